//! Leased mode against a fake coordinator window on paused tokio time:
//! coalescing credits each grant once, late grants are dropped, credits
//! never outlive their window, and admissions never exceed grants.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{assert_well_formed, FakeCoordinator, Flight};
use leasehold_client::{
    ClientError, CreditSource, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode,
};
use leasehold_core::ids::ClientId;
use tokio::time::Instant;

fn leased(batch: u64, low_water: u64) -> LeaseOptions {
    LeaseOptions::default()
        .with_sizing(LeaseSizing::Fixed(batch))
        .with_low_water(low_water)
        .with_max_refill_rounds(64)
}

fn limiter(source: Arc<dyn CreditSource>, options: LeaseOptions, name: &str) -> Limiter {
    let mut config = LimiterConfig::new(
        Mode::Leased(options),
        ClientId::new(name).expect("valid id"),
    );
    config.call_timeout = Duration::from_secs(30);
    Limiter::with_shared_source(source, config).expect("valid config")
}

/// Regression for the original's coalescing double credit: 100 concurrent
/// checks waiting on refills must be served from grants credited once.
#[tokio::test(start_paused = true)]
async fn coalesced_refills_credit_each_grant_once() {
    let fake = FakeCoordinator::new(1_000, 60_000, 0);
    fake.random_delays(7, 40);
    let l1 = limiter(fake.clone(), leased(10, 0), "coalesce");
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let l1 = l1.clone();
            tokio::spawn(async move { l1.check_labelled("hot", 1).await })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        let a = t.await.expect("task").expect("no error");
        assert_well_formed(&a);
        admitted += u64::from(a.decision.allowed);
    }
    let stats = l1.stats();
    assert_eq!(admitted, 100, "the budget covers every check");
    // Credited once: what the wallet received is exactly what was granted.
    assert_eq!(stats.tokens_leased, fake.total_granted());
    assert_eq!(
        stats.admitted_tokens + l1.local_balance("hot"),
        stats.tokens_leased
    );
    // Coalesced: one refill per batch, not one per waiting check.
    assert_eq!(
        stats.refills,
        fake.acquire_calls.load(std::sync::atomic::Ordering::SeqCst)
    );
    assert!(stats.refills <= 11, "refills = {}", stats.refills);
}

/// A prefetch whose grant lands after the window died is not credited.
#[tokio::test(start_paused = true)]
async fn late_prefetch_grant_is_dropped() {
    let fake = FakeCoordinator::new(1_000, 1_000, 0);
    // First refill instant; the prefetch is applied at once but its answer
    // takes 1.5 s to come back: past the window's end.
    fake.script([
        Flight::default(),
        Flight {
            before: Duration::ZERO,
            after: Duration::from_millis(1_500),
        },
    ]);
    let l1 = limiter(fake.clone(), leased(10, 5), "prefetch");
    for _ in 0..5 {
        assert!(l1.check("k", 1).await.expect("ok").allowed);
    }
    // Balance 5 ≤ low water: a prefetch is in flight.
    assert_eq!(l1.stats().prefetches, 1);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let stats = l1.stats();
    assert_eq!(stats.late_grants_dropped, 1);
    assert_eq!(stats.late_tokens_dropped, 10);
    assert_eq!(stats.tokens_leased, 10, "only the first grant was credited");
    assert_eq!(
        l1.local_balance("k"),
        0,
        "old credits died with their window"
    );
    assert_eq!(stats.tokens_expired, 5);
    // The next check leases afresh in the new window.
    let a = l1.check_labelled("k", 1).await.expect("ok");
    assert!(a.decision.allowed);
    assert_eq!(a.window_start_ms, Some(2_000));
}

/// A prefetch that lands in time tops the wallet up without a wait.
#[tokio::test(start_paused = true)]
async fn timely_prefetch_is_credited() {
    let fake = FakeCoordinator::new(1_000, 60_000, 0);
    let l1 = limiter(fake.clone(), leased(10, 3), "prefetch-ok");
    for _ in 0..7 {
        assert!(l1.check("k", 1).await.expect("ok").allowed);
    }
    tokio::task::yield_now().await;
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert_eq!(l1.stats().prefetches, 1);
    assert_eq!(l1.local_balance("k"), 13);
    assert_eq!(l1.stats().late_grants_dropped, 0);
}

