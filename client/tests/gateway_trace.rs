//! How honest the gate's `Retry-After` is on a gateway workload: 300
//! tenants (one heavy), bursts, requests of varied cost and duration, and
//! releases that come late, twice, or never (a dropped handle). An oracle
//! that knows when every request in flight will free its slot, and shadow
//! copies of the rate and cost state machines fed with exactly what was
//! admitted, judges every denial:
//!
//! - a concurrency wait is *short* when no slot frees within it (a retry
//!   then is denied again), and otherwise overshoots by how much longer
//!   it is than the first slot's freeing; the gate's computed wait is
//!   compared with the fixed 1 s wait it used to answer;
//! - a denial's Retry-After is *too short for rate or cost* when the
//!   request, retried then, would still be denied by either.
//!
//! Two shapes: an API (48 slots, requests of 50–1 500 ms, 2 minutes) and
//! an LLM gateway (8 slots, requests of 2–30 s, 15 minutes). `cargo test -p leasehold-client
//! --release --test gateway_trace -- --nocapture` prints the table
//! (docs/admission.md).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use leasehold_client::admission::{
    AdmissionGate, AdmitRequest, Axis, ConcurrencyParams, CostAxis, GcraParams, InProcessLimit,
    Release, TokenBucketParams,
};
use leasehold_client::transport::WallClock;
use leasehold_core::admission::gcra::Gcra;
use leasehold_core::admission::token_bucket::TokenBucket;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Default)]
struct Clock(AtomicU64);

impl WallClock for Clock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

const FIXED_WAIT_MS: u64 = 1_000;

/// A workload shape.
#[derive(Debug, Clone, Copy)]
struct Shape {
    name: &'static str,
    slots: u64,
    work_ms: (u64, u64),
    /// Arrivals per ms outside and inside the bursts.
    per_ms: (f64, f64),
    /// How long the trace runs, in ms.
    length_ms: u64,
}

const API: Shape = Shape {
    name: "API",
    slots: 48,
    work_ms: (50, 1_500),
    per_ms: (0.06, 0.6),
    length_ms: 120_000,
};

const LLM: Shape = Shape {
    name: "LLM",
    slots: 8,
    work_ms: (2_000, 30_000),
    per_ms: (0.003, 0.03),
    length_ms: 900_000,
};
const RATE: GcraParams = GcraParams {
    limit: 60,
    period_ms: 60_000,
};
const COST: TokenBucketParams = TokenBucketParams {
    capacity: 40_000,
    refill_per_sec: 400,
};

/// How a request's holder ends it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ending {
    OnTime,
    /// Released 500 ms after the work ended.
    Late,
    /// Released twice.
    Twice,
    /// The handle dropped without a release.
    Dropped,
}

struct InFlight {
    frees_at: u64,
    ending: Ending,
    release: Release,
}

#[derive(Debug, Default)]
struct Tally {
    arrivals: u64,
    admitted: u64,
    concurrency_denials: u64,
    computed_short: u64,
    fixed_short: u64,
    /// How much longer than the first slot's freeing each wait that was
    /// long enough is.
    computed_overshoot: Vec<u64>,
    fixed_overshoot: Vec<u64>,
    denials: u64,
    too_short_for_rate_or_cost: u64,
}

fn median(values: &mut [u64]) -> u64 {
    values.sort_unstable();
    values.get(values.len() / 2).copied().unwrap_or(0)
}

/// Shadow rate and cost state per tenant, fed with what was admitted.
#[derive(Default)]
struct Shadow(HashMap<u32, (Gcra, TokenBucket)>);

impl Shadow {
    fn admit(&mut self, tenant: u32, now: u64, cost: u64) {
        let (rate, bucket) = self.0.entry(tenant).or_insert_with(|| {
            (
                Gcra::new(RATE).expect("valid"),
                TokenBucket::new(COST, now).expect("valid"),
            )
        });
        assert!(rate.try_acquire(now, 1).allowed, "shadow rate in step");
        assert!(bucket.try_acquire(now, cost).allowed, "shadow cost in step");
    }

    /// Whether rate and cost would both admit the request at `at`.
    fn would_admit(&self, tenant: u32, at: u64, cost: u64) -> bool {
        match self.0.get(&tenant) {
            None => true,
            Some((rate, bucket)) => rate.peek(at, 1).allowed && bucket.peek(at, cost).allowed,
        }
    }
}

