//! How Leasehold processes reach each other and read the time: the [`Dialer`]
//! seam (a `host:port` becomes a tonic [`Channel`], or for the members'
//! framed Raft transport a plain byte stream) and the [`WallClock`] seam
//! (epoch milliseconds).
//!
//! Both are injected rather than called directly so the same node and client
//! code runs over real TCP and the system clock in production, and over a
//! simulated network and clock in the chaos suite. [`TcpDialer`] and
//! [`SystemClock`] are the production implementations.
//!
//! Addresses are written `host:port`; `http://host:port` (with or without a
//! trailing `/`) is accepted everywhere and normalised by [`normalize_addr`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

/// The future a [`Dialer`] returns.
pub type DialFuture = Pin<Box<dyn Future<Output = Result<Channel, DialError>> + Send + 'static>>;

/// A connected byte stream (TCP, TLS over TCP, a simulated socket).
pub trait ByteStream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}

impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> ByteStream for T {}

/// The future [`Dialer::dial_stream`] returns.
pub type StreamDialFuture =
    Pin<Box<dyn Future<Output = Result<Box<dyn ByteStream>, DialError>> + Send + 'static>>;

/// Turns a peer address into a gRPC channel. Implementations decide how the
/// bytes travel (real TCP, a simulated network) and set connection-level
/// options such as connect timeouts and HTTP/2 keep-alive.
///
/// Callers re-dial after a failed call rather than reusing a channel that may
/// be wedged, so a dial should be cheap (lazy channels are fine).
pub trait Dialer: Send + Sync + 'static {
    /// A channel to `addr` (`host:port`, already normalised).
    fn dial(&self, addr: &str) -> DialFuture;

    /// A connected byte stream to `addr` (`host:port`), with the same
    /// security as [`dial`](Self::dial)'s channels (TLS when they use it),
    /// bounded by the dialer's connect timeout. The coordinator members'
    /// framed Raft transport runs over it. The default is
    /// [`DialError::Unsupported`]: the members then use gRPC.
    fn dial_stream(&self, addr: &str) -> StreamDialFuture {
        let addr = addr.to_string();
        Box::pin(async move { Err(DialError::Unsupported { addr }) })
    }
}

/// Why a peer address could not be turned into a channel.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DialError {
    /// The address is not of the form `host:port`.
    #[error("invalid address {addr:?}: {reason}")]
    InvalidAddress {
        /// The address as given.
        addr: String,
        /// What is wrong with it.
        reason: String,
    },
    /// This process's TLS material (CA, certificate, key) is unusable.
    #[error("TLS credentials for {addr}: {reason}")]
    Credentials {
        /// The address dialled.
        addr: String,
        /// What is wrong with the files.
        reason: String,
    },
    /// Connecting failed.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// The transport's explanation.
        reason: String,
    },
    /// This dialer makes gRPC channels only, not byte streams.
    #[error("no byte streams to {addr} from this dialer")]
    Unsupported {
        /// The address dialled.
        addr: String,
    },
}

/// Normalises an address to `host:port`: strips an `http://` scheme and a
/// trailing `/`, and checks a non-empty host and a numeric port are present.
///
/// ```
/// use leasehold_client::transport::normalize_addr;
/// assert_eq!(normalize_addr("http://127.0.0.1:7101/").unwrap(), "127.0.0.1:7101");
/// assert_eq!(normalize_addr("n1:7100").unwrap(), "n1:7100");
/// assert!(normalize_addr("n1").is_err());
/// ```
pub fn normalize_addr(addr: &str) -> Result<String, DialError> {
    let invalid = |reason: &str| DialError::InvalidAddress {
        addr: addr.to_string(),
        reason: reason.to_string(),
    };
    let trimmed = addr.trim();
    let without_scheme = trimmed.strip_prefix("http://").unwrap_or(trimmed);
    if without_scheme.contains("://") {
        return Err(invalid("only plain http:// endpoints are supported"));
    }
    let hostport = without_scheme.trim_end_matches('/');
    if hostport.contains('/') {
        return Err(invalid("expected host:port without a path"));
    }
    let Some((host, port)) = hostport.rsplit_once(':') else {
        return Err(invalid("expected host:port"));
    };
    if host.is_empty() {
        return Err(invalid("the host is empty"));
    }
    if port.parse::<u16>().is_err() {
        return Err(invalid("the port is not a number between 0 and 65535"));
    }
    Ok(hostport.to_string())
}

/// Every address of `endpoints` normalised ([`normalize_addr`]), in the
/// order given, each once.
pub fn normalize_endpoints<I, S>(endpoints: I) -> Result<Vec<String>, DialError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let mut normalized: Vec<String> = Vec::new();
    for endpoint in endpoints {
        let addr = normalize_addr(endpoint.as_ref())?;
        if !normalized.contains(&addr) {
            normalized.push(addr);
        }
    }
    Ok(normalized)
}

/// The URI tonic needs for a normalised `host:port`.
pub fn endpoint_uri(addr: &str) -> String {
    format!("http://{addr}")
}

/// Connection options of [`TcpDialer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TcpDialerOptions {
    /// Bound on establishing a TCP connection.
    pub connect_timeout: Duration,
    /// Interval of HTTP/2 PING frames on an open connection.
    pub keep_alive_interval: Duration,
    /// How long to wait for a PING acknowledgement before dropping the connection.
    pub keep_alive_timeout: Duration,
}

