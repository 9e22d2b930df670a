//! `Limiter::check` in leased mode with credits already held (no network),
//! next to governor's keyed GCRA check on the same keys, in one run.
//!
//! `cargo bench -p leasehold-client --bench check`
//!
//! Two limiters: `leasehold_leased` has the default check clock,
//! `CheckClock::Auto` (the cycle-counter bound in real time),
//! `leasehold_runtime` sets `CheckClock::Runtime` (tokio's clock on every
//! check).
//! governor reads its default clock, `quanta`'s scaled cycle counter.
//!
//! Cases: one hot key and 1 000 keys, from 1 and 2 threads. The limiter's
//! source grants 2^40 tokens for an hour per refill, so after one warm-up
//! check per key every measured check is a local spend. governor is given a
//! quota it never exhausts, so both sides measure the allowed path.
//!
//! On a machine shared with other work, criterion's ratio swings with the
//! load, because it times the two sides one after the other for seconds
//! each. `CHECK_PAIRED_ROUNDS=20 cargo bench -p leasehold-client --bench
//! check` instead alternates the two sides in rounds of 300 000 checks and
//! prints each side's fastest round and the median of the per-round ratios.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, BenchmarkId, Criterion};
use futures::future::BoxFuture;
use futures::FutureExt;
use leasehold_client::{
    cycle_counter_status, AcquireRequest, CheckClock, CheckReply, CheckRequest, ClientError,
    CreditSource, CycleCounterStatus, Grant, LeaseOptions, LeaseSizing, Limiter, LimiterConfig,
    Mode, ReturnRequest,
};
use leasehold_core::ids::ClientId;

/// A source that always grants what is asked, for an hour.
struct Plenty;

impl CreditSource for Plenty {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        async move {
            Ok(Grant {
                granted: request.tokens,
                limit: 1 << 48,
                window_start_ms: 0,
                window_end_ms: 3_600_000,
                remaining_lifetime_ms: 3_600_000,
                retry_after_ms: 0,
            })
        }
        .boxed()
    }

    fn check(&self, _request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        async { Err(ClientError::Protocol("leased mode only".into())) }.boxed()
    }

    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        async move { Ok(request.tokens) }.boxed()
    }
}

fn keys(count: usize) -> Vec<String> {
    (0..count).map(|i| format!("tenant-{i}/api")).collect()
}

