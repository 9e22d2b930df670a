//! Online lease sizing: the economic order quantity (EOQ) learned per key.
//!
//! Every lease costs one coordinator round trip (`order_cost`, c); every
//! credit leased but not spent before its window ends is stranded
//! (`strand_penalty` per credit, h). With a per-window demand D, the cost of
//! leasing in batches of b is `c·D/b + h·b/2`, minimised at the EOQ
//! `b* = sqrt(2·c·D/h)`. D is unknown and drifts, so [`EoqSizer`] learns b
//! online with AdaGrad in log space: after each window it takes one step
//! against the gradient of that window's cost at its current size.
//!
//! Window coupling makes the admission bound independent of the lease size:
//! sizing trades round trips against stranded credits and never touches
//! safety. This learner is per node and never replicated, so it may use
//! floating point; its output is an integer in `[min_size, max_size]`.

/// Why a sizer configuration was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SizerError {
    /// A cost parameter was not a finite positive number.
    #[error("{0} must be a finite number greater than 0")]
    NotPositive(&'static str),
    /// The size bounds are empty or start below 1.
    #[error("sizes must satisfy 1 <= min_size <= max_size, got {min_size}..={max_size}")]
    Bounds {
        /// The lower bound.
        min_size: u64,
        /// The upper bound.
        max_size: u64,
    },
}

/// Parameters of an [`EoqSizer`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EoqParams {
    /// Cost of one lease (one coordinator round trip), c > 0.
    pub order_cost: f64,
    /// Cost of one stranded credit, h > 0.
    pub strand_penalty: f64,
    /// Smallest size ever recommended (≥ 1).
    pub min_size: u64,
    /// Largest size ever recommended (≥ `min_size`).
    pub max_size: u64,
    /// Where learning starts (clamped into the bounds).
    pub initial_size: u64,
    /// Most the size may change in one observation, as a factor (≥ 1; 2.0
    /// = at most double or halve). AdaGrad's first step spans the whole log
    /// range; bounding it keeps one noisy window from leasing a huge batch.
    pub max_step_factor: f64,
}

impl Default for EoqParams {
    fn default() -> Self {
        EoqParams {
            order_cost: 20.0,
            strand_penalty: 1.0,
            min_size: 1,
            max_size: 1_000_000,
            initial_size: 16,
            max_step_factor: 2.0,
        }
    }
}

const EPSILON: f64 = 1e-8;

/// The online EOQ learner (AdaGrad in log space).
#[derive(Debug, Clone, PartialEq)]
pub struct EoqSizer {
    params: EoqParams,
    log_size: f64,
    sum_sq_grad: f64,
    step_scale: f64,
}

impl EoqSizer {
    /// Validates the parameters and starts at `initial_size`.
    pub fn new(params: EoqParams) -> Result<Self, SizerError> {
        for (name, v) in [
            ("order_cost", params.order_cost),
            ("strand_penalty", params.strand_penalty),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(SizerError::NotPositive(name));
            }
        }
        if !(params.max_step_factor.is_finite() && params.max_step_factor >= 1.0) {
            return Err(SizerError::NotPositive("max_step_factor - 1"));
        }
        if params.min_size == 0 || params.min_size > params.max_size {
            return Err(SizerError::Bounds {
                min_size: params.min_size,
                max_size: params.max_size,
            });
        }
        let (lo, hi) = ((params.min_size as f64).ln(), (params.max_size as f64).ln());
        let start = params.initial_size.clamp(params.min_size, params.max_size) as f64;
        Ok(EoqSizer {
            params,
            log_size: start.ln(),
            sum_sq_grad: 0.0,
            step_scale: (hi - lo).max(1e-6),
        })
    }

    /// The recommended lease size now: an integer in `[min_size, max_size]`.
    pub fn size(&self) -> u64 {
        let size = self.log_size.exp().round();
        // `as` saturates for out-of-range floats; the clamp restores the bounds.
        (size as u64).clamp(self.params.min_size, self.params.max_size)
    }

    /// Learns from one closed window in which `demand` tokens were served.
    pub fn observe(&mut self, demand: u64) {
        let b = self.log_size.exp();
        let d = demand as f64;
        let grad = -(self.params.order_cost * d) / b + (self.params.strand_penalty / 2.0) * b;
        if !grad.is_finite() {
            return;
        }
        self.sum_sq_grad += grad * grad;
        let step = self.step_scale / (EPSILON + self.sum_sq_grad).sqrt();
        let (lo, hi) = (
            (self.params.min_size as f64).ln(),
            (self.params.max_size as f64).ln(),
        );
        let max_move = self.params.max_step_factor.ln();
        let delta = (step * grad).clamp(-max_move, max_move);
        self.log_size = (self.log_size - delta).clamp(lo, hi);
    }

    /// The largest size it ever recommends.
    pub fn max_size(&self) -> u64 {
        self.params.max_size
    }

    /// The EOQ for a known demand: `sqrt(2·c·D/h)`.
    pub fn optimum(&self, demand: u64) -> f64 {
        (2.0 * self.params.order_cost * demand as f64 / self.params.strand_penalty).sqrt()
    }
}
