//! One key of a regional escrow node (L2) as a single sans-IO machine:
//! [`KeyMachine::handle`] takes an [`Event`] and the time, and returns the
//! [`Action`]s to perform, in the manner of openraft's engine. The node's
//! key actor only performs them (coordinator calls, timers, replies,
//! metrics); simulations and property tests run the very same code.
//!
//! The machine holds everything one key decides: the counter escrow
//! ([`RegionEscrow`]: leases, reconcile, sizing, the outage gate), the fair
//! state ([`FairKey`]: pool grant, tenants, demand split, reclaim), the
//! key's policy (kind, outage policy, shadow), the exactly-once book of
//! holders ([`HolderBook`]) and the optional fair throttle
//! ([`EscrowFairGate`]).
//!
//! Rules:
//! - **Sans IO**: `handle` never reads a clock, never waits, never draws
//!   randomness except from the throttle's draw source it was given. The
//!   caller performs the actions in the order given and feeds each call's
//!   outcome back as one event naming the call (ticket, call or release id).
//! - **One decision at a time**: acquisitions are decided one after the
//!   other in arrival order; those that arrive meanwhile queue. Returns are
//!   settled at once.
//! - **One call in flight**: at most one coordinator call (a lease, a pool
//!   grant or a pool release) is outstanding; an answer naming another
//!   call is ignored (a late lease grant is counted as unexpected by the
//!   escrow and never credited).
//! - **Answered once**: every acquisition gets exactly one
//!   [`Action::Answer`] and every return one [`Action::Settle`]; a retry of
//!   a request id gets the remembered answer without being executed again.
//! - **An acquisition's pipeline**: exactly-once admission → fair throttle
//!   gate → the policy (refreshed when unknown: [`Action::RefreshPolicy`])
//!   → the key kind's rules (counter: serve, lease, serve again; fair: at
//!   most [`MAX_POOL_ASKS_PER_CHECK`] pool asks) → the outage policy when
//!   the coordinator is unreachable (`fail_closed` denies, `fallback`
//!   serves its share per wall-clock window) → whole-or-nothing (a partial
//!   serve goes back into the escrow and becomes a denial) → the throttle
//!   learns the outcome (not a denial during an outage) → shadow (a denial
//!   under a shadow policy becomes an admission counted as would-deny) →
//!   the answer is remembered for the holder.
//! - **Reclaim**: a fair key that has seen no request for
//!   `pool_release_idle_ms` while holding a live grant releases what it did
//!   not admit; so does a key that shuts down. A pending release is resent
//!   (same release id) before any other pool call, a probe interval after
//!   its last try when nothing else asks.
//! - **Ceiling waits**: a region at its pool ceiling asks again after
//!   `pool_release_idle_ms` (at most a quarter window; a quarter window
//!   when reclaim is off), since other regions may have released.
//! - **Timers and eviction**: whenever it is idle the machine arms one
//!   timer ([`Action::ArmTimer`]) for the next due release or for eviction;
//!   on [`Event::Tick`] a key idle for `idle_evict_ms` asks to be evicted
//!   ([`Action::Evict`]): the caller stops taking requests, feeds those
//!   already accepted, then [`Event::Shutdown`], on which the key hands its
//!   credits back ([`Action::Reconcile`]) and, with reclaim on, releases its
//!   pool grant.
//!
//! Times are the caller's monotonic milliseconds ([`Now::mono_ms`]); the
//! wall clock ([`Now::wall_ms`]) only labels the windows of outage fallback
//! and shadow credits, which have no coordinator window.

use std::collections::VecDeque;

use crate::fair_throttle::CallerId;
use crate::ids::TenantId;
use crate::policy::{Policy, PolicyKind};
use crate::sizer::LeaseSizer;
use crate::wfe::MAX_POOL_ASKS_PER_CHECK;
use crate::window::WindowBounds;

use super::{
    Admission, CoordinatorGrant, EscrowCounters, EscrowFairGate, FairGateCounters, FairKey,
    FairStep, GateVerdict, Holder, HolderBook, HolderCounters, HolderHeld, HolderLimits,
    HolderRefusal, JoinAhead, LeaseTicket, PendingRelease, PoolAnswer, Reconcile, RegionEscrow,
    ReleaseAnswer, ReturnClaim, ReturnSettled, Served, WEIGHT_SCALE,
};

/// Tenant of a fair key's request that names none.
pub const DEFAULT_TENANT: &str = "default";

/// Most tenants of one key a [`KeyView`] lists (the first in byte order).
pub const MAX_VIEWED_TENANTS: usize = 32;

/// The two clocks an event is handled at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic milliseconds: every deadline, probe and idle time.
    pub mono_ms: u64,
    /// Wall-clock epoch milliseconds: only the windows of fallback and
    /// shadow credits.
    pub wall_ms: u64,
}

/// What a key is configured with at its node.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyMachineConfig {
    /// Lease sizing of counter keys (and the batch of fair asks).
    pub sizer: LeaseSizer,
    /// After a failed call, at most one call per this many ms.
    pub probe_interval_ms: u64,
    /// Reclaim: release a fair grant after this long without a request (0: off).
    pub pool_release_idle_ms: u64,
    /// Evict the key after this long without a request (≥ 1).
    pub idle_evict_ms: u64,
    /// Most tenants tracked by a fair key.
    pub max_tenants: usize,
    /// Bounds of the holders' book.
    pub holder_limits: HolderLimits,
}

/// A key's fair throttle: the gate, the retry hint of a throttled request
/// and where each decision's rotation seed and uniform draw come from.
pub struct ThrottleFront {
    gate: EscrowFairGate,
    retry_after_ms: u64,
    draws: Box<dyn FnMut() -> (u32, u64) + Send>,
}

impl ThrottleFront {
    /// A throttle answering throttled requests with `retry_after_ms`;
    /// `draws` yields a fresh rotation seed and a uniform draw per decision.
    pub fn new(
        gate: EscrowFairGate,
        retry_after_ms: u64,
        draws: Box<dyn FnMut() -> (u32, u64) + Send>,
    ) -> Self {
        ThrottleFront {
            gate,
            retry_after_ms,
            draws,
        }
    }
}

impl std::fmt::Debug for ThrottleFront {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThrottleFront")
            .field("gate", &self.gate)
            .field("retry_after_ms", &self.retry_after_ms)
            .finish_non_exhaustive()
    }
}

