//! The public coordinator API (`leasehold.v1.Coordinator`): lease,
//! reconcile and pool grant go through group commit at the leader;
//! `GetWindow` is a linearizable read.
//!
//! Every handler validates its input first (`INVALID_ARGUMENT`, nothing
//! proposed), then checks leadership (`FAILED_PRECONDITION` with a leader
//! hint, or `UNAVAILABLE`), then proposes and maps the state machine's
//! outcome (`NOT_FOUND` without a policy, `FAILED_PRECONDITION` on a kind
//! mismatch).
//!
//! Lease, Reconcile and PoolGrant act for the request's region: only that
//! region's certificate may send them (`PERMISSION_DENIED` otherwise; see
//! [`crate::auth`]).
//!
//! On a sharded cluster each key-addressed call is first routed to the
//! group of the key's shard ([`super::routing`]): the API of shard 0
//! carries the router; each hosted shard has an API of its own, over its
//! group, with its own pool desk.

use std::sync::Arc;

use leasehold_core::coordinator::{Command, Outcome, PoolReleaseDisposition};
use leasehold_core::pool::desk::{GrantNotes, PoolCall, PoolDesk};
use leasehold_core::pool::holder_weights::Holder;
use leasehold_core::principal::Principal;
use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::convert::InvalidField;
use leasehold_proto::refusal::{item_refusal, refusal, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::coordinator_server::Coordinator;
use tonic::{Request, Response, Status};

use super::context::NodeContext;
use super::leader::{command_error_status, LeaderView};
use super::metrics::Rejection;
use super::routing::{Route, ShardRouting};
use crate::auth::{authorize_region, caller, PeerInfo};
use crate::telemetry;

/// Serves `leasehold.v1.Coordinator` for one member.
#[derive(Clone)]
pub struct CoordinatorApi {
    node: Arc<NodeContext>,
    /// The leader's pool memory — demand reports, the regions of recent
    /// windows, capped asks — held while leading (see
    /// `leasehold_core::pool::desk`).
    pool_desk: Arc<std::sync::Mutex<PoolDesk>>,
    /// Shard 0's API only: routes each key to its shard's group.
    routing: Option<Arc<ShardRouting>>,
}

impl CoordinatorApi {
    /// The API over a group's shared context (one shard: no routing).
    pub fn new(node: Arc<NodeContext>) -> Self {
        Self {
            node,
            pool_desk: Arc::default(),
            routing: None,
        }
    }

    /// The same API routing each key to its shard first (shard 0's).
    pub fn with_routing(mut self, routing: Arc<ShardRouting>) -> Self {
        self.routing = Some(routing);
        self
    }

    /// The Raft handle of this API's group.
    pub fn raft(&self) -> leasehold_raft_store::Raft {
        self.node.raft.clone()
    }

    /// The group this API answers for.
    pub fn context(&self) -> &Arc<NodeContext> {
        &self.node
    }

    /// The API that answers calls for `key` on this member (this one for
    /// shard 0), or `NOT_OWNER`.
    fn for_key(&self, key: &str) -> Result<CoordinatorApi, Status> {
        match &self.routing {
            None => Ok(self.clone()),
            Some(routing) => match routing.route(key)? {
                Route::Meta => Ok(self.clone()),
                Route::Hosted(_, api) => Ok(api),
            },
        }
    }

    /// `result` of a call about `key`, its `NOT_LEADER` naming the key's
    /// shard and the placement version when that shard is not 0.
    fn about_key<T>(&self, key: &str, result: Result<T, Status>) -> Result<T, Status> {
        let Some(routing) = &self.routing else {
            return result;
        };
        result.map_err(|status| {
            let (shard, version) = routing.shard_of(key);
            if shard.0 == 0 {
                status
            } else {
                super::routing::with_shard(status, shard, version)
            }
        })
    }

    /// The `INVALID_ARGUMENT` refusal of `error`, counted.
    fn invalid(&self, error: InvalidField) -> Status {
        self.node
            .metrics
            .record_rejection(Rejection::InvalidArgument);
        Status::from(error)
    }

    /// Refuses unless the caller may act for `region`.
    fn require_region<T>(&self, request: &Request<T>, region: &str) -> Result<(), Status> {
        authorize_region(&caller(request), region).map_err(|refusal| {
            let peer = request.extensions().get::<PeerInfo>();
            self.node.metrics.auth.refuse(peer, "Coordinator", refusal)
        })
    }

    async fn write(&self, command: Command) -> Result<Outcome, Status> {
        self.node.require_leader()?;
        let outcome = self.node.propose(command).await?;
        match outcome {
            Outcome::Rejected(error) => Err(command_error_status(&error)),
            outcome => Ok(outcome),
        }
    }
}

/// `notes` in a pool grant's answer: the hints and the demand totals.
fn add_notes(response: &mut pb::PoolGrantResponse, notes: GrantNotes) {
    if let Some(standing) = notes.standing {
        response.guarantee_total = standing.guarantee;
        response.ceiling_total = standing.ceiling;
    }
    if let Some(expected) = notes.expected {
        response.expected_guarantee_total = expected.guarantee;
        response.expected_ceiling_total = expected.ceiling;
    }
    response.reserved_unheld_total = notes.reserved_unheld;
    response.retired_kept_total = notes.retired_kept;
    response.late_released_before_total = notes.late_released_before;
    response.tenant_demands = convert::tenant_demands_to_wire(&notes.tenant_demands);
    response.settled_tenant_demands =
        convert::tenant_demands_to_wire(&notes.settled_tenant_demands);
}

fn unexpected(outcome: &Outcome) -> Status {
    refusal(Reason::Internal, format!("unexpected outcome {outcome:?}"))
}

impl CoordinatorApi {
    async fn lease_call(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        self.require_region(&request, &request.get_ref().region)?;
        let caller = caller(&request);
        let request = request.into_inner();
        let tokens = request.tokens;
        let command = convert::lease_command(request, caller).map_err(|e| self.invalid(e))?;
        self.node.require_leader()?;
        self.node.metrics.record_lease_request(tokens);
        match self.write(command).await? {
            Outcome::Lease(grant) => Ok(Response::new(pb::LeaseResponse::from(&grant))),
            other => Err(unexpected(&other)),
        }
    }

    async fn reconcile_call(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        self.require_region(&request, &request.get_ref().region)?;
        let caller = caller(&request);
        let command = convert::reconcile_command(request.into_inner(), caller)
            .map_err(|e| self.invalid(e))?;
        match self.write(command).await? {
            Outcome::Reconcile(outcome) => Ok(Response::new(pb::ReconcileResponse::from(&outcome))),
            other => Err(unexpected(&other)),
        }
    }

    async fn pool_grant_call(
        &self,
        request: Request<pb::PoolGrantRequest>,
    ) -> Result<Response<pb::PoolGrantResponse>, Status> {
        self.require_region(&request, &request.get_ref().region)?;
        let caller = caller(&request);
        let demands = convert::tenant_demands(&request.get_ref().tenant_demands)
            .map_err(|e| self.invalid(e))?;
        let mut request = request.into_inner();
        let demand_window = request.demand_window_start_ms;
        let holder = convert::pool_holder(&request.holder).map_err(|e| self.invalid(e))?;
        let want_more = request.want_more;
        let join_next = request.join_next.take();
        let (join_window, join_demands) = self.join_report(join_next.as_ref())?;
        let command =
            convert::pool_grant_command(request, caller.clone()).map_err(|e| self.invalid(e))?;
        let Command::PoolGrant { key, region, .. } = &command else {
            return Err(refusal(Reason::Internal, "not a pool grant"));
        };
        let (key, region) = (key.clone(), region.clone());
        let join = join_next
            .map(|join| {
                let join_want_more = join.want_more;
                convert::join_next_command(join, key.clone(), region.clone(), caller.clone())
                    .map(|command| (command, join_want_more))
            })
            .transpose()
            .map_err(|e| self.invalid(e))?;
        let call = PoolCall {
            command,
            holder: holder.clone(),
            want_more,
            join,
        };
        let (outcome, join_outcome) = self.propose_pool_call(call).await?;
        match outcome {
            Outcome::PoolGrant(grant) => {
                let mut response = pb::PoolGrantResponse::from(&grant);
                if let Some(joined) = join_outcome {
                    let (next, refused) = self.join_answer(
                        &key,
                        (&region, &holder),
                        joined,
                        join_window,
                        &join_demands,
                    );
                    response.next_window = next.map(Box::new);
                    response.next_window_refused = refused;
                }
                // The region's standing as this member applied it, and the
                // demand totals its report earns.
                let notes = self.node.state.read(|state| {
                    self.desk().grant_notes(
                        state,
                        &key,
                        (&region, &holder),
                        &grant,
                        Some((demand_window, &demands)),
                    )
                });
                add_notes(&mut response, notes);
                Ok(Response::new(response))
            }
            other => Err(unexpected(&other)),
        }
    }

    async fn pool_release_call(
        &self,
        request: Request<pb::PoolReleaseRequest>,
    ) -> Result<Response<pb::PoolReleaseResponse>, Status> {
        self.require_region(&request, &request.get_ref().region)?;
        let caller = caller(&request);
        let mut request = request.into_inner();
        let join_next = request.join_next.take();
        let holder = convert::pool_holder(&request.holder).map_err(|e| self.invalid(e))?;
        let (join_window, join_demands) = self.join_report(join_next.as_ref())?;
        let command =
            convert::pool_release_command(request, caller.clone()).map_err(|e| self.invalid(e))?;
        let (key, region) = match &command {
            Command::PoolRelease { key, region, .. } => (key.clone(), region.clone()),
            _ => return Err(refusal(Reason::Internal, "not a pool release")),
        };
        let join = join_next
            .map(|join| {
                let join_want_more = join.want_more;
                convert::join_next_command(join, key.clone(), region.clone(), caller)
                    .map(|command| (command, join_want_more))
            })
            .transpose()
            .map_err(|e| self.invalid(e))?;
        let call = PoolCall {
            command,
            holder: holder.clone(),
            want_more: 0,
            join,
        };
        let (outcome, join_outcome) = self.propose_pool_call(call).await?;
        match outcome {
            Outcome::PoolRelease(outcome) => {
                // Remembered for the next window's grants: what was handed
                // back late (the proto's late_released_before_total), and
                // that this holder stopped reserving.
                let now_ms = self.node.clock.now_ms();
                self.desk()
                    .note_release(&key, (&region, &holder), &outcome, now_ms);
                let mut response = pb::PoolReleaseResponse::from(&outcome);
                if let Some(joined) = join_outcome {
                    let (next, refused) = self.join_answer(
                        &key,
                        (&region, &holder),
                        joined,
                        join_window,
                        &join_demands,
                    );
                    response.next_window = next;
                    response.next_window_refused = refused;
                }
                Ok(Response::new(response))
            }
            other => Err(unexpected(&other)),
        }
    }

    /// The leader's pool desk (`leasehold_core::pool::desk`).
    fn desk(&self) -> std::sync::MutexGuard<'_, PoolDesk> {
        self.pool_desk
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Proposes pool call `command` with its join ahead as the desk plans
    /// them (capped asks, lapses first, the join last, in one group) and
    /// returns the call's outcome and the join's. A refused call is its
    /// error status.
    async fn propose_pool_call(
        &self,
        call: PoolCall,
    ) -> Result<(Outcome, Option<Outcome>), Status> {
        let now_ms = self.node.clock.now_ms();
        let leader = Principal::Member(self.node.id);
        let plan = self
            .node
            .state
            .read(|state| self.desk().plan(state, call, now_ms, &leader));
        let in_flight = plan.in_flight.clone();
        let outcomes = self.propose_plan(plan).await;
        // Applied or refused: the asks it planned no longer wait in the log.
        self.desk().settle(&in_flight);
        outcomes
    }

    /// Proposes the commands of `plan` (see [`Self::propose_pool_call`]).
    async fn propose_plan(
        &self,
        plan: leasehold_core::pool::desk::PoolPlan,
    ) -> Result<(Outcome, Option<Outcome>), Status> {
        if plan.commands.len() == 1 {
            let Some(command) = plan.commands.into_iter().next() else {
                return Err(refusal(Reason::Internal, "no command to propose"));
            };
            return Ok((self.write(command).await?, None));
        }
        self.node.require_leader()?;
        let mut outcomes = self.node.propose_all(plan.commands).await?;
        let join_outcome = if plan.joined { outcomes.pop() } else { None };
        if plan.lapses > 0 {
            // (A release that met a changed total retired no one.)
            let lapsed = outcomes
                .iter()
                .take(plan.lapses)
                .filter(|outcome| {
                    matches!(
                        outcome,
                        Outcome::PoolRelease(release)
                            if release.disposition == PoolReleaseDisposition::Released
                    )
                })
                .count() as u64;
            self.node.metrics.record_pool_reserves_lapsed(lapsed);
        }
        match outcomes.pop() {
            Some(Outcome::Rejected(error)) => Err(command_error_status(&error)),
            Some(outcome) => Ok((outcome, join_outcome)),
            None => Err(refusal(Reason::Internal, "no outcome for the pool call")),
        }
    }

    /// A join ahead's demand report, read before anything is proposed (a
    /// malformed one refuses the call): the window joined and the report.
    fn join_report(
        &self,
        join: Option<&pb::NextWindowJoin>,
    ) -> Result<(u64, Vec<(leasehold_core::ids::TenantId, u64)>), Status> {
        let Some(join) = join else {
            return Ok((0, Vec::new()));
        };
        let demands = convert::join_next_demands(join).map_err(|e| self.invalid(e))?;
        Ok((join.window_start_ms, demands))
    }

    /// The answer of a join ahead: the grant in the window joined, with the
    /// desk's notes there ([`PoolDesk::join_notes`]); or why it was refused.
    fn join_answer(
        &self,
        key: &leasehold_core::ids::Key,
        holder: (&leasehold_core::ids::RegionId, &Holder),
        outcome: Outcome,
        join_window_start_ms: u64,
        demands: &[(leasehold_core::ids::TenantId, u64)],
    ) -> (Option<pb::PoolGrantResponse>, String) {
        let grant = match outcome {
            Outcome::PoolGrant(grant) => grant,
            Outcome::Rejected(error) => return (None, error.to_string()),
            other => return (None, format!("unexpected outcome {other:?}")),
        };
        self.node.metrics.record_pool_join_ahead();
        let mut response = pb::PoolGrantResponse::from(&grant);
        let notes = self.node.state.read(|state| {
            self.desk()
                .join_notes(state, key, holder, &grant, join_window_start_ms, demands)
        });
        add_notes(&mut response, notes);
        (Some(response), String::new())
    }

    async fn get_window_call(
        &self,
        request: Request<pb::GetWindowRequest>,
    ) -> Result<Response<pb::GetWindowResponse>, Status> {
        let key = convert::window_key(request.get_ref()).map_err(|e| self.invalid(e))?;
        self.node.linearizable_read().await?;
        let wall_now = self.node.clock.now_ms();
        let view = self.node.state.read(|state| {
            if !state.owns(&key) {
                return None;
            }
            Some(state.window_view(&key, state.now_ms().max(wall_now)))
        });
        // The group does not hold the key's window (yet, or any more):
        // an empty view would read as nothing granted.
        let Some(view) = view else {
            return Err(refusal(
                Reason::SlotMoving,
                format!("the window of {key:?} is changing shards; retry shortly"),
            ));
        };
        match view {
            Ok(view) => Ok(Response::new(convert::window_response(&key, &view))),
            Err(error) => {
                self.node.metrics.record_rejection(Rejection::NoPolicy);
                Err(command_error_status(&error))
            }
        }
    }
}

/// Most items in one `LeaseBatch`.
pub const MAX_BATCH_ITEMS: usize = 256;

/// What becomes of one item of a batch before anything is proposed.
enum BatchSlot {
    /// Refused by identity or input; nothing proposed for it.
    Refused(Status),
    /// Proposed as the `n`th command.
    Proposed(usize),
}

impl CoordinatorApi {
    /// `LeaseBatch`: each item validated and authorized as a `Lease` alone
    /// would be, the valid ones proposed together through group commit, and
    /// each answered with its own outcome. A failure to propose (not the
    /// leader, no quorum, ...) fails the whole call: retrying it with the
    /// same request ids is exactly-once per item.
    async fn lease_batch_call(
        &self,
        request: Request<pb::LeaseBatchRequest>,
    ) -> Result<Response<pb::LeaseBatchResponse>, Status> {
        let caller = caller(&request);
        let peer = request.extensions().get::<PeerInfo>().cloned();
        let items = request.into_inner().items;
        if items.is_empty() || items.len() > MAX_BATCH_ITEMS {
            return Err(self.invalid(InvalidField::new(
                "items",
                format!(
                    "a batch holds 1 to {MAX_BATCH_ITEMS} items, not {}",
                    items.len()
                ),
            )));
        }
        let results = match &self.routing {
            None => self.lease_items(&caller, peer.as_ref(), items).await?,
            Some(routing) => {
                self.routed_lease_items(routing, &caller, peer.as_ref(), items)
                    .await?
            }
        };
        Ok(Response::new(pb::LeaseBatchResponse { results }))
    }

    /// A batch's items cut by shard and answered by each shard's group
    /// (see [`super::routing`]); all of shard 0's in one group.
    async fn routed_lease_items(
        &self,
        routing: &ShardRouting,
        caller: &Principal,
        peer: Option<&PeerInfo>,
        items: Vec<pb::LeaseRequest>,
    ) -> Result<Vec<pb::LeaseItemResult>, Status> {
        let count = items.len();
        let mut ordered: Vec<Option<pb::LeaseItemResult>> = vec![None; count];
        let mut parts: std::collections::BTreeMap<u32, Vec<(usize, pb::LeaseRequest)>> =
            std::collections::BTreeMap::new();
        for (index, item) in items.into_iter().enumerate() {
            let (shard, _) = routing.shard_of(&item.key);
            parts.entry(shard.0).or_default().push((index, item));
        }
        if parts.len() == 1 && parts.contains_key(&0) {
            let items = parts
                .into_values()
                .flatten()
                .map(|(_, item)| item)
                .collect();
            return self.lease_items(caller, peer, items).await;
        }
        let answers = parts.into_values().map(|part| async move {
            let key = part[0].1.key.clone();
            let (indices, items): (Vec<usize>, Vec<pb::LeaseRequest>) = part.into_iter().unzip();
            let answered = match self.for_key(&key) {
                Ok(api) => api.lease_items(caller, peer, items).await,
                Err(status) => Err(status),
            };
            let results = match self.about_key(&key, answered) {
                Ok(results) => results,
                Err(status) => indices
                    .iter()
                    .map(|_| pb::LeaseItemResult {
                        result: Some(pb::lease_item_result::Result::Refused(item_refusal(
                            &status,
                        ))),
                    })
                    .collect(),
            };
            indices.into_iter().zip(results).collect::<Vec<_>>()
        });
        for (index, result) in futures::future::join_all(answers)
            .await
            .into_iter()
            .flatten()
        {
            ordered[index] = Some(result);
        }
        Ok(ordered
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| pb::LeaseItemResult {
                    result: Some(pb::lease_item_result::Result::Refused(item_refusal(
                        &refusal(Reason::Internal, "no answer for the item"),
                    ))),
                })
            })
            .collect())
    }

    /// Each item validated and authorized as a `Lease` alone would be,
    /// the valid ones proposed together to this group, each answered with
    /// its own outcome; a failure to propose fails them all.
    async fn lease_items(
        &self,
        caller: &Principal,
        peer: Option<&PeerInfo>,
        items: Vec<pb::LeaseRequest>,
    ) -> Result<Vec<pb::LeaseItemResult>, Status> {
        self.node.require_leader()?;
        let mut slots = Vec::with_capacity(items.len());
        let mut commands = Vec::with_capacity(items.len());
        for item in items {
            if let Err(refused) = authorize_region(caller, &item.region) {
                let status = self
                    .node
                    .metrics
                    .auth
                    .refuse(peer, "Coordinator/LeaseBatch", refused);
                slots.push(BatchSlot::Refused(status));
                continue;
            }
            let tokens = item.tokens;
            match convert::lease_command(item, caller.clone()) {
                Ok(command) => {
                    self.node.metrics.record_lease_request(tokens);
                    slots.push(BatchSlot::Proposed(commands.len()));
                    commands.push(command);
                }
                Err(error) => slots.push(BatchSlot::Refused(self.invalid(error))),
            }
        }
        // Submitted as one group: it rides whole in one proposal when it
        // fits (`max_batch_commands`), at the cost of one submission.
        let outcomes = self.node.propose_all(commands).await?;
        Ok(slots
            .into_iter()
            .map(|slot| {
                let result = match slot {
                    BatchSlot::Refused(status) => {
                        pb::lease_item_result::Result::Refused(item_refusal(&status))
                    }
                    BatchSlot::Proposed(n) => match &outcomes[n] {
                        Outcome::Lease(grant) => {
                            pb::lease_item_result::Result::Granted(pb::LeaseResponse::from(grant))
                        }
                        Outcome::Rejected(error) => pb::lease_item_result::Result::Refused(
                            item_refusal(&command_error_status(error)),
                        ),
                        other => {
                            pb::lease_item_result::Result::Refused(item_refusal(&unexpected(other)))
                        }
                    },
                };
                pb::LeaseItemResult {
                    result: Some(result),
                }
            })
            .collect())
    }

    /// `GetPlacement`: this member's view of the placement, with the
    /// leaders of the shards it hosts.
    fn get_placement_call(&self) -> pb::Placement {
        let leader_of = |shard: leasehold_core::shard::ShardId| -> Option<LeaderView> {
            if shard.0 == 0 {
                return Some(LeaderView::of(&self.node.raft));
            }
            let routing = self.routing.as_ref()?;
            routing.leader_of(shard)
        };
        super::routing::placement_message(&self.node, leader_of)
    }
}

