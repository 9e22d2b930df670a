//! One actor per key: a handle (bounded mailbox) and a task that performs
//! what the key's sans-IO [`KeyMachine`] decides. The machine (core) holds
//! every rule of the key — counter leases, fair pool grants and tenants,
//! outage policies, shadow, whole-or-nothing, the fair throttle, reclaim
//! and eviction timing; the actor feeds it requests, the coordinator's
//! answers and timer ticks, and performs its actions: the `Lease`,
//! `PoolGrant`, `PoolRelease` and reconcile calls, policy refreshes,
//! replies, the timer and the node's metrics.
//!
//! Requests for a key are handled one at a time: the actor drives each
//! request's events until the machine has answered it and nothing is in
//! flight, so at most one coordinator call of the key is ever outstanding.

use leasehold_client::coordinator::CoordinatorError;
use leasehold_core::coordinator::{PoolReleaseDisposition, PoolReleaseOutcome};
use leasehold_core::pool::fair_pool::PoolStanding;
use leasehold_core::principal::Principal;
use leasehold_proto::convert::coordinator::tenant_demands_to_wire;
use leasehold_proto::refusal::{refusal, refusal_with, Reason, KEY};
use leasehold_proto::v1 as pb;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::escrow::machine::{
    AcquireRequest, Action, Event, KeyMachine, KeyMachineConfig, Now, Refused, Serving,
};
use leasehold_core::escrow::{
    CoordinatorGrant, EscrowCounters, FairGateCounters, HolderCounters, HolderRefusal, JoinAhead,
    LeaseTicket, PendingRelease, PoolAnswer, ReleaseAnswer, ReturnClaim, ReturnSettled,
};
use leasehold_core::ids::TenantId;
use leasehold_core::policy::OutagePolicy;
use leasehold_core::sizer::{EoqParams, LeaseSizer};
use leasehold_core::window::WindowBounds;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};
use tracing::Instrument;

use super::fair_throttle::{caller_id, rule_for, KeyFairThrottle};
use super::key_shared::KeyShared;

pub use leasehold_core::escrow::machine::{Acquired, HolderRequest, KeyView, MAX_VIEWED_TENANTS};

/// Largest lease the EOQ sizer may ask for: past this, one region's lease
/// strands more of a window than it saves in round trips.
pub const EOQ_MAX_LEASE: u64 = 4_096;

/// Capacity of one key's mailbox: requests beyond it wait in the caller.
pub const KEY_MAILBOX_CAPACITY: usize = 256;

/// A request to a key actor.
#[derive(Debug)]
pub enum KeyRequest {
    /// Take up to `tokens` credits.
    Acquire {
        /// How many.
        tokens: u64,
        /// The asking tenant (`fair` keys; `None`: the key's default tenant).
        tenant: Option<TenantId>,
        /// The tenant's weight (≥ 1).
        weight: u64,
        /// The holder and seq, when the request carries a request id: the
        /// credits are then recorded under the holder and the answer is
        /// given once per seq. `None`: executed as it comes, not returnable.
        from: Option<HolderRequest>,
        /// Who called (the fair throttle's caller, with the holder or tenant).
        principal: Principal,
        /// How much of `tokens` may be served.
        serving: Serving,
        /// Where the answer goes.
        reply: oneshot::Sender<Result<Acquired, Status>>,
        /// The request's span: the actor works (and calls the coordinator)
        /// inside it, so the trace continues.
        span: tracing::Span,
    },
    /// Give back credits a holder acquired.
    Return {
        /// The holder and seq.
        from: HolderRequest,
        /// What it gives back.
        claim: ReturnClaim,
        /// What was taken back.
        reply: oneshot::Sender<Result<ReturnSettled, Status>>,
    },
    /// Take back credits served without a holder (an RLS refund), up to
    /// what the key served in that window and has not taken back.
    Refund {
        /// Tokens offered back.
        tokens: u64,
        /// The window they were served in.
        window_start_ms: u64,
        /// What was taken back.
        reply: oneshot::Sender<Result<ReturnSettled, Status>>,
    },
    /// A forecast of the key's demand in its next window.
    Forecast {
        /// Tokens expected.
        demand: u64,
        /// Whether the key's sizer takes forecasts.
        reply: oneshot::Sender<bool>,
    },
}

