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

/// How one key's lease size is chosen: a fixed batch, or learned online.
/// Either way the result is deterministic given the demands observed.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseSizer {
    /// Always lease this many tokens (a batch of 0 is treated as 1).
    Fixed(u64),
    /// The online EOQ learner.
    Eoq(EoqSizer),
    /// Prediction-following and EOQ experts under Hedge
    /// ([`crate::predictive_sizer`]).
    Predictive(crate::predictive_sizer::PredictiveSizer),
}

impl LeaseSizer {
    /// The lease size to ask for now (≥ 1).
    pub fn size(&self) -> u64 {
        match self {
            LeaseSizer::Fixed(batch) => (*batch).max(1),
            LeaseSizer::Eoq(sizer) => sizer.size(),
            LeaseSizer::Predictive(sizer) => sizer.size(),
        }
    }

    /// The least the first lease of a window should ask for when the window
    /// before it kept `last_window_demand` tokens: that demand, capped by
    /// the learner's largest size; 0 for a fixed size (its batch is the
    /// operator's choice).
    pub fn warm_start(&self, last_window_demand: u64) -> u64 {
        match self {
            LeaseSizer::Fixed(_) => 0,
            LeaseSizer::Eoq(sizer) => last_window_demand.min(sizer.max_size()),
            LeaseSizer::Predictive(sizer) => last_window_demand.min(sizer.max_size()),
        }
    }

    /// Hands it a forecast of a key's next window
    /// ([`PredictiveSizer::forecast`](crate::predictive_sizer::PredictiveSizer::forecast));
    /// whether it uses forecasts (only the predictive sizer does).
    pub fn forecast(&mut self, demand: u64, serving: bool) -> bool {
        match self {
            LeaseSizer::Predictive(sizer) => {
                sizer.forecast(demand, serving);
                true
            }
            LeaseSizer::Fixed(_) | LeaseSizer::Eoq(_) => false,
        }
    }

    /// Learns from one closed window in which `window_demand` tokens were
    /// served (a fixed size ignores it).
    pub fn observe(&mut self, window_demand: u64) {
        match self {
            LeaseSizer::Fixed(_) => {}
            LeaseSizer::Eoq(sizer) => sizer.observe(window_demand),
            LeaseSizer::Predictive(sizer) => sizer.observe(window_demand),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn converges_near_the_eoq_under_stationary_demand() {
        // c = 20, h = 1, D = 100: b* = sqrt(4000) ≈ 63.2.
        let mut sizer = EoqSizer::new(EoqParams {
            initial_size: 1,
            ..EoqParams::default()
        })
        .unwrap();
        for _ in 0..6400 {
            sizer.observe(100);
        }
        let optimum = sizer.optimum(100);
        let size = sizer.size() as f64;
        assert!(
            (size - optimum).abs() <= 0.3 * optimum,
            "size {size}, optimum {optimum}"
        );
    }

    #[test]
    fn shrinks_when_leases_get_cheaper() {
        let mut sizer = EoqSizer::new(EoqParams {
            initial_size: 500,
            ..EoqParams::default()
        })
        .unwrap();
        let before = sizer.size();
        for _ in 0..200 {
            sizer.observe(10);
        }
        assert!(
            sizer.size() < before / 2,
            "{} not below {}",
            sizer.size(),
            before / 2
        );
    }

    #[test]
    fn one_window_moves_the_size_at_most_by_the_step_factor() {
        let mut sizer = EoqSizer::new(EoqParams {
            initial_size: 16,
            ..EoqParams::default()
        })
        .unwrap();
        sizer.observe(1_000_000);
        assert!(sizer.size() <= 32, "{}", sizer.size());
        sizer.observe(0);
        assert!(sizer.size() >= 8, "{}", sizer.size());
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(EoqSizer::new(EoqParams {
            order_cost: 0.0,
            ..EoqParams::default()
        })
        .is_err());
        assert!(EoqSizer::new(EoqParams {
            strand_penalty: f64::NAN,
            ..EoqParams::default()
        })
        .is_err());
        assert!(EoqSizer::new(EoqParams {
            min_size: 0,
            ..EoqParams::default()
        })
        .is_err());
        assert!(EoqSizer::new(EoqParams {
            min_size: 10,
            max_size: 9,
            ..EoqParams::default()
        })
        .is_err());
    }

    #[test]
    fn a_fixed_size_ignores_demand() {
        let mut fixed = LeaseSizer::Fixed(16);
        fixed.observe(1_000_000);
        assert_eq!(fixed.size(), 16);
        assert_eq!(LeaseSizer::Fixed(0).size(), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn the_same_demands_give_the_same_sizes(demands in proptest::collection::vec(0u64..100_000, 0..64)) {
            let mut a = LeaseSizer::Eoq(EoqSizer::new(EoqParams::default()).unwrap());
            let mut b = a.clone();
            for d in demands {
                a.observe(d);
                b.observe(d);
                prop_assert_eq!(a.size(), b.size());
            }
        }

        #[test]
        fn size_stays_within_bounds(
            min in 1u64..100, span in 0u64..10_000, initial in 0u64..20_000,
            demands in proptest::collection::vec(0u64..u64::MAX / 4, 0..64),
        ) {
            let params = EoqParams { min_size: min, max_size: min + span, initial_size: initial, ..EoqParams::default() };
            let mut sizer = EoqSizer::new(params).unwrap();
            for d in demands {
                sizer.observe(d);
                let s = sizer.size();
                prop_assert!(s >= min && s <= min + span);
            }
        }
    }
}
