//! The regional escrow node (L2): serves one region's clients from credits
//! it leases from the coordinator cluster.
//!
//! - [`config`]: the node's configuration ([`EscrowConfig`]) and its name
//!   across restarts; [`config_file`]: its TOML config file (`--config`).
//! - [`actor`]: one actor per key (handle + task, bounded mailbox) performing
//!   what the key's sans-IO
//!   [`KeyMachine`](leasehold_core::escrow::machine::KeyMachine) decides:
//!   the lease, pool and reconcile RPCs (at most one in flight), timers,
//!   replies and metrics. It sees only [`key_shared`]: what every key actor
//!   shares (key settings, the coordinator client and lease coalescer,
//!   reachability, the policy table, the node's counters).
//! - [`table`]: the key table (bounded; idle actors evicted), over
//!   [`shared`]: the node's state beside the actors' (configuration,
//!   listener counters, refusals by identity, RLS state).
//! - [`service`]: the `leasehold.v1.Escrow` gRPC service (Acquire, Check,
//!   Return, Status) through the key table. The node also serves
//!   `leasehold.v1.Monitor` (`Watch`, see [`crate::monitor::escrow`]).
//! - [`outage`]: when the node enters and leaves a coordinator outage
//!   (one log line each way, with what the outage cost).
//! - [`fair_throttle`]: which keys a fair throttle (FAIR) fronts, its
//!   validation, and who the caller is.
//! - [`prometheus`]: the node's `/metrics`.
//! - [`rls`], [`rls_state`] and [`rls_wire`]: Envoy's rate limit service
//!   (RLS v3) in front of the Escrow service's admissions; the domains,
//!   counters and refund book it serves with (shared with [`shared`],
//!   depending on nothing of the node); its route with descriptor entries
//!   read as bytes. Nothing below the front depends on it.
//!
//! [`run_escrow`] serves them on injected connections, [`serve_escrow`] on
//! real TCP in the serve shell it shares with members
//! ([`crate::serving`]).
//!
//! Credits are in memory only: they die with their window, so a restarted
//! escrow node simply leases afresh. Policies (kind, outage mode) are read
//! from the cluster and refreshed on a cadence, so runtime changes apply.

pub mod actor;
pub mod config;
pub mod config_file;
pub mod fair_throttle;
pub mod key_shared;
pub mod outage;
pub mod prometheus;
pub mod rls;
pub mod rls_state;
pub mod rls_wire;
pub mod service;
pub mod shared;
pub mod table;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use leasehold_client::coordinator::{CoordinatorClient, RetryOptions};
use leasehold_client::transport::{Dialer, WallClock};
use leasehold_proto::v1::escrow_server::EscrowServer;
use leasehold_proto::v1::monitor_server::MonitorServer;

