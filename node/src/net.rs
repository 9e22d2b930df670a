//! Bounds on what a network peer can hold open on a listener, before any
//! request is read: a cap on open connections and a deadline for the first
//! byte of each connection, plus the gRPC server limits built on top.
//!
//! [`bounded_incoming`] wraps *any* stream of accepted connections (real TCP,
//! simulated sockets, or a TLS acceptor placed after it) and yields
//! [`BoundedConnection`]s:
//! - each connection holds one permit of a semaphore of
//!   [`ServerLimits::max_connections`]; the permit is released when the
//!   connection is dropped. At the cap a newly accepted connection is closed
//!   at once and counted (`connections_refused_at_capacity`).
//! - a connection that sends nothing within
//!   [`ServerLimits::first_byte_timeout_ms`] of its accept is closed (its next
//!   read fails with `TimedOut`) and counted
//!   (`connections_closed_idle_before_first_byte`). After the first byte,
//!   HTTP/2 keep-alive drops dead peers.
//! - when accepting itself fails for lack of file descriptors or memory
//!   (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`), the stream waits
//!   [`ACCEPT_ERROR_BACKOFF`] before accepting again instead of spinning.
//!
//! The wrapped connection forwards
//! [`Connected::connect_info`](tonic::transport::server::Connected::connect_info) of the inner
//! one, so handlers still see the peer address (and certificates).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use crate::connection_adapter::{AdaptedConnection, ReadAdapter};
use futures::Stream;
use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::REASON_METADATA;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Sleep;

/// How long the listener pauses after an accept failed for lack of file
/// descriptors or memory, so it does not spin on the failing accept.
pub const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_millis(100);

/// Largest HTTP/2 header list a server accepts (`SETTINGS_MAX_HEADER_LIST_SIZE`).
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// HTTP/2 flow-control window of one stream (bytes in flight before the
/// server acknowledges).
pub const STREAM_WINDOW_BYTES: u32 = 1024 * 1024;

/// HTTP/2 flow-control window of one connection, all streams together.
pub const CONNECTION_WINDOW_BYTES: u32 = 4 * 1024 * 1024;

/// Streams a client may open and reset before the server has accepted them
/// (the "rapid reset" bound); beyond it the connection is closed.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 64;

/// Largest response any public service encodes. Responses are sized by
/// state that is bounded elsewhere (policies, regions per window), never by
/// the caller's bytes.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024 * 1024;

/// Why a set of server limits was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid server limit: {field} {problem}")]
pub struct LimitError {
    /// The limit's config field.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

/// The resource limits of one gRPC listener (coordinator member or escrow
/// node). Every field has a default and is checked by [`Self::validate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Most connections open at once; beyond it new ones are closed at once.
    pub max_connections: usize,
    /// A connection that sends no byte within this long of its accept is closed.
    pub first_byte_timeout_ms: u64,
    /// `SETTINGS_MAX_CONCURRENT_STREAMS` advertised to every client (and the
    /// per-connection concurrency limit of the services).
    pub max_concurrent_streams: u32,
    /// Longest a request may take, body included; then it fails (`CANCELLED`).
    pub request_timeout_ms: u64,
    /// Largest request message the public services decode; a larger one is
    /// refused with `RESOURCE_EXHAUSTED` before its body is buffered.
    pub max_request_bytes: usize,
}

/// Default of [`ServerLimits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 4_096;
/// Default of [`ServerLimits::first_byte_timeout_ms`].
pub const DEFAULT_FIRST_BYTE_TIMEOUT_MS: u64 = 10_000;
/// Default of [`ServerLimits::max_concurrent_streams`].
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 256;
/// Default of [`ServerLimits::request_timeout_ms`].
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Default of [`ServerLimits::max_request_bytes`]: far above the largest
/// legitimate public request (an `InitRequest` of a few members, a policy
/// with a 256-byte prefix, a lease with a 256-byte key), far below what could
/// hurt a member when multiplied by streams and connections.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 64 * 1024;

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            first_byte_timeout_ms: DEFAULT_FIRST_BYTE_TIMEOUT_MS,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            request_timeout_ms: DEFAULT_REQUEST_TIMEOUT_MS,
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
        }
    }
}