/// The gRPC status of a holder refusal, with its reason.
pub fn refusal_status(refused: &HolderRefusal) -> Status {
    let reason = match refused {
        HolderRefusal::Reused { .. } => Reason::RequestIdReused,
        HolderRefusal::Expired { .. } => Reason::SessionExpired,
        HolderRefusal::HoldersExhausted { .. }
        | HolderRefusal::PrincipalHoldersExhausted { .. } => Reason::HoldersExhausted,
    };
    refusal(reason, refused.to_string())
}

/// The coordinator's refusal of this node's call, passed on to the caller
/// with the reason the coordinator gave (a leader hint means nothing to the
/// caller: it sees the coordinator as unavailable and retries).
fn relayed(key: &str, error: &CoordinatorError) -> Status {
    match error {
        CoordinatorError::NotFound(message) => {
            refusal_with(Reason::NoPolicy, message.clone(), [(KEY, key.to_string())])
        }
        // The coordinator's message names what it refused; this node does
        // not guess which field of its own request that was.
        CoordinatorError::InvalidArgument(message) => {
            refusal(Reason::InvalidField, message.clone())
        }
        CoordinatorError::FailedPrecondition { reason, message } => {
            refusal(reason.unwrap_or(Reason::WrongKeyKind), message.clone())
        }
        other => refusal(Reason::CoordinatorUnavailable, other.to_string()),
    }
}

/// Whether the coordinator answered a lease or pool grant by refusing the
/// request itself (not an outage).
fn refused_request(error: &CoordinatorError) -> bool {
    matches!(
        error.code(),
        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition
    )
}

/// The actor is gone (evicted or stopped); the caller makes a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key's actor has stopped")]
pub struct ActorDropped;

/// The handle of one key's actor.
#[derive(Debug, Clone)]
pub struct KeyHandle {
    sender: mpsc::Sender<KeyRequest>,
    view: Arc<std::sync::Mutex<KeyView>>,
}

impl KeyHandle {
    /// Starts the actor of `key`; `on_idle` is called with the key when the
    /// actor stops taking requests because it has been idle (the table
    /// forgets it).
    pub fn spawn(key: String, shared: Arc<KeyShared>, on_idle: OnIdle) -> Self {
        let (sender, mailbox) = mpsc::channel(KEY_MAILBOX_CAPACITY);
        let view = Arc::new(std::sync::Mutex::new(KeyView::default()));
        let eoq = EoqParams {
            initial_size: shared.config.batch,
            max_size: shared.config.batch.max(EOQ_MAX_LEASE),
            ..EoqParams::default()
        };
        let sizer = shared
            .config
            .sizer
            .build(shared.config.batch, eoq)
            .unwrap_or(LeaseSizer::Fixed(shared.config.batch));
        let throttle = rule_for(&shared.config.fair_throttle, &key).and_then(|rule| {
            KeyFairThrottle::new(
                rule,
                &key,
                shared.config.fair_throttle_rng_seed,
                shared.mono_ms(),
            )
            .map_err(|e| tracing::warn!(key = %key, error = %e, "fair throttle off for this key"))
            .ok()
        });
        let has_throttle = throttle.is_some();
        let config = KeyMachineConfig {
            sizer,
            probe_interval_ms: shared.config.probe_interval_ms,
            pool_release_idle_ms: shared.config.pool_release_idle_ms,
            idle_evict_ms: shared.config.idle_evict_ms,
            max_tenants: shared.config.max_tenants,
            holder_limits: shared.config.holder_limits,
        };
        let now = shared.mono_ms();
        let machine = KeyMachine::new(config, throttle.map(KeyFairThrottle::into_front), now);
        tokio::spawn(
            KeyActor {
                wake_at_ms: machine.next_wake_ms(now),
                machine,
                key,
                on_idle,
                has_throttle,
                shared,
                mailbox,
                view: view.clone(),
                replies: HashMap::new(),
                next_request: 0,
                release_request_id: None,
                join_request_id: None,
                evicted: false,
                reported: EscrowCounters::default(),
                reported_holders: HolderCounters::default(),
                reported_fair: FairGateCounters::default(),
            }
            .run(),
        );
        KeyHandle { sender, view }
    }

