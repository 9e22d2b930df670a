//! Tests of the admission gate: order, short-circuit, give-back on a later
//! denial, the release contract, bad input, counters and the span field.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures::future::{BoxFuture, FutureExt};
use leasehold_core::admission::concurrency::ConcurrencyParams;
use leasehold_core::ids::ClientId;
use proptest::prelude::*;

use super::*;
use crate::transport::WallClock;
use crate::{
    AcquireRequest, CheckReply, CheckRequest, ClientError, CreditSource, Grant, Limiter,
    LimiterConfig, Mode, ReturnRequest,
};

/// A clock the test moves by hand.
#[derive(Debug, Default)]
struct ManualClock(AtomicU64);

impl ManualClock {
    fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }
}

impl WallClock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn clock() -> Arc<ManualClock> {
    Arc::new(ManualClock(AtomicU64::new(1_000_000)))
}

fn gate(
    clock: &Arc<ManualClock>,
    concurrency: u64,
    rate: u64,
    cost_capacity: u64,
) -> AdmissionGate {
    AdmissionGate::builder()
        .clock(clock.clone())
        .concurrency(ConcurrencyParams::aimd(concurrency, concurrency))
        .rate(InProcessLimit::gcra(rate, 60_000))
        .cost(CostAxis::InProcess(InProcessLimit::token_bucket(
            cost_capacity,
            1,
        )))
        .build()
        .unwrap()
}

#[test]
fn a_concurrency_denial_takes_nothing_from_rate_and_cost() {
    let c = clock();
    let g = gate(&c, 1, 10, 1_000);
    let held = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert!(held.decision.allowed);
    let denied = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert!(!denied.decision.allowed);
    assert_eq!(denied.binding_axis, Some(Axis::Concurrency));
    // Rate and cost were asked what they would decide, and allowed.
    let last = g.last_decisions();
    assert!(last.concurrency.is_some_and(|d| !d.allowed));
    assert!(last.rate.is_some_and(|d| d.allowed) && last.cost.is_some_and(|d| d.allowed));
    assert_eq!(denied.release.release(false), ReleaseOutcome::NothingHeld);
    // The denial spent nothing: 9 rate units and 999 cost units are left.
    assert_eq!(held.release.release(false), ReleaseOutcome::Released);
    let next = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert_eq!(g.last_decisions().rate.unwrap().remaining, 8);
    assert_eq!(g.last_decisions().cost.unwrap().remaining, 998);
    next.release.release(false);
}

/// A denial's wait covers every in-process axis the request must pass,
/// not only the one that denied: a concurrency denial while the key's
/// rate is spent for 60 s says 60 s, not the concurrency axis's 1 s; a
/// rate denial while the cost bucket needs longer says the cost's wait.
#[test]
fn a_denials_wait_is_the_longest_of_every_in_process_axis() {
    let c = clock();
    // One slot; 1 request per 60 s; a cost bucket of 10 refilled 1 per s.
    let g = gate(&c, 1, 1, 10);
    let held = g.admit_sync(AdmitRequest::new("k", 10)).unwrap();
    assert!(held.decision.allowed);
    let denied = g.admit_sync(AdmitRequest::new("k", 10)).unwrap();
    assert_eq!(denied.binding_axis, Some(Axis::Concurrency));
    let last = g.last_decisions();
    assert_eq!(last.concurrency.unwrap().retry_after_ms, 1_000);
    assert_eq!(last.rate.unwrap().retry_after_ms, 60_000);
    assert_eq!(denied.decision.retry_after_ms, 60_000);
    assert_eq!(denied.retry_after_secs(), Some(60));
    held.release.release(false);

    // The rate is spent for 60 s; 70 s of cost refill are needed for 80.
    let g = AdmissionGate::builder()
        .clock(c.clone())
        .rate(InProcessLimit::gcra(1, 60_000))
        .cost(CostAxis::InProcess(InProcessLimit::token_bucket(100, 1)))
        .build()
        .unwrap();
    assert!(
        g.admit_sync(AdmitRequest::new("j", 90))
            .unwrap()
            .decision
            .allowed
    );
    let denied = g.admit_sync(AdmitRequest::new("j", 80)).unwrap();
    assert_eq!(denied.binding_axis, Some(Axis::Rate));
    assert_eq!(denied.decision.retry_after_ms, 70_000);
    // Nothing was taken by the denial: after 70 s the request passes.
    c.advance(70_000);
    assert!(
        g.admit_sync(AdmitRequest::new("j", 80))
            .unwrap()
            .decision
            .allowed
    );
}

