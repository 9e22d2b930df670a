//! The calls of a key's region fair pool. [`PoolGrantCall`] is one
//! `PoolGrant` request, built step by step (a report of the region's
//! tenants' demand, a join of the next window ahead, tokens beyond what the
//! region holds) and sent by [`CoordinatorClient::pool_grant`] in a pooled
//! session; [`PoolReleaseCall`] is one `PoolRelease`, sent by
//! [`CoordinatorClient::pool_release_with_id`] under the caller's request
//! id. Every pool call of a client names it as the holder, and the node it
//! speaks for when one is named (`PoolGrantRequest.holder`, `.node`).

use leasehold_proto::v1::{
    NextWindowJoin, PoolGrantRequest, PoolGrantResponse, PoolReleaseRequest, PoolReleaseResponse,
    RequestId, TenantDemand,
};

use super::call::RequestIds;
use super::client::CoordinatorClient;
use super::error::CoordinatorError;

/// One `PoolGrant`: raises a region's fair-pool grant of a key towards a
/// total.
///
/// ```
/// use leasehold_client::coordinator::PoolGrantCall;
///
/// let call = PoolGrantCall::new("chat/tokens", "eu", 1_000, 40).asking_more(10);
/// # let _ = call;
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PoolGrantCall {
    request: PoolGrantRequest,
}

impl PoolGrantCall {
    /// Raises `region`'s grant of `key`, the region weighing
    /// `region_weight`, towards `want_total`.
    pub fn new(key: &str, region: &str, region_weight: u64, want_total: u64) -> Self {
        Self {
            request: PoolGrantRequest {
                key: key.to_string(),
                region: region.to_string(),
                region_weight,
                want_total,
                ..PoolGrantRequest::default()
            },
        }
    }

    /// With a report of the region's tenants' demand in the window
    /// starting at `demand_window_start_ms`; the answer's `tenant_demands`
    /// are their totals over all regions (see the proto's
    /// `PoolGrantRequest.tenant_demands`).
    pub fn reporting(
        mut self,
        demand_window_start_ms: u64,
        tenant_demands: Vec<TenantDemand>,
    ) -> Self {
        self.request.demand_window_start_ms = demand_window_start_ms;
        self.request.tenant_demands = tenant_demands;
        self
    }

    /// Also joining the key's next window ahead with `join_next` (see the
    /// proto's `NextWindowJoin`; `None`: no join): the answer's
    /// `next_window` is the grant there, or `next_window_refused` says why
    /// there is none.
    pub fn joining_next(mut self, join_next: Option<NextWindowJoin>) -> Self {
        self.request.join_next = join_next;
        self
    }

    /// Asking for `want_more` tokens more than the region holds when the
    /// leader takes the call up, at least the total in all (the proto's
    /// `PoolGrantRequest.want_more`; 0, the default: the total alone).
    pub fn asking_more(mut self, want_more: u64) -> Self {
        self.request.want_more = want_more;
        self
    }
}

/// One `PoolRelease`: retires a region from a key's pool in a window,
/// keeping part of its total (reclaim).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolReleaseCall {
    request: PoolReleaseRequest,
}

impl PoolReleaseCall {
    /// Retires `region` from `key`'s pool in the window starting at
    /// `window_start_ms`, keeping `keep_total` of `from_total`.
    pub fn new(
        key: &str,
        region: &str,
        from_total: u64,
        keep_total: u64,
        window_start_ms: u64,
    ) -> Self {
        Self {
            request: PoolReleaseRequest {
                key: key.to_string(),
                region: region.to_string(),
                from_total,
                keep_total,
                window_start_ms,
                ..PoolReleaseRequest::default()
            },
        }
    }

    /// Also joining the key's next window ahead with `join_next` (as
    /// [`PoolGrantCall::joining_next`]); a resend carries the same join.
    pub fn joining_next(mut self, join_next: Option<NextWindowJoin>) -> Self {
        self.request.join_next = join_next;
        self
    }
}

impl CoordinatorClient {
    /// Sends `call` (in a pooled session).
    #[tracing::instrument(name = "leasehold.coordinator.pool_grant", level = "debug", skip_all, fields(otel.kind = "client", key, region, want_total))]
    pub async fn pool_grant(
        &self,
        call: PoolGrantCall,
    ) -> Result<PoolGrantResponse, CoordinatorError> {
        let target = self.target_for(&call.request.key).await;
        let request = PoolGrantRequest {
            // This client is one holder (its node, when named, else
            // its process): the leader sums a region's weight over its
            // holders (the proto's PoolGrantRequest.node and .holder).
            holder: self.client_id().to_string(),
            node: self.node_name(),
            ..call.request
        };
        self.send_exactly_once(target, RequestIds::Pooled, |request_id| PoolGrantRequest {
            request_id: Some(request_id),
            ..request.clone()
        })
        .await
    }

    /// Sends `call` under an explicit request id (from
    /// [`next_request_id_for`](Self::next_request_id_for)): until the
    /// answer comes, the caller spends at most the total it keeps, and it
    /// retries the same id before any other pool call of the key (see the
    /// proto).
    #[tracing::instrument(name = "leasehold.coordinator.pool_release", level = "debug", skip_all, fields(otel.kind = "client", key, region))]
    pub async fn pool_release_with_id(
        &self,
        call: PoolReleaseCall,
        request_id: RequestId,
    ) -> Result<PoolReleaseResponse, CoordinatorError> {
        let request = PoolReleaseRequest {
            holder: self.client_id().to_string(),
            node: self.node_name(),
            ..call.request
        };
        let target = self.target_for(&request.key).await;
        self.send_exactly_once(target, RequestIds::Callers(request_id), |request_id| {
            PoolReleaseRequest {
                request_id: Some(request_id),
                ..request.clone()
            }
        })
        .await
    }
}