fn run(shape: Shape, seed: u64) -> Tally {
    let clock = Arc::new(Clock::default());
    let gate = AdmissionGate::builder()
        .clock(clock.clone())
        .concurrency(ConcurrencyParams::aimd(shape.slots, shape.slots))
        .concurrency_retry_after_ms(FIXED_WAIT_MS)
        .rate(InProcessLimit::Gcra(RATE))
        .cost(CostAxis::InProcess(InProcessLimit::TokenBucket(COST)))
        .build()
        .expect("a valid gate");
    let mut rng = StdRng::seed_from_u64(seed);
    let mut in_flight: Vec<InFlight> = Vec::new();
    let mut shadow = Shadow::default();
    let mut tally = Tally::default();
    for now in 0..shape.length_ms {
        clock.0.store(now, Ordering::SeqCst);
        // Slots free first.
        let mut i = 0;
        while i < in_flight.len() {
            if in_flight[i].frees_at <= now {
                let done = in_flight.swap_remove(i);
                match done.ending {
                    Ending::OnTime | Ending::Late => {
                        done.release.release(false);
                    }
                    Ending::Twice => {
                        done.release.release(false);
                        done.release.release(false);
                    }
                    Ending::Dropped => drop(done.release),
                }
            } else {
                i += 1;
            }
        }
        // A 1 s burst every 10 s at ten times the base rate.
        let per_ms = if now % 10_000 < 1_000 {
            shape.per_ms.1
        } else {
            shape.per_ms.0
        };
        let mut arrivals = 0;
        while rng.gen_bool(per_ms / (1.0 + per_ms)) && arrivals < 8 {
            arrivals += 1;
        }
        for _ in 0..arrivals {
            tally.arrivals += 1;
            let tenant: u32 = if rng.gen_bool(0.2) {
                0
            } else {
                rng.gen_range(1..300)
            };
            let cost = rng.gen_range(100..4_000);
            let work_ms = rng.gen_range(shape.work_ms.0..shape.work_ms.1);
            let key = format!("tenant-{tenant}");
            let outcome = gate
                .admit_sync(AdmitRequest::new(&key, cost))
                .expect("valid input");
            if outcome.decision.allowed {
                tally.admitted += 1;
                shadow.admit(tenant, now, cost);
                let ending = match rng.gen_range(0..100) {
                    0..=89 => Ending::OnTime,
                    90..=94 => Ending::Late,
                    95..=97 => Ending::Twice,
                    _ => Ending::Dropped,
                };
                let frees_at = now + work_ms + if ending == Ending::Late { 500 } else { 0 };
                in_flight.push(InFlight {
                    frees_at,
                    ending,
                    release: outcome.release,
                });
                continue;
            }
            tally.denials += 1;
            let wait = outcome.decision.retry_after_ms;
            if !shadow.would_admit(tenant, now + wait, cost) {
                tally.too_short_for_rate_or_cost += 1;
            }
            if outcome.binding_axis == Some(Axis::Concurrency) {
                tally.concurrency_denials += 1;
                let own = gate
                    .last_decisions()
                    .concurrency
                    .expect("the concurrency axis decided")
                    .retry_after_ms;
                let earliest = in_flight
                    .iter()
                    .map(|f| f.frees_at)
                    .min()
                    .expect("a full ceiling has requests in flight")
                    - now;
                for (wait, short, overshoot) in [
                    (
                        own,
                        &mut tally.computed_short,
                        &mut tally.computed_overshoot,
                    ),
                    (
                        FIXED_WAIT_MS,
                        &mut tally.fixed_short,
                        &mut tally.fixed_overshoot,
                    ),
                ] {
                    if wait < earliest {
                        *short += 1;
                    } else {
                        overshoot.push(wait - earliest);
                    }
                }
            }
        }
    }
    tally
}

#[test]
fn retry_after_on_a_gateway_trace() {
    let mut rows = String::from(
        "| shape | seed | arrivals | admitted | denials | concurrency denials | short: computed | short: fixed 1 s | median overshoot: computed | median overshoot: fixed 1 s | too short for rate or cost |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for shape in [API, LLM] {
        let (mut computed, mut fixed, mut concurrency) = (0, 0, 0);
        let (mut computed_over, mut fixed_over) = (Vec::new(), Vec::new());
        for seed in 0..4 {
            let mut t = run(shape, seed);
            let percent = |n: u64| 100.0 * n as f64 / t.concurrency_denials.max(1) as f64;
            rows += &format!(
                "| {} | {seed} | {} | {} | {} | {} | {} ({:.1}%) | {} ({:.1}%) | {} ms | {} ms | {} |\n",
                shape.name,
                t.arrivals,
                t.admitted,
                t.denials,
                t.concurrency_denials,
                t.computed_short,
                percent(t.computed_short),
                t.fixed_short,
                percent(t.fixed_short),
                median(&mut t.computed_overshoot),
                median(&mut t.fixed_overshoot),
                t.too_short_for_rate_or_cost
            );
            assert_eq!(
                t.too_short_for_rate_or_cost, 0,
                "{} seed {seed}: a retry after the wait is denied by rate or cost",
                shape.name
            );
            computed += t.computed_short;
            fixed += t.fixed_short;
            concurrency += t.concurrency_denials;
            computed_over.append(&mut t.computed_overshoot);
            fixed_over.append(&mut t.fixed_overshoot);
        }
        assert!(
            concurrency > 100,
            "{}: the trace fills the ceiling",
            shape.name
        );
        // Short at most a quarter of the time, whatever the shape...
        assert!(
            computed * 4 <= concurrency,
            "{}: computed wait short {computed} of {concurrency}",
            shape.name
        );
        // ...and where the fixed wait is rarely short, far shorter.
        if fixed * 4 <= concurrency {
            assert!(
                median(&mut computed_over) * 2 <= median(&mut fixed_over),
                "{}: the computed wait overshoots less",
                shape.name
            );
        } else {
            assert!(computed * 2 <= fixed, "{}: short less often", shape.name);
        }
    }
    println!("{rows}");
}
