//! The state an escrow node's key table and services share: the node's
//! configuration, what its key actors share ([`KeyShared`], all of the
//! node an actor sees), the listener's counters, refusals by identity and,
//! when the node serves it, the RLS state. The key actors never see it.

use std::sync::Arc;

use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::transport::WallClock;
use leasehold_proto::v1 as pb;

use super::config::EscrowConfig;
use super::key_shared::KeyShared;
use crate::net::ConnectionCounters;

/// State shared by the key table, the service and the RLS front.
pub struct EscrowShared {
    /// The node's configuration.
    pub config: EscrowConfig,
    /// What every key actor shares.
    pub keys: Arc<KeyShared>,
    /// The listener's counters (connections, refused requests).
    pub connections: Arc<ConnectionCounters>,
    /// Calls refused by identity (shared with the listener's auth layer).
    pub auth_refusals: Arc<crate::auth::AuthRefusals>,
    /// Envoy's rate limit service, when the node serves it: its domains
    /// and metrics.
    pub rls: Option<Arc<super::rls_state::RlsState>>,
}

impl std::fmt::Debug for EscrowShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EscrowShared")
            .field("region", &self.config.region)
            .finish()
    }
}

impl EscrowShared {
    /// Shared state for a node.
    pub fn new(
        config: EscrowConfig,
        client: CoordinatorClient,
        clock: Arc<dyn WallClock>,
    ) -> Arc<Self> {
        let rls = config
            .rls
            .as_ref()
            .map(|rls| Arc::new(super::rls_state::RlsState::new(rls)));
        Arc::new(EscrowShared {
            rls,
            keys: KeyShared::new(&config, client, clock),
            config,
            connections: Arc::default(),
            auth_refusals: Arc::default(),
        })
    }
}

/// Re-reads the policy table from the cluster on a cadence.
pub async fn refresh_policies(shared: Arc<EscrowShared>) {
    let every = std::time::Duration::from_millis(shared.config.policy_refresh_ms.max(10));
    loop {
        shared.keys.refresh_policies_now().await;
        tokio::time::sleep(every).await;
    }
}

/// This node's counters and state, as `Escrow.Status` answers them (and as
/// `/metrics` exports them).
pub(crate) fn status_of(s: &EscrowShared, active_keys: u64) -> pb::EscrowStatusResponse {
    pb::EscrowStatusResponse {
        counters: s
            .connections
            .snapshot()
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect(),
        refused_unauthenticated: s.auth_refusals.unauthenticated(),
        refused_permission_denied: s.auth_refusals.permission_denied(),
        ..s.keys.status(active_keys)
    }
}