#[test]
fn a_rate_denial_gives_the_slot_back() {
    let c = clock();
    let g = gate(&c, 4, 1, 1_000);
    let first = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    let denied = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert_eq!(denied.binding_axis, Some(Axis::Rate));
    assert_eq!(g.concurrency(), Some((4, 1)));
    assert_eq!(denied.retry_after_secs(), Some(60));
    // Rate is per key: another key passes.
    let other = g.admit_sync(AdmitRequest::new("other", 1)).unwrap();
    assert!(other.decision.allowed);
    first.release.release(false);
    other.release.release(false);
    assert_eq!(g.concurrency(), Some((4, 0)));
}

#[test]
fn a_cost_denial_gives_back_the_slot_and_the_rate_unit() {
    let c = clock();
    let g = gate(&c, 4, 3, 100);
    let big = g.admit_sync(AdmitRequest::new("k", 90)).unwrap();
    assert!(big.decision.allowed);
    let denied = g.admit_sync(AdmitRequest::new("k", 20)).unwrap();
    assert_eq!(denied.binding_axis, Some(Axis::Cost));
    // 10 tokens short at 1 token/s: the dominant wait is 10 s.
    assert_eq!(denied.decision.retry_after_ms, 10_000);
    assert_eq!(denied.retry_after_secs(), Some(10));
    assert_eq!(g.concurrency(), Some((4, 1)));
    // The rate unit came back: two more requests pass the rate of 3.
    for _ in 0..2 {
        let ok = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
        assert!(ok.decision.allowed);
        ok.release.release(false);
    }
    assert_eq!(
        g.denied_by_axis(),
        DeniedByAxis {
            cost: 1,
            ..DeniedByAxis::default()
        }
    );
    big.release.release(false);
}

#[test]
fn release_is_idempotent_and_a_drop_contracts_the_limit() {
    let c = clock();
    let g = AdmissionGate::builder()
        .clock(c.clone())
        .concurrency(ConcurrencyParams {
            initial_limit: 8,
            ..ConcurrencyParams::aimd(2, 16)
        })
        .build()
        .unwrap();
    let outcome = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    c.advance(40);
    assert_eq!(outcome.release.release(true), ReleaseOutcome::Released);
    assert_eq!(
        outcome.release.release(true),
        ReleaseOutcome::AlreadyReleased
    );
    assert_eq!(
        outcome.release.release(false),
        ReleaseOutcome::AlreadyReleased
    );
    let (limit, in_flight) = g.concurrency().unwrap();
    assert!(limit < 8, "limit {limit}");
    assert_eq!(in_flight, 0);
}

#[test]
fn dropping_an_unreleased_handle_frees_its_slot() {
    let c = clock();
    let g = gate(&c, 1, 100, 1_000);
    {
        let outcome = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
        assert!(outcome.release.is_holding());
    }
    assert_eq!(g.concurrency(), Some((1, 0)));
    assert!(
        g.admit_sync(AdmitRequest::new("k", 1))
            .unwrap()
            .decision
            .allowed
    );
}

#[test]
fn bad_input_is_a_typed_error_and_takes_nothing() {
    let c = clock();
    let g = gate(&c, 1, 10, 100);
    assert_eq!(
        g.admit_sync(AdmitRequest::new("", 1)).unwrap_err(),
        AdmissionError::EmptyKey
    );
    assert_eq!(
        g.admit_sync(AdmitRequest::new("k", 0)).unwrap_err(),
        AdmissionError::ZeroCost
    );
    assert!(matches!(
        g.admit_sync(AdmitRequest::new("k", 1).with_value(f64::NAN)),
        Err(AdmissionError::InvalidValue(_))
    ));
    assert!(matches!(
        g.admit_sync(AdmitRequest::new("k", 1).with_value(-1.0)),
        Err(AdmissionError::InvalidValue(_))
    ));
    assert_eq!(
        g.admit_sync(AdmitRequest::new("k", 101)).unwrap_err(),
        AdmissionError::CostExceedsCapacity {
            axis: "cost",
            cost: 101,
            capacity: 100
        }
    );
    assert_eq!(g.concurrency(), Some((1, 0)));
}

#[test]
fn idle_keys_are_forgotten_when_the_table_is_full() {
    let c = clock();
    let limit = super::in_process::KeyedLimit::new(InProcessLimit::gcra(2, 1_000), 2).unwrap();
    assert!(limit.try_acquire("a", c.now_ms(), 1).allowed);
    assert!(limit.try_acquire("b", c.now_ms(), 1).allowed);
    c.advance(1_000);
    // Both keys are idle again, so a third key sweeps them out.
    assert!(limit.try_acquire("c", c.now_ms(), 1).allowed);
    assert_eq!(limit.tracked_keys(), 1);
}

