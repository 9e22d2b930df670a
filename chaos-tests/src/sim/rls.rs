//! Envoy in the simulation: the `rls_*` scenarios' escrow nodes serve
//! Envoy's rate limit service with one rule, and their clients call it as
//! Envoy's rate limit filter does — one `ShouldRateLimit` per request, one
//! hit, for the descriptor `(tenant, acme)` — recording every `OK` as an
//! admission of the rule's key in the window the answer's reset names. The
//! Δ oracle then sums the fleet's `OK` answers per window.

use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use leasehold_client::transport::Dialer;
use leasehold_core::rls::answer::admitted_window_start;
use leasehold_core::rls::{DescriptorRule, DomainConfig, Quota, RateLimit, Unit, ValueMatch};
use leasehold_node::escrow::rls::RlsConfig;
use rand::Rng;

use super::{sim_now_ms, SimDialer};
use crate::history::{Admission, Recorder};

/// The domain the clients ask for.
pub const DOMAIN: &str = "chaos";
/// The descriptor entry's key.
pub const ENTRY_KEY: &str = "tenant";
/// The descriptor entry's value.
pub const ENTRY_VALUE: &str = "acme";
/// The Leasehold key the rule charges the descriptor to
/// (`leasehold_core::rls::budget_key` of the rule's prefix; pinned by a test).
pub const RLS_KEY: &str = "rls:chaos/tenant/|acme";

/// The unit whose window is `window_ms`, if one is.
pub fn unit_of(window_ms: u64) -> Option<Unit> {
    Unit::ALL.into_iter().find(|u| u.window_ms() == window_ms)
}

/// The domain: `tenant` (each value its own budget) at `limit` per `unit`.
pub fn domain(limit: u64, unit: Unit) -> DomainConfig {
    DomainConfig {
        domain: DOMAIN.into(),
        descriptors: vec![DescriptorRule {
            key: ENTRY_KEY.into(),
            value: ValueMatch::Any,
            rate_limit: Some(RateLimit {
                name: None,
                replaces: Vec::new(),
                quota: Quota::PerUnit {
                    requests_per_unit: u32::try_from(limit).unwrap_or(u32::MAX),
                    unit,
                },
            }),
            shadow_mode: false,
            detailed_metric: false,
            descriptors: Vec::new(),
        }],
    }
}

/// What an escrow node of an `rls` fleet serves.
pub fn node_config(limit: u64, window_ms: u64) -> anyhow::Result<RlsConfig> {
    let unit = unit_of(window_ms).ok_or_else(|| {
        anyhow::anyhow!("an rls fleet's window must be a unit's, not {window_ms} ms")
    })?;
    Ok(RlsConfig {
        files: Vec::new(),
        domains: vec![domain(limit, unit)],
        response_headers: false,
        reload_interval_ms: 0,
    })
}

/// One client: asks escrow node `addr` until `load_end_ms`, recording each
/// `OK`; after an `OVER_LIMIT` or a failure it waits a little, as a caller
/// turned away would.
pub async fn ask_until(
    index: usize,
    addr: String,
    window_ms: u64,
    load_end_ms: u64,
    recorder: Recorder,
    mut rng: rand::rngs::StdRng,
) -> anyhow::Result<()> {
    let request = RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: ENTRY_KEY.into(),
                value: ENTRY_VALUE.into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    let mut client = None;
    while sim_now_ms() < load_end_ms {
        if client.is_none() {
            match SimDialer.dial(&addr).await {
                Ok(channel) => client = Some(RateLimitServiceClient::new(channel)),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            }
        }
        let Some(rls) = client.as_mut() else {
            continue;
        };
        let asked = tokio::time::timeout(
            Duration::from_secs(3),
            rls.should_rate_limit(request.clone()),
        )
        .await;
        let answer = match asked {
            Ok(Ok(answer)) => answer.into_inner(),
            Ok(Err(_)) | Err(_) => {
                client = None;
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if answer.overall_code == Code::Ok as i32 {
            let at_ms = sim_now_ms();
            let reset_ms = answer
                .statuses
                .first()
                .and_then(|s| s.duration_until_reset)
                .map_or(0, |d| {
                    u64::try_from(d.seconds).unwrap_or(0) * 1_000
                        + u64::try_from(d.nanos).unwrap_or(0) / 1_000_000
                });
            recorder.admit(Admission {
                client: index,
                key: RLS_KEY,
                cost: 1,
                window_start_ms: admitted_window_start(at_ms, reset_ms, window_ms),
                at_ms,
            });
            tokio::time::sleep(Duration::from_millis(rng.gen_range(2..8))).await;
        } else {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(5..30))).await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recorded_key_is_the_rules_budget_key() {
        let config = domain(10, Unit::Second);
        let entries = [(ENTRY_KEY, ENTRY_VALUE)];
        let matched = config.match_descriptor(&entries).expect("the rule matches");
        let prefix = leasehold_core::rls::rule_prefix(DOMAIN, &matched.path);
        assert_eq!(leasehold_core::rls::budget_key(&prefix, &entries), RLS_KEY);
        assert_eq!(config.policies()[0].prefix, prefix);
    }

    #[test]
    fn only_unit_windows_serve_rls() {
        assert!(unit_of(1_000).is_some() && unit_of(10_000).is_none());
    }
}
