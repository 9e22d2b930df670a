//! Shards on real members (ADR 0025): shard 0 split into a shard that
//! three of four members replicate. The moved keys keep their windows —
//! the new owner continues them — member 1, which does not host the new
//! shard, refuses its keys `NOT_OWNER` with the shard and the placement
//! version, a batch mixing shards is answered item by item by each
//! shard, a retry is answered by the group that executed it, and the
//! shard survives the loss of its leader with its windows.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use leasehold_core::shard::{slot_of, SLOTS};
use leasehold_proto::refusal::{detail, reason_of, status_of_item, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::admin_client::AdminClient as AdminRpc;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use leasehold_proto::v1::monitor_client::MonitorClient;
use leasehold_proto::v1::watch_request::Target;
use tonic::transport::Channel;

use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

async fn channel(addr: &str) -> Result<Channel> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect()
            .await?,
    )
}

fn lease(key: &str, tokens: u64, seq: Option<u64>) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: key.into(),
        region: "eu".into(),
        tokens,
        request_id: seq.map(|seq| pb::RequestId {
            client_id: "shards-test".into(),
            seq,
        }),
    }
}

/// The change of `shard`'s replicas to `replicas`, made against `version`.
fn set_replicas(
    version: u64,
    shard: u32,
    replicas: impl Into<Vec<u64>>,
) -> pb::ChangePlacementRequest {
    pb::ChangePlacementRequest {
        expected_version: version,
        change: Some(pb::change_placement_request::Change::SetReplicas(
            pb::SetShardReplicas {
                shard,
                replicas: replicas.into(),
            },
        )),
    }
}

/// The split of shard 0 into shard 1 on `replicas`, made against version 0.
fn split_zero_into_one(replicas: &[u64]) -> pb::ChangePlacementRequest {
    pb::ChangePlacementRequest {
        expected_version: 0,
        change: Some(pb::change_placement_request::Change::Split(
            pb::SplitShard {
                shard: 0,
                into: 1,
                replicas: replicas.to_vec(),
            },
        )),
    }
}

/// A cluster of `members`, its `k` prefix at 10 per window, and a client.
async fn cluster_with_policy(
    members: u64,
) -> Result<(Cluster, leasehold_client::coordinator::CoordinatorClient)> {
    let cluster = Cluster::start_initialised(members, |_| {}).await?;
    let client = cluster.client()?;
    client
        .admin()
        .set_policy(counter_policy("k", 10, LONG_WINDOW_MS))
        .await?;
    Ok((cluster, client))
}

/// The first key `k<i>` a split of shard 0 moves out (or keeps).
fn key_that_moves(moving: bool) -> String {
    (0..)
        .map(|i| format!("k{i}"))
        .find(|k| (slot_of(k) >= SLOTS / 2) == moving)
        .expect("some key")
}

/// Leases `key` on `addr` until it is neither refused `NOT_OWNER` nor
/// `NOT_LEADER` nor unavailable (the shard forming, acquiring, electing).
async fn lease_when_served(addr: &str, key: &str, tokens: u64) -> Result<pb::LeaseResponse> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut rpc = CoordinatorRpc::new(channel(addr).await?);
    loop {
        match rpc.lease(lease(key, tokens, None)).await {
            Ok(response) => return Ok(response.into_inner()),
            Err(status) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(%status, "not served yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => bail!("{key} never served on {addr}: {status}"),
        }
    }
}

/// Reads `key`'s window at `shard`'s leader (as member 2 names it) until
/// the leader serves it (the window is refused while the slot moves),
/// spending nothing; returns the leader's address.
async fn served_by_leader(cluster: &Cluster, shard: u32, key: &str) -> Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, leader) = shard_leader(cluster, 2, shard).await?;
        let mut rpc = CoordinatorRpc::new(channel(&leader).await?);
        let request = pb::GetWindowRequest { key: key.into() };
        match rpc.get_window(request).await {
            Ok(_) => return Ok(leader),
            Err(status) if tokio::time::Instant::now() < deadline => {
                tracing::debug!(%status, "not served yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(status) => bail!("{key} never served by shard {shard}: {status}"),
        }
    }
}

