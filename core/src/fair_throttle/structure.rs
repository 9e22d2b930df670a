//! One stochastic-fair-BLUE structure: `levels × buckets` cells of
//! (throttle probability, last update), a caller's cells picked by one
//! seeded Murmur3 hash of its id.
//!
//! Laws (property-tested in `fair_throttle::tests`):
//! - **Constant memory:** the cells are allocated once, at construction;
//!   no call ever grows or shrinks them, whatever the number of callers.
//! - **Bounded:** every cell's probability, and so every caller's, stays in `[0, 1]`.
//! - **Independent levels:** a level's index comes from its own 32 bits of
//!   the hash (one Murmur3 x64-128 call gives four levels' worth; more
//!   levels hash again with a derived seed), so two callers share all `L`
//!   cells with probability `(1/B)^L`, not the `~1/B²` of double hashing.
//! - **Decay:** a cell untouched for `Δt` seconds reads `p · e^(−λ·Δt)`, so
//!   a fully throttled caller's probability falls below any `ε > 0` in
//!   finite time without any outcome.
//! - **Monotone outcomes:** against the decayed value at the same instant,
//!   an exhaustion raises each of the caller's cells by exactly `Pi` and a
//!   success lowers it by exactly `Pd` (both clamped to `[0, 1]`).

use super::config::{FairThrottleConfig, FairThrottleError, LevelCombine, MAX_LEVELS};
use super::murmur3::murmur3_x64_128;

/// Bytes one cell takes.
pub const CELL_BYTES: usize = std::mem::size_of::<Cell>();

impl FairThrottleConfig {
    /// Bytes of cells one structure of this configuration holds (fixed at
    /// construction).
    pub fn structure_bytes(&self) -> u64 {
        self.cells() * CELL_BYTES as u64
    }
}

/// A caller's id as the throttle sees it (an API key, an IP, a tenant):
/// any non-empty byte string. Borrowed, so asking costs no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallerId<'a>(&'a [u8]);

impl<'a> CallerId<'a> {
    /// Refuses the empty id.
    pub fn new(bytes: &'a [u8]) -> Result<Self, FairThrottleError> {
        if bytes.is_empty() {
            Err(FairThrottleError::EmptyCallerId)
        } else {
            Ok(CallerId(bytes))
        }
    }

    /// The id's bytes.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.0
    }
}

/// What the protected resource answered for an admitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The resource served it: every cell of the caller loses `Pd`.
    Success,
    /// The resource was exhausted: every cell of the caller gains `Pi`.
    Exhausted,
}

/// The throttle's answer for one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FairVerdict {
    /// Whether the request may go on to the resource.
    pub admit: bool,
    /// The caller's throttle probability that decided it.
    pub probability: f64,
}

/// The cell index of a caller at each level (`levels` entries used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellIndices {
    indices: [u32; MAX_LEVELS as usize],
    levels: usize,
}

