//! Policies: key prefix → limit, window length, kind, outage policy and
//! shadow mode.
//! Replicated through the coordinator log; the longest matching prefix wins.

use serde::{Deserialize, Serialize};

/// Largest limit accepted per window (keeps all u64 sums and u128 products exact).
pub const MAX_LIMIT: u64 = 1 << 48;
/// Longest window accepted: 366 days (a year of Envoy's `year` unit, 365
/// days, fits; so would a leap year).
pub const MAX_WINDOW_MS: u64 = 366 * 24 * 3600 * 1000;

/// How a key's budget is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum PolicyKind {
    /// First-come leasing from the window's counter.
    #[default]
    Counter,
    /// Region fair pool across regions plus tenant weighted-fair escrow inside each.
    Fair,
}

/// What an escrow node does for this policy while the coordinator is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum OutagePolicy {
    /// Serve what is already held, then deny with a retry hint (Δ = 0 holds).
    #[default]
    FailClosed,
    /// Admit up to `tokens_per_region` per window per region while the
    /// coordinator is unreachable. Δ is then bounded by the sum of those
    /// shares over the regions in outage: the one mode that trades Δ for availability.
    Fallback {
        /// Static share of L each region may admit per window during an outage.
        tokens_per_region: u64,
    },
}

/// One policy row.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Policy {
    /// Key prefix this policy applies to (may be empty: matches every key).
    pub prefix: String,
    /// L: tokens per window, 1..=[`MAX_LIMIT`].
    pub limit: u64,
    /// Window length in milliseconds, 1..=[`MAX_WINDOW_MS`].
    pub window_ms: u64,
    /// Counter or fair.
    pub kind: PolicyKind,
    /// Outage behaviour of escrow nodes.
    pub outage: OutagePolicy,
    /// Shadow mode: decisions are computed and counted as would-deny but
    /// never enforced (see [`crate::shadow`]); Δ = 0 does not hold for it.
    pub shadow: bool,
}

/// Why a policy was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// Limit out of range.
    #[error("limit must be between 1 and {MAX_LIMIT}, got {0}")]
    Limit(u64),
    /// Window out of range.
    #[error("window_ms must be between 1 and {MAX_WINDOW_MS}, got {0}")]
    Window(u64),
    /// Prefix longer than a key may be.
    #[error("prefix is {0} bytes, longer than the maximum key length of 256")]
    PrefixTooLong(usize),
    /// Fallback share larger than the limit.
    #[error("fallback tokens_per_region ({share}) must not exceed the limit ({limit})")]
    FallbackShare {
        /// The configured share.
        share: u64,
        /// The limit.
        limit: u64,
    },
}

impl Policy {
    /// A counter policy: keys starting with `prefix` lease first come, first
    /// served from `limit` tokens per window of `window_ms`; escrow nodes
    /// fail closed during an outage; enforced (not shadow). Not validated:
    /// see [`Policy::validate`].
    pub fn counter(prefix: impl Into<String>, limit: u64, window_ms: u64) -> Self {
        Self::of_kind(PolicyKind::Counter, prefix, limit, window_ms)
    }

    /// A fair policy: as [`Policy::counter`], but the window is shared by
    /// the region fair pool and weighted-fair escrow inside each region.
    pub fn fair(prefix: impl Into<String>, limit: u64, window_ms: u64) -> Self {
        Self::of_kind(PolicyKind::Fair, prefix, limit, window_ms)
    }

    /// A policy of `kind`, otherwise as [`Policy::counter`].
    pub fn of_kind(
        kind: PolicyKind,
        prefix: impl Into<String>,
        limit: u64,
        window_ms: u64,
    ) -> Self {
        Policy {
            prefix: prefix.into(),
            limit,
            window_ms,
            kind,
            outage: OutagePolicy::FailClosed,
            shadow: false,
        }
    }

    /// This policy with `outage` as its outage behaviour.
    #[must_use]
    pub fn with_outage(self, outage: OutagePolicy) -> Self {
        Policy { outage, ..self }
    }

    /// This policy in shadow mode (`true`) or enforced (`false`).
    #[must_use]
    pub fn with_shadow(self, shadow: bool) -> Self {
        Policy { shadow, ..self }
    }

    /// Checks every field; a policy that passes can be applied without overflow.
    pub fn validate(&self) -> Result<(), PolicyError> {
        if self.limit == 0 || self.limit > MAX_LIMIT {
            return Err(PolicyError::Limit(self.limit));
        }
        if self.window_ms == 0 || self.window_ms > MAX_WINDOW_MS {
            return Err(PolicyError::Window(self.window_ms));
        }
        if self.prefix.len() > crate::ids::MAX_KEY_BYTES {
            return Err(PolicyError::PrefixTooLong(self.prefix.len()));
        }
        if let OutagePolicy::Fallback { tokens_per_region } = self.outage {
            if tokens_per_region > self.limit {
                return Err(PolicyError::FallbackShare {
                    share: tokens_per_region,
                    limit: self.limit,
                });
            }
        }
        Ok(())
    }
}