/// The leader of `shard` as member `via` reports it, once known.
async fn shard_leader(cluster: &Cluster, via: u64, shard: u32) -> Result<(u64, String)> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut rpc = CoordinatorRpc::new(channel(&cluster.addr(via)).await?);
    loop {
        if let Ok(placement) = rpc.get_placement(pb::GetPlacementRequest {}).await {
            let placement = placement.into_inner();
            let info = placement.shards.iter().find(|s| s.id == shard);
            if let Some(pb::ShardInfo {
                leader_id: Some(id),
                leader_addr,
                ..
            }) = info
            {
                return Ok((*id, leader_addr.clone()));
            }
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "member {via} never knew shard {shard}'s leader"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_shard_serves_its_keys_with_their_windows_on_its_replicas() -> Result<()> {
    let (mut cluster, _client) = cluster_with_policy(4).await?;
    let (low, high) = (key_that_moves(false), key_that_moves(true));
    let meta_leader = cluster.leader().await?;
    let mut meta = CoordinatorRpc::new(channel(&cluster.addr(meta_leader)).await?);
    let before_split = meta.lease(lease(&high, 7, Some(1))).await?.into_inner();
    assert_eq!(before_split.granted, 7);
    meta.lease(lease(&low, 7, None)).await?;

    let mut admin_rpc = AdminRpc::new(channel(&cluster.addr(meta_leader)).await?);
    let placement = admin_rpc
        .change_placement(split_zero_into_one(&[2, 3, 4]))
        .await?
        .into_inner();
    assert_eq!(placement.version, 1);
    assert_eq!(
        placement.slots,
        vec![
            pb::SlotRange {
                start: 0,
                end: 8_192,
                shard: 0
            },
            pb::SlotRange {
                start: 8_192,
                end: 16_384,
                shard: 1
            },
        ]
    );
    let stale = admin_rpc
        .change_placement(pb::ChangePlacementRequest {
            expected_version: 0,
            change: Some(pb::change_placement_request::Change::RemoveShard(
                pb::RemoveShard { shard: 1 },
            )),
        })
        .await
        .expect_err("a stale version is refused");
    assert_eq!(reason_of(&stale), Some(Reason::PlacementRefused));

    // The new shard forms on members 2 and 3 and continues the window.
    let (leader, leader_addr) = shard_leader(&cluster, 2, 1).await?;
    ensure!((2..=4).contains(&leader), "shard 1 led by member {leader}");
    let after = lease_when_served(&leader_addr, &high, 5).await?;
    assert_eq!(
        after.granted, 3,
        "the 7 granted before the split moved with the window"
    );
    assert_eq!(after.window_start_ms, before_split.window_start_ms);

    // Member 1 hosts no replica of shard 1.
    let mut member_one = CoordinatorRpc::new(channel(&cluster.addr(1)).await?);
    let refused = member_one
        .lease(lease(&high, 1, None))
        .await
        .expect_err("member 1 does not serve shard 1");
    assert_eq!(reason_of(&refused), Some(Reason::NotOwner));
    assert_eq!(detail(&refused, "shard").as_deref(), Some("1"));
    assert_eq!(detail(&refused, "placement_version").as_deref(), Some("1"));

    // The client crate, told of member 1 only, reaches shard 1 by the
    // hints and reads the placement; a batch mixing shards is cut by shard.
    let routed = leasehold_client::coordinator::CoordinatorClient::with_options(
        [cluster.addr(1)],
        std::sync::Arc::new(leasehold_client::transport::TcpDialer::default()),
        crate::harness::patient(),
    )?;
    let other_high = (0..)
        .map(|i| format!("k-other{i}"))
        .find(|k| slot_of(k) >= SLOTS / 2)
        .context("a key")?;
    assert_eq!(routed.lease(&other_high, "eu", 3).await?.granted, 3);
    assert_eq!(routed.lease(&other_high, "eu", 1).await?.granted, 1);
    assert_eq!(
        (routed.placement_version(), routed.shard_of(&other_high)),
        (1, 1),
        "the placement a refusal named was read before the next call"
    );
    let batch = routed
        .lease_batch(&[
            leasehold_client::coordinator::LeaseItem {
                key: other_high.clone(),
                region: "eu".into(),
                tokens: 10,
            },
            leasehold_client::coordinator::LeaseItem {
                key: low.clone(),
                region: "eu".into(),
                tokens: 1,
            },
        ])
        .await?;
    assert_eq!(batch[0].as_ref().map(|g| g.granted).ok(), Some(6));
    assert_eq!(batch[1].as_ref().map(|g| g.granted).ok(), Some(1));

    // A retry of a request executed before the split, sent to the key's
    // new owner: its first answer (the session moved with the slot).
    let mut at_owner = CoordinatorRpc::new(channel(&leader_addr).await?);
    let retried = at_owner.lease(lease(&high, 7, Some(1))).await?.into_inner();
    assert_eq!(retried, before_split);

    // A batch mixing shards, sent to shard 1's leader: its key is served
    // there; shard 0's key by shard 0 on that member (its leader or not).
    let mut at_shard_leader = CoordinatorRpc::new(channel(&leader_addr).await?);
    let batch = at_shard_leader
        .lease_batch(pb::LeaseBatchRequest {
            items: vec![lease(&high, 1, None), lease(&low, 1, None)],
        })
        .await?
        .into_inner();
    let high_result = batch.results[0].result.clone().context("a result")?;
    assert!(
        matches!(high_result, pb::lease_item_result::Result::Granted(ref g) if g.granted == 0),
        "{high_result:?}"
    );
    match batch.results[1].result.clone().context("a result")? {
        pb::lease_item_result::Result::Granted(grant) => {
            ensure!(meta_leader == leader, "only shard 0's leader grants");
            assert_eq!(grant.granted, 1);
        }
        pb::lease_item_result::Result::Refused(item) => {
            assert_eq!(reason_of(&status_of_item(&item)), Some(Reason::NotLeader));
        }
    }

    // Shard 1 loses its leader: the other replica leads with the window.
    cluster.stop(leader).await?;
    let (_, new_leader_addr) = loop {
        let survivor = if leader == 2 { 3 } else { 2 };
        let (id, addr) = shard_leader(&cluster, survivor, 1).await?;
        if id != leader {
            break (id, addr);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let exhausted = lease_when_served(&new_leader_addr, &high, 100).await?;
    assert_eq!(exhausted.granted, 0, "the window is spent: 7 + 3 of 10");
    cluster.stop_all().await?;
    Ok(())
}

fn leasehold(args: &[&str]) -> Result<std::process::Output> {
    Ok(std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_INSECURE", "true")
        .args(args)
        .output()?)
}

fn leasehold_ok(args: &[&str]) -> Result<String> {
    let output = leasehold(args)?;
    ensure!(
        output.status.success(),
        "leasehold {args:?} failed: {}{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    Ok(String::from_utf8(output.stdout)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_splits_a_shard_and_its_keys_are_served_through_any_member() -> Result<()> {
    let mut cluster = Cluster::start_initialised(3, |_| {}).await?;
    cluster.leader().await?;
    let endpoint = format!("http://{}", cluster.addr(1));
    let high = key_that_moves(true);
    let out = tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
        let e = endpoint.as_str();
        let before = leasehold_ok(&["shard", "list", "-e", e])?;
        leasehold_ok(&[
            "policy",
            "set",
            "-e",
            e,
            "--prefix",
            "k",
            "--limit",
            "9",
            "--window-ms",
            "3600000",
        ])?;
        let split = leasehold_ok(&[
            "shard",
            "split",
            "-e",
            e,
            "--into",
            "1",
            "--replicas",
            "2,3",
            "--output",
            "json",
        ])?;
        let stale = leasehold(&[
            "shard",
            "remove",
            "-e",
            e,
            "--shard",
            "1",
            "--expect-version",
            "0",
        ])?;
        ensure!(!stale.status.success(), "a stale version is refused");
        let stale = String::from_utf8_lossy(&stale.stderr).to_string();
        let lease = leasehold_ok(&[
            "lease", "-e", e, "--key", &high, "--region", "eu", "--tokens", "4", "--output", "json",
        ])?;
        let after = leasehold_ok(&["shard", "list", "-e", e])?;
        Ok(vec![before, split, stale, lease, after])
    })
    .await??;
    ensure!(
        out[0].contains("placement version 0 (never sharded"),
        "{}",
        out[0]
    );
    let split: serde_json::Value = serde_json::from_str(&out[1])?;
    ensure!(split["version"] == 1, "{split}");
    ensure!(split["slots"][1]["shard"] == 1, "{split}");
    ensure!(out[2].contains("version 1, not 0"), "{}", out[2]);
    let lease: serde_json::Value = serde_json::from_str(&out[3])?;
    ensure!(lease["granted"] == 4, "{lease}");
    ensure!(
        out[4].contains("shard    1   8192 slots  replicas 2,3"),
        "{}",
        out[4]
    );
    cluster.stop_all().await
}

/// A client that knows one member, which hosts no replica of the new
/// shard, is served on its first call right after the split: its retries
/// follow the hints (a replica, the shard's leader) while the shard forms
/// and acquires, and the refusals meanwhile are not remembered as the
/// answer to its request id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_call_after_a_split_is_served_while_the_shard_forms() -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(3).await?;
    let high = key_that_moves(true);
    client
        .admin()
        .change_placement(split_zero_into_one(&[2, 3]))
        .await?;
    let routed = leasehold_client::coordinator::CoordinatorClient::new(
        [cluster.addr(1)],
        std::sync::Arc::new(leasehold_client::transport::TcpDialer::default()),
    )?;
    assert_eq!(routed.lease(&high, "eu", 6).await?.granted, 6);
    assert_eq!(routed.lease(&high, "eu", 6).await?.granted, 4);
    cluster.stop_all().await
}

/// A shard's replicas change from members 2, 3, 4 to 1, 2, 3: member 1
/// joins the group (a learner first), member 4 leaves it and stops
/// serving the shard, and the shard's windows stay whole throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_moves_to_other_replicas_with_its_windows() -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(4).await?;
    let admin = client.admin();
    let high = key_that_moves(true);
    admin
        .change_placement(split_zero_into_one(&[2, 3, 4]))
        .await?;
    assert_eq!(client.lease(&high, "eu", 6).await?.granted, 6);
    admin
        .change_placement(set_replicas(1, 1, vec![1, 2, 3]))
        .await?;
    // Member 1 comes to know shard 1's leader: it hosts a replica now.
    shard_leader(&cluster, 1, 1).await?;
    // Member 4 stops serving shard 1.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let mut member_four = CoordinatorRpc::new(channel(&cluster.addr(4)).await?);
    loop {
        let answer = member_four.lease(lease(&high, 1, None)).await;
        if let Err(status) = &answer {
            if reason_of(status) == Some(Reason::NotOwner) {
                break;
            }
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "member 4 still serves shard 1: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.stop(4).await?;
    let granted = client.lease(&high, "eu", 10).await?.granted;
    ensure!(
        granted <= 4,
        "the window kept its grants across the replica change: {granted} more granted"
    );
    cluster.stop_all().await
}

/// Shard 1 (on members 2, 3 and 4) is split again into shard 2 on two of
/// its replicas: shard 1 releases the upper half of its slots in its own
/// log and shard 2's leader acquires them from its replica of shard 1.
/// The moved key's window continues, a retry of a request shard 1
/// executed is answered by shard 1, and a split onto a member that is no
/// replica of shard 1 is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_split_again_continues_its_windows_and_answers_retries_of_the_first_owner(
) -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(4).await?;
    let admin = client.admin();
    let top = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| slot_of(k) >= SLOTS / 4 * 3)
        .expect("some key");
    admin
        .change_placement(split_zero_into_one(&[2, 3, 4]))
        .await?;
    let one_leader = served_by_leader(&cluster, 1, &top).await?;
    let mut rpc = CoordinatorRpc::new(channel(&one_leader).await?);
    let first = rpc.lease(lease(&top, 3, Some(1))).await?.into_inner();
    assert_eq!(first.granted, 3);

    let split_one = |replicas: Vec<u64>| pb::ChangePlacementRequest {
        expected_version: 1,
        change: Some(pb::change_placement_request::Change::Split(
            pb::SplitShard {
                shard: 1,
                into: 2,
                replicas,
            },
        )),
    };
    let refused = admin
        .change_placement(split_one(vec![1, 2]))
        .await
        .expect_err("member 1 is no replica of shard 1");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");
    assert!(refused.to_string().contains("replicas"), "{refused}");
    let placement = admin.change_placement(split_one(vec![2, 3])).await?;
    assert_eq!(placement.version, 2);

    // Shard 2 serves the key once it has acquired it, continuing its
    // window: 3 of 10 were granted by shard 1.
    let two_leader = served_by_leader(&cluster, 2, &top).await?;
    let mut rpc = CoordinatorRpc::new(channel(&two_leader).await?);
    let rest = rpc.lease(lease(&top, 10, Some(2))).await?.into_inner();
    assert_eq!(rest.granted, 7, "the window kept shard 1's grants");
    // The retry of shard 1's request gets shard 1's answer, not a second
    // execution (which would grant 0 of the spent window).
    let retried = rpc.lease(lease(&top, 3, Some(1))).await?.into_inner();
    assert_eq!(retried, first);
    let placement = admin.placement().await?;
    let owned = |shard: u32| {
        placement
            .shards
            .iter()
            .find(|s| s.id == shard)
            .map_or(0, |s| s.slots)
    };
    assert_eq!((owned(1), owned(2)), (4_096, 4_096));
    // Member 2 reports both shards it hosts in its status.
    let mut member_two = AdminRpc::new(channel(&cluster.addr(2)).await?);
    let status = member_two.status(pb::StatusRequest {}).await?.into_inner();
    let hosted: Vec<(u32, u32)> = status
        .shards
        .iter()
        .map(|s| (s.id, s.owned_slots))
        .collect();
    assert_eq!(hosted, vec![(1, 4_096), (2, 4_096)]);
    let top_shard = &status.shards[1];
    assert!(top_shard.live_windows >= 1 && top_shard.current_leader.is_some());
    // A watch on member 2 reads each key from the group serving it: the
    // moved key's window from shard 2, a prefix's from every group.
    let low = key_that_moves(false);
    client.lease(&low, "eu", 2).await?;
    let mut monitor = MonitorClient::new(channel(&cluster.addr(2)).await?);
    let granted_in = |update: &pb::WatchUpdate, key: &str| {
        update
            .windows
            .iter()
            .find(|w| w.key == key)
            .map(|w| w.granted)
    };
    for target in [Target::Key(top.clone()), Target::Prefix("k".into())] {
        let request = pb::WatchRequest {
            target: Some(target.clone()),
        };
        let mut stream = monitor.watch(request).await?.into_inner();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let update = tokio::time::timeout(Duration::from_secs(8), stream.message())
                .await??
                .context("the stream ended")?;
            let seen = (granted_in(&update, &top), granted_in(&update, &low));
            let want = match target {
                Target::Key(_) => (Some(10), seen.1),
                Target::Prefix(_) => (Some(10), Some(2)),
            };
            if seen == want {
                break;
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "{target:?}: {update:?}"
            );
        }
    }
    cluster.stop_all().await
}

