//! An upper bound on the monotonic clock read from the CPU's cycle counter:
//! what a check with credits held reads instead of the clock when its
//! limiter is built with [`CheckClock::CycleCounter`](crate::CheckClock).
//!
//! A read of the monotonic clock costs about 20 ns (the vDSO fences the
//! counter read it makes); a bare read of the counter (x86-64 `rdtsc`,
//! aarch64 `cntvct_el0`, through the `quanta` crate) a few. A check only
//! needs to know that its credits' deadline is still ahead, so a bound that
//! is never *earlier* than the clock serves as well as the clock itself:
//!
//! - **Rate.** Once per process, in the background, two clock reads 25 ms
//!   apart, each between two counter reads, give the counter's rate; the
//!   bound uses the *longest* time per tick the two samples allow (clock
//!   span over the shortest counter span between them), raised by
//!   [`RATE_MARGIN_SHIFT`] (1/64, 1.6 %) for drift and clock slewing (NTP
//!   slews the monotonic clock by at most 0.05 %).
//! - **Anchors.** Each thread pins the counter to the clock with a sample
//!   of its own, and re-pins every [`ANCHOR_SPAN_NS`] (1 ms) of counter
//!   ticks or whenever the counter reads below its anchor (a CPU whose
//!   counter lags). Between pins the bound is the anchor's clock reading
//!   plus the ticks since, at the bounding rate, plus [`SLACK_NS`] for the
//!   counter skew between CPUs: never earlier than the clock, and at most
//!   ~18 µs later.
//! - **Self-check.** Every re-pin first checks that the old anchor's bound,
//!   carried forward to the new sample, is still no earlier than the clock.
//!   If it ever is (a counter that slowed or stopped: a migrated virtual
//!   machine, a counter that is not invariant), the process stops using the
//!   counter for good and every check reads the clock, with a warning
//!   logged once ([`status`] reports it).
//!
//! Until the rate is measured, and where the CPU has no invariant counter
//! (`quanta` then reads the monotonic clock itself), the bound is the clock.
//!
//! The counter runs in real time, so a limiter using it must not run under
//! tokio's paused test clock; [`CheckClock::Runtime`](crate::CheckClock)
//! is for that.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Once, OnceLock};
use std::time::{Duration, Instant};

/// The bounding rate is the measured one plus this fraction of it
/// (`rate >> 6`, 1/64).
const RATE_MARGIN_SHIFT: u32 = 6;

/// Counter ticks a thread's anchor answers for, in nanoseconds at the
/// bounding rate: the bound drifts at most this × 1/64 ahead of the clock.
pub(crate) const ANCHOR_SPAN_NS: u64 = 1_000_000;

/// Added to every bound: counter skew between CPUs (a kernel that uses
/// the counter as its clock source checks it is far below this).
pub(crate) const SLACK_NS: u64 = 2_000;

/// The span between the two calibration samples.
const CALIBRATION_SPAN: Duration = Duration::from_millis(25);

/// A calibration sample is retried while the counter moved more than
/// 1 / this of the span during its clock read (the thread was preempted).
const CALIBRATION_NOISE_DIVISOR: u64 = 1_000;

/// Attempts at a quiet calibration before settling for a noisy one (which
/// only makes the bound looser).
const CALIBRATION_ATTEMPTS: usize = 5;

/// One clock read between two counter reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sample {
    /// The counter just before the clock read.
    pub before: u64,
    /// The clock, nanoseconds since the process origin.
    pub clock_ns: u64,
    /// The counter just after the clock read.
    pub after: u64,
}

/// Nanoseconds per counter tick, 32.32 fixed point: an upper bound on the
/// clock's time per tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TickRate(u64);