impl CellIndices {
    /// The bucket of each level, level 0 first.
    pub fn as_slice(&self) -> &[u32] {
        &self.indices[..self.levels]
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Cell {
    probability: f64,
    updated_ms: u64,
}

/// One structure (see the module doc).
#[derive(Debug, Clone)]
pub struct ThrottleStructure {
    config: FairThrottleConfig,
    seed: u32,
    cells: Box<[Cell]>,
}

/// A uniform draw in `[0, 1)` from the top 53 bits of `draw`.
pub fn unit_interval(draw: u64) -> f64 {
    (draw >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl ThrottleStructure {
    /// A structure with every cell at probability 0, hashing with `seed`.
    pub fn new(config: FairThrottleConfig, seed: u32) -> Result<Self, FairThrottleError> {
        config.validate()?;
        let cells = vec![Cell::default(); config.cells() as usize].into_boxed_slice();
        Ok(ThrottleStructure {
            config,
            seed,
            cells,
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &FairThrottleConfig {
        &self.config
    }

    /// The hash seed.
    pub fn seed(&self) -> u32 {
        self.seed
    }

    /// Bytes of cells held: `levels × buckets × 16`, fixed at construction.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.cells)
    }

    /// Forgets everything and hashes with `seed` from now on (the memory is reused).
    pub fn reset(&mut self, seed: u32) {
        self.seed = seed;
        self.cells.fill(Cell::default());
    }

    /// The caller's bucket at each level: level `i` takes 32-bit word `i mod 4`
    /// of the Murmur3 hash with seed `seed + ⌊i/4⌋·φ`, mapped onto `[0, B)` by
    /// multiply-shift.
    pub fn cell_indices(&self, caller: CallerId<'_>) -> CellIndices {
        let levels = self.config.levels as usize;
        let buckets = u64::from(self.config.buckets);
        let mut indices = [0u32; MAX_LEVELS as usize];
        let mut words = [0u32; 4];
        for (level, slot) in indices.iter_mut().take(levels).enumerate() {
            if level % 4 == 0 {
                let group = (level / 4) as u32;
                let seed = self.seed.wrapping_add(group.wrapping_mul(0x9e37_79b9));
                let (h1, h2) = murmur3_x64_128(caller.as_bytes(), seed);
                words = [h1 as u32, (h1 >> 32) as u32, h2 as u32, (h2 >> 32) as u32];
            }
            *slot = ((u64::from(words[level % 4]) * buckets) >> 32) as u32;
        }
        CellIndices { indices, levels }
    }

    fn cell_position(&self, level: usize, bucket: u32) -> usize {
        level * self.config.buckets as usize + bucket as usize
    }

    fn decayed(&self, cell: Cell, now_ms: u64) -> f64 {
        let elapsed_ms = now_ms.saturating_sub(cell.updated_ms);
        if elapsed_ms == 0 || cell.probability == 0.0 || self.config.decay_per_sec == 0.0 {
            return cell.probability;
        }
        let exponent = -self.config.decay_per_sec * (elapsed_ms as f64 / 1000.0);
        (cell.probability * exponent.exp()).clamp(0.0, 1.0)
    }

    /// Each level's probability for the caller at `now_ms` (decay applied).
    pub fn level_probabilities(&self, caller: CallerId<'_>, now_ms: u64) -> Vec<f64> {
        let indices = self.cell_indices(caller);
        indices
            .as_slice()
            .iter()
            .enumerate()
            .map(|(level, bucket)| {
                self.decayed(self.cells[self.cell_position(level, *bucket)], now_ms)
            })
            .collect()
    }

    /// The caller's throttle probability at `now_ms`: the min (or mean) of
    /// its levels' decayed probabilities; in `[0, 1]`.
    pub fn throttle_probability(&self, caller: CallerId<'_>, now_ms: u64) -> f64 {
        let indices = self.cell_indices(caller);
        let mut min = 1.0f64;
        let mut sum = 0.0f64;
        for (level, bucket) in indices.as_slice().iter().enumerate() {
            let p = self.decayed(self.cells[self.cell_position(level, *bucket)], now_ms);
            min = min.min(p);
            sum += p;
        }
        let p = match self.config.combine {
            LevelCombine::Min => min,
            LevelCombine::Mean => sum / indices.levels as f64,
        };
        p.clamp(0.0, 1.0)
    }

    /// Throttles iff `unit_interval(draw) < p`: probability 0 never
    /// throttles, probability 1 always does.
    pub fn decide(&self, caller: CallerId<'_>, now_ms: u64, draw: u64) -> FairVerdict {
        let probability = self.throttle_probability(caller, now_ms);
        FairVerdict {
            admit: unit_interval(draw) >= probability,
            probability,
        }
    }

    /// Applies an outcome to every cell of the caller: decay up to `now_ms`,
    /// then `−Pd` (success) or `+Pi` (exhaustion), clamped to `[0, 1]`.
    pub fn record(&mut self, caller: CallerId<'_>, outcome: Outcome, now_ms: u64) {
        let indices = self.cell_indices(caller);
        let step = match outcome {
            Outcome::Success => -self.config.decrement,
            Outcome::Exhausted => self.config.increment,
        };
        for (level, bucket) in indices.as_slice().iter().enumerate() {
            let position = self.cell_position(level, *bucket);
            let cell = self.cells[position];
            let probability = (self.decayed(cell, now_ms) + step).clamp(0.0, 1.0);
            self.cells[position] = Cell {
                probability,
                updated_ms: cell.updated_ms.max(now_ms),
            };
        }
    }
}
