//! What the in-process fleet tests share: a seeded generator, a delaying
//! network that may reorder messages, each region's key machine
//! ([`region`]), and the real coordinator state machine driven through
//! proposals the way a Raft leader would drive it, answering the regions'
//! calls as the coordinator's API answers them.

#![allow(dead_code)]

pub mod region;

use std::collections::{BTreeMap, VecDeque};

use leasehold_core::coordinator::{
    Command, CommandError, CoordinatorState, LeaseGrant, Outcome, PoolGrantOutcome,
    PoolReleaseDisposition, Proposal, ReconcileOutcome,
};
use leasehold_core::escrow::machine::{Action, Event, Now};
use leasehold_core::escrow::{
    CoordinatorGrant, JoinAhead, PendingRelease, PoolAnswer, Reconcile, ReleaseAnswer, Served,
};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId, TenantId};
use leasehold_core::policy::{OutagePolicy, Policy, PolicyKind};
use leasehold_core::pool::desk::{GrantNotes, PoolCall, PoolDesk};
use leasehold_core::pool::holder_weights::Holder;
use leasehold_core::principal::Principal;
use leasehold_core::window::WindowBounds;

use region::{failed, Call, Region};

/// A tiny seeded generator (xorshift64) so every run is reproducible by seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Uniform in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Messages in flight, each delivered at its own time; equal times keep
/// their sending order. Random delays reorder messages.
pub struct Network<M> {
    in_flight: Vec<(u64, u64, M)>,
    sent: u64,
}

impl<M> Default for Network<M> {
    fn default() -> Self {
        Network {
            in_flight: Vec::new(),
            sent: 0,
        }
    }
}

impl<M> Network<M> {
    pub fn send(&mut self, deliver_at: u64, message: M) {
        self.sent += 1;
        self.in_flight.push((deliver_at, self.sent, message));
    }

    /// Removes and returns every message due at `now`, in delivery order.
    pub fn due(&mut self, now: u64) -> Vec<M> {
        let mut due = Vec::new();
        let mut i = 0;
        while i < self.in_flight.len() {
            if self.in_flight[i].0 <= now {
                due.push(self.in_flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|(at, seq, _)| (*at, *seq));
        due.into_iter().map(|(_, _, m)| m).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }
}

/// What becomes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Applied and answered.
    Answered,
    /// Applied, answer lost (the caller sees a failure).
    Lost,
    /// Never arrived.
    NotApplied,
}

/// The coordinator state machine of one key, driven by proposals stamped
/// with the coordinator's clock, and the leader's demand board.
pub struct Coordinator {
    pub state: CoordinatorState,
    pub key: Key,
    pub policy: Policy,
    /// The leader's pool desk, as the coordinator's API drives it (see
    /// `PoolDesk::without_demand_totals` for a leader that answers none).
    pub desk: PoolDesk,
    /// Per region: the release id it last sent and the request id that
    /// went under (every resend of a release carries the same one, as the
    /// node sends it).
    releases: BTreeMap<usize, (u64, RequestId)>,
    /// Per holder (the index the simulation calls with: one escrow node's
    /// key machine), the region it serves when not its own index
    /// ([`Coordinator::place`]).
    homes: BTreeMap<usize, usize>,
    /// Per holder, its process incarnation: a restarted process draws
    /// request ids under a client id of its own ([`Coordinator::restart`]).
    incarnations: BTreeMap<usize, u64>,
    /// Per holder, the last seq drawn under its client id: every pool call
    /// of one process goes under one client id, as the node's do (its
    /// session names the holder to the leader's desk).
    seqs: BTreeMap<usize, u64>,
    /// Per (holder, join id of its key machine): the request id that join
    /// went under (a resend carries the same).
    joins: BTreeMap<(usize, u64), RequestId>,
    /// Whether holders name their node (`PoolGrantRequest.node`, the same
    /// across restarts, as escrow nodes do) or only their process (an
    /// older escrow node: each restart a holder of its own).
    pub named_nodes: bool,
}

pub fn region(i: usize) -> RegionId {
    RegionId::new(format!("r{i}")).expect("valid region id")
}

/// The fleet's policy: `fleet/` at `limit` per `window_ms`.
pub fn policy(limit: u64, window_ms: u64, kind: PolicyKind, outage: OutagePolicy) -> Policy {
    Policy {
        prefix: "fleet/".into(),
        limit,
        window_ms,
        kind,
        outage,
        shadow: false,
    }
}

impl Coordinator {
    pub fn new(limit: u64, window_ms: u64, kind: PolicyKind, stamp_ms: u64) -> Self {
        Self::with_policy(
            policy(limit, window_ms, kind, OutagePolicy::FailClosed),
            stamp_ms,
        )
    }

