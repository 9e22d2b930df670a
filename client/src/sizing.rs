//! Lease sizing: how many tokens one refill asks for.
//!
//! Window coupling makes the admission bound independent of the lease size,
//! so sizing trades only round trips against stranded credits (seed 003):
//! a size cannot loosen the bound, only change efficiency. A refill always
//! asks for at least the cost of the check that needs it.
//!
//! [`LeaseSizing::Fixed`] asks for a constant batch. [`LeaseSizing::Adaptive`]
//! runs one [`LeaseSizer`] per key, fed with the tokens served in each
//! window once the window closes (the first grant of a newer window closes
//! it).

use std::sync::Arc;

use leasehold_core::predictive_sizer::{PredictiveParams, PredictiveSizer, SizerKind};
use leasehold_core::sizer::{EoqParams, EoqSizer};

use crate::error::ConfigError;

/// A per-key learner of lease sizes.
pub trait LeaseSizer: Send + std::fmt::Debug {
    /// The size to ask for now; values below 1 are treated as 1.
    fn size(&self) -> u64;
    /// Feeds the tokens served from one window that just closed.
    fn observe_window_demand(&mut self, served: u64);
    /// A forecast of the key's next window: the one after the window
    /// being served (`serving`), else the one starting now. Whether this
    /// sizer uses forecasts (the default: no, it is ignored).
    fn forecast(&mut self, _demand: u64, _serving: bool) -> bool {
        false
    }
}

impl LeaseSizer for EoqSizer {
    fn size(&self) -> u64 {
        EoqSizer::size(self)
    }
    fn observe_window_demand(&mut self, served: u64) {
        self.observe(served);
    }
}

impl LeaseSizer for PredictiveSizer {
    fn size(&self) -> u64 {
        PredictiveSizer::size(self)
    }
    fn observe_window_demand(&mut self, served: u64) {
        self.observe(served);
    }
    fn forecast(&mut self, demand: u64, serving: bool) -> bool {
        PredictiveSizer::forecast(self, demand, serving);
        true
    }
}

/// Builds a fresh [`LeaseSizer`] for each key.
#[derive(Clone)]
pub struct SizerFactory(Arc<dyn Fn() -> Box<dyn LeaseSizer> + Send + Sync>);

impl SizerFactory {
    /// A factory calling `make` once per key.
    pub fn new(make: impl Fn() -> Box<dyn LeaseSizer> + Send + Sync + 'static) -> Self {
        SizerFactory(Arc::new(make))
    }
}

impl std::fmt::Debug for SizerFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SizerFactory")
    }
}

impl PartialEq for SizerFactory {
    /// Two factories are equal when they are the same factory.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How a leased limiter sizes its refills.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseSizing {
    /// Always ask for this many tokens (at least the check's cost).
    Fixed(u64),
    /// Ask what a per-key learner says (for example an EOQ sizer).
    Adaptive(SizerFactory),
}

impl LeaseSizing {
    /// Per-key online EOQ sizing (see `leasehold_core::sizer`): each key
    /// learns its own batch from the demand served in each closed window.
    pub fn eoq(params: EoqParams) -> Result<Self, ConfigError> {
        EoqSizer::new(params).map_err(|e| ConfigError(format!("EOQ sizer: {e}")))?;
        Ok(LeaseSizing::Adaptive(SizerFactory::new(
            move || match EoqSizer::new(params) {
                Ok(sizer) => Box::new(sizer) as Box<dyn LeaseSizer>,
                // Unreachable: the parameters were validated above.
                Err(_) => Box::new(FixedSizer(params.initial_size.max(1))),
            },
        )))
    }

    /// Per-key predictive sizing (see `leasehold_core::predictive_sizer`):
    /// Hedge over "lease the EOQ of the predicted demand" (the last
    /// window's demand stands in for a prediction) and the EOQ learner.
    pub fn predictive(eoq: EoqParams, hedge: PredictiveParams) -> Result<Self, ConfigError> {
        PredictiveSizer::new(eoq, hedge)
            .map_err(|e| ConfigError(format!("predictive sizer: {e}")))?;
        Ok(LeaseSizing::Adaptive(SizerFactory::new(move || {
            match PredictiveSizer::new(eoq, hedge) {
                Ok(sizer) => Box::new(sizer) as Box<dyn LeaseSizer>,
                // Unreachable: the parameters were validated above.
                Err(_) => Box::new(FixedSizer(eoq.initial_size.max(1))),
            }
        })))
    }

