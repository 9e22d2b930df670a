//! Lease sizing: how many tokens one refill asks for.
//!
//! Window coupling makes the admission bound independent of the lease size,
//! so sizing trades only round trips against stranded credits (seed 003).

use crate::error::ConfigError;

/// How a leased limiter sizes its refills.
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseSizing {
    /// Always ask for this many tokens (at least the check's cost).
    Fixed(u64),
}

impl LeaseSizing {
    /// Checks the parameters.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            LeaseSizing::Fixed(0) => {
                Err(ConfigError("a fixed lease size must be at least 1".into()))
            }
            LeaseSizing::Fixed(_) => Ok(()),
        }
    }

    /// A fresh per-key sizer following this rule.
    pub(crate) fn sizer(&self) -> KeySizer {
        match self {
            LeaseSizing::Fixed(n) => KeySizer::Fixed((*n).max(1)),
        }
    }
}

/// The per-key state of a sizing rule.
#[derive(Debug, Clone)]
pub(crate) enum KeySizer {
    Fixed(u64),
}

impl KeySizer {
    /// The lease size to ask for now, ≥ 1.
    pub(crate) fn size(&self) -> u64 {
        match self {
            KeySizer::Fixed(n) => *n,
        }
    }

    /// Feeds the demand served in a window that just closed.
    pub(crate) fn observe_window_demand(&mut self, _served: u64) {
        match self {
            KeySizer::Fixed(_) => {}
        }
    }
}