#[test]
fn bad_configuration_is_a_typed_error() {
    assert_eq!(
        AdmissionGate::builder().build().unwrap_err(),
        AdmissionError::NoAxis
    );
    assert!(matches!(
        AdmissionGate::builder()
            .rate(InProcessLimit::gcra(0, 1_000))
            .build(),
        Err(AdmissionError::Config(_))
    ));
    assert!(matches!(
        AdmissionGate::builder()
            .cost(CostAxis::InProcess(InProcessLimit::token_bucket(10, 0)))
            .build(),
        Err(AdmissionError::Config(_))
    ));
    assert!(matches!(
        AdmissionGate::builder()
            .concurrency(ConcurrencyParams::aimd(8, 4))
            .build(),
        Err(AdmissionError::Config(_))
    ));
}

/// A one-window budget; fails every call once `failing` is set.
struct Budget {
    left: AtomicU64,
    failing: std::sync::atomic::AtomicBool,
}

impl CreditSource for Budget {
    fn acquire(&self, r: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        if self.failing.load(Ordering::SeqCst) {
            return async { Err(ClientError::Unavailable("down".into())) }.boxed();
        }
        let granted = r.tokens.min(self.left.load(Ordering::SeqCst));
        self.left.fetch_sub(granted, Ordering::SeqCst);
        let grant = Grant {
            granted,
            limit: 10,
            window_start_ms: 0,
            window_end_ms: u64::MAX / 4,
            remaining_lifetime_ms: 600_000,
            retry_after_ms: if granted == 0 { 1_000 } else { 0 },
        };
        async move { Ok(grant) }.boxed()
    }
    fn check(&self, _: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        async { Err(ClientError::Unsupported("leased only".into())) }.boxed()
    }
    fn give_back(&self, r: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        self.left.fetch_add(r.tokens, Ordering::SeqCst);
        async move { Ok(r.tokens) }.boxed()
    }
}

fn global_gate(c: &Arc<ManualClock>, budget: Arc<Budget>) -> AdmissionGate {
    let options = crate::LeaseOptions {
        sizing: crate::LeaseSizing::Fixed(1),
        ..crate::LeaseOptions::default()
    };
    let config = LimiterConfig::new(Mode::Leased(options), ClientId::new("gate-test").unwrap());
    let limiter = Limiter::with_shared_source(budget, config).unwrap();
    AdmissionGate::builder()
        .clock(c.clone())
        .concurrency(ConcurrencyParams::aimd(4, 4))
        .rate(InProcessLimit::gcra(100, 60_000))
        .cost(CostAxis::Global(limiter))
        .build()
        .unwrap()
}

#[tokio::test]
async fn the_global_budget_as_the_cost_axis() {
    let c = clock();
    let budget = Arc::new(Budget {
        left: AtomicU64::new(5),
        failing: false.into(),
    });
    let g = global_gate(&c, budget.clone());
    assert_eq!(
        g.admit_sync(AdmitRequest::new("k", 1)).unwrap_err(),
        AdmissionError::NotInProcess
    );
    let mut admitted = 0;
    for _ in 0..8 {
        let outcome = g.admit(AdmitRequest::new("k", 1)).await.unwrap();
        if outcome.decision.allowed {
            admitted += 1;
        } else {
            assert_eq!(outcome.binding_axis, Some(Axis::Cost));
        }
        outcome.release.release(false);
    }
    assert_eq!(admitted, 5);
    assert_eq!(g.denied_by_axis().cost, 3);
    // A failing backend is an error that leaves nothing held.
    budget.failing.store(true, Ordering::SeqCst);
    budget.left.store(5, Ordering::SeqCst);
    let err = g.admit(AdmitRequest::new("fresh", 1)).await.unwrap_err();
    assert!(matches!(err, AdmissionError::Backend(_)), "{err}");
    assert_eq!(g.concurrency(), Some((4, 0)));
}

#[derive(Debug, Clone)]
enum Step {
    Admit { key: u8, cost: u64 },
    Release { index: usize, dropped: bool },
    Advance(u64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0u8..3, 1u64..60).prop_map(|(key, cost)| Step::Admit { key, cost }),
        2 => (0usize..64, any::<bool>()).prop_map(|(index, dropped)| Step::Release { index, dropped }),
        1 => (0u64..5_000).prop_map(Step::Advance),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    /// Retry-After is never an understatement on in-process axes: whatever
    /// the history, a denied request retried after its wait — its slot
    /// free, nothing else admitted meanwhile — is admitted.
    #[test]
    fn a_denied_request_retried_after_its_wait_is_admitted(steps in proptest::collection::vec(step(), 1..200)) {
        let c = clock();
        let g = AdmissionGate::builder()
            .clock(c.clone())
            .concurrency(ConcurrencyParams::aimd(1, 4))
            .rate(InProcessLimit::gcra(5, 10_000))
            .cost(CostAxis::InProcess(InProcessLimit::token_bucket(100, 10)))
            .build()
            .unwrap();
        let mut held: Vec<Release> = Vec::new();
        for s in steps {
            match s {
                Step::Admit { key, cost } => {
                    let key = format!("k{key}");
                    let outcome = g.admit_sync(AdmitRequest::new(&key, cost)).unwrap();
                    if outcome.decision.allowed {
                        held.push(outcome.release);
                        continue;
                    }
                    for release in held.drain(..) {
                        release.release(false);
                    }
                    c.advance(outcome.decision.retry_after_ms);
                    let again = g.admit_sync(AdmitRequest::new(&key, cost)).unwrap();
                    prop_assert!(
                        again.decision.allowed,
                        "denied by {:?} after waiting {} ms for {:?}: {:?}",
                        again.binding_axis,
                        outcome.decision.retry_after_ms,
                        outcome.binding_axis,
                        g.last_decisions()
                    );
                    held.push(again.release);
                }
                Step::Release { index, dropped } => {
                    if !held.is_empty() {
                        held.swap_remove(index % held.len()).release(dropped);
                    }
                }
                Step::Advance(ms) => c.advance(ms),
            }
        }
    }

