//! The regional escrow node (L2): serves one region's clients from credits
//! it leases from the coordinator cluster.
//!
//! - [`actor`]: one actor per key (handle + task, bounded mailbox) wrapping
//!   the sans-IO [`RegionEscrow`](leasehold_core::escrow::RegionEscrow);
//!   it performs the lease/reconcile RPCs, at most one lease in flight.
//! - [`service`]: the `leasehold.v1.Escrow` gRPC service (Acquire, Check,
//!   Return, Status) and the key table (bounded; idle actors evicted).
//!
//! Credits are in memory only: they die with their window, so a restarted
//! escrow node simply leases afresh. Policies (kind, outage mode) are read
//! from the cluster and refreshed on a cadence, so runtime changes apply.

pub mod actor;
pub mod service;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use leasehold_client::coordinator::{CoordinatorClient, RetryOptions};
use leasehold_client::transport::{Dialer, SystemClock, TcpDialer, WallClock};
use leasehold_core::ids::RegionId;
use leasehold_proto::v1::escrow_server::EscrowServer;
use tokio::io::{AsyncRead, AsyncWrite};
use tonic::transport::server::Connected;

use crate::error::NodeError;
use service::{EscrowApi, EscrowShared};

/// Configuration of one escrow node.
#[derive(Debug, Clone)]
pub struct EscrowConfig {
    /// The region this node serves.
    pub region: RegionId,
    /// `host:port` to listen on.
    pub listen: String,
    /// Coordinator members to lease from.
    pub coordinators: Vec<String>,
    /// Tokens per coordinator lease (at least the request's size); the
    /// starting size when `eoq` is set.
    pub batch: u64,
    /// Learn each key's lease size online (EOQ, `leasehold_core::sizer`)
    /// from the tokens it served per window, instead of a fixed batch.
    pub eoq: bool,
    /// While the coordinator is unreachable, one probe per this interval.
    pub probe_interval_ms: u64,
    /// Most keys tracked at once; new keys beyond it get `RESOURCE_EXHAUSTED`.
    pub max_keys: usize,
    /// Most tenants tracked per `fair` key; the oldest is evicted beyond it
    /// and its use keeps counting, so a tenant flood cannot over-admit.
    pub max_tenants: usize,
    /// A key's actor returns its credits and stops after this long idle.
    pub idle_evict_ms: u64,
    /// How often policies are re-read from the cluster.
    pub policy_refresh_ms: u64,
    /// Deadline of one coordinator call, retries included.
    pub coordinator_timeout_ms: u64,
}

impl EscrowConfig {
    /// Defaults for `region` listening on `listen`, leasing from `coordinators`.
    pub fn new(region: RegionId, listen: String, coordinators: Vec<String>) -> Self {
        EscrowConfig {
            region,
            listen,
            coordinators,
            batch: 16,
            eoq: false,
            probe_interval_ms: 1_000,
            max_keys: 100_000,
            max_tenants: 10_000,
            idle_evict_ms: 30_000,
            policy_refresh_ms: 2_000,
            coordinator_timeout_ms: 1_000,
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), NodeError> {
        let bad =
            |field: &str, why: &str| Err(NodeError::Invalid(format!("escrow {field}: {why}")));
        if self.coordinators.is_empty() {
            return bad("coordinator", "at least one coordinator member is needed");
        }
        if self.batch == 0 {
            return bad("batch", "must be at least 1");
        }
        if self.max_keys == 0 {
            return bad("max-keys", "must be at least 1");
        }
        if self.probe_interval_ms == 0 || self.coordinator_timeout_ms == 0 {
            return bad("intervals", "must be at least 1 ms");
        }
        Ok(())
    }
}

/// Runs an escrow node on the given listener and dialer until `shutdown`.
pub async fn run_escrow<I, IO, IE>(
    config: EscrowConfig,
    incoming: I,
    dialer: Arc<dyn Dialer>,
    clock: Arc<dyn WallClock>,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), NodeError>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IE: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    config.validate()?;
    let timeout = Duration::from_millis(config.coordinator_timeout_ms);
    let options = RetryOptions {
        call_timeout: timeout,
        total_timeout: timeout,
        max_attempts: 4,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
    };
    let client = CoordinatorClient::with_options(&config.coordinators, dialer, options)
        .map_err(|e| NodeError::Invalid(format!("escrow coordinator: {e}")))?;
    let shared = EscrowShared::new(config.clone(), client, clock);
    let refresher = tokio::spawn(service::refresh_policies(shared.clone()));
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<EscrowServer<EscrowApi>>()
        .await;
    tracing::info!(region = %config.region, listen = %config.listen, "escrow node serving");
    let served = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(EscrowServer::new(EscrowApi::new(shared.clone())))
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await;
    refresher.abort();
    shared.return_everything().await;
    tracing::info!(region = %config.region, "escrow node stopped");
    served.map_err(NodeError::Serve)
}

/// Runs an escrow node on real TCP with the system clock.
pub async fn serve_escrow(
    config: EscrowConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), NodeError> {
    config.validate()?;
    let listener = crate::coordinator::bind(&config.listen).await?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    run_escrow(
        config,
        incoming,
        Arc::new(TcpDialer::default()),
        Arc::new(SystemClock),
        shutdown,
    )
    .await
}