/// What an acquisition got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// Credits handed out (possibly fewer than asked).
    Credits {
        /// The credits.
        served: Served,
        /// The key's limit.
        limit: u64,
        /// A shadow policy's admission of a request the escrow would have
        /// denied ([`crate::shadow`]): the credits are not from a
        /// coordinator grant and are never returnable.
        shadow_would_deny: bool,
    },
    /// Nothing now; try again after this long.
    Denied {
        /// Retry hint.
        retry_after_ms: u64,
        /// The key's limit.
        limit: u64,
        /// End of the window the denial is about, if known (coordinator ms).
        window_end_ms: u64,
        /// Refused by the key's fair throttle, not for want of budget.
        fair_throttled: bool,
    },
}

/// Who asks, for exactly-once effects: the holder and the request's seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderRequest {
    /// The holder (caller, client id).
    pub holder: Holder,
    /// The request id's seq.
    pub seq: u64,
}

/// One acquisition.
#[derive(Debug, Clone, PartialEq)]
pub struct AcquireRequest {
    /// Names the request in its [`Action::Answer`].
    pub id: u64,
    /// Tokens asked for.
    pub tokens: u64,
    /// The asking tenant (fair keys; `None`: [`DEFAULT_TENANT`]).
    pub tenant: Option<TenantId>,
    /// The tenant's declared weight (≥ 1).
    pub weight: u64,
    /// The holder and seq, when the request carries a request id: the
    /// credits are recorded under the holder and the answer given once
    /// per seq. `None`: executed as it comes, not returnable.
    pub from: Option<HolderRequest>,
    /// Who calls, as the fair throttle tells callers apart (only read
    /// when the key has a throttle).
    pub caller: Option<Vec<u8>>,
    /// How much of `tokens` may be served.
    pub serving: Serving,
    /// The key's policy as the caller's table knows it now; `None` makes
    /// the machine ask for a refresh first.
    pub policy: Option<Policy>,
    /// Whether the node saw the coordinator answer its last call (of any
    /// key): a denial while it did not teaches the throttle nothing.
    pub node_reachable: bool,
}

/// How much of an acquisition may be served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Serving {
    /// Any part of it, up to the tokens asked (`Acquire`).
    #[default]
    Part,
    /// All of it or nothing (thin clients' `Check`): short of credits, the
    /// node leases the difference first; a partial serve then goes
    /// straight back into the escrow, capped like any return, and the
    /// answer is a denial.
    Whole,
    /// Nothing: whether it could be served whole now (a check-only call,
    /// Envoy's `hits_addend` of 0). Served as `Whole`, then what was
    /// handed out goes back into the escrow by the same capped path; the
    /// answer is `Credits` with `granted` 0, or a denial. The lease it may
    /// take to find out stays held, for later requests. (Fallback credits
    /// of an outage are not put back: during an outage a probe costs what
    /// a serve would.)
    Probe,
    /// All of it when the window has it, else all the window has left (a
    /// charge of what was used: Envoy's stream-end `hits_addend`): short
    /// of credits, the node leases the difference first, as for `Whole`,
    /// and keeps what it serves.
    Charge,
}

impl Serving {
    /// Whether a partial serve is put back and answered as a denial.
    pub fn whole_or_nothing(self) -> bool {
        matches!(self, Serving::Whole | Serving::Probe)
    }

    /// Whether a request short of credits leases the difference before it
    /// is served.
    pub fn leases_shortfall(self) -> bool {
        self != Serving::Part
    }
}

/// Why an acquisition was refused rather than answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused<R> {
    /// No policy matches the key.
    NoPolicy,
    /// The request id was refused before anything was executed.
    Holder(HolderRefusal),
    /// The coordinator refused the key's call (no policy, wrong kind, an
    /// invalid argument), passed on as the caller's transport reported it.
    Coordinator(R),
    /// The request could not be decided (an invalid default tenant).
    Internal(String),
}

/// What happens to a key. `R` is the caller's form of a coordinator refusal.
#[derive(Debug, Clone, PartialEq)]
pub enum Event<R> {
    /// A client asks for credits.
    Acquire(AcquireRequest),
    /// A holder gives credits back.
    Return {
        /// Names the return in its [`Action::Settle`].
        id: u64,
        /// The holder and seq.
        from: HolderRequest,
        /// What it gives back.
        claim: ReturnClaim,
    },
    /// Credits served without a holder come back (an RLS refund: Envoy's
    /// `is_negative_hits`), up to what this node served in the window and
    /// has not taken back — the same cap as every return. The caller caps
    /// it first by what the refunding caller was charged. Answered by
    /// [`Action::Settle`].
    Refund {
        /// Names the refund in its [`Action::Settle`].
        id: u64,
        /// Tokens offered back.
        tokens: u64,
        /// The window they were served in.
        window_start_ms: u64,
    },
    /// The key's policy as the caller's refreshed table has it.
    Policy(Option<Policy>),
    /// Lease `ticket` was granted.
    LeaseGranted {
        /// The lease's id ([`LeaseTicket::id`]).
        ticket: u64,
        /// The grant.
        grant: CoordinatorGrant,
    },
    /// Lease `ticket` failed (unreachable, timeout, no quorum).
    LeaseFailed {
        /// The lease's id.
        ticket: u64,
    },
    /// The coordinator refused lease `ticket`.
    LeaseRefused {
        /// The lease's id.
        ticket: u64,
        /// The refusal, passed to the waiting request.
        refusal: R,
    },
    /// Pool grant `call` was answered.
    PoolGranted {
        /// The call's id.
        call: u64,
        /// The grant.
        answer: PoolAnswer,
        /// Tenants' demand over all regions in the window the call reported.
        tenant_demands: Vec<(TenantId, u64)>,
        /// The grant of the join of the next window the call carried, when
        /// it was made.
        next_window: Option<PoolAnswer>,
        /// The settled tenants' demand totals the join's answer carries
        /// (of the window two before the one joined).
        next_window_demands: Vec<(TenantId, u64)>,
    },
    /// Pool grant `call` failed (unreachable).
    PoolFailed {
        /// The call's id.
        call: u64,
    },
    /// The coordinator refused pool grant `call`.
    PoolRefused {
        /// The call's id.
        call: u64,
        /// The refusal, passed to the waiting request.
        refusal: R,
    },
    /// Pool release `release` was answered.
    ReleaseAnswered {
        /// The release's id ([`PendingRelease::request_id`]).
        release: u64,
        /// The answer.
        answer: ReleaseAnswer,
        /// The grant of the join of the next window the release carried,
        /// when it was made.
        next_window: Option<PoolAnswer>,
        /// The settled tenants' demand totals the join's answer carries
        /// (of the window two before the one joined).
        next_window_demands: Vec<(TenantId, u64)>,
    },
    /// Pool release `release` went unanswered: it stays pending.
    ReleaseFailed {
        /// The release's id.
        release: u64,
    },
    /// The coordinator refused pool release `release` definitively.
    ReleaseRefused {
        /// The release's id.
        release: u64,
    },
    /// The timer armed last fired.
    Tick,
    /// The key stops: hand back its credits and release its pool grant.
    Shutdown,
}