/// A client that has never read the placement sends a `LeaseBatch` of
/// keys of shard 1 (formed by member 2, not the meta group's leader as a
/// rule) to the meta group's leader: the member routes them to its replica
/// of shard 1, whose refusals name shard 1, a newer placement and its
/// leader; the client reads the placement and sends the items to shard
/// 1's leader. Every item is granted, in one `lease_batch` call, each
/// time (batches of both shards, mixed, from fresh clients).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_reaches_each_shards_leader_from_a_client_that_knows_no_placement() -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(3).await?;
    client
        .admin()
        .change_placement(split_zero_into_one(&[1, 2, 3]))
        .await?;
    let high = key_that_moves(true);
    served_by_leader(&cluster, 1, &high).await?;
    let keys: Vec<String> = (0..200).map(|i| format!("kb{i}")).collect();
    for round in 0..3 {
        let fresh = cluster.client()?;
        let items: Vec<leasehold_client::coordinator::LeaseItem> = keys
            .iter()
            .map(|key| leasehold_client::coordinator::LeaseItem {
                key: key.clone(),
                region: "eu".into(),
                tokens: 1,
            })
            .collect();
        let answers = fresh.lease_batch(&items).await?;
        let refused: Vec<String> = answers
            .iter()
            .zip(&keys)
            .filter_map(|(answer, key)| answer.as_ref().err().map(|e| format!("{key}: {e}")))
            .collect();
        ensure!(refused.is_empty(), "round {round}: {refused:?}");
        ensure!(answers
            .iter()
            .all(|a| a.as_ref().is_ok_and(|g| g.granted == 1)));
    }
    assert!(
        keys.iter().any(|k| slot_of(k) >= SLOTS / 2) && keys.iter().any(|k| slot_of(k) < SLOTS / 2)
    );
    cluster.stop_all().await
}