impl TcpDialerOptions {
    /// Bound on establishing a TCP connection.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// HTTP/2 keep-alive: PING interval and how long to wait for its
    /// acknowledgement.
    pub fn with_keep_alive(mut self, interval: Duration, timeout: Duration) -> Self {
        self.keep_alive_interval = interval;
        self.keep_alive_timeout = timeout;
        self
    }
}

impl Default for TcpDialerOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_millis(1_000),
            keep_alive_interval: Duration::from_millis(2_000),
            keep_alive_timeout: Duration::from_millis(2_000),
        }
    }
}

/// Dials real TCP with a connect timeout, `TCP_NODELAY` and HTTP/2
/// keep-alive (also while idle, so a dead peer is noticed between calls).
/// Channels are lazy: the connection is made on first use.
#[derive(Debug, Clone, Default)]
pub struct TcpDialer {
    options: TcpDialerOptions,
}

impl TcpDialer {
    /// A dialer with the given options.
    pub fn new(options: TcpDialerOptions) -> Self {
        Self { options }
    }

    /// The endpoint this dialer would connect, with every option applied.
    pub fn endpoint(&self, addr: &str) -> Result<Endpoint, DialError> {
        let addr = normalize_addr(addr)?;
        self.endpoint_for_uri(&addr, endpoint_uri(&addr))
    }

    /// The endpoint of `uri` (the address `addr` with a scheme), with every
    /// option applied.
    pub(crate) fn endpoint_for_uri(&self, addr: &str, uri: String) -> Result<Endpoint, DialError> {
        let endpoint = Endpoint::from_shared(uri).map_err(|e| DialError::InvalidAddress {
            addr: addr.to_string(),
            reason: e.to_string(),
        })?;
        Ok(endpoint
            .connect_timeout(self.options.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(self.options.keep_alive_interval)
            .keep_alive_timeout(self.options.keep_alive_timeout)
            .keep_alive_while_idle(true))
    }
}

impl TcpDialer {
    /// The options this dialer connects with.
    pub fn options(&self) -> TcpDialerOptions {
        self.options
    }

    /// A TCP connection to `addr` (`host:port`) within the connect
    /// timeout, with `TCP_NODELAY`.
    pub async fn connect_tcp(&self, addr: &str) -> Result<TcpStream, DialError> {
        let addr = normalize_addr(addr)?;
        let failed = |reason: String| DialError::Connect {
            addr: addr.clone(),
            reason,
        };
        let stream = tokio::time::timeout(self.options.connect_timeout, TcpStream::connect(&addr))
            .await
            .map_err(|_| {
                failed(format!(
                    "no connection within {} ms",
                    self.options.connect_timeout.as_millis()
                ))
            })?
            .map_err(|e| failed(e.to_string()))?;
        stream
            .set_nodelay(true)
            .map_err(|e| failed(e.to_string()))?;
        Ok(stream)
    }
}

impl Dialer for TcpDialer {
    fn dial(&self, addr: &str) -> DialFuture {
        let endpoint = self.endpoint(addr);
        Box::pin(async move { Ok(endpoint?.connect_lazy()) })
    }

    fn dial_stream(&self, addr: &str) -> StreamDialFuture {
        let (dialer, addr) = (self.clone(), addr.to_string());
        Box::pin(async move {
            let stream: Box<dyn ByteStream> = Box::new(dialer.connect_tcp(&addr).await?);
            Ok(stream)
        })
    }
}

impl fmt::Debug for dyn Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Dialer")
    }
}

/// A source of wall-clock time in epoch milliseconds. The coordinator leader
/// stamps proposals with it; nothing compares it across hosts (DESIGN §4).
pub trait WallClock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// The host's system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

impl fmt::Debug for dyn WallClock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WallClock")
    }
}

/// A request for `message` with a deadline of `timeout`, carrying the
/// current span's W3C trace context when the `otel` feature is on
/// ([`crate::trace_context`]): how this crate builds every call.
pub fn outgoing<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    #[cfg(feature = "otel")]
    crate::trace_context::inject_current(request.metadata_mut());
    request
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn accepts_host_port_with_or_without_scheme() {
        assert_eq!(normalize_addr("127.0.0.1:7101").unwrap(), "127.0.0.1:7101");
        assert_eq!(normalize_addr("http://n1:7100").unwrap(), "n1:7100");
        assert_eq!(normalize_addr(" http://n1:7100/ ").unwrap(), "n1:7100");
        assert_eq!(normalize_addr("[::1]:7100").unwrap(), "[::1]:7100");
    }

    #[test]
    fn rejects_malformed_addresses() {
        for bad in [
            "",
            "n1",
            ":7100",
            "n1:",
            "n1:x",
            "n1:70000",
            "https://n1:7100",
            "n1:7100/path",
        ] {
            assert!(normalize_addr(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[tokio::test]
    async fn tcp_dialer_builds_lazy_channels_and_rejects_bad_addresses() {
        let dialer = TcpDialer::default();
        assert!(dialer.dial("127.0.0.1:1").await.is_ok());
        assert!(matches!(
            dialer.dial("nope").await,
            Err(DialError::InvalidAddress { .. })
        ));
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now_ms() > 1_577_836_800_000);
    }

    proptest! {
        /// Normalising is idempotent and the port survives it.
        #[test]
        fn normalize_is_idempotent(host in "[a-z][a-z0-9.-]{0,20}", port in 0u16..) {
            let once = normalize_addr(&format!("http://{host}:{port}/")).unwrap();
            prop_assert_eq!(normalize_addr(&once).unwrap(), once.clone());
            let suffix = format!(":{}", port);
            prop_assert!(once.ends_with(&suffix));
        }
    }
}