impl ServerLimits {
    /// Checks that every limit is usable (non-zero, within what HTTP/2 allows).
    pub fn validate(&self) -> Result<(), LimitError> {
        let bad = |field: &'static str, problem: &str| {
            Err(LimitError {
                field,
                problem: problem.to_string(),
            })
        };
        if self.max_connections == 0 {
            return bad("max_connections", "must be greater than 0");
        }
        if self.max_connections > Semaphore::MAX_PERMITS {
            return bad("max_connections", "is larger than the semaphore allows");
        }
        if self.first_byte_timeout_ms == 0 {
            return bad("first_byte_timeout_ms", "must be greater than 0");
        }
        if self.max_concurrent_streams == 0 {
            return bad("max_concurrent_streams", "must be greater than 0");
        }
        if self.request_timeout_ms == 0 {
            return bad("request_timeout_ms", "must be greater than 0");
        }
        if self.max_request_bytes < 1024 {
            return bad("max_request_bytes", "must be at least 1024");
        }
        if self.max_request_bytes > MAX_RESPONSE_BYTES {
            return bad(
                "max_request_bytes",
                "must not exceed the response limit (4 MiB)",
            );
        }
        Ok(())
    }

    /// [`first_byte_timeout_ms`](Self::first_byte_timeout_ms) as a duration.
    pub fn first_byte_timeout(&self) -> Duration {
        Duration::from_millis(self.first_byte_timeout_ms)
    }

    /// [`request_timeout_ms`](Self::request_timeout_ms) as a duration.
    pub fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }

    /// A tonic server builder with these limits applied: advertised stream
    /// cap, per-connection concurrency, rapid-reset bound, header list size,
    /// flow-control windows and request timeout.
    pub fn server_builder(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.max_concurrent_streams)
            .concurrency_limit_per_connection(self.max_concurrent_streams as usize)
            .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
            .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            .timeout(self.request_timeout())
            .trace_fn(crate::telemetry::server_span)
    }
}

/// Counters of one listener; read with [`ConnectionCounters::snapshot`].
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    accepted: AtomicU64,
    refused_at_capacity: AtomicU64,
    closed_idle_before_first_byte: AtomicU64,
    accept_errors: AtomicU64,
    requests_refused_too_large: AtomicU64,
    responses_resource_exhausted: AtomicU64,
}