/// The change that adds shard `shard` on `replicas` at `version`.
fn add_shard(version: u64, shard: u32, replicas: &[u64]) -> pb::ChangePlacementRequest {
    pb::ChangePlacementRequest {
        expected_version: version,
        change: Some(pb::change_placement_request::Change::AddShard(
            pb::AddShard {
                shard,
                replicas: replicas.to_vec(),
            },
        )),
    }
}

/// Waits until member `via` names `want(leader)` as `shard`'s leader.
async fn until_shard_led(
    cluster: &Cluster,
    via: u64,
    shard: u32,
    within: Duration,
    want: impl Fn(u64) -> bool,
) -> Result<u64> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let (leader, _) = shard_leader(cluster, via, shard).await?;
        if want(leader) {
            return Ok(leader);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "shard {shard} still led by member {leader} after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Shards 1 and 2 on all three members start led by their forming
/// replicas (members 2 and 3). Member 3 stops: shard 2 is led elsewhere.
/// Member 3 comes back leading nothing, and takes shard 2 back once the
/// other leader has held it for `RECLAIM_AFTER`: the leaderships spread
/// out again after a failure. Shard 1 stays with member 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_preferred_leader_that_comes_back_takes_its_shard_back() -> Result<()> {
    use leasehold_node::coordinator::shard::reclaim::RECLAIM_AFTER;
    let (mut cluster, client) = cluster_with_policy(3).await?;
    let admin = client.admin();
    admin.change_placement(add_shard(0, 1, &[1, 2, 3])).await?;
    admin.change_placement(add_shard(1, 2, &[1, 2, 3])).await?;
    let within = Duration::from_secs(20);
    until_shard_led(&cluster, 1, 1, within, |leader| leader == 2).await?;
    until_shard_led(&cluster, 1, 2, within, |leader| leader == 3).await?;
    cluster.stop(3).await?;
    let stand_in = until_shard_led(&cluster, 1, 2, within, |leader| leader != 3).await?;
    cluster.restart(3).await?;
    let back = tokio::time::Instant::now();
    until_shard_led(&cluster, 1, 2, RECLAIM_AFTER + within, |leader| leader == 3)
        .await
        .with_context(|| format!("member {stand_in} kept shard 2"))?;
    let took = back.elapsed();
    tracing::info!(?took, "shard 2 back with its preferred leader");
    ensure!(
        took >= RECLAIM_AFTER.saturating_sub(Duration::from_secs(1)),
        "shard 2 was taken back after {took:?}, before its leader settled"
    );
    until_shard_led(&cluster, 1, 1, within, |leader| leader == 2).await?;
    cluster.stop_all().await
}