    /// What the actor last published for watchers.
    pub fn view(&self) -> KeyView {
        self.view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Sends a request; fails if the actor has stopped.
    pub async fn send(&self, request: KeyRequest) -> Result<(), ActorDropped> {
        self.sender.send(request).await.map_err(|_| ActorDropped)
    }
}

/// What an idle actor calls with its key as it stops taking requests.
pub type OnIdle = Arc<dyn Fn(&str) + Send + Sync>;

/// Where a request's answer goes.
enum Reply {
    Acquire(oneshot::Sender<Result<Acquired, Status>>),
    Return(oneshot::Sender<Result<ReturnSettled, Status>>),
}

struct KeyActor {
    machine: KeyMachine<Status>,
    key: String,
    on_idle: OnIdle,
    /// Whether a fair throttle fronts the key (the caller id is then worked out).
    has_throttle: bool,
    /// All of the node the actor sees.
    shared: Arc<KeyShared>,
    mailbox: mpsc::Receiver<KeyRequest>,
    /// What watchers read (see [`KeyView`]).
    view: Arc<std::sync::Mutex<KeyView>>,
    /// The requests the machine has yet to answer, by its request id.
    replies: HashMap<u64, Reply>,
    next_request: u64,
    /// The machine's release id and the coordinator request id it is sent
    /// under (drawn when a release starts, kept for its resends).
    release_request_id: Option<(u64, pb::RequestId)>,
    /// The same for the join of the next window a call carried last.
    join_request_id: Option<(u64, pb::RequestId)>,
    /// When the machine's timer is due (monotonic ms).
    wake_at_ms: u64,
    /// The machine asked to be evicted.
    evicted: bool,
    reported: EscrowCounters,
    reported_holders: HolderCounters,
    reported_fair: FairGateCounters,
}

impl KeyActor {
    async fn run(mut self) {
        let _running = self.shared.actor_started();
        loop {
            let wait = self.wake_at_ms.saturating_sub(self.shared.mono_ms()).max(1);
            match tokio::time::timeout(Duration::from_millis(wait), self.mailbox.recv()).await {
                Ok(Some(request)) => self.receive(request).await,
                Ok(None) => break,
                Err(_) => {
                    self.drive(Event::Tick).await;
                    self.report();
                    if self.evicted {
                        // Idle: stop taking requests, hand credits back, leave the table.
                        (self.on_idle)(&self.key);
                        self.mailbox.close();
                        while let Some(request) = self.mailbox.recv().await {
                            self.receive(request).await;
                        }
                        break;
                    }
                }
            }
        }
        self.drive(Event::Shutdown).await;
        self.report();
    }

    fn now(&self) -> Now {
        Now {
            mono_ms: self.shared.mono_ms(),
            wall_ms: self.shared.wall_ms(),
        }
    }

    /// Feeds one request to the machine and drives it to its answer.
    async fn receive(&mut self, request: KeyRequest) {
        self.next_request += 1;
        let id = self.next_request;
        match request {
            KeyRequest::Acquire {
                tokens,
                tenant,
                weight,
                from,
                principal,
                serving,
                reply,
                span,
            } => {
                let caller = self.has_throttle.then(|| {
                    caller_id(
                        &principal,
                        from.as_ref().map(|f| &f.holder),
                        tenant.as_ref(),
                    )
                });
                self.replies.insert(id, Reply::Acquire(reply));
                let request = AcquireRequest {
                    id,
                    tokens,
                    tenant,
                    weight,
                    from,
                    caller,
                    serving,
                    policy: self.shared.policy_for(&self.key),
                    node_reachable: self.shared.is_reachable(),
                };
                self.drive(Event::Acquire(request)).instrument(span).await;
            }
            KeyRequest::Return { from, claim, reply } => {
                self.replies.insert(id, Reply::Return(reply));
                self.drive(Event::Return { id, from, claim }).await;
            }
            KeyRequest::Refund {
                tokens,
                window_start_ms,
                reply,
            } => {
                self.replies.insert(id, Reply::Return(reply));
                self.drive(Event::Refund {
                    id,
                    tokens,
                    window_start_ms,
                })
                .await;
            }
            KeyRequest::Forecast { demand, reply } => {
                let _ = reply.send(self.machine.forecast(demand));
            }
        }
    }