    pub fn with_policy(policy: Policy, stamp_ms: u64) -> Self {
        let mut state = CoordinatorState::default();
        let result = state.apply(&Proposal {
            stamp_ms,
            commands: vec![Command::SetPolicy(policy.clone())],
        });
        assert_eq!(result.outcomes, vec![Outcome::PolicySet]);
        Coordinator {
            state,
            key: Key::new("fleet/key").expect("valid key"),
            policy,
            desk: PoolDesk::new(),
            releases: BTreeMap::new(),
            homes: BTreeMap::new(),
            incarnations: BTreeMap::new(),
            seqs: BTreeMap::new(),
            joins: BTreeMap::new(),
            named_nodes: true,
        }
    }

    /// Holder `holder` (the index calls are made with) serves region
    /// `region_index`: a second escrow node of that region.
    pub fn place(&mut self, holder: usize, region_index: usize) {
        self.homes.insert(holder, region_index);
    }

    /// Holder `holder`'s process restarts (its memory lost): its calls
    /// from now on go under request ids of a new client id, as a new
    /// process draws one.
    pub fn restart(&mut self, holder: usize) {
        *self.incarnations.entry(holder).or_default() += 1;
        self.releases.remove(&holder);
        self.seqs.remove(&holder);
        self.joins.retain(|(of, _), _| *of != holder);
    }

    /// The region holder `holder` serves.
    pub fn region_of(&self, holder: usize) -> RegionId {
        region(self.homes.get(&holder).copied().unwrap_or(holder))
    }

    /// Holder `holder`'s client id in its current incarnation: the
    /// holder its pool calls name, as a node names its client id.
    fn client_of(&self, holder: usize) -> ClientId {
        let client = match self.incarnations.get(&holder) {
            Some(incarnation) => format!("escrow-r{holder}-i{incarnation}"),
            None => format!("escrow-r{holder}"),
        };
        ClientId::new(client).expect("valid client id")
    }

    /// Who holder `holder`'s pool calls declare for: the node it names
    /// (the same across its restarts, as an escrow node's `--node-name`),
    /// or without [`Coordinator::named_nodes`] its current incarnation's
    /// session.
    fn holder_of(&self, holder: usize) -> Holder {
        let node = self
            .named_nodes
            .then(|| ClientId::new(format!("node-{holder}")).expect("valid node name"));
        Holder::of(&Principal::Anonymous, node, Some(self.client_of(holder)))
    }

    /// A new request id of holder `holder` in its current incarnation.
    fn next_request_id(&mut self, holder: usize) -> RequestId {
        let client = self.client_of(holder);
        let seq = self.seqs.entry(holder).or_default();
        *seq += 1;
        RequestId { client, seq: *seq }
    }

    fn apply(&mut self, stamp_ms: u64, command: Command) -> Outcome {
        let mut result = self.state.apply(&Proposal {
            stamp_ms,
            commands: vec![command],
        });
        assert_eq!(result.outcomes.len(), 1);
        result.outcomes.remove(0)
    }

    pub fn lease(&mut self, region_index: usize, tokens: u64, stamp_ms: u64) -> LeaseGrant {
        match self.lease_outcome(region_index, tokens, stamp_ms) {
            Outcome::Lease(grant) => grant,
            other => panic!("lease answered {other:?}"),
        }
    }

    fn lease_outcome(&mut self, region_index: usize, tokens: u64, stamp_ms: u64) -> Outcome {
        let command = Command::Lease {
            key: self.key.clone(),
            region: self.region_of(region_index),
            tokens,
            request_id: None,
            caller: Principal::Anonymous,
        };
        self.apply(stamp_ms, command)
    }

