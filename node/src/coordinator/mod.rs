//! The coordinator member (L3): one Raft member on its stores, serving the
//! Coordinator, Admin, Monitor, Raft and health gRPC services on an
//! injected listener.
//!
//! [`run_coordinator`] takes everything that touches the outside world as
//! arguments — the stores, the stream of accepted connections, the dialer
//! for peers, the wall clock and the shutdown signal — so the same code runs
//! on real TCP ([`serve`]) and in the turmoil simulation. Inside, only
//! `tokio::time` measures time.
//!
//! Layout: [`context`] (what handlers share), [`shard`] (the shards a
//! member hosts and the Coordinator service's routing: which group answers
//! a key) over [`api`] (one group's side of it, one file per RPC),
//! [`admin`] (the Admin service), [`batcher`] (group commit), [`leader`]
//! (leader view and hints), [`network`], [`raft_service`], [`peer_frames`],
//! [`frame_link`] and [`frame_server`] (the peer transport: frames, or gRPC
//! to older members), [`stores`] (the groups' Raft stores on disk),
//! [`metrics`] (counters) and [`prometheus`] (their exposition), `tasks`
//! (health and clock ticks, readiness), [`status_log`] and [`peer_links`]
//! (one log line per change of leader, membership or peer link). The TCP
//! and TLS shell it serves in is [`crate::serving`]'s, shared with the
//! escrow node.

pub mod admin;
pub mod api;
pub mod batcher;
pub mod context;
pub mod frame_link;
pub mod frame_server;
pub mod leader;
pub mod metrics;
pub mod network;
pub mod peer_frames;
pub mod peer_links;
pub mod prometheus;
pub mod raft_service;
pub mod shard;
pub mod status_log;
pub mod stores;
mod tasks;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use leasehold_client::transport::{Dialer, WallClock};
use leasehold_proto::v1::admin_server::AdminServer;
use leasehold_proto::v1::coordinator_server::CoordinatorServer;
use leasehold_proto::v1::monitor_server::MonitorServer;
use leasehold_raft_store::Raft;
use tokio::sync::watch;

use self::admin::AdminApi;
use self::api::CoordinatorApi;
use self::context::{store_has_log, GroupParts, NodeContext};
use self::frame_server::{split_framed, FrameServer};
use self::metrics::NodeMetrics;
use self::network::PeerNetwork;
use self::raft_service::RaftService;
use self::shard::hosting::ShardHost;
use self::shard::routing::{HostedApis, ShardRouting};
use self::stores::ShardStoreOpener;
pub use self::stores::{open_stores, CoordinatorStores};
use crate::auth::{AuthLayer, Scope};
use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::monitor::member::MemberSampler;
use crate::monitor::watch::MonitorApi;
use crate::monitor::WatchSlots;
use crate::net::{bounded_incoming, AcceptError, MAX_RESPONSE_BYTES};
use crate::serving::{
    announce_shutdown, health_and_reflection, serve_on_tcp, serve_routes, Connection,
    ConnectionServer,
};

/// HTTP/2 keep-alive of the server side: a peer that stops acknowledging
/// PINGs is dropped instead of holding a wedged connection.
const SERVER_KEEP_ALIVE: Duration = Duration::from_secs(2);

/// Runs one coordinator member until `shutdown` resolves, then stops the
/// server (in-flight requests finish), the batcher and Raft, and returns
/// once every task has ended and the stores are released.
///
/// - `incoming`: accepted connections (a `TcpListenerStream`, or simulated
///   sockets implementing tonic's `Connected`). They are bounded here by
///   the connection cap and first-byte deadline of `config`
///   ([`crate::net::bounded_incoming`]).
/// - `dialer`: how to reach peers (`host:port` from the membership).
/// - `clock`: wall clock the leader stamps proposals with.
pub async fn run_coordinator<I, IO, IE>(
    config: NodeConfig,
    stores: CoordinatorStores,
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
    let shard_stores = stores::on_disk(config.data_dir.clone());
    run_coordinator_with_shards(
        config,
        stores,
        shard_stores,
        incoming,
        dialer,
        clock,
        shutdown,
    )
    .await
}

