//! The history behind the format-8 fixture in `tests/fixtures/`: the
//! format-6 history, then the split of shard 0's upper half into shard 1
//! on members 2 and 3 — a state with a placement and a move of slots
//! (frozen keys, no sessions), as the code of format 8 (before sessions
//! moved with their slots) snapshotted it.

use leasehold_core::coordinator::sharding::PlacementChange;
use leasehold_core::coordinator::{Command, Proposal};
use leasehold_core::shard::ShardId;
use leasehold_raft_store::{Entry, EntryPayload};

use super::log_id;

/// The log of the history.
pub fn entries() -> Vec<Entry> {
    let mut log = super::format_v6::entries();
    let split = Proposal {
        stamp_ms: 2_850,
        commands: vec![Command::ChangePlacement {
            expected_version: 0,
            change: PlacementChange::Split {
                shard: ShardId(0),
                into: ShardId(1),
                replicas: vec![2, 3],
            },
        }],
    };
    log.push(Entry {
        log_id: log_id(2, log.len() as u64 + 1),
        payload: EntryPayload::Normal(split.into()),
    });
    log
}
