//! The disaster drills of docs/operations.md, on real members: a backup
//! saved under load, the cluster destroyed, a new cluster restored from
//! the backup and grown back; and a quorum lost for good, a survivor
//! forced into a new cluster and grown back. An oracle sums every
//! acknowledged grant per (key, window) across both clusters: Σ ≤ L.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use leasehold_client::coordinator::CoordinatorClient;
use leasehold_raft_store::backup::{read_backup, survivor_state, write_new_cluster, StateOrigin};

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

/// Limit of the loaded key's short windows.
const LIMIT: u64 = 40;
/// Its window length: long enough for a new cluster to lead within the
/// window the old one was last granting in.
const WINDOW_MS: u64 = 3_000;
/// A key leased only before the backup, in one long window.
const KEPT_KEY: &str = "kept/k";

/// Acknowledged grants by window start, of both clusters.
type Acked = Arc<Mutex<BTreeMap<u64, u64>>>;

fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Leases 1 token of `key` from four callers until `stop`, recording
/// every acknowledged grant.
fn load(client: &CoordinatorClient, key: &str, stop: &Arc<AtomicBool>, acked: &Acked) {
    for caller in 0..4 {
        let (client, key, stop, acked) =
            (client.clone(), key.to_string(), stop.clone(), acked.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(grant) = client.lease(&key, &format!("r{caller}"), 1).await {
                    *acked
                        .lock()
                        .unwrap()
                        .entry(grant.window_start_ms)
                        .or_default() += grant.granted;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    }
}

/// Σ ≤ L for every window, and a window opened after the seal granted
/// (the new cluster admits again).
fn check_oracle(acked: &Acked, sealed_before_ms: u64) -> Result<()> {
    let acked = acked.lock().unwrap();
    for (start, granted) in acked.iter() {
        ensure!(
            *granted <= LIMIT,
            "window {start}: {granted} granted > L = {LIMIT}: {acked:?}"
        );
    }
    ensure!(
        acked
            .range(sealed_before_ms..)
            .any(|(_, granted)| *granted > 0),
        "no window after the seal ({sealed_before_ms}) granted: {acked:?}"
    );
    Ok(())
}

/// Grows `cluster` (led by `first`) by one new member; returns its id.
async fn grow(cluster: &mut Cluster, first: u64, voters: &mut Vec<u64>) -> Result<u64> {
    let (id, addr) = cluster.add_member(|_, _| Ok(())).await?;
    let admin = cluster.admin_of(first)?;
    admin.add_learner(id, &addr).await?;
    voters.push(id);
    let change = admin.change_membership(voters, false).await?;
    ensure!(change.lagging_member_ids.is_empty(), "{change:?}");
    Ok(id)
}

/// Save under load, destroy every member, restore member 4 from the file,
/// grow to members 4, 5, 6: every window holds Σ ≤ L across both
/// clusters, the long window the backup held keeps its acknowledged grants
/// (and grants nothing more), old ids are refused for good, and the new
/// cluster admits in the windows after the seal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_restored_from_a_backup_taken_under_load_keeps_sigma_within_l() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    let client = cluster.client()?;
    let admin = client.admin();
    admin
        .set_policy(counter_policy("drill/", LIMIT, WINDOW_MS))
        .await?;
    admin
        .set_policy(counter_policy("kept/", 1_000, LONG_WINDOW_MS))
        .await?;
    let kept = client.lease(KEPT_KEY, "r0", 7).await?;
    ensure!(kept.granted == 7);

    let acked: Acked = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    load(&client, "drill/k", &stop, &acked);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (info, bytes) = admin.save_snapshot(false).await?;
    ensure!(
        info.linearizable && info.bytes == bytes.len() as u64,
        "{info:?}"
    );
    let envelope = read_backup(&bytes)?;
    ensure!(envelope.last_applied.map(|id| id.index) == Some(info.last_log_index));
    // The old cluster goes on granting after the backup, into a window
    // the backup does not know, then is lost.
    let backup_window_end = info.state_clock_ms / WINDOW_MS * WINDOW_MS + WINDOW_MS;
    tokio::time::sleep(Duration::from_millis(
        (backup_window_end + 300).saturating_sub(wall_now_ms()),
    ))
    .await;
    stop.store(true, Ordering::Relaxed);
    cluster.stop_all().await?;
    let destroyed_at = wall_now_ms();

    let restored_at = wall_now_ms() + 1_000;
    let mut written = None;
    let (_, addr4) = cluster
        .add_member(|dir, addr| {
            written = Some(write_new_cluster(
                dir,
                envelope,
                4,
                addr,
                restored_at,
                StateOrigin::Backup,
            )?);
            Ok(())
        })
        .await?;
    let written = written.context("restored")?;
    ensure!(written.retired == [1, 2, 3].into(), "{written:?}");
    ensure!(written.restored_at_ms >= destroyed_at);
    ensure!(cluster.leader().await? == 4);
    // Load at once, in the window the old cluster was last granting in;
    // grow to three members meanwhile.
    let new_client = client_of(&[addr4]);
    let stop = Arc::new(AtomicBool::new(false));
    load(&new_client, "drill/k", &stop, &acked);
    let loaded_from = tokio::time::Instant::now();
    let mut voters = vec![4];
    for _ in 0..2 {
        grow(&mut cluster, 4, &mut voters).await?;
    }
    ensure!(cluster.leader().await? == 4);
    let status = cluster.status(6).await?;
    ensure!(status.retired_member_ids == vec![1, 2, 3], "{status:?}");
    ensure!(
        status.restored_at_ms == written.restored_at_ms,
        "{status:?}"
    );
    tokio::time::sleep_until(loaded_from + Duration::from_millis(2 * WINDOW_MS + 1_500)).await;
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    check_oracle(&acked, restored_at + WINDOW_MS)?;

    // The long window the backup held: its grants kept, sealed.
    let window = new_client.get_window(KEPT_KEY).await?;
    ensure!(window.granted == 7 && window.limit == 0, "{window:?}");
    ensure!(new_client.lease(KEPT_KEY, "r0", 1).await?.granted == 0);
    Ok(())
}

/// A patient client of these members.
fn client_of(addrs: &[String]) -> CoordinatorClient {
    CoordinatorClient::with_options(
        addrs,
        Arc::new(leasehold_client::transport::TcpDialer::default()),
        crate::harness::patient(),
    )
    .expect("valid endpoints")
}

/// Two of three members lost for good (their data gone): the survivor,
/// stopped, is forced into a one-member cluster from its own store, leads,
/// and grows back with new members; Σ ≤ L in every window across the old
/// cluster and the new one, and the lost ids are refused for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_survivor_forced_into_a_new_cluster_keeps_sigma_within_l() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("drill/", LIMIT, WINDOW_MS))
        .await?;
    let acked: Acked = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    load(&client, "drill/k", &stop, &acked);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // The survivor falls behind: the two members that will be lost go on
    // granting without it, into a window it never hears of, then are lost
    // with their data.
    let leader = cluster.leader().await?;
    let survivor = (1..=3).find(|id| *id != leader).expect("a follower");
    cluster.stop(survivor).await?;
    let window_end = acked.lock().unwrap().keys().max().copied().unwrap_or(0) + WINDOW_MS;
    tokio::time::sleep(Duration::from_millis(
        (window_end + 300).saturating_sub(wall_now_ms()),
    ))
    .await;
    stop.store(true, Ordering::Relaxed);
    for id in (1..=3).filter(|id| *id != survivor) {
        cluster.stop(id).await?;
    }

    let dir = cluster.data_dir(survivor);
    let state = survivor_state(&dir).await?;
    let restored_at = wall_now_ms() + 1_000;
    let written = write_new_cluster(
        &dir,
        state,
        survivor,
        &cluster.addr(survivor),
        restored_at,
        StateOrigin::Survivor,
    )?;
    let lost: std::collections::BTreeSet<u64> = (1..=3).filter(|id| *id != survivor).collect();
    ensure!(written.retired == lost, "{written:?}");
    ensure!(written.previous_store.as_ref().is_some_and(|p| p.exists()));
    cluster.restart(survivor).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while cluster
        .status(survivor)
        .await
        .map(|s| s.state)
        .ok()
        .as_deref()
        != Some("Leader")
    {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "the survivor never led"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Load at once, in the window the lost members were last granting in.
    let new_client = client_of(&[cluster.addr(survivor)]);
    let stop = Arc::new(AtomicBool::new(false));
    load(&new_client, "drill/k", &stop, &acked);
    let loaded_from = tokio::time::Instant::now();
    let mut voters = vec![survivor];
    let added = grow(&mut cluster, survivor, &mut voters).await?;
    let status = cluster.status(added).await?;
    ensure!(
        status.retired_member_ids == lost.iter().copied().collect::<Vec<_>>(),
        "{status:?}"
    );
    tokio::time::sleep_until(loaded_from + Duration::from_millis(2 * WINDOW_MS + 1_500)).await;
    stop.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_millis(100)).await;
    check_oracle(&acked, restored_at + WINDOW_MS)?;
    Ok(())
}

