//! The escrow node's Prometheus metrics (`--metrics-listen`): coordinator
//! reachability and outage state, what outages cost (denials, fallback
//! admissions), coordinator calls against tokens served, refusals, and the
//! fair throttle's and shadow mode's counts — the numbers `Escrow.Status`
//! answers, under stable names. No series per key or tenant. Names and
//! meanings are listed in docs/operations.md ("Metrics").

use leasehold_core::metrics::HistogramSnapshot;
use leasehold_proto::v1 as pb;

use super::key_shared::DenialReason;
use super::shared::EscrowShared;
use crate::metrics_http::{Exposition, MetricKind};

/// What the metrics show beyond `Escrow.Status`.
#[derive(Debug, Clone)]
pub struct Observations {
    /// Round trips of answered Lease and PoolGrant calls, µs.
    pub lease_round_trip: HistogramSnapshot,
    /// Denials by reason.
    pub denials: Vec<(DenialReason, u64)>,
    /// Lease calls sent (`LeaseBatch` or `Lease`).
    pub lease_calls: u64,
    /// Refills per lease call.
    pub lease_call_items: HistogramSnapshot,
    /// Envoy's rate limit service, when the node serves it.
    pub rls: Option<std::sync::Arc<super::rls_state::RlsState>>,
}

impl Observations {
    /// The node's observations now.
    pub fn of(shared: &EscrowShared) -> Self {
        Self {
            lease_round_trip: shared.keys.lease_round_trip.snapshot(),
            denials: shared.keys.denials(),
            lease_calls: shared
                .keys
                .leases
                .stats()
                .calls
                .load(std::sync::atomic::Ordering::Relaxed),
            lease_call_items: shared.keys.leases.stats().items_per_call.snapshot(),
            rls: shared.rls.clone(),
        }
    }
}

