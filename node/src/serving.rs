//! The serve shell a coordinator member and an escrow node share: binding
//! a TCP listener, accepting plaintext or mutual-TLS connections on it
//! ([`serve_on_tcp`], handing them to a [`ConnectionServer`]), and the gRPC
//! server around a listener's own services — health and reflection
//! ([`health_and_reflection`]), the refusal counting and identity checks
//! of every call, the shutdown that ends watch streams first
//! ([`announce_shutdown`]) — in [`serve_routes`].
//!
//! What each listener serves, and the connection bounds it applies to its
//! stream of accepted connections ([`crate::net::bounded_incoming`]), stay
//! with the member ([`crate::coordinator`]) and the escrow node
//! ([`crate::escrow`]); this module knows neither.

use std::future::Future;
use std::sync::Arc;

use futures::Stream;
use leasehold_client::transport::{Dialer, SystemClock, WallClock};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::transport::server::Connected;
use tonic_health::server::HealthReporter;

use crate::auth::AuthLayer;
use crate::error::NodeError;
use crate::net::{refusal_layer, AcceptError, ConnectionCounters};
use crate::tls::{
    ReloadingServerConfig, Security, TlsIncoming, DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_RELOAD_INTERVAL,
};

/// One accepted connection a gRPC server runs on: a TCP stream, a TLS
/// connection over one, or a simulated socket.
pub trait Connection: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static {}

impl<T> Connection for T where T: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static {}

/// A server that runs on a stream of accepted connections until it stops
/// (a coordinator member, an escrow node): what [`serve_on_tcp`] hands the
/// connections of its listener to.
pub trait ConnectionServer {
    /// Runs on `incoming`, dialing out with `dialer` and reading the wall
    /// clock `clock`, until the server's own shutdown.
    fn run_on<I, IO, IE>(
        self,
        incoming: I,
        dialer: Arc<dyn Dialer>,
        clock: Arc<dyn WallClock>,
    ) -> impl Future<Output = Result<(), NodeError>> + Send
    where
        I: Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: Connection,
        IE: Into<AcceptError> + Send + 'static;
}

/// Runs `server` on real TCP at `listen` with the system clock: mutual TLS
/// in and out with `security`'s files (reloaded when they change), or
/// plaintext when it is `Insecure` (with a warning: callers are then not
/// authenticated).
pub async fn serve_on_tcp(
    listen: &str,
    security: Security,
    server: impl ConnectionServer,
) -> Result<(), NodeError> {
    let dialer = security.dialer();
    let listener = bind(listen).await?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    match security {
        Security::Insecure => {
            tracing::warn!("serving plaintext (--insecure): callers are not authenticated");
            server.run_on(incoming, dialer, Arc::new(SystemClock)).await
        }
        Security::MutualTls(files) => {
            let tls = ReloadingServerConfig::load(files)?;
            let (_stop_reloading, stop) = watch::channel(false);
            tokio::spawn(tls.clone().watch(DEFAULT_RELOAD_INTERVAL, stop));
            let incoming = TlsIncoming::new(incoming, tls, DEFAULT_HANDSHAKE_TIMEOUT);
            server.run_on(incoming, dialer, Arc::new(SystemClock)).await
        }
    }
}

/// Binds a TCP listener on `addr` (`host:port`).
pub async fn bind(addr: &str) -> Result<tokio::net::TcpListener, NodeError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| NodeError::Bind {
            addr: addr.to_string(),
            source,
        })
}

/// `shutdown` as a server takes it, and a signal that turns true when it
/// begins: watch streams end on it, so none holds the server open.
pub fn announce_shutdown(
    shutdown: impl Future<Output = ()> + Send,
) -> (impl Future<Output = ()> + Send, watch::Receiver<bool>) {
    let (closing_tx, closing) = watch::channel(false);
    let shutdown = async move {
        shutdown.await;
        let _ = closing_tx.send(true);
    };
    (shutdown, closing)
}

/// What every gRPC listener serves beside its own services: health
/// (`grpc.health.v1`, reported through the returned reporter) and
/// reflection (v1 and v1alpha) advertising `services`, each reading
/// requests of at most `max_request_bytes`. The listener adds its own
/// services to the routes.
pub fn health_and_reflection(
    services: &[&str],
    max_request_bytes: usize,
) -> Result<(HealthReporter, Routes), NodeError> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let (reflection, reflection_v1alpha) = crate::reflection::reflection_services(services)
        .map_err(|e| NodeError::Reflection(e.to_string()))?;
    let routes = Routes::new(health_service)
        .add_service(reflection.max_decoding_message_size(max_request_bytes))
        .add_service(reflection_v1alpha.max_decoding_message_size(max_request_bytes));
    Ok((health_reporter, routes))
}

/// Serves `routes` on `incoming` with `server`'s limits until `shutdown`:
/// every call checked by `auth` before any handler runs, every refused
/// request counted in `counters` ([`refusal_layer`]). In-flight requests
/// finish after `shutdown`.
pub async fn serve_routes<I, IO, IE>(
    server: tonic::transport::Server,
    (counters, auth): (Arc<ConnectionCounters>, AuthLayer),
    routes: Routes,
    incoming: I,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: Connection,
    IE: Into<AcceptError>,
{
    let mut server = server.layer(refusal_layer(counters)).layer(auth);
    server
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
}
