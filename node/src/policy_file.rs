//! Policy files: the policy table as a TOML file, one `[[policy]]` table
//! per prefix, applied with `leasehold policy apply FILE` and checked with
//! `leasehold config check FILE`.
//!
//! ```toml
//! [[policy]]
//! prefix = "api/"          # required; "" matches every key
//! limit = 10000            # required, 1..=2^48 tokens per window
//! window_ms = 60000        # required, 1..=366 days
//! kind = "counter"         # counter | fair
//! outage = "fail-closed"   # fail-closed | fallback
//! fallback_tokens_per_region = 0   # with outage = "fallback"
//! shadow = false           # count would-deny, never deny
//! ```
//!
//! The same rules as `leasehold policy set` (and the coordinator) apply to
//! each entry; a prefix may appear once. [`PolicyFile::problems`] lists
//! every problem with its entry, field and what to do.

use std::path::Path;

use leasehold_core::policy::{
    OutagePolicy, Policy, PolicyError, PolicyKind, MAX_LIMIT, MAX_WINDOW_MS,
};
use leasehold_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::toml_file::{self, FieldPath, Problem, TomlFileError};

/// A policy file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyFile {
    /// The `[[policy]]` tables, in file order.
    pub policy: Vec<PolicyEntry>,
}

/// One `[[policy]]` table. Every field is optional in the syntax; `prefix`,
/// `limit` and `window_ms` are required by [`PolicyFile::problems`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PolicyEntry {
    /// Key prefix.
    pub prefix: Option<String>,
    /// Tokens per window.
    pub limit: Option<u64>,
    /// Window length, ms.
    pub window_ms: Option<u64>,
    /// `counter` (default) or `fair`.
    pub kind: Option<String>,
    /// `fail-closed` (default) or `fallback`.
    pub outage: Option<String>,
    /// With `outage = "fallback"`: tokens per region per window in an outage.
    pub fallback_tokens_per_region: Option<u64>,
    /// Shadow mode (never enforced; see `Policy.shadow` in the proto).
    pub shadow: Option<bool>,
}

impl PolicyFile {
    /// Reads and parses a file (syntax and unknown keys).
    pub fn load(path: &Path) -> Result<Self, TomlFileError> {
        toml_file::load(path)
    }

    /// Every problem, each with its entry, field and what to do.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        if self.policy.is_empty() {
            problems.push(Problem::error(
                FieldPath::top("policy"),
                "the file holds no [[policy]] table",
                "add one [[policy]] table per prefix (prefix, limit, window_ms)",
            ));
        }
        for (index, entry) in self.policy.iter().enumerate() {
            let field = |key: &str| FieldPath::in_entry("policy", index, key);
            match entry.to_policy() {
                Ok(_) => {}
                Err(entry_problems) => problems.extend(
                    entry_problems
                        .into_iter()
                        .map(|(key, problem, fix)| Problem::error(field(key), problem, fix)),
                ),
            }
            if let Some(prefix) = &entry.prefix {
                let first = self
                    .policy
                    .iter()
                    .position(|other| other.prefix.as_ref() == Some(prefix));
                if first.is_some_and(|first| first < index) {
                    problems.push(Problem::error(
                        field("prefix"),
                        format!("prefix {prefix:?} already has a policy in this file"),
                        "keep one [[policy]] per prefix (the later one would replace the earlier)",
                    ));
                }
            }
        }
        problems
    }

    /// The policies as the coordinator takes them; the problems if any.
    pub fn to_wire(&self) -> Result<Vec<pb::Policy>, Vec<Problem>> {
        let problems = self.problems();
        if !problems.is_empty() {
            return Err(problems);
        }
        Ok(self
            .policy
            .iter()
            .filter_map(|entry| entry.to_policy().ok())
            .map(|policy| pb::Policy::from(&policy))
            .collect())
    }
}

