//! `Lease`: a grant of tokens of a key's current window to a region.

use leasehold_core::coordinator::Outcome;
use leasehold_proto::convert::coordinator as convert;
use leasehold_proto::v1 as pb;
use tonic::Status;

use super::group::{unexpected, Caller, CoordinatorApi};

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
}