/// What the caller performs, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum Action<R> {
    /// Send this lease; answer with `LeaseGranted`, `LeaseFailed` or
    /// `LeaseRefused` and its id.
    SendLease(LeaseTicket),
    /// Ask the region fair pool; answer with `PoolGranted`, `PoolFailed`
    /// or `PoolRefused` and `call`.
    SendPoolGrant {
        /// The call's id.
        call: u64,
        /// The region's weight, in thousandths.
        region_weight: u64,
        /// The total asked for.
        want_total: u64,
        /// How much more than the region holds the key asks for
        /// ([`FairKey::want_more`]).
        want_more: u64,
        /// The window the demand report is about (0: none).
        demand_window_ms: u64,
        /// The region's demand per tenant in that window.
        demands: Vec<(TenantId, u64)>,
        /// The join of the next window the call carries, if any (its
        /// answer comes as the event's `next_window`).
        join_next: Option<JoinAhead<u64>>,
    },
    /// Send (or resend, same id) this pool release; answer with
    /// `ReleaseAnswered`, `ReleaseFailed` or `ReleaseRefused`.
    SendPoolRelease(PendingRelease<u64>),
    /// Hand these credits back to the coordinator (no answer expected).
    Reconcile(Reconcile),
    /// Refresh the policy table and feed [`Event::Policy`].
    RefreshPolicy,
    /// Answer acquisition `id`.
    Answer {
        /// The request's id.
        id: u64,
        /// The answer.
        answer: Result<Acquired, Refused<R>>,
    },
    /// Answer return `id`.
    Settle {
        /// The return's id.
        id: u64,
        /// What was taken back.
        settled: Result<ReturnSettled, HolderRefusal>,
    },
    /// Count one request of `tokens` a shadow policy admitted.
    CountShadowWouldDeny {
        /// The tokens it was admitted.
        tokens: u64,
    },
    /// Feed [`Event::Tick`] at this monotonic time (replaces any earlier timer).
    ArmTimer {
        /// When.
        at_ms: u64,
    },
    /// The key has been idle: stop taking requests, feed those accepted,
    /// then [`Event::Shutdown`].
    Evict,
}

/// What a key shows watchers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyView {
    /// The window of the credits held (coordinator epoch ms), if any.
    pub window: Option<WindowBounds>,
    /// The key's limit.
    pub limit: u64,
    /// What the coordinator granted this region in that window (a fair
    /// key: its pool grant).
    pub granted: u64,
    /// Credits held unspent now (counter keys).
    pub held: u64,
    /// The region's pool weight (fair keys; else 0).
    pub region_weight: u64,
    /// Tenants tracked (fair keys).
    pub tenant_count: u64,
    /// At most [`MAX_VIEWED_TENANTS`] of them: (tenant, weight, admitted).
    pub tenants: Vec<(String, u64, u64)>,
}

/// A weight in thousandths ([`WEIGHT_SCALE`]) shown in the units tenants
/// declare, rounded to the nearest (at least 1 when not 0).
fn declared_units(scaled: u64) -> u64 {
    if scaled == 0 {
        return 0;
    }
    (scaled.saturating_add(WEIGHT_SCALE / 2) / WEIGHT_SCALE).max(1)
}

/// The coordinator call in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outbound {
    Lease {
        ticket: u64,
    },
    Pool {
        call: u64,
        want_total: u64,
        sent_ms: u64,
        demand_window_ms: u64,
        /// A surplus check's raise: retire at the new total once answered.
        then_retire: bool,
        /// The total the join of the next window it carries asked for.
        join_want: Option<u64>,
    },
    Release {
        release: u64,
    },
}

/// Where the acquisition being decided waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// For [`Event::Policy`].
    Policy,
    /// For its lease's answer.
    Lease,
    /// For the pending release to settle before asking the pool.
    ReleaseBeforeAsk {
        region_weight: u64,
        want_total: u64,
        asks_left: usize,
    },
    /// For its pool ask's answer.
    Pool { asks_left: usize },
}

/// The acquisition being decided.
#[derive(Debug, Clone)]
struct Working {
    request: AcquireRequest,
    holder_ticket: Option<super::AcquireTicket>,
    /// The caller the throttle learns the outcome for (a passed request).
    learns: Option<Vec<u8>>,
    throttled: bool,
    /// Whether this request's own last call was answered (`None`: none made).
    answered: Option<bool>,
    stage: Stage,
    /// Whether it already leased again after a grant that came back too
    /// late to credit (its window had ended): it does so once.
    leased_again: bool,
}

/// One key of a regional escrow node (see the module doc).
#[derive(Debug)]
pub struct KeyMachine<R> {
    config: KeyMachineConfig,
    policy: Option<Policy>,
    counter: RegionEscrow,
    fair: Option<FairKey<u64>>,
    book: HolderBook<Acquired>,
    throttle: Option<ThrottleFront>,
    queue: VecDeque<AcquireRequest>,
    working: Option<Working>,
    outbound: Option<Outbound>,
    next_call: u64,
    last_request_ms: u64,
    release_tried_ms: u64,
    last_window_end_ms: u64,
    /// (window start, tokens credited from grants of that window).
    window_credit: (u64, u64),
    evicted: bool,
    stopping: bool,
    stopped: bool,
    _refusal: std::marker::PhantomData<fn() -> R>,
}

impl<R> KeyMachine<R> {
    /// A key that has seen nothing yet, created at monotonic `now_ms`.
    pub fn new(config: KeyMachineConfig, throttle: Option<ThrottleFront>, now_ms: u64) -> Self {
        let counter = RegionEscrow::with_sizer(
            config.sizer.clone(),
            config.probe_interval_ms,
            Default::default(),
        );
        KeyMachine {
            book: HolderBook::new(config.holder_limits),
            config,
            policy: None,
            counter,
            fair: None,
            throttle,
            queue: VecDeque::new(),
            working: None,
            outbound: None,
            next_call: 0,
            last_request_ms: now_ms,
            release_tried_ms: 0,
            last_window_end_ms: 0,
            window_credit: (0, 0),
            evicted: false,
            stopping: false,
            stopped: false,
            _refusal: std::marker::PhantomData,
        }
    }

    /// Handles `event` at `now`; returns what to perform, in order.
    pub fn handle(&mut self, event: Event<R>, now: Now) -> Vec<Action<R>> {
        let mut out = Vec::new();
        self.handle_into(event, now, &mut out);
        out
    }

