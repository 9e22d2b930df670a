//! [`KnownPlacement`]: the placement of keys on shards as this client last
//! read it (`GetPlacement`, ADR 0025), and the shard it puts a key in.

use std::collections::HashMap;

use leasehold_proto::v1::Placement;

use crate::transport::normalize_addr;

/// The placement of keys on shards, as last read.
#[derive(Debug, Clone, Default)]
pub(super) struct KnownPlacement {
    /// Its version (0: never sharded, or never read).
    pub(super) version: u64,
    /// `(start, end, shard)` slot runs, in slot order.
    runs: Vec<(u32, u32, u32)>,
    /// Replica addresses by shard.
    replicas: HashMap<u32, Vec<String>>,
}

impl KnownPlacement {
    /// The placement a member answered (replica addresses that do not
    /// parse left out).
    pub(super) fn of(placement: &Placement) -> Self {
        Self {
            version: placement.version,
            runs: placement
                .slots
                .iter()
                .map(|run| (run.start, run.end, run.shard))
                .collect(),
            replicas: placement
                .shards
                .iter()
                .map(|shard| {
                    let addrs = shard
                        .replica_addrs
                        .iter()
                        .filter_map(|member| normalize_addr(&member.addr).ok())
                        .collect();
                    (shard.id, addrs)
                })
                .collect(),
        }
    }

    /// The shard `key`'s slot is placed on (0 when none is known).
    pub(super) fn shard_of(&self, key: &str) -> u32 {
        if self.runs.is_empty() {
            return 0;
        }
        let slot = u32::from(leasehold_core::shard::slot_of(key));
        self.runs
            .iter()
            .find(|(start, end, _)| *start <= slot && slot < *end)
            .map_or(0, |(_, _, shard)| *shard)
    }

    /// The replica addresses of `shard` (none when unknown).
    pub(super) fn replicas_of(&self, shard: u32) -> &[String] {
        self.replicas.get(&shard).map_or(&[], Vec::as_slice)
    }
}