/// The replicated policy table: prefix → policy, longest-prefix match.
///
/// Law: `lookup(key)` returns the policy whose `prefix` is the longest prefix
/// of `key` among all stored prefixes (the empty prefix matches every key),
/// or `None` when no stored prefix is a prefix of `key`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyTable {
    by_prefix: std::collections::BTreeMap<String, Policy>,
}

impl PolicyTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Validates `policy` and inserts it, replacing any policy with the same
    /// prefix. Returns the replaced policy, if any. On error nothing changes.
    pub fn set(&mut self, policy: Policy) -> Result<Option<Policy>, PolicyError> {
        policy.validate()?;
        Ok(self.by_prefix.insert(policy.prefix.clone(), policy))
    }

    /// A table of policies read back from storage, where each was validated
    /// when it was set (an upgrade from an older format); a later prefix
    /// replaces an earlier one.
    pub(crate) fn from_stored(policies: impl IntoIterator<Item = Policy>) -> Self {
        PolicyTable {
            by_prefix: policies
                .into_iter()
                .map(|policy| (policy.prefix.clone(), policy))
                .collect(),
        }
    }

    /// Removes the policy with exactly this prefix; returns it if it existed.
    pub fn remove(&mut self, prefix: &str) -> Option<Policy> {
        self.by_prefix.remove(prefix)
    }

    /// The policy governing `key`: the longest stored prefix of `key`.
    /// Costs O(len(key) · log n) map probes, one per character boundary.
    pub fn lookup(&self, key: &str) -> Option<&Policy> {
        (0..=key.len())
            .rev()
            .filter(|&end| key.is_char_boundary(end))
            .find_map(|end| self.by_prefix.get(&key[..end]))
    }

    /// All policies, sorted by prefix.
    pub fn iter(&self) -> impl Iterator<Item = &Policy> {
        self.by_prefix.values()
    }

    /// Number of policies.
    pub fn len(&self) -> usize {
        self.by_prefix.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.by_prefix.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(prefix: &str, limit: u64) -> Policy {
        Policy::counter(prefix, limit, 1000)
    }

    #[test]
    fn constructors_set_what_they_name_and_default_the_rest() {
        let counter = Policy::counter("api/", 10, 1000);
        assert_eq!(
            counter,
            Policy {
                prefix: "api/".to_string(),
                limit: 10,
                window_ms: 1000,
                kind: PolicyKind::Counter,
                outage: OutagePolicy::FailClosed,
                shadow: false,
            }
        );
        assert_eq!(
            Policy::fair("api/", 10, 1000),
            Policy {
                kind: PolicyKind::Fair,
                ..counter.clone()
            }
        );
        assert_eq!(
            Policy::of_kind(PolicyKind::Fair, "api/", 10, 1000),
            Policy::fair("api/", 10, 1000)
        );
        let fallback = OutagePolicy::Fallback {
            tokens_per_region: 3,
        };
        let tuned = counter.clone().with_outage(fallback).with_shadow(true);
        assert_eq!((tuned.outage, tuned.shadow), (fallback, true));
        assert_eq!(tuned.validate(), Ok(()));
        assert_eq!(
            Policy::counter("", 0, 1000).validate(),
            Err(PolicyError::Limit(0))
        );
    }

    #[test]
    fn invalid_policy_is_refused_and_table_unchanged() {
        let mut table = PolicyTable::new();
        assert!(table.set(policy("a", 0)).is_err());
        assert!(table.is_empty());
    }

    #[test]
    fn empty_prefix_matches_everything_but_longer_prefix_wins() {
        let mut table = PolicyTable::new();
        table.set(policy("", 1)).unwrap();
        table.set(policy("api/", 2)).unwrap();
        table.set(policy("api/users", 3)).unwrap();
        assert_eq!(table.lookup("other").map(|p| p.limit), Some(1));
        assert_eq!(table.lookup("api/x").map(|p| p.limit), Some(2));
        assert_eq!(table.lookup("api/users/7").map(|p| p.limit), Some(3));
        assert_eq!(table.remove("").map(|p| p.limit), Some(1));
        assert_eq!(table.lookup("other"), None);
    }

    #[test]
    fn multibyte_keys_do_not_panic() {
        let mut table = PolicyTable::new();
        table.set(policy("é", 5)).unwrap();
        assert_eq!(table.lookup("éa").map(|p| p.limit), Some(5));
        assert_eq!(table.lookup("aé"), None);
    }

    proptest! {
        /// lookup agrees with a brute-force scan for the longest matching prefix.
        #[test]
        fn lookup_is_longest_matching_prefix(
            prefixes in proptest::collection::vec("[ab]{0,3}", 0..6),
            key in "[ab]{1,5}",
        ) {
            let mut table = PolicyTable::new();
            for (i, p) in prefixes.iter().enumerate() {
                table.set(policy(p, i as u64 + 1)).unwrap();
            }
            let expected = table
                .iter()
                .filter(|p| key.starts_with(p.prefix.as_str()))
                .max_by_key(|p| p.prefix.len())
                .cloned();
            prop_assert_eq!(table.lookup(&key).cloned(), expected);
        }
    }
}
