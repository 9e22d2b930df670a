//! [`AdmissionGate`]: one admission decision across concurrency, rate and
//! cost, with the release handle of the concurrency slot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leasehold_core::admission::axis::{Axis, AxisDecisions};
use leasehold_core::admission::bid_price::{BidPriceFilter, BidVerdict};
use leasehold_core::admission::concurrency::{ConcurrencyParams, WaitBasis};
use leasehold_core::decision::Decision;
use tracing::Instrument;

use super::concurrency::ConcurrencyAxis;
use super::error::AdmissionError;
use super::in_process::{InProcessLimit, KeyedLimit};
use super::release::Release;
use super::request::{AdmitOutcome, AdmitRequest, DeniedByAxis};
use crate::limiter::{lock, Limiter};
use crate::transport::{SystemClock, WallClock};

/// The cost axis: an in-process limit, or the global budget through a
/// [`Limiter`] (leased, strict or cached-deny, against an escrow node or
/// the coordinator).
#[derive(Clone)]
#[non_exhaustive]
pub enum CostAxis {
    /// A per-key (per tenant and key, for requests naming a tenant)
    /// in-process limit.
    InProcess(InProcessLimit),
    /// The global budget, charged to the limiter's tenant. Requests naming
    /// a tenant are refused ([`AdmissionError::TenantNeedsPerTenantCost`]).
    Global(Limiter),
    /// The global budget, charged to each request's tenant: one limiter
    /// per tenant, built from `config` (its tenant replaced) on `source`,
    /// at most `max_tenants` at once (the least recently built is dropped
    /// first, its credits forfeited, which is always safe). Requests
    /// without a tenant are charged to `config`'s tenant.
    GlobalPerTenant {
        /// The credit source every tenant's limiter draws on.
        source: Arc<dyn crate::CreditSource>,
        /// The limiters' configuration.
        config: crate::LimiterConfig,
        /// Most tenants' limiters held at once.
        max_tenants: usize,
    },
}

impl std::fmt::Debug for CostAxis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CostAxis::InProcess(limit) => f.debug_tuple("InProcess").field(limit).finish(),
            CostAxis::Global(limiter) => f.debug_tuple("Global").field(limiter).finish(),
            CostAxis::GlobalPerTenant {
                config,
                max_tenants,
                ..
            } => f
                .debug_struct("GlobalPerTenant")
                .field("config", config)
                .field("max_tenants", max_tenants)
                .finish_non_exhaustive(),
        }
    }
}

#[derive(Debug, Default)]
struct DenialCounters {
    concurrency: AtomicU64,
    rate: AtomicU64,
    cost: AtomicU64,
    policy: AtomicU64,
    admitted: AtomicU64,
}

/// Builds an [`AdmissionGate`]; every axis is optional but one is needed.
#[derive(Debug)]
pub struct AdmissionGateBuilder {
    concurrency: Option<ConcurrencyParams>,
    concurrency_retry_after_ms: u64,
    rate: Option<InProcessLimit>,
    cost: Option<CostAxis>,
    clock: Arc<dyn WallClock>,
    max_keys: usize,
    bid_price: Option<BidPriceFilter>,
    policy_retry_after_ms: u64,
}

impl AdmissionGateBuilder {
    /// Opt-in bid-price (joint-LP) admission: after concurrency and rate
    /// allow and before the cost axis is asked, a request is admitted only
    /// if `value ≥ p_R + p_C·cost (+ p_K·hold)`. Strictly more selective
    /// than the axes alone. Needs a cost axis.
    pub fn bid_price(mut self, filter: BidPriceFilter) -> Self {
        self.bid_price = Some(filter);
        self
    }

    /// The wait a bid-price denial suggests (default 1 000 ms).
    pub fn policy_retry_after_ms(mut self, ms: u64) -> Self {
        self.policy_retry_after_ms = ms;
        self
    }