impl TickRate {
    /// The bounding rate from two samples taken in that order: the clock's
    /// span over the fewest ticks that can have passed between its two
    /// reads, plus the margin. `None` if the counter did not advance
    /// between them, the clock did not, or the rate does not fit.
    pub(crate) fn measure(first: Sample, second: Sample) -> Option<TickRate> {
        let ticks = second.before.checked_sub(first.after)?;
        let clock = second.clock_ns.checked_sub(first.clock_ns)?;
        if ticks == 0 || clock == 0 {
            return None;
        }
        let per_tick = (u128::from(clock) << 32).div_ceil(u128::from(ticks));
        let bounding = per_tick + (per_tick >> RATE_MARGIN_SHIFT) + 1;
        u64::try_from(bounding)
            .ok()
            .filter(|r| *r != 0)
            .map(TickRate)
    }

    /// Nanoseconds in `ticks`, rounded up (saturating).
    #[inline]
    pub(crate) fn nanos(self, ticks: u64) -> u64 {
        let scaled = (u128::from(ticks) * u128::from(self.0) + u128::from(u32::MAX)) >> 32;
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// The ticks in `nanos`, rounded down (at least 1).
    pub(crate) fn ticks_in(self, nanos: u64) -> u64 {
        let ticks = (u128::from(nanos) << 32) / u128::from(self.0);
        u64::try_from(ticks).unwrap_or(u64::MAX).max(1)
    }

    /// Clock nanoseconds per tick, for reports.
    pub(crate) fn nanos_per_tick(self) -> f64 {
        self.0 as f64 / (1u64 << 32) as f64
    }
}

/// A thread's pin of the counter to the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Anchor {
    /// The counter read just before `clock_ns` was.
    ticks: u64,
    clock_ns: u64,
    /// The last counter reading this anchor answers for.
    until_ticks: u64,
}

impl Anchor {
    /// The anchor of `sample`, answering for [`ANCHOR_SPAN_NS`].
    pub(crate) fn new(sample: Sample, rate: TickRate) -> Anchor {
        Anchor {
            ticks: sample.before,
            clock_ns: sample.clock_ns,
            until_ticks: sample.before.saturating_add(rate.ticks_in(ANCHOR_SPAN_NS)),
        }
    }

    /// The bound on the clock when the counter reads `ticks`, or `None`
    /// outside this anchor's span (the thread re-pins).
    #[inline]
    pub(crate) fn bound(&self, rate: TickRate, ticks: u64) -> Option<u64> {
        if ticks < self.ticks || ticks > self.until_ticks {
            return None;
        }
        Some(
            self.clock_ns
                .saturating_add(rate.nanos(ticks - self.ticks))
                .saturating_add(SLACK_NS),
        )
    }

    /// Whether the bound carried forward from this anchor is still no
    /// earlier than the clock at `later` (a sample whose counter reads
    /// below the anchor's cannot tell, and passes).
    pub(crate) fn held_at(&self, rate: TickRate, later: Sample) -> bool {
        let Some(ticks) = later.after.checked_sub(self.ticks) else {
            return true;
        };
        let bound = self
            .clock_ns
            .saturating_add(rate.nanos(ticks))
            .saturating_add(SLACK_NS);
        bound >= later.clock_ns
    }
}

/// What the cycle counter is doing for this process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CycleCounterStatus {
    /// No limiter asked for it yet.
    NotStarted,
    /// Its rate is being measured; checks read the clock meanwhile.
    Measuring,
    /// Checks read it; the bounding clock nanoseconds per tick.
    InUse {
        /// Clock nanoseconds per counter tick (upper bound).
        nanos_per_tick: f64,
    },
    /// Its rate could not be measured (no counter that advances with the
    /// clock); checks read the clock.
    Unavailable,
    /// A bound came out earlier than the clock once; checks read the clock
    /// for the rest of the process's life.
    Disabled,
}

impl CycleCounterStatus {
    /// The state as the `leasehold_client_check_clock` gauge labels it.
    pub(crate) fn label(&self) -> &'static str {
        match self {
            CycleCounterStatus::NotStarted | CycleCounterStatus::Measuring => "measuring",
            CycleCounterStatus::InUse { .. } => "in_use",
            CycleCounterStatus::Unavailable => "unavailable",
            CycleCounterStatus::Disabled => "disabled",
        }
    }
}