/// Credits are never spent at or after their window's end in real time,
/// with random flight times, across many windows and concurrent callers.
#[tokio::test(start_paused = true)]
async fn credits_never_outlive_their_window() {
    let mut died = 0;
    for seed in 0..6u64 {
        // A coordinator clock far from tokio's origin, windows misaligned
        // with the start of the test.
        let fake = FakeCoordinator::new(50, 200, 1_700_000_000_037 + seed * 13);
        fake.random_delays(seed, 120);
        let l1 = limiter(fake.clone(), leased(8, 3), "deadline");
        let tasks: Vec<_> = (0..8)
            .map(|t| {
                let l1 = l1.clone();
                let fake = fake.clone();
                tokio::spawn(async move {
                    for i in 0..60u64 {
                        let a = l1
                            .check_labelled("k", 1 + (i + t) % 3)
                            .await
                            .expect("no error");
                        assert_well_formed(&a);
                        if let Some(start) = a.window_start_ms {
                            let end = fake.instant_of(start + fake.window_ms);
                            assert!(
                                Instant::now() < end,
                                "seed {seed}: admitted after the window ended"
                            );
                        }
                        tokio::time::sleep(Duration::from_millis(7 * (1 + (i * t) % 5))).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        let s = l1.stats();
        died += s.tokens_expired + s.late_tokens_dropped;
    }
    assert!(
        died > 0,
        "the histories must include credits that died with their window"
    );
}

/// Several limiters (the L1s of a region) on one coordinator window: Σ
/// admissions per window ≤ Σ granted − Σ returned ≤ L, for seeded random
/// costs, delays and concurrency.
#[tokio::test(start_paused = true)]
async fn admissions_never_exceed_grants_under_concurrency() {
    use rand::{Rng, SeedableRng};
    for seed in 0..8u64 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let limit = rng.gen_range(20..200);
        let fake = FakeCoordinator::new(limit, 500, rng.gen_range(0..10_000));
        fake.random_delays(seed, 60);
        let admitted = Arc::new(std::sync::Mutex::new(
            std::collections::BTreeMap::<u64, u64>::new(),
        ));
        let mut tasks = Vec::new();
        let mut limiters = Vec::new();
        for n in 0..rng.gen_range(1..5) {
            let options = leased(rng.gen_range(1..20), rng.gen_range(0..4))
                .with_return_idle_after(Duration::from_millis(rng.gen_range(50..400)));
            let l1 = limiter(fake.clone(), options, &format!("l1-{n}"));
            limiters.push(l1.clone());
            for t in 0..rng.gen_range(1..12) {
                let l1 = l1.clone();
                let admitted = admitted.clone();
                let task_seed = seed * 1_000 + n * 100 + t;
                tasks.push(tokio::spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(task_seed);
                    for _ in 0..40 {
                        let cost = rng.gen_range(1..6);
                        let a = l1.check_labelled("shared", cost).await.expect("no error");
                        assert_well_formed(&a);
                        if let Some(start) = a.window_start_ms {
                            *admitted.lock().expect("lock").entry(start).or_default() += cost;
                        }
                        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..80))).await;
                    }
                }));
            }
        }
        for t in tasks {
            t.await.expect("task");
        }
        let usage = fake.usage();
        for (start, spent) in admitted.lock().expect("lock").iter() {
            let u = usage.get(start).copied().unwrap_or_default();
            assert!(
                *spent <= u.granted - u.returned,
                "seed {seed} window {start}: {spent} > {u:?}"
            );
            assert!(
                *spent <= limit,
                "seed {seed} window {start}: {spent} > L = {limit}"
            );
        }
        for l1 in &limiters {
            let s = l1.stats();
            assert!(s.admitted_tokens <= s.tokens_leased, "seed {seed}: {s:?}");
            assert_eq!(s.errors, 0, "seed {seed}: {s:?}");
        }
    }
}