impl PolicyEntry {
    /// The core policy, or every `(field, problem, fix)` of this entry.
    pub fn to_policy(&self) -> Result<Policy, Vec<(&'static str, String, String)>> {
        let mut problems = Vec::new();
        let mut required = |key: &'static str, present: bool, example: &str| {
            if !present {
                problems.push((
                    key,
                    "is required".to_string(),
                    format!("set {key} = {example}"),
                ));
            }
        };
        required("prefix", self.prefix.is_some(), "\"api/\"");
        required("limit", self.limit.is_some(), "10000");
        required("window_ms", self.window_ms.is_some(), "60000");
        let kind = match self.kind.as_deref().unwrap_or("counter") {
            "counter" => PolicyKind::Counter,
            "fair" => PolicyKind::Fair,
            other => {
                problems.push((
                    "kind",
                    format!("unknown kind {other:?}"),
                    "use \"counter\" or \"fair\"".to_string(),
                ));
                PolicyKind::Counter
            }
        };
        let share = self.fallback_tokens_per_region.unwrap_or(0);
        let outage = match self.outage.as_deref().unwrap_or("fail-closed") {
            "fail-closed" => {
                if share > 0 {
                    problems.push((
                        "fallback_tokens_per_region",
                        "is only used with outage = \"fallback\"".to_string(),
                        "set outage = \"fallback\" or remove it".to_string(),
                    ));
                }
                OutagePolicy::FailClosed
            }
            "fallback" => OutagePolicy::Fallback {
                tokens_per_region: share,
            },
            other => {
                problems.push((
                    "outage",
                    format!("unknown outage mode {other:?}"),
                    "use \"fail-closed\" or \"fallback\"".to_string(),
                ));
                OutagePolicy::FailClosed
            }
        };
        let policy = Policy {
            prefix: self.prefix.clone().unwrap_or_default(),
            limit: self.limit.unwrap_or(1),
            window_ms: self.window_ms.unwrap_or(1),
            kind,
            outage,
            shadow: self.shadow.unwrap_or(false),
        };
        let mut range = |key: &'static str, value: Option<u64>, max: u64, fix: &str| {
            if let Some(value) = value.filter(|v| *v == 0 || *v > max) {
                problems.push((key, format!("{value} is out of range"), fix.to_string()));
            }
        };
        range("limit", self.limit, MAX_LIMIT, LIMIT_FIX);
        range("window_ms", self.window_ms, MAX_WINDOW_MS, WINDOW_FIX);
        if problems.is_empty() {
            if let Err(error) = policy.validate() {
                problems.push(policy_error_problem(&error));
            }
        }
        if problems.is_empty() {
            Ok(policy)
        } else {
            Err(problems)
        }
    }
}

const LIMIT_FIX: &str = "use 1 to 281474976710656 (2^48) tokens";
const WINDOW_FIX: &str = "use 1 ms to 366 days (31622400000 ms)";

/// A core policy refusal as `(field, problem, fix)`.
fn policy_error_problem(error: &PolicyError) -> (&'static str, String, String) {
    let (key, fix) = match error {
        PolicyError::Limit(_) => ("limit", LIMIT_FIX),
        PolicyError::Window(_) => ("window_ms", WINDOW_FIX),
        PolicyError::PrefixTooLong(_) => ("prefix", "shorten it to 256 bytes at most"),
        PolicyError::FallbackShare { .. } => (
            "fallback_tokens_per_region",
            "keep the fallback share at or below the limit",
        ),
    };
    (key, error.to_string(), fix.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_file_converts_to_wire_policies() {
        let file: PolicyFile = toml::from_str(
            "[[policy]]\nprefix = \"api/\"\nlimit = 100\nwindow_ms = 1000\nshadow = true\n\
             [[policy]]\nprefix = \"\"\nlimit = 5\nwindow_ms = 60000\nkind = \"fair\"\n\
             outage = \"fallback\"\nfallback_tokens_per_region = 2\n",
        )
        .unwrap();
        let policies = file.to_wire().unwrap();
        assert_eq!(policies.len(), 2);
        assert!(policies[0].shadow);
        assert_eq!(policies[1].fallback_tokens_per_region, 2);
    }

    #[test]
    fn every_bad_entry_is_reported_with_its_field() {
        let file: PolicyFile = toml::from_str(
            "[[policy]]\nprefix = \"a\"\nlimit = 0\nwindow_ms = 1000\n\
             [[policy]]\nprefix = \"a\"\nlimit = 281474976710657\nwindow_ms = 1000\n\
             [[policy]]\nlimit = 1\nwindow_ms = 0\nkind = \"round-robin\"\n",
        )
        .unwrap();
        let fields: Vec<String> = file
            .problems()
            .iter()
            .map(|p| p.field.to_string())
            .collect();
        assert_eq!(
            fields,
            [
                "policy[0].limit",
                "policy[1].limit",
                "policy[1].prefix",
                "policy[2].prefix",
                "policy[2].kind",
                "policy[2].window_ms",
            ]
        );
        assert!(file.to_wire().is_err());
        assert!(!PolicyFile::default().problems().is_empty());
    }
}
