//! One actor per key: a handle (bounded mailbox) and a task that owns the
//! key's [`RegionEscrow`] and performs its coordinator calls. Requests for a
//! key are handled one at a time, so at most one lease is ever in flight and
//! waiters simply see the credited balance when their turn comes.
//!
//! `fair` keys follow [`FairKey`] (core, sans IO: the pool grant, its
//! deadline, ask sizing, the ceiling and reclaim); the actor performs the
//! `PoolGrant` and `PoolRelease` calls it asks for. Reclaim: a key that has
//! seen no request for `pool_release_idle_ms` while its grant is live
//! releases what it did not admit, and so does a key that stops (evicted,
//! or the node shutting down). A pending release is resent (same request
//! id) before any other pool call of the key. A region at its pool ceiling
//! asks again after `pool_release_idle_ms` (at most a quarter window),
//! since others may have released meanwhile.

use leasehold_client::coordinator::CoordinatorError;
use leasehold_core::fair_throttle::CallerId;
use leasehold_core::principal::Principal;
use leasehold_proto::refusal::{refusal, refusal_with, Reason, KEY};
use leasehold_proto::v1 as pb;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::escrow::{
    Admission, CoordinatorGrant, EscrowCounters, FairGateCounters, FairKey, FairStep, GateVerdict,
    Holder, HolderBook, HolderCounters, HolderHeld, HolderRefusal, PoolAnswer, RegionEscrow,
    ReleaseAnswer, ReturnClaim, ReturnSettled, Served, WEIGHT_SCALE,
};
use leasehold_core::ids::TenantId;
use leasehold_core::policy::{OutagePolicy, Policy, PolicyKind};
use leasehold_core::sizer::{EoqParams, LeaseSizer};
use leasehold_core::window::WindowBounds;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};
use tracing::Instrument;

use super::fair_throttle::{caller_id, rule_for, KeyFairThrottle};
use super::shared::EscrowShared;

/// Largest lease the EOQ sizer may ask for: past this, one region's lease
/// strands more of a window than it saves in round trips.
pub const EOQ_MAX_LEASE: u64 = 4_096;

/// Capacity of one key's mailbox: requests beyond it wait in the caller.
pub const KEY_MAILBOX_CAPACITY: usize = 256;

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
        /// denied ([`leasehold_core::shadow`]): the credits are not from a
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
        /// Refused by the key's fair throttle, not for want of budget
        /// (the answer carries `leasehold-reason: FAIR_THROTTLED`).
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
        /// Serve `tokens` whole or nothing (thin clients' `Check`): a
        /// partial serve goes straight back into the escrow, capped like
        /// any return, and the answer is a denial.
        whole_or_nothing: bool,
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
}