/// Runs the binary; returns (exit code, stdout, stderr).
fn leasehold(args: &[&str]) -> Result<(i32, String, String)> {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args(args)
        .output()
        .context("run leasehold")?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8(output.stdout)?,
        String::from_utf8(output.stderr)?,
    ))
}

/// The operator's commands: `snapshot save` writes a file `inspect` reads
/// back; a damaged copy is refused by name; `restore` refuses an id of the
/// old cluster and a used data directory, and writes a new member's store
/// otherwise; `force-new-cluster` will not run without its loud flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_snapshot_commands_save_inspect_and_restore() -> Result<()> {
    let cluster = Cluster::start_initialised(3, |_| {}).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("drill/", LIMIT, LONG_WINDOW_MS))
        .await?;
    ensure!(client.lease("drill/a", "eu", 3).await?.granted == 3);
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("leasehold.backup");
    let file_arg = file.to_str().context("utf-8 path")?;
    // A follower first: the backup still comes from the leader.
    let leader = cluster.leader().await?;
    let mut members = cluster.member_list();
    members.sort_by_key(|(id, _)| *id == leader);
    let endpoints = members
        .iter()
        .map(|(_, addr)| addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let (code, out, err) = leasehold(&[
        "snapshot",
        "save",
        "--endpoint",
        &endpoints,
        "--out",
        file_arg,
        "--output",
        "json",
    ])?;
    ensure!(code == 0, "{err}");
    let saved: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(
        saved["linearizable"] == true && saved["live_windows"] == 1,
        "{saved}"
    );
    ensure!(saved["taken_from"] == leader, "{saved}");
    // Asked of a follower alone with --any-member: its applied state.
    let follower_file = dir.path().join("follower.backup");
    let (code, out, err) = leasehold(&[
        "snapshot",
        "save",
        "--any-member",
        "--endpoint",
        &members[0].1,
        "--out",
        follower_file.to_str().context("utf-8 path")?,
        "--output",
        "json",
    ])?;
    ensure!(code == 0, "{err}");
    let follower: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(
        follower["linearizable"] == false && follower["taken_from"] == members[0].0,
        "{follower}"
    );
    ensure!(saved["bytes"].as_u64() == Some(std::fs::metadata(&file)?.len()));
    #[cfg(unix)]
    {
        // A backup holds every policy and session: its owner's alone.
        use std::os::unix::fs::PermissionsExt;
        for backup in [&file, &follower_file] {
            let mode = std::fs::metadata(backup)?.permissions().mode() & 0o777;
            ensure!(mode == 0o600, "{} has mode {mode:o}", backup.display());
        }
    }

    // Scheduled backups: named by the time, the newest `--keep` kept.
    let scheduled = dir.path().join("scheduled");
    std::fs::create_dir(&scheduled)?;
    let scheduled_arg = scheduled.to_str().context("utf-8 path")?;
    for _ in 0..3 {
        let (code, out, err) = leasehold(&[
            "snapshot",
            "save",
            "--endpoint",
            &endpoints,
            "--out-dir",
            scheduled_arg,
            "--keep",
            "2",
            "--output",
            "json",
        ])?;
        ensure!(code == 0, "{err}");
        let saved: serde_json::Value = serde_json::from_str(&out)?;
        let written = saved["file"].as_str().context("the file written")?;
        ensure!(std::path::Path::new(written).exists(), "{saved}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let kept = std::fs::read_dir(&scheduled)?.count();
    ensure!(kept == 2, "--keep 2 left {kept} backups");
    let (code, _, err) = leasehold(&["snapshot", "save", "--endpoint", &endpoints])?;
    ensure!(code == 2 && err.contains("--out"), "{code}: {err}");

    let (code, out, err) = leasehold(&["snapshot", "inspect", file_arg, "--output", "json"])?;
    ensure!(code == 0, "{err}");
    let inspected: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(
        inspected["last_log_index"] == saved["last_log_index"],
        "{inspected} {saved}"
    );
    ensure!(
        inspected["voter_ids"] == serde_json::json!([1, 2, 3]),
        "{inspected}"
    );

    let mut damaged = std::fs::read(&file)?;
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x40;
    let damaged_file = dir.path().join("damaged.backup");
    std::fs::write(&damaged_file, damaged)?;
    let (code, _, err) = leasehold(&["snapshot", "inspect", damaged_file.to_str().unwrap()])?;
    ensure!(
        code == 1 && err.contains("checksum does not match"),
        "{code}: {err}"
    );

    let restored = dir.path().join("member-9");
    let restored_arg = restored.to_str().unwrap();
    let restore_at = |id: &str, addr: &str| {
        leasehold(&[
            "snapshot",
            "restore",
            "--from",
            file_arg,
            "--data-dir",
            restored_arg,
            "--id",
            id,
            "--addr",
            addr,
            "--output",
            "json",
        ])
    };
    let restore = |id: &str| restore_at(id, "127.0.0.1:1");
    // What `serve` would refuse is refused before anything is written.
    for (id, addr, word) in [("0", "127.0.0.1:1", "--id"), ("9", "nonsense", "--addr")] {
        let (code, _, err) = restore_at(id, addr)?;
        ensure!(
            code == 2 && err.contains(word) && !restored.exists(),
            "restore --id {id} --addr {addr}: {code}: {err}"
        );
    }
    let (code, _, err) = restore("2")?;
    ensure!(
        code == 1 && err.contains("belongs to the cluster"),
        "{code}: {err}"
    );
    let (code, out, err) = restore("9")?;
    ensure!(code == 0, "{err}");
    let written: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(
        written["retired_member_ids"] == serde_json::json!([1, 2, 3]),
        "{written}"
    );
    ensure!(
        written["last_log_index"] == saved["last_log_index"],
        "{written}"
    );
    let (code, _, err) = restore("10")?;
    ensure!(
        code == 1 && err.contains("already holds a Raft store"),
        "{code}: {err}"
    );

    let (code, _, err) = leasehold(&[
        "force-new-cluster",
        "--data-dir",
        restored_arg,
        "--id",
        "9",
        "--addr",
        "127.0.0.1:1",
    ])?;
    ensure!(
        code == 2 && err.contains("--unsafe-lose-entries-only-the-lost-members-hold"),
        "{code}: {err}"
    );
    Ok(())
}