    /// Handles `event` and performs the machine's actions, feeding back the
    /// outcome of each call, until nothing is left to perform.
    async fn drive(&mut self, event: Event<Status>) {
        let mut events = VecDeque::from([event]);
        while let Some(event) = events.pop_front() {
            let actions = self.machine.handle(event, self.now());
            for action in actions {
                if let Some(next) = self.perform(action).await {
                    events.push_back(next);
                }
            }
        }
    }

    /// Performs one action; returns the event it leads to, if any.
    async fn perform(&mut self, action: Action<Status>) -> Option<Event<Status>> {
        match action {
            Action::SendLease(ticket) => Some(self.lease(ticket).await),
            Action::SendPoolGrant {
                call,
                region_weight,
                want_total,
                want_more,
                demand_window_ms,
                demands,
                join_next,
            } => Some(
                self.pool_grant(
                    call,
                    region_weight,
                    (want_total, want_more),
                    demand_window_ms,
                    demands,
                    join_next,
                )
                .await,
            ),
            Action::SendPoolRelease(pending) => Some(self.pool_release(pending).await),
            Action::Reconcile(back) => {
                self.shared.reconcile(&self.key, back).await;
                None
            }
            Action::RefreshPolicy => {
                self.shared.refresh_policies_now().await;
                Some(Event::Policy(self.shared.policy_for(&self.key)))
            }
            Action::Answer { id, answer } => {
                self.report();
                if let Some(Reply::Acquire(reply)) = self.replies.remove(&id) {
                    let _ = reply.send(answer.map_err(|refused| self.status_of(refused)));
                }
                None
            }
            Action::Settle { id, settled } => {
                self.report();
                if let Some(Reply::Return(reply)) = self.replies.remove(&id) {
                    let _ = reply.send(settled.map_err(|refusal| refusal_status(&refusal)));
                }
                None
            }
            Action::CountShadowWouldDeny { tokens } => {
                self.shared.record_shadow_would_deny(tokens);
                None
            }
            Action::ArmTimer { at_ms } => {
                self.wake_at_ms = at_ms;
                None
            }
            Action::Evict => {
                self.evicted = true;
                None
            }
        }
    }

    /// The gRPC status of a refused acquisition.
    fn status_of(&self, refused: Refused<Status>) -> Status {
        match refused {
            Refused::NoPolicy => refusal_with(
                Reason::NoPolicy,
                format!("no policy matches key {:?}", self.key),
                [(KEY, self.key.to_string())],
            ),
            Refused::Holder(refusal) => refusal_status(&refusal),
            Refused::Coordinator(status) => status,
            Refused::Internal(message) => refusal(Reason::Internal, message),
        }
    }

    /// The outage policy the node's outage log line names.
    fn outage_policy(&self) -> OutagePolicy {
        self.machine
            .policy()
            .map_or(OutagePolicy::FailClosed, |p| p.outage)
    }