/// [`run_coordinator`] with the stores of the shards past 0 this member
/// comes to host opened by `shard_stores` (the simulation's power-loss
/// disks; on a real member `data_dir/shards/<id>`, [`stores::on_disk`]).
pub async fn run_coordinator_with_shards<I, IO, IE>(
    config: NodeConfig,
    stores: CoordinatorStores,
    shard_stores: ShardStoreOpener,
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
    let raft_config = config.raft_config()?;
    let peer_message_limit = config.peer_message_limit_bytes()?;
    let limits = config.server_limits();
    let (log_store, state_machine) = stores;
    let state = state_machine.reader();
    let has_log = store_has_log(&log_store).await?;
    let log_flush_latency = log_store.flush_latency();
    let network = PeerNetwork::new(config.id, dialer).with_max_message_bytes(peer_message_limit);
    let shard_network = network.clone();
    let raft = Raft::new(config.id, raft_config, network, log_store, state_machine)
        .await
        .map_err(|e| NodeError::Raft(e.to_string()))?;

    let metrics = Arc::new(NodeMetrics::default());
    let connection_counters = metrics.connections();
    let incoming = bounded_incoming(incoming, &limits, connection_counters.clone());
    let (stop, stopped) = watch::channel(false);
    let raft_service = RaftService::new(
        raft.clone(),
        state.clone(),
        config.join_members.iter().copied().collect(),
        has_log,
        metrics.auth.clone(),
    );
    let incoming = split_framed(
        incoming,
        FrameServer {
            service: raft_service.clone(),
            max_frame_bytes: peer_message_limit,
            stopped: stopped.clone(),
        },
    );
    let (node, batcher_task) = NodeContext::start(
        GroupParts {
            id: config.id,
            raft: raft.clone(),
            state,
            log_flush_latency,
        },
        config,
        clock,
        metrics,
        stopped.clone(),
    );

    let hosted_apis = HostedApis::default();
    let hosted_apis_for_metrics = hosted_apis.clone();
    let hosted_apis_for_admin = hosted_apis.clone();
    let hosted_apis_for_watch = hosted_apis.clone();
    let routing = Arc::new(ShardRouting::new(
        CoordinatorApi::new(node.clone()),
        hosted_apis.clone(),
    ));
    let shard_host = ShardHost::new(
        node.clone(),
        shard_network,
        shard_stores,
        raft_service.hosted_shards(),
        hosted_apis,
    );

    let public_request_limit = limits.max_request_bytes;
    let (health_reporter, routes) = health_and_reflection(
        &[
            leasehold_proto::v1::coordinator_server::SERVICE_NAME,
            leasehold_proto::v1::admin_server::SERVICE_NAME,
            leasehold_proto::v1::monitor_server::SERVICE_NAME,
        ],
        public_request_limit,
    )?;
    let mut background = vec![
        tokio::spawn(tasks::report_health(
            raft.clone(),
            health_reporter,
            stopped.clone(),
        )),
        tokio::spawn(tasks::tick_clock(node.clone(), stopped.clone())),
        tokio::spawn(status_log::log_status_changes(
            raft.clone(),
            stopped.clone(),
        )),
        tokio::spawn(shard_host.run(stopped)),
    ];
    background.push(batcher_task);
    if let Some(addr) = node.config.metrics_listen.clone() {
        let render_node = Arc::clone(&node);
        let render_shards = hosted_apis_for_metrics.clone();
        let ready_raft = raft.clone();
        let exposed = crate::metrics_http::Exposed {
            render: Arc::new(move || prometheus::render(&render_node, &render_shards)),
            readiness: Arc::new(move || tasks::readiness(&ready_raft)),
        };
        background.push(
            crate::metrics_http::spawn_metrics_listener(&addr, exposed, stop.subscribe()).await?,
        );
    }

    let (shutdown, closing) = announce_shutdown(shutdown);
    let membership = raft.clone();
    let monitor = MonitorApi::new(
        Arc::new(
            MemberSampler::new(node.clone()).with_shards(hosted_apis_for_watch, routing.clone()),
        ),
        node.clock.clone(),
        Arc::new(WatchSlots::default()),
        closing,
    )
    .with_member_gate(Arc::new(move |id| {
        membership
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
            .any(|(member, _)| *member == id)
    }));

    tracing::info!(id = node.id, listen = %node.config.listen, "coordinator member serving");
    let auth = AuthLayer::new(Scope::Coordinator, node.metrics.auth.clone());
    let routes = routes
        .add_service(
            CoordinatorServer::from_arc(routing)
                .max_decoding_message_size(public_request_limit)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        )
        .add_service(
            AdminServer::new(AdminApi::new(node.clone()).with_hosted(hosted_apis_for_admin))
                .max_decoding_message_size(public_request_limit)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        )
        .add_service(
            MonitorServer::new(monitor)
                .max_decoding_message_size(public_request_limit)
                .max_encoding_message_size(MAX_RESPONSE_BYTES),
        )
        .add_service(
            raft_service
                .into_server()
                .max_decoding_message_size(peer_message_limit)
                .max_encoding_message_size(peer_message_limit),
        );
    let server = limits
        .server_builder()
        .http2_keepalive_interval(Some(SERVER_KEEP_ALIVE))
        .http2_keepalive_timeout(Some(SERVER_KEEP_ALIVE));
    let served = serve_routes(
        server,
        (connection_counters, auth),
        routes,
        incoming,
        shutdown,
    )
    .await;

    tracing::info!(id = node.id, "coordinator member stopping");
    let _ = stop.send(true);
    for task in background {
        let _ = task.await;
    }
    drop(node);
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(error = %e, "raft did not shut down cleanly");
    }
    served.map_err(NodeError::Serve)
}

/// Runs a member on real TCP: opens the Raft store (segment files) under
/// `config.data_dir`, binds `config.listen` and stamps with the system
/// clock. With TLS material (see [`NodeConfig::security`]) every connection
/// is mutual TLS, in and out, and the files are reloaded when they change;
/// with `insecure` everything is plaintext. Neither refuses to start.
pub async fn serve(
    config: NodeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), NodeError> {
    config.validate()?;
    let security = config.security()?;
    let stores = open_stores(&config)?;
    let listen = config.listen.clone();
    let member = MemberOnTcp {
        config,
        stores,
        shutdown,
    };
    serve_on_tcp(&listen, security, member).await
}

/// A member [`serve`] runs on the connections of its listener.
struct MemberOnTcp<S> {
    config: NodeConfig,
    stores: CoordinatorStores,
    shutdown: S,
}

impl<S: Future<Output = ()> + Send> ConnectionServer for MemberOnTcp<S> {
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
        run_coordinator(
            self.config,
            self.stores,
            incoming,
            dialer,
            clock,
            self.shutdown,
        )
    }
}