    pub fn reconcile(
        &mut self,
        region_index: usize,
        back: Reconcile,
        stamp_ms: u64,
    ) -> ReconcileOutcome {
        let command = Command::Reconcile {
            key: self.key.clone(),
            region: self.region_of(region_index),
            leftover: back.leftover,
            window_start_ms: back.window_start_ms,
            request_id: None,
            caller: Principal::Anonymous,
        };
        match self.apply(stamp_ms, command) {
            Outcome::Reconcile(outcome) => outcome,
            other => panic!("reconcile answered {other:?}"),
        }
    }

    /// Applies region `region_index`'s `call` at `stamp_ms` and answers it
    /// as the coordinator's API does, as the event the region's machine is
    /// fed (`None` for a reconcile, which is not answered).
    pub fn answer(
        &mut self,
        region_index: usize,
        call: &Call,
        stamp_ms: u64,
    ) -> Option<Event<CommandError>> {
        match call {
            Action::SendLease(ticket) => {
                let event = match self.lease_outcome(region_index, ticket.tokens, stamp_ms) {
                    Outcome::Lease(grant) => Event::LeaseGranted {
                        ticket: ticket.id,
                        grant: as_escrow_grant(&grant),
                    },
                    Outcome::Rejected(refusal) => Event::LeaseRefused {
                        ticket: ticket.id,
                        refusal,
                    },
                    other => panic!("lease answered {other:?}"),
                };
                Some(event)
            }
            ask @ Action::SendPoolGrant { .. } => {
                Some(self.pool_grant(region_index, ask, stamp_ms))
            }
            Action::SendPoolRelease(pending) => {
                Some(self.pool_release(region_index, pending, stamp_ms))
            }
            Action::Reconcile(back) => {
                self.reconcile(region_index, *back, stamp_ms);
                None
            }
            other => panic!("{other:?} is not a coordinator call"),
        }
    }

    /// A pool grant ask, answered as the coordinator's API answers it: the
    /// leader's desk plans the commands (capped ask, lapses, the join) and
    /// notes the answer (standing, the settled totals the report earns).
    fn pool_grant(
        &mut self,
        region_index: usize,
        ask: &Call,
        stamp_ms: u64,
    ) -> Event<CommandError> {
        let Action::SendPoolGrant {
            call,
            region_weight,
            want_total,
            want_more,
            demand_window_ms,
            demands,
            join_next,
        } = ask
        else {
            panic!("{ask:?} is not a pool grant");
        };
        let region_id = self.region_of(region_index);
        let request_id = self.next_request_id(region_index);
        let holder = self.holder_of(region_index);
        let command = Command::PoolGrant {
            key: self.key.clone(),
            region: region_id.clone(),
            region_weight: *region_weight,
            want_total: *want_total,
            request_id: Some(request_id),
            caller: Principal::Anonymous,
        };
        let join = join_next
            .as_ref()
            .map(|join| (self.join_command(region_index, join), join.want_more));
        let pool_call = PoolCall {
            command,
            holder: holder.clone(),
            want_more: *want_more,
            join,
        };
        let (outcome, join_outcome) = self.propose(pool_call, stamp_ms);
        match outcome {
            Outcome::PoolGrant(grant) => {
                let notes = self.desk.grant_notes(
                    &self.state,
                    &self.key,
                    (&region_id, &holder),
                    &grant,
                    Some((*demand_window_ms, demands)),
                );
                let (next_window, next_window_demands) =
                    self.join_answer(region_index, join_next.as_ref(), join_outcome);
                Event::PoolGranted {
                    call: *call,
                    answer: pool_answer(&grant, &notes),
                    tenant_demands: notes.settled_tenant_demands,
                    next_window,
                    next_window_demands,
                }
            }
            Outcome::Rejected(refusal) => Event::PoolRefused {
                call: *call,
                refusal,
            },
            other => panic!("pool grant answered {other:?}"),
        }
    }

