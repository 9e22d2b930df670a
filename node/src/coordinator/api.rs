//! One group's side of the public coordinator API
//! (`leasehold.v1.Coordinator`): lease, reconcile and pool grant go
//! through group commit at the group's leader; `GetWindow` is a
//! linearizable read.
//!
//! Every call validates its input first (`INVALID_ARGUMENT`, nothing
//! proposed), then checks leadership (`FAILED_PRECONDITION` with a leader
//! hint, or `UNAVAILABLE`), then proposes and maps the state machine's
//! outcome (`NOT_FOUND` without a policy, `FAILED_PRECONDITION` on a kind
//! mismatch).
//!
//! Lease, Reconcile and PoolGrant act for the request's region: only that
//! region's certificate may send them (`PERMISSION_DENIED` otherwise; see
//! [`crate::auth`]).
//!
//! A [`CoordinatorApi`] answers for its own group alone, as plain async
//! methods over the decoded message and its [`Caller`]; which group a
//! key's call goes to is settled before the call reaches one, by the
//! router the member serves (`ShardRouting`). Shard 0 and each hosted
//! shard have an API of their own, over their group, with their own pool
//! desk.

use std::sync::Arc;

use leasehold_core::coordinator::{Command, Outcome, PoolReleaseDisposition};
use leasehold_core::pool::desk::{GrantNotes, PoolCall, PoolDesk};
use leasehold_core::pool::holder_weights::Holder;
use leasehold_core::principal::Principal;
use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::convert::InvalidField;
use leasehold_proto::refusal::{item_refusal, refusal, Reason};
use leasehold_proto::v1 as pb;
use tonic::{Request, Status};

use super::context::NodeContext;
use super::leader::command_error_status;
use super::metrics::Rejection;
use crate::auth::{authorize_region, PeerInfo};

/// Who sent a call, as its connection proved it.
pub struct Caller {
    /// The principal its certificate proves (anonymous in plaintext).
    pub principal: Principal,
    /// Its peer, for the refusals counted against it.
    pub peer: Option<PeerInfo>,
}

impl Caller {
    /// The sender of `request`.
    pub fn of<T>(request: &Request<T>) -> Self {
        Self {
            principal: crate::auth::caller(request),
            peer: request.extensions().get::<PeerInfo>().cloned(),
        }
    }
}

/// Answers `leasehold.v1.Coordinator` calls for one group of a member.
#[derive(Clone)]
pub struct CoordinatorApi {
    node: Arc<NodeContext>,
    /// The leader's pool memory — demand reports, the regions of recent
    /// windows, capped asks — held while leading (see
    /// `leasehold_core::pool::desk`).
    pool_desk: Arc<std::sync::Mutex<PoolDesk>>,
}

impl CoordinatorApi {
    /// The API over a group's shared context.
    pub fn new(node: Arc<NodeContext>) -> Self {
        Self {
            node,
            pool_desk: Arc::default(),
        }
    }

    /// The Raft handle of this API's group.
    pub fn raft(&self) -> leasehold_raft_store::Raft {
        self.node.raft.clone()
    }

    /// The group this API answers for.
    pub fn context(&self) -> &Arc<NodeContext> {
        &self.node
    }

    /// The `INVALID_ARGUMENT` refusal of `error`, counted.
    fn invalid(&self, error: InvalidField) -> Status {
        self.node
            .metrics
            .record_rejection(Rejection::InvalidArgument);
        Status::from(error)
    }