    /// A process-wide adaptive in-flight ceiling.
    pub fn concurrency(mut self, params: ConcurrencyParams) -> Self {
        self.concurrency = Some(params);
        self
    }

    /// The wait a concurrency denial suggests until a request has
    /// completed (default 1 000 ms; set it near the service's typical
    /// latency). From then on the wait is computed from the ages in
    /// flight, the recent latencies and the limit's next steps
    /// (`ConcurrencyLimit::slot_wait`).
    pub fn concurrency_retry_after_ms(mut self, ms: u64) -> Self {
        self.concurrency_retry_after_ms = ms;
        self
    }

    /// A per-key rate limit; each admitted request spends 1 unit.
    pub fn rate(mut self, limit: InProcessLimit) -> Self {
        self.rate = Some(limit);
        self
    }

    /// A per-key cost limit; each admitted request spends its cost.
    pub fn cost(mut self, axis: CostAxis) -> Self {
        self.cost = Some(axis);
        self
    }

    /// The clock in-process axes read (default: the system clock).
    pub fn clock(mut self, clock: Arc<dyn WallClock>) -> Self {
        self.clock = clock;
        self
    }

    /// Keys tracked per in-process axis before idle keys are forgotten
    /// (default 100 000).
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Validates and builds the gate.
    pub fn build(self) -> Result<AdmissionGate, AdmissionError> {
        if self.concurrency.is_none() && self.rate.is_none() && self.cost.is_none() {
            return Err(AdmissionError::NoAxis);
        }
        if self.bid_price.is_some() && self.cost.is_none() {
            return Err(AdmissionError::PolicyNeedsCostAxis);
        }
        let concurrency = match self.concurrency {
            Some(params) => Some(Arc::new(ConcurrencyAxis::new(
                params,
                self.concurrency_retry_after_ms,
                Arc::clone(&self.clock),
            )?)),
            None => None,
        };
        let rate = match self.rate {
            Some(limit) => Some(KeyedLimit::new(limit, self.max_keys)?),
            None => None,
        };
        let cost = match self.cost {
            Some(CostAxis::InProcess(limit)) => Some(CostBackend::InProcess(KeyedLimit::new(
                limit,
                self.max_keys,
            )?)),
            Some(CostAxis::Global(limiter)) => Some(CostBackend::Global(limiter)),
            Some(CostAxis::GlobalPerTenant {
                source,
                config,
                max_tenants,
            }) => {
                config
                    .validate()
                    .map_err(|e| AdmissionError::Backend(e.into()))?;
                let default = Limiter::with_shared_source(Arc::clone(&source), config.clone())
                    .map_err(|e| AdmissionError::Backend(e.into()))?;
                Some(CostBackend::PerTenant(PerTenant {
                    source,
                    config,
                    max_tenants: max_tenants.max(1),
                    default,
                    limiters: Mutex::new(TenantLimiters::default()),
                }))
            }
            None => None,
        };
        Ok(AdmissionGate {
            inner: Arc::new(GateInner {
                clock: self.clock,
                concurrency,
                rate,
                cost,
                last: Mutex::new(AxisDecisions::default()),
                counters: DenialCounters::default(),
                bid_price: self.bid_price.map(Mutex::new),
                policy_retry_after_ms: self.policy_retry_after_ms,
            }),
        })
    }
}

/// One decision across the three admission axes.
///
/// Axes are evaluated concurrency → rate → cost, stopping at the first
/// denial; a unit or slot taken by an earlier axis is given back when a
/// later one denies, so a denied admission holds nothing. Concurrency is
/// process-wide; rate and cost are per key. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct AdmissionGate {
    inner: Arc<GateInner>,
}

enum CostBackend {
    InProcess(KeyedLimit),
    Global(Limiter),
    PerTenant(PerTenant),
}

/// The global cost axis charged per tenant.
struct PerTenant {
    source: Arc<dyn crate::CreditSource>,
    config: crate::LimiterConfig,
    max_tenants: usize,
    /// For requests without a tenant.
    default: Limiter,
    limiters: Mutex<TenantLimiters>,
}