    /// Applies pool call `command` with its join ahead as the leader's desk
    /// plans them, at `stamp_ms`: the call's outcome and the join's.
    fn propose(&mut self, call: PoolCall, stamp_ms: u64) -> (Outcome, Option<Outcome>) {
        let (commands, receipt) = self
            .desk
            .plan(&self.state, call, stamp_ms, &Principal::Member(1))
            .into_parts();
        let outcomes = self.state.apply(&Proposal { stamp_ms, commands }).outcomes;
        let finished = self
            .desk
            .finish(receipt, outcomes)
            .expect("one outcome per command");
        (finished.call, finished.join)
    }

    /// A pool release (or its resend), answered.
    fn pool_release(
        &mut self,
        region_index: usize,
        pending: &PendingRelease<u64>,
        stamp_ms: u64,
    ) -> Event<CommandError> {
        let release = pending.request_id;
        let request_id = self.release_request_id(region_index, release);
        let holder = self.holder_of(region_index);
        let command = Command::PoolRelease {
            key: self.key.clone(),
            region: self.region_of(region_index),
            from_total: pending.from_total,
            keep_total: pending.keep_total,
            window_start_ms: pending.window.start_ms,
            request_id: Some(request_id),
            caller: Principal::Anonymous,
        };
        let join = pending
            .join_next
            .as_ref()
            .map(|join| (self.join_command(region_index, join), join.want_more));
        let call = PoolCall {
            command,
            holder: holder.clone(),
            want_more: 0,
            join,
        };
        let (outcome, join_outcome) = self.propose(call, stamp_ms);
        match outcome {
            Outcome::PoolRelease(outcome) => {
                // The leader remembers late hand-backs, as the API does.
                let region_id = self.region_of(region_index);
                self.desk
                    .note_release(&self.key, (&region_id, &holder), &outcome, stamp_ms);
                let (next_window, next_window_demands) =
                    self.join_answer(region_index, pending.join_next.as_ref(), join_outcome);
                Event::ReleaseAnswered {
                    release,
                    answer: match outcome.disposition {
                        PoolReleaseDisposition::Released => ReleaseAnswer::Released {
                            released: outcome.released,
                            granted_total: outcome.granted_total,
                        },
                        PoolReleaseDisposition::StaleTotal => ReleaseAnswer::StaleTotal {
                            granted_total: outcome.granted_total,
                        },
                        PoolReleaseDisposition::WindowEnded => ReleaseAnswer::WindowEnded,
                    },
                    next_window,
                    next_window_demands,
                }
            }
            Outcome::Rejected(_) => Event::ReleaseRefused { release },
            other => panic!("pool release answered {other:?}"),
        }
    }

    /// The join of the next window region `region_index`'s call carries,
    /// under the region's join session (the desk caps its ask).
    fn join_command(&mut self, region_index: usize, join: &JoinAhead<u64>) -> Command {
        let request_id = match self.joins.get(&(region_index, join.request_id)) {
            Some(request_id) => request_id.clone(),
            None => {
                let request_id = self.next_request_id(region_index);
                self.joins
                    .insert((region_index, join.request_id), request_id.clone());
                request_id
            }
        };
        Command::PoolJoinNext {
            key: self.key.clone(),
            region: self.region_of(region_index),
            region_weight: join.region_weight,
            want_total: join.want_total,
            window_start_ms: join.window_start_ms,
            retire: join.retire,
            request_id: Some(request_id),
            caller: Principal::Anonymous,
        }
    }

    /// The answer of a join ahead: its grant with the desk's notes in the
    /// window joined (`None` when it was refused or not made), and the
    /// settled totals its demand report earns, as the API answers them.
    fn join_answer(
        &mut self,
        region_index: usize,
        join: Option<&JoinAhead<u64>>,
        outcome: Option<Outcome>,
    ) -> (Option<PoolAnswer>, Vec<(TenantId, u64)>) {
        let (Some(join), Some(Outcome::PoolGrant(grant))) = (join, outcome) else {
            return (None, Vec::new());
        };
        let region_id = self.region_of(region_index);
        let holder = self.holder_of(region_index);
        let notes = self.desk.join_notes(
            &self.state,
            &self.key,
            (&region_id, &holder),
            &grant,
            join.window_start_ms,
            &join.demands,
        );
        (
            Some(pool_answer(&grant, &notes)),
            notes.settled_tenant_demands,
        )
    }