/// A check its caller gives up on does not cancel the refill: the grant
/// still lands, once, for the next check.
#[tokio::test(start_paused = true)]
async fn a_cancelled_check_leaves_the_refill_running() {
    let fake = FakeCoordinator::new(100, 60_000, 0);
    fake.script([Flight {
        before: Duration::from_millis(300),
        after: Duration::from_millis(300),
    }]);
    let l1 = limiter(fake.clone(), leased(10, 0), "slow");
    let gave_up = tokio::time::timeout(Duration::from_millis(400), l1.check("k", 1)).await;
    assert!(gave_up.is_err(), "the caller's own deadline fired first");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(l1.local_balance("k"), 10);
    assert!(l1.check("k", 1).await.expect("ok").allowed);
    assert_eq!(l1.stats().tokens_leased, 10);
    assert_eq!(
        fake.acquire_calls.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
}

/// The limiter's own call deadline turns a hung backend into a typed error.
#[tokio::test(start_paused = true)]
async fn a_hung_backend_hits_the_call_deadline() {
    let fake = FakeCoordinator::new(100, 60_000, 0);
    fake.script([Flight {
        before: Duration::from_secs(60),
        after: Duration::ZERO,
    }]);
    let mut config = LimiterConfig::new(
        Mode::Leased(leased(10, 0)),
        ClientId::new("hung").expect("valid"),
    );
    config.call_timeout = Duration::from_millis(400);
    let l1 = Limiter::new(fake.clone(), config).expect("valid");
    assert_eq!(
        l1.check("k", 1).await,
        Err(ClientError::DeadlineExceeded(Duration::from_millis(400)))
    );
    // The refill is abandoned at its own deadline; then the key refills again.
    tokio::time::sleep(Duration::from_millis(1)).await;
    assert!(
        l1.check("k", 1)
            .await
            .expect("second refill answers at once")
            .allowed
    );
    assert_eq!(l1.stats().refills, 2);
}

/// An exhausted window is denied with the time left as the retry hint, and
/// the empty grant is remembered: no refill storm while it runs.
#[tokio::test(start_paused = true)]
async fn exhausted_window_denies_without_asking_again() {
    let fake = FakeCoordinator::new(5, 1_000, 0);
    let l1 = limiter(fake.clone(), leased(10, 0), "exhaust");
    for _ in 0..5 {
        assert!(l1.check("k", 1).await.expect("ok").allowed);
    }
    let denial = l1.check("k", 1).await.expect("ok");
    assert!(!denial.allowed);
    assert!(denial.retry_after_ms >= 1 && denial.retry_after_ms <= 1_000);
    assert_eq!(denial.reset_at_ms, 1_000);
    let calls = fake.acquire_calls.load(std::sync::atomic::Ordering::SeqCst);
    for _ in 0..20 {
        assert!(!l1.check("k", 1).await.expect("ok").allowed);
    }
    assert_eq!(
        fake.acquire_calls.load(std::sync::atomic::Ordering::SeqCst),
        calls
    );
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(
        l1.check("k", 1).await.expect("ok").allowed,
        "a new window grants again"
    );
}

/// Partial grants are accumulated until the cost is covered.
#[tokio::test(start_paused = true)]
async fn a_large_cost_is_served_from_several_grants() {
    let fake = FakeCoordinator::new(100, 60_000, 0);
    let l1 = limiter(fake.clone(), leased(4, 0), "large");
    let a = l1.check_labelled("k", 30).await.expect("ok");
    assert!(a.decision.allowed);
    assert_eq!(fake.total_granted(), 30);
    let too_big = l1.check("k", 80).await.expect("ok");
    assert!(!too_big.allowed, "only 70 tokens are left in the window");
    assert_eq!(fake.total_granted(), 100);
    assert!(
        l1.check("k", 70).await.expect("ok").allowed,
        "the residue stays usable"
    );
}

/// Bad input is a typed error, not a denial and not a backend call.
#[tokio::test(start_paused = true)]
async fn bad_input_is_rejected_before_the_backend() {
    let fake = FakeCoordinator::new(100, 60_000, 0);
    let l1 = limiter(fake.clone(), leased(4, 0), "input");
    assert!(matches!(
        l1.check("", 1).await,
        Err(ClientError::InvalidInput(_))
    ));
    assert!(matches!(
        l1.check("k", 0).await,
        Err(ClientError::InvalidInput(_))
    ));
    assert!(matches!(
        l1.check(&"x".repeat(300), 1).await,
        Err(ClientError::InvalidInput(_))
    ));
    assert_eq!(
        fake.acquire_calls.load(std::sync::atomic::Ordering::SeqCst),
        0
    );
    assert_eq!(l1.stats().errors, 3);
}

/// An unreachable backend is an `Unavailable` error; held credits keep
/// serving meanwhile, and the next refill after recovery works.
#[tokio::test(start_paused = true)]
async fn an_unreachable_backend_is_a_transient_error() {
    let fake = FakeCoordinator::new(100, 60_000, 0);
    let l1 = limiter(fake.clone(), leased(3, 0), "outage");
    assert!(l1.check("k", 1).await.expect("ok").allowed);
    fake.fail_next(1);
    assert!(l1.check("k", 1).await.expect("ok").allowed);
    assert!(l1.check("k", 1).await.expect("ok").allowed);
    let err = l1.check("k", 1).await.expect_err("backend down");
    assert!(matches!(err, ClientError::Unavailable(_)) && err.is_transient());
    assert!(l1.check("k", 1).await.expect("recovered").allowed);
}

/// Idle credits go back to the backend while their window is current.
#[tokio::test(start_paused = true)]
async fn idle_credits_are_returned() {
    let fake = FakeCoordinator::new(100, 60_000, 0);
    let options = leased(10, 0).with_return_idle_after(Duration::from_millis(500));
    let l1 = limiter(fake.clone(), options, "idle");
    assert!(l1.check("k", 3).await.expect("ok").allowed);
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    assert_eq!(l1.local_balance("k"), 0);
    assert_eq!(l1.stats().tokens_returned, 7);
    let usage = fake.usage();
    assert_eq!(usage.values().map(|u| u.returned).sum::<u64>(), 7);
    // Returning on demand (e.g. at shutdown) works too.
    assert!(l1.check("k", 1).await.expect("ok").allowed);
    assert_eq!(l1.return_idle_credits(Duration::ZERO).await, Ok(9));
}

/// Every refill carries a fresh request id of this limiter's incarnation:
/// the configured name plus a random suffix drawn per limiter.
#[tokio::test(start_paused = true)]
async fn refills_carry_distinct_request_ids_of_a_fresh_incarnation() {
    let fake = FakeCoordinator::new(100, 60_000, 0);
    let l1 = limiter(fake.clone(), leased(2, 0), "ids");
    let restarted = limiter(fake.clone(), leased(2, 0), "ids");
    assert_ne!(
        l1.client_id(),
        restarted.client_id(),
        "a restarted process draws another incarnation"
    );
    for _ in 0..10 {
        l1.check("k", 1).await.expect("ok");
    }
    let ids = fake.request_ids();
    assert_eq!(ids.len(), 5);
    assert!(ids
        .iter()
        .all(|(client, _)| client == l1.client_id().as_str() && client.starts_with("ids-")));
    let mut seqs: Vec<u64> = ids.iter().map(|(_, s)| *s).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), 5);
}