/// The gRPC status of a holder refusal, with its reason.
pub fn refusal_status(refused: &HolderRefusal) -> Status {
    let reason = match refused {
        HolderRefusal::Reused { .. } => Reason::RequestIdReused,
        HolderRefusal::Expired { .. } => Reason::SessionExpired,
        HolderRefusal::HoldersExhausted { .. } => Reason::HoldersExhausted,
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

/// The actor is gone (evicted or stopped); the caller makes a new one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the key's actor has stopped")]
pub struct ActorDropped;

/// Most tenants of one key a [`KeyView`] lists (the first in byte order).
pub const MAX_VIEWED_TENANTS: usize = 32;

/// What a key's actor last published for watchers (`Monitor.Watch` on an
/// escrow node): read without sending the actor anything, so a watch
/// neither delays requests nor keeps an idle key alive. Refreshed after
/// every request the actor handles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyView {
    /// The window of the credits held (coordinator epoch ms), if any.
    pub window: Option<WindowBounds>,
    /// The key's limit.
    pub limit: u64,
    /// What the coordinator granted this region in that window (a `fair`
    /// key: its pool grant).
    pub granted: u64,
    /// Credits held unspent now (counter keys).
    pub held: u64,
    /// The region's pool weight (`fair` keys; else 0).
    pub region_weight: u64,
    /// Tenants tracked (`fair` keys).
    pub tenant_count: u64,
    /// At most [`MAX_VIEWED_TENANTS`] of them: (tenant, weight, admitted).
    pub tenants: Vec<(String, u64, u64)>,
}

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
    pub fn spawn(key: String, shared: Arc<EscrowShared>, on_idle: OnIdle) -> Self {
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
        let escrow =
            RegionEscrow::with_sizer(sizer, shared.config.probe_interval_ms, Default::default());
        let book = HolderBook::new(shared.config.holder_limits);
        let fair_throttle = rule_for(&shared.config.fair_throttle, &key).and_then(|rule| {
            KeyFairThrottle::new(
                rule,
                &key,
                shared.config.fair_throttle_rng_seed,
                shared.mono_ms(),
            )
            .map_err(|e| tracing::warn!(key = %key, error = %e, "fair throttle off for this key"))
            .ok()
        });
        tokio::spawn(
            KeyActor {
                key,
                on_idle,
                last_request_ms: shared.mono_ms(),
                release_tried_ms: 0,
                escrow,
                shared,
                mailbox,
                last_window_end_ms: 0,
                window_credit: (0, 0),
                view: view.clone(),
                reported: EscrowCounters::default(),
                book,
                reported_holders: HolderCounters::default(),
                fair: None,
                fair_throttle,
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

struct KeyActor {
    key: String,
    on_idle: OnIdle,
    /// When the last request arrived (monotonic ms): eviction and reclaim
    /// count idleness from it.
    last_request_ms: u64,
    /// When the pending pool release was last tried (monotonic ms).
    release_tried_ms: u64,
    escrow: RegionEscrow,
    shared: Arc<EscrowShared>,
    mailbox: mpsc::Receiver<KeyRequest>,
    last_window_end_ms: u64,
    /// (window start, tokens credited from grants of that window).
    window_credit: (u64, u64),
    /// What watchers read (see [`KeyView`]).
    view: Arc<std::sync::Mutex<KeyView>>,
    reported: EscrowCounters,
    /// Who holds which credits; the answers given per request id.
    book: HolderBook<Acquired>,
    reported_holders: HolderCounters,
    /// The `fair` key's state, once the key turned out to be fair.
    fair: Option<FairKey<pb::RequestId>>,
    /// The key's fair throttle, when a `fair_throttle` rule fronts it.
    fair_throttle: Option<KeyFairThrottle>,
    reported_fair: FairGateCounters,
}

/// A weight in thousandths ([`WEIGHT_SCALE`]) shown in the units tenants
/// declare, rounded to the nearest (at least 1 when not 0).
fn declared_units(scaled: u64) -> u64 {
    if scaled == 0 {
        return 0;
    }
    (scaled.saturating_add(WEIGHT_SCALE / 2) / WEIGHT_SCALE).max(1)
}

/// Tenant used when a request names none.
const DEFAULT_TENANT: &str = "default";

impl KeyActor {
    async fn run(mut self) {
        let _running = self.shared.actor_started();
        loop {
            let wait = self.next_wake();
            match tokio::time::timeout(wait, self.mailbox.recv()).await {
                Ok(Some(request)) => {
                    self.last_request_ms = self.shared.mono_ms();
                    self.handle(request).await;
                }
                Ok(None) => break,
                Err(_) => {
                    let now = self.shared.mono_ms();
                    if self.release_due(now) {
                        self.release_pool().await;
                        self.report();
                        continue;
                    }
                    let idle_ms = self.shared.config.idle_evict_ms.max(1);
                    if now.saturating_sub(self.last_request_ms) < idle_ms {
                        continue;
                    }
                    // Idle: stop taking requests, hand credits back, leave the table.
                    (self.on_idle)(&self.key);
                    self.mailbox.close();
                    while let Some(request) = self.mailbox.recv().await {
                        self.handle(request).await;
                    }
                    break;
                }
            }
        }
        if let Some(back) = self.escrow.return_all(self.shared.mono_ms()) {
            self.shared.reconcile(&self.key, back).await;
        }
        if self.shared.config.pool_release_idle_ms > 0 {
            self.release_pool().await;
        }
        self.report();
    }

    /// How long the mailbox may stay silent before the actor acts on its
    /// own: a due pool release, or eviction.
    fn next_wake(&self) -> Duration {
        let now = self.shared.mono_ms();
        let evict_at = self
            .last_request_ms
            .saturating_add(self.shared.config.idle_evict_ms.max(1));
        let wake = self.release_at().map_or(evict_at, |at| at.min(evict_at));
        Duration::from_millis(wake.saturating_sub(now).max(1))
    }

    /// When the key's pool release falls due (monotonic ms): a pending one
    /// a probe interval after its last try; otherwise `pool_release_idle_ms`
    /// after the last request, while a live, unretired grant is held.
    fn release_at(&self) -> Option<u64> {
        self.fair.as_ref()?.release_at(
            self.last_request_ms,
            self.shared.config.pool_release_idle_ms,
            self.release_tried_ms,
            self.shared.config.probe_interval_ms,
            self.shared.mono_ms(),
        )
    }

    fn release_due(&self, now_ms: u64) -> bool {
        self.release_at().is_some_and(|at| now_ms >= at)
    }

    /// Reclaim: retires the region from the key's pool in its live window,
    /// keeping what it admitted (or retries a pending release).
    async fn release_pool(&mut self) {
        let now = self.shared.mono_ms();
        if let Some(fair) = self.fair.as_mut() {
            if fair.pending_release().is_none() {
                // From now on the key spends no more than it keeps,
                // whatever becomes of the release.
                fair.begin_release(self.shared.client.next_request_id(), now);
            }
        }
        self.resolve_pending_release().await;
    }

    /// Sends the pending release (if any) and settles it; true when none is
    /// pending afterwards.
    async fn resolve_pending_release(&mut self) -> bool {
        let Some(pending) = self
            .fair
            .as_ref()
            .and_then(|fair| fair.pending_release())
            .cloned()
        else {
            return true;
        };
        self.release_tried_ms = self.shared.mono_ms();
        self.shared.count_call();
        let answer = self
            .shared
            .client
            .pool_release_with_id(
                &self.key,
                self.shared.config.region.as_str(),
                pending.from_total,
                pending.keep_total,
                pending.window.start_ms,
                pending.request_id.clone(),
            )
            .await;
        match answer {
            Ok(answer) => {
                self.escrow.outage_mut().on_answer();
                let settled = match pb::PoolReleaseDisposition::try_from(answer.disposition) {
                    Ok(pb::PoolReleaseDisposition::Released) => {
                        self.shared.record_pool_release(answer.released);
                        tracing::debug!(key = %self.key, released = answer.released, kept = answer.granted_total, "pool grant released");
                        ReleaseAnswer::Released {
                            released: answer.released,
                        }
                    }
                    // The coordinator holds another total for the region:
                    // that is its grant.
                    Ok(pb::PoolReleaseDisposition::StaleTotal) => ReleaseAnswer::StaleTotal {
                        granted_total: answer.granted_total,
                    },
                    _ => ReleaseAnswer::WindowEnded,
                };
                if let Some(fair) = self.fair.as_mut() {
                    fair.on_release_answer(settled);
                }
                true
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
                if let Some(fair) = self.fair.as_mut() {
                    fair.on_release_refused();
                }
                true
            }
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "pool release unanswered; retried before any pool call");
                let now = self.shared.mono_ms();
                self.escrow.outage_mut().on_failure(now);
                false
            }
        }
    }

    async fn handle(&mut self, request: KeyRequest) {
        match request {
            KeyRequest::Acquire {
                tokens,
                tenant,
                weight,
                from,
                principal,
                whole_or_nothing,
                reply,
                span,
            } => {
                let answer = self
                    .acquire_once(tokens, tenant, weight, from, &principal, whole_or_nothing)
                    .instrument(span)
                    .await;
                self.report();
                let _ = reply.send(answer);
            }
            KeyRequest::Return { from, claim, reply } => {
                let now = self.shared.mono_ms();
                let escrow = &mut self.escrow;
                // `fair` keys hold nothing in `escrow`, so they take nothing back.
                let settled = self
                    .book
                    .settle_return(&from.holder, from.seq, &claim, now, |offered| {
                        escrow.take_back(offered, claim.window_start_ms, now)
                    })
                    .map_err(|refusal| refusal_status(&refusal));
                self.report();
                let _ = reply.send(settled);
            }
        }
    }

    /// Publishes the key's [`KeyView`] for watchers.
    fn publish_view(&mut self) {
        let limit = self.shared.policy_for(&self.key).map_or(0, |p| p.limit);
        let fair = self
            .fair
            .as_ref()
            .and_then(|fair| Some((fair.window()?, fair.escrow()?)));
        let view = match fair {
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
                let status = self.escrow.status(self.shared.mono_ms());
                let (start, credited) = self.window_credit;
                KeyView {
                    window: (self.last_window_end_ms > 0).then_some(WindowBounds {
                        start_ms: start,
                        end_ms: self.last_window_end_ms,
                    }),
                    limit,
                    granted: credited,
                    held: status.balance,
                    ..KeyView::default()
                }
            }
        };
        *self
            .view
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = view;
    }

    /// Counts a grant's credited tokens towards its window's total.
    fn note_credited(&mut self, window_start_ms: u64, credited: u64) {
        if self.window_credit.0 != window_start_ms {
            self.window_credit = (window_start_ms, 0);
        }
        self.window_credit.1 = self.window_credit.1.saturating_add(credited);
    }

    fn report(&mut self) {
        self.publish_view();
        self.shared
            .record(&mut self.reported, self.escrow.counters());
        self.shared
            .record_holders(&mut self.reported_holders, self.book.counters());
        if let Some(fair) = &self.fair_throttle {
            self.shared
                .record_fair(&mut self.reported_fair, fair.gate.counters());
        }
    }

    /// An acquisition, once per (holder, seq) when it names a holder.
    async fn acquire_once(
        &mut self,
        tokens: u64,
        tenant: Option<TenantId>,
        weight: u64,
        from: Option<HolderRequest>,
        principal: &Principal,
        whole_or_nothing: bool,
    ) -> Result<Acquired, Status> {
        let caller = self
            .fair_throttle
            .as_ref()
            .map(|_| caller_id(principal, from.as_ref().map(|f| &f.holder), tenant.as_ref()));
        let ticket = match from {
            None => None,
            Some(from) => match self.book.admit_acquire(
                &from.holder,
                from.seq,
                tenant.as_ref(),
                tokens,
                self.shared.mono_ms(),
            ) {
                Ok(Admission::Replay(answer)) => return Ok(answer),
                Ok(Admission::New(ticket)) => Some(ticket),
                Err(refusal) => return Err(refusal_status(&refusal)),
            },
        };
        let verdict = match &caller {
            Some(id) => self.fair_gate(id).await?,
            None => Ok(GateVerdict::Pass),
        };
        let answer = match verdict {
            Err(throttled) => throttled,
            Ok(verdict) => {
                let mut answer = self.acquire(tokens, tenant.clone(), weight).await;
                if whole_or_nothing {
                    answer = answer.map(|a| self.whole_or_nothing(tokens, a));
                }
                if let (GateVerdict::Pass, Some(id), Ok(answer)) = (verdict, &caller, &answer) {
                    self.fair_record(id, answer);
                }
                answer?
            }
        };
        let answer = self.shadow(tokens, answer);
        if let Some(ticket) = ticket {
            let now = self.shared.mono_ms();
            let held = match answer {
                Acquired::Credits { served, .. } if !served.from_fallback => Some(HolderHeld {
                    tenant,
                    window_start_ms: served.window_start_ms,
                    tokens: served.granted,
                    deadline_ms: now.saturating_add(served.remaining_lifetime_ms),
                }),
                _ => None,
            };
            self.book.record_acquire(ticket, answer, held, now);
        }
        Ok(answer)
    }

    /// The fair throttle's verdict for `caller` (rotating first if due):
    /// `Err` holds the denial of a throttled request, which never reaches
    /// the escrow rules.
    async fn fair_gate(&mut self, caller: &[u8]) -> Result<Result<GateVerdict, Acquired>, Status> {
        let Ok(id) = CallerId::new(caller) else {
            return Ok(Ok(GateVerdict::Pass));
        };
        let now = self.shared.mono_ms();
        let unleased = self.escrow.balance(now);
        let Some(fair) = self.fair_throttle.as_mut() else {
            return Ok(Ok(GateVerdict::Pass));
        };
        let (seed, draw) = fair.draw();
        match fair.gate.gate(id, now, seed, draw, unleased) {
            GateVerdict::Throttled { .. } => {
                let retry_after_ms = fair.retry_after_ms;
                let limit = self.policy().await?.limit;
                Ok(Err(Acquired::Denied {
                    retry_after_ms,
                    limit,
                    window_end_ms: self.last_window_end_ms,
                    fair_throttled: true,
                }))
            }
            verdict => Ok(Ok(verdict)),
        }
    }

    /// Feeds the fair throttle what the escrow rules answered a passed
    /// request: served, or denied for want of budget. A denial during a
    /// coordinator outage says nothing about the caller and is not fed.
    fn fair_record(&mut self, caller: &[u8], answer: &Acquired) {
        let served = match answer {
            Acquired::Credits { served, .. } => served.granted > 0,
            Acquired::Denied { .. }
                if self.escrow.coordinator_unreachable() || !self.shared.is_reachable() =>
            {
                return
            }
            Acquired::Denied { .. } => false,
        };
        if let (Some(fair), Ok(id)) = (self.fair_throttle.as_mut(), CallerId::new(caller)) {
            fair.gate.record(id, served, self.shared.mono_ms());
        }
    }

    /// Turns a partial serve into a denial, putting the partial back into
    /// the escrow through the same capped path as any return.
    fn whole_or_nothing(&mut self, tokens: u64, answer: Acquired) -> Acquired {
        match answer {
            Acquired::Credits { served, limit, .. } if served.granted < tokens => {
                if !served.from_fallback {
                    self.escrow.take_back(
                        served.granted,
                        served.window_start_ms,
                        self.shared.mono_ms(),
                    );
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

    /// Shadow mode: a denial of a key whose policy is in shadow mode becomes
    /// an admission of the `tokens` asked, counted as would-deny (the fair
    /// throttle has already learnt from the enforced decision). Anything
    /// else passes unchanged.
    fn shadow(&mut self, tokens: u64, answer: Acquired) -> Acquired {
        let Acquired::Denied { limit, .. } = answer else {
            return answer;
        };
        let Some(policy) = self.shared.policy_for(&self.key).filter(|p| p.shadow) else {
            return answer;
        };
        self.shared.record_shadow_would_deny(tokens);
        let served = RegionEscrow::serve_shadow_at(tokens, self.shared.wall_ms(), policy.window_ms);
        Acquired::Credits {
            served,
            limit,
            shadow_would_deny: true,
        }
    }

    async fn policy(&mut self) -> Result<Policy, Status> {
        if self.shared.policy_for(&self.key).is_none() {
            // The cached table may predate a policy set moments ago.
            self.shared.refresh_policies_now().await;
        }
        let policy = self.shared.policy_for(&self.key).ok_or_else(|| {
            refusal_with(
                Reason::NoPolicy,
                format!("no policy matches key {:?}", self.key),
                [(KEY, self.key.to_string())],
            )
        })?;
        self.escrow.set_outage_policy(policy.outage);
        Ok(policy)
    }

    async fn acquire(
        &mut self,
        tokens: u64,
        tenant: Option<TenantId>,
        weight: u64,
    ) -> Result<Acquired, Status> {
        let policy = self.policy().await?;
        if policy.kind == PolicyKind::Fair {
            let tenant = match tenant {
                Some(t) => t,
                None => TenantId::new(DEFAULT_TENANT)
                    .map_err(|e| refusal(Reason::Internal, e.to_string()))?,
            };
            return self
                .acquire_fair(&policy, &tenant, weight.max(1), tokens)
                .await;
        }
        let limit = policy.limit;
        let now = self.shared.mono_ms();
        if let Some(served) = self.escrow.serve(tokens, now) {
            return Ok(Acquired::Credits {
                served,
                limit,
                shadow_would_deny: false,
            });
        }
        let mut retry_after_ms = None;
        if let Some(ticket) = self.escrow.send_lease(tokens, now) {
            let sent = tokio::time::Instant::now();
            let result = self
                .shared
                .leases
                .lease(&self.key, self.shared.config.region.as_str(), ticket.tokens)
                .await;
            if result.is_ok() {
                self.shared.lease_round_trip.record_duration(sent.elapsed());
            }
            let arrived = self.shared.mono_ms();
            match result {
                Ok(grant) => {
                    tracing::debug!(key = %self.key, asked = ticket.tokens, granted = grant.granted, window_start_ms = grant.window_start_ms, "lease answered");
                    self.shared
                        .set_reachable(true, &self.key, policy.outage, None);
                    self.last_window_end_ms = grant.window_end_ms;
                    if grant.granted == 0 {
                        retry_after_ms = Some(grant.remaining_lifetime_ms.max(1));
                    }
                    let grant = CoordinatorGrant {
                        granted: grant.granted,
                        window_start_ms: grant.window_start_ms,
                        window_end_ms: grant.window_end_ms,
                        remaining_lifetime_ms: grant.remaining_lifetime_ms,
                    };
                    let credited_before = self.escrow.counters().tokens_credited;
                    let back = self.escrow.on_grant_for(ticket.id, grant, arrived);
                    let credited = self.escrow.counters().tokens_credited - credited_before;
                    self.note_credited(grant.window_start_ms, credited);
                    if let Some(back) = back {
                        self.shared.reconcile(&self.key, back).await;
                    }
                }
                Err(e)
                    if matches!(
                        e.code(),
                        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition
                    ) =>
                {
                    // Not an outage: the cluster answered and refused the lease.
                    self.escrow.on_lease_refused_for(ticket.id, arrived);
                    return Err(relayed(&self.key, &e));
                }
                Err(e) => {
                    tracing::debug!(key = %self.key, error = %e, "lease failed; outage policy applies");
                    let error = e.to_string();
                    self.shared
                        .set_reachable(false, &self.key, policy.outage, Some(&error));
                    self.escrow.on_lease_failed_for(ticket.id, arrived);
                }
            }
            if let Some(served) = self.escrow.serve(tokens, self.shared.mono_ms()) {
                return Ok(Acquired::Credits {
                    served,
                    limit,
                    shadow_would_deny: false,
                });
            }
        }
        if self.escrow.coordinator_unreachable() {
            let wall = self.shared.wall_ms();
            // Fallback credits live only for the rest of the local window.
            if let Some(served) = self.escrow.serve_outage_at(tokens, wall, policy.window_ms) {
                return Ok(Acquired::Credits {
                    served,
                    limit,
                    shadow_would_deny: false,
                });
            }
        }
        let now = self.shared.mono_ms();
        Ok(Acquired::Denied {
            retry_after_ms: retry_after_ms.unwrap_or_else(|| self.escrow.retry_after_ms(now)),
            limit,
            window_end_ms: self.last_window_end_ms,
            fair_throttled: false,
        })
    }
}

impl KeyActor {
    /// Asks the region fair pool for the region's total; `None` when the
    /// coordinator could not be reached.
    /// Asks the region fair pool for `want_total`: `Ok(Some(total))` when
    /// the coordinator answered, `Ok(None)` when it could not be reached
    /// (the key's outage gate then waits a probe interval), `Err` when it
    /// refused (no policy, wrong kind, ...).
    async fn pool_grant(
        &mut self,
        region_weight: u64,
        want_total: u64,
        outage: OutagePolicy,
    ) -> Result<Option<u64>, Status> {
        if !self.resolve_pending_release().await {
            return Ok(None);
        }
        let sent = self.shared.mono_ms();
        let sent_at = tokio::time::Instant::now();
        self.shared.count_call();
        let (demand_window, demands) = self
            .fair
            .as_ref()
            .and_then(|fair| fair.demand_report())
            .unwrap_or_default();
        let demands = demands
            .into_iter()
            .map(|(tenant, demand)| pb::TenantDemand {
                tenant: tenant.to_string(),
                demand,
            })
            .collect();
        let answer = self
            .shared
            .client
            .pool_grant_reporting(
                &self.key,
                self.shared.config.region.as_str(),
                region_weight,
                want_total,
                demand_window,
                demands,
            )
            .await;
        if answer.is_ok() {
            self.shared
                .lease_round_trip
                .record_duration(sent_at.elapsed());
        }
        match answer {
            Ok(grant) => {
                self.escrow.outage_mut().on_answer();
                self.shared.set_reachable(true, &self.key, outage, None);
                let window = WindowBounds {
                    start_ms: grant.window_start_ms,
                    end_ms: grant.window_end_ms,
                };
                // Other regions release after `pool_release_idle_ms` of
                // quiet: at the ceiling, look again at that cadence, at
                // most every quarter window.
                let window_ms = window.end_ms.saturating_sub(window.start_ms);
                let re_ask_ms = match self.shared.config.pool_release_idle_ms {
                    0 => window_ms / 4,
                    idle_ms => (window_ms / 4).min(idle_ms.max(100)),
                };
                let max_tenants = self.shared.config.max_tenants;
                let now = self.shared.mono_ms();
                let totals = grant
                    .tenant_demands
                    .iter()
                    .filter_map(|d| Some((TenantId::new(d.tenant.clone()).ok()?, d.demand)))
                    .collect();
                let fair = self.fair.get_or_insert_with(|| FairKey::new(max_tenants));
                fair.on_tenant_demands(demand_window, totals);
                fair.on_pool_answer(
                    PoolAnswer {
                        granted_total: grant.granted_total,
                        limit: grant.limit,
                        window,
                        remaining_lifetime_ms: grant.remaining_lifetime_ms,
                    },
                    want_total,
                    sent,
                    now,
                    re_ask_ms,
                );
                self.last_window_end_ms = grant.window_end_ms;
                Ok(Some(grant.granted_total))
            }
            Err(e)
                if matches!(
                    e.code(),
                    Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition
                ) =>
            {
                Err(relayed(&self.key, &e))
            }
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "pool grant failed; the outage policy applies");
                let error = e.to_string();
                let now = self.shared.mono_ms();
                self.escrow.outage_mut().on_failure(now);
                self.shared
                    .set_reachable(false, &self.key, outage, Some(&error));
                Ok(None)
            }
        }
    }

    /// A fair key's request while the coordinator cannot be reached and
    /// its pool grant cannot cover it: the key's outage policy decides,
    /// through the same gate as counter keys (`fallback`: up to the
    /// region's share per window, first come first served across tenants;
    /// `fail_closed`: denied), counted as outage denials or fallback
    /// admissions.
    fn fair_outage(&mut self, policy: &Policy, cost: u64) -> Acquired {
        let wall = self.shared.wall_ms();
        let now = self.shared.mono_ms();
        let gate = self.escrow.outage_mut();
        if let Some(served) = gate.serve_at(cost, wall, policy.window_ms) {
            return Acquired::Credits {
                served,
                limit: policy.limit,
                shadow_would_deny: false,
            };
        }
        Acquired::Denied {
            retry_after_ms: gate
                .retry_after_ms(now)
                .unwrap_or(self.shared.config.probe_interval_ms.max(1)),
            limit: policy.limit,
            window_end_ms: self.last_window_end_ms,
            fair_throttled: false,
        }
    }

    /// One weighted-fair decision of `cost` tokens for `tenant`, over the
    /// region's pool grant ([`FairKey`] decides; this performs its asks).
    async fn acquire_fair(
        &mut self,
        policy: &Policy,
        tenant: &TenantId,
        weight: u64,
        cost: u64,
    ) -> Result<Acquired, Status> {
        let max_tenants = self.shared.config.max_tenants;
        self.fair
            .get_or_insert_with(|| FairKey::new(max_tenants))
            .note_demand(tenant, cost);
        for _ in 0..leasehold_core::wfe::MAX_POOL_ASKS_PER_CHECK {
            let now = self.shared.mono_ms();
            let lease_size = self.escrow.lease_size();
            let step = self
                .fair
                .get_or_insert_with(|| FairKey::new(max_tenants))
                .decide(tenant, weight, cost, lease_size, now);
            // Answers carry the key's limit L (the proto's contract), not
            // the tenant's ceiling in the region.
            let (region_weight, want_total) = match step {
                FairStep::Admit { served, .. } => {
                    return Ok(Acquired::Credits {
                        served,
                        limit: policy.limit,
                        shadow_would_deny: false,
                    })
                }
                FairStep::Deny {
                    retry_after_ms,
                    window_end_ms,
                    ..
                } => {
                    return Ok(Acquired::Denied {
                        retry_after_ms,
                        limit: policy.limit,
                        window_end_ms,
                        fair_throttled: false,
                    })
                }
                FairStep::Join {
                    region_weight,
                    want_total,
                }
                | FairStep::Ask {
                    region_weight,
                    want_total,
                } => (region_weight, want_total.min(policy.limit.max(cost))),
            };
            // At most one pool call per probe interval while the
            // coordinator is unreachable.
            if !self.escrow.outage_mut().may_call(now) {
                return Ok(self.fair_outage(policy, cost));
            }
            if self
                .pool_grant(region_weight, want_total, policy.outage)
                .await?
                .is_none()
            {
                return Ok(self.fair_outage(policy, cost));
            }
        }
        Ok(Acquired::Denied {
            retry_after_ms: 1,
            limit: policy.limit,
            window_end_ms: self.last_window_end_ms,
            fair_throttled: false,
        })
    }
}
