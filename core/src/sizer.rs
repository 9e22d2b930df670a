//! How one key's lease size is chosen ([`LeaseSizer`]): a fixed batch, the
//! online EOQ learner ([`crate::eoq_sizer`]) or prediction-following and
//! EOQ experts under Hedge ([`crate::predictive_sizer`]), and the sizer a
//! [`SizerKind`] names. The EOQ types are re-exported here.

pub use crate::eoq_sizer::{EoqParams, EoqSizer, SizerError};
use crate::predictive_sizer::{PredictiveParams, PredictiveSizer, SizerKind};

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
    Predictive(PredictiveSizer),
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

impl SizerKind {
    /// A fresh sizer of this kind: `batch` for fixed, `eoq` for the
    /// learners (the predictive sizer with default Hedge parameters).
    pub fn build(self, batch: u64, eoq: EoqParams) -> Result<LeaseSizer, SizerError> {
        Ok(match self {
            SizerKind::Fixed => LeaseSizer::Fixed(batch),
            SizerKind::Eoq => LeaseSizer::Eoq(EoqSizer::new(eoq)?),
            SizerKind::Predictive => {
                LeaseSizer::Predictive(PredictiveSizer::new(eoq, PredictiveParams::default())?)
            }
        })
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