    /// [`handle`](Self::handle), pushing the actions into `out`.
    pub fn handle_into(&mut self, event: Event<R>, now: Now, out: &mut Vec<Action<R>>) {
        match event {
            Event::Acquire(request) => {
                self.last_request_ms = now.mono_ms;
                self.queue.push_back(request);
            }
            Event::Return { id, from, claim } => {
                self.last_request_ms = now.mono_ms;
                let counter = &mut self.counter;
                let settled = self.book.settle_return(
                    &from.holder,
                    from.seq,
                    &claim,
                    now.mono_ms,
                    |offered| counter.take_back(offered, claim.window_start_ms, now.mono_ms),
                );
                out.push(Action::Settle { id, settled });
            }
            Event::Refund {
                id,
                tokens,
                window_start_ms,
            } => {
                self.last_request_ms = now.mono_ms;
                let accepted = self.counter.take_back(tokens, window_start_ms, now.mono_ms);
                out.push(Action::Settle {
                    id,
                    settled: Ok(ReturnSettled {
                        accepted,
                        refused: tokens - accepted,
                    }),
                });
            }
            Event::Policy(policy) => self.on_policy(policy, now, out),
            Event::LeaseGranted { ticket, grant } => self.on_lease_granted(ticket, grant, now, out),
            Event::LeaseFailed { ticket } => {
                if self.outbound_is(Outbound::Lease { ticket }) {
                    self.outbound = None;
                    self.counter.on_lease_failed_for(ticket, now.mono_ms);
                    self.after_lease(None, Some(false), now, out);
                }
            }
            Event::LeaseRefused { ticket, refusal } => {
                if self.outbound_is(Outbound::Lease { ticket }) {
                    self.outbound = None;
                    self.counter.on_lease_refused_for(ticket, now.mono_ms);
                    self.finish(Err(Refused::Coordinator(refusal)), now, out);
                }
            }
            Event::PoolGranted {
                call,
                answer,
                tenant_demands,
                next_window,
                next_window_demands,
            } => self.on_pool_granted(
                call,
                answer,
                tenant_demands,
                next_window.map(|next| (next, next_window_demands)),
                now,
                out,
            ),
            Event::PoolFailed { call } => {
                if matches!(self.outbound, Some(Outbound::Pool { call: c, .. }) if c == call) {
                    self.outbound = None;
                    self.counter.outage_mut().on_failure(now.mono_ms);
                    if let Some(working) = self.working.as_mut() {
                        working.answered = Some(false);
                        let answer = self.fair_outage(now);
                        self.finish(Ok(answer), now, out);
                    }
                }
            }
            Event::PoolRefused { call, refusal } => {
                if matches!(self.outbound, Some(Outbound::Pool { call: c, .. }) if c == call) {
                    self.outbound = None;
                    self.finish(Err(Refused::Coordinator(refusal)), now, out);
                }
            }
            Event::ReleaseAnswered {
                release,
                answer,
                next_window,
                next_window_demands,
            } => {
                if self.outbound_is(Outbound::Release { release }) {
                    self.outbound = None;
                    self.counter.outage_mut().on_answer();
                    let re_ask_ms = next_window.map_or(0, |a| self.re_ask_ms(a.window));
                    let sent_ms = self.release_tried_ms;
                    if let Some(fair) = self.fair.as_mut() {
                        let join_want = fair
                            .pending_release()
                            .and_then(|p| p.join_next.as_ref().map(|j| j.want_total));
                        fair.on_release_answer(answer);
                        if let (Some(next), Some(want)) = (next_window, join_want) {
                            fair.on_ahead_answer(
                                next,
                                next_window_demands,
                                want,
                                sent_ms,
                                now.mono_ms,
                                re_ask_ms,
                            );
                        }
                    }
                    self.after_release(true, now, out);
                }
            }
            Event::ReleaseRefused { release } => {
                if self.outbound_is(Outbound::Release { release }) {
                    self.outbound = None;
                    if let Some(fair) = self.fair.as_mut() {
                        fair.on_release_refused();
                    }
                    self.after_release(true, now, out);
                }
            }
            Event::ReleaseFailed { release } => {
                if self.outbound_is(Outbound::Release { release }) {
                    self.outbound = None;
                    self.counter.outage_mut().on_failure(now.mono_ms);
                    self.after_release(false, now, out);
                }
            }
            Event::Tick => self.on_tick(now, out),
            Event::Shutdown => self.stopping = true,
        }
        self.pump(now, out);
    }

    /// A forecast of the key's demand in its next window, for a predictive
    /// lease sizer ([`RegionEscrow::forecast`]); whether it is used (not by
    /// other sizers, nor by a `fair` key, whose leases are pool grants).
    pub fn forecast(&mut self, demand: u64) -> bool {
        if self.fair.is_some() {
            return false;
        }
        self.counter.forecast(demand)
    }

    /// The policy the key last saw.
    pub fn policy(&self) -> Option<&Policy> {
        self.policy.as_ref()
    }

    /// The counter escrow (what a counter key holds; its outage gate and
    /// sizer serve fair keys too).
    pub fn counter(&self) -> &RegionEscrow {
        &self.counter
    }

    /// The fair state, once the key turned out to be fair.
    pub fn fair(&self) -> Option<&FairKey<u64>> {
        self.fair.as_ref()
    }

    /// The key's escrow counters (outage counters included, both kinds).
    pub fn counters(&self) -> EscrowCounters {
        self.counter.counters()
    }

    /// The holders' book counters.
    pub fn holder_counters(&self) -> HolderCounters {
        self.book.counters()
    }

    /// The fair throttle's counters, when the key has one.
    pub fn throttle_counters(&self) -> Option<FairGateCounters> {
        self.throttle.as_ref().map(|t| t.gate.counters())
    }

    /// Whether nothing is being decided, queued or awaited.
    pub fn is_idle(&self) -> bool {
        self.working.is_none() && self.outbound.is_none() && self.queue.is_empty()
    }

    /// When the next timer is due (monotonic ms): a pool release falling
    /// due, or eviction `idle_evict_ms` after the last request.
    pub fn next_wake_ms(&self, now_ms: u64) -> u64 {
        let evict_at = self
            .last_request_ms
            .saturating_add(self.config.idle_evict_ms.max(1));
        self.release_at(now_ms)
            .map_or(evict_at, |at| at.min(evict_at))
    }