    /// The request id of region `region_index`'s release `release`: the
    /// one it first went under, or the region's next seq for a new one.
    fn release_request_id(&mut self, region_index: usize, release: u64) -> RequestId {
        if let Some((id, request_id)) = self.releases.get(&region_index) {
            if *id == release {
                return request_id.clone();
            }
        }
        let request_id = self.next_request_id(region_index);
        self.releases
            .insert(region_index, (release, request_id.clone()));
        request_id
    }

    /// Performs region `region_index`'s `calls` at once — each applied at
    /// `stamp_ms` and answered, or lost, as `delivery` says — and feeds
    /// every answer back, until the region waits on nothing: a network
    /// without delay.
    pub fn settle(
        &mut self,
        region_index: usize,
        node: &mut Region,
        calls: Vec<Call>,
        stamp_ms: u64,
        now: Now,
        mut delivery: impl FnMut(&Call) -> Delivery,
    ) {
        let mut calls = VecDeque::from(calls);
        while let Some(call) = calls.pop_front() {
            let event = match delivery(&call) {
                Delivery::Answered => self.answer(region_index, &call, stamp_ms),
                Delivery::Lost => {
                    self.answer(region_index, &call, stamp_ms);
                    failed(&call)
                }
                Delivery::NotApplied => failed(&call),
            };
            if let Some(event) = event {
                calls.extend(node.feed(event, now));
            }
        }
    }
}

/// What a fleet admitted, per coordinator window and per whoever the
/// simulation tells apart (a region, a tenant), and how many admissions
/// were made at or after their window's end on the coordinator's clock.
pub struct Admissions<K> {
    pub per_window: BTreeMap<u64, BTreeMap<K, u64>>,
    pub late: u64,
}

impl<K> Default for Admissions<K> {
    fn default() -> Self {
        Admissions {
            per_window: BTreeMap::new(),
            late: 0,
        }
    }
}

impl<K: Ord> Admissions<K> {
    /// Counts `served`, admitted to `who` at `coordinator_now_ms`.
    pub fn record(&mut self, who: K, served: &Served, coordinator_now_ms: u64) {
        *self
            .per_window
            .entry(served.window_start_ms)
            .or_default()
            .entry(who)
            .or_default() += served.granted;
        if coordinator_now_ms >= served.window_end_ms {
            self.late += 1;
        }
    }

    /// Σ admitted in the window starting at `window_start_ms`.
    pub fn total(&self, window_start_ms: u64) -> u64 {
        self.per_window
            .get(&window_start_ms)
            .map_or(0, |who| who.values().sum())
    }

    /// Σ admitted per window.
    pub fn totals(&self) -> BTreeMap<u64, u64> {
        self.per_window
            .keys()
            .map(|window| (*window, self.total(*window)))
            .collect()
    }

    /// What `who` was admitted in the window starting at `window_start_ms`.
    pub fn of(&self, window_start_ms: u64, who: &K) -> u64 {
        self.per_window
            .get(&window_start_ms)
            .and_then(|m| m.get(who))
            .copied()
            .unwrap_or(0)
    }
}

/// What the escrow sees of a grant: the window and the relative lifetime.
pub fn as_escrow_grant(grant: &LeaseGrant) -> CoordinatorGrant {
    CoordinatorGrant {
        granted: grant.granted,
        window_start_ms: grant.window_start_ms,
        window_end_ms: grant.window_end_ms,
        remaining_lifetime_ms: grant.window_end_ms - grant.coordinator_now_ms,
    }
}

/// A pool grant as the escrow node's key machine reads the API's answer:
/// the outcome with the desk's notes.
fn pool_answer(grant: &PoolGrantOutcome, notes: &GrantNotes) -> PoolAnswer {
    PoolAnswer {
        granted_total: grant.granted_total,
        granted_increment: grant.granted_increment,
        limit: grant.limit,
        window: WindowBounds {
            start_ms: grant.window_start_ms,
            end_ms: grant.window_end_ms,
        },
        remaining_lifetime_ms: grant.window_end_ms - grant.coordinator_now_ms,
        standing: notes.standing,
        expected: notes.expected,
        reserved_unheld: notes.reserved_unheld,
        retired_kept: notes.retired_kept,
        late_released_before: notes.late_released_before,
    }
}