/// [`RATE`] while the rate is not (yet) known.
const RATE_UNKNOWN: u64 = 0;
/// [`RATE`] once measuring failed.
const RATE_UNAVAILABLE: u64 = 1;
/// [`RATE`] once a bound failed.
const RATE_DISABLED: u64 = 2;
/// The smallest real rate: rates below it are refused by [`install`]
/// (a tick of less than 2^-29 ns).
const RATE_SMALLEST: u64 = 8;

/// The bounding rate (32.32), or one of the states above.
static RATE: AtomicU64 = AtomicU64::new(RATE_UNKNOWN);
static COUNTER: OnceLock<quanta::Clock> = OnceLock::new();
static CALIBRATION: Once = Once::new();
static ORIGIN: OnceLock<Instant> = OnceLock::new();

thread_local! {
    static ANCHOR: Cell<Option<Anchor>> = const { Cell::new(None) };
}

/// The instant the counter clock counts its nanoseconds from.
pub(crate) fn origin() -> Instant {
    *ORIGIN.get_or_init(Instant::now)
}

/// The monotonic clock, nanoseconds since [`origin`] (saturating).
fn clock_ns() -> u64 {
    u64::try_from(origin().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Whether tokio's clock reads real time here: its reading lies between
/// two reads of the monotonic clock taken around it. A paused clock reads
/// its frozen instant plus what was advanced, and a clock resumed after a
/// pause stays offset by the time it was paused: both fall outside the
/// bracket once any real time has passed since the pause. What
/// [`CheckClock::Auto`](crate::CheckClock::Auto) decides by.
pub(crate) fn runtime_clock_is_real_time() -> bool {
    let before = Instant::now();
    let runtime = tokio::time::Instant::now().into_std();
    let after = Instant::now();
    before <= runtime && runtime <= after
}

/// Starts measuring the counter's rate in the background (once per
/// process); checks read the clock until it is known.
pub(crate) fn start() {
    origin();
    CALIBRATION.call_once(|| {
        let spawned = std::thread::Builder::new()
            .name("leasehold-cycle-counter".into())
            .spawn(calibrate);
        if spawned.is_err() {
            RATE.store(RATE_UNAVAILABLE, Ordering::Release);
        }
    });
}

/// One clock read between two counter reads.
fn sample(counter: &quanta::Clock) -> Sample {
    let before = counter.raw();
    let clock_ns = clock_ns();
    let after = counter.raw();
    Sample {
        before,
        clock_ns,
        after,
    }
}

/// Measures the rate and installs it.
fn calibrate() {
    let counter = quanta::Clock::new();
    let mut rate = None;
    for attempt in 0..CALIBRATION_ATTEMPTS {
        let first = sample(&counter);
        std::thread::sleep(CALIBRATION_SPAN);
        let second = sample(&counter);
        let span = second.before.saturating_sub(first.after);
        let noise =
            first.after.saturating_sub(first.before) + second.after.saturating_sub(second.before);
        rate = TickRate::measure(first, second);
        let quiet = noise.saturating_mul(CALIBRATION_NOISE_DIVISOR) <= span;
        if rate.is_none() || quiet || attempt + 1 == CALIBRATION_ATTEMPTS {
            break;
        }
    }
    let _ = COUNTER.set(counter);
    install(rate);
}

/// Publishes a measured rate (or that none could be measured).
fn install(rate: Option<TickRate>) {
    let value = match rate {
        Some(TickRate(r)) if r >= RATE_SMALLEST => r,
        _ => RATE_UNAVAILABLE,
    };
    // Never overwrite a disabled counter.
    let _ = RATE.compare_exchange(RATE_UNKNOWN, value, Ordering::AcqRel, Ordering::Acquire);
}

/// What the cycle counter is doing for this process.
pub fn status() -> CycleCounterStatus {
    match RATE.load(Ordering::Acquire) {
        RATE_UNKNOWN if CALIBRATION.is_completed() => CycleCounterStatus::Measuring,
        RATE_UNKNOWN => CycleCounterStatus::NotStarted,
        RATE_UNAVAILABLE => CycleCounterStatus::Unavailable,
        RATE_DISABLED => CycleCounterStatus::Disabled,
        rate => CycleCounterStatus::InUse {
            nanos_per_tick: TickRate(rate).nanos_per_tick(),
        },
    }
}

/// A bound on the monotonic clock now, nanoseconds since [`origin`]: never
/// earlier than the clock (the clock itself until the counter's rate is
/// known, and at each re-pin).
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    let rate = RATE.load(Ordering::Acquire);
    if rate < RATE_SMALLEST {
        return clock_ns();
    }
    let Some(counter) = COUNTER.get() else {
        return clock_ns();
    };
    let rate = TickRate(rate);
    let ticks = counter.raw();
    ANCHOR
        .try_with(|anchor| {
            let previous = anchor.get();
            if let Some(bound) = previous.and_then(|a| a.bound(rate, ticks)) {
                return bound;
            }
            repin(anchor, previous, rate, counter)
        })
        .unwrap_or_else(|_| clock_ns())
}

/// Re-pins this thread's anchor with a fresh sample, first checking that
/// the previous anchor's bound held; returns the sample's clock reading.
#[cold]
fn repin(
    anchor: &Cell<Option<Anchor>>,
    previous: Option<Anchor>,
    rate: TickRate,
    counter: &quanta::Clock,
) -> u64 {
    let sample = sample(counter);
    let clock_ns = sample.clock_ns;
    if previous.is_some_and(|p| !p.held_at(rate, sample)) {
        if RATE.swap(RATE_DISABLED, Ordering::AcqRel) != RATE_DISABLED {
            tracing::warn!(
                "the cycle counter ran slower than the clock; checks read the clock from now on"
            );
        }
        anchor.set(None);
        return clock_ns;
    }
    anchor.set(Some(Anchor::new(sample, rate)));
    clock_ns
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A world where the counter ticks `ticks_per_us` times per clock
    /// microsecond from `offset`: the counter at clock time `ns`.
    fn counter_at(offset: u64, ticks_per_us: u64, ns: u64) -> u64 {
        offset + ns * ticks_per_us / 1_000
    }

    proptest! {
        /// Whatever the counter's rate, the noise of the two calibration
        /// samples and the clock's slewing (±0.05 %) afterwards, the bound
        /// from any anchor is never earlier than the clock within the
        /// anchor's span, and at most 1.6 % + 2 µs + a few ns later.
        #[test]
        fn the_bound_is_never_earlier_than_the_clock(
            ticks_per_us in 100u64..10_000,
            offset in 0u64..1 << 40,
            first_ns in 0u64..1 << 36,
            noise_a in 0u64..5_000,
            noise_b in 0u64..5_000,
            span_ns in 20_000_000u64..30_000_000,
            anchor_ns in 0u64..1 << 36,
            since_ns in 0u64..ANCHOR_SPAN_NS,
            slew_ppm in -500i64..=500,
        ) {
            let at = |ns| counter_at(offset, ticks_per_us, ns);
            // Each clock read lies between its counter reads.
            let first = Sample { before: at(first_ns), clock_ns: first_ns + noise_a / 2, after: at(first_ns + noise_a) };
            let second_ns = first_ns + span_ns;
            let second = Sample { before: at(second_ns), clock_ns: second_ns + noise_b / 2, after: at(second_ns + noise_b) };
            let rate = TickRate::measure(first, second).expect("a rate");
            let anchor = Anchor::new(Sample { before: at(anchor_ns), clock_ns: anchor_ns, after: at(anchor_ns) }, rate);
            // Afterwards the clock may run up to 0.05 % fast against the counter.
            let clock_since = (since_ns as i64 + since_ns as i64 * slew_ppm / 1_000_000) as u64;
            let ticks = at(anchor_ns + since_ns);
            if let Some(bound) = anchor.bound(rate, ticks) {
                prop_assert!(bound >= anchor_ns + clock_since, "bound {} < clock {}", bound, anchor_ns + clock_since);
                let loosest = anchor_ns + since_ns + since_ns / 50 + SLACK_NS + 2_000;
                prop_assert!(bound <= loosest, "bound {} too loose (> {})", bound, loosest);
            } else {
                // Only the end of the span may be cut by rounding.
                prop_assert!(since_ns > ANCHOR_SPAN_NS - ANCHOR_SPAN_NS / 50);
            }
        }

        /// The self-check passes every clock the bound covers and fails a
        /// counter that ran more than the margin slow.
        #[test]
        fn the_self_check_catches_a_slowed_counter(
            ticks_per_us in 100u64..10_000,
            later_us in 2_000u64..1_000_000,
            slow_percent in 3u64..90,
        ) {
            let at = |ns| counter_at(0, ticks_per_us, ns);
            let first = Sample { before: at(0), clock_ns: 0, after: at(0) };
            let second = Sample { before: at(25_000_000), clock_ns: 25_000_000, after: at(25_000_000) };
            let rate = TickRate::measure(first, second).expect("a rate");
            let anchor = Anchor::new(Sample { before: at(30_000_000), clock_ns: 30_000_000, after: at(30_000_000) }, rate);
            let later_ns = 30_000_000 + later_us * 1_000;
            let honest = Sample { before: at(later_ns), clock_ns: later_ns, after: at(later_ns) };
            prop_assert!(anchor.held_at(rate, honest));
            // The counter advanced only (100 - slow_percent) % of what it should have.
            let slowed_ticks = at(30_000_000) + (at(later_ns) - at(30_000_000)) * (100 - slow_percent) / 100;
            let slowed = Sample { before: slowed_ticks, clock_ns: later_ns, after: slowed_ticks };
            prop_assert!(!anchor.held_at(rate, slowed));
        }
    }

    #[test]
    fn a_counter_read_below_the_anchor_or_past_its_span_asks_for_a_repin() {
        let rate = TickRate::measure(
            Sample {
                before: 0,
                clock_ns: 0,
                after: 0,
            },
            Sample {
                before: 1_000_000,
                clock_ns: 1_000_000,
                after: 1_000_000,
            },
        )
        .expect("one tick per ns");
        let anchor = Anchor::new(
            Sample {
                before: 5_000,
                clock_ns: 5_000,
                after: 5_000,
            },
            rate,
        );
        assert_eq!(anchor.bound(rate, 4_999), None, "a lagging CPU's counter");
        assert!(anchor.bound(rate, 5_000).is_some());
        let end = 5_000 + rate.ticks_in(ANCHOR_SPAN_NS);
        assert!(anchor.bound(rate, end).is_some());
        assert_eq!(anchor.bound(rate, end + 1), None, "past the span");
    }

    #[test]
    fn degenerate_samples_give_no_rate() {
        let s = |before, clock_ns, after| Sample {
            before,
            clock_ns,
            after,
        };
        assert_eq!(
            TickRate::measure(s(0, 0, 10), s(10, 100, 10)),
            None,
            "no ticks between"
        );
        assert_eq!(
            TickRate::measure(s(0, 100, 0), s(50, 100, 50)),
            None,
            "no clock between"
        );
        assert_eq!(
            TickRate::measure(s(10, 0, 10), s(5, 100, 5)),
            None,
            "counter backwards"
        );
    }

    /// On the real counter: once measured, no bound read on any of several
    /// threads is earlier than a clock read made just before it.
    #[test]
    fn real_bounds_are_never_earlier_than_the_clock() {
        start();
        let deadline = Instant::now() + Duration::from_secs(5);
        while status() == CycleCounterStatus::Measuring && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(
            matches!(status(), CycleCounterStatus::InUse { .. }),
            "measured: {:?}",
            status()
        );
        let threads: Vec<_> = (0..3)
            .map(|_| {
                std::thread::spawn(|| {
                    for round in 0..200_000u32 {
                        let clock = clock_ns();
                        let bound = now_ns();
                        assert!(bound >= clock, "bound {bound} < clock {clock}");
                        if round % 50_000 == 0 {
                            std::thread::sleep(Duration::from_millis(3));
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no bound below the clock");
        }
        assert!(
            !matches!(status(), CycleCounterStatus::Disabled),
            "the self-check never fired"
        );
    }
}
