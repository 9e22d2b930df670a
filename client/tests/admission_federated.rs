//! Federated admission: several regions, each with its own admission gate
//! (local concurrency and per-key rate) whose cost axis is the one global
//! budget, leased through a `Limiter` from a shared coordinator window.
//! Σ cost admitted per window stays ≤ L across regions, while rate and
//! concurrency bind locally. Paused tokio time, seeded arrivals.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::FakeCoordinator;
use leasehold_client::admission::{AdmissionGate, AdmitRequest, CostAxis, InProcessLimit};
use leasehold_client::transport::WallClock;
use leasehold_client::{CreditSource, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode};
use leasehold_core::admission::concurrency::ConcurrencyParams;
use leasehold_core::ids::ClientId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const WINDOW_MS: u64 = 1_000;
const GLOBAL_LIMIT: u64 = 1_000;

/// The gates read the coordinator's clock (no skew in this test).
struct CoordinatorClock(Arc<FakeCoordinator>);

impl WallClock for CoordinatorClock {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}

fn region_gate(fake: &Arc<FakeCoordinator>, region: usize) -> AdmissionGate {
    let options = LeaseOptions::default()
        .with_sizing(LeaseSizing::Fixed(20))
        .with_max_refill_rounds(64);
    let mut config = LimiterConfig::new(
        Mode::Leased(options),
        ClientId::new(format!("region-{region}")).expect("valid id"),
    );
    config.call_timeout = Duration::from_secs(30);
    let source: Arc<dyn CreditSource> = fake.clone();
    let limiter = Limiter::with_shared_source(source, config).expect("valid config");
    AdmissionGate::builder()
        .clock(Arc::new(CoordinatorClock(fake.clone())))
        .concurrency(ConcurrencyParams::aimd(4, 4))
        .rate(InProcessLimit::gcra(20, WINDOW_MS))
        .cost(CostAxis::Global(limiter))
        .build()
        .expect("valid gate")
}

#[derive(Default)]
struct Ledger {
    /// Σ cost admitted, by the coordinator window it was admitted in.
    cost_by_window: BTreeMap<u64, u64>,
}

/// One region's traffic: `keys` tenants, a request every `gap_ms`, each
/// holding its slot `hold_ms`.
async fn drive(
    gate: AdmissionGate,
    fake: Arc<FakeCoordinator>,
    ledger: Arc<Mutex<Ledger>>,
    seed: u64,
    gap_ms: u64,
    hold_ms: u64,
    requests: usize,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut handlers = Vec::new();
    for i in 0..requests {
        tokio::time::sleep(Duration::from_millis(gap_ms)).await;
        let key = format!("tenant-{}", i % 2);
        let cost = rng.gen_range(1..=20u64);
        let (gate, fake, ledger) = (gate.clone(), fake.clone(), ledger.clone());
        handlers.push(tokio::spawn(async move {
            let outcome = gate
                .admit(AdmitRequest::new(&key, cost))
                .await
                .expect("the fake coordinator answers");
            if outcome.decision.allowed {
                let window = fake.now_ms() / WINDOW_MS;
                *ledger
                    .lock()
                    .unwrap()
                    .cost_by_window
                    .entry(window)
                    .or_default() += cost;
                tokio::time::sleep(Duration::from_millis(hold_ms)).await;
                outcome.release.release(false);
            }
        }));
    }
    for h in handlers {
        h.await.expect("handler");
    }
}

#[tokio::test(start_paused = true)]
async fn global_cost_per_window_stays_within_the_limit_while_rate_and_concurrency_bind_locally() {
    let fake = FakeCoordinator::new(GLOBAL_LIMIT, WINDOW_MS, 0);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    // (arrival gap, hold): a hot region, a busy one, a quiet one.
    let shapes = [(2u64, 20u64), (5, 10), (20, 5)];
    let gates: Vec<AdmissionGate> = (0..shapes.len()).map(|r| region_gate(&fake, r)).collect();
    let mut regions = Vec::new();
    for (r, (gap_ms, hold_ms)) in shapes.into_iter().enumerate() {
        regions.push(tokio::spawn(drive(
            gates[r].clone(),
            fake.clone(),
            ledger.clone(),
            40 + r as u64,
            gap_ms,
            hold_ms,
            (5 * WINDOW_MS / gap_ms) as usize,
        )));
    }
    for r in regions {
        r.await.expect("region");
    }

    let ledger = ledger.lock().unwrap();
    assert!(
        ledger.cost_by_window.len() >= 5,
        "{:?}",
        ledger.cost_by_window
    );
    for (window, cost) in &ledger.cost_by_window {
        assert!(
            *cost <= GLOBAL_LIMIT,
            "window {window}: {cost} admitted > L = {GLOBAL_LIMIT}"
        );
    }
    // The budget binds globally: some window is nearly spent.
    let busiest = ledger.cost_by_window.values().max().copied().unwrap_or(0);
    assert!(busiest >= GLOBAL_LIMIT * 9 / 10, "busiest window {busiest}");

    let hot = gates[0].denied_by_axis();
    assert!(hot.concurrency > 0, "hot region: {hot:?}");
    assert!(hot.rate > 0, "hot region: {hot:?}");
    let quiet = gates[2].denied_by_axis();
    assert_eq!(quiet.concurrency, 0, "quiet region: {quiet:?}");
    assert!(gates.iter().map(|g| g.denied_by_axis().cost).sum::<u64>() > 0);
    assert!(gates[2].admitted() > 0);
}
