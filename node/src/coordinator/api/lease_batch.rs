//! `LeaseBatch`: the items of a batch this group answers, proposed
//! together through group commit, each answered on its own.

use leasehold_core::coordinator::Outcome;
use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::refusal::item_refusal;
use leasehold_proto::v1 as pb;
use tonic::Status;

use super::group::{unexpected, Caller, CoordinatorApi};
use crate::coordinator::leader::command_error_status;

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
            if let Err(status) =
                self.require_region_in(caller, &item.region, "Coordinator/LeaseBatch")
            {
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
