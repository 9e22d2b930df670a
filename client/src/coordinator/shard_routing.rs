//! Where a key's calls go on a sharded cluster (ADR 0025): the leader of
//! the key's shard by the placement known, the placement read again
//! (`GetPlacement`) before a call when a member has named a newer one. A
//! cluster never sharded names no placement, and nothing of this costs a
//! call.

use leasehold_proto::v1::{GetPlacementRequest, RequestId};

use super::client::CoordinatorClient;
use super::error::CoordinatorError;
use super::routing::Target;

impl CoordinatorClient {
    /// The shard of `key` as this client knows the placement (0 on a
    /// cluster never sharded, or before any member named a placement).
    pub fn shard_of(&self, key: &str) -> u32 {
        self.routing().placement().shard_of(key)
    }

    /// The placement version this client routes by (0: never sharded).
    pub fn placement_version(&self) -> u64 {
        self.routing().placement().version
    }

    /// [`next_request_id`](Self::next_request_id) for a call about `key`:
    /// an id of this client's own session in the group of `key`'s shard,
    /// as this client knows the placement (each group keeps its own
    /// sessions).
    pub fn next_request_id_for(&self, key: &str) -> RequestId {
        let shard = self.shard_of(key);
        self.shared.sessions.manual_request_id_in(shard)
    }

    /// Reads the placement from any member (`GetPlacement`) and routes by
    /// it from now on.
    pub async fn refresh_placement(&self) -> Result<u64, CoordinatorError> {
        let placement = self.send(Target::Any, GetPlacementRequest {}).await?;
        Ok(self.routing().adopt_placement(&placement))
    }

    /// Where `key`'s calls go: its shard's leader. The placement is read
    /// again first when a member has named a newer one.
    pub(super) async fn target_for(&self, key: &str) -> Target {
        let stale = self.routing().placement_is_stale();
        if stale {
            if let Err(error) = self.refresh_placement().await {
                tracing::debug!(%error, "placement not read; routing by the one known");
            }
        }
        Target::Shard(self.shard_of(key))
    }
}
