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
