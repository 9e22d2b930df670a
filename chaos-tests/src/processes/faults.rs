//! Inflicting a scenario's faults on the processes at their times
//! ([`inflict`]): kills, stops and restarts of members, membership and
//! shard changes as an operator makes them, floods, each recorded in the
//! fault log.

use std::time::Duration;

use anyhow::{Context, Result};
use leasehold_client::coordinator::{AdminClient, CoordinatorClient};
use tonic::Code;

use super::catalogue::{ProcessFault, ProcessScenario};
use super::{fleet, hostile, identities, wall_now_ms, Fleet, KEY};
use crate::history::Recorder;
use crate::sim::shards;

async fn sleep_until_ms(at_ms: u64) {
    let now = wall_now_ms();
    if at_ms > now {
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

/// Member `pick`, or the current leader for `0` (asked for up to 5 s).
async fn resolve(fleet: &Fleet, pick: u64) -> Option<u64> {
    if pick != 0 {
        return Some(pick);
    }
    // An election after an earlier fault may take a few seconds on a
    // loaded machine (processes, not a simulation): wait up to 5 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < deadline {
        if let Some(leader) = fleet.leader().await {
            return Some(leader);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Replaces the voters by `voters`, as an operator would: again while the
/// previous change is still committing (refused `FAILED_PRECONDITION`),
/// for up to five seconds; then, as docs/security.md says, waits until
/// each member the leader named as not holding the change yet shows it in
/// its log (`cluster status` on it), for up to five seconds more.
async fn change_membership(fleet: &Fleet, admin: &AdminClient, voters: &[u64]) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match admin.change_membership(voters, false).await {
            Ok(change) => {
                let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
                for id in change.lagging_member_ids {
                    loop {
                        let status = fleet.status_of(id).await;
                        if status.is_some_and(|s| s.last_log_index >= change.log_index) {
                            break;
                        }
                        anyhow::ensure!(
                            tokio::time::Instant::now() < deadline,
                            "member {id} did not receive membership change {} within 5 s",
                            change.log_index
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                return Ok(());
            }
            Err(e)
                if e.code() == Code::FailedPrecondition
                    && tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// A client of every member, as the operator.
fn operator(fleet: &Fleet) -> Result<CoordinatorClient> {
    Ok(CoordinatorClient::with_options(
        fleet.member_addrs(),
        fleet.dialer_as(&identities::operator()),
        fleet::runner_retry_options(),
    )?)
}

/// The admin API of member `id` alone, as the operator.
fn member_admin(fleet: &Fleet, id: u64) -> Result<AdminClient> {
    let addr = fleet
        .member_addr(id)
        .with_context(|| format!("no address for member {id}"))?;
    Ok(CoordinatorClient::with_options(
        vec![addr],
        fleet.dialer_as(&identities::operator()),
        fleet::runner_retry_options(),
    )?
    .admin())
}

/// Records a shard change made at `since_ms`: healed when `served` (the
/// key served again within the bound), else an unfinished action.
fn shard_change_done(recorder: &Recorder, since_ms: u64, what: &str, served: bool) {
    let done = wall_now_ms();
    if served {
        recorder.fault(format!(
            "{since_ms}: {what}; served again after {} ms",
            done - since_ms
        ));
        recorder.healed(done);
    } else {
        recorder.unfinished(format!(
            "{what}: the key not served again within {} ms",
            shards::SHARD_CHANGE_BOUND_MS
        ));
    }
}

/// A fault that runs in the background until the load ends; it answers
/// a line for the fault log.
type Background = tokio::task::JoinHandle<String>;

/// Applies the scenario's faults at their times; faults that last until
/// the load ends leave their tasks in `background`.
pub(super) async fn inflict(
    fleet: &mut Fleet,
    admin: &AdminClient,
    scenario: &ProcessScenario,
    recorder: &Recorder,
    (load_start_ms, load_end_ms): (u64, u64),
    background: &mut Vec<Background>,
) -> Result<()> {
    let mut joiner: Option<(u64, String)> = None;
    for (at, fault) in &scenario.faults {
        sleep_until_ms(load_start_ms + u64::try_from(at.as_millis()).unwrap_or(0)).await;
        fleet.check_alive()?;
        let now = wall_now_ms();
        match fault {
            ProcessFault::Kill(p) => {
                let id = resolve(fleet, *p).await.context("no leader to kill")?;
                fleet.kill_member(id)?;
                recorder.fault(format!("{now}: kill -9 member {id}"));
            }
            ProcessFault::KillAll => {
                for id in fleet.responsive_members() {
                    fleet.kill_member(id)?;
                }
                recorder.fault(format!("{now}: kill -9 every member"));
            }
            ProcessFault::Stop(p) => {
                let id = resolve(fleet, *p).await.context("no leader to stop")?;
                fleet.stop_member(id)?;
                recorder.fault(format!("{now}: SIGSTOP member {id}"));
            }
            ProcessFault::Continue => {
                fleet.continue_members()?;
                recorder.fault(format!("{now}: SIGCONT"));
                recorder.healed(now);
            }
            ProcessFault::Restart => {
                fleet.restart_members()?;
                recorder.fault(format!("{now}: restart killed members"));
                recorder.healed(now);
            }
            ProcessFault::KillEscrow(index) => {
                fleet.kill_escrow(*index)?;
                recorder.fault(format!("{now}: kill -9 escrow node {index}"));
            }
            ProcessFault::TermEscrow(index) => {
                fleet.terminate_escrow(*index).await?;
                recorder.fault(format!("{now}: SIGTERM escrow node {index}"));
            }
            ProcessFault::StopEscrow(index) => {
                fleet.stop_escrow(*index)?;
                recorder.fault(format!("{now}: SIGSTOP escrow node {index}"));
            }
            ProcessFault::ContinueEscrows => {
                fleet.continue_escrows()?;
                recorder.fault(format!("{now}: SIGCONT escrow nodes"));
                recorder.healed(now);
            }
            ProcessFault::RestartEscrows => {
                fleet.restart_escrows()?;
                recorder.fault(format!("{now}: restart escrow nodes"));
                recorder.healed(now);
            }
            ProcessFault::StepDown => {
                let old = resolve(fleet, 0).await.context("no leader to step down")?;
                let new = admin
                    .step_down(Some(old))
                    .await
                    .with_context(|| format!("member {old} stepping down"))?;
                let done = wall_now_ms();
                recorder.fault(format!(
                    "{now}: member {old} steps down; {new} leads from {done}"
                ));
                recorder.healed(done);
            }
            ProcessFault::StartJoiner => {
                let (id, addr) = fleet.start_joiner()?;
                recorder.fault(format!("{now}: member {id} starts, told to join"));
                joiner = Some((id, addr));
            }
            ProcessFault::AddJoiner => {
                let (id, addr) = joiner.clone().context("no joiner started")?;
                admin
                    .add_learner(id, &addr)
                    .await
                    .with_context(|| format!("adding member {id}"))?;
                let voters: Vec<u64> = fleet
                    .member_ids()
                    .into_iter()
                    .filter(|m| !fleet.retired_members().contains(m))
                    .collect();
                change_membership(fleet, admin, &voters)
                    .await
                    .with_context(|| format!("making member {id} a voter"))?;
                recorder.fault(format!("{now}: member {id} joins: voters {voters:?}"));
            }
            ProcessFault::Retire(p) => {
                let id = resolve(fleet, *p).await.context("no leader to retire")?;
                let voters: Vec<u64> = fleet
                    .member_ids()
                    .into_iter()
                    .filter(|m| *m != id && !fleet.retired_members().contains(m))
                    .collect();
                change_membership(fleet, admin, &voters)
                    .await
                    .with_context(|| format!("retiring member {id}"))?;
                fleet.retire_member(id)?;
                recorder.fault(format!("{now}: member {id} retired: voters {voters:?}"));
            }
            ProcessFault::SplitKeyShard => {
                let in_time = || wall_now_ms() < load_end_ms;
                let members = fleet.member_ids().len() as u64;
                let made = shards::split_key_shard(admin, members, in_time).await;
                anyhow::ensure!(made, "the split of the key's shard was not made");
                let served =
                    shards::key_served_within_bound(&operator(fleet)?, now, wall_now_ms).await;
                shard_change_done(recorder, now, "split of the key's shard", served);
            }
            ProcessFault::DropKeyShardLeader => {
                let in_time = || wall_now_ms() < load_end_ms;
                let members = fleet.member_ids();
                let members_admin = members
                    .iter()
                    .map(|id| member_admin(fleet, *id))
                    .collect::<Result<Vec<_>>>()?;
                let made = shards::drop_key_shard_leader(
                    admin,
                    &members_admin,
                    members.len() as u64,
                    in_time,
                )
                .await
                .context("the replica change was not made")?;
                recorder.fault(format!("{now}: {made:?}"));
                let served =
                    shards::new_replicas_lead_within_bound(&members_admin, &made, now, wall_now_ms)
                        .await
                        && shards::key_served_within_bound(&operator(fleet)?, now, wall_now_ms)
                            .await;
                shard_change_done(recorder, now, "replica change dropping the leader", served);
            }
            ProcessFault::LoseQuorum => {
                let leader = resolve(fleet, 0).await.context("no leader")?;
                let survivor = fleet
                    .responsive_members()
                    .into_iter()
                    .find(|id| *id != leader)
                    .context("no follower to survive")?;
                fleet.kill_member(survivor)?;
                recorder.fault(format!("{now}: kill -9 member {survivor}: it falls behind"));
                // The others grant on into a window it never hears of;
                // the survivor is back within that window.
                let window_ms = recorder.window_ms().max(1);
                sleep_until_ms((wall_now_ms() / window_ms + 1) * window_ms + 300).await;
                let lost: Vec<u64> = fleet
                    .responsive_members()
                    .into_iter()
                    .filter(|id| *id != survivor)
                    .collect();
                let restored_at_ms = fleet.force_new_cluster(survivor, &lost, 200)?;
                let done = wall_now_ms();
                recorder.forced_new_cluster(restored_at_ms.saturating_add(window_ms));
                recorder.fault(format!(
                    "{done}: members {lost:?} lost with their data; member {survivor} forced into a new cluster, windows sealed as of {restored_at_ms}"
                ));
                recorder.healed(done);
            }
            ProcessFault::ForgeRaft => {
                let identities = fleet.identities().context("ForgeRaft needs mutual TLS")?;
                let mut forgers: Vec<hostile::Forger> = fleet
                    .retired_members()
                    .into_iter()
                    .map(|id| hostile::Forger {
                        certificate: id,
                        claims: id,
                        kind: "retired",
                    })
                    .collect();
                forgers.push(hostile::Forger {
                    certificate: identities::STRANGER,
                    claims: identities::STRANGER,
                    kind: "stranger",
                });
                let running = fleet.responsive_members();
                if let [first, second, ..] = running[..] {
                    forgers.push(hostile::Forger {
                        certificate: second,
                        claims: first,
                        kind: "impostor",
                    });
                }
                let targets: Vec<String> = running
                    .iter()
                    .filter_map(|id| fleet.member_addr(*id))
                    .collect();
                let sent =
                    hostile::forge_raft_messages(identities, &targets, &forgers, recorder).await;
                recorder.fault(format!(
                    "{now}: {sent} forged Raft messages to members {running:?} from {:?}",
                    forgers
                        .iter()
                        .map(|f| (f.kind, f.certificate))
                        .collect::<Vec<_>>()
                ));
            }
            ProcessFault::StallHandshakes(per_member) => {
                let targets = fleet.member_addrs();
                let stalled = hostile::stall_handshakes(targets, *per_member, load_end_ms);
                let per_member = *per_member;
                background.push(tokio::spawn(async move {
                    let opened = stalled.await.unwrap_or(0);
                    format!(
                        "{now}..{load_end_ms}: {per_member} stalled handshakes per member from 127.0.0.2 ({opened} connections opened)"
                    )
                }));
                recorder.fault(format!("{now}: stalling handshakes"));
            }
            ProcessFault::FloodHolders(index) => {
                let addr = fleet
                    .escrow_addrs()
                    .get(*index)
                    .cloned()
                    .with_context(|| format!("no escrow node {index}"))?;
                let region = scenario.escrow_regions[*index];
                let flooder =
                    identities::service(identities::FLOOD_SERVICE, &format!("region-{region}"))?;
                let flood = hostile::flood_holders(
                    fleet.dialer_as(&flooder),
                    addr,
                    KEY,
                    *index,
                    load_end_ms,
                    recorder.clone(),
                );
                let index = *index;
                background.push(tokio::spawn(async move {
                    let counts = flood.await.unwrap_or_default();
                    format!(
                        "{now}..{load_end_ms}: holder flood at escrow node {index}: {} acquires, {} tokens granted, {} refused RESOURCE_EXHAUSTED",
                        counts.sent, counts.granted, counts.refused_exhausted
                    )
                }));
                recorder.fault(format!("{now}: flooding escrow node {index} with holders"));
            }
        }
    }
    Ok(())
}