/// The tenants' limiters, oldest first.
#[derive(Default)]
struct TenantLimiters {
    by_tenant: std::collections::HashMap<String, Limiter>,
    built: std::collections::VecDeque<String>,
}

impl PerTenant {
    /// The limiter of `tenant` (`None`: the default one), built on first use.
    fn limiter(&self, tenant: Option<&str>) -> Result<Limiter, AdmissionError> {
        let Some(tenant) = tenant else {
            return Ok(self.default.clone());
        };
        let mut limiters = lock(&self.limiters);
        if let Some(limiter) = limiters.by_tenant.get(tenant) {
            return Ok(limiter.clone());
        }
        let id = leasehold_core::ids::TenantId::new(tenant)
            .map_err(|e| AdmissionError::Backend(e.into()))?;
        let config = self.config.clone().with_tenant(id);
        let limiter = Limiter::with_shared_source(Arc::clone(&self.source), config)
            .map_err(|e| AdmissionError::Backend(e.into()))?;
        while limiters.by_tenant.len() >= self.max_tenants {
            let Some(oldest) = limiters.built.pop_front() else {
                break;
            };
            limiters.by_tenant.remove(&oldest);
        }
        limiters
            .by_tenant
            .insert(tenant.to_string(), limiter.clone());
        limiters.built.push_back(tenant.to_string());
        Ok(limiter)
    }
}

struct GateInner {
    clock: Arc<dyn WallClock>,
    concurrency: Option<Arc<ConcurrencyAxis>>,
    rate: Option<KeyedLimit>,
    cost: Option<CostBackend>,
    last: Mutex<AxisDecisions>,
    counters: DenialCounters,
    bid_price: Option<Mutex<BidPriceFilter>>,
    policy_retry_after_ms: u64,
}

impl std::fmt::Debug for GateInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionGate")
            .field("concurrency", &self.concurrency.is_some())
            .field("rate", &self.rate.as_ref().map(|r| r.limit))
            .field("cost", &self.cost.is_some())
            .field("bid_price", &self.bid_price.is_some())
            .finish_non_exhaustive()
    }
}

/// What the axes before cost took, to give back if a later axis denies.
struct Taken {
    decisions: AxisDecisions,
    /// How the concurrency axis's denial found its wait.
    slot_wait: Option<WaitBasis>,
    slot: bool,
    rate: bool,
    now_ms: u64,
}

enum Stage {
    Done(AdmitOutcome),
    NeedsCost(Taken),
}

impl AdmissionGate {
    /// A builder with no axes, the system clock and 100 000 keys per axis.
    pub fn builder() -> AdmissionGateBuilder {
        AdmissionGateBuilder {
            concurrency: None,
            concurrency_retry_after_ms: 1_000,
            rate: None,
            cost: None,
            clock: Arc::new(SystemClock),
            max_keys: 100_000,
            bid_price: None,
            policy_retry_after_ms: 1_000,
        }
    }

    /// The bid prices in force now, when a bid-price policy is configured.
    pub fn bid_prices(&self) -> Option<leasehold_core::admission::bid_price::Duals> {
        self.inner.bid_price.as_ref().map(|f| lock(f).duals())
    }

