//! Per-host wall clocks on simulated time, with an offset and a drift: the coordinator
//! stamps proposals with its host's clock, so skewed members exercise the
//! monotonic state-machine clock and relative lifetimes.

use leasehold_client::transport::WallClock;

/// Simulated epoch: the wall clock of an unskewed host at simulated time 0.
pub const SIM_EPOCH_MS: u64 = 1_800_000_000_000;

/// Simulated real time, epoch ms (call from inside a simulation).
pub fn sim_now_ms() -> u64 {
    let elapsed = turmoil::sim_elapsed().unwrap_or_default();
    SIM_EPOCH_MS + u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

/// A host clock `offset_ms` ahead of simulated real time at the start,
/// gaining `drift_ppm` millionths of a second per second (negative: losing).
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    /// How far ahead of real time this host's clock runs at time 0.
    pub offset_ms: u64,
    /// Rate error in parts per million.
    pub drift_ppm: i64,
}

impl WallClock for SkewedClock {
    fn now_ms(&self) -> u64 {
        let real = sim_now_ms();
        let elapsed = i128::from(real.saturating_sub(SIM_EPOCH_MS));
        let drift = elapsed * i128::from(self.drift_ppm) / 1_000_000;
        let now = i128::from(real) + i128::from(self.offset_ms) + drift;
        u64::try_from(now).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// Reads `clock` after `after` of simulated time.
    fn read_after(clock: SkewedClock, after: Duration) -> u64 {
        let seen = Arc::new(AtomicU64::new(0));
        let out = Arc::clone(&seen);
        let mut sim = turmoil::Builder::new()
            .simulation_duration(Duration::from_secs(60))
            .build();
        sim.client("reader", async move {
            tokio::time::sleep(after).await;
            out.store(clock.now_ms(), Ordering::SeqCst);
            Ok(())
        });
        sim.run().expect("simulation runs");
        seen.load(Ordering::SeqCst)
    }

    #[test]
    fn offset_and_drift_add_to_real_time() {
        let ten_s = Duration::from_secs(10);
        let fast = read_after(
            SkewedClock {
                offset_ms: 250,
                drift_ppm: 30_000,
            },
            ten_s,
        );
        let slow = read_after(
            SkewedClock {
                offset_ms: 0,
                drift_ppm: -30_000,
            },
            ten_s,
        );
        // 10 s at ±3 %: 300 ms gained or lost, on top of the offset.
        assert!(
            (SIM_EPOCH_MS + 10_550..=SIM_EPOCH_MS + 10_551).contains(&fast),
            "{fast}"
        );
        assert!(
            (SIM_EPOCH_MS + 9_700..=SIM_EPOCH_MS + 9_701).contains(&slow),
            "{slow}"
        );
    }
}
