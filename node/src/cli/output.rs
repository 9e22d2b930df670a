//! Rendering command results as human text or JSON (`--output json`), and
//! the JSON shape of each wire message the CLI prints.

use leasehold_core::coordinator::{ReconcileDisposition, ReconcileOutcome};
use leasehold_proto::v1 as pb;
use serde_json::{json, Value};

/// How a command prints its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Human-readable lines.
    Text,
    /// One JSON document.
    Json,
}

/// Prints `json` or `text` according to `format`.
pub fn emit(format: OutputFormat, json: Value, text: impl FnOnce() -> String) {
    match format {
        OutputFormat::Json => println!("{json}"),
        OutputFormat::Text => println!("{}", text()),
    }
}

/// A policy's kind as the CLI spells it.
pub fn kind_name(kind: i32) -> &'static str {
    match pb::PolicyKind::try_from(kind) {
        Ok(pb::PolicyKind::Fair) => "fair",
        _ => "counter",
    }
}

/// A policy's outage mode as the CLI spells it.
pub fn outage_name(outage: i32) -> &'static str {
    match pb::OutageMode::try_from(outage) {
        Ok(pb::OutageMode::Fallback) => "fallback",
        _ => "fail-closed",
    }
}

/// A reconcile answer's disposition as the CLI spells it, read through the
/// wire conversion (`unspecified` for one the conversion refuses).
pub fn disposition_name(response: &pb::ReconcileResponse) -> &'static str {
    match ReconcileOutcome::try_from(response).map(|outcome| outcome.disposition) {
        Ok(ReconcileDisposition::Credited) => "credited",
        Ok(ReconcileDisposition::WindowEnded) => "window-ended",
        Ok(ReconcileDisposition::Duplicate) => "duplicate",
        Err(_) => "unspecified",
    }
}

/// JSON of a policy.
pub fn policy_json(policy: &pb::Policy) -> Value {
    json!({
        "prefix": policy.prefix,
        "limit": policy.limit,
        "window_ms": policy.window_ms,
        "kind": kind_name(policy.kind),
        "outage": outage_name(policy.outage),
        "fallback_tokens_per_region": policy.fallback_tokens_per_region,
        "shadow": policy.shadow,
    })
}

/// One line describing a policy.
pub fn policy_text(policy: &pb::Policy) -> String {
    let mut line = format!(
        "{:<24} limit {:>10} per {:>8} ms  {:<7}  {}",
        format!("{:?}", policy.prefix),
        policy.limit,
        policy.window_ms,
        kind_name(policy.kind),
        outage_name(policy.outage)
    );
    if policy.fallback_tokens_per_region > 0 {
        line.push_str(&format!(
            " ({} per region)",
            policy.fallback_tokens_per_region
        ));
    }
    if policy.shadow {
        line.push_str("  SHADOW (not enforced)");
    }
    line
}

/// JSON of a lease response.
pub fn lease_json(response: &pb::LeaseResponse) -> Value {
    json!({
        "granted": response.granted,
        "limit": response.limit,
        "window_start_ms": response.window_start_ms,
        "window_end_ms": response.window_end_ms,
        "coordinator_now_ms": response.coordinator_now_ms,
        "remaining_lifetime_ms": response.remaining_lifetime_ms,
    })
}

/// JSON of a window view.
pub fn window_json(window: &pb::GetWindowResponse) -> Value {
    json!({
        "key": window.key,
        "policy": window.policy.as_ref().map(policy_json),
        "limit": window.limit,
        "window_start_ms": window.window_start_ms,
        "window_end_ms": window.window_end_ms,
        "granted": window.granted,
        "returned": window.returned,
        "coordinator_now_ms": window.coordinator_now_ms,
        "would_deny_tokens": window.would_deny_tokens,
        "would_deny_requests": window.would_deny_requests,
        "regions": window.regions.iter().map(|r| json!({
            "region": r.region, "granted": r.granted, "returned": r.returned, "pool_weight": r.pool_weight,
        })).collect::<Vec<_>>(),
    })
}