/// The reproduction of issue 48: one client id leases seqs 1..=100 of a
/// key on shard 0, the key's half is split into shard 1, and every id is
/// sent again. The new owner answers as the old one would: the 64 ids the
/// session keeps with their first answers (seq 7 leased 3 tokens: its
/// grant, not a second one), the older ones `SESSION_EXPIRED`; the window
/// counts each grant once; a resend that reaches member 1, which does not
/// host shard 1, is sent on with the same id and answered the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_id_resent_after_a_split_is_answered_as_its_first_owner_answered() -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(4).await?;
    client
        .admin()
        .set_policy(counter_policy("k", 1_000, LONG_WINDOW_MS))
        .await?;
    let high = key_that_moves(true);
    let id = |seq| pb::RequestId {
        client_id: "resender".into(),
        seq,
    };
    let tokens = |seq| if seq == 7 { 3 } else { 1 };
    let mut first = Vec::new();
    for seq in 1..=100u64 {
        first.push(
            client
                .lease_with_id(&high, "eu", tokens(seq), id(seq))
                .await?,
        );
    }
    let granted_before: u64 = first.iter().map(|r| r.granted).sum();
    assert_eq!(granted_before, 102);
    client
        .admin()
        .change_placement(split_zero_into_one(&[2, 3, 4]))
        .await?;
    let leader = served_by_leader(&cluster, 1, &high).await?;
    // A client that knows nothing of the placement, sending everywhere.
    let fresh = cluster.client()?;
    for seq in 1..=100u64 {
        let again = fresh.lease_with_id(&high, "eu", tokens(seq), id(seq)).await;
        if seq > 100 - 64 {
            let again = again.with_context(|| format!("seq {seq}"))?;
            ensure!(
                again == first[(seq - 1) as usize],
                "seq {seq}: {again:?}, first {:?}",
                first[(seq - 1) as usize]
            );
        } else {
            let error = again.expect_err("an id below the session's floor");
            ensure!(error.is_session_expired(), "seq {seq}: {error}");
        }
    }
    let mut rpc = CoordinatorRpc::new(channel(&leader).await?);
    let window = rpc
        .get_window(pb::GetWindowRequest { key: high.clone() })
        .await?
        .into_inner();
    ensure!(
        window.granted == granted_before,
        "the window counts {} after the resends, {granted_before} before",
        window.granted
    );
    cluster.stop_all().await
}