    /// Refuses unless `caller` may act for `region`.
    fn require_region(&self, caller: &Caller, region: &str) -> Result<(), Status> {
        authorize_region(&caller.principal, region).map_err(|refusal| {
            self.node
                .metrics
                .auth
                .refuse(caller.peer.as_ref(), "Coordinator", refusal)
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
    /// `Lease` in this group.
    pub async fn lease(
        &self,
        caller: &Caller,
        request: pb::LeaseRequest,
    ) -> Result<pb::LeaseResponse, Status> {
        self.require_region(caller, &request.region)?;
        let tokens = request.tokens;
        let command = convert::lease_command(request, caller.principal.clone())
            .map_err(|e| self.invalid(e))?;
        self.node.require_leader()?;
        self.node.metrics.record_lease_request(tokens);
        match self.write(command).await? {
            Outcome::Lease(grant) => Ok(pb::LeaseResponse::from(&grant)),
            other => Err(unexpected(&other)),
        }
    }

    /// `Reconcile` in this group.
    pub async fn reconcile(
        &self,
        caller: &Caller,
        request: pb::ReconcileRequest,
    ) -> Result<pb::ReconcileResponse, Status> {
        self.require_region(caller, &request.region)?;
        let command = convert::reconcile_command(request, caller.principal.clone())
            .map_err(|e| self.invalid(e))?;
        match self.write(command).await? {
            Outcome::Reconcile(outcome) => Ok(pb::ReconcileResponse::from(&outcome)),
            other => Err(unexpected(&other)),
        }
    }

    /// `PoolGrant` in this group, with its join ahead if it asks one.
    pub async fn pool_grant(
        &self,
        caller: &Caller,
        mut request: pb::PoolGrantRequest,
    ) -> Result<pb::PoolGrantResponse, Status> {
        self.require_region(caller, &request.region)?;
        let caller = &caller.principal;
        let demands =
            convert::tenant_demands(&request.tenant_demands).map_err(|e| self.invalid(e))?;
        let demand_window = request.demand_window_start_ms;
        let holder = self.pool_holder(caller, &request.node, &request.holder)?;
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
                Ok(response)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// `PoolRelease` in this group, with its join ahead if it asks one.
    pub async fn pool_release(
        &self,
        caller: &Caller,
        mut request: pb::PoolReleaseRequest,
    ) -> Result<pb::PoolReleaseResponse, Status> {
        self.require_region(caller, &request.region)?;
        let caller = &caller.principal;
        let join_next = request.join_next.take();
        let holder = self.pool_holder(caller, &request.node, &request.holder)?;
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
                convert::join_next_command(join, key.clone(), region.clone(), caller.clone())
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
                Ok(response)
            }
            other => Err(unexpected(&other)),
        }
    }

    /// Who a pool call by `caller` declares for: the node it names, else
    /// its process (`holder`), else its region's anonymous holder
    /// ([`Holder::of`]).
    fn pool_holder(&self, caller: &Principal, node: &str, session: &str) -> Result<Holder, Status> {
        let node = convert::pool_node(node).map_err(|e| self.invalid(e))?;
        let session = convert::pool_holder(session).map_err(|e| self.invalid(e))?;
        Ok(Holder::of(caller, node, session))
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

    /// `GetWindow` in this group: a linearizable read of the key's window.
    pub async fn get_window(
        &self,
        request: &pb::GetWindowRequest,
    ) -> Result<pb::GetWindowResponse, Status> {
        let key = convert::window_key(request).map_err(|e| self.invalid(e))?;
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
            Ok(view) => Ok(convert::window_response(&key, &view)),
            Err(error) => {
                self.node.metrics.record_rejection(Rejection::NoPolicy);
                Err(command_error_status(&error))
            }
        }
    }
}

/// What becomes of one item of a batch before anything is proposed.
enum BatchSlot {
    /// Refused by identity or input; nothing proposed for it.
    Refused(Status),
    /// Proposed as the `n`th command.
    Proposed(usize),
}

impl CoordinatorApi {
    /// The items of a `LeaseBatch` this group answers: each validated and
    /// authorized as a `Lease` alone would be, the valid ones proposed
    /// together through group commit, each answered with its own outcome.
    /// A failure to propose (not the leader, no quorum, ...) fails them
    /// all: retrying them with the same request ids is exactly-once per
    /// item.
    pub async fn lease_items(
        &self,
        caller: &Caller,
        items: Vec<pb::LeaseRequest>,
    ) -> Result<Vec<pb::LeaseItemResult>, Status> {
        self.node.require_leader()?;
        let mut slots = Vec::with_capacity(items.len());
        let mut commands = Vec::with_capacity(items.len());
        for item in items {
            if let Err(refused) = authorize_region(&caller.principal, &item.region) {
                let status = self.node.metrics.auth.refuse(
                    caller.peer.as_ref(),
                    "Coordinator/LeaseBatch",
                    refused,
                );
                slots.push(BatchSlot::Refused(status));
                continue;
            }
            let tokens = item.tokens;
            match convert::lease_command(item, caller.principal.clone()) {
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
}