    /// What watchers see at `now_ms`; `limit` is the key's limit as the
    /// caller's policy table has it.
    pub fn view(&mut self, limit: u64, now_ms: u64) -> KeyView {
        let fair = self
            .fair
            .as_ref()
            .and_then(|fair| Some((fair.window()?, fair.escrow()?)));
        match fair {
            Some((window, escrow)) => KeyView {
                window: Some(window),
                limit,
                granted: escrow.budget(),
                held: 0,
                region_weight: declared_units(escrow.region_weight()),
                tenant_count: escrow.tenant_count() as u64,
                tenants: escrow
                    .tenants()
                    .take(MAX_VIEWED_TENANTS)
                    .map(|(tenant, weight, used)| {
                        (tenant.to_string(), declared_units(weight), used)
                    })
                    .collect(),
            },
            None => {
                let (start, credited) = self.window_credit;
                KeyView {
                    window: (self.last_window_end_ms > 0).then_some(WindowBounds {
                        start_ms: start,
                        end_ms: self.last_window_end_ms,
                    }),
                    limit,
                    granted: credited,
                    held: self.counter.balance(now_ms),
                    ..KeyView::default()
                }
            }
        }
    }

    fn outbound_is(&self, call: Outbound) -> bool {
        self.outbound == Some(call)
    }

    fn next_call_id(&mut self) -> u64 {
        self.next_call += 1;
        self.next_call
    }

    /// When the key's pool release falls due (see [`FairKey::release_at`]).
    fn release_at(&self, now_ms: u64) -> Option<u64> {
        self.fair.as_ref()?.release_at(
            self.last_request_ms,
            self.config.pool_release_idle_ms,
            self.release_tried_ms,
            self.config.probe_interval_ms,
            now_ms,
        )
    }

    /// Starts queued requests while nothing is awaited, shuts down once
    /// asked and idle, and arms the next timer when idle.
    fn pump(&mut self, now: Now, out: &mut Vec<Action<R>>) {
        while self.working.is_none() && self.outbound.is_none() {
            if let Some(request) = self.queue.pop_front() {
                self.start(request, now, out);
            } else if self.stopping && !self.stopped {
                self.stopped = true;
                if let Some(back) = self.counter.return_all(now.mono_ms) {
                    out.push(Action::Reconcile(back));
                }
                if self.config.pool_release_idle_ms > 0 {
                    self.release_pool(now, out);
                }
            } else {
                break;
            }
        }
        if self.is_idle() && !self.evicted && !self.stopping {
            out.push(Action::ArmTimer {
                at_ms: self.next_wake_ms(now.mono_ms),
            });
        }
    }

    fn on_tick(&mut self, now: Now, out: &mut Vec<Action<R>>) {
        if !self.is_idle() || self.evicted || self.stopping {
            return;
        }
        if self
            .release_at(now.mono_ms)
            .is_some_and(|at| now.mono_ms >= at)
        {
            self.release_pool(now, out);
            return;
        }
        let idle_ms = self.config.idle_evict_ms.max(1);
        if now.mono_ms.saturating_sub(self.last_request_ms) >= idle_ms {
            self.evicted = true;
            out.push(Action::Evict);
        }
    }

    /// Reclaim: retires the region from the key's pool in its live window,
    /// keeping what it admitted (or resends a pending release).
    fn release_pool(&mut self, now: Now, out: &mut Vec<Action<R>>) {
        let id = self.next_call + 1;
        if let Some(fair) = self.fair.as_mut() {
            // From now on the key spends no more than it keeps, whatever
            // becomes of the release.
            // Idle (or shutting down): keep what was admitted; otherwise
            // the window's surplus check keeps what the pace still needs.
            let idle = self.stopping
                || now.mono_ms.saturating_sub(self.last_request_ms)
                    >= self.config.pool_release_idle_ms;
            if fair.pending_release().is_none()
                && fair.begin_release(id, idle, now.mono_ms).is_some()
            {
                self.next_call = id;
                // A release late in the window (not an idle one) also
                // joins the next window ahead.
                if !idle {
                    fair.attach_join_ahead(id + 1, self.counter.lease_size(), now.mono_ms);
                    if fair
                        .pending_release()
                        .is_some_and(|p| p.join_next.is_some())
                    {
                        self.next_call = id + 1;
                    }
                }
            }
            // A region whose pace needs more than it holds while the pool
            // reserves well beyond that: raise to the need, then retire.
            if fair.pending_release().is_none() {
                if let Some((region_weight, want_total)) = fair.take_retiring_raise(now.mono_ms) {
                    self.send_pool_grant(region_weight, want_total, 0, true, now, out);
                    return;
                }
            }
        }
        self.send_pending_release(now, out);
    }

    /// Sends the pending release, if any; true when one went out.
    fn send_pending_release(&mut self, now: Now, out: &mut Vec<Action<R>>) -> bool {
        let Some(pending) = self.fair.as_ref().and_then(|f| f.pending_release()) else {
            return false;
        };
        self.release_tried_ms = now.mono_ms;
        self.outbound = Some(Outbound::Release {
            release: pending.request_id,
        });
        out.push(Action::SendPoolRelease(pending.clone()));
        true
    }

    fn on_policy(&mut self, policy: Option<Policy>, now: Now, out: &mut Vec<Action<R>>) {
        self.set_policy(policy);
        let waiting = self
            .working
            .as_ref()
            .is_some_and(|w| w.stage == Stage::Policy);
        if waiting {
            if self.policy.is_some() {
                self.decide(now, out);
            } else {
                self.finish(Err(Refused::NoPolicy), now, out);
            }
        }
    }

    fn set_policy(&mut self, policy: Option<Policy>) {
        if let Some(policy) = &policy {
            self.counter.set_outage_policy(policy.outage);
        }
        self.policy = policy;
    }

    /// The start of an acquisition's pipeline: admission, throttle, policy.
    fn start(&mut self, mut request: AcquireRequest, now: Now, out: &mut Vec<Action<R>>) {
        let holder_ticket = match &request.from {
            None => None,
            Some(from) => match self.book.admit_acquire(
                &from.holder,
                from.seq,
                request.tenant.as_ref(),
                request.tokens,
                now.mono_ms,
            ) {
                Ok(Admission::Replay(answer)) => {
                    out.push(Action::Answer {
                        id: request.id,
                        answer: Ok(answer),
                    });
                    return;
                }
                Ok(Admission::New(ticket)) => Some(ticket),
                Err(refusal) => {
                    out.push(Action::Answer {
                        id: request.id,
                        answer: Err(Refused::Holder(refusal)),
                    });
                    return;
                }
            },
        };
        let verdict = self.gate(request.caller.as_deref(), now.mono_ms);
        let learns = match verdict {
            Some(GateVerdict::Pass) => request.caller.clone(),
            _ => None,
        };
        let policy = request.policy.take();
        let known = policy.is_some();
        if known {
            self.set_policy(policy);
        }
        self.working = Some(Working {
            request,
            holder_ticket,
            learns,
            throttled: matches!(verdict, Some(GateVerdict::Throttled { .. })),
            answered: None,
            stage: Stage::Policy,
            leased_again: false,
        });
        if known {
            self.decide(now, out);
        } else {
            // The caller's table may predate a policy set moments ago.
            out.push(Action::RefreshPolicy);
        }
    }

