//! `leasehold snapshot save | inspect | restore` and `leasehold
//! force-new-cluster`: backups of the coordinator state, a new cluster
//! from a backup, and the unsafe way out of a quorum lost for good
//! (docs/operations.md, "Backup and restore" and "Losing a quorum for good").

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand};
use leasehold_proto::v1 as pb;
use leasehold_raft_store::backup::{
    read_backup, survivor_state, write_new_cluster, NewCluster, NewClusterError, StateOrigin,
    StateSummary,
};
use leasehold_raft_store::SnapshotEnvelope;
use serde_json::{json, Value};

use super::args::ClientArgs;
use super::error::CliError;
use super::output::{emit, OutputFormat};

/// Options of `leasehold snapshot`.
#[derive(Debug, Clone, Args)]
pub struct SnapshotArgs {
    /// Which snapshot command.
    #[command(subcommand)]
    pub command: SnapshotCommand,
}

/// The snapshot commands.
#[derive(Debug, Clone, Subcommand)]
pub enum SnapshotCommand {
    /// Save a backup of the whole coordinator state from a live cluster (its leader).
    Save(SaveArgs),
    /// Check a backup file and show what it holds.
    Inspect(InspectArgs),
    /// Write a member's data directory that starts a new one-member cluster from a backup.
    Restore(RestoreArgs),
}