    /// Admits `request` against every axis; works with any cost axis.
    ///
    /// Errors: bad input ([`AdmissionError::EmptyKey`],
    /// [`ZeroCost`](AdmissionError::ZeroCost),
    /// [`InvalidValue`](AdmissionError::InvalidValue),
    /// [`CostExceedsCapacity`](AdmissionError::CostExceedsCapacity)) and a
    /// remote cost axis that could not answer
    /// ([`Backend`](AdmissionError::Backend)); in every error case nothing
    /// stays held.
    pub async fn admit(&self, request: AdmitRequest<'_>) -> Result<AdmitOutcome, AdmissionError> {
        let local_key = self.local_key(&request)?;
        // The in-process axes see the tenant's key; the global axis the key.
        let local = AdmitRequest {
            key: &local_key,
            ..request
        };
        let span = admission_span(&request);
        async {
            let global = match &self.inner.cost {
                Some(CostBackend::Global(limiter)) => Some(limiter.clone()),
                Some(CostBackend::PerTenant(per_tenant)) => {
                    Some(per_tenant.limiter(request.tenant)?)
                }
                _ => None,
            };
            match self.before_cost(&local)? {
                Stage::Done(outcome) => Ok(outcome),
                Stage::NeedsCost(taken) => {
                    let cost_decision = match (&self.inner.cost, global) {
                        (Some(CostBackend::InProcess(limit)), _) => {
                            limit.try_acquire(local.key, taken.now_ms, request.cost)
                        }
                        (_, Some(limiter)) => {
                            match limiter.check(request.key, request.cost).await {
                                Ok(d) => d,
                                Err(e) => {
                                    self.give_back(&local, &taken);
                                    return Err(AdmissionError::Backend(e));
                                }
                            }
                        }
                        _ => Decision::ALLOW_FULL,
                    };
                    Ok(self.after_cost(&local, taken, cost_decision))
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Admits `request` without awaiting; every configured axis must be
    /// in-process ([`AdmissionError::NotInProcess`] otherwise, before
    /// anything is taken).
    pub fn admit_sync(&self, request: AdmitRequest<'_>) -> Result<AdmitOutcome, AdmissionError> {
        if matches!(
            self.inner.cost,
            Some(CostBackend::Global(_) | CostBackend::PerTenant(_))
        ) {
            return Err(AdmissionError::NotInProcess);
        }
        let local_key = self.local_key(&request)?;
        let local = AdmitRequest {
            key: &local_key,
            ..request
        };
        let span = admission_span(&request);
        let _entered = span.enter();
        match self.before_cost(&local)? {
            Stage::Done(outcome) => Ok(outcome),
            Stage::NeedsCost(taken) => {
                let cost_decision = match &self.inner.cost {
                    Some(CostBackend::InProcess(limit)) => {
                        limit.try_acquire(local.key, taken.now_ms, request.cost)
                    }
                    _ => Decision::ALLOW_FULL,
                };
                Ok(self.after_cost(&local, taken, cost_decision))
            }
        }
    }

    /// The key the in-process axes keep a request's state under: the key,
    /// or `tenant NUL key` for a request naming a tenant (keys and tenants
    /// holding a NUL are refused, so the two never meet).
    fn local_key<'a>(
        &self,
        request: &AdmitRequest<'a>,
    ) -> Result<std::borrow::Cow<'a, str>, AdmissionError> {
        if request.key.contains('\0') {
            return Err(AdmissionError::InvalidName("key"));
        }
        let Some(tenant) = request.tenant else {
            return Ok(std::borrow::Cow::Borrowed(request.key));
        };
        if tenant.is_empty() || tenant.contains('\0') {
            return Err(AdmissionError::InvalidName("tenant"));
        }
        if matches!(self.inner.cost, Some(CostBackend::Global(_))) {
            return Err(AdmissionError::TenantNeedsPerTenantCost);
        }
        Ok(std::borrow::Cow::Owned(format!(
            "{tenant}\0{}",
            request.key
        )))
    }

    /// What each axis decided in the most recent admission (axes not
    /// configured or short-circuited are `None`).
    pub fn last_decisions(&self) -> AxisDecisions {
        *lock(&self.inner.last)
    }

    /// Denials per binding axis since the gate was built.
    pub fn denied_by_axis(&self) -> DeniedByAxis {
        let c = &self.inner.counters;
        DeniedByAxis {
            concurrency: c.concurrency.load(Ordering::Relaxed),
            rate: c.rate.load(Ordering::Relaxed),
            cost: c.cost.load(Ordering::Relaxed),
            policy: c.policy.load(Ordering::Relaxed),
        }
    }

    /// Tenants whose limiters a `CostAxis::GlobalPerTenant` holds now (0
    /// for any other cost axis): at most its `max_tenants`.
    pub fn tenant_limiters(&self) -> usize {
        match &self.inner.cost {
            Some(CostBackend::PerTenant(per_tenant)) => lock(&per_tenant.limiters).by_tenant.len(),
            _ => 0,
        }
    }

    /// Admissions allowed since the gate was built.
    pub fn admitted(&self) -> u64 {
        self.inner.counters.admitted.load(Ordering::Relaxed)
    }

    /// The concurrency ceiling now and the requests in flight, when the
    /// gate has a concurrency axis.
    pub fn concurrency(&self) -> Option<(u64, u64)> {
        self.inner
            .concurrency
            .as_ref()
            .map(|axis| axis.limit_and_in_flight())
    }

    fn validate(&self, request: &AdmitRequest<'_>) -> Result<(), AdmissionError> {
        if request.key.is_empty() {
            return Err(AdmissionError::EmptyKey);
        }
        if request.cost == 0 {
            return Err(AdmissionError::ZeroCost);
        }
        if let Some(value) = request.value {
            if !(value.is_finite() && value >= 0.0) {
                return Err(AdmissionError::InvalidValue(value));
            }
        }
        if let Some(CostBackend::InProcess(limit)) = &self.inner.cost {
            let capacity = limit.limit.capacity();
            if request.cost > capacity {
                return Err(AdmissionError::CostExceedsCapacity {
                    axis: Axis::Cost.as_str(),
                    cost: request.cost,
                    capacity,
                });
            }
        }
        Ok(())
    }

    /// Concurrency, then rate; stops at the first denial.
    fn before_cost(&self, request: &AdmitRequest<'_>) -> Result<Stage, AdmissionError> {
        self.validate(request)?;
        let inner = &self.inner;
        let now_ms = inner.clock.now_ms();
        let mut taken = Taken {
            decisions: AxisDecisions::default(),
            slot_wait: None,
            slot: false,
            rate: false,
            now_ms,
        };
        if let Some(concurrency) = &inner.concurrency {
            let (d, basis) = concurrency.try_acquire(now_ms);
            taken.decisions.set(Axis::Concurrency, d);
            taken.slot_wait = basis;
            if !d.allowed {
                self.ask_later_axes(request, &mut taken, Axis::Concurrency);
                return Ok(Stage::Done(self.deny(request, &taken)));
            }
            taken.slot = true;
        }
        if let Some(rate) = &inner.rate {
            let d = rate.try_acquire(request.key, now_ms, 1);
            taken.decisions.set(Axis::Rate, d);
            if !d.allowed {
                self.ask_later_axes(request, &mut taken, Axis::Rate);
                return Ok(Stage::Done(self.deny(request, &taken)));
            }
            taken.rate = true;
        }
        if let Some(filter) = &inner.bid_price {
            let value = request.value.unwrap_or(1.0);
            let verdict = lock(filter).decide(value, request.cost as f64, request.hold_ms);
            if verdict != BidVerdict::Admit {
                let priced_out = verdict == BidVerdict::PricedOut;
                return Ok(Stage::Done(
                    self.deny_by_policy(request, &taken, priced_out),
                ));
            }
        }
        if inner.cost.is_none() {
            return Ok(Stage::Done(self.allow(taken)));
        }
        Ok(Stage::NeedsCost(taken))
    }

    /// After `denied` denied: records what each later in-process axis
    /// would decide now, taking nothing, so the denial's wait is the
    /// longest of every axis it must pass (a caller that waits it is not
    /// sent back by the next one). A global cost axis is not asked: asking
    /// it spends.
    fn ask_later_axes(&self, request: &AdmitRequest<'_>, taken: &mut Taken, denied: Axis) {
        let inner = &self.inner;
        if denied < Axis::Rate {
            if let Some(rate) = &inner.rate {
                let d = rate.peek(request.key, taken.now_ms, 1);
                taken.decisions.set(Axis::Rate, d);
            }
        }
        if let Some(CostBackend::InProcess(limit)) = &inner.cost {
            let d = limit.peek(request.key, taken.now_ms, request.cost);
            taken.decisions.set(Axis::Cost, d);
        }
    }

    fn after_cost(
        &self,
        request: &AdmitRequest<'_>,
        mut taken: Taken,
        cost: Decision,
    ) -> AdmitOutcome {
        taken.decisions.set(Axis::Cost, cost);
        if cost.allowed {
            self.allow(taken)
        } else {
            self.deny(request, &taken)
        }
    }

    fn allow(&self, taken: Taken) -> AdmitOutcome {
        *lock(&self.inner.last) = taken.decisions;
        self.inner.counters.admitted.fetch_add(1, Ordering::Relaxed);
        let release = match &self.inner.concurrency {
            Some(axis) if taken.slot => Release::holding(Arc::clone(axis), taken.now_ms),
            _ => Release::nothing_held(),
        };
        AdmitOutcome {
            decision: taken.decisions.combined(),
            release,
            binding_axis: None,
            slot_wait: None,
            policy_denied: false,
            priced_out: false,
        }
    }

    /// Gives back what was taken, counts the denial and records the
    /// binding axis on the admission span.
    fn deny(&self, request: &AdmitRequest<'_>, taken: &Taken) -> AdmitOutcome {
        self.give_back(request, taken);
        *lock(&self.inner.last) = taken.decisions;
        let binding_axis = taken.decisions.binding_axis();
        let counters = &self.inner.counters;
        let counter = match binding_axis {
            Some(Axis::Concurrency) => &counters.concurrency,
            Some(Axis::Rate) => &counters.rate,
            Some(Axis::Cost) => &counters.cost,
            None => &counters.policy,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let decision = taken.decisions.combined();
        let span = tracing::Span::current();
        span.record("binding_axis", binding_axis.map_or("policy", Axis::as_str));
        tracing::debug!(
            binding_axis = binding_axis.map_or("policy", Axis::as_str),
            retry_after_ms = decision.retry_after_ms,
            "admission denied"
        );
        AdmitOutcome {
            decision,
            release: Release::nothing_held(),
            binding_axis,
            slot_wait: taken
                .slot_wait
                .filter(|_| binding_axis == Some(Axis::Concurrency)),
            policy_denied: false,
            priced_out: false,
        }
    }

    /// Every axis reached had room but the bid-price filter refused: the
    /// request is below its price (`priced_out`), or on it and rationed.
    fn deny_by_policy(
        &self,
        request: &AdmitRequest<'_>,
        taken: &Taken,
        priced_out: bool,
    ) -> AdmitOutcome {
        let policy = Decision {
            allowed: false,
            limit: u64::MAX,
            remaining: u64::MAX,
            reset_at_ms: 0,
            retry_after_ms: self.inner.policy_retry_after_ms.max(1),
        };
        let mut outcome = self.deny(request, taken);
        outcome.decision = outcome.decision.combine(policy);
        outcome.policy_denied = true;
        outcome.priced_out = priced_out;
        outcome
    }

    fn give_back(&self, request: &AdmitRequest<'_>, taken: &Taken) {
        if taken.rate {
            if let Some(rate) = &self.inner.rate {
                rate.refund(request.key, taken.now_ms, 1);
            }
        }
        if taken.slot {
            if let Some(concurrency) = &self.inner.concurrency {
                concurrency.cancel(taken.now_ms);
            }
        }
    }
}

/// The span one admission runs in; `binding_axis` is recorded on denials.
fn admission_span(request: &AdmitRequest<'_>) -> tracing::Span {
    tracing::info_span!(
        "admission",
        key = request.key,
        tenant = request.tenant.unwrap_or_default(),
        cost = request.cost,
        binding_axis = tracing::field::Empty,
    )
}
