//! Leased mode with `CheckClock::CycleCounter`, in real time on several
//! threads: credits are never spent once their window is over, and keys
//! evicted under checking threads (whose caches of recent cells still hold
//! them) never spend past their grants, with every admitted token counted.
//! And the default, `CheckClock::Auto`: the counter in real time, tokio's
//! clock once a test pauses it.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{assert_well_formed, FakeCoordinator};
use leasehold_client::{
    cycle_counter_status, CheckClock, CycleCounterStatus, LeaseOptions, LeaseSizing, Limiter,
    LimiterConfig, Mode,
};
use leasehold_core::ids::ClientId;
use tokio::time::Instant;

fn counter_limiter(fake: Arc<FakeCoordinator>, batch: u64, max_keys: usize) -> Limiter {
    let options = LeaseOptions::default()
        .with_sizing(LeaseSizing::Fixed(batch))
        .with_clock(CheckClock::CycleCounter);
    let mut config = LimiterConfig::new(
        Mode::Leased(options),
        ClientId::new("counter").expect("valid id"),
    );
    config.max_keys = max_keys;
    Limiter::new(fake, config).expect("valid config")
}

/// Waits (at most 5 s) until the counter's rate is measured; it must end in
/// use or unavailable, never disabled.
async fn counter_measured() {
    let give_up = Instant::now() + Duration::from_secs(5);
    while matches!(
        cycle_counter_status(),
        CycleCounterStatus::Measuring | CycleCounterStatus::NotStarted
    ) && Instant::now() < give_up
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !matches!(cycle_counter_status(), CycleCounterStatus::Disabled),
        "{:?}",
        cycle_counter_status()
    );
}