    async fn lease(&mut self, ticket: LeaseTicket) -> Event<Status> {
        let sent = tokio::time::Instant::now();
        let result = self
            .shared
            .leases
            .lease(&self.key, self.shared.config.region.as_str(), ticket.tokens)
            .await;
        let outage = self.outage_policy();
        match result {
            Ok(grant) => {
                self.shared.lease_round_trip.record_duration(sent.elapsed());
                tracing::debug!(key = %self.key, asked = ticket.tokens, granted = grant.granted, window_start_ms = grant.window_start_ms, "lease answered");
                self.shared.set_reachable(true, &self.key, outage, None);
                Event::LeaseGranted {
                    ticket: ticket.id,
                    grant: CoordinatorGrant {
                        granted: grant.granted,
                        window_start_ms: grant.window_start_ms,
                        window_end_ms: grant.window_end_ms,
                        remaining_lifetime_ms: grant.remaining_lifetime_ms,
                    },
                }
            }
            // Not an outage: the cluster answered and refused the lease.
            Err(e) if refused_request(&e) => Event::LeaseRefused {
                ticket: ticket.id,
                refusal: relayed(&self.key, &e),
            },
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "lease failed; outage policy applies");
                let error = e.to_string();
                self.shared
                    .set_reachable(false, &self.key, outage, Some(&error));
                Event::LeaseFailed { ticket: ticket.id }
            }
        }
    }

    async fn pool_grant(
        &mut self,
        call: u64,
        region_weight: u64,
        (want_total, want_more): (u64, u64),
        demand_window_ms: u64,
        demands: Vec<(TenantId, u64)>,
        join_next: Option<JoinAhead<u64>>,
    ) -> Event<Status> {
        let sent = tokio::time::Instant::now();
        self.shared.count_call();
        let demands = tenant_demands_to_wire(&demands);
        let join_next = join_next.map(|join| self.join_request(join));
        let answer = self
            .shared
            .client
            .pool_grant(
                leasehold_client::coordinator::PoolGrantCall::new(
                    &self.key,
                    self.shared.config.region.as_str(),
                    region_weight,
                    want_total,
                )
                .reporting(demand_window_ms, demands)
                .joining_next(join_next)
                .asking_more(want_more),
            )
            .await;
        let outage = self.outage_policy();
        match answer {
            Ok(grant) => {
                self.shared.lease_round_trip.record_duration(sent.elapsed());
                self.shared.set_reachable(true, &self.key, outage, None);
                tracing::debug!(
                    key = %self.key,
                    region_weight,
                    want_total,
                    granted_total = grant.granted_total,
                    guarantee_total = grant.guarantee_total,
                    ceiling_total = grant.ceiling_total,
                    expected_guarantee_total = grant.expected_guarantee_total,
                    expected_ceiling_total = grant.expected_ceiling_total,
                    reserved_unheld_total = grant.reserved_unheld_total,
                    retired_kept_total = grant.retired_kept_total,
                    late_released_before_total = grant.late_released_before_total,
                    window_start_ms = grant.window_start_ms,
                    "pool grant answered"
                );
                let tenant_demands = settled_demands_of(&grant);
                if !grant.next_window_refused.is_empty() {
                    tracing::debug!(key = %self.key, reason = %grant.next_window_refused, "join of the next window refused");
                }
                Event::PoolGranted {
                    call,
                    answer: pool_answer_of(&grant),
                    tenant_demands,
                    next_window: grant.next_window.as_deref().map(pool_answer_of),
                    next_window_demands: grant
                        .next_window
                        .as_deref()
                        .map(settled_demands_of)
                        .unwrap_or_default(),
                }
            }
            Err(e) if refused_request(&e) => Event::PoolRefused {
                call,
                refusal: relayed(&self.key, &e),
            },
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "pool grant failed; the outage policy applies");
                let error = e.to_string();
                self.shared
                    .set_reachable(false, &self.key, outage, Some(&error));
                Event::PoolFailed { call }
            }
        }
    }

    /// Sends (or resends, under the same request id) the pending release.
    async fn pool_release(&mut self, pending: PendingRelease<u64>) -> Event<Status> {
        let release = pending.request_id;
        let request_id = match &self.release_request_id {
            Some((id, request_id)) if *id == release => request_id.clone(),
            _ => {
                let request_id = self.shared.client.next_request_id_for(&self.key);
                self.release_request_id = Some((release, request_id.clone()));
                request_id
            }
        };
        self.shared.count_call();
        let join_next = pending.join_next.map(|join| self.join_request(join));
        let answer = self
            .shared
            .client
            .pool_release_with_id(
                leasehold_client::coordinator::PoolReleaseCall::new(
                    &self.key,
                    self.shared.config.region.as_str(),
                    pending.from_total,
                    pending.keep_total,
                    pending.window.start_ms,
                )
                .joining_next(join_next),
                request_id,
            )
            .await;
        match answer {
            Ok(answer) => {
                if !answer.next_window_refused.is_empty() {
                    tracing::debug!(key = %self.key, reason = %answer.next_window_refused, "join of the next window refused");
                }
                let next_window = answer.next_window.as_ref().map(pool_answer_of);
                let next_window_demands = answer
                    .next_window
                    .as_ref()
                    .map(settled_demands_of)
                    .unwrap_or_default();
                // An unknown disposition (a newer coordinator) reads as
                // not applied in this window.
                let answer = match PoolReleaseOutcome::try_from(&answer).map(|o| o.disposition) {
                    Ok(PoolReleaseDisposition::Released) => {
                        self.shared.record_pool_release(answer.released);
                        tracing::debug!(key = %self.key, released = answer.released, kept = answer.granted_total, "pool grant released");
                        ReleaseAnswer::Released {
                            released: answer.released,
                            granted_total: answer.granted_total,
                        }
                    }
                    // The coordinator holds another total for the region
                    // (another holder moved it): nothing was released.
                    Ok(PoolReleaseDisposition::StaleTotal) => ReleaseAnswer::StaleTotal {
                        granted_total: answer.granted_total,
                    },
                    Ok(PoolReleaseDisposition::WindowEnded) | Err(_) => ReleaseAnswer::WindowEnded,
                };
                Event::ReleaseAnswered {
                    release,
                    answer,
                    next_window,
                    next_window_demands,
                }
            }
            Err(e)
                if !matches!(e, CoordinatorError::NotLeader { .. })
                    && matches!(
                        e.code(),
                        Code::InvalidArgument
                            | Code::NotFound
                            | Code::AlreadyExists
                            | Code::FailedPrecondition
                            | Code::Unimplemented
                            | Code::PermissionDenied
                            | Code::Unauthenticated
                    ) =>
            {
                // Refused, so not applied (or, for an expired session,
                // never applied again): the key keeps spending no more than
                // it kept until the pool tells it its total again.
                tracing::debug!(key = %self.key, error = %e, "pool release refused");
                Event::ReleaseRefused { release }
            }
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "pool release unanswered; retried before any pool call");
                Event::ReleaseFailed { release }
            }
        }
    }

    /// The wire form of a join of the next window: under the request id
    /// it first went out with when it is resent (a release's resend
    /// carries the same join), a new one otherwise.
    fn join_request(&mut self, join: JoinAhead<u64>) -> pb::NextWindowJoin {
        let request_id = match &self.join_request_id {
            Some((id, request_id)) if *id == join.request_id => request_id.clone(),
            _ => {
                let request_id = self.shared.client.next_request_id_for(&self.key);
                self.join_request_id = Some((join.request_id, request_id.clone()));
                request_id
            }
        };
        pb::NextWindowJoin {
            window_start_ms: join.window_start_ms,
            region_weight: join.region_weight,
            want_total: join.want_total,
            request_id: Some(request_id),
            retire: join.retire,
            tenant_demands: tenant_demands_to_wire(&join.demands),
            want_more: join.want_more,
        }
    }

    /// Publishes the key's view and adds what its counters grew by to the
    /// node's.
    fn report(&mut self) {
        let limit = self.shared.policy_for(&self.key).map_or(0, |p| p.limit);
        let view = self.machine.view(limit, self.shared.mono_ms());
        *self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = view;
        self.shared
            .record(&mut self.reported, self.machine.counters());
        self.shared
            .record_holders(&mut self.reported_holders, self.machine.holder_counters());
        if let Some(counters) = self.machine.throttle_counters() {
            self.shared.record_fair(&mut self.reported_fair, counters);
        }
    }
}

