//! `leasehold shard list | add | split | move | replicas | remove`: where
//! keys live when the coordinator runs many Raft groups (ADR 0025;
//! docs/operations.md, "Shards").
//!
//! Every change is made against the placement version it read (`list`
//! shows it): a change that raced another is refused and changes nothing.
//! The commands read the version themselves unless `--expect-version`
//! pins it.

use clap::{Args, Subcommand};
use leasehold_proto::v1 as pb;
use pb::change_placement_request::Change;
use serde_json::{json, Value};

use super::args::ClientArgs;
use super::error::CliError;
use super::output::emit;

/// Options of `leasehold shard`.
#[derive(Debug, Clone, Args)]
pub struct ShardArgs {
    /// Which shard command.
    #[command(subcommand)]
    pub command: ShardCommand,
}

/// The shard commands.
#[derive(Debug, Clone, Subcommand)]
pub enum ShardCommand {
    /// Show the placement: its version, each shard's slots, replicas and leader.
    List(ListArgs),
    /// Add an empty shard replicated by the given members.
    Add(AddArgs),
    /// Move the upper half of a shard's slots (with their keys' windows) to a new shard.
    Split(SplitArgs),
    /// Move a range of slots (with their keys' windows) to a shard.
    Move(MoveArgs),
    /// Replace a shard's replicas.
    Replicas(ReplicasArgs),
    /// Remove a shard that owns no slot.
    Remove(RemoveArgs),
}

/// Options of `shard list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// The version a change is made against.
#[derive(Debug, Clone, Args)]
pub struct Expect {
    /// Make the change only if the placement is at this version (default:
    /// the version read just before).
    #[arg(long)]
    pub expect_version: Option<u64>,
}

/// Options of `shard add`.
#[derive(Debug, Clone, Args)]
pub struct AddArgs {
    /// The new shard's id (1..1023).
    #[arg(long)]
    pub shard: u32,
    /// Its replicas: member ids, comma-separated (3 or 5 is usual).
    #[arg(long, value_delimiter = ',', required = true)]
    pub replicas: Vec<u64>,
    /// The version to change.
    #[command(flatten)]
    pub expect: Expect,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `shard split`.
#[derive(Debug, Clone, Args)]
pub struct SplitArgs {
    /// The shard split (0 by default; a shard other than 0 splits into a
    /// shard on its replicas).
    #[arg(long, default_value_t = 0)]
    pub shard: u32,
    /// The new shard's id.
    #[arg(long)]
    pub into: u32,
    /// The new shard's replicas: member ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub replicas: Vec<u64>,
    /// The version to change.
    #[command(flatten)]
    pub expect: Expect,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `shard move`.
#[derive(Debug, Clone, Args)]
pub struct MoveArgs {
    /// First slot of the range.
    #[arg(long)]
    pub start: u32,
    /// One past the last slot (at most 16384).
    #[arg(long)]
    pub end: u32,
    /// The shard that gets them.
    #[arg(long)]
    pub to: u32,
    /// The version to change.
    #[command(flatten)]
    pub expect: Expect,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `shard replicas`.
#[derive(Debug, Clone, Args)]
pub struct ReplicasArgs {
    /// The shard (not 0: shard 0 is every member).
    #[arg(long)]
    pub shard: u32,
    /// Its replicas: member ids, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    pub replicas: Vec<u64>,
    /// The version to change.
    #[command(flatten)]
    pub expect: Expect,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `shard remove`.
#[derive(Debug, Clone, Args)]
pub struct RemoveArgs {
    /// The shard (owning no slot).
    #[arg(long)]
    pub shard: u32,
    /// The version to change.
    #[command(flatten)]
    pub expect: Expect,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

impl ShardCommand {
    /// Where the command connects and how it prints.
    pub fn client(&self) -> &ClientArgs {
        match self {
            ShardCommand::List(a) => &a.client,
            ShardCommand::Add(a) => &a.client,
            ShardCommand::Split(a) => &a.client,
            ShardCommand::Move(a) => &a.client,
            ShardCommand::Replicas(a) => &a.client,
            ShardCommand::Remove(a) => &a.client,
        }
    }

    /// The change a changing command asks for, and the version it pins.
    fn change(&self) -> Option<(Change, Option<u64>)> {
        Some(match self {
            ShardCommand::List(_) => return None,
            ShardCommand::Add(a) => (
                Change::AddShard(pb::AddShard {
                    shard: a.shard,
                    replicas: a.replicas.clone(),
                }),
                a.expect.expect_version,
            ),
            ShardCommand::Split(a) => (
                Change::Split(pb::SplitShard {
                    shard: a.shard,
                    into: a.into,
                    replicas: a.replicas.clone(),
                }),
                a.expect.expect_version,
            ),
            ShardCommand::Move(a) => (
                Change::MoveSlots(pb::MoveSlots {
                    start: a.start,
                    end: a.end,
                    to: a.to,
                }),
                a.expect.expect_version,
            ),
            ShardCommand::Replicas(a) => (
                Change::SetReplicas(pb::SetShardReplicas {
                    shard: a.shard,
                    replicas: a.replicas.clone(),
                }),
                a.expect.expect_version,
            ),
            ShardCommand::Remove(a) => (
                Change::RemoveShard(pb::RemoveShard { shard: a.shard }),
                a.expect.expect_version,
            ),
        })
    }
}

/// The placement as JSON.
pub fn placement_json(placement: &pb::Placement) -> Value {
    json!({
        "version": placement.version,
        "slots": placement.slots.iter().map(|r| json!({
            "start": r.start, "end": r.end, "shard": r.shard,
        })).collect::<Vec<_>>(),
        "shards": placement.shards.iter().map(|s| json!({
            "id": s.id,
            "slots": s.slots,
            "replicas": s.replica_addrs.iter().map(|m| json!({"id": m.id, "addr": m.addr})).collect::<Vec<_>>(),
            "leader_id": s.leader_id,
            "leader_addr": s.leader_addr,
        })).collect::<Vec<_>>(),
    })
}

/// The placement as lines: the version, one line per shard, one per run.
pub fn placement_text(placement: &pb::Placement) -> String {
    let mut lines = vec![format!(
        "placement version {}{}",
        placement.version,
        if placement.version == 0 {
            " (never sharded: shard 0 serves every key)"
        } else {
            ""
        }
    )];
    for shard in &placement.shards {
        let replicas = if shard.id == 0 {
            "every member".to_string()
        } else {
            shard
                .replica_addrs
                .iter()
                .map(|m| m.id.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let leader = match shard.leader_id {
            Some(id) => format!("leader {id}"),
            None => "leader unknown here".to_string(),
        };
        lines.push(format!(
            "shard {:>4}  {:>5} slots  replicas {replicas}  {leader}",
            shard.id, shard.slots
        ));
    }
    for run in &placement.slots {
        lines.push(format!(
            "slots {:>5}..{:<5} shard {}",
            run.start, run.end, run.shard
        ));
    }
    lines.join("\n")
}

/// Runs `leasehold shard …`.
pub async fn run(args: ShardArgs) -> Result<(), CliError> {
    let client_args = args.command.client().clone();
    let admin = client_args.client()?.admin();
    let placement = match args.command.change() {
        None => admin.placement().await?,
        Some((change, pinned)) => {
            let expected_version = match pinned {
                Some(version) => version,
                None => admin.placement().await?.version,
            };
            admin
                .change_placement(pb::ChangePlacementRequest {
                    expected_version,
                    change: Some(change),
                })
                .await?
        }
    };
    emit(client_args.output, placement_json(&placement), || {
        placement_text(&placement)
    });
    Ok(())
}