use crate::auth::{AuthLayer, Scope};
use crate::error::NodeError;
use crate::monitor::escrow::EscrowSampler;
use crate::monitor::watch::MonitorApi;
use crate::monitor::WatchSlots;
use crate::net::{bounded_incoming, AcceptError, MAX_RESPONSE_BYTES};
use crate::serving::{
    announce_shutdown, health_and_reflection, serve_on_tcp, serve_routes, Connection,
    ConnectionServer,
};
use crate::tls::SecurityChoiceError;
pub use config::{
    cut_to_node_name, default_node_name, host_name, node_name_of, EscrowConfig,
    DEFAULT_MAX_TENANT_WEIGHT, MAX_COORDINATOR_TIMEOUT_MS,
};
pub use fair_throttle::FairThrottleRule;
use service::EscrowApi;
use shared::EscrowShared;
use table::KeyTable;

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
    IO: Connection,
    IE: Into<AcceptError>,
{
    config.validate()?;
    let timeout = Duration::from_millis(config.coordinator_timeout_ms);
    // The whole deadline is spent retrying, not a fixed few attempts: a
    // leader change (a step-down, an election after a crash) lasts a few
    // hundred ms, and a call that rides through it is not an outage, so
    // the services behind the node are not denied for it.
    let options = RetryOptions {
        call_timeout: timeout,
        total_timeout: timeout,
        max_attempts: u32::MAX,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(100),
    };
    let client = match config.coordinator_rng_seed {
        Some(seed) => CoordinatorClient::with_seed(&config.coordinators, dialer, options, seed),
        None => CoordinatorClient::with_options(&config.coordinators, dialer, options),
    }
    .map_err(|e| NodeError::Invalid(format!("escrow coordinator: {e}")))?;
    if let Some(name) = &config.node_name {
        client
            .set_node_name(name)
            .map_err(|e| NodeError::Invalid(format!("escrow node-name: {e}")))?;
    }
    let shared = EscrowShared::new(config.clone(), client, clock.clone());
    let table = KeyTable::new(shared.clone());
    let limits = config.limits;
    let incoming = bounded_incoming(incoming, &limits, shared.connections.clone());
    let refresher = tokio::spawn(shared::refresh_policies(shared.clone()));
    let rls_reloader = shared
        .rls
        .clone()
        .map(|state| tokio::spawn(rls::reload_periodically(state)));
    let (metrics_stop, metrics_stopped) = tokio::sync::watch::channel(false);
    let metrics_task = match &config.metrics_listen {
        Some(addr) => {
            let metrics_table = table.clone();
            let render: crate::metrics_http::Render = Arc::new(move || {
                let shared = &metrics_table.shared;
                prometheus::render(
                    &shared::status_of(shared, metrics_table.active_keys()),
                    &prometheus::Observations::of(shared),
                )
            });
            // Ready once serving, like the gRPC health of leasehold.v1.Escrow:
            // a node that cannot reach the coordinator still answers from
            // what it holds and by each key's outage policy.
            let exposed = crate::metrics_http::Exposed {
                render,
                readiness: Arc::new(|| Ok(())),
            };
            Some(crate::metrics_http::spawn_metrics_listener(addr, exposed, metrics_stopped).await?)
        }
        None => None,
    };
    let (health_reporter, routes) = health_and_reflection(
        &[
            leasehold_proto::v1::escrow_server::SERVICE_NAME,
            leasehold_proto::v1::monitor_server::SERVICE_NAME,
        ],
        limits.max_request_bytes,
    )?;
    health_reporter
        .set_serving::<EscrowServer<EscrowApi>>()
        .await;
    if config.rls.is_some() {
        health_reporter
            .set_serving::<rls_wire::RateLimitServer<rls::RateLimitApi>>()
            .await;
    }
    tracing::info!(region = %config.region, listen = %config.listen, "escrow node serving");
    let auth = AuthLayer::new(
        Scope::Escrow {
            region: config.region.clone(),
        },
        shared.auth_refusals.clone(),
    );
    let (shutdown, closing) = announce_shutdown(shutdown);
    let monitor = MonitorApi::new(
        Arc::new(EscrowSampler::new(table.clone())),
        clock,
        Arc::new(WatchSlots::default()),
        closing,
    );
    let mut routes = routes
        .add_service(
            EscrowServer::new(EscrowApi::new(table.clone()))
                .max_decoding_message_size(limits.max_request_bytes)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        )
        .add_service(
            MonitorServer::new(monitor)
                .max_decoding_message_size(limits.max_request_bytes)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        );
    if let Some(rls) = &config.rls {
        let domains: Vec<&str> = rls.domains.iter().map(|d| d.domain.as_str()).collect();
        tracing::info!(?domains, "serving Envoy's rate limit service (RLS v3)");
    }
    if let Some(state) = shared.rls.clone() {
        routes = routes.add_service(
            rls_wire::RateLimitServer::new(rls::RateLimitApi::new(
                EscrowApi::new(table.clone()),
                state,
            ))
            .max_decoding_message_size(limits.max_request_bytes)
            .max_encoding_message_size(MAX_RESPONSE_BYTES),
        );
    }
    let served = serve_routes(
        limits.server_builder(),
        (shared.connections.clone(), auth),
        routes,
        incoming,
        shutdown,
    )
    .await;
    refresher.abort();
    if let Some(reloader) = rls_reloader {
        reloader.abort();
    }
    let _ = metrics_stop.send(true);
    if let Some(task) = metrics_task {
        let _ = task.await;
    }
    let still_running = table
        .return_everything(Duration::from_millis(config.shutdown_drain_ms))
        .await;
    if still_running > 0 {
        tracing::warn!(region = %config.region, keys = still_running, drain_ms = config.shutdown_drain_ms,
            "escrow node stopped before every key handed its credits back (they die with their windows)");
    }
    tracing::info!(region = %config.region, "escrow node stopped");
    served.map_err(NodeError::Serve)
}

/// Runs an escrow node on real TCP with the system clock: mutual TLS in and
/// out with `config.security`'s files (reloaded when they change), or
/// plaintext when it is `Insecure`; refuses to start without a choice.
pub async fn serve_escrow(
    config: EscrowConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), NodeError> {
    config.validate()?;
    let security = config
        .security
        .clone()
        .ok_or_else(|| NodeError::Invalid(SecurityChoiceError::Missing.to_string()))?;
    let listen = config.listen.clone();
    serve_on_tcp(&listen, security, EscrowOnTcp { config, shutdown }).await
}

/// An escrow node [`serve_escrow`] runs on the connections of its listener.
struct EscrowOnTcp<S> {
    config: EscrowConfig,
    shutdown: S,
}

impl<S: Future<Output = ()> + Send> ConnectionServer for EscrowOnTcp<S> {
    fn run_on<I, IO, IE>(
        self,
        incoming: I,
        dialer: Arc<dyn Dialer>,
        clock: Arc<dyn WallClock>,
    ) -> impl Future<Output = Result<(), NodeError>> + Send
    where
        I: Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: Connection,
        IE: Into<AcceptError> + Send + 'static,
    {
        run_escrow(self.config, incoming, dialer, clock, self.shutdown)
    }
}
