//! A sharded fleet ([`FleetShape::shards`] > 1): at setup the control host
//! spreads the hash slots evenly over the shards through the real admin
//! API, with the load's key ([`KEY`]) on the last shard, and waits until
//! that shard serves it. From then on the driver's "leader" is the key's
//! shard's leader, so a leader fault hits the group that serves the load
//! while the meta group and the other shards carry on (or, where one
//! member leads several groups, hits several leaders at once).

use std::time::Duration;

use leasehold_client::coordinator::{AdminClient, CoordinatorClient};
use leasehold_core::shard::{slot_of, Placement, ShardId, SLOTS};
use leasehold_proto::v1 as pb;
use pb::change_placement_request::Change;

use super::{sim_now_ms, FleetShape, KEY};

/// The placement changes that spread the slots over `shards` shards on
/// `members` members: the slots fall into `shards` equal blocks; the block
/// holding `key_slot` goes to the last shard, the first other block stays
/// shard 0's, the rest go, in order, to shards 1, 2, …. Shard `s` is
/// replicated by three members (all of them when fewer), starting at
/// member `s % members + 1`. (The simulation and the process runner both
/// spread their fleets with it.)
pub fn spread_changes(shards: u32, members: u64, key_slot: u32) -> Vec<Change> {
    let shards = shards.clamp(1, u32::from(SLOTS));
    let block = u32::from(SLOTS) / shards;
    let block_of = |slot: u32| (slot / block).min(shards - 1);
    let range = |b: u32| {
        let end = if b == shards - 1 {
            u32::from(SLOTS)
        } else {
            (b + 1) * block
        };
        (b * block, end)
    };
    let key_block = block_of(key_slot);
    let mut others = (0..shards).filter(|b| *b != key_block);
    others.next(); // stays shard 0's
    let owners = others
        .zip(1..)
        .chain(std::iter::once((key_block, shards - 1)));
    let mut changes = Vec::new();
    for (b, shard) in owners.filter(|(_, shard)| *shard != 0) {
        let (start, end) = range(b);
        changes.push(Change::AddShard(pb::AddShard {
            shard,
            replicas: replicas_of(shard, members),
        }));
        changes.push(Change::MoveSlots(pb::MoveSlots {
            start,
            end,
            to: shard,
        }));
    }
    changes
}

/// The placement [`spread_changes`] makes (the fleet's from setup on,
/// until a scenario moves a slot).
pub fn spread_placement(shape: &FleetShape) -> Placement {
    let mut placement = Placement::meta();
    for change in spread_changes(shape.shards, shape.members, u32::from(slot_of(KEY))) {
        let applied = match change {
            Change::AddShard(add) => {
                placement.add_shard(ShardId(add.shard), add.replicas.iter().copied())
            }
            Change::MoveSlots(m) => placement.move_slots(m.start, m.end, ShardId(m.to)),
            _ => Ok(()),
        };
        debug_assert!(applied.is_ok(), "spread changes apply: {applied:?}");
    }
    placement
}

/// Three members (all when fewer) from member `shard % members + 1` on.
pub fn replicas_of(shard: u32, members: u64) -> Vec<u64> {
    let members = members.max(1);
    let mut replicas: Vec<u64> = (0..members.min(3))
        .map(|i| (u64::from(shard) + i) % members + 1)
        .collect();
    replicas.sort_unstable();
    replicas
}