/// Options of `snapshot save`.
#[derive(Debug, Clone, Args)]
pub struct SaveArgs {
    /// The backup file to write (written beside, then renamed into place).
    #[arg(long, required_unless_present = "out_dir", conflicts_with = "out_dir")]
    pub out: Option<PathBuf>,
    /// Write `leasehold-<unix ms>.backup` into this directory instead (for
    /// scheduled backups: a CronJob, a timer).
    #[arg(long)]
    pub out_dir: Option<PathBuf>,
    /// With --out-dir: keep the newest N backups there, deleting older
    /// `leasehold-*.backup` files once this one is written (0 keeps all).
    #[arg(long, requires = "out_dir", default_value_t = 0)]
    pub keep: usize,
    /// Take it from the first endpoint that answers, leader or not (its
    /// applied state, which may lag the leader's), e.g. while no leader can
    /// be elected.
    #[arg(long)]
    pub any_member: bool,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Options of `snapshot inspect`.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The backup file.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Where a new cluster's first member lives, and its seal.
#[derive(Debug, Clone, Args)]
pub struct NewMemberArgs {
    /// The member's data directory (its Raft store goes in DIR/store).
    #[arg(long)]
    pub data_dir: PathBuf,
    /// The member's id.
    #[arg(long)]
    pub id: u64,
    /// The address other members and clients will reach it at (HOST:PORT).
    #[arg(long)]
    pub addr: String,
    /// The most the wall clocks of the old cluster's members may have run
    /// ahead of this machine's: windows the old cluster may have granted in
    /// are sealed as of now plus this margin.
    #[arg(long, default_value_t = 1_000)]
    pub clock_margin_ms: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Options of `snapshot restore`.
#[derive(Debug, Clone, Args)]
pub struct RestoreArgs {
    /// The backup file.
    #[arg(long)]
    pub from: PathBuf,
    /// The new cluster's first member: a new id, an empty data directory.
    #[command(flatten)]
    pub member: NewMemberArgs,
}

/// Options of `leasehold force-new-cluster`.
#[derive(Debug, Clone, Args)]
pub struct ForceNewClusterArgs {
    /// The survivor (stopped): its data directory, its own id and address.
    #[command(flatten)]
    pub member: NewMemberArgs,
    /// Required: the entries the lost members committed that this member's
    /// log lacks are lost for good, and every window live now is sealed.
    #[arg(long, required = true)]
    pub unsafe_lose_entries_only_the_lost_members_hold: bool,
}

/// Runs `leasehold snapshot …`.
pub async fn run(args: SnapshotArgs) -> Result<(), CliError> {
    match args.command {
        SnapshotCommand::Save(args) => save(args).await,
        SnapshotCommand::Inspect(args) => inspect(&args),
        SnapshotCommand::Restore(args) => restore(&args),
    }
}

async fn save(args: SaveArgs) -> Result<(), CliError> {
    // One try carries the whole state: give it the whole budget.
    let budget = Duration::from_millis(args.client.timeout_ms.max(1));
    let client = args.client.client_with_call_timeout(budget)?;
    let (info, bytes) = client.admin().save_snapshot(args.any_member).await?;
    if bytes.len() as u64 != info.bytes || crc32fast::hash(&bytes) != info.crc32 {
        return Err(CliError::Failed(format!(
            "the backup arrived damaged: {} bytes with CRC-32 {:08x}, the member sent {} bytes \
             with CRC-32 {:08x}; nothing was written",
            bytes.len(),
            crc32fast::hash(&bytes),
            info.bytes,
            info.crc32
        )));
    }
    read_backup(&bytes).map_err(|e| {
        CliError::Failed(format!(
            "the backup does not read back: {e}; nothing was written"
        ))
    })?;
    let out = match (&args.out, &args.out_dir) {
        (Some(out), _) => out.clone(),
        (None, Some(dir)) => dir.join(format!("{BACKUP_PREFIX}{}{BACKUP_SUFFIX}", wall_now_ms())),
        (None, None) => return Err(CliError::Usage("pass --out FILE or --out-dir DIR".into())),
    };
    write_atomically(&out, &bytes)?;
    let pruned = match &args.out_dir {
        Some(dir) if args.keep > 0 => prune_backups(dir, args.keep)?,
        _ => Vec::new(),
    };
    let mut json = saved_json(&out, &info);
    json["pruned"] = json!(pruned
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>());
    emit(args.client.output, json, || {
        format!(
            "saved {} ({} bytes, CRC-32 {:08x}) from member {}{}: log position {} (term {}), \
             {} live windows, {} policies, voters {:?}{}",
            out.display(),
            info.bytes,
            info.crc32,
            info.taken_from,
            if info.linearizable {
                ", the leader, after a read barrier"
            } else {
                " (not the leader: its applied state)"
            },
            info.last_log_index,
            info.last_log_term,
            info.live_windows,
            info.policies,
            info.voter_ids,
            if pruned.is_empty() {
                String::new()
            } else {
                format!("; deleted {} older backups", pruned.len())
            }
        )
    });
    Ok(())
}

/// The names `snapshot save --out-dir` writes: `leasehold-<unix ms>.backup`.
const BACKUP_PREFIX: &str = "leasehold-";
const BACKUP_SUFFIX: &str = ".backup";

/// Whether `name` is one `--out-dir` wrote: the prefix, digits, the suffix.
fn is_scheduled_backup(name: &str) -> Option<u64> {
    let stamp = name
        .strip_prefix(BACKUP_PREFIX)?
        .strip_suffix(BACKUP_SUFFIX)?;
    if stamp.is_empty() || !stamp.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stamp.parse().ok()
}

/// Deletes all but the newest `keep` scheduled backups in `dir` (by the
/// time in their names; other files are never touched); returns those
/// deleted.
fn prune_backups(dir: &Path, keep: usize) -> Result<Vec<PathBuf>, CliError> {
    let failed = |e: std::io::Error| CliError::Failed(format!("listing {}: {e}", dir.display()));
    let mut backups = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(failed)? {
        let entry = entry.map_err(failed)?;
        if let Some(stamp) = entry.file_name().to_str().and_then(is_scheduled_backup) {
            backups.push((stamp, entry.path()));
        }
    }
    backups.sort();
    let excess = backups.len().saturating_sub(keep);
    let mut deleted = Vec::new();
    for (_, path) in backups.into_iter().take(excess) {
        std::fs::remove_file(&path)
            .map_err(|e| CliError::Failed(format!("deleting {}: {e}", path.display())))?;
        deleted.push(path);
    }
    Ok(deleted)
}

fn saved_json(out: &Path, info: &pb::SnapshotInfo) -> Value {
    json!({
        "file": out.display().to_string(),
        "bytes": info.bytes,
        "crc32": format!("{:08x}", info.crc32),
        "taken_from": info.taken_from,
        "linearizable": info.linearizable,
        "last_log_index": info.last_log_index,
        "last_log_term": info.last_log_term,
        "state_clock_ms": info.state_clock_ms,
        "live_windows": info.live_windows,
        "policies": info.policies,
        "voter_ids": info.voter_ids,
        "retired_member_ids": info.retired_member_ids,
        "restored_at_ms": info.restored_at_ms,
    })
}

/// Writes `bytes` to `path` durably: beside it first, then renamed. The
/// file is readable by its owner only (0600): a backup holds every policy
/// and session of the cluster.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let failed =
        |what: &str, e: std::io::Error| CliError::Failed(format!("{what} {}: {e}", path.display()));
    let mut beside = path.as_os_str().to_owned();
    beside.push(".partial");
    let beside = PathBuf::from(beside);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(&beside).map_err(|e| failed("creating", e))?;
    #[cfg(unix)]
    {
        // A `.partial` left by an earlier run keeps its mode through open.
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|e| failed("restricting", e))?;
    }
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| failed("writing", e))?;
    std::fs::rename(&beside, path).map_err(|e| failed("renaming into", e))?;
    Ok(())
}

fn read_file(path: &Path) -> Result<SnapshotEnvelope, CliError> {
    let bytes = std::fs::read(path)
        .map_err(|e| CliError::Failed(format!("reading {}: {e}", path.display())))?;
    read_backup(&bytes).map_err(|e| CliError::Failed(format!("{}: {e}", path.display())))
}

fn summary_json(summary: &StateSummary) -> Value {
    json!({
        "last_log_index": summary.last_log_id.map(|id| id.index),
        "last_log_term": summary.last_log_id.map(|id| id.leader_id.term),
        "voter_ids": summary.voters,
        "retired_member_ids": summary.retired,
        "state_clock_ms": summary.clock_ms,
        "restored_at_ms": summary.restored_at_ms,
        "live_windows": summary.live_windows,
        "policies": summary.policies,
    })
}