/// A replica change that drops the shard's leader completes: shard 1 on
/// members 1, 2, 3 moves to one of them that does not lead it and members
/// 4 and 5 (the new set's forming replica is a newcomer, which before
/// formed a group of its own that nobody joined). The key is served again
/// by a leader among the new replicas within the bound, with its window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_change_that_drops_the_shards_leader_completes() -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(5).await?;
    let admin = client.admin();
    let high = key_that_moves(true);
    admin
        .change_placement(split_zero_into_one(&[1, 2, 3]))
        .await?;
    assert_eq!(client.lease(&high, "eu", 6).await?.granted, 6);
    let (old_leader, _) = shard_leader(&cluster, 2, 1).await?;
    let kept = (1..=3).find(|m| *m != old_leader).expect("a non-leader");
    let replicas = vec![kept, 4, 5];
    let started = tokio::time::Instant::now();
    admin
        .change_placement(set_replicas(1, 1, replicas.clone()))
        .await?;
    let new_leader = led_by_one_of(&cluster, 4, 1, &replicas, started).await?;
    let granted = lease_when_served(&cluster.addr(new_leader), &high, 10).await?;
    let took = started.elapsed();
    ensure!(
        granted.granted == 4,
        "the window kept its 6: {} granted",
        granted.granted
    );
    ensure!(
        took <= Duration::from_secs(SHARD_CHANGE_BOUND_SECS),
        "served again after {took:?}"
    );
    tracing::info!(?took, "served again by the new replicas");
    cluster.stop_all().await
}