/// Makes `change` against the placement read just before, retrying while
/// `in_time()` holds; whether it was made. (The simulation's control and
/// operator hosts and the process runner all change the placement so.)
pub async fn make_change(admin: &AdminClient, change: &Change, in_time: impl Fn() -> bool) -> bool {
    while in_time() {
        let made = match admin.placement().await {
            Ok(placement) => admin
                .change_placement(pb::ChangePlacementRequest {
                    expected_version: placement.version,
                    change: Some(change.clone()),
                })
                .await
                .is_ok(),
            Err(_) => false,
        };
        if made {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// After an accepted placement change, every slot is served again within
/// this (docs/operations.md, Shards: the bound the node tests and these
/// scenarios hold every change to).
pub const SHARD_CHANGE_BOUND_MS: u64 = 10_000;

/// The shard serving the load's key in `placement`, with its replicas
/// (shard 0's: none listed, every member).
fn key_shard(placement: &pb::Placement) -> Option<&pb::ShardInfo> {
    let slot = u32::from(slot_of(KEY));
    let shard = placement
        .slots
        .iter()
        .find(|range| range.start <= slot && slot < range.end)?
        .shard;
    placement.shards.iter().find(|info| info.id == shard)
}

/// Splits the shard serving the load's key into a new shard (one past the
/// highest id) on the same replicas (members 1 to 3 for shard 0), and
/// moves the key's slot on to it where the split left it behind (the
/// operator splitting a hot shard, then moving the hot key). Whether every
/// change was made while `in_time()` held.
pub async fn split_key_shard(
    admin: &AdminClient,
    members: u64,
    in_time: impl Fn() -> bool,
) -> bool {
    let (from, into, replicas) = loop {
        if !in_time() {
            return false;
        }
        if let Ok(placement) = admin.placement().await {
            if let Some(info) = key_shard(&placement) {
                let into = placement.shards.iter().map(|s| s.id).max().unwrap_or(0) + 1;
                let replicas = if info.id == 0 {
                    replicas_of(into, members)
                } else {
                    info.replicas.clone()
                };
                break (info.id, into, replicas);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let split = Change::Split(pb::SplitShard {
        shard: from,
        into,
        replicas,
    });
    if !make_change(admin, &split, &in_time).await {
        return false;
    }
    let left_behind = loop {
        if !in_time() {
            return false;
        }
        if let Ok(placement) = admin.placement().await {
            break key_shard(&placement).is_some_and(|info| info.id != into);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let slot = u32::from(slot_of(KEY));
    let follow = Change::MoveSlots(pb::MoveSlots {
        start: slot,
        end: slot + 1,
        to: into,
    });
    !left_behind || make_change(admin, &follow, &in_time).await
}

/// A replica change that drops a shard's leader, as made.
#[derive(Debug, Clone)]
pub struct LeaderDropped {
    /// The shard.
    pub shard: u32,
    /// The leader it had (no longer a replica).
    pub dropped: u64,
    /// Its replicas now.
    pub replicas: Vec<u64>,
}

/// Changes the replicas of the shard serving the load's key so that its
/// current leader is not one of them: the leader gives way to the lowest
/// of members `1..=members` that is not a replica. The leader is read
/// from the placement its replicas answer (`members_admin[i]` asks member
/// `i + 1` alone: a member knows the leaders of the shards it hosts).
/// The change made, if made while `in_time()` held; never for a key on
/// shard 0 (whose replicas are every member).
pub async fn drop_key_shard_leader(
    admin: &AdminClient,
    members_admin: &[AdminClient],
    members: u64,
    in_time: impl Fn() -> bool,
) -> Option<LeaderDropped> {
    while in_time() {
        if let Some(dropped) = without_leader(admin, members_admin, members).await {
            let change = Change::SetReplicas(pb::SetShardReplicas {
                shard: dropped.shard,
                replicas: dropped.replicas.clone(),
            });
            if make_change(admin, &change, &in_time).await {
                return Some(dropped);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

/// The leader `shard` has as member `asked` answers (`None` where it does
/// not host the shard or knows no leader).
async fn leader_seen_by(asked: &AdminClient, shard: u32) -> Option<u64> {
    let seen = asked.placement().await.ok()?;
    seen.shards
        .iter()
        .find(|s| s.id == shard)
        .and_then(|s| s.leader_id)
}

fn admin_of(members_admin: &[AdminClient], member: u64) -> Option<&AdminClient> {
    usize::try_from(member.checked_sub(1)?)
        .ok()
        .and_then(|i| members_admin.get(i))
}

/// The replica change [`drop_key_shard_leader`] makes, as the placement
/// stands now; `None` while the key's shard or its leader is not known.
async fn without_leader(
    admin: &AdminClient,
    members_admin: &[AdminClient],
    members: u64,
) -> Option<LeaderDropped> {
    let placement = admin.placement().await.ok()?;
    let info = key_shard(&placement).filter(|info| info.id != 0)?;
    let mut leader = None;
    for replica in &info.replicas {
        leader = match admin_of(members_admin, *replica) {
            Some(asked) => leader_seen_by(asked, info.id).await,
            None => None,
        };
        if leader.is_some() {
            break;
        }
    }
    let dropped = leader?;
    let newcomer = (1..=members).find(|m| !info.replicas.contains(m))?;
    let mut replicas: Vec<u64> = info
        .replicas
        .iter()
        .copied()
        .filter(|m| *m != dropped)
        .chain([newcomer])
        .collect();
    replicas.sort_unstable();
    Some(LeaderDropped {
        shard: info.id,
        dropped,
        replicas,
    })
}

/// Waits until the change `made` has finished — a new replica answers
/// that one of the new replicas leads the shard — at most
/// [`SHARD_CHANGE_BOUND_MS`] from `since_ms` by `now_ms`; whether it did.
pub async fn new_replicas_lead_within_bound(
    members_admin: &[AdminClient],
    made: &LeaderDropped,
    since_ms: u64,
    now_ms: fn() -> u64,
) -> bool {
    loop {
        for replica in &made.replicas {
            let Some(asked) = admin_of(members_admin, *replica) else {
                continue;
            };
            let leader = leader_seen_by(asked, made.shard).await;
            if leader.is_some_and(|id| made.replicas.contains(&id)) {
                return true;
            }
        }
        if now_ms() >= since_ms + SHARD_CHANGE_BOUND_MS {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the load's key is served (its window read through
/// `client`, which follows the placement), at most
/// [`SHARD_CHANGE_BOUND_MS`] from `since_ms` by `now_ms`; whether it was.
pub async fn key_served_within_bound(
    client: &CoordinatorClient,
    since_ms: u64,
    now_ms: fn() -> u64,
) -> bool {
    loop {
        if client.get_window(KEY).await.is_ok() {
            return true;
        }
        if now_ms() >= since_ms + SHARD_CHANGE_BOUND_MS {
            return false;
        }
        let _ = client.refresh_placement().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Spreads the slots ([`spread_changes`]) and waits until the key's shard
/// serves the key (its window can be read).
pub(crate) async fn spread(
    admin: &AdminClient,
    client: &CoordinatorClient,
    shape: &FleetShape,
    stop_at_ms: u64,
) -> Result<(), String> {
    for change in spread_changes(shape.shards, shape.members, u32::from(slot_of(KEY))) {
        if !make_change(admin, &change, || sim_now_ms() < stop_at_ms).await {
            return Err(format!("placement change {change:?} not made in time"));
        }
    }
    while client.get_window(KEY).await.is_err() {
        if sim_now_ms() >= stop_at_ms {
            return Err(format!("the shard of {KEY:?} never served it"));
        }
        let _ = client.refresh_placement().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

/// The leader of the key's shard, as the placement a member answers
/// names it.
pub(crate) async fn key_shard_leader(admin: &AdminClient) -> Option<u64> {
    let placement = admin.placement().await.ok()?;
    key_shard(&placement)?.leader_id
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(changes: &[Change]) -> Placement {
        let mut placement = Placement::meta();
        for change in changes {
            let applied = match change {
                Change::AddShard(add) => {
                    placement.add_shard(ShardId(add.shard), add.replicas.iter().copied())
                }
                Change::MoveSlots(m) => placement.move_slots(m.start, m.end, ShardId(m.to)),
                other => panic!("unexpected change {other:?}"),
            };
            applied.expect("every spread change applies");
        }
        placement
    }

    /// Every shard gets an equal block (the last one the rounding), the
    /// key lands on the last shard wherever its slot is (every block
    /// boundary tried), and each shard has min(3, members) distinct
    /// replicas among the members.
    #[test]
    fn spreads_evenly_with_the_key_on_the_last_shard() {
        for shards in 1u32..=8 {
            let block = u32::from(SLOTS) / shards;
            let key_slots = (0..shards)
                .flat_map(|b| [b * block, (b * block + block / 2), (b + 1) * block - 1])
                .chain([u32::from(SLOTS) - 1]);
            for key_slot in key_slots {
                for members in 1u64..=7 {
                    let changes = spread_changes(shards, members, key_slot);
                    assert_eq!(changes.len(), 2 * (shards as usize - 1));
                    let placement = apply(&changes);
                    let slot = u16::try_from(key_slot).expect("a slot");
                    assert_eq!(placement.shard_of_slot(slot), ShardId(shards - 1));
                    for shard in 0..shards {
                        let count = placement.slot_count(ShardId(shard));
                        assert!(count >= block && count < block + shards, "{shard}: {count}");
                    }
                    for shard in 1..shards {
                        let replicas = replicas_of(shard, members);
                        assert_eq!(replicas.len() as u64, members.min(3));
                        assert!(replicas.iter().all(|m| (1..=members).contains(m)));
                        assert!(replicas.windows(2).all(|w| w[0] < w[1]));
                    }
                }
            }
        }
    }
}