fn inspect(args: &InspectArgs) -> Result<(), CliError> {
    let summary = StateSummary::of(&read_file(&args.file)?);
    emit(args.output, summary_json(&summary), || {
        let position = summary.last_log_id.map_or("none".to_string(), |id| {
            format!("{} (term {})", id.index, id.leader_id.term)
        });
        format!(
            "{}: a good backup. log position {position}, state clock {} ms, {} live windows, \
             {} policies, voters {:?}, retired {:?}{}",
            args.file.display(),
            summary.clock_ms,
            summary.live_windows,
            summary.policies,
            summary.voters,
            summary.retired,
            if summary.restored_at_ms == 0 {
                String::new()
            } else {
                format!(", restored at {} ms", summary.restored_at_ms)
            }
        )
    });
    Ok(())
}

/// Milliseconds since the Unix epoch on this machine.
fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn restore(args: &RestoreArgs) -> Result<(), CliError> {
    let envelope = read_file(&args.from)?;
    new_cluster(&args.member, envelope, StateOrigin::Backup)
}

/// Runs `leasehold force-new-cluster`.
pub async fn force_new_cluster(args: ForceNewClusterArgs) -> Result<(), CliError> {
    if !args.unsafe_lose_entries_only_the_lost_members_hold {
        return Err(CliError::Usage(
            "force-new-cluster needs --unsafe-lose-entries-only-the-lost-members-hold".into(),
        ));
    }
    let envelope = survivor_state(&args.member.data_dir)
        .await
        .map_err(|e| CliError::Failed(e.to_string()))?;
    new_cluster(&args.member, envelope, StateOrigin::Survivor)
}

fn new_cluster(
    member: &NewMemberArgs,
    envelope: SnapshotEnvelope,
    origin: StateOrigin,
) -> Result<(), CliError> {
    // The member `serve` will start from this store: refused now by the
    // rules `serve` applies, not after the store is written.
    crate::config::validate_member_id("id", member.id)
        .and_then(|()| crate::config::validate_member_addr("addr", &member.addr))
        .map_err(|e| match e {
            crate::config::ConfigError::Invalid { field, problem } => {
                CliError::Usage(format!("--{field} {problem}"))
            }
            other => CliError::Usage(other.to_string()),
        })?;
    let restored_at = wall_now_ms().saturating_add(member.clock_margin_ms);
    let written: NewCluster = write_new_cluster(
        &member.data_dir,
        envelope,
        member.id,
        &member.addr,
        restored_at,
        origin,
    )
    .map_err(|e| match e {
        NewClusterError::IdInUse(_)
        | NewClusterError::StoreExists(_)
        | NewClusterError::NotAMember(_) => CliError::Conflict(e.to_string()),
        _ => CliError::Failed(e.to_string()),
    })?;
    let json = json!({
        "member": member.id,
        "addr": member.addr,
        "data_dir": member.data_dir.display().to_string(),
        "last_log_index": written.last_log_id.index,
        "last_log_term": written.last_log_id.leader_id.term,
        "restored_at_ms": written.restored_at_ms,
        "retired_member_ids": written.retired,
        "previous_store": written.previous_store.as_ref().map(|p| p.display().to_string()),
    });
    emit(member.output, json, || {
        let mut text = format!(
            "member {} at {} is the only voter of a new cluster starting at log position {} \
             (term {}). Windows that start before {} ms plus their length are sealed (they \
             grant nothing more). Ids {:?} are retired for good.\nnext: start it (`leasehold \
             serve --id {} --data-dir {} …`), then add members with new ids (add-learner, \
             change-membership).",
            member.id,
            member.addr,
            written.last_log_id.index,
            written.last_log_id.leader_id.term,
            written.restored_at_ms,
            written.retired,
            member.id,
            member.data_dir.display()
        );
        if let Some(previous) = &written.previous_store {
            text.push_str(&format!(
                "\nits previous store was kept at {}",
                previous.display()
            ));
        }
        text
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_scheduled_backups_are_pruned_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let names = [
            "leasehold-100.backup",
            "leasehold-20.backup",
            "leasehold-3000.backup",
            "leasehold-.backup",
            "leasehold-12x.backup",
            "leasehold-5.backup.partial",
            "mine.backup",
        ];
        for name in names {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let deleted = prune_backups(dir.path(), 1).unwrap();
        let deleted: Vec<String> = deleted
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(deleted, ["leasehold-20.backup", "leasehold-100.backup"]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [
                "leasehold-.backup",
                "leasehold-12x.backup",
                "leasehold-3000.backup",
                "leasehold-5.backup.partial",
                "mine.backup"
            ]
        );
        assert!(prune_backups(dir.path(), 5).unwrap().is_empty());
    }
}