/// A sizer that asks for twice the last window's demand, recording what it saw.
#[derive(Debug)]
struct DoubleLastWindow {
    seen: Arc<std::sync::Mutex<Vec<u64>>>,
    size: u64,
}

impl leasehold_client::sizing::LeaseSizer for DoubleLastWindow {
    fn size(&self) -> u64 {
        self.size
    }
    fn observe_window_demand(&mut self, served: u64) {
        self.seen.lock().expect("lock").push(served);
        self.size = 2 * served;
    }
}

/// An adaptive sizer learns each closed window's demand and sizes the
/// following refills from it.
#[tokio::test(start_paused = true)]
async fn an_adaptive_sizer_learns_from_closed_windows() {
    let fake = FakeCoordinator::new(1_000, 1_000, 0);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let factory_seen = seen.clone();
    let sizing = LeaseSizing::Adaptive(leasehold_client::sizing::SizerFactory::new(move || {
        Box::new(DoubleLastWindow {
            seen: factory_seen.clone(),
            size: 4,
        })
    }));
    let l1 = limiter(fake.clone(), leased(1, 0).with_sizing(sizing), "adaptive");
    for _ in 0..7 {
        assert!(l1.check("k", 1).await.expect("ok").allowed);
    }
    assert_eq!(fake.asked(), vec![4, 4]);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert!(l1.check("k", 1).await.expect("ok").allowed);
    assert_eq!(
        *seen.lock().expect("lock"),
        vec![7],
        "window 0 served 7 tokens"
    );
    for _ in 0..4 {
        assert!(l1.check("k", 1).await.expect("ok").allowed);
    }
    assert_eq!(
        fake.asked(),
        vec![4, 4, 4, 14],
        "sized from the learned demand"
    );
}

