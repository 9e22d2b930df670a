//! Every unary RPC of the coordinator's services (`Coordinator` and
//! `Admin`), named by its request: [`Unary`] says which method a request is
//! sent to and what it answers, so that one generic call
//! ([`CoordinatorClient::send`](super::CoordinatorClient)) sends any of
//! them.

use std::future::Future;

use leasehold_proto::v1::admin_client::AdminClient as AdminRpc;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use leasehold_proto::v1::{
    AddLearnerRequest, AddLearnerResponse, ChangeMembershipRequest, ChangeMembershipResponse,
    ChangePlacementRequest, DeletePolicyRequest, DeletePolicyResponse, GetPlacementRequest,
    GetWindowRequest, GetWindowResponse, InitRequest, InitResponse, LeaseBatchRequest,
    LeaseBatchResponse, LeaseRequest, LeaseResponse, ListPoliciesRequest, ListPoliciesResponse,
    Placement, PoolGrantRequest, PoolGrantResponse, PoolReleaseRequest, PoolReleaseResponse,
    ReconcileRequest, ReconcileResponse, SetPolicyRequest, SetPolicyResponse, StatusRequest,
    StatusResponse, StepDownRequest, StepDownResponse,
};
use tonic::transport::Channel;
use tonic::Status;

/// A request of a unary RPC: it knows its method and its answer.
pub(super) trait Unary: Clone + Send + 'static {
    /// What the method answers.
    type Response: Send + 'static;

    /// Calls the method on `channel` with `request`.
    fn send(
        channel: Channel,
        request: tonic::Request<Self>,
    ) -> impl Future<Output = Result<tonic::Response<Self::Response>, Status>> + Send;
}

/// Implements [`Unary`] for each `Service::method(Request) -> Response`.
macro_rules! unary_rpcs {
    ($($service:ident::$method:ident($request:ty) -> $response:ty;)*) => {
        $(
            impl Unary for $request {
                type Response = $response;

                fn send(
                    channel: Channel,
                    request: tonic::Request<Self>,
                ) -> impl Future<Output = Result<tonic::Response<$response>, Status>> + Send {
                    async move { $service::new(channel).$method(request).await }
                }
            }
        )*
    };
}

unary_rpcs! {
    CoordinatorRpc::lease(LeaseRequest) -> LeaseResponse;
    CoordinatorRpc::lease_batch(LeaseBatchRequest) -> LeaseBatchResponse;
    CoordinatorRpc::reconcile(ReconcileRequest) -> ReconcileResponse;
    CoordinatorRpc::pool_grant(PoolGrantRequest) -> PoolGrantResponse;
    CoordinatorRpc::pool_release(PoolReleaseRequest) -> PoolReleaseResponse;
    CoordinatorRpc::get_window(GetWindowRequest) -> GetWindowResponse;
    CoordinatorRpc::get_placement(GetPlacementRequest) -> Placement;
    AdminRpc::init(InitRequest) -> InitResponse;
    AdminRpc::add_learner(AddLearnerRequest) -> AddLearnerResponse;
    AdminRpc::change_membership(ChangeMembershipRequest) -> ChangeMembershipResponse;
    AdminRpc::step_down(StepDownRequest) -> StepDownResponse;
    AdminRpc::status(StatusRequest) -> StatusResponse;
    AdminRpc::set_policy(SetPolicyRequest) -> SetPolicyResponse;
    AdminRpc::delete_policy(DeletePolicyRequest) -> DeletePolicyResponse;
    AdminRpc::list_policies(ListPoliciesRequest) -> ListPoliciesResponse;
    AdminRpc::change_placement(ChangePlacementRequest) -> Placement;
}