impl ConnectionCounters {
    /// Every counter as `(name, value)`.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        vec![
            ("connections_accepted", read(&self.accepted)),
            (
                "connections_refused_at_capacity",
                read(&self.refused_at_capacity),
            ),
            (
                "connections_closed_idle_before_first_byte",
                read(&self.closed_idle_before_first_byte),
            ),
            ("connection_accept_errors", read(&self.accept_errors)),
            (
                "requests_refused_too_large",
                read(&self.requests_refused_too_large),
            ),
            (
                "responses_resource_exhausted",
                read(&self.responses_resource_exhausted),
            ),
        ]
        .into_iter()
        // The process's TLS listeners' handshake refusals (0 in plaintext).
        .chain(crate::tls::HANDSHAKES.snapshot())
        .collect()
    }

    /// Counts the status of one response and gives the refusals tonic makes
    /// itself (before a handler runs) their `ErrorInfo` reason: an oversized
    /// message (tonic says `OUT_OF_RANGE`; the gRPC convention and this
    /// project's is `RESOURCE_EXHAUSTED`), an undecodable body (tonic says
    /// `INTERNAL`; it is the caller's fault: `INVALID_ARGUMENT`), an unknown
    /// method and the request timeout. Statuses that already carry details
    /// pass unchanged.
    fn observe_response<B>(&self, response: &mut http::Response<B>) {
        let headers = response.headers_mut();
        let code = headers
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .map(tonic::Code::from_i32);
        let Some(code) = code.filter(|code| *code != tonic::Code::Ok) else {
            return;
        };
        let rewrite = if headers.contains_key("grpc-status-details-bin") {
            None
        } else {
            let message = tonic::Status::from_header_map(headers)
                .map(|status| status.message().to_string())
                .unwrap_or_default();
            tonic_refusal_reason(code, &message).map(|reason| (reason, message))
        };
        let final_code = rewrite.as_ref().map_or(code, |(reason, _)| reason.code());
        if let Some((reason, message)) = rewrite {
            if reason == Reason::RequestTooLarge {
                self.requests_refused_too_large
                    .fetch_add(1, Ordering::Relaxed);
            }
            let mut rewritten = http::HeaderMap::new();
            if refusal(reason, message).add_header(&mut rewritten).is_ok() {
                for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
                    match rewritten.get(name) {
                        Some(value) => {
                            headers.insert(name, value.clone());
                        }
                        None => {
                            headers.remove(name);
                        }
                    }
                }
                headers.insert(
                    REASON_METADATA,
                    http::HeaderValue::from_static(reason.as_str()),
                );
            }
        }
        if final_code == tonic::Code::ResourceExhausted {
            self.responses_resource_exhausted
                .fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The reason of a refusal tonic made itself, told by its code and message.
fn tonic_refusal_reason(code: tonic::Code, message: &str) -> Option<Reason> {
    use tonic::Code;
    match code {
        Code::OutOfRange if message.contains("message length too large") => {
            Some(Reason::RequestTooLarge)
        }
        Code::Internal if message.contains("failed to decode") => Some(Reason::MalformedRequest),
        Code::Unimplemented => Some(Reason::UnknownMethod),
        Code::Cancelled if message.contains("Timeout expired") => Some(Reason::RequestTimeout),
        _ => None,
    }
}

/// A tower layer over a gRPC server's routes that counts refused requests
/// and reports an oversized message as `RESOURCE_EXHAUSTED` (see
/// [`ConnectionCounters::snapshot`]).
pub fn refusal_layer<B>(
    counters: Arc<ConnectionCounters>,
) -> tower::util::MapResponseLayer<impl Fn(http::Response<B>) -> http::Response<B> + Clone> {
    tower::util::MapResponseLayer::new(move |mut response: http::Response<B>| {
        counters.observe_response(&mut response);
        response
    })
}

/// An accepted connection with its connection-cap permit and first-byte deadline.
pub type BoundedConnection<IO> = AdaptedConnection<IO, FirstByteDeadline>;

/// What a [`BoundedConnection`] holds besides the connection: its permit and,
/// until the first byte arrives, the deadline for it.
pub struct FirstByteDeadline {
    /// Released when the connection is dropped.
    _permit: OwnedSemaphorePermit,
    /// Set until the first byte arrives.
    deadline: Option<Pin<Box<Sleep>>>,
    counters: Arc<ConnectionCounters>,
}

impl<IO: AsyncRead + Unpin> ReadAdapter<IO> for FirstByteDeadline {
    fn poll_read(
        &mut self,
        inner: Pin<&mut IO>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = inner.poll_read(cx, buf);
        let Some(deadline) = self.deadline.as_mut() else {
            return polled;
        };
        match polled {
            Poll::Ready(Ok(())) if buf.filled().len() > before => {
                self.deadline = None;
                Poll::Ready(Ok(()))
            }
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => match deadline.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => {
                    self.deadline = None;
                    self.counters
                        .closed_idle_before_first_byte
                        .fetch_add(1, Ordering::Relaxed);
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no byte received before the first-byte deadline",
                    )))
                }
            },
        }
    }
}

/// The error type [`bounded_incoming`] yields (what tonic accepts).
pub type AcceptError = Box<dyn std::error::Error + Send + Sync>;