    /// Whatever the interleaving: in-flight never exceeds the ceiling and
    /// equals the unreleased allowed admissions; per key, admitted cost
    /// stays within the bucket's bound; denials hold nothing.
    #[test]
    fn the_gate_keeps_every_axis_bound(steps in proptest::collection::vec(step(), 1..200)) {
        let c = clock();
        let start = c.now_ms();
        let g = AdmissionGate::builder()
            .clock(c.clone())
            .concurrency(ConcurrencyParams::gradient(2, 8))
            .rate(InProcessLimit::gcra(20, 10_000))
            .cost(CostAxis::InProcess(InProcessLimit::token_bucket(100, 10)))
            .build()
            .unwrap();
        let mut held: Vec<Release> = Vec::new();
        let mut cost_by_key = [0u64; 3];
        for s in steps {
            match s {
                Step::Admit { key, cost } => {
                    let outcome = g.admit_sync(AdmitRequest::new(&format!("k{key}"), cost)).unwrap();
                    prop_assert_eq!(outcome.decision.allowed, outcome.binding_axis.is_none());
                    if outcome.decision.allowed {
                        cost_by_key[key as usize] += cost;
                        held.push(outcome.release);
                    } else {
                        prop_assert!(!outcome.release.is_holding());
                        prop_assert!(outcome.decision.retry_after_ms >= 1);
                    }
                }
                Step::Release { index, dropped } => {
                    if !held.is_empty() {
                        let r = held.swap_remove(index % held.len());
                        prop_assert_eq!(r.release(dropped), ReleaseOutcome::Released);
                        prop_assert_eq!(r.release(dropped), ReleaseOutcome::AlreadyReleased);
                    }
                }
                Step::Advance(ms) => c.advance(ms),
            }
            let (limit, in_flight) = g.concurrency().unwrap();
            prop_assert_eq!(in_flight, held.len() as u64);
            prop_assert!((2..=8).contains(&limit));
            let elapsed = c.now_ms() - start;
            for spent in cost_by_key {
                prop_assert!(spent <= 100 + elapsed * 10 / 1_000);
            }
        }
    }
}

mod bid_price {
    use leasehold_core::admission::bid_price::{BidPriceFilter, Duals, RequestType, Workload};

    use super::*;

    fn gateway_workload() -> Workload {
        Workload {
            types: vec![
                RequestType {
                    cost: 100.0,
                    value: 1.0,
                    weight: 500.0,
                    hold: 0.0,
                },
                RequestType {
                    cost: 10_000.0,
                    value: 50.0,
                    weight: 500.0,
                    hold: 0.0,
                },
            ],
            rate_budget: Some(1_000.0),
            cost_budget: 50_000.0,
            concurrency_budget: None,
        }
    }

    fn policy_gate(c: &Arc<ManualClock>, filter: BidPriceFilter) -> AdmissionGate {
        AdmissionGate::builder()
            .clock(c.clone())
            .concurrency(ConcurrencyParams::aimd(2, 2))
            .rate(InProcessLimit::gcra(1_000, 60_000))
            .cost(CostAxis::InProcess(InProcessLimit::token_bucket(50_000, 1)))
            .bid_price(filter)
            .build()
            .unwrap()
    }