/// JSON of a member's status.
pub fn status_json(status: &pb::StatusResponse) -> Value {
    let members = |list: &[pb::Member]| {
        list.iter()
            .map(|m| json!({"id": m.id, "addr": m.addr}))
            .collect::<Vec<_>>()
    };
    let counters: serde_json::Map<String, Value> = status
        .counters
        .iter()
        .map(|(name, value)| (name.clone(), json!(value)))
        .collect();
    json!({
        "node_id": status.node_id,
        "state": status.state,
        "initialized": status.initialized,
        "current_term": status.current_term,
        "current_leader": status.current_leader,
        "leader_addr": status.leader_addr,
        "last_log_index": status.last_log_index,
        "last_applied_index": status.last_applied_index,
        "snapshot_index": status.snapshot_index,
        "purged_index": status.purged_index,
        "voters": members(&status.voters),
        "learners": members(&status.learners),
        "retired_member_ids": status.retired_member_ids,
        "restored_at_ms": status.restored_at_ms,
        "state_machine_now_ms": status.state_machine_now_ms,
        "live_windows": status.live_windows,
        "policies": status.policies,
        "counters": counters,
        "shadow": status.shadow.iter().map(|t| json!({
            "prefix": t.prefix,
            "would_deny_tokens": t.would_deny_tokens,
            "would_deny_requests": t.would_deny_requests,
        })).collect::<Vec<_>>(),
        "shards": status.shards.iter().map(|s| json!({
            "id": s.id,
            "state": s.state,
            "current_leader": s.current_leader,
            "last_applied_index": s.last_applied_index,
            "live_windows": s.live_windows,
            "owned_slots": s.owned_slots,
        })).collect::<Vec<_>>(),
    })
}

/// A member's status as text.
pub fn status_text(status: &pb::StatusResponse) -> String {
    let members = |list: &[pb::Member]| {
        if list.is_empty() {
            "-".to_string()
        } else {
            list.iter()
                .map(|m| format!("{}={}", m.id, m.addr))
                .collect::<Vec<_>>()
                .join(" ")
        }
    };
    let leader = match status.current_leader {
        Some(id) => format!("{id} ({})", status.leader_addr),
        None => "unknown".to_string(),
    };
    let mut counters: Vec<_> = status.counters.iter().collect();
    counters.sort();
    let counters = counters
        .iter()
        .map(|(name, value)| format!("{name}={value}"))
        .collect::<Vec<_>>()
        .join(" ");
    let shadow = status
        .shadow
        .iter()
        .map(|t| {
            format!(
                "\n  shadow {:?}: would deny {} tokens in {} requests",
                t.prefix, t.would_deny_tokens, t.would_deny_requests
            )
        })
        .collect::<String>();
    let shards = status
        .shards
        .iter()
        .map(|s| {
            let leader = s
                .current_leader
                .map_or_else(|| "unknown".to_string(), |id| id.to_string());
            format!(
                "\n  shard {} is {}  leader {}  applied {}  live windows {}  slots {}",
                s.id, s.state, leader, s.last_applied_index, s.live_windows, s.owned_slots
            )
        })
        .collect::<String>();
    let retired = if status.retired_member_ids.is_empty() {
        "-".to_string()
    } else {
        status
            .retired_member_ids
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let retired = if status.restored_at_ms == 0 {
        retired
    } else {
        format!(
            "{retired}  (restored at {} ms: earlier windows sealed)",
            status.restored_at_ms
        )
    };
    format!(
        "node {} is {}{}\n  term {}  leader {}\n  log index {}  applied {}  snapshot {}  purged {}\n  voters   {}\n  learners {}\n  retired  {}\n  state clock {} ms  live windows {}  policies {}\n  counters {}{}{}",
        status.node_id,
        status.state,
        if status.initialized { "" } else { " (not initialised)" },
        status.current_term,
        leader,
        status.last_log_index,
        status.last_applied_index,
        status.snapshot_index,
        status.purged_index,
        members(&status.voters),
        members(&status.learners),
        retired,
        status.state_machine_now_ms,
        status.live_windows,
        status.policies,
        counters,
        shadow,
        shards,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reconcile_disposition_has_its_spelling() {
        let spelled = |disposition| {
            let outcome = ReconcileOutcome {
                credited: 3,
                disposition,
            };
            disposition_name(&pb::ReconcileResponse::from(&outcome))
        };
        assert_eq!(spelled(ReconcileDisposition::Credited), "credited");
        assert_eq!(spelled(ReconcileDisposition::WindowEnded), "window-ended");
        assert_eq!(spelled(ReconcileDisposition::Duplicate), "duplicate");
        for unknown in [0, 4, -1] {
            let response = pb::ReconcileResponse {
                credited: 0,
                disposition: unknown,
            };
            assert_eq!(disposition_name(&response), "unspecified", "{unknown}");
        }
    }
}