    /// The throttle's verdict for `caller` (`None`: no throttle applies).
    fn gate(&mut self, caller: Option<&[u8]>, now_ms: u64) -> Option<GateVerdict> {
        self.throttle.as_ref()?;
        let id = CallerId::new(caller?).ok()?;
        let unleased = self.counter.balance(now_ms);
        let throttle = self.throttle.as_mut()?;
        let (seed, draw) = (throttle.draws)();
        Some(throttle.gate.gate(id, now_ms, seed, draw, unleased))
    }

    /// Decides the working request once its policy is known.
    fn decide(&mut self, now: Now, out: &mut Vec<Action<R>>) {
        let (Some(working), Some(policy)) = (self.working.as_ref(), self.policy.as_ref()) else {
            return;
        };
        let (throttled, limit, kind) = (working.throttled, policy.limit, policy.kind);
        if throttled {
            let retry_after_ms = self.throttle.as_ref().map_or(1, |t| t.retry_after_ms);
            let answer = Acquired::Denied {
                retry_after_ms,
                limit,
                window_end_ms: self.last_window_end_ms,
                fair_throttled: true,
            };
            self.finish(Ok(answer), now, out);
            return;
        }
        if kind == PolicyKind::Fair {
            self.fair_begin(now, out);
        } else {
            self.counter_begin(now, out);
        }
    }

    fn limit(&self) -> u64 {
        self.policy.as_ref().map_or(0, |p| p.limit)
    }

    fn window_ms(&self) -> u64 {
        self.policy.as_ref().map_or(1, |p| p.window_ms)
    }

    fn tokens(&self) -> u64 {
        self.working.as_ref().map_or(0, |w| w.request.tokens)
    }

    fn credits(&self, served: Served) -> Acquired {
        Acquired::Credits {
            served,
            limit: self.limit(),
            shadow_would_deny: false,
        }
    }

    fn counter_begin(&mut self, now: Now, out: &mut Vec<Action<R>>) {
        let tokens = self.tokens();
        // A request served whole (a probe, a charge) that finds fewer
        // credits held than it asks leases the difference first, once:
        // served in part now, it would be denied (or short) while the
        // window may still have them.
        let leases_shortfall = self
            .working
            .as_ref()
            .is_some_and(|w| w.request.serving.leases_shortfall());
        let shortfall = if leases_shortfall {
            tokens.saturating_sub(self.counter.balance(now.mono_ms))
        } else {
            0
        };
        if shortfall == 0 {
            if let Some(served) = self.counter.serve(tokens, now.mono_ms) {
                let answer = self.credits(served);
                self.finish(Ok(answer), now, out);
                return;
            }
        }
        let want = if shortfall > 0 { shortfall } else { tokens };
        if let Some(ticket) = self.counter.send_lease(want, now.mono_ms) {
            self.outbound = Some(Outbound::Lease { ticket: ticket.id });
            if let Some(working) = self.working.as_mut() {
                working.stage = Stage::Lease;
            }
            out.push(Action::SendLease(ticket));
            return;
        }
        self.counter_settle(None, now, out);
    }

    fn on_lease_granted(
        &mut self,
        ticket: u64,
        grant: CoordinatorGrant,
        now: Now,
        out: &mut Vec<Action<R>>,
    ) {
        if !self.outbound_is(Outbound::Lease { ticket }) {
            // Counted by the escrow as unexpected, never credited.
            self.counter.on_grant_for(ticket, grant, now.mono_ms);
            return;
        }
        self.outbound = None;
        self.last_window_end_ms = grant.window_end_ms;
        let retry_after_ms = (grant.granted == 0).then(|| grant.remaining_lifetime_ms.max(1));
        let credited_before = self.counter.counters().tokens_credited;
        let back = self.counter.on_grant_for(ticket, grant, now.mono_ms);
        let credited = self.counter.counters().tokens_credited - credited_before;
        self.note_credited(grant.window_start_ms, credited);
        if let Some(back) = back {
            out.push(Action::Reconcile(back));
        }
        // A grant that came back after its window ended is handed back,
        // uncredited; it says nothing of the window now current. The
        // request it was for leases once more instead of being denied for
        // want of a budget nobody has asked about yet.
        let late = grant.granted > 0 && credited == 0;
        if let Some(working) = self.working.as_mut().filter(|w| late && !w.leased_again) {
            working.leased_again = true;
            working.answered = Some(true);
            self.counter_begin(now, out);
            return;
        }
        self.after_lease(retry_after_ms, Some(true), now, out);
    }

    /// Counts a grant's credited tokens towards its window's total.
    fn note_credited(&mut self, window_start_ms: u64, credited: u64) {
        if self.window_credit.0 != window_start_ms {
            self.window_credit = (window_start_ms, 0);
        }
        self.window_credit.1 = self.window_credit.1.saturating_add(credited);
    }

    /// The working request once its lease is settled: serve, else the
    /// outage policy, else deny.
    fn after_lease(
        &mut self,
        retry_after_ms: Option<u64>,
        answered: Option<bool>,
        now: Now,
        out: &mut Vec<Action<R>>,
    ) {
        let Some(working) = self.working.as_mut() else {
            return;
        };
        working.answered = answered;
        let tokens = working.request.tokens;
        if let Some(served) = self.counter.serve(tokens, now.mono_ms) {
            let answer = self.credits(served);
            self.finish(Ok(answer), now, out);
            return;
        }
        self.counter_settle(retry_after_ms, now, out);
    }

    fn counter_settle(&mut self, retry_after_ms: Option<u64>, now: Now, out: &mut Vec<Action<R>>) {
        let tokens = self.tokens();
        if self.counter.coordinator_unreachable() {
            // Fallback credits live only for the rest of the local window.
            let window_ms = self.window_ms();
            if let Some(served) = self.counter.serve_outage_at(tokens, now.wall_ms, window_ms) {
                let answer = self.credits(served);
                self.finish(Ok(answer), now, out);
                return;
            }
        }
        let answer = Acquired::Denied {
            retry_after_ms: retry_after_ms
                .unwrap_or_else(|| self.counter.retry_after_ms(now.mono_ms)),
            limit: self.limit(),
            window_end_ms: self.last_window_end_ms,
            fair_throttled: false,
        };
        self.finish(Ok(answer), now, out);
    }

    fn working_tenant(&self) -> Result<TenantId, Refused<R>> {
        match self.working.as_ref().and_then(|w| w.request.tenant.clone()) {
            Some(tenant) => Ok(tenant),
            None => TenantId::new(DEFAULT_TENANT).map_err(|e| Refused::Internal(e.to_string())),
        }
    }