/// The value of one sample line of a text exposition document.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// The limiter's `/metrics` document agrees with its stats, counts a round
/// trip per answered refill, and shows the backend unreachable after a
/// failed refill and reachable again after the next answer.
#[tokio::test(start_paused = true)]
async fn metrics_follow_stats_round_trips_and_reachability() {
    let fake = FakeCoordinator::new(1_000, 60_000, 0);
    let l1 = limiter(fake.clone(), leased(10, 0), "metrics");
    for _ in 0..25 {
        let admission = l1.check_labelled("m", 1).await.expect("admitted");
        assert!(admission.decision.allowed);
    }
    let stats = l1.stats();
    let text = l1.metrics_text();
    assert_eq!(
        sample(&text, "leasehold_client_info{mode=\"leased\"}"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        sample(
            &text,
            // The default clock under tokio's paused clock: the clock.
            "leasehold_client_check_clock{clock=\"runtime\",state=\"in_use\",chosen=\"auto\"}"
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(sample(&text, "leasehold_client_admitted_total"), Some(25.0));
    assert_eq!(
        sample(&text, "leasehold_client_refills_total"),
        Some(stats.refills as f64)
    );
    assert_eq!(
        sample(&text, "leasehold_client_backend_round_trip_seconds_count"),
        Some(stats.refills as f64),
        "one round trip per answered refill"
    );
    assert_eq!(
        sample(&text, "leasehold_client_backend_reachable"),
        Some(1.0)
    );

    // Spend what is held, then the next refill fails.
    while l1.local_balance("m") > 0 {
        l1.check_labelled("m", 1).await.expect("admitted");
    }
    fake.fail_next(64);
    let failed = l1.check_labelled("m", 1).await;
    assert!(failed.is_err() || !failed.as_ref().is_ok_and(|a| a.decision.allowed));
    let text = l1.metrics_text();
    assert_eq!(
        sample(&text, "leasehold_client_backend_reachable"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        sample(&text, "leasehold_client_backend_round_trip_seconds_count"),
        Some(l1.stats().refills as f64 - 1.0),
        "a failed refill has no round trip"
    );
}

/// One run of a demand trace through a leased limiter: 1 s windows whose
/// demand switches between 40 and 900 tokens every 6 windows, spread
/// evenly over the first 990 ms of each window (a grant in the last
/// millisecond is too late to use); before each window, `forecast(actual)` is
/// handed to `predict`. Returns (refills, stranded tokens).
async fn trace_run(sizing: LeaseSizing, forecast: impl Fn(u64) -> Option<u64>) -> (u64, u64) {
    const WINDOWS: u64 = 48;
    let demand = |t: u64| if (t / 6).is_multiple_of(2) { 40 } else { 900 };
    let fake = FakeCoordinator::new(10_000_000, 1_000, 0);
    let l1 = limiter(fake.clone(), leased(1, 0).with_sizing(sizing), "trace");
    let start = tokio::time::Instant::now();
    for t in 0..WINDOWS {
        let d = demand(t);
        if let Some(f) = forecast(d) {
            l1.predict("k", f).expect("a valid key");
        }
        for i in 0..d {
            tokio::time::sleep_until(
                start + Duration::from_micros(t * 1_000_000 + i * 990_000 / d + 1),
            )
            .await;
            let d = l1.check("k", 1).await.expect("ok");
            assert!(d.allowed, "window {t}, check {i}: {d:?} {:?}", l1.stats());
        }
    }
    tokio::time::sleep_until(start + Duration::from_millis(WINDOWS * 1_000 + 10)).await;
    let stats = l1.stats();
    (stats.refills, stats.tokens_expired)
}

/// The predictive sizer's forecasts through `Limiter::predict`: on a
/// trace whose demand jumps, good forecasts cost less than the EOQ learner
/// alone (20 per refill + 1 per stranded credit, the EOQ objective), and
/// forecasts 1 000× off cost about what the learner alone does.
#[tokio::test(start_paused = true)]
async fn forecasts_through_the_limiter_beat_the_eoq_learner_and_bad_ones_cost_little() {
    use leasehold_client::EoqParams;
    let eoq = EoqParams::default();
    let cost = |(refills, stranded): (u64, u64)| 20 * refills + stranded;
    let learner = trace_run(LeaseSizing::eoq(eoq).expect("valid"), |_| None).await;
    let predictive = || {
        LeaseSizing::predictive(eoq, leasehold_client::PredictiveParams::default()).expect("valid")
    };
    let unforecast = trace_run(predictive(), |_| None).await;
    let good = trace_run(predictive(), Some).await;
    let bad = trace_run(predictive(), |d| Some(d * 1_000)).await;
    println!(
        "EOQ learner {} ({learner:?}), predictive without forecasts {} ({unforecast:?}), \
         good forecasts {} ({good:?}), forecasts 1000x off {} ({bad:?})",
        cost(learner),
        cost(unforecast),
        cost(good),
        cost(bad)
    );
    assert!(
        cost(good) * 100 <= cost(learner) * 90,
        "good forecasts gain ≥ 10%"
    );
    assert!(
        cost(bad) * 100 <= cost(learner) * 125,
        "bad forecasts cost ≤ 25% more"
    );
    // A fixed-size limiter takes no forecasts.
    let fake = FakeCoordinator::new(1_000, 1_000, 0);
    let fixed = limiter(fake, leased(4, 0), "fixed");
    assert!(!fixed.predict("k", 100).expect("a valid key"));
    assert!(fixed.predict("", 100).is_err());
}
