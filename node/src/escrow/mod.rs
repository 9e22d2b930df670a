//! The regional escrow node (L2): serves one region's clients from credits
//! it leases from the coordinator cluster.
//!
//! - [`actor`]: one actor per key (handle + task, bounded mailbox) performing
//!   what the key's sans-IO
//!   [`KeyMachine`](leasehold_core::escrow::machine::KeyMachine) decides:
//!   the lease, pool and reconcile RPCs (at most one in flight), timers,
//!   replies and metrics.
//! - [`service`]: the `leasehold.v1.Escrow` gRPC service (Acquire, Check,
//!   Return, Status); [`table`]: the key table (bounded; idle actors
//!   evicted). The node also serves `leasehold.v1.Monitor` (`Watch`, see
//!   [`crate::monitor::escrow`]).
//! - [`outage`]: when the node enters and leaves a coordinator outage
//!   (one log line each way, with what the outage cost).
//! - [`fair_throttle`]: which keys a fair throttle (FAIR) fronts, its
//!   validation, and who the caller is.
//! - [`config_file`]: the node's TOML config file (`--config`).
//! - [`rls`], [`rls_state`] and [`rls_wire`]: Envoy's rate limit service
//!   (RLS v3) from the node's escrow; the domains, counters and refund book
//!   it serves with (shared with [`shared`], depending on nothing of the
//!   node); its route with descriptor entries read as bytes.
//!
//! [`run_escrow`] serves them on injected connections, [`serve_escrow`] on
//! real TCP in the serve shell it shares with members
//! ([`crate::serving`]).
//!
//! Credits are in memory only: they die with their window, so a restarted
//! escrow node simply leases afresh. Policies (kind, outage mode) are read
//! from the cluster and refreshed on a cadence, so runtime changes apply.

pub mod actor;
pub mod config_file;
pub mod fair_throttle;
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
use leasehold_core::escrow::HolderLimits;
use leasehold_core::ids::RegionId;
use leasehold_core::predictive_sizer::SizerKind;
use leasehold_proto::v1::escrow_server::EscrowServer;
use leasehold_proto::v1::monitor_server::MonitorServer;

use crate::auth::{AuthLayer, Scope};
use crate::error::NodeError;
use crate::monitor::escrow::EscrowSampler;
use crate::monitor::watch::MonitorApi;
use crate::monitor::WatchSlots;
use crate::net::{bounded_incoming, AcceptError, ServerLimits, MAX_RESPONSE_BYTES};
use crate::serving::{
    announce_shutdown, health_and_reflection, serve_on_tcp, serve_routes, Connection,
    ConnectionServer,
};
use crate::tls::{Security, SecurityChoiceError};
pub use fair_throttle::FairThrottleRule;
use service::EscrowApi;
use shared::EscrowShared;
use table::KeyTable;