    #[test]
    fn a_policy_denial_takes_nothing_and_is_counted() {
        let c = clock();
        let g = policy_gate(
            &c,
            BidPriceFilter::from_workload(&gateway_workload()).unwrap(),
        );
        let large = g
            .admit_sync(AdmitRequest::new("k", 10_000).with_value(50.0))
            .unwrap();
        assert!(!large.decision.allowed);
        assert!(large.policy_denied && large.priced_out);
        assert_eq!(large.binding_axis, None);
        assert_eq!(large.retry_after_secs(), Some(1));
        assert_eq!(g.concurrency(), Some((2, 0)));
        let small = g
            .admit_sync(AdmitRequest::new("k", 100).with_value(1.0))
            .unwrap();
        assert!(small.decision.allowed && !small.policy_denied);
        // The policy ran before the cost axis: the large request spent nothing.
        assert_eq!(g.last_decisions().cost.unwrap().remaining, 49_900);
        assert_eq!(g.denied_by_axis().policy, 1);
        small.release.release(false);
    }

    #[test]
    fn a_request_on_its_price_is_rationed_at_the_lp_fraction_not_priced_out() {
        let c = clock();
        // Small (cost 10, value 1) and large (cost 100, value 5), 1 000 of
        // each, budget 15 000: the large type is admitted at 5%.
        let workload = leasehold_core::admission::simulation::knife_edge_workload(15_000.0);
        let g = policy_gate(&c, BidPriceFilter::from_workload(&workload).unwrap());
        let mut admitted = 0;
        for _ in 0..40 {
            let large = g
                .admit_sync(AdmitRequest::new("k", 100).with_value(5.0))
                .unwrap();
            if large.decision.allowed {
                admitted += 1;
                large.release.release(false);
            } else {
                assert!(large.policy_denied && !large.priced_out, "{large:?}");
                assert_eq!(large.retry_after_secs(), Some(1));
            }
        }
        assert_eq!(admitted, 2, "5% of 40");
        let under = g
            .admit_sync(AdmitRequest::new("k", 100).with_value(4.0))
            .unwrap();
        assert!(under.policy_denied && under.priced_out);
    }

    #[tokio::test]
    async fn the_layer_answers_a_priced_out_request_without_a_retry_after() {
        use tower::{service_fn, Layer, ServiceExt};
        let c = clock();
        let g = policy_gate(
            &c,
            BidPriceFilter::from_workload(&gateway_workload()).unwrap(),
        );
        let layer = AdmissionLayer::new(g, |request: &http::Request<String>| {
            let value = request
                .headers()
                .get("x-value")?
                .to_str()
                .ok()?
                .parse()
                .ok()?;
            Some(Admit::new("k", 10_000).with_value(value))
        });
        let service = layer.layer(service_fn(|_: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
        }));
        let request = http::Request::get("/")
            .header("x-value", "50")
            .body(String::new())
            .unwrap();
        let response = service.oneshot(request).await.unwrap();
        assert_eq!(response.status(), http::StatusCode::TOO_MANY_REQUESTS);
        assert!(response.headers().get(http::header::RETRY_AFTER).is_none());
        assert!(
            response.body().contains("priced_out"),
            "{}",
            response.body()
        );
    }

    #[test]
    fn a_policy_without_a_cost_axis_is_refused() {
        let filter = BidPriceFilter::with_duals(Duals::default()).unwrap();
        let err = AdmissionGate::builder()
            .rate(InProcessLimit::gcra(1, 1))
            .bid_price(filter)
            .build()
            .unwrap_err();
        assert_eq!(err, AdmissionError::PolicyNeedsCostAxis);
    }

    #[test]
    fn a_missing_or_negative_hold_is_fail_open() {
        let c = clock();
        let duals = Duals {
            concurrency: 1.0,
            ..Duals::default()
        };
        let g = policy_gate(&c, BidPriceFilter::with_duals(duals).unwrap());
        for request in [
            AdmitRequest::new("k", 1).with_value(1.0),
            AdmitRequest::new("k", 1).with_value(1.0).with_hold_ms(-5.0),
            AdmitRequest::new("k", 1)
                .with_value(1.0)
                .with_hold_ms(f64::NAN),
        ] {
            let outcome = g.admit_sync(request).unwrap();
            assert!(outcome.decision.allowed, "{request:?}");
            outcome.release.release(false);
        }
        let hog = g
            .admit_sync(AdmitRequest::new("k", 1).with_value(1.0).with_hold_ms(5.0))
            .unwrap();
        assert!(hog.policy_denied);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]
        /// The policy never admits what marginal-AND would deny: every
        /// allowed admission was allowed by every axis.
        #[test]
        fn never_admits_what_marginal_and_denies(
            steps in proptest::collection::vec((1u64..20_000, 0.0f64..100.0, any::<bool>(), 0u64..2_000), 1..120),
            cost_dual in 0.0f64..0.02,
        ) {
            let c = clock();
            let duals = Duals { cost: cost_dual, ..Duals::default() };
            let g = policy_gate(&c, BidPriceFilter::with_duals(duals).unwrap());
            let mut held = Vec::new();
            for (cost, value, release_one, gap) in steps {
                c.advance(gap);
                let outcome = g.admit_sync(AdmitRequest::new("k", cost.min(50_000)).with_value(value)).unwrap();
                if outcome.decision.allowed {
                    let last = g.last_decisions();
                    for axis in Axis::IN_ORDER {
                        prop_assert!(last.get(axis).is_some_and(|d| d.allowed), "{:?}", axis);
                    }
                    prop_assert!(duals.admits(value, cost as f64, None));
                    held.push(outcome.release);
                } else {
                    prop_assert!(!outcome.release.is_holding());
                }
                if release_one {
                    if let Some(r) = held.pop() { r.release(false); }
                }
                prop_assert_eq!(g.concurrency().unwrap().1, held.len() as u64);
            }
        }
    }
}

