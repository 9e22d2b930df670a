//! `leasehold watch --key K | --prefix P`: follows the Monitor service's
//! stream of a key's (or a prefix's) current windows and redraws a table
//! on every update (at least once per window), or prints one JSON line per
//! update with `--output json`. `--once` prints the first update and exits.
//!
//! The stream is read from the first endpoint that accepts it; when that
//! member goes away the watch moves on to the next endpoint, so it keeps
//! running through a leader failover when every member is listed. A
//! refusal that another member would repeat (not allowed, bad input, too
//! many streams) ends the command with the server's explanation.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;
use leasehold_client::transport::{normalize_addr, Dialer};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::monitor_client::MonitorClient;
use leasehold_proto::v1::watch_request::Target;
use serde_json::json;
use tonic::Code;

use super::args::ClientArgs;
use super::error::CliError;
use super::output::{window_json, OutputFormat};

/// Pause before trying the next endpoint after a stream broke.
const RECONNECT_PAUSE: Duration = Duration::from_millis(500);
/// ANSI: cursor home and clear screen (only written to a terminal).
const CLEAR_SCREEN: &str = "\x1b[H\x1b[2J";

/// Options of `leasehold watch`.
#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// Watch this key.
    #[arg(long, conflicts_with = "prefix", required_unless_present = "prefix")]
    pub key: Option<String>,
    /// Watch the keys with a live window under this prefix ("" for every key; the first 64 shown).
    #[arg(long)]
    pub prefix: Option<String>,
    /// Print the first update and exit.
    #[arg(long)]
    pub once: bool,
    /// Exit after this many updates (0: until interrupted).
    #[arg(long, default_value_t = 0)]
    pub updates: u64,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

impl WatchArgs {
    fn target(&self) -> Result<Target, CliError> {
        match (&self.key, &self.prefix) {
            (Some(key), None) => Ok(Target::Key(key.clone())),
            (None, Some(prefix)) => Ok(Target::Prefix(prefix.clone())),
            _ => Err(CliError::Usage(
                "give exactly one of --key or --prefix".into(),
            )),
        }
    }

    /// How many updates to print before exiting (`None`: no end).
    fn update_budget(&self) -> Option<u64> {
        if self.once {
            Some(1)
        } else if self.updates > 0 {
            Some(self.updates)
        } else {
            None
        }
    }
}