/// The default bound on a tenant's declared weight ([`EscrowConfig::max_tenant_weight`]).
pub const DEFAULT_MAX_TENANT_WEIGHT: u64 = 1_000;

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
    /// starting size of the learning sizers.
    pub batch: u64,
    /// How each key's lease size is chosen: a fixed `batch`, the online EOQ
    /// learner (`leasehold_core::sizer`), or Hedge over a
    /// prediction-following expert and the EOQ learner
    /// (`leasehold_core::predictive_sizer`); the learners observe the
    /// tokens served per window.
    pub sizer: SizerKind,
    /// While the coordinator is unreachable, one probe per this interval.
    pub probe_interval_ms: u64,
    /// Most keys tracked at once; new keys beyond it get `RESOURCE_EXHAUSTED`.
    pub max_keys: usize,
    /// Of those, most first requested by one caller identity (TLS): its
    /// new keys beyond it get `RESOURCE_EXHAUSTED`, and only its own.
    pub max_keys_per_identity: usize,
    /// Most tenants tracked per `fair` key; the oldest is evicted beyond it
    /// and its use keeps counting, so a tenant flood cannot over-admit.
    pub max_tenants: usize,
    /// The largest tenant `weight` an Acquire or Check may declare (≥ 1).
    /// A request above it is refused with `INVALID_ARGUMENT` (reason
    /// `INVALID_FIELD`, field `weight`) before anything is admitted, so one
    /// service cannot declare its way to nearly all of its region's fair
    /// share, nor inflate its region's pool weight (Σ tenant weights).
    pub max_tenant_weight: u64,
    /// A key's actor returns its credits and stops after this long idle.
    pub idle_evict_ms: u64,
    /// Reclaim: a `fair` key without requests for this long hands the
    /// unspent part of its pool grant back (`PoolRelease`) while its window
    /// is current; 0 turns it off (a grant is then kept to the window's end).
    pub pool_release_idle_ms: u64,
    /// At shutdown, how long the node may spend handing credits back
    /// (final reconciles and pool releases) before it stops anyway.
    pub shutdown_drain_ms: u64,
    /// Bounds of each key's credit holders (caller, client id): holders per
    /// key (a new one beyond it gets `RESOURCE_EXHAUSTED`), answers and
    /// credit entries remembered per holder, how long an answer is kept.
    pub holder_limits: HolderLimits,
    /// How often policies are re-read from the cluster.
    pub policy_refresh_ms: u64,
    /// Deadline of one coordinator call, retries included: a call keeps
    /// retrying (following leader hints, backing off 10–100 ms) until it,
    /// so a leader change shorter than it is not an outage.
    pub coordinator_timeout_ms: u64,
    /// Connection cap, first-byte deadline, stream and request limits of
    /// the Escrow listener (see [`crate::net`]).
    pub limits: ServerLimits,
    /// Mutual TLS (the region's certificate, presented to clients and to
    /// the coordinator) or `Insecure`; `None` refuses to start on TCP.
    pub security: Option<Security>,
    /// Keys fronted by a fair throttle (FAIR), by key prefix: callers that
    /// keep finding the key's budget gone are throttled before it is gone.
    /// Empty: no key is.
    pub fair_throttle: Vec<FairThrottleRule>,
    /// Seed of the fair throttles' random source (hash seeds and draws);
    /// `None`: the OS's. Simulations set it so that a seed replays.
    pub fair_throttle_rng_seed: Option<u64>,
    /// Seed of the coordinator client's random choices (which member it
    /// tries first, retry jitter); `None`: the OS's. Simulations set it so
    /// that a seed replays.
    pub coordinator_rng_seed: Option<u64>,
    /// `host:port` of the Prometheus `/metrics` listener (plain HTTP; none
    /// when unset).
    pub metrics_listen: Option<String>,
    /// Envoy's rate limit service (RLS v3) with these domains, on the
    /// node's listener; not served when `None`.
    pub rls: Option<rls::RlsConfig>,
    /// The name this node keeps across its restarts, sent with its pool
    /// calls (`PoolGrantRequest.node`) so that the coordinator counts its
    /// region weight once however often it restarts. `None`: each process
    /// start is a holder of its own. `leasehold escrow` sets
    /// `--node-name`, by default [`default_node_name`].
    pub node_name: Option<String>,
}

/// The name an escrow node listening on `listen` goes by when none is
/// given: `<host name>:<port>` — a pod's name in Kubernetes, which its
/// container restarts keep, and unique among the processes of one host,
/// which listen on different ports. At most 128 bytes.
pub fn default_node_name(listen: &str) -> String {
    node_name_of(&host_name(), listen)
}

/// This host's name: the kernel's, else `HOSTNAME`, else `escrow`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| "escrow".to_string())
}

/// `<host>:<port of listen>` (the pure part of [`default_node_name`]).
pub fn node_name_of(host: &str, listen: &str) -> String {
    let port = listen.rsplit_once(':').map_or(listen, |(_, port)| port);
    cut_to_node_name(format!("{host}:{port}"))
}