/// The stream [`bounded_incoming`] returns.
pub struct BoundedIncoming<S> {
    inner: Pin<Box<S>>,
    permits: Arc<Semaphore>,
    first_byte_timeout: Duration,
    counters: Arc<ConnectionCounters>,
    backoff: Option<Pin<Box<Sleep>>>,
}

/// Wraps a stream of accepted connections with the connection cap, the
/// first-byte deadline and the accept-error backoff of `limits` (see the
/// module doc); counts into `counters`.
pub fn bounded_incoming<S, IO, E>(
    incoming: S,
    limits: &ServerLimits,
    counters: Arc<ConnectionCounters>,
) -> BoundedIncoming<S>
where
    S: Stream<Item = Result<IO, E>>,
{
    BoundedIncoming {
        inner: Box::pin(incoming),
        permits: Arc::new(Semaphore::new(
            limits.max_connections.min(Semaphore::MAX_PERMITS),
        )),
        first_byte_timeout: limits.first_byte_timeout(),
        counters,
        backoff: None,
    }
}

/// Whether an accept failed for lack of descriptors or memory (worth a pause).
fn is_resource_shortage(error: &AcceptError) -> bool {
    let Some(io_error) = error.downcast_ref::<io::Error>() else {
        return false;
    };
    // Linux errno values (EMFILE and ENFILE are the same on every Unix).
    const EMFILE: i32 = 24;
    const ENFILE: i32 = 23;
    const ENOBUFS: i32 = 105;
    const ENOMEM: i32 = 12;
    matches!(
        io_error.raw_os_error(),
        Some(EMFILE | ENFILE | ENOBUFS | ENOMEM)
    ) || io_error.kind() == io::ErrorKind::OutOfMemory
}