/// The settled tenants' demand totals a pool grant answer carries (an
/// invalid tenant name is left out).
fn settled_demands_of(grant: &pb::PoolGrantResponse) -> Vec<(TenantId, u64)> {
    grant
        .settled_tenant_demands
        .iter()
        .filter_map(|d| Some((TenantId::new(d.tenant.clone()).ok()?, d.demand)))
        .collect()
}

/// A pool grant answer on the wire as the key machine takes it.
fn pool_answer_of(grant: &pb::PoolGrantResponse) -> PoolAnswer {
    PoolAnswer {
        granted_total: grant.granted_total,
        granted_increment: grant.granted_increment,
        limit: grant.limit,
        window: WindowBounds {
            start_ms: grant.window_start_ms,
            end_ms: grant.window_end_ms,
        },
        remaining_lifetime_ms: grant.remaining_lifetime_ms,
        // 0 / 0: a coordinator that did not say.
        standing: (grant.ceiling_total > 0).then_some(PoolStanding {
            guarantee: grant.guarantee_total,
            ceiling: grant.ceiling_total,
        }),
        expected: (grant.expected_ceiling_total > 0).then_some(PoolStanding {
            guarantee: grant.expected_guarantee_total,
            ceiling: grant.expected_ceiling_total,
        }),
        reserved_unheld: grant.reserved_unheld_total,
        retired_kept: grant.retired_kept_total,
        late_released_before: grant.late_released_before_total,
    }
}
