//! Per-host wall clocks on simulated time, with an offset: the coordinator
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

/// A host clock `offset_ms` ahead of simulated real time.
#[derive(Debug, Clone, Copy)]
pub struct SkewedClock {
    /// How far ahead of real time this host's clock runs.
    pub offset_ms: u64,
}

impl WallClock for SkewedClock {
    fn now_ms(&self) -> u64 {
        sim_now_ms() + self.offset_ms
    }
}