/// Runs `leasehold watch`.
pub async fn run(args: WatchArgs) -> Result<(), CliError> {
    let target = args.target()?;
    let label = match &target {
        Target::Key(key) => format!("key {key:?}"),
        Target::Prefix(prefix) => format!("prefix {prefix:?}"),
    };
    let dialer = args.client.transport.dialer()?;
    let endpoints = args
        .client
        .endpoints
        .iter()
        .map(|e| normalize_addr(e).map_err(|e| CliError::Usage(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let connect_timeout = Duration::from_millis(args.client.timeout_ms.max(1));
    let terminal = std::io::stdout().is_terminal();
    let mut remaining = args.update_budget();
    let mut failures = Vec::new();
    let mut next = 0;
    loop {
        let endpoint = &endpoints[next % endpoints.len()];
        next += 1;
        match follow(
            dialer.as_ref(),
            endpoint,
            &target,
            connect_timeout,
            |update| {
                print_update(args.client.output, terminal, &label, update);
                match remaining.as_mut() {
                    Some(left) => {
                        *left -= 1;
                        *left > 0
                    }
                    None => true,
                }
            },
        )
        .await
        {
            Ok(()) => return Ok(()),
            Err(Broken::Refused(status)) => {
                return Err(CliError::Failed(format!(
                    "{endpoint} refused the watch: {}: {}",
                    status.code(),
                    status.message()
                )))
            }
            Err(Broken::Lost { why, received }) => {
                if received {
                    failures.clear();
                }
                failures.push(format!("{endpoint}: {why}"));
                if failures.len() >= endpoints.len() && !received {
                    if remaining.is_some() {
                        return Err(CliError::Failed(format!(
                            "no endpoint served the watch ({}); pass every member with --endpoint",
                            failures.join("; ")
                        )));
                    }
                    eprintln!("watch: {}; retrying", failures.join("; "));
                    failures.clear();
                }
                tokio::time::sleep(RECONNECT_PAUSE).await;
            }
        }
    }
}

/// How a stream ended other than by printing enough updates.
enum Broken {
    /// A refusal every member would repeat: give up.
    Refused(tonic::Status),
    /// The member or the connection went away: try the next one.
    Lost {
        /// What happened.
        why: String,
        /// Whether any update arrived before it broke.
        received: bool,
    },
}

fn lost(why: impl ToString, received: bool) -> Broken {
    Broken::Lost {
        why: why.to_string(),
        received,
    }
}

/// Follows one member's stream, handing each update to `on_update` until it
/// answers false (done) or the stream breaks.
async fn follow(
    dialer: &dyn Dialer,
    endpoint: &str,
    target: &Target,
    connect_timeout: Duration,
    mut on_update: impl FnMut(&pb::WatchUpdate) -> bool,
) -> Result<(), Broken> {
    let connect = async {
        let channel = dialer.dial(endpoint).await.map_err(|e| lost(e, false))?;
        MonitorClient::new(channel)
            .watch(pb::WatchRequest {
                target: Some(target.clone()),
            })
            .await
            .map_err(|status| match status.code() {
                Code::InvalidArgument
                | Code::PermissionDenied
                | Code::Unauthenticated
                | Code::ResourceExhausted
                | Code::Unimplemented => Broken::Refused(status),
                _ => lost(format!("{}: {}", status.code(), status.message()), false),
            })
    };
    let mut stream = tokio::time::timeout(connect_timeout, connect)
        .await
        .map_err(|_| lost("no answer within the timeout", false))??
        .into_inner();
    let mut received = false;
    loop {
        match stream.message().await {
            Ok(Some(update)) => {
                received = true;
                if !on_update(&update) {
                    return Ok(());
                }
            }
            Ok(None) => return Err(lost("the stream ended", received)),
            Err(status) => {
                return Err(lost(
                    format!("{}: {}", status.code(), status.message()),
                    received,
                ))
            }
        }
    }
}

fn print_update(format: OutputFormat, terminal: bool, label: &str, update: &pb::WatchUpdate) {
    let mut out = std::io::stdout().lock();
    let _ = match format {
        OutputFormat::Json => writeln!(out, "{}", update_json(update)),
        OutputFormat::Text if terminal => {
            write!(out, "{CLEAR_SCREEN}{}", render_table(label, update))
        }
        OutputFormat::Text => writeln!(out, "{}", render_table(label, update)),
    };
    let _ = out.flush();
}

/// One update as a JSON line.
pub fn update_json(update: &pb::WatchUpdate) -> serde_json::Value {
    json!({
        "sequence": update.sequence,
        "skipped": update.skipped,
        "served_by": update.served_by,
        "is_leader": update.is_leader,
        "leader_id": update.leader_id,
        "applied_index": update.applied_index,
        "sampled_at_ms": update.sampled_at_ms,
        "matching_keys": update.matching_keys,
        "truncated": update.truncated,
        "windows": update.windows.iter().map(window_json).collect::<Vec<_>>(),
        "region": update.region,
        "tenants": update.tenants.iter().map(|t| json!({
            "key": t.key,
            "tenant_count": t.tenant_count,
            "tenants": t.tenants.iter().map(|u| json!({
                "tenant": u.tenant, "weight": u.weight, "admitted": u.admitted,
            })).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    })
}

/// One update as a table: a header naming who served it, a row per key
/// (limit, Σ granted, Σ returned, in use, use %, time left in the window,
/// shadow would-deny), then a row per region.
pub fn render_table(label: &str, update: &pb::WatchUpdate) -> String {
    let server = if !update.region.is_empty() {
        format!("escrow node of region {}", update.region)
    } else {
        let role = if update.is_leader {
            "leader".to_string()
        } else if update.leader_id == 0 {
            "no leader known".to_string()
        } else {
            format!("follower of {}", update.leader_id)
        };
        format!(
            "member {} ({role}) · applied {}",
            update.served_by, update.applied_index
        )
    };
    let mut text = format!(
        "watch {label} · {server} · update {}{}\n",
        update.sequence,
        if update.skipped > 0 {
            format!(" ({} skipped)", update.skipped)
        } else {
            String::new()
        }
    );
    text.push_str(&format!(
        "{:<28} {:>12} {:>12} {:>12} {:>12} {:>7} {:>10} {:>14}\n",
        "KEY", "LIMIT", "GRANTED", "RETURNED", "IN USE", "USE%", "ENDS IN", "WOULD-DENY"
    ));
    if update.windows.is_empty() {
        text.push_str("(no key with a live window)\n");
    }
    for window in &update.windows {
        let Some(policy) = &window.policy else {
            text.push_str(&format!(
                "{:<28} (no policy governs this key)\n",
                window.key
            ));
            continue;
        };
        let in_use = window.granted.saturating_sub(window.returned);
        let use_percent = if window.limit == 0 {
            "-".to_string()
        } else {
            format!("{:.1}%", in_use as f64 * 100.0 / window.limit as f64)
        };
        let ends_in_ms = window
            .window_end_ms
            .saturating_sub(window.coordinator_now_ms);
        let would_deny = if policy.shadow || window.would_deny_requests > 0 {
            format!(
                "{} ({} req)",
                window.would_deny_tokens, window.would_deny_requests
            )
        } else {
            "-".to_string()
        };
        text.push_str(&format!(
            "{:<28} {:>12} {:>12} {:>12} {:>12} {:>7} {:>10} {:>14}\n",
            window.key,
            window.limit,
            window.granted,
            window.returned,
            in_use,
            use_percent,
            format!("{:.1} s", ends_in_ms as f64 / 1000.0),
            would_deny
        ));
        if let Some(tenants) = update.tenants.iter().find(|t| t.key == window.key) {
            for tenant in &tenants.tenants {
                text.push_str(&format!(
                    "  tenant {:<19} {:>12} {:>12}   weight {}\n",
                    tenant.tenant, "", tenant.admitted, tenant.weight
                ));
            }
            let hidden = tenants
                .tenant_count
                .saturating_sub(tenants.tenants.len() as u64);
            if hidden > 0 {
                text.push_str(&format!("  … and {hidden} more tenants\n"));
            }
        }
        for region in &window.regions {
            text.push_str(&format!(
                "  {:<26} {:>12} {:>12} {:>12}{}\n",
                region.region,
                "",
                region.granted,
                region.returned,
                if region.pool_weight > 0 {
                    format!("   weight {}", region.pool_weight)
                } else {
                    String::new()
                }
            ));
        }
    }
    if update.truncated {
        text.push_str(&format!(
            "… {} keys match; the first {} are shown\n",
            update.matching_keys,
            update.windows.len()
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(key: &str, granted: u64, returned: u64, shadow: bool) -> pb::GetWindowResponse {
        pb::GetWindowResponse {
            key: key.into(),
            policy: Some(
                leasehold_core::policy::Policy::counter("api/", 1_000, 60_000)
                    .with_shadow(shadow)
                    .into(),
            ),
            limit: 1_000,
            window_start_ms: 60_000,
            window_end_ms: 120_000,
            granted,
            returned,
            regions: vec![pb::RegionUsage {
                region: "eu".into(),
                granted,
                returned,
                pool_weight: 0,
            }],
            coordinator_now_ms: 90_000,
            would_deny_tokens: if shadow { 250 } else { 0 },
            would_deny_requests: if shadow { 3 } else { 0 },
        }
    }

    #[test]
    fn the_table_shows_the_numbers_of_each_key_and_region() {
        let update = pb::WatchUpdate {
            windows: vec![
                window("api/a", 400, 10, false),
                window("api/b", 1_250, 0, true),
            ],
            matching_keys: 70,
            truncated: true,
            served_by: 2,
            leader_id: 1,
            applied_index: 812,
            sequence: 9,
            skipped: 2,
            ..Default::default()
        };
        let table = render_table("prefix \"api/\"", &update);
        assert!(table.contains("member 2 (follower of 1) · applied 812 · update 9 (2 skipped)"));
        let row_a = table.lines().find(|l| l.starts_with("api/a")).unwrap();
        for cell in ["1000", "400", "10", "390", "39.0%", "30.0 s", "-"] {
            assert!(row_a.contains(cell), "{cell} missing from {row_a:?}");
        }
        let row_b = table.lines().find(|l| l.starts_with("api/b")).unwrap();
        assert!(
            row_b.contains("125.0%") && row_b.contains("250 (3 req)"),
            "{row_b}"
        );
        assert!(table
            .lines()
            .any(|l| l.trim_start().starts_with("eu") && l.contains("400")));
        assert!(table.contains("70 keys match; the first 2 are shown"));
        assert!(
            !table.contains('\x1b'),
            "no escape codes in the table itself"
        );
    }

    #[test]
    fn an_escrow_nodes_table_lists_the_tenants_of_a_key() {
        let update = pb::WatchUpdate {
            windows: vec![window("fair/k", 90, 0, false)],
            region: "eu".into(),
            tenants: vec![pb::KeyTenants {
                key: "fair/k".into(),
                tenant_count: 3,
                tenants: vec![
                    pb::TenantUsage {
                        tenant: "gold".into(),
                        weight: 3,
                        admitted: 60,
                    },
                    pb::TenantUsage {
                        tenant: "free".into(),
                        weight: 1,
                        admitted: 30,
                    },
                ],
            }],
            ..Default::default()
        };
        let table = render_table("key \"fair/k\"", &update);
        assert!(table.contains("escrow node of region eu"), "{table}");
        let gold = table.lines().find(|l| l.contains("tenant gold")).unwrap();
        assert!(gold.contains("60") && gold.contains("weight 3"), "{gold}");
        assert!(table.contains("and 1 more tenants"));
        assert_eq!(
            update_json(&update)["tenants"][0]["tenants"][1]["admitted"],
            30
        );
    }

    #[test]
    fn a_key_without_policy_and_an_empty_prefix_say_so() {
        let no_policy = pb::WatchUpdate {
            windows: vec![pb::GetWindowResponse {
                key: "nope".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(render_table("key \"nope\"", &no_policy).contains("no policy governs this key"));
        let empty = render_table("prefix \"x/\"", &pb::WatchUpdate::default());
        assert!(empty.contains("no key with a live window") && empty.contains("no leader known"));
        let json = update_json(&no_policy);
        assert_eq!(json["windows"][0]["key"], "nope");
    }
}
