//! Fair throttling (FAIR, stochastic fair BLUE) in front of escrow keys:
//! which keys are fronted ([`FairThrottleRule`], by key prefix), how a
//! rule is validated, and who the caller is.
//!
//! The gate itself is pure ([`leasehold_core::escrow::EscrowFairGate`]);
//! the key's actor owns one, draws its seeds and decisions from its random
//! source and feeds it what the escrow rules answered.
//!
//! **The caller** is the credit holder when the request names one: the
//! authenticated principal and the request id's client id. A request
//! without a request id (every `Check`, an `Acquire` without one) is the
//! principal and the tenant it names. On a plaintext listener every
//! principal is anonymous, so there callers are told apart by client id
//! (or tenant); anonymous requests with neither share one caller.

use leasehold_core::escrow::machine::ThrottleFront;
use leasehold_core::escrow::{EscrowFairGate, Holder};
use leasehold_core::fair_throttle::{murmur3::murmur3_x64_128, FairThrottleConfig};
use leasehold_core::ids::TenantId;
use leasehold_core::principal::Principal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::NodeError;

/// Default retry hint of a throttled request.
pub const DEFAULT_FAIR_RETRY_AFTER_MS: u64 = 100;

/// Keys under `prefix` are fronted by a fair throttle with these parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct FairThrottleRule {
    /// Key prefix (non-empty); the longest matching prefix wins.
    pub prefix: String,
    /// The throttle's parameters (validated at start).
    pub config: FairThrottleConfig,
    /// Idle capacity: a request the throttle refuses still reaches the
    /// escrow while the key holds more than this many unleased credits
    /// (`None`: never).
    pub idle_reserve: Option<u64>,
    /// Retry hint of a throttled request (≥ 1 ms).
    pub retry_after_ms: u64,
}

impl FairThrottleRule {
    /// A rule for `prefix` with the core defaults and no idle capacity.
    pub fn new(prefix: impl Into<String>) -> Self {
        FairThrottleRule {
            prefix: prefix.into(),
            config: FairThrottleConfig::default(),
            idle_reserve: None,
            retry_after_ms: DEFAULT_FAIR_RETRY_AFTER_MS,
        }
    }
}

/// Refuses an empty or repeated prefix, a zero retry hint and every
/// parameter the core refuses, naming the prefix.
pub fn validate_rules(rules: &[FairThrottleRule]) -> Result<(), NodeError> {
    let bad = |prefix: &str, why: String| {
        Err(NodeError::Invalid(format!(
            "escrow fair-throttle {prefix:?}: {why}"
        )))
    };
    for (i, rule) in rules.iter().enumerate() {
        if rule.prefix.is_empty() {
            return bad(&rule.prefix, "the key prefix must not be empty".into());
        }
        if rules[..i].iter().any(|r| r.prefix == rule.prefix) {
            return bad(&rule.prefix, "the key prefix is given twice".into());
        }
        if rule.retry_after_ms == 0 {
            return bad(&rule.prefix, "the retry hint must be at least 1 ms".into());
        }
        if let Err(e) = rule.config.validate() {
            return bad(&rule.prefix, e.to_string());
        }
    }
    Ok(())
}

/// The rule fronting `key` (longest matching prefix), if any.
pub fn rule_for<'a>(rules: &'a [FairThrottleRule], key: &str) -> Option<&'a FairThrottleRule> {
    rules
        .iter()
        .filter(|r| key.starts_with(r.prefix.as_str()))
        .max_by_key(|r| r.prefix.len())
}

/// The caller's id as the throttle hashes it (see the module doc):
/// principal, then `c` and the client id, or `t` and the tenant, separated
/// by NUL bytes (which neither contains).
pub fn caller_id(
    principal: &Principal,
    holder: Option<&Holder>,
    tenant: Option<&TenantId>,
) -> Vec<u8> {
    let mut id = principal.to_string().into_bytes();
    id.push(0);
    match holder {
        Some(holder) => {
            id.push(b'c');
            id.push(0);
            id.extend_from_slice(holder.client.as_str().as_bytes());
        }
        None => {
            id.push(b't');
            id.push(0);
            if let Some(tenant) = tenant {
                id.extend_from_slice(tenant.as_str().as_bytes());
            }
        }
    }
    id
}

/// One key's throttle and the random source its seeds and draws come from.
#[derive(Debug)]
pub struct KeyFairThrottle {
    /// The pure gate.
    pub gate: EscrowFairGate,
    /// Retry hint of a throttled request.
    pub retry_after_ms: u64,
    rng: StdRng,
}

