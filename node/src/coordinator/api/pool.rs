//! `PoolGrant` and `PoolRelease`: a region's share of a `fair` key's pool
//! raised or handed back, each with its join of the next window ahead —
//! planned by the leader's pool desk (capped asks, lapses first, the join
//! last) and proposed in one group commit.

use leasehold_core::coordinator::{Command, Outcome};
use leasehold_core::pool::desk::{PoolCall, PoolDesk};
use leasehold_core::pool::holder_weights::Holder;
use leasehold_core::principal::Principal;
use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::v1 as pb;
use tonic::Status;

use super::group::{add_notes, unexpected, Caller, CoordinatorApi};
use crate::coordinator::leader::command_error_status;

impl CoordinatorApi {
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
    /// returns the call's outcome and the join's, as the desk reads them
    /// back ([`PoolDesk::finish`]). A refused call is its error status.
    async fn propose_pool_call(
        &self,
        call: PoolCall,
    ) -> Result<(Outcome, Option<Outcome>), Status> {
        let now_ms = self.node.clock.now_ms();
        let leader = Principal::Member(self.node.id);
        let (commands, receipt) = self
            .node
            .state
            .read(|state| self.desk().plan(state, call, now_ms, &leader))
            .into_parts();
        let (outcomes, failed) = match self.propose_commands(commands).await {
            Ok(outcomes) => (outcomes, None),
            Err(status) => (Vec::new(), Some(status)),
        };
        // Applied or refused: the asks it planned no longer wait in the log.
        let finished = self.desk().finish(receipt, outcomes);
        if let Some(status) = failed {
            return Err(status);
        }
        let Some(finished) = finished else {
            return Err(refusal(Reason::Internal, "no outcome for the pool call"));
        };
        self.node
            .metrics
            .record_pool_reserves_lapsed(finished.lapsed);
        match finished.call {
            Outcome::Rejected(error) => Err(command_error_status(&error)),
            outcome => Ok((outcome, finished.join)),
        }
    }

    /// Proposes `commands` in one group: a lone command through group
    /// commit, several as one entry of their own. One outcome per command.
    async fn propose_commands(&self, commands: Vec<Command>) -> Result<Vec<Outcome>, Status> {
        if let [_] = commands.as_slice() {
            let Some(command) = commands.into_iter().next() else {
                return Err(refusal(Reason::Internal, "no command to propose"));
            };
            return Ok(vec![self.write(command).await?]);
        }
        self.node.require_leader()?;
        self.node.propose_all(commands).await
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
}
