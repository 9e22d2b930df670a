//! [`AdminClient`]: cluster membership, status and policies over the
//! `leasehold.v1.Admin` service, with the same routing and retries as
//! [`CoordinatorClient`] (each call a thin wrapper of its generic call).

use leasehold_proto::v1::admin_client::AdminClient as AdminRpc;
use leasehold_proto::v1::{
    AddLearnerRequest, AddLearnerResponse, ChangeMembershipRequest, ChangeMembershipResponse,
    ChangePlacementRequest, DeletePolicyRequest, GetPlacementRequest, InitRequest,
    ListPoliciesRequest, Member, Placement, Policy, SaveSnapshotRequest, SetPolicyRequest,
    SnapshotInfo, StatusRequest, StatusResponse, StepDownRequest,
};

use super::client::CoordinatorClient;
use super::error::CoordinatorError;
use super::routing::Target;
use crate::transport::outgoing;

/// Administers a coordinator cluster. Writes and policy reads go to the
/// leader; [`status`](Self::status) and [`init`](Self::init) go to the first
/// configured endpoint that answers.
#[derive(Debug, Clone)]
pub struct AdminClient {
    client: CoordinatorClient,
}

impl CoordinatorClient {
    /// An admin client sharing this client's routing and connections.
    pub fn admin(&self) -> AdminClient {
        AdminClient::from_client(self.clone())
    }
}

impl AdminClient {
    /// Wraps a coordinator client, sharing its routing and connections.
    pub fn from_client(client: CoordinatorClient) -> Self {
        Self { client }
    }

    /// The underlying coordinator client.
    pub fn client(&self) -> &CoordinatorClient {
        &self.client
    }

    /// Initialises a pristine cluster with `members` (`(node id, host:port)`),
    /// sent to the first configured endpoint. Fails with
    /// [`CoordinatorError::AlreadyExists`] when that node is initialised already.
    pub async fn init(&self, members: &[(u64, String)]) -> Result<(), CoordinatorError> {
        let request = InitRequest {
            members: members
                .iter()
                .map(|(id, addr)| Member {
                    id: *id,
                    addr: addr.clone(),
                })
                .collect(),
        };
        self.client.send(Target::Any, request).await.map(|_| ())
    }

    /// Adds a non-voting member that starts receiving the log; returns the
    /// log index of the membership change and whether the learner held it
    /// within the leader's wait (asking again is harmless and waits again).
    pub async fn add_learner(
        &self,
        id: u64,
        addr: &str,
    ) -> Result<AddLearnerResponse, CoordinatorError> {
        let request = AddLearnerRequest {
            member: Some(Member {
                id,
                addr: addr.to_string(),
            }),
        };
        self.client.send(Target::Leader, request).await
    }

    /// Makes exactly `voter_ids` the voters; with `retain`, removed voters
    /// stay as learners. Returns the log index of the final membership and
    /// the members that did not hold it yet when the leader answered (they
    /// still accept Raft messages from removed members until they do).
    pub async fn change_membership(
        &self,
        voter_ids: &[u64],
        retain: bool,
    ) -> Result<ChangeMembershipResponse, CoordinatorError> {
        let request = ChangeMembershipRequest {
            voter_ids: voter_ids.to_vec(),
            retain,
        };
        self.client.send(Target::Leader, request).await
    }

    /// A backup of the coordinator state (`Admin/SaveSnapshot`): from the
    /// leader (`from_any_member` false: consistent with every write
    /// acknowledged before the call) or from the first configured endpoint
    /// that answers (its applied state). Returns what the member says the
    /// backup holds and the backup file's bytes, as received: check them
    /// (`leasehold_raft_store::backup::read_backup`) before relying on them.
    /// Each try must finish within the call timeout.
    pub async fn save_snapshot(
        &self,
        from_any_member: bool,
    ) -> Result<(SnapshotInfo, Vec<u8>), CoordinatorError> {
        let target = if from_any_member {
            Target::Any
        } else {
            Target::Leader
        };
        self.client
            .call(target, move |channel, timeout| {
                let request = outgoing(
                    SaveSnapshotRequest {
                        any_member: from_any_member,
                    },
                    timeout,
                );
                async move {
                    let mut chunks = AdminRpc::new(channel)
                        .save_snapshot(request)
                        .await?
                        .into_inner();
                    let (mut info, mut bytes) = (None, Vec::new());
                    while let Some(chunk) = chunks.message().await? {
                        info = info.or(chunk.info);
                        bytes.extend_from_slice(&chunk.data);
                    }
                    let info = info.ok_or_else(|| {
                        tonic::Status::data_loss("the backup arrived without its description")
                    })?;
                    Ok(tonic::Response::new((info, bytes)))
                }
            })
            .await
    }

    /// Asks the leader to step down so that another voter leads; returns
    /// the new leader's id. With `leader_id` (the member expected to lead)
    /// retries are idempotent: once another member leads, it is the answer.
    /// Without it, a retry after a lost reply may move leadership again.
    /// Fails with `UNAVAILABLE` when no other voter took over within the
    /// server's admin timeout (the old leader still leads).
    pub async fn step_down(&self, leader_id: Option<u64>) -> Result<u64, CoordinatorError> {
        let request = StepDownRequest {
            leader_id: leader_id.unwrap_or(0),
        };
        self.client
            .send(Target::Leader, request)
            .await
            .map(|response| response.new_leader)
    }

    /// The status of the first configured endpoint that answers (node-local,
    /// not necessarily the leader's).
    pub async fn status(&self) -> Result<StatusResponse, CoordinatorError> {
        self.client.send(Target::Any, StatusRequest {}).await
    }

    /// Inserts or replaces the policy with `policy.prefix`: a core policy
    /// (e.g. `leasehold_core::policy::Policy::counter("api/", 100, 1_000)`)
    /// or a wire one. The leader validates it; an invalid field is refused
    /// with [`CoordinatorError::InvalidArgument`].
    pub async fn set_policy(&self, policy: impl Into<Policy>) -> Result<(), CoordinatorError> {
        let request = SetPolicyRequest {
            policy: Some(policy.into()),
        };
        self.client.send(Target::Leader, request).await.map(|_| ())
    }

    /// Removes the policy with exactly `prefix`; returns whether it existed.
    pub async fn delete_policy(&self, prefix: &str) -> Result<bool, CoordinatorError> {
        let request = DeletePolicyRequest {
            prefix: prefix.to_string(),
        };
        self.client
            .send(Target::Leader, request)
            .await
            .map(|response| response.existed)
    }

    /// The placement of keys on shards as the first member that answers
    /// knows it (`GetPlacement`).
    pub async fn placement(&self) -> Result<Placement, CoordinatorError> {
        self.client.send(Target::Any, GetPlacementRequest {}).await
    }

    /// Changes the placement (at shard 0's leader), if it is at the
    /// request's `expected_version`; answers the placement after.
    pub async fn change_placement(
        &self,
        request: ChangePlacementRequest,
    ) -> Result<Placement, CoordinatorError> {
        self.client.send(Target::Leader, request).await
    }

    /// Every policy, sorted by prefix (a linearizable read at the leader).
    pub async fn list_policies(&self) -> Result<Vec<Policy>, CoordinatorError> {
        self.client
            .send(Target::Leader, ListPoliciesRequest {})
            .await
            .map(|response| response.policies)
    }
}
