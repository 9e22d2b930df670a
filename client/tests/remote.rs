//! Strict and cached-deny modes against the fake coordinator window.

mod common;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{assert_well_formed, FakeCoordinator};
use leasehold_client::{combine, CreditSource, Decision, Limiter, LimiterConfig, Mode};
use leasehold_core::ids::ClientId;

fn limiter(source: Arc<dyn CreditSource>, mode: Mode) -> Limiter {
    let config = LimiterConfig::new(mode, ClientId::new("remote").expect("valid id"));
    Limiter::with_shared_source(source, config).expect("valid config")
}

/// Strict mode asks the backend on every check and admits exactly L.
#[tokio::test(start_paused = true)]
async fn strict_asks_every_time() {
    let fake = FakeCoordinator::new(10, 1_000, 0);
    let l1 = limiter(fake.clone(), Mode::Strict);
    let mut admitted = 0;
    for i in 0..25u64 {
        let a = l1.check_labelled("k", 1).await.expect("ok");
        assert_well_formed(&a);
        admitted += u64::from(a.decision.allowed);
        assert_eq!(fake.check_calls.load(Ordering::SeqCst), i + 1);
    }
    assert_eq!(admitted, 10);
    let stats = l1.stats();
    assert_eq!(
        (stats.admitted, stats.denied, stats.backend_calls),
        (10, 15, 25)
    );
    assert_eq!(stats.denied_from_cache, 0);
}

/// Cached-deny serves a denial locally until its retry-after has passed,
/// with a shrinking retry hint; smaller costs still ask.
#[tokio::test(start_paused = true)]
async fn cached_deny_honours_retry_after() {
    let fake = FakeCoordinator::with_deny_retry_after(5, 60_000, 500);
    let l1 = limiter(fake.clone(), Mode::CachedDeny);
    assert!(l1.check("k", 3).await.expect("ok").allowed);
    let first = l1.check("k", 3).await.expect("ok");
    assert!(!first.allowed);
    assert_eq!(first.retry_after_ms, 500);
    assert_eq!(fake.check_calls.load(Ordering::SeqCst), 2);

    tokio::time::sleep(Duration::from_millis(200)).await;
    let cached = l1.check("k", 4).await.expect("ok");
    assert!(!cached.allowed);
    assert_eq!(cached.retry_after_ms, 300, "the hint counts down");
    assert_eq!(
        fake.check_calls.load(Ordering::SeqCst),
        2,
        "answered locally"
    );
    assert_eq!(l1.stats().denied_from_cache, 1);

    // A smaller cost may fit: it asks.
    assert!(l1.check("k", 2).await.expect("ok").allowed);
    assert_eq!(fake.check_calls.load(Ordering::SeqCst), 3);

    // Once the hint has passed, the backend is asked again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!l1.check("k", 3).await.expect("ok").allowed);
    assert_eq!(fake.check_calls.load(Ordering::SeqCst), 4);
}

/// A flood on a denied key costs the backend one call per retry-after.
#[tokio::test(start_paused = true)]
async fn cached_deny_absorbs_a_flood() {
    let fake = FakeCoordinator::with_deny_retry_after(1, 60_000, 1_000);
    let l1 = limiter(fake.clone(), Mode::CachedDeny);
    assert!(l1.check("k", 1).await.expect("ok").allowed);
    for _ in 0..1_000 {
        let a = l1.check_labelled("k", 1).await.expect("ok");
        assert_well_formed(&a);
        assert!(!a.decision.allowed);
    }
    assert_eq!(fake.check_calls.load(Ordering::SeqCst), 2);
    assert_eq!(l1.stats().denied_from_cache, 999);
}

/// Decisions of different limits combine per core's algebra: the result
/// is allowed only if both are, and reports the binding limit and wait.
#[tokio::test(start_paused = true)]
async fn decisions_of_two_limiters_combine() {
    let per_user = limiter(FakeCoordinator::new(3, 60_000, 0), Mode::Strict);
    let per_org = limiter(FakeCoordinator::new(100, 60_000, 0), Mode::Strict);
    let mut admitted = 0;
    for _ in 0..5 {
        let user = per_user.check("user:1", 1).await.expect("ok");
        let org = per_org.check("org:1", 1).await.expect("ok");
        let both = combine(combine(Decision::ALLOW_FULL, user), org);
        assert_eq!(both.allowed, user.allowed && org.allowed);
        assert_eq!(both.limit, 3);
        assert_eq!(
            both.retry_after_ms,
            user.retry_after_ms.max(org.retry_after_ms)
        );
        admitted += u64::from(both.allowed);
    }
    assert_eq!(admitted, 3);
}