/// Replica changes that drop the shard's leader, four in a row, each
/// replacing it by the lowest member not a replica: the second adds back
/// the member the first dropped (its store still holds the group's old
/// log), and later ones drop leaders the shard was not founded with (a
/// member a change added, which the placement then names neither replica
/// nor founder, and which must still make the change that drops it). Each
/// completes within the bound, the group led by one of the replicas the
/// placement names, with the key's window whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_changes_that_drop_each_leader_in_turn_complete() -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(5).await?;
    let admin = client.admin();
    let high = key_that_moves(true);
    admin
        .change_placement(split_zero_into_one(&[1, 2, 3]))
        .await?;
    assert_eq!(client.lease(&high, "eu", 6).await?.granted, 6);
    let mut replicas: Vec<u64> = vec![1, 2, 3];
    let mut dropped = Vec::new();
    for version in 1..=4u64 {
        let (old_leader, _) = shard_leader(&cluster, replicas[0], 1).await?;
        let newcomer = (1..=5)
            .find(|m| !replicas.contains(m) && *m != old_leader)
            .expect("a member outside the replicas");
        replicas.retain(|m| *m != old_leader);
        replicas.push(newcomer);
        replicas.sort_unstable();
        dropped.push(old_leader);
        let started = tokio::time::Instant::now();
        admin
            .change_placement(set_replicas(version, 1, replicas.clone()))
            .await?;
        let new_leader = led_by_one_of(&cluster, replicas[0], 1, &replicas, started)
            .await
            .with_context(|| format!("change {version}"))?;
        let granted = lease_when_served(&cluster.addr(new_leader), &high, 1).await?;
        ensure!(granted.granted == 1, "change {version}: {granted:?}");
        let took = started.elapsed();
        ensure!(
            took <= Duration::from_secs(SHARD_CHANGE_BOUND_SECS),
            "change {version}: served again after {took:?}"
        );
    }
    tracing::info!(?dropped, "leaders dropped in turn");
    let window = client.get_window(&high).await?;
    ensure!(window.granted == 10, "the window counts {}", window.granted);
    cluster.stop_all().await
}