fn leased_limiter(
    runtime: &tokio::runtime::Runtime,
    keys: &[String],
    clock: CheckClock,
) -> Limiter {
    let options = LeaseOptions::default()
        .with_sizing(LeaseSizing::Fixed(1 << 40))
        .with_clock(clock);
    let config = LimiterConfig::new(
        Mode::Leased(options),
        ClientId::new("bench").expect("valid client id"),
    );
    let limiter = Limiter::new(Plenty, config).expect("valid config");
    runtime.block_on(async {
        for key in keys {
            let decision = limiter.check(key, 1).await.expect("warm-up check");
            assert!(decision.allowed, "warm-up check admitted");
        }
    });
    if clock != CheckClock::Runtime {
        // The counter's rate is measured in the background (tens of ms).
        let give_up = Instant::now() + Duration::from_secs(5);
        while matches!(
            cycle_counter_status(),
            CycleCounterStatus::Measuring | CycleCounterStatus::NotStarted
        ) && Instant::now() < give_up
        {
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("cycle counter: {:?}", cycle_counter_status());
    }
    limiter
}

type Governor = governor::DefaultKeyedRateLimiter<String>;

/// One check of `key` in leased mode with credits held: it completes on
/// its first poll, without a wait or a network call.
#[inline(always)]
fn check_held(limiter: &Limiter, key: &str) {
    let decision = limiter
        .check(key, 1)
        .now_or_never()
        .expect("a check with credits held needs no wait")
        .expect("local check");
    assert!(decision.allowed);
}

fn governor_limiter() -> Governor {
    let quota = governor::Quota::per_second(NonZeroU32::MAX).allow_burst(NonZeroU32::MAX);
    governor::RateLimiter::keyed(quota)
}

/// Runs `check` `iterations` times on each of `threads` threads (each
/// inside `runtime`'s context, all at once), cycling through `keys`;
/// returns the wall time, so criterion reports the time of one check on one
/// thread while the other threads check too (contention shows as a rise).
fn timed<F>(
    runtime: &tokio::runtime::Handle,
    threads: usize,
    iterations: u64,
    keys: &Arc<Vec<String>>,
    check: F,
) -> Duration
where
    F: Fn(&String) + Send + Sync + Clone + 'static,
{
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|thread| {
            let keys = Arc::clone(keys);
            let check = check.clone();
            let runtime = runtime.clone();
            std::thread::spawn(move || {
                let _entered = runtime.enter();
                let first = thread * 7;
                for (index, _) in (first..).zip(0..iterations) {
                    check(&keys[index % keys.len()]);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().expect("bench thread");
    }
    start.elapsed()
}

fn check(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("check");
    // Long samples, so the per-sample thread start-up is noise.
    group.sample_size(20);
    group.measurement_time(Duration::from_secs(3));
    for key_count in [1_usize, 1_000] {
        let keys = Arc::new(keys(key_count));
        for threads in [1_usize, 2] {
            let case = format!("{key_count}key/{threads}thread");
            let handle = runtime.handle().clone();
            for (name, clock) in [
                ("leasehold_leased", CheckClock::default()),
                ("leasehold_runtime", CheckClock::Runtime),
            ] {
                let limiter = leased_limiter(&runtime, &keys, clock);
                group.bench_function(BenchmarkId::new(name, &case), |b| {
                    b.iter_custom(|iterations| {
                        let limiter = limiter.clone();
                        timed(&handle, threads, iterations, &keys, move |key| {
                            check_held(&limiter, key)
                        })
                    })
                });
            }
            let governor = Arc::new(governor_limiter());
            group.bench_function(BenchmarkId::new("governor_keyed", &case), |b| {
                b.iter_custom(|iterations| {
                    let governor = Arc::clone(&governor);
                    timed(&handle, threads, iterations, &keys, move |key| {
                        assert!(governor.check_key(key).is_ok());
                    })
                })
            });
        }
    }
    group.finish();
}

/// Checks per thread in one paired round.
const PAIRED_ROUND_CHECKS: u64 = 300_000;

/// The same cases as [`check`], the two sides alternating round by round,
/// so that both see the same load; prints one line per case.
fn paired(rounds: usize) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let handle = runtime.handle().clone();
    let per_check = |elapsed: Duration| elapsed.as_nanos() as f64 / PAIRED_ROUND_CHECKS as f64;
    for key_count in [1_usize, 1_000] {
        let keys = Arc::new(keys(key_count));
        for threads in [1_usize, 2] {
            let limiter = leased_limiter(&runtime, &keys, CheckClock::default());
            let runtime_clock = leased_limiter(&runtime, &keys, CheckClock::Runtime);
            let governor = Arc::new(governor_limiter());
            let (mut ours, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
            let mut ours_runtime = Vec::new();
            for _ in 0..rounds {
                let limiter = limiter.clone();
                let leased = per_check(timed(
                    &handle,
                    threads,
                    PAIRED_ROUND_CHECKS,
                    &keys,
                    move |key| check_held(&limiter, key),
                ));
                let runtime_clock = runtime_clock.clone();
                ours_runtime.push(per_check(timed(
                    &handle,
                    threads,
                    PAIRED_ROUND_CHECKS,
                    &keys,
                    move |key| check_held(&runtime_clock, key),
                )));
                let governor = Arc::clone(&governor);
                let keyed = per_check(timed(
                    &handle,
                    threads,
                    PAIRED_ROUND_CHECKS,
                    &keys,
                    move |key| {
                        assert!(governor.check_key(key).is_ok());
                    },
                ));
                ours.push(leased);
                theirs.push(keyed);
                ratios.push(leased / keyed);
            }
            let fastest = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
            ratios.sort_by(f64::total_cmp);
            let median = ratios[ratios.len() / 2];
            println!(
                "check/paired/{key_count}key/{threads}thread: leasehold_leased {:.1} ns, \
                 governor_keyed {:.1} ns (fastest of {rounds} rounds): {:.2}x; \
                 median of the rounds' ratios {median:.2}x; \
                 leasehold_runtime (tokio's clock) {:.1} ns: {:.2}x",
                fastest(&ours),
                fastest(&theirs),
                fastest(&ours) / fastest(&theirs),
                fastest(&ours_runtime),
                fastest(&ours_runtime) / fastest(&theirs),
            );
        }
    }
}

criterion_group!(benches, check);

/// Criterion's cases; with `CHECK_PAIRED_ROUNDS` set to a positive count,
/// the paired rounds instead.
fn main() {
    let paired_rounds = std::env::var("CHECK_PAIRED_ROUNDS")
        .ok()
        .and_then(|rounds| rounds.parse::<usize>().ok())
        .filter(|rounds| *rounds > 0);
    match paired_rounds {
        Some(rounds) => paired(rounds),
        None => {
            benches();
            Criterion::default().configure_from_args().final_summary();
        }
    }
}
