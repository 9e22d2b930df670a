//! Membership changes and leader hand-offs under load: an operator host
//! that carries out the driver's operator faults through the real admin API
//! (add learners, change voters, step down), one at a time, while the
//! clients keep leasing.

use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leasehold_client::coordinator::{AdminClient, CoordinatorClient};
use leasehold_client::transport::Dialer;

use super::{member_addr, shards, sim_now_ms, sim_retry_options, FleetShape, SimDialer};
use crate::history::Recorder;
use crate::plan::MembershipAction;

/// The driver's side: actions are queued here at their fault times.
pub type ActionQueue = Arc<Mutex<VecDeque<MembershipAction>>>;

/// Host name of the operator host.
pub const OPERATOR_HOST: &str = "operator";

/// Adds the operator host: it polls `queue` and applies each action with
/// retries until it succeeds or the load is over.
#[allow(clippy::too_many_arguments)]
pub fn spawn_operator(
    sim: &mut turmoil::Sim<'_>,
    shape: &FleetShape,
    seed: u64,
    queue: &ActionQueue,
    recorder: &Recorder,
    leader: &Arc<AtomicU64>,
    stop_at_ms: u64,
) {
    let (queue, recorder, leader) = (queue.clone(), recorder.clone(), leader.clone());
    let (voters, spares) = (shape.members, shape.spare_members);
    // A sharded fleet's shards 1.. exist from setup on: a new shard of an
    // action is numbered after them.
    let shards_before = shape.shards.max(1) - 1;
    sim.client(OPERATOR_HOST, async move {
        let endpoints: Vec<String> = (1..=voters + spares).map(member_addr).collect();
        let dialer: Arc<dyn Dialer> = Arc::new(SimDialer);
        let client = CoordinatorClient::with_seed(
            endpoints,
            dialer.clone(),
            sim_retry_options(),
            seed.wrapping_add(0x6f70),
        )?;
        let admin = client.admin();
        // One admin per member, asking that member alone (a member knows
        // the leaders of the shards it hosts).
        let members_admin = (1..=voters + spares)
            .map(|id| {
                CoordinatorClient::with_seed(
                    vec![member_addr(id)],
                    dialer.clone(),
                    sim_retry_options(),
                    seed.wrapping_add(0x6f70 + id),
                )
                .map(|client| client.admin())
            })
            .collect::<Result<Vec<_>, _>>()?;
        let in_time = || sim_now_ms() < stop_at_ms;
        let mut current: BTreeSet<u64> = (1..=voters).collect();
        while sim_now_ms() < stop_at_ms {
            let action = queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pop_front();
            let Some(action) = action else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let done = match action {
                MembershipAction::JoinSpares => {
                    let spares: Vec<u64> = (voters + 1..=voters + spares).collect();
                    join(&admin, &mut current, &spares, stop_at_ms).await
                }
                MembershipAction::RemoveVoter(pick) => {
                    let id = pick_voter(pick, &leader, &current);
                    let mut next = current.clone();
                    next.remove(&id);
                    let ok = change(&admin, &next, false, stop_at_ms).await;
                    if ok {
                        current = next;
                    }
                    ok
                }
                MembershipAction::StepDown => step_down(&admin, &leader, stop_at_ms).await,
                MembershipAction::MoveKeyToNewShard { shard, replicas } => {
                    move_key(&admin, shard + shards_before, &replicas, stop_at_ms).await
                }
                MembershipAction::SplitKeyShard => {
                    let since_ms = sim_now_ms();
                    shards::split_key_shard(&admin, voters, in_time).await
                        && shards::key_served_within_bound(&client, since_ms, sim_now_ms).await
                }
                MembershipAction::DropKeyShardLeader => {
                    let since_ms = sim_now_ms();
                    match shards::drop_key_shard_leader(&admin, &members_admin, voters, in_time)
                        .await
                    {
                        Some(made) => {
                            recorder.fault(format!("{}: {made:?}", sim_now_ms()));
                            shards::new_replicas_lead_within_bound(
                                &members_admin,
                                &made,
                                since_ms,
                                sim_now_ms,
                            )
                            .await
                                && shards::key_served_within_bound(&client, since_ms, sim_now_ms)
                                    .await
                        }
                        None => false,
                    }
                }
            };
            let now_ms = sim_now_ms();
            let voters_now: Vec<String> = current.iter().map(|id| format!("n{id}")).collect();
            let voters_now = voters_now.join(",");
            if done {
                recorder.fault(format!("{now_ms}: {action:?} done; voters {voters_now}"));
                recorder.healed(now_ms);
            } else {
                recorder.unfinished(format!("{action:?} (voters {voters_now})"));
            }
        }
        for action in queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            recorder.unfinished(format!("{action:?} (never started)"));
        }
        Ok(())
    });
}

fn pick_voter(pick: u64, leader: &AtomicU64, current: &BTreeSet<u64>) -> u64 {
    if pick != 0 {
        return pick;
    }
    let id = leader.load(Ordering::SeqCst);
    if current.contains(&id) {
        id
    } else {
        current.iter().next().copied().unwrap_or(1)
    }
}

/// Retries `change_membership` until it succeeds or time runs out.
async fn change(
    admin: &AdminClient,
    voters: &BTreeSet<u64>,
    retain: bool,
    stop_at_ms: u64,
) -> bool {
    let ids: Vec<u64> = voters.iter().copied().collect();
    while sim_now_ms() < stop_at_ms {
        if admin.change_membership(&ids, retain).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn join(
    admin: &AdminClient,
    current: &mut BTreeSet<u64>,
    joining: &[u64],
    stop_at_ms: u64,
) -> bool {
    for id in joining {
        let addr = member_addr(*id);
        loop {
            if sim_now_ms() >= stop_at_ms {
                return false;
            }
            if admin.add_learner(*id, &addr).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let mut next = current.clone();
    next.extend(joining.iter().copied());
    let ok = change(admin, &next, false, stop_at_ms).await;
    if ok {
        *current = next;
    }
    ok
}

/// Adds shard `shard` on `replicas`, then moves the slot of the load's
/// key ([`super::KEY`]) to it (from whichever shard holds it), each change
/// retried (against the version read just before) until it is made or
/// time runs out.
async fn move_key(admin: &AdminClient, shard: u32, replicas: &[u64], stop_at_ms: u64) -> bool {
    use leasehold_proto::v1 as pb;
    use pb::change_placement_request::Change;

    let slot = u32::from(leasehold_core::shard::slot_of(super::KEY));
    let changes = [
        Change::AddShard(pb::AddShard {
            shard,
            replicas: replicas.to_vec(),
        }),
        Change::MoveSlots(pb::MoveSlots {
            start: slot,
            end: slot + 1,
            to: shard,
        }),
    ];
    for change in changes {
        if !shards::make_change(admin, &change, || sim_now_ms() < stop_at_ms).await {
            return false;
        }
    }
    true
}

/// Asks the leader to step down, naming it (so a retried call cannot move
/// leadership twice); the leader is read fresh from a member's status.
async fn step_down(admin: &AdminClient, leader: &AtomicU64, stop_at_ms: u64) -> bool {
    while sim_now_ms() < stop_at_ms {
        let known = match admin.status().await {
            Ok(status) => status.current_leader,
            Err(_) => None,
        }
        .or_else(|| Some(leader.load(Ordering::SeqCst)).filter(|id| *id != 0));
        if admin.step_down(known).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}
