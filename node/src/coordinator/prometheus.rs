//! The coordinator member's Prometheus metrics (`--metrics-listen`): its
//! request counters, Raft progress, state-machine sizes, and per policy
//! prefix the limit, what its live windows granted, and their utilisation.
//! Series are per prefix (capped, see [`crate::metrics_http`]) and never per
//! key. Names and meanings are listed in docs/operations.md ("Metrics").

use leasehold_core::policy::PolicyKind;
use openraft::ServerState;

use super::context::NodeContext;
use super::shard::routing::HostedApis;
use crate::metrics_http::{cap_prefixes, Exposition, MetricKind};

/// Counters of [`super::metrics::NodeMetrics`] that are levels, not totals.
const GAUGE_COUNTERS: &[&str] = &["largest_batch", "connections_open"];

/// The metrics document of this member now; `shards`: the shards past 0
/// it hosts (their groups' series, labelled `shard`).
pub fn render(node: &NodeContext, shards: &HostedApis) -> String {
    let mut doc = Exposition::new();
    render_shards(&mut doc, node, shards);
    for (name, value) in node.metrics.snapshot() {
        if GAUGE_COUNTERS.contains(&name) {
            let metric = format!("leasehold_coordinator_{name}");
            doc.single(&metric, MetricKind::Gauge, &describe(name), value as f64);
        } else {
            let metric = format!("leasehold_coordinator_{name}_total");
            doc.single(&metric, MetricKind::Counter, &describe(name), value as f64);
        }
    }

    doc.histogram(
        "leasehold_raft_commit_seconds",
        "Time from proposing a group-commit batch to its being applied on the leader \
         (replicated to a quorum, fsync'd, committed, applied).",
        &node.metrics.commit_latency.snapshot(),
        1e-6,
    );
    doc.histogram(
        "leasehold_raft_log_fsync_seconds",
        "Time each flush of this member's Raft log to disk took (appends, votes, truncations).",
        &node.log_flush_latency.snapshot(),
        1e-6,
    );
    doc.histogram(
        "leasehold_raft_proposal_batch_size",
        "Commands per group-commit proposal.",
        &node.metrics.batch_sizes.0.snapshot(),
        1.0,
    );

    let snapshot = node.state.snapshot();
    doc.single(
        "leasehold_raft_snapshot_bytes",
        MetricKind::Gauge,
        "Encoded size of this member's stored snapshot (0: none yet).",
        snapshot.bytes() as f64,
    );
    doc.single(
        "leasehold_raft_snapshot_age_seconds",
        MetricKind::Gauge,
        "Seconds since this member stored its snapshot (built or installed), or loaded it at \
         start (0: none yet).",
        snapshot.age().map_or(0.0, |age| age.as_secs_f64()),
    );

    let raft = node.raft.metrics().borrow().clone();
    let index = |id: Option<u64>| id.unwrap_or(0) as f64;
    doc.single(
        "leasehold_raft_term",
        MetricKind::Gauge,
        "Current Raft term.",
        raft.current_term as f64,
    );
    doc.single(
        "leasehold_raft_leader_id",
        MetricKind::Gauge,
        "Node id of the leader this member knows (0: none).",
        index(raft.current_leader),
    );
    doc.single(
        "leasehold_raft_is_leader",
        MetricKind::Gauge,
        "1 while this member is the leader.",
        f64::from(u8::from(raft.state == ServerState::Leader)),
    );
    doc.single(
        "leasehold_raft_last_log_index",
        MetricKind::Gauge,
        "Index of the last entry in this member's log.",
        index(raft.last_log_index),
    );
    doc.single(
        "leasehold_raft_applied_index",
        MetricKind::Gauge,
        "Index of the last entry applied to the state machine.",
        index(raft.last_applied.map(|id| id.index)),
    );
    doc.single(
        "leasehold_raft_snapshot_index",
        MetricKind::Gauge,
        "Last log index covered by the stored snapshot.",
        index(raft.snapshot.map(|id| id.index)),
    );
    doc.single(
        "leasehold_raft_purged_index",
        MetricKind::Gauge,
        "Highest log index removed by compaction.",
        index(raft.purged.map(|id| id.index)),
    );
    doc.single(
        "leasehold_raft_voters",
        MetricKind::Gauge,
        "Voters in the membership this member knows.",
        raft.membership_config.membership().voter_ids().count() as f64,
    );

    let wall_now = node.clock.now_ms();
    let (live, keys, sessions, usage, shadow) = node.state.read(|state| {
        (
            state.live_windows(),
            state.tracked_keys(),
            state.client_sessions(),
            state.usage_by_policy(wall_now),
            state
                .shadow_tallies()
                .map(|(prefix, tally)| (prefix.to_string(), tally))
                .collect::<Vec<_>>(),
        )
    });
    doc.single(
        "leasehold_coordinator_live_windows",
        MetricKind::Gauge,
        "Window records held by the state machine.",
        live as f64,
    );
    doc.single(
        "leasehold_coordinator_tracked_keys",
        MetricKind::Gauge,
        "Keys with window state (live or tombstone).",
        keys as f64,
    );
    doc.single(
        "leasehold_coordinator_sessions",
        MetricKind::Gauge,
        "Exactly-once client sessions held.",
        sessions as f64,
    );
    doc.single(
        "leasehold_coordinator_policies",
        MetricKind::Gauge,
        "Policies set.",
        usage.len() as f64,
    );

    let rows = cap_prefixes(
        usage
            .iter()
            .map(|u| {
                (
                    u.policy.prefix.clone(),
                    [
                        u.policy.limit as f64,
                        u.live_windows as f64,
                        u.limit_in_live_windows as f64,
                        u.granted as f64,
                        u.returned as f64,
                        f64::from(u8::from(u.policy.shadow)),
                        f64::from(u8::from(u.policy.kind == PolicyKind::Fair)),
                    ],
                )
            })
            .collect(),
    );
    let families: [(&str, MetricKind, &str); 7] = [
        (
            "leasehold_policy_limit",
            MetricKind::Gauge,
            "The policy's limit L per window and key.",
        ),
        (
            "leasehold_policy_live_windows",
            MetricKind::Gauge,
            "Keys of the policy with a live window.",
        ),
        (
            "leasehold_policy_window_limit_tokens",
            MetricKind::Gauge,
            "Σ of the limits of the policy's live windows.",
        ),
        (
            "leasehold_policy_window_granted_tokens",
            MetricKind::Gauge,
            "Σ granted in the policy's live windows.",
        ),
        (
            "leasehold_policy_window_returned_tokens",
            MetricKind::Gauge,
            "Σ credited back in the policy's live windows.",
        ),
        (
            "leasehold_policy_shadow",
            MetricKind::Gauge,
            "1 while the policy is in shadow mode.",
        ),
        (
            "leasehold_policy_fair",
            MetricKind::Gauge,
            "1 for a fair policy, 0 for a counter policy.",
        ),
    ];
    for (column, (name, kind, help)) in families.iter().enumerate() {
        doc.family(name, *kind, help);
        for (prefix, values) in &rows {
            doc.sample(name, &[("prefix", prefix)], values[column]);
        }
    }
    doc.family(
        "leasehold_policy_window_utilisation_ratio",
        MetricKind::Gauge,
        "Granted ÷ limit over the policy's live windows (0 with none live).",
    );
    for (prefix, values) in &rows {
        let ratio = if values[2] > 0.0 {
            values[3] / values[2]
        } else {
            0.0
        };
        doc.sample(
            "leasehold_policy_window_utilisation_ratio",
            &[("prefix", prefix)],
            ratio,
        );
    }
    let shadow_rows = cap_prefixes(
        shadow
            .into_iter()
            .map(|(prefix, tally)| {
                (
                    prefix,
                    [
                        tally.would_deny_tokens as f64,
                        tally.would_deny_requests as f64,
                    ],
                )
            })
            .collect(),
    );
    doc.family(
        "leasehold_policy_shadow_would_deny_tokens_total",
        MetricKind::Counter,
        "Tokens a shadow policy handed out that it would have refused.",
    );
    for (prefix, values) in &shadow_rows {
        doc.sample(
            "leasehold_policy_shadow_would_deny_tokens_total",
            &[("prefix", prefix)],
            values[0],
        );
    }
    doc.family(
        "leasehold_policy_shadow_would_deny_requests_total",
        MetricKind::Counter,
        "Decisions of a shadow policy that would have refused something.",
    );
    for (prefix, values) in &shadow_rows {
        doc.sample(
            "leasehold_policy_shadow_would_deny_requests_total",
            &[("prefix", prefix)],
            values[1],
        );
    }
    doc.finish()
}