/// The tower layer over a plain `http` service.
mod layer {
    use std::convert::Infallible;

    use http::{Request, Response, StatusCode};
    use tower::{service_fn, Layer, ServiceExt};

    use super::*;

    type Classify = fn(&Request<String>) -> Option<Admit>;

    /// `x-user` pays `x-cost` (default 1); no `x-user`: not limited.
    fn by_user(request: &Request<String>) -> Option<Admit> {
        let header = |name: &str| request.headers().get(name)?.to_str().ok();
        let cost = header("x-cost").and_then(|c| c.parse().ok()).unwrap_or(1);
        Some(Admit::new(header("x-user")?, cost))
    }

    fn request(user: Option<&str>, cost: u64) -> Request<String> {
        let mut builder = Request::get("/").header("x-cost", cost.to_string());
        if let Some(user) = user {
            builder = builder.header("x-user", user);
        }
        builder.body(String::new()).unwrap()
    }

    async fn ok(_: Request<String>) -> Result<Response<String>, Infallible> {
        Ok(Response::new("served".to_string()))
    }

    fn header(response: &Response<String>, name: &str) -> Option<String> {
        Some(response.headers().get(name)?.to_str().ok()?.to_string())
    }

    #[tokio::test]
    async fn admitted_requests_reach_the_service_and_a_denial_is_429_with_its_wait() {
        let c = clock();
        let layer = AdmissionLayer::new(gate(&c, 4, 2, 1_000), by_user as Classify)
            .headers_when_admitted(true);
        let service = layer.layer(service_fn(ok));
        for _ in 0..2 {
            let response = service
                .clone()
                .oneshot(request(Some("u"), 1))
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.body(), "served");
            assert!(header(&response, "ratelimit-limit").is_some());
        }
        // Two a minute: the third waits 30 s for the rate axis.
        let denied = service
            .clone()
            .oneshot(request(Some("u"), 1))
            .await
            .unwrap();
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(header(&denied, "retry-after").as_deref(), Some("30"));
        assert_eq!(header(&denied, "ratelimit-reset").as_deref(), Some("30"));
        assert_eq!(header(&denied, "ratelimit-remaining").as_deref(), Some("0"));
        assert!(
            denied.body().contains(r#""binding_axis":"rate""#),
            "{}",
            denied.body()
        );
        // Retried after its wait, it is admitted.
        c.advance(30_000);
        let again = service
            .clone()
            .oneshot(request(Some("u"), 1))
            .await
            .unwrap();
        assert_eq!(again.status(), StatusCode::OK);
        // Unlimited requests pass and are counted; invalid ones are 400.
        let health = service.clone().oneshot(request(None, 1)).await.unwrap();
        assert_eq!(health.status(), StatusCode::OK);
        let zero = service
            .clone()
            .oneshot(request(Some("u"), 0))
            .await
            .unwrap();
        assert_eq!(zero.status(), StatusCode::BAD_REQUEST);
        let stats = layer.stats();
        assert_eq!(
            (
                stats.admitted,
                stats.denied,
                stats.unclassified,
                stats.invalid
            ),
            (3, 1, 1, 1)
        );
    }