/// The metrics document of a node whose status is `status`.
pub fn render(status: &pb::EscrowStatusResponse, observed: &Observations) -> String {
    let mut doc = Exposition::new();
    doc.histogram(
        "leasehold_escrow_lease_round_trip_seconds",
        "Round trip of answered Lease and PoolGrant calls to the coordinator \
         (leader redirects and retries included).",
        &observed.lease_round_trip,
        1e-6,
    );
    doc.single(
        "leasehold_escrow_lease_calls_total",
        MetricKind::Counter,
        "Lease calls sent to the coordinator (a LeaseBatch carries the refills of many keys).",
        observed.lease_calls as f64,
    );
    doc.histogram(
        "leasehold_escrow_lease_call_items",
        "Refills per lease call (coalesced into LeaseBatch).",
        &observed.lease_call_items,
        1.0,
    );
    doc.family(
        "leasehold_escrow_denials_total",
        MetricKind::Counter,
        "Acquire and Check calls denied, by reason (WINDOW_EXHAUSTED, FAIR_THROTTLED, \
         COORDINATOR_UNREACHABLE).",
    );
    for (reason, count) in &observed.denials {
        doc.sample(
            "leasehold_escrow_denials_total",
            &[("reason", reason.as_str())],
            *count as f64,
        );
    }
    doc.family(
        "leasehold_escrow_info",
        MetricKind::Gauge,
        "Always 1; labelled with the node's region.",
    );
    doc.sample("leasehold_escrow_info", &[("region", &status.region)], 1.0);
    let reachable = f64::from(u8::from(status.coordinator_reachable));
    doc.single(
        "leasehold_escrow_coordinator_reachable",
        MetricKind::Gauge,
        "1 while the coordinator answers, 0 during an outage.",
        reachable,
    );
    doc.single(
        "leasehold_escrow_outage",
        MetricKind::Gauge,
        "1 while the node is in a coordinator outage (each key's outage policy applies).",
        1.0 - reachable,
    );
    doc.single(
        "leasehold_escrow_active_keys",
        MetricKind::Gauge,
        "Keys with a live actor.",
        status.active_keys as f64,
    );
    let counters: [(&str, &str, u64); 21] = [
        (
            "evicted_keys",
            "Key actors stopped after being idle.",
            status.evicted_keys,
        ),
        (
            "outage_denials",
            "Requests denied because the coordinator was unreachable.",
            status.outage_denials,
        ),
        (
            "fallback_admission_tokens",
            "Tokens admitted under a fallback outage policy.",
            status.fallback_admissions,
        ),
        (
            "coordinator_calls",
            "Calls to the coordinator (leases, pool grants, reconciles).",
            status.coordinator_calls,
        ),
        (
            "tokens_served",
            "Tokens handed to callers.",
            status.tokens_served,
        ),
        (
            "returns_capped",
            "Returns capped at what the holder acquired.",
            status.returns_capped,
        ),
        (
            "return_tokens_refused",
            "Tokens of Returns refused by the cap.",
            status.return_tokens_refused,
        ),
        (
            "acquire_replays",
            "Acquire retries answered from the stored answer.",
            status.acquire_replays,
        ),
        (
            "return_replays",
            "Return retries answered from the stored answer.",
            status.return_replays,
        ),
        (
            "refused_request_ids",
            "Requests refused for a reused or expired request id.",
            status.refused_request_ids,
        ),
        (
            "refused_holders_exhausted",
            "Requests refused because a key had too many holders.",
            status.refused_holders_exhausted,
        ),
        (
            "refused_identity_holders",
            "Requests refused because the caller's identity had too many holders of a key.",
            status.refused_identity_holders,
        ),
        (
            "refused_identity_keys",
            "New keys refused because the caller's identity had created too many keys.",
            status.refused_identity_keys,
        ),
        (
            "refused_unauthenticated",
            "Calls refused without a valid identity.",
            status.refused_unauthenticated,
        ),
        (
            "refused_permission_denied",
            "Calls refused for the caller's identity.",
            status.refused_permission_denied,
        ),
        (
            "fair_throttle_passes",
            "Requests the fair throttle let through.",
            status.fair_throttle_passes,
        ),
        (
            "fair_throttle_denials",
            "Requests the fair throttle refused.",
            status.fair_throttle_denials,
        ),
        (
            "fair_throttle_idle_admissions",
            "Throttled requests admitted from idle capacity.",
            status.fair_throttle_idle_admissions,
        ),
        (
            "shadow_would_deny_requests",
            "Decisions of shadow policies that would have refused.",
            status.shadow_would_deny_requests,
        ),
        (
            "shadow_would_deny_tokens",
            "Tokens shadow policies served that they would have refused.",
            status.shadow_would_deny_tokens,
        ),
        (
            "pool_tokens_released",
            "Tokens of fair keys handed back to the region fair pool (reclaim).",
            status.pool_tokens_released,
        ),
    ];
    for (name, help, value) in counters {
        doc.single(
            &format!("leasehold_escrow_{name}_total"),
            MetricKind::Counter,
            help,
            value as f64,
        );
    }
    for (name, value) in &status.counters {
        if crate::metrics_http::is_metric_name(name) {
            doc.single(
                &format!("leasehold_escrow_{name}_total"),
                MetricKind::Counter,
                &format!("Listener counter {}.", name.replace('_', " ")),
                *value as f64,
            );
        }
    }
    if let Some(rls) = &observed.rls {
        rls.metrics.render(&mut doc);
    }
    doc.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_shows_as_unreachable_and_outage() {
        let status = pb::EscrowStatusResponse {
            region: "eu".into(),
            coordinator_reachable: false,
            outage_denials: 7,
            coordinator_calls: 3,
            tokens_served: 1_000,
            ..Default::default()
        };
        let observed = Observations {
            lease_round_trip: leasehold_core::metrics::Histogram::latency().snapshot(),
            denials: vec![(DenialReason::CoordinatorUnreachable, 7)],
            lease_calls: 2,
            lease_call_items: leasehold_core::metrics::Histogram::latency().snapshot(),
            rls: None,
        };
        let text = render(&status, &observed);
        assert!(
            text.contains("leasehold_escrow_denials_total{reason=\"COORDINATOR_UNREACHABLE\"} 7\n"),
            "{text}"
        );
        assert!(text.contains("leasehold_escrow_lease_round_trip_seconds_count 0\n"));
        assert!(
            text.contains("leasehold_escrow_info{region=\"eu\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("leasehold_escrow_coordinator_reachable 0\n"));
        assert!(text.contains("leasehold_escrow_outage 1\n"));
        assert!(text.contains("leasehold_escrow_outage_denials_total 7\n"));
        assert!(text.contains("leasehold_escrow_coordinator_calls_total 3\n"));
        assert!(text.contains("leasehold_escrow_tokens_served_total 1000\n"));
    }
}