/// Records a refusal (or a grant of nothing) on the current span.
fn traced<T>(
    result: Result<Response<T>, Status>,
    granted_nothing: impl Fn(&T) -> bool,
) -> Result<Response<T>, Status> {
    match &result {
        Err(status) => telemetry::record_refusal(status),
        Ok(response) if granted_nothing(response.get_ref()) => {
            telemetry::record_denial(telemetry::DENIED_WINDOW_EXHAUSTED)
        }
        Ok(_) => {}
    }
    result
}

#[tonic::async_trait]
impl Coordinator for CoordinatorApi {
    #[tracing::instrument(name = "coordinator.lease", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region, tokens = request.get_ref().tokens))]
    async fn lease(
        &self,
        request: Request<pb::LeaseRequest>,
    ) -> Result<Response<pb::LeaseResponse>, Status> {
        let key = request.get_ref().key.clone();
        let api = self.for_key(&key)?;
        traced(self.about_key(&key, api.lease_call(request).await), |r| {
            r.granted == 0
        })
    }

    #[tracing::instrument(name = "coordinator.lease_batch", level = "debug", skip_all, fields(
        items = request.get_ref().items.len()))]
    async fn lease_batch(
        &self,
        request: Request<pb::LeaseBatchRequest>,
    ) -> Result<Response<pb::LeaseBatchResponse>, Status> {
        traced(self.lease_batch_call(request).await, |_| false)
    }

    #[tracing::instrument(name = "coordinator.reconcile", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn reconcile(
        &self,
        request: Request<pb::ReconcileRequest>,
    ) -> Result<Response<pb::ReconcileResponse>, Status> {
        let key = request.get_ref().key.clone();
        let api = self.for_key(&key)?;
        traced(
            self.about_key(&key, api.reconcile_call(request).await),
            |_| false,
        )
    }

    #[tracing::instrument(name = "coordinator.pool_grant", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn pool_grant(
        &self,
        request: Request<pb::PoolGrantRequest>,
    ) -> Result<Response<pb::PoolGrantResponse>, Status> {
        let key = request.get_ref().key.clone();
        let api = self.for_key(&key)?;
        traced(
            self.about_key(&key, api.pool_grant_call(request).await),
            |r| r.granted_total == 0,
        )
    }

    #[tracing::instrument(name = "coordinator.pool_release", level = "debug", skip_all, fields(
        key = %request.get_ref().key, region = %request.get_ref().region))]
    async fn pool_release(
        &self,
        request: Request<pb::PoolReleaseRequest>,
    ) -> Result<Response<pb::PoolReleaseResponse>, Status> {
        let key = request.get_ref().key.clone();
        let api = self.for_key(&key)?;
        traced(
            self.about_key(&key, api.pool_release_call(request).await),
            |_| false,
        )
    }

    #[tracing::instrument(name = "coordinator.get_window", level = "debug", skip_all, fields(
        key = %request.get_ref().key))]
    async fn get_window(
        &self,
        request: Request<pb::GetWindowRequest>,
    ) -> Result<Response<pb::GetWindowResponse>, Status> {
        let key = request.get_ref().key.clone();
        let api = self.for_key(&key)?;
        traced(
            self.about_key(&key, api.get_window_call(request).await),
            |_| false,
        )
    }

    async fn get_placement(
        &self,
        _request: Request<pb::GetPlacementRequest>,
    ) -> Result<Response<pb::Placement>, Status> {
        Ok(Response::new(self.get_placement_call()))
    }
}