    #[tokio::test]
    async fn the_slot_is_held_while_the_service_runs_and_freed_when_it_ends_or_is_dropped() {
        let c = clock();
        let layer = AdmissionLayer::new(gate(&c, 1, 100, 1_000), by_user as Classify);
        let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
        let gate_open = Arc::new(tokio::sync::Notify::new());
        let open = gate_open.clone();
        let slow = service_fn(move |_: Request<String>| {
            let (started, open) = (started_tx.clone(), open.clone());
            async move {
                let _ = started.send(());
                open.notified().await;
                Ok::<_, Infallible>(Response::new("slow".to_string()))
            }
        });
        let service = layer.layer(slow);
        let first = tokio::spawn(service.clone().oneshot(request(Some("a"), 1)));
        started_rx.recv().await.unwrap();
        // The only slot is held: another request waits for concurrency.
        let busy = service
            .clone()
            .oneshot(request(Some("b"), 1))
            .await
            .unwrap();
        assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(busy.body().contains(r#""binding_axis":"concurrency""#));
        gate_open.notify_one();
        assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
        // (limit, in flight)
        assert_eq!(layer.gate().concurrency(), Some((1, 0)));
        // A request whose caller hangs up frees its slot too.
        let hung_up = tokio::spawn(service.clone().oneshot(request(Some("c"), 1)));
        started_rx.recv().await.unwrap();
        assert_eq!(layer.gate().concurrency(), Some((1, 1)));
        hung_up.abort();
        let _ = hung_up.await;
        assert_eq!(layer.gate().concurrency(), Some((1, 0)));
    }

    #[tokio::test]
    async fn an_unreachable_budget_is_503_unless_the_layer_fails_open() {
        let c = clock();
        let budget = Arc::new(Budget {
            left: AtomicU64::new(100),
            failing: true.into(),
        });
        let closed = AdmissionLayer::new(global_gate(&c, budget.clone()), by_user as Classify);
        let response = closed
            .layer(service_fn(ok))
            .oneshot(request(Some("u"), 1))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&response, "retry-after").as_deref(), Some("1"));
        assert_eq!(closed.stats().unanswered_denied, 1);
        let open = AdmissionLayer::new(global_gate(&c, budget), by_user as Classify)
            .when_unanswered(WhenUnanswered::Admit);
        let response = open
            .layer(service_fn(ok))
            .oneshot(request(Some("u"), 1))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(open.stats().unanswered_admitted, 1);
    }

    #[tokio::test]
    async fn a_server_error_reports_an_overload_that_contracts_the_limit() {
        let c = clock();
        let gate = AdmissionGate::builder()
            .clock(c.clone())
            .concurrency(ConcurrencyParams {
                initial_limit: 4,
                ..ConcurrencyParams::aimd(1, 8)
            })
            .build()
            .unwrap();
        let layer = AdmissionLayer::new(gate, by_user as Classify);
        let failing = service_fn(|_: Request<String>| async {
            let mut response = Response::new("down".to_string());
            *response.status_mut() = StatusCode::BAD_GATEWAY;
            Ok::<_, Infallible>(response)
        });
        let before = layer.gate().concurrency().unwrap().0;
        let response = layer
            .layer(failing)
            .oneshot(request(Some("u"), 1))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
        assert!(layer.gate().concurrency().unwrap().0 < before);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the requests, the cost that reaches the service never
        /// exceeds the cost axis's budget, every other request is a 429
        /// with a Retry-After of at least 1 s, and the counters add up.
        #[test]
        fn the_service_never_sees_more_than_the_budget(
            requests in proptest::collection::vec((0u8..4, 1u64..40), 1..80),
        ) {
            let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
            let c = clock();
            // Cost capacity 200, refilled 1 a second: the clock never moves.
            let layer = AdmissionLayer::new(gate(&c, 8, 1_000, 200), by_user as Classify);
            let service = layer.layer(service_fn(ok));
            let served_cost = runtime.block_on(async {
                let mut served = 0u64;
                for (user, cost) in &requests {
                    let user = format!("u{user}");
                    let response = service
                        .clone()
                        .oneshot(request(Some(&user), *cost))
                        .await
                        .unwrap();
                    if response.status() == StatusCode::OK {
                        served += cost;
                    } else {
                        assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                        let wait: u64 = header(&response, "retry-after").unwrap().parse().unwrap();
                        assert!(wait >= 1);
                    }
                }
                served
            });
            let stats = layer.stats();
            prop_assert!(served_cost <= 4 * 200, "per key at most its bucket");
            prop_assert_eq!(stats.admitted + stats.denied, requests.len() as u64);
        }
    }
}

/// Requests naming a tenant.
mod tenants {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn in_process_budgets_are_kept_per_tenant_and_key() {
        let c = clock();
        let g = gate(&c, 8, 2, 1_000);
        for tenant in ["acme", "globex"] {
            for _ in 0..2 {
                let outcome = g
                    .admit_sync(AdmitRequest::new("k", 1).with_tenant(tenant))
                    .unwrap();
                assert!(outcome.decision.allowed, "{tenant}");
                outcome.release.release(false);
            }
            let third = g
                .admit_sync(AdmitRequest::new("k", 1).with_tenant(tenant))
                .unwrap();
            assert_eq!(third.binding_axis, Some(Axis::Rate), "{tenant}");
        }
        // The key without a tenant is a budget of its own.
        let bare = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
        assert!(bare.decision.allowed);
        bare.release.release(false);
    }