impl<S, IO, E> Stream for BoundedIncoming<S>
where
    S: Stream<Item = Result<IO, E>>,
    E: Into<AcceptError>,
{
    type Item = Result<BoundedConnection<IO>, AcceptError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(backoff) = this.backoff.as_mut() {
                if backoff.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                this.backoff = None;
            }
            let accepted = match this.inner.as_mut().poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(None),
                Poll::Ready(Some(Err(error))) => {
                    let error: AcceptError = error.into();
                    this.counters.accept_errors.fetch_add(1, Ordering::Relaxed);
                    if is_resource_shortage(&error) {
                        tracing::warn!(%error, "accept failed; pausing the listener");
                        this.backoff = Some(Box::pin(tokio::time::sleep(ACCEPT_ERROR_BACKOFF)));
                    }
                    return Poll::Ready(Some(Err(error)));
                }
                Poll::Ready(Some(Ok(io))) => io,
            };
            let Ok(permit) = this.permits.clone().try_acquire_owned() else {
                // At the cap: close the new connection at once (drop) and
                // keep accepting, so the backlog drains instead of filling.
                this.counters
                    .refused_at_capacity
                    .fetch_add(1, Ordering::Relaxed);
                drop(accepted);
                continue;
            };
            this.counters.accepted.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Some(Ok(AdaptedConnection::new(
                accepted,
                FirstByteDeadline {
                    _permit: permit,
                    deadline: Some(Box::pin(tokio::time::sleep(this.first_byte_timeout))),
                    counters: this.counters.clone(),
                },
            ))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tonic::transport::server::Connected;

    struct Duplex(tokio::io::DuplexStream);

    impl AsyncRead for Duplex {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Duplex {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    impl Connected for Duplex {
        type ConnectInfo = u32;
        fn connect_info(&self) -> u32 {
            7
        }
    }

    fn limits(max_connections: usize, first_byte_timeout_ms: u64) -> ServerLimits {
        ServerLimits {
            max_connections,
            first_byte_timeout_ms,
            ..ServerLimits::default()
        }
    }

    fn value(counters: &ConnectionCounters, name: &str) -> u64 {
        counters
            .snapshot()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v)
            .unwrap_or(u64::MAX)
    }

    #[tokio::test]
    async fn connections_beyond_the_cap_are_dropped_until_a_permit_is_released() {
        let (mut peers, servers): (Vec<_>, Vec<_>) = (0..3)
            .map(|_| {
                let (a, b) = tokio::io::duplex(64);
                (a, Ok::<_, io::Error>(Duplex(b)))
            })
            .unzip();
        let counters = Arc::new(ConnectionCounters::default());
        let mut incoming = bounded_incoming(
            futures::stream::iter(servers),
            &limits(1, 60_000),
            counters.clone(),
        );
        let first = incoming.next().await.unwrap().unwrap();
        assert_eq!(first.connect_info(), 7, "connect info is forwarded");
        drop(first);
        // The permit is back: the second connection gets it; the third is dropped.
        let second = incoming.next().await.unwrap().unwrap();
        assert!(incoming.next().await.is_none());
        assert_eq!(value(&counters, "connections_accepted"), 2);
        assert_eq!(value(&counters, "connections_refused_at_capacity"), 1);
        // The dropped third connection reads end-of-stream on its peer side.
        let mut byte = [0u8; 1];
        assert_eq!(peers.pop().unwrap().read(&mut byte).await.unwrap(), 0);
        drop(second);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_silent_past_the_deadline_fails_its_read_but_a_talking_one_does_not() {
        let (mut talker, talker_server) = tokio::io::duplex(64);
        let (_silent, silent_server) = tokio::io::duplex(64);
        let counters = Arc::new(ConnectionCounters::default());
        let sources = vec![
            Ok::<_, io::Error>(Duplex(talker_server)),
            Ok(Duplex(silent_server)),
        ];
        let mut incoming = bounded_incoming(
            futures::stream::iter(sources),
            &limits(10, 1_000),
            counters.clone(),
        );
        let mut talking = incoming.next().await.unwrap().unwrap();
        let mut silent = incoming.next().await.unwrap().unwrap();
        talker.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        assert_eq!(talking.read(&mut byte).await.unwrap(), 1);
        let error = silent.read(&mut byte).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        // Long after the deadline the talking connection still waits for data.
        let later = tokio::time::timeout(Duration::from_secs(5), talking.read(&mut byte)).await;
        assert!(later.is_err(), "a connection that talked is not timed out");
        assert_eq!(
            value(&counters, "connections_closed_idle_before_first_byte"),
            1
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_accept_failing_for_lack_of_descriptors_pauses_the_listener() {
        let emfile = || Err::<Duplex, io::Error>(io::Error::from_raw_os_error(24));
        let counters = Arc::new(ConnectionCounters::default());
        let mut incoming = bounded_incoming(
            futures::stream::iter(vec![emfile(), emfile()]),
            &limits(10, 1_000),
            counters.clone(),
        );
        let started = tokio::time::Instant::now();
        assert!(incoming.next().await.unwrap().is_err());
        assert!(incoming.next().await.unwrap().is_err());
        assert!(started.elapsed() >= ACCEPT_ERROR_BACKOFF);
        assert_eq!(value(&counters, "connection_accept_errors"), 2);
    }

    #[test]
    fn each_unusable_limit_is_named() {
        let cases = [
            (
                ServerLimits {
                    max_connections: 0,
                    ..ServerLimits::default()
                },
                "max_connections",
            ),
            (
                ServerLimits {
                    first_byte_timeout_ms: 0,
                    ..ServerLimits::default()
                },
                "first_byte_timeout_ms",
            ),
            (
                ServerLimits {
                    max_concurrent_streams: 0,
                    ..ServerLimits::default()
                },
                "max_concurrent_streams",
            ),
            (
                ServerLimits {
                    request_timeout_ms: 0,
                    ..ServerLimits::default()
                },
                "request_timeout_ms",
            ),
            (
                ServerLimits {
                    max_request_bytes: 10,
                    ..ServerLimits::default()
                },
                "max_request_bytes",
            ),
        ];
        ServerLimits::default().validate().unwrap();
        for (limits, field) in cases {
            assert_eq!(limits.validate().unwrap_err().field, field);
        }
    }
}
