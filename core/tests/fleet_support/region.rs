//! One region of a simulated fleet: the key machine an escrow node runs for
//! the fleet's key ([`KeyMachine`]), fed the way the node's key actor feeds
//! it. Its actions become coordinator [`Call`]s, which the simulation
//! delivers, delays or loses, answers to the simulated clients, and a timer;
//! the coordinator's answers come back as the machine's events
//! ([`super::Coordinator::answer`]).

use leasehold_core::coordinator::CommandError;
use leasehold_core::escrow::machine::{
    AcquireRequest, Acquired, Action, Event, KeyMachine, KeyMachineConfig, Now, Refused,
};
use leasehold_core::escrow::{HolderLimits, Served};
use leasehold_core::ids::TenantId;
use leasehold_core::policy::Policy;
use leasehold_core::sizer::LeaseSizer;

/// What a simulated client is answered.
pub type Answer = Result<Acquired, Refused<CommandError>>;

/// After a failed call, a region calls the coordinator at most once per
/// this many ms.
pub const PROBE_INTERVAL_MS: u64 = 100;

/// A coordinator call a region's machine asked for: one of its actions
/// [`Action::SendLease`], [`Action::SendPoolGrant`],
/// [`Action::SendPoolRelease`] or [`Action::Reconcile`], performed by the
/// simulation ([`super::Coordinator::answer`]).
pub type Call = Action<CommandError>;

/// The event a machine is fed when `call` fails (no answer in time), if it
/// waits for one.
pub fn failed(call: &Call) -> Option<Event<CommandError>> {
    match call {
        Action::SendLease(ticket) => Some(Event::LeaseFailed { ticket: ticket.id }),
        Action::SendPoolGrant { call, .. } => Some(Event::PoolFailed { call: *call }),
        Action::SendPoolRelease(pending) => Some(Event::ReleaseFailed {
            release: pending.request_id,
        }),
        _ => None,
    }
}

/// A key's configuration at a simulated escrow node: `sizer`, reclaim after
/// `pool_release_idle_ms` (0: off), never evicted.
pub fn config(sizer: LeaseSizer, pool_release_idle_ms: u64) -> KeyMachineConfig {
    KeyMachineConfig {
        sizer,
        probe_interval_ms: PROBE_INTERVAL_MS,
        pool_release_idle_ms,
        idle_evict_ms: u64::MAX / 4,
        max_tenants: 64,
        holder_limits: HolderLimits::default(),
    }
}

/// One region's key machine and what the node's actor keeps beside it.
#[derive(Debug)]
pub struct Region {
    machine: KeyMachine<CommandError>,
    policy: Policy,
    next_request: u64,
    answers: Vec<(u64, Answer)>,
    timer: Option<u64>,
}

impl Region {
    /// A region's key under `policy`, created at monotonic `now_ms`.
    pub fn new(config: KeyMachineConfig, policy: Policy, now_ms: u64) -> Self {
        Region {
            machine: KeyMachine::new(config, None, now_ms),
            policy,
            next_request: 0,
            answers: Vec::new(),
            timer: None,
        }
    }

    /// The machine, for its counters and state.
    pub fn machine(&self) -> &KeyMachine<CommandError> {
        &self.machine
    }

    /// A client asks for `tokens` as `tenant` (`None`: the default) of
    /// `weight`; returns the request's id (its answer is named by it, now
    /// or once the calls it waits on are answered) and the calls to make.
    pub fn acquire(
        &mut self,
        tenant: Option<TenantId>,
        weight: u64,
        tokens: u64,
        now: Now,
    ) -> (u64, Vec<Call>) {
        self.next_request += 1;
        let request = AcquireRequest {
            id: self.next_request,
            tokens,
            tenant,
            weight,
            from: None,
            caller: None,
            serving: leasehold_core::escrow::machine::Serving::Part,
            policy: Some(self.policy.clone()),
            node_reachable: true,
        };
        (self.next_request, self.feed(Event::Acquire(request), now))
    }

    /// Feeds `event`; returns the calls to make.
    pub fn feed(&mut self, event: Event<CommandError>, now: Now) -> Vec<Call> {
        let actions = self.machine.handle(event, now);
        let mut calls = Vec::new();
        self.perform(actions, now, &mut calls);
        calls
    }

    /// Fires the armed timer if it is due at `now`.
    pub fn tick(&mut self, now: Now) -> Vec<Call> {
        match self.timer {
            Some(at) if at <= now.mono_ms => {
                self.timer = None;
                self.feed(Event::Tick, now)
            }
            _ => Vec::new(),
        }
    }

    /// Stops the key, as an evicted or stopping node does: it hands its
    /// credits back and releases its pool grant.
    pub fn shutdown(&mut self, now: Now) -> Vec<Call> {
        self.feed(Event::Shutdown, now)
    }

    /// The answers given since the last call, in order.
    pub fn take_answers(&mut self) -> Vec<(u64, Answer)> {
        std::mem::take(&mut self.answers)
    }

    fn perform(&mut self, actions: Vec<Action<CommandError>>, now: Now, calls: &mut Vec<Call>) {
        for action in actions {
            match action {
                Action::SendLease(_)
                | Action::SendPoolGrant { .. }
                | Action::SendPoolRelease(_)
                | Action::Reconcile(_) => calls.push(action),
                Action::RefreshPolicy => {
                    let policy = Some(self.policy.clone());
                    let more = self.machine.handle(Event::Policy(policy), now);
                    self.perform(more, now, calls);
                }
                Action::Answer { id, answer } => self.answers.push((id, answer)),
                Action::ArmTimer { at_ms } => self.timer = Some(at_ms),
                Action::Settle { .. } | Action::CountShadowWouldDeny { .. } | Action::Evict => {}
            }
        }
    }
}

/// The credits an answer hands out, if any.
pub fn credits(answer: &Answer) -> Option<Served> {
    match answer {
        Ok(Acquired::Credits { served, .. }) => Some(*served),
        _ => None,
    }
}