    fn fair_begin(&mut self, now: Now, out: &mut Vec<Action<R>>) {
        let tenant = match self.working_tenant() {
            Ok(tenant) => tenant,
            Err(refused) => {
                self.finish(Err(refused), now, out);
                return;
            }
        };
        let tokens = self.tokens();
        let max_tenants = self.config.max_tenants;
        self.fair
            .get_or_insert_with(|| FairKey::new(max_tenants))
            .note_demand(&tenant, tokens);
        self.fair_continue(MAX_POOL_ASKS_PER_CHECK, now, out);
    }

    /// One step of the working request's weighted-fair decision over the
    /// region's pool grant: admit, deny, or ask the pool (at most
    /// `asks_left` more times; the answer brings the next step).
    fn fair_continue(&mut self, asks_left: usize, now: Now, out: &mut Vec<Action<R>>) {
        let tenant = match self.working_tenant() {
            Ok(tenant) => tenant,
            Err(refused) => {
                self.finish(Err(refused), now, out);
                return;
            }
        };
        let Some(working) = self.working.as_ref() else {
            return;
        };
        let (weight, cost, whole_or_nothing) = (
            working.request.weight.max(1),
            working.request.tokens,
            working.request.serving.whole_or_nothing(),
        );
        let (limit, max_tenants) = (self.limit(), self.config.max_tenants);
        if asks_left == 0 {
            let answer = Acquired::Denied {
                retry_after_ms: 1,
                limit,
                window_end_ms: self.last_window_end_ms,
                fair_throttled: false,
            };
            self.finish(Ok(answer), now, out);
            return;
        }
        let asks_left = asks_left - 1;
        let lease_size = self.counter.lease_size();
        let step = self
            .fair
            .get_or_insert_with(|| FairKey::new(max_tenants))
            .decide(
                &tenant,
                weight,
                cost,
                lease_size,
                whole_or_nothing,
                now.mono_ms,
            );
        // Answers carry the key's limit L (the proto's contract), not
        // the tenant's ceiling in the region.
        let (region_weight, want_total) = match step {
            FairStep::Admit { served, .. } => {
                let answer = self.credits(served);
                self.finish(Ok(answer), now, out);
                return;
            }
            FairStep::Deny {
                retry_after_ms,
                window_end_ms,
                ..
            } => {
                let answer = Acquired::Denied {
                    retry_after_ms,
                    limit,
                    window_end_ms,
                    fair_throttled: false,
                };
                self.finish(Ok(answer), now, out);
                return;
            }
            FairStep::Join {
                region_weight,
                want_total,
            }
            | FairStep::Ask {
                region_weight,
                want_total,
            } => (region_weight, want_total.min(limit.max(cost))),
        };
        // At most one pool call per probe interval while the
        // coordinator is unreachable.
        if !self.counter.outage_mut().may_call(now.mono_ms) {
            let answer = self.fair_outage(now);
            self.finish(Ok(answer), now, out);
            return;
        }
        // A pending release goes first, with its own id.
        if self.send_pending_release(now, out) {
            if let Some(working) = self.working.as_mut() {
                working.stage = Stage::ReleaseBeforeAsk {
                    region_weight,
                    want_total,
                    asks_left,
                };
            }
            return;
        }
        self.send_pool_grant(region_weight, want_total, asks_left, false, now, out);
    }

    /// Sends a pool ask; `then_retire`: a surplus check's raise, retired at
    /// once when answered.
    fn send_pool_grant(
        &mut self,
        region_weight: u64,
        want_total: u64,
        asks_left: usize,
        then_retire: bool,
        now: Now,
        out: &mut Vec<Action<R>>,
    ) {
        let (demand_window_ms, demands) = self
            .fair
            .as_ref()
            .and_then(|fair| fair.demand_report(now.mono_ms))
            .unwrap_or_default();
        let call = self.next_call_id();
        let lease_size = self.counter.lease_size();
        let join_next = match self.fair.as_mut() {
            Some(fair) => {
                let join_id = self.next_call + 1;
                let join = fair.join_ahead(join_id, lease_size, now.mono_ms);
                if join.is_some() {
                    self.next_call = join_id;
                }
                join
            }
            None => None,
        };
        self.outbound = Some(Outbound::Pool {
            call,
            want_total,
            sent_ms: now.mono_ms,
            demand_window_ms,
            then_retire,
            join_want: join_next.as_ref().map(|j| j.want_total),
        });
        if let Some(working) = self.working.as_mut() {
            working.stage = Stage::Pool { asks_left };
        }
        let want_more = self
            .fair
            .as_ref()
            .map_or(want_total, |fair| fair.want_more(want_total, now.mono_ms));
        out.push(Action::SendPoolGrant {
            call,
            region_weight,
            want_total,
            want_more,
            demand_window_ms,
            demands,
            join_next,
        });
    }

    fn on_pool_granted(
        &mut self,
        call: u64,
        answer: PoolAnswer,
        tenant_demands: Vec<(TenantId, u64)>,
        next_window: Option<(PoolAnswer, Vec<(TenantId, u64)>)>,
        now: Now,
        out: &mut Vec<Action<R>>,
    ) {
        let Some(Outbound::Pool {
            call: sent_call,
            want_total,
            sent_ms,
            demand_window_ms,
            then_retire,
            join_want,
        }) = self.outbound
        else {
            return;
        };
        if sent_call != call {
            return;
        }
        self.outbound = None;
        self.counter.outage_mut().on_answer();
        // Other regions release after `pool_release_idle_ms` of quiet: at
        // the ceiling, look again at that cadence, at most every quarter
        // window.
        let window_ms = answer.window.end_ms.saturating_sub(answer.window.start_ms);
        let re_ask_ms = self.re_ask_ms(answer.window);
        let max_tenants = self.config.max_tenants;
        let fair = self.fair.get_or_insert_with(|| FairKey::new(max_tenants));
        // The answer's totals are the settled ones: for the window before
        // the reported one.
        fair.on_tenant_demands(demand_window_ms.saturating_sub(window_ms), tenant_demands);
        fair.on_pool_answer(answer, want_total, sent_ms, now.mono_ms, re_ask_ms);
        if let (Some((next, demands)), Some(join_want)) = (next_window, join_want) {
            fair.on_ahead_answer(next, demands, join_want, sent_ms, now.mono_ms, re_ask_ms);
        }
        self.last_window_end_ms = answer.window.end_ms;
        if then_retire && self.working.is_none() {
            self.release_pool(now, out);
            return;
        }
        let Some(working) = self.working.as_mut() else {
            return;
        };
        working.answered = Some(true);
        if let Stage::Pool { asks_left } = working.stage {
            self.fair_continue(asks_left, now, out);
        }
    }