/// A replica change of a shard made right after the split that made it,
/// while its move from a shard other than 0 runs, to members that do not
/// all host the source: the change waits for the move (the founding
/// replicas acquire it), then completes, and the key is served by the new
/// replicas with its window.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_change_right_after_a_split_waits_for_the_move_and_completes() -> Result<()> {
    let (mut cluster, client) = cluster_with_policy(5).await?;
    let admin = client.admin();
    // The top quarter of the slots: shard 0 → shard 1 → shard 2.
    let top = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| slot_of(k) >= SLOTS / 4 * 3)
        .expect("some key");
    admin
        .change_placement(split_zero_into_one(&[1, 2, 3]))
        .await?;
    assert_eq!(client.lease(&top, "eu", 6).await?.granted, 6);
    let started = tokio::time::Instant::now();
    admin
        .change_placement(pb::ChangePlacementRequest {
            expected_version: 1,
            change: Some(pb::change_placement_request::Change::Split(
                pb::SplitShard {
                    shard: 1,
                    into: 2,
                    replicas: vec![1, 2, 3],
                },
            )),
        })
        .await?;
    admin
        .change_placement(set_replicas(2, 2, vec![3, 4, 5]))
        .await?;
    let leader = led_by_one_of(&cluster, 4, 2, &[3, 4, 5], started).await?;
    let granted = lease_when_served(&cluster.addr(leader), &top, 10).await?;
    ensure!(
        granted.granted == 4,
        "the window kept its 6: {} granted",
        granted.granted
    );
    let took = started.elapsed();
    ensure!(
        took <= Duration::from_secs(SHARD_CHANGE_BOUND_SECS),
        "served again after {took:?}"
    );
    cluster.stop_all().await
}

/// Seconds within which every slot is served again after an accepted
/// placement change (docs/operations.md, Shards).
const SHARD_CHANGE_BOUND_SECS: u64 = 10;

/// The leader of `shard` as member `via` names it, once it is one of
/// `replicas`; an error if that takes past the bound from `started`.
async fn led_by_one_of(
    cluster: &Cluster,
    via: u64,
    shard: u32,
    replicas: &[u64],
    started: tokio::time::Instant,
) -> Result<u64> {
    let deadline = started + Duration::from_secs(SHARD_CHANGE_BOUND_SECS);
    loop {
        let (leader, _) = shard_leader(cluster, via, shard).await?;
        if replicas.contains(&leader) {
            return Ok(leader);
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "shard {shard} still led by member {leader}, not one of {replicas:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