    /// The sizing a `--sizer fixed|eoq|predictive` option selects: `batch`
    /// for fixed, `eoq` parameters for the learners.
    pub fn from_kind(kind: SizerKind, batch: u64, eoq: EoqParams) -> Result<Self, ConfigError> {
        match kind {
            SizerKind::Fixed => Ok(LeaseSizing::Fixed(batch)),
            SizerKind::Eoq => Self::eoq(eoq),
            SizerKind::Predictive => Self::predictive(eoq, PredictiveParams::default()),
        }
    }

    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            LeaseSizing::Fixed(0) => {
                Err(ConfigError("a fixed lease size must be at least 1".into()))
            }
            LeaseSizing::Fixed(_) | LeaseSizing::Adaptive(_) => Ok(()),
        }
    }

    /// A fresh per-key sizer following this rule.
    pub(crate) fn sizer(&self) -> KeySizer {
        match self {
            LeaseSizing::Fixed(n) => KeySizer::Fixed((*n).max(1)),
            LeaseSizing::Adaptive(factory) => KeySizer::Adaptive((factory.0)()),
        }
    }
}

/// The per-key state of a sizing rule.
#[derive(Debug)]
pub(crate) enum KeySizer {
    Fixed(u64),
    Adaptive(Box<dyn LeaseSizer>),
}

impl KeySizer {
    /// The lease size to ask for now, ≥ 1.
    pub(crate) fn size(&self) -> u64 {
        match self {
            KeySizer::Fixed(n) => *n,
            KeySizer::Adaptive(sizer) => sizer.size().max(1),
        }
    }

    /// A forecast of the key's next window ([`LeaseSizer::forecast`]);
    /// whether the sizer uses it.
    pub(crate) fn forecast(&mut self, demand: u64, serving: bool) -> bool {
        match self {
            KeySizer::Fixed(_) => false,
            KeySizer::Adaptive(sizer) => sizer.forecast(demand, serving),
        }
    }

    /// Feeds the demand served in a window that just closed.
    pub(crate) fn observe_window_demand(&mut self, served: u64) {
        match self {
            KeySizer::Fixed(_) => {}
            KeySizer::Adaptive(sizer) => sizer.observe_window_demand(served),
        }
    }
}

/// A constant size, used only as the fallback of [`LeaseSizing::eoq`].
#[derive(Debug)]
struct FixedSizer(u64);

impl LeaseSizer for FixedSizer {
    fn size(&self) -> u64 {
        self.0
    }
    fn observe_window_demand(&mut self, _served: u64) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eoq_sizing_learns_per_key() {
        let sizing = LeaseSizing::eoq(EoqParams {
            initial_size: 4,
            ..EoqParams::default()
        })
        .unwrap();
        let (mut busy, quiet) = (sizing.sizer(), sizing.sizer());
        for _ in 0..500 {
            busy.observe_window_demand(10_000);
        }
        assert!(
            busy.size() > quiet.size(),
            "{} vs {}",
            busy.size(),
            quiet.size()
        );
        assert_eq!(quiet.size(), 4);
    }

    #[test]
    fn the_sizer_option_selects_fixed_eoq_or_predictive() {
        let eoq = EoqParams {
            initial_size: 4,
            ..EoqParams::default()
        };
        let fixed = LeaseSizing::from_kind("fixed".parse().unwrap(), 9, eoq).unwrap();
        assert_eq!(fixed, LeaseSizing::Fixed(9));
        for text in ["eoq", "predictive"] {
            let sizing = LeaseSizing::from_kind(text.parse().unwrap(), 9, eoq).unwrap();
            let (mut busy, quiet) = (sizing.sizer(), sizing.sizer());
            for _ in 0..200 {
                busy.observe_window_demand(10_000);
            }
            assert!(busy.size() > quiet.size(), "{text}");
        }
        let bad = EoqParams {
            strand_penalty: f64::NAN,
            ..eoq
        };
        assert!(LeaseSizing::from_kind(SizerKind::Predictive, 9, bad).is_err());
    }

    #[test]
    fn eoq_sizing_refuses_bad_parameters() {
        assert!(LeaseSizing::eoq(EoqParams {
            order_cost: -1.0,
            ..EoqParams::default()
        })
        .is_err());
    }
}