impl KeyFairThrottle {
    /// The throttle of `key` under `rule`, starting at `now_ms`. The random
    /// source is the OS's, or derived from `rng_seed` and the key when one
    /// is set (simulations, so that a seed replays).
    pub fn new(
        rule: &FairThrottleRule,
        key: &str,
        rng_seed: Option<u64>,
        now_ms: u64,
    ) -> Result<Self, NodeError> {
        let mut rng = match rng_seed {
            Some(seed) => {
                let (h, _) = murmur3_x64_128(key.as_bytes(), seed as u32 ^ (seed >> 32) as u32);
                StdRng::seed_from_u64(seed ^ h)
            }
            None => StdRng::from_entropy(),
        };
        let gate =
            EscrowFairGate::new(rule.config, rule.idle_reserve, now_ms, rng.gen(), rng.gen())
                .map_err(|e| {
                    NodeError::Invalid(format!("escrow fair-throttle {:?}: {e}", rule.prefix))
                })?;
        Ok(KeyFairThrottle {
            gate,
            retry_after_ms: rule.retry_after_ms,
            rng,
        })
    }

    /// A fresh rotation seed and a uniform draw.
    pub fn draw(&mut self) -> (u32, u64) {
        (self.rng.gen(), self.rng.gen())
    }

    /// The throttle as the key's machine holds it: the gate and retry
    /// hint, drawing each decision's seed and draw from this random source.
    pub fn into_front(self) -> ThrottleFront {
        let KeyFairThrottle {
            gate,
            retry_after_ms,
            mut rng,
        } = self;
        ThrottleFront::new(
            gate,
            retry_after_ms,
            Box::new(move || (rng.gen(), rng.gen())),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::ids::ClientId;

    #[test]
    fn bad_rules_are_refused_with_the_prefix_named() {
        let cases: Vec<(Vec<FairThrottleRule>, &str)> = vec![
            (vec![FairThrottleRule::new("")], "must not be empty"),
            (
                vec![FairThrottleRule::new("a/"), FairThrottleRule::new("a/")],
                "given twice",
            ),
            (
                vec![FairThrottleRule {
                    retry_after_ms: 0,
                    ..FairThrottleRule::new("a/")
                }],
                "retry hint",
            ),
            (
                vec![FairThrottleRule {
                    config: FairThrottleConfig {
                        increment: f64::NAN,
                        ..FairThrottleConfig::default()
                    },
                    ..FairThrottleRule::new("a/")
                }],
                "increment",
            ),
        ];
        for (rules, why) in cases {
            let err = validate_rules(&rules).expect_err("refused").to_string();
            assert!(err.contains("fair-throttle") && err.contains(why), "{err}");
        }
        assert!(
            validate_rules(&[FairThrottleRule::new("a/"), FairThrottleRule::new("b/")]).is_ok()
        );
    }

    #[test]
    fn the_longest_prefix_fronts_a_key() {
        let rules = [FairThrottleRule::new("a/"), FairThrottleRule::new("a/b/")];
        assert_eq!(
            rule_for(&rules, "a/b/c").map(|r| r.prefix.as_str()),
            Some("a/b/")
        );
        assert_eq!(
            rule_for(&rules, "a/c").map(|r| r.prefix.as_str()),
            Some("a/")
        );
        assert!(rule_for(&rules, "b/").is_none());
    }

    #[test]
    fn callers_are_told_apart_by_client_id_and_by_tenant() {
        let holder = |c: &str| Holder {
            principal: Principal::Anonymous,
            client: ClientId::new(c).expect("valid"),
        };
        let tenant = TenantId::new("x").expect("valid");
        let a = caller_id(&Principal::Anonymous, Some(&holder("x")), None);
        let b = caller_id(&Principal::Anonymous, Some(&holder("y")), None);
        let t = caller_id(&Principal::Anonymous, None, Some(&tenant));
        assert_ne!(a, b);
        assert_ne!(a, t, "a client id and a tenant of the same name differ");
    }

    #[test]
    fn a_seeded_source_replays_per_key() {
        let rule = FairThrottleRule::new("a/");
        let mut one = KeyFairThrottle::new(&rule, "a/k", Some(7), 0).expect("valid");
        let mut two = KeyFairThrottle::new(&rule, "a/k", Some(7), 0).expect("valid");
        let mut other = KeyFairThrottle::new(&rule, "a/j", Some(7), 0).expect("valid");
        assert_eq!(one.draw(), two.draw());
        assert_ne!(one.draw(), other.draw());
    }
}
