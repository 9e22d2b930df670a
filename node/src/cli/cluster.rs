//! `leasehold cluster init | status | add-learner | change-membership | step-down`.

use std::time::Duration;

use clap::{Args, Subcommand};
use leasehold_client::coordinator::{AdminClient, CoordinatorError};
use leasehold_core::policy::Policy;
use leasehold_proto::v1 as pb;
use serde_json::json;

use super::args::ClientArgs;
use super::error::CliError;
use super::output::{emit, status_json, status_text};

/// Options of `leasehold cluster`.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Which cluster command.
    #[command(subcommand)]
    pub command: ClusterCommand,
}

/// The cluster commands.
#[derive(Debug, Clone, Subcommand)]
pub enum ClusterCommand {
    /// Initialise a pristine cluster (sent to --endpoint, which must be one of the members).
    Init(InitArgs),
    /// Show the status of the member at --endpoint.
    Status(StatusArgs),
    /// Add a non-voting member that starts receiving the log.
    AddLearner(AddLearnerArgs),
    /// Replace the set of voters (learners to promote must have been added).
    ChangeMembership(ChangeMembershipArgs),
    /// Make the leader hand its leadership to another voter (before maintenance).
    StepDown(StepDownArgs),
}

/// Options of `cluster init`.
#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    /// A member as ID=HOST:PORT; repeat for each member.
    #[arg(long = "member", required = true, value_parser = parse_member)]
    pub members: Vec<(u64, String)>,
    /// Keep trying for this long while the endpoint is not up yet.
    #[arg(long, default_value_t = 0)]
    pub wait_secs: u64,
    /// A policy to set after a fresh initialisation, as PREFIX=LIMIT/WINDOW_MS; repeatable.
    #[arg(long = "policy", value_parser = parse_policy)]
    pub policies: Vec<pb::Policy>,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `cluster status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `cluster add-learner`.
#[derive(Debug, Clone, Args)]
pub struct AddLearnerArgs {
    /// The new member as ID=HOST:PORT.
    #[arg(long, value_parser = parse_member)]
    pub member: (u64, String),
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `cluster change-membership`.
#[derive(Debug, Clone, Args)]
pub struct ChangeMembershipArgs {
    /// A voter id; repeat for each voter of the new configuration.
    #[arg(long = "voter", required = true)]
    pub voters: Vec<u64>,
    /// Keep removed voters as learners.
    #[arg(long)]
    pub retain: bool,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `cluster step-down`.
#[derive(Debug, Clone, Args)]
pub struct StepDownArgs {
    /// The member expected to lead; makes retries idempotent (default: whichever leads).
    #[arg(long)]
    pub leader: Option<u64>,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Parses `ID=HOST:PORT`.
pub fn parse_member(raw: &str) -> Result<(u64, String), String> {
    let (id, addr) = raw
        .split_once('=')
        .ok_or_else(|| format!("expected ID=HOST:PORT, got {raw:?}"))?;
    let id: u64 = id
        .trim()
        .parse()
        .map_err(|_| format!("member id {id:?} is not a number"))?;
    if id == 0 {
        return Err("member ids start at 1".into());
    }
    let addr = leasehold_client::transport::normalize_addr(addr).map_err(|e| e.to_string())?;
    Ok((id, addr))
}

/// Parses `PREFIX=LIMIT/WINDOW_MS` into a counter, fail-closed policy.
pub fn parse_policy(raw: &str) -> Result<pb::Policy, String> {
    let (prefix, rest) = raw
        .rsplit_once('=')
        .ok_or_else(|| format!("expected PREFIX=LIMIT/WINDOW_MS, got {raw:?}"))?;
    let (limit, window_ms) = rest
        .split_once('/')
        .ok_or_else(|| format!("expected LIMIT/WINDOW_MS, got {rest:?}"))?;
    let limit = limit
        .trim()
        .parse()
        .map_err(|_| format!("limit {limit:?} is not a number"))?;
    let window_ms = window_ms
        .trim()
        .parse()
        .map_err(|_| format!("window {window_ms:?} is not a number"))?;
    Ok(Policy::counter(prefix, limit, window_ms).into())
}

/// Runs `leasehold cluster …`.
pub async fn run(args: ClusterArgs) -> Result<(), CliError> {
    match args.command {
        ClusterCommand::Init(args) => init(args).await,
        ClusterCommand::Status(args) => {
            let status = args.client.client()?.admin().status().await?;
            emit(args.client.output, status_json(&status), || {
                status_text(&status)
            });
            Ok(())
        }
        ClusterCommand::AddLearner(args) => add_learner(args).await,
        ClusterCommand::ChangeMembership(args) => {
            let change = args
                .client
                .client()?
                .admin()
                .change_membership(&args.voters, args.retain)
                .await?;
            let index = change.log_index;
            let lagging = &change.lagging_member_ids;
            emit(
                args.client.output,
                json!({"voters": args.voters, "log_index": index, "lagging_member_ids": lagging}),
                || format!("voters are now {:?} (log index {index})", args.voters),
            );
            if !lagging.is_empty() {
                eprintln!(
                    "warning: members {lagging:?} do not hold the change yet; until they do \
                     they still accept Raft messages from removed members (`cluster status` \
                     on each: last_log_index ≥ {index})"
                );
            }
            Ok(())
        }
        ClusterCommand::StepDown(args) => {
            let new_leader = args.client.client()?.admin().step_down(args.leader).await?;
            emit(
                args.client.output,
                json!({"new_leader": new_leader}),
                || format!("node {new_leader} leads now"),
            );
            Ok(())
        }
    }
}

/// `cluster add-learner`: adds the member, then asks again (harmless: the
/// leader waits each time) until it holds the entry that added it or
/// `--timeout-ms` runs out: a learner that never takes the log is an error,
/// not an added member.
async fn add_learner(args: AddLearnerArgs) -> Result<(), CliError> {
    let (id, addr) = &args.member;
    let admin = args.client.client()?.admin();
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(args.client.timeout_ms.max(1));
    let added = loop {
        let added = admin.add_learner(*id, addr).await?;
        if added.caught_up || tokio::time::Instant::now() >= deadline {
            break added;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let index = added.log_index;
    if !added.caught_up {
        let holds = if added.matched_any {
            format!("holds the log only up to index {}", added.matched_index)
        } else {
            "has taken nothing of the log".to_string()
        };
        return Err(CliError::Failed(format!(
            "learner {id} at {addr} was added (log index {index}) but {holds} after {} ms: \
             check that it runs at {addr}, reaches the members, and was started with \
             --join-members listing the current members (docs/security.md, \"Joining a \
             member\"); run add-learner again to wait longer (`change-membership` refuses to \
             make it a voter until it catches up)",
            args.client.timeout_ms
        )));
    }
    emit(
        args.client.output,
        json!({"added_learner": id, "log_index": index, "caught_up": true}),
        || format!("added learner {id} at {addr} (log index {index}); it holds the log"),
    );
    Ok(())
}

/// After `init` found the cluster initialised: succeeds (idempotent) only if
/// it was initialised with exactly `wanted` as its members.
async fn check_same_members(
    admin: &leasehold_client::coordinator::AdminClient,
    wanted: &[(u64, String)],
) -> Result<(), CliError> {
    let status = admin.status().await?;
    let mut current: Vec<(u64, String)> = status
        .voters
        .iter()
        .chain(status.learners.iter())
        .map(|m| (m.id, m.addr.clone()))
        .collect();
    current.sort();
    let mut wanted = wanted.to_vec();
    wanted.sort();
    if current == wanted {
        return Ok(());
    }
    let list = |members: &[(u64, String)]| {
        members
            .iter()
            .map(|(id, addr)| format!("{id}={addr}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(CliError::Conflict(format!(
        "the cluster is already initialised with members [{}], not [{}]; nothing changed \
         (change members with `leasehold cluster add-learner` and `cluster change-membership`)",
        list(&current),
        list(&wanted)
    )))
}

async fn init(args: InitArgs) -> Result<(), CliError> {
    let mut client_args = args.client.clone();
    client_args.timeout_ms = client_args
        .timeout_ms
        .max(args.wait_secs.saturating_mul(1_000));
    let admin = client_args.client()?.admin();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait_secs);
    let fresh = loop {
        match admin.init(&args.members).await {
            Ok(()) => break true,
            Err(CoordinatorError::AlreadyExists(_)) => break false,
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                tracing::info!(error = %e, "waiting for the endpoint");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    if !fresh {
        check_same_members(&admin, &args.members).await?;
    }
    if fresh {
        for policy in &args.policies {
            admin.set_policy(policy.clone()).await?;
        }
    }
    let members: Vec<_> = args
        .members
        .iter()
        .map(|(id, addr)| json!({"id": id, "addr": addr}))
        .collect();
    emit(
        args.client.output,
        json!({"initialized": fresh, "already_initialized": !fresh, "members": members}),
        || {
            if fresh {
                format!(
                    "initialised a cluster of {} member(s); {} policy(ies) set",
                    args.members.len(),
                    args.policies.len()
                )
            } else {
                "already initialised; nothing changed".to_string()
            }
        },
    );
    Ok(())
}

/// Waits until the cluster reachable through `admin` has a leader, or the budget ends.
pub async fn wait_for_leader(
    admin: &AdminClient,
    budget: Duration,
) -> Result<pb::StatusResponse, CliError> {
    let deadline = tokio::time::Instant::now() + budget;
    loop {
        match admin.status().await {
            Ok(status) if status.current_leader.is_some() => return Ok(status),
            Ok(_) | Err(_) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Ok(_) => return Err(CliError::Failed("no leader was elected in time".into())),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_and_policies_parse() {
        assert_eq!(
            parse_member("2=http://n2:7100").unwrap(),
            (2, "n2:7100".to_string())
        );
        assert!(parse_member("0=n:1").is_err());
        assert!(parse_member("n:1").is_err());
        assert!(parse_member("x=n:1").is_err());
        let policy = parse_policy("demo/=1000/1000").unwrap();
        assert_eq!(
            (policy.prefix.as_str(), policy.limit, policy.window_ms),
            ("demo/", 1000, 1000)
        );
        assert!(parse_policy("demo/=1000").is_err());
        assert!(parse_policy("demo/=x/1").is_err());
    }
}