/// One line of help for a member counter.
fn describe(name: &str) -> String {
    match name {
        "leases" => "Lease commands answered.".into(),
        "lease_tokens_requested" => "Tokens asked for by Lease.".into(),
        "lease_tokens_granted" => "Tokens granted by Lease.".into(),
        "lease_denials" => "Leases that granted nothing.".into(),
        "proposals" => "Raft proposals (group-commit batches).".into(),
        "proposed_commands" => "Commands carried by Raft proposals.".into(),
        "largest_batch" => "Most commands in one proposal so far.".into(),
        "pool_reserves_lapsed" => {
            "Regions retired by the leader, keeping all they hold, so that a late pool ask may take the reserves no region holds.".into()
        }
        "shard_leader_reclaims" => {
            "Elections this member stood for to take back a shard it is the preferred leader of, after a failure moved it.".into()
        }
        "pool_joins_ahead" => {
            "Joins of a fair key's next window made ahead, carried by a pool call late in the live one.".into()
        }
        name if name.starts_with("rejected_") => {
            format!(
                "Requests refused: {}.",
                name.trim_start_matches("rejected_").replace('_', " ")
            )
        }
        name => format!("Counter {}.", name.replace('_', " ")),
    }
}

/// The placement and, per shard this member hosts (0 included), whether
/// it leads it, the slots the group owns and its live windows.
fn render_shards(doc: &mut Exposition, node: &NodeContext, shards: &HostedApis) {
    let (version, shard_ids) = node.state.read(|state| {
        let placement = state.sharding().placement();
        (placement.version(), placement.shards().collect::<Vec<_>>())
    });
    doc.single(
        "leasehold_placement_version",
        MetricKind::Gauge,
        "Version of the placement of keys on shards this member knows (0: never sharded).",
        version as f64,
    );
    let mut groups = vec![(leasehold_core::shard::ShardId(0), None)];
    for shard in shard_ids.into_iter().filter(|s| s.0 != 0) {
        if let Some(api) = shards.get(shard) {
            groups.push((shard, Some(api)));
        }
    }
    let rows: Vec<(String, f64, f64, f64)> = groups
        .iter()
        .map(|(shard, api)| {
            let context = api.as_ref().map_or(node, |api| api.context().as_ref());
            let leads = context.raft.metrics().borrow().state == ServerState::Leader;
            let (owned, live) = context
                .state
                .read(|state| (state.sharding().owned_slots(), state.live_windows()));
            (
                shard.0.to_string(),
                f64::from(u8::from(leads)),
                f64::from(owned),
                live as f64,
            )
        })
        .collect();
    let families: [(&str, &str); 3] = [
        (
            "leasehold_shard_is_leader",
            "1 while this member leads the shard's group (per shard it hosts).",
        ),
        (
            "leasehold_shard_owned_slots",
            "Hash slots the shard's group serves (out of 16 384; per shard it hosts).",
        ),
        (
            "leasehold_shard_live_windows",
            "Window records the shard's group holds (per shard it hosts).",
        ),
    ];
    for (column, (name, help)) in families.iter().enumerate() {
        doc.family(name, MetricKind::Gauge, help);
        for (shard, leads, owned, live) in &rows {
            let value = [*leads, *owned, *live][column];
            doc.sample(name, &[("shard", shard)], value);
        }
    }
}