/// Grants far larger than the checks spend, so the lanes still hold credits
/// when each window ends: a check that starts after its window's end must
/// not be admitted under that window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credits_are_never_spent_after_their_window() {
    let fake = FakeCoordinator::new(1_000_000, 40, 1_700_000_000_011);
    let limiter = counter_limiter(fake.clone(), 100_000, 1_000);
    counter_measured().await;
    let late = Arc::new(Mutex::new(Vec::new()));
    let windows = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let limiter = limiter.clone();
            let fake = fake.clone();
            let late = late.clone();
            let windows = windows.clone();
            tokio::spawn(async move {
                let until = Instant::now() + Duration::from_millis(400);
                let mut checks = 0u64;
                while Instant::now() < until {
                    let started = Instant::now();
                    let admission = limiter
                        .check_labelled(&format!("key-{}", checks % 3), 1 + t % 2)
                        .await
                        .expect("no error");
                    assert_well_formed(&admission);
                    if let Some(start) = admission.window_start_ms {
                        windows.lock().expect("lock").insert(start);
                        if started >= fake.instant_of(start + fake.window_ms) {
                            late.lock().expect("lock").push(start);
                        }
                    }
                    checks += 1;
                    if checks.is_multiple_of(64) {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("checking task");
    }
    assert!(
        windows.lock().expect("lock").len() >= 5,
        "the run spans several windows"
    );
    assert_eq!(
        *late.lock().expect("lock"),
        Vec::<u64>::new(),
        "admitted under a window that had ended"
    );
    assert!(
        limiter.stats().tokens_expired > 0,
        "credits died with their windows"
    );
    let text = limiter.metrics_text();
    assert!(
        text.contains(
            "leasehold_client_check_clock{clock=\"cycle_counter\",state=\"in_use\",\
             chosen=\"cycle_counter\"} 1"
        ),
        "{text}"
    );
}

/// A key table far smaller than the keys checked: cells are evicted while
/// other threads hold them in their caches. Admissions per window never
/// exceed what was granted (less what came back), and the limiter counts
/// exactly the tokens its checks were admitted for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_keys_never_spend_past_their_grants() {
    let fake = FakeCoordinator::new(200_000, 100, 1_700_000_000_000);
    let limiter = counter_limiter(fake.clone(), 16, 3);
    counter_measured().await;
    let admitted = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
    let tasks: Vec<_> = (0..4u64)
        .map(|t| {
            let limiter = limiter.clone();
            let admitted = admitted.clone();
            tokio::spawn(async move {
                for i in 0..4_000u64 {
                    // Runs of one key, so cached cells are spent from
                    // before the next key's insert evicts them.
                    let key = format!("key-{}", (i / 8 + t) % 8);
                    let cost = 1 + (i + t) % 3;
                    let admission = limiter.check_labelled(&key, cost).await.expect("no error");
                    assert_well_formed(&admission);
                    if admission.decision.allowed {
                        let start = admission.window_start_ms.expect("a leased label");
                        *admitted.lock().expect("lock").entry(start).or_default() += cost;
                    }
                    if i.is_multiple_of(32) {
                        tokio::task::yield_now().await;
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("checking task");
    }
    let usage = fake.usage();
    let admitted = admitted.lock().expect("lock");
    for (start, spent) in admitted.iter() {
        let used = usage.get(start).copied().unwrap_or_default();
        assert!(
            *spent <= used.granted - used.returned,
            "window {start}: admitted {spent} > {used:?}"
        );
    }
    let stats = limiter.stats();
    assert_eq!(
        stats.admitted_tokens,
        admitted.values().sum::<u64>(),
        "every admitted token is counted: {stats:?}"
    );
    assert!(stats.admitted_tokens <= stats.tokens_leased, "{stats:?}");
}

/// The clock a limiter's checks read, from its metrics.
fn check_clock(limiter: &Limiter) -> String {
    let text = limiter.metrics_text();
    text.lines()
        .find(|line| line.starts_with("leasehold_client_check_clock{"))
        .unwrap_or_else(|| panic!("no check clock gauge in {text}"))
        .to_string()
}

/// The default clock reads the cycle counter in real time, and tokio's
/// clock for good from the first refill after a test pauses it: credits
/// are then judged in the paused time, so one granted before the pause
/// that the paused time has outlived is not spent.
#[tokio::test]
async fn the_default_clock_is_the_counter_in_real_time_and_the_clock_once_paused() {
    let fake = FakeCoordinator::new(1_000_000, 200, 1_700_000_000_000);
    let config = LimiterConfig::leased(ClientId::new("auto").expect("valid id"))
        .with_lease(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(2)));
    assert_eq!(LeaseOptions::default().clock, CheckClock::Auto);
    let limiter = Limiter::new(fake.clone(), config).expect("valid config");
    counter_measured().await;
    assert!(limiter.check("k", 1).await.expect("no error").allowed);
    let real = check_clock(&limiter);
    if matches!(cycle_counter_status(), CycleCounterStatus::InUse { .. }) {
        assert!(
            real.contains("clock=\"cycle_counter\",state=\"in_use\",chosen=\"auto\""),
            "{real}"
        );
    }

    tokio::time::pause();
    // One credit is held; a check of 2 refills, and the refill looks again.
    assert!(limiter.check("k", 2).await.expect("no error").allowed);
    assert_eq!(limiter.local_balance("k"), 1);
    let paused = check_clock(&limiter);
    assert!(
        paused.contains("clock=\"runtime\",state=\"in_use\",chosen=\"auto\""),
        "{paused}"
    );
    let calls = fake.acquire_calls.load(std::sync::atomic::Ordering::SeqCst);
    // A lifetime of at most one 200 ms window: outlived in paused time.
    tokio::time::advance(Duration::from_millis(1_000)).await;
    let admission = limiter.check_labelled("k", 1).await.expect("no error");
    assert!(admission.decision.allowed);
    assert!(
        fake.acquire_calls.load(std::sync::atomic::Ordering::SeqCst) > calls,
        "the check refilled instead of spending a credit the paused time outlived"
    );
}

/// A limiter built under tokio's paused clock reads the clock from the
/// start.
#[tokio::test(start_paused = true)]
async fn the_default_clock_built_under_a_paused_clock_is_the_clock() {
    let fake = FakeCoordinator::new(1_000, 200, 1_700_000_000_000);
    let limiter = Limiter::new(
        fake,
        LimiterConfig::leased(ClientId::new("paused").expect("valid id")),
    )
    .expect("valid config");
    assert!(limiter.check("k", 1).await.expect("no error").allowed);
    let clock = check_clock(&limiter);
    assert!(
        clock.contains("clock=\"runtime\",state=\"in_use\",chosen=\"auto\""),
        "{clock}"
    );
}