/// `name` cut to the 128 bytes a node name may have, at a character
/// boundary.
pub fn cut_to_node_name(mut name: String) -> String {
    let mut end = name.len().min(leasehold_core::ids::MAX_CLIENT_ID_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// The longest deadline of one coordinator call (10 minutes): a longer one
/// would hold a waiting request past any caller's patience, and one near
/// `u64::MAX` ms would overflow the clock.
pub const MAX_COORDINATOR_TIMEOUT_MS: u64 = 600_000;

impl EscrowConfig {
    /// Defaults for `region` listening on `listen`, leasing from `coordinators`.
    pub fn new(region: RegionId, listen: String, coordinators: Vec<String>) -> Self {
        EscrowConfig {
            region,
            listen,
            coordinators,
            batch: 16,
            sizer: SizerKind::Fixed,
            probe_interval_ms: 1_000,
            max_keys: 100_000,
            max_keys_per_identity: 25_000,
            max_tenants: 10_000,
            max_tenant_weight: DEFAULT_MAX_TENANT_WEIGHT,
            idle_evict_ms: 30_000,
            pool_release_idle_ms: 1_000,
            shutdown_drain_ms: 5_000,
            holder_limits: HolderLimits::default(),
            policy_refresh_ms: 2_000,
            coordinator_timeout_ms: 1_000,
            limits: ServerLimits::default(),
            security: None,
            fair_throttle: Vec::new(),
            fair_throttle_rng_seed: None,
            coordinator_rng_seed: None,
            metrics_listen: None,
            rls: None,
            node_name: None,
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), NodeError> {
        let bad =
            |field: &str, why: &str| Err(NodeError::Invalid(format!("escrow {field}: {why}")));
        if self.coordinators.is_empty() {
            return bad("coordinator", "at least one coordinator member is needed");
        }
        if let Some(name) = &self.node_name {
            if let Err(e) = leasehold_core::ids::ClientId::new(name) {
                return Err(NodeError::Invalid(format!("escrow node-name: {e}")));
            }
        }
        if self.batch == 0 {
            return bad("batch", "must be at least 1");
        }
        if self.max_keys == 0 {
            return bad("max-keys", "must be at least 1");
        }
        if self.max_keys_per_identity == 0 {
            return bad("max-keys-per-identity", "must be at least 1");
        }
        if self.max_tenant_weight == 0 {
            return bad("max-tenant-weight", "must be at least 1");
        }
        if self.holder_limits.max_holders == 0 {
            return bad("max-holders-per-key", "must be at least 1");
        }
        if self.holder_limits.max_holders_per_principal == 0 {
            return bad("max-holders-per-identity", "must be at least 1");
        }
        if self.probe_interval_ms == 0 || self.coordinator_timeout_ms == 0 {
            return bad("intervals", "must be at least 1 ms");
        }
        if self.coordinator_timeout_ms > MAX_COORDINATOR_TIMEOUT_MS {
            return bad(
                "coordinator-timeout-ms",
                &format!("must be at most {MAX_COORDINATOR_TIMEOUT_MS} ms"),
            );
        }
        fair_throttle::validate_rules(&self.fair_throttle)?;
        self.limits
            .validate()
            .map_err(|e| NodeError::Invalid(format!("escrow {e}")))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EscrowConfig {
        EscrowConfig::new(
            RegionId::new("eu").expect("valid region"),
            "127.0.0.1:0".into(),
            vec!["127.0.0.1:7100".into()],
        )
    }

    #[test]
    fn the_coordinator_timeout_is_between_1_ms_and_ten_minutes() {
        let mut config = config();
        for (timeout, valid) in [(0, false), (1, true), (MAX_COORDINATOR_TIMEOUT_MS, true)] {
            config.coordinator_timeout_ms = timeout;
            assert_eq!(config.validate().is_ok(), valid, "{timeout} ms");
        }
        config.coordinator_timeout_ms = u64::MAX;
        let error = config
            .validate()
            .expect_err("a deadline past any clock is refused");
        assert!(
            error.to_string().contains("coordinator-timeout-ms"),
            "{error}"
        );
    }

    #[test]
    fn max_tenant_weight_defaults_to_1000_and_must_be_at_least_1() {
        let mut config = config();
        assert_eq!(config.max_tenant_weight, 1_000);
        assert!(config.validate().is_ok());
        config.max_tenant_weight = 0;
        let error = config.validate().expect_err("a zero bound is refused");
        assert!(error.to_string().contains("max-tenant-weight"), "{error}");
        config.max_tenant_weight = 1;
        assert!(config.validate().is_ok());
        config.max_tenant_weight = u64::MAX;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_node_name_is_the_host_and_port_within_128_bytes_and_is_checked() {
        assert_eq!(
            node_name_of("escrow-7f9c", "0.0.0.0:7201"),
            "escrow-7f9c:7201"
        );
        assert_eq!(node_name_of("h", "[::1]:7201"), "h:7201");
        let long = node_name_of(&"é".repeat(100), "0.0.0.0:7201");
        assert!(long.len() <= 128 && long.starts_with('é'), "{long}");
        assert!(!default_node_name("127.0.0.1:7201").is_empty());
        let mut config = config();
        config.node_name = Some(String::new());
        let error = config.validate().expect_err("an empty name is refused");
        assert!(error.to_string().contains("node-name"), "{error}");
        config.node_name = Some("n".repeat(129));
        assert!(config.validate().is_err());
        config.node_name = Some(default_node_name(&config.listen));
        assert!(config.validate().is_ok());
    }
}