    #[test]
    fn names_that_could_meet_are_refused() {
        let c = clock();
        let g = gate(&c, 8, 2, 1_000);
        for request in [
            AdmitRequest::new("a\0b", 1),
            AdmitRequest::new("k", 1).with_tenant(""),
            AdmitRequest::new("k", 1).with_tenant("t\0"),
        ] {
            assert!(
                matches!(g.admit_sync(request), Err(AdmissionError::InvalidName(_))),
                "{request:?}"
            );
        }
        assert_eq!(g.concurrency(), Some((8, 0)), "nothing held");
    }

    /// Records the tenant of every acquire; grants what is asked.
    #[derive(Default)]
    struct Tenants(Mutex<Vec<Option<String>>>);

    impl CreditSource for Tenants {
        fn acquire(&self, r: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
            lock_vec(&self.0).push(r.tenant.map(|t| t.as_str().to_string()));
            let grant = Grant {
                granted: r.tokens,
                limit: 1_000,
                window_start_ms: 0,
                window_end_ms: u64::MAX / 4,
                remaining_lifetime_ms: 600_000,
                retry_after_ms: 0,
            };
            async move { Ok(grant) }.boxed()
        }
        fn check(&self, _: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
            async { Err(ClientError::Unsupported("leased only".into())) }.boxed()
        }
        fn give_back(&self, r: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
            async move { Ok(r.tokens) }.boxed()
        }
    }

    fn lock_vec<T>(m: &Mutex<Vec<T>>) -> std::sync::MutexGuard<'_, Vec<T>> {
        m.lock().unwrap()
    }

    #[tokio::test]
    async fn the_global_budget_is_charged_to_each_requests_tenant() {
        let c = clock();
        let source = Arc::new(Tenants::default());
        let config = LimiterConfig::leased(ClientId::new("per-tenant").unwrap())
            .with_lease(crate::LeaseOptions::default().with_sizing(crate::LeaseSizing::Fixed(1)));
        let g = AdmissionGate::builder()
            .clock(c.clone())
            .cost(CostAxis::GlobalPerTenant {
                source: source.clone(),
                config,
                max_tenants: 2,
            })
            .build()
            .unwrap();
        for tenant in [
            Some("acme"),
            Some("globex"),
            None,
            Some("initech"),
            Some("acme"),
        ] {
            let request = match tenant {
                Some(t) => AdmitRequest::new("k", 1).with_tenant(t),
                None => AdmitRequest::new("k", 1),
            };
            assert!(g.admit(request).await.unwrap().decision.allowed);
        }
        let asked: Vec<Option<String>> = lock_vec(&source.0).clone();
        let named = |t: &str| Some(t.to_string());
        assert_eq!(
            asked,
            vec![
                named("acme"),
                named("globex"),
                None,
                named("initech"),
                named("acme")
            ],
            "each request's tenant is charged; no tenant is the config's"
        );
        // A plain global axis refuses a tenant rather than charging another.
        let budget = Arc::new(Budget {
            left: AtomicU64::new(5),
            failing: false.into(),
        });
        let plain = global_gate(&c, budget);
        assert_eq!(
            plain
                .admit(AdmitRequest::new("k", 1).with_tenant("acme"))
                .await
                .unwrap_err(),
            AdmissionError::TenantNeedsPerTenantCost
        );
    }
}

/// A concurrency denial says how its Retry-After was found: the
/// configured fallback before any request completed, an estimate from the
/// latencies seen, and one resting on a request that has run longer than
/// any seen; a denial by another axis says nothing of it.
#[test]
fn a_concurrency_denial_says_how_its_wait_was_found() {
    let c = clock();
    let g = AdmissionGate::builder()
        .clock(c.clone())
        .concurrency(ConcurrencyParams::aimd(1, 1))
        .concurrency_retry_after_ms(250)
        .build()
        .unwrap();
    let first = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    let denied = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert_eq!(denied.binding_axis, Some(Axis::Concurrency));
    assert_eq!(denied.slot_wait, Some(WaitBasis::NoHistory));
    assert_eq!(
        denied.decision.retry_after_ms, 250,
        "the fallback, not an estimate"
    );
    c.advance(40);
    first.release.release(true);
    let second = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert_eq!(second.slot_wait, None, "allowed");
    c.advance(10);
    let denied = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert_eq!(denied.slot_wait, Some(WaitBasis::Estimated));
    c.advance(100);
    let denied = g.admit_sync(AdmitRequest::new("k", 1)).unwrap();
    assert_eq!(denied.slot_wait, Some(WaitBasis::BeyondHistory));
    second.release.release(true);
    // A rate denial says nothing of slots.
    let rated = gate(&c, 10, 1, 1_000);
    rated
        .admit_sync(AdmitRequest::new("r", 1))
        .unwrap()
        .release
        .release(true);
    let denied = rated.admit_sync(AdmitRequest::new("r", 1)).unwrap();
    assert_eq!(denied.binding_axis, Some(Axis::Rate));
    assert_eq!(denied.slot_wait, None);
}