    /// How long a key at the pool's ceiling waits before looking again in
    /// `window`: other regions release after `pool_release_idle_ms` of
    /// quiet, so at that cadence, at most every quarter window.
    fn re_ask_ms(&self, window: WindowBounds) -> u64 {
        let window_ms = window.end_ms.saturating_sub(window.start_ms);
        match self.config.pool_release_idle_ms {
            0 => window_ms / 4,
            idle_ms => (window_ms / 4).min(idle_ms.max(100)),
        }
    }

    /// The working request once the release it waited on is settled
    /// (`resolved`: nothing pending any more).
    fn after_release(&mut self, resolved: bool, now: Now, out: &mut Vec<Action<R>>) {
        let Some(Stage::ReleaseBeforeAsk {
            region_weight,
            want_total,
            asks_left,
        }) = self.working.as_ref().map(|w| w.stage)
        else {
            return;
        };
        if resolved {
            self.send_pool_grant(region_weight, want_total, asks_left, false, now, out);
        } else {
            let answer = self.fair_outage(now);
            self.finish(Ok(answer), now, out);
        }
    }

    /// A fair key's request while the coordinator cannot be reached and
    /// its pool grant cannot cover it: the key's outage policy decides,
    /// through the same gate as counter keys.
    fn fair_outage(&mut self, now: Now) -> Acquired {
        let (tokens, limit, window_ms) = (self.tokens(), self.limit(), self.window_ms());
        let probe_ms = self.config.probe_interval_ms.max(1);
        let gate = self.counter.outage_mut();
        if let Some(served) = gate.serve_at(tokens, now.wall_ms, window_ms) {
            return self.credits(served);
        }
        Acquired::Denied {
            retry_after_ms: gate.retry_after_ms(now.mono_ms).unwrap_or(probe_ms),
            limit,
            window_end_ms: self.last_window_end_ms,
            fair_throttled: false,
        }
    }

    /// The end of an acquisition's pipeline: whole-or-nothing, throttle
    /// feedback, shadow, the holder's record, the answer.
    fn finish(&mut self, result: Result<Acquired, Refused<R>>, now: Now, out: &mut Vec<Action<R>>) {
        let Some(working) = self.working.take() else {
            return;
        };
        let tokens = working.request.tokens;
        let mut result = result;
        if working.request.serving.whole_or_nothing() {
            result = result.map(|answer| self.whole_or_nothing(tokens, answer, now.mono_ms));
        }
        if working.request.serving == Serving::Probe {
            result = result.map(|answer| self.put_back(answer, now.mono_ms));
        }
        if let (Some(caller), Ok(answer)) = (&working.learns, &result) {
            let node_reachable = working.answered.unwrap_or(working.request.node_reachable);
            self.learn(caller, answer, node_reachable, now.mono_ms);
        }
        let answer = match result {
            Ok(answer) => self.shadow(tokens, answer, now, out),
            Err(refused) => {
                out.push(Action::Answer {
                    id: working.request.id,
                    answer: Err(refused),
                });
                return;
            }
        };
        if let Some(ticket) = working.holder_ticket {
            let held = match answer {
                Acquired::Credits { served, .. } if !served.from_fallback => Some(HolderHeld {
                    tenant: working.request.tenant.clone(),
                    window_start_ms: served.window_start_ms,
                    tokens: served.granted,
                    deadline_ms: now.mono_ms.saturating_add(served.remaining_lifetime_ms),
                }),
                _ => None,
            };
            self.book.record_acquire(ticket, answer, held, now.mono_ms);
        }
        out.push(Action::Answer {
            id: working.request.id,
            answer: Ok(answer),
        });
    }

    /// Turns a partial serve into a denial, putting the partial back into
    /// the escrow through the same capped path as any return.
    fn whole_or_nothing(&mut self, tokens: u64, answer: Acquired, now_ms: u64) -> Acquired {
        match answer {
            Acquired::Credits { served, limit, .. } if served.granted < tokens => {
                if !served.from_fallback {
                    self.counter
                        .take_back(served.granted, served.window_start_ms, now_ms);
                }
                Acquired::Denied {
                    retry_after_ms: served.remaining_lifetime_ms.max(1),
                    limit,
                    window_end_ms: served.window_end_ms,
                    fair_throttled: false,
                }
            }
            other => other,
        }
    }

    /// A probe's answer: what a serve handed out goes back into the
    /// escrow, and the answer says so (`granted` 0, `held_after` with it).
    fn put_back(&mut self, answer: Acquired, now_ms: u64) -> Acquired {
        match answer {
            Acquired::Credits {
                mut served,
                limit,
                shadow_would_deny,
            } if !served.from_fallback && served.granted > 0 => {
                let back = self
                    .counter
                    .take_back(served.granted, served.window_start_ms, now_ms);
                served.granted -= back;
                served.held_after = served.held_after.saturating_add(back);
                Acquired::Credits {
                    served,
                    limit,
                    shadow_would_deny,
                }
            }
            other => other,
        }
    }

    /// Feeds the fair throttle what the escrow rules answered a passed
    /// request: served, or denied for want of budget. A denial during a
    /// coordinator outage says nothing about the caller and is not fed.
    fn learn(&mut self, caller: &[u8], answer: &Acquired, node_reachable: bool, now_ms: u64) {
        let served = match answer {
            Acquired::Credits { served, .. } => served.granted > 0,
            Acquired::Denied { .. }
                if self.counter.coordinator_unreachable() || !node_reachable =>
            {
                return
            }
            Acquired::Denied { .. } => false,
        };
        if let (Some(throttle), Ok(id)) = (self.throttle.as_mut(), CallerId::new(caller)) {
            throttle.gate.record(id, served, now_ms);
        }
    }

    /// Shadow mode: a denial of a key whose policy is in shadow mode becomes
    /// an admission of the `tokens` asked, counted as would-deny.
    fn shadow(
        &mut self,
        tokens: u64,
        answer: Acquired,
        now: Now,
        out: &mut Vec<Action<R>>,
    ) -> Acquired {
        let Acquired::Denied { limit, .. } = answer else {
            return answer;
        };
        let Some(policy) = self.policy.as_ref().filter(|p| p.shadow) else {
            return answer;
        };
        out.push(Action::CountShadowWouldDeny { tokens });
        let served = RegionEscrow::serve_shadow_at(tokens, now.wall_ms, policy.window_ms);
        Acquired::Credits {
            served,
            limit,
            shadow_would_deny: true,
        }
    }
}

#[cfg(test)]
mod tests;
