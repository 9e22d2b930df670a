//! The calls on one key's window, each a thin wrapper of the generic call
//! to the leader of the key's shard: [`lease`](CoordinatorClient::lease)
//! (a pooled session's id, or the caller's), [`reconcile`](CoordinatorClient::reconcile)
//! and the linearizable read [`get_window`](CoordinatorClient::get_window).

use leasehold_proto::v1::{
    GetWindowRequest, GetWindowResponse, LeaseRequest, LeaseResponse, ReconcileRequest,
    ReconcileResponse, RequestId,
};

use super::call::RequestIds;
use super::client::CoordinatorClient;
use super::error::CoordinatorError;

impl CoordinatorClient {
    /// Leases up to `tokens` of `key`'s current window for `region`.
    pub async fn lease(
        &self,
        key: &str,
        region: &str,
        tokens: u64,
    ) -> Result<LeaseResponse, CoordinatorError> {
        self.lease_under(key, region, tokens, RequestIds::Pooled)
            .await
    }

    /// [`lease`](Self::lease) with an explicit request id.
    pub async fn lease_with_id(
        &self,
        key: &str,
        region: &str,
        tokens: u64,
        request_id: RequestId,
    ) -> Result<LeaseResponse, CoordinatorError> {
        self.lease_under(key, region, tokens, RequestIds::Callers(request_id))
            .await
    }

    #[tracing::instrument(name = "leasehold.coordinator.lease", level = "debug", skip_all, fields(otel.kind = "client", key, region, tokens))]
    async fn lease_under(
        &self,
        key: &str,
        region: &str,
        tokens: u64,
        ids: RequestIds,
    ) -> Result<LeaseResponse, CoordinatorError> {
        let target = self.target_for(key).await;
        self.send_exactly_once(target, ids, |request_id| LeaseRequest {
            key: key.to_string(),
            region: region.to_string(),
            tokens,
            request_id: Some(request_id),
        })
        .await
    }

    /// Returns `leftover` unused credits of the window starting at `window_start_ms`.
    #[tracing::instrument(name = "leasehold.coordinator.reconcile", level = "debug", skip_all, fields(otel.kind = "client", key, region, leftover))]
    pub async fn reconcile(
        &self,
        key: &str,
        region: &str,
        leftover: u64,
        window_start_ms: u64,
    ) -> Result<ReconcileResponse, CoordinatorError> {
        let target = self.target_for(key).await;
        self.send_exactly_once(target, RequestIds::Pooled, |request_id| ReconcileRequest {
            key: key.to_string(),
            region: region.to_string(),
            leftover,
            window_start_ms,
            request_id: Some(request_id),
        })
        .await
    }

    /// A linearizable view of `key`'s current window.
    #[tracing::instrument(name = "leasehold.coordinator.get_window", level = "debug", skip_all, fields(otel.kind = "client", key))]
    pub async fn get_window(&self, key: &str) -> Result<GetWindowResponse, CoordinatorError> {
        let target = self.target_for(key).await;
        let request = GetWindowRequest {
            key: key.to_string(),
        };
        self.send(target, request).await
    }
}
