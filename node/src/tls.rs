//! Mutual TLS on the node's listeners: server configuration from PEM files
//! (reloaded without restart when the files change), a TLS acceptor over any
//! stream of accepted connections, and the [`Principal`] a client
//! certificate names.
//!
//! - [`TlsFiles`]: where the CA bundle, certificate chain and private key live.
//! - [`ReloadingServerConfig`]: the current rustls configuration; a poller
//!   re-reads the files when their modification times change. New
//!   connections use the new material; a broken file keeps the old
//!   configuration and logs a warning.
//! - [`TlsIncoming`]: wraps a stream of accepted connections (real TCP, a
//!   bounded listener, simulated sockets) and yields [`TlsConnection`]s whose
//!   handshake finished within the timeout. Every client must present a
//!   certificate chaining to the CA bundle and naming a principal in a SAN
//!   URI; anything else is dropped at the handshake. Handshakes cannot be
//!   hoarded ([`HandshakeGate`]): one source address holds at most
//!   [`MAX_PENDING_HANDSHAKES_PER_SOURCE`] of them (its next connection is
//!   closed at once), and the timeout a new handshake gets shrinks as the
//!   listener fills, so sources that stall turn their slots over fast and
//!   one of them never stops the accept loop for everyone.
//! - [`TlsConnection`]: implements tonic's `Connected` with
//!   `ConnectInfo = PeerInfo`, so [`crate::auth::caller`] sees the principal.
//!
//! Only the `ring` crypto provider is used.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use futures::stream::FuturesUnordered;
use futures::Stream;
use leasehold_core::principal::Principal;
use rustls::crypto::CryptoProvider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::auth::{IdentityQuota, PeerInfo};

/// A connection that has not finished its handshake by then is closed.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the certificate files' modification times are checked.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(2);
/// Most handshakes in progress at once; the listener stops accepting beyond it.
pub const MAX_PENDING_HANDSHAKES: usize = 1_024;
/// Most handshakes in progress from one source address; its next
/// connection is closed at once.
pub const MAX_PENDING_HANDSHAKES_PER_SOURCE: usize = 32;
/// Most connections one identity (one certificate's principal) may hold
/// open on a listener, a quarter of the default connection cap: a caller
/// with a certificate cannot take every connection of a member or escrow
/// node; its next connection is closed after the handshake.
pub const MAX_CONNECTIONS_PER_IDENTITY: usize = 1_024;
/// The shortest time a handshake is given, when the listener is full.
pub const MIN_HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(500);

/// Handshake refusals of every TLS listener of this process (shown with
/// each listener's connection counters).
pub static HANDSHAKES: HandshakeCounters = HandshakeCounters::new();

/// See [`HANDSHAKES`].
#[derive(Debug)]
pub struct HandshakeCounters {
    refused_per_source: AtomicU64,
    timed_out: AtomicU64,
    refused_per_identity: AtomicU64,
}

impl HandshakeCounters {
    const fn new() -> Self {
        HandshakeCounters {
            refused_per_source: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            refused_per_identity: AtomicU64::new(0),
        }
    }

    /// Every counter as `(name, value)`.
    pub fn snapshot(&self) -> [(&'static str, u64); 3] {
        [
            (
                "tls_connections_refused_per_identity",
                self.refused_per_identity.load(Ordering::Relaxed),
            ),
            (
                "tls_handshakes_refused_per_source",
                self.refused_per_source.load(Ordering::Relaxed),
            ),
            (
                "tls_handshakes_timed_out",
                self.timed_out.load(Ordering::Relaxed),
            ),
        ]
    }
}

/// The handshakes a listener has in progress, per source address, and
/// what a new one gets (pure; see the module doc).
#[derive(Debug, Default)]
pub struct HandshakeGate {
    per_source: HashMap<IpAddr, usize>,
    pending: usize,
}

impl HandshakeGate {
    /// A new handshake from `source`: the time it is given — `full` while
    /// the listener is at most a quarter full, then less, down to
    /// [`MIN_HANDSHAKE_TIMEOUT`] when full ([`timeout_under`]) — or `None`
    /// when its source already has [`MAX_PENDING_HANDSHAKES_PER_SOURCE`] in
    /// progress (close it at once). Counted until [`Self::finished`].
    pub fn admit(&mut self, source: Option<IpAddr>, full: Duration) -> Option<Duration> {
        if let Some(ip) = source {
            let from = self.per_source.entry(ip).or_default();
            if *from >= MAX_PENDING_HANDSHAKES_PER_SOURCE {
                return None;
            }
            *from += 1;
        }
        let timeout = timeout_under(self.pending, full);
        self.pending += 1;
        Some(timeout)
    }

    /// A handshake admitted from `source` ended (done, failed or timed out).
    pub fn finished(&mut self, source: Option<IpAddr>) {
        self.pending = self.pending.saturating_sub(1);
        if let Some(ip) = source {
            if let Some(from) = self.per_source.get_mut(&ip) {
                *from -= 1;
                if *from == 0 {
                    self.per_source.remove(&ip);
                }
            }
        }
    }

    /// Handshakes in progress.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Sources with a handshake in progress.
    pub fn sources(&self) -> usize {
        self.per_source.len()
    }
}

/// One open connection counted among its identity's connections of a
/// listener, given back when the connection is dropped.
#[derive(Debug)]
struct IdentitySlot {
    table: Arc<Mutex<IdentityQuota>>,
    principal: Principal,
}

impl Drop for IdentitySlot {
    fn drop(&mut self) {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .give_back(&self.principal);
    }
}

/// The time a handshake is given with `pending` others in progress:
/// `full` up to a quarter of [`MAX_PENDING_HANDSHAKES`], then down in a
/// straight line to [`MIN_HANDSHAKE_TIMEOUT`] at the bound (never below it,
/// never above `full`).
pub fn timeout_under(pending: usize, full: Duration) -> Duration {
    let floor = MIN_HANDSHAKE_TIMEOUT.min(full);
    let calm = MAX_PENDING_HANDSHAKES / 4;
    if pending <= calm {
        return full;
    }
    let pressure = (pending - calm).min(MAX_PENDING_HANDSHAKES - calm) as u128;
    let span = (MAX_PENDING_HANDSHAKES - calm) as u128;
    let room = full.saturating_sub(floor).as_millis();
    let cut = room * pressure / span;
    full.saturating_sub(Duration::from_millis(
        u64::try_from(cut).unwrap_or(u64::MAX),
    ))
    .max(floor)
}

/// Where one process's TLS material lives (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA bundle that peers' certificates must chain to.
    pub ca: PathBuf,
    /// This process's certificate chain (leaf first).
    pub cert: PathBuf,
    /// This process's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS material could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: io::Error,
    },
    /// A file holds no usable PEM item of the expected kind.
    #[error("{path} holds no {what}")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What was expected in it.
        what: &'static str,
    },
    /// A PEM item could not be decoded.
    #[error("{path}: {message}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// The decoder's explanation.
        message: String,
    },
    /// rustls refused the material (key does not match, bad CA, ...).
    #[error("TLS configuration refused: {0}")]
    Config(String),
}

/// The crypto provider every TLS configuration of the project uses.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Every certificate in a PEM file (at least one).
pub fn load_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty {
            path: path.to_path_buf(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub fn load_private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty {
            path: path.to_path_buf(),
            what: "private key",
        },
        other => TlsError::Pem {
            path: path.to_path_buf(),
            message: other.to_string(),
        },
    })
}

/// The trust anchors of a CA bundle.
pub fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certificates(path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::Config(format!("CA bundle {}: {e}", path.display())))?;
    }
    Ok(roots)
}

/// A server configuration that requires a client certificate chaining to
/// `files.ca`, presents `files.cert`, and speaks HTTP/2.
pub fn load_server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let provider = crypto_provider();
    let roots = Arc::new(load_roots(&files.ca)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider.clone())
        .build()
        .map_err(|e| TlsError::Config(e.to_string()))?;
    let chain = load_certificates(&files.cert)?;
    let key = load_private_key(&files.key)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The principal named by a DER certificate's SAN URIs, if any parses.
pub fn principal_of_certificate(der: &[u8]) -> Option<Principal> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let san = cert.subject_alternative_name().ok()??;
    let uris = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            x509_parser::extensions::GeneralName::URI(uri) => Some(*uri),
            _ => None,
        });
    Principal::from_uris(uris)
}

fn modification_times(files: &TlsFiles) -> [Option<SystemTime>; 3] {
    [&files.ca, &files.cert, &files.key]
        .map(|path| std::fs::metadata(path).and_then(|m| m.modified()).ok())
}

/// The current server configuration of one listener, replaced when the
/// files change (see [`ReloadingServerConfig::watch`]).
#[derive(Debug)]
pub struct ReloadingServerConfig {
    files: TlsFiles,
    current: RwLock<Arc<ServerConfig>>,
    stamps: RwLock<[Option<SystemTime>; 3]>,
}

impl ReloadingServerConfig {
    /// Loads `files`; fails if the material is unusable now.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let stamps = modification_times(&files);
        let config = load_server_config(&files)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new(config),
            stamps: RwLock::new(stamps),
        }))
    }

    /// The configuration new connections use.
    pub fn current(&self) -> Arc<ServerConfig> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Re-reads the files if any modification time changed. Returns whether
    /// a new configuration is now in use; a broken file keeps the old one.
    pub fn reload_if_changed(&self) -> bool {
        let stamps = modification_times(&self.files);
        {
            let mut seen = match self.stamps.write() {
                Ok(guard) => guard,
                Err(poisoned) => poisoned.into_inner(),
            };
            if *seen == stamps {
                return false;
            }
            *seen = stamps;
        }
        match load_server_config(&self.files) {
            Ok(config) => {
                match self.current.write() {
                    Ok(mut guard) => *guard = config,
                    Err(poisoned) => *poisoned.into_inner() = config,
                }
                tracing::info!(cert = %self.files.cert.display(), "TLS material reloaded");
                true
            }
            Err(error) => {
                tracing::warn!(%error, "new TLS material refused; keeping the previous configuration");
                false
            }
        }
    }

    /// Checks the files every `interval` until `stop` turns true (or its
    /// sender is dropped).
    pub async fn watch(self: Arc<Self>, interval: Duration, mut stop: watch::Receiver<bool>) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => { self.reload_if_changed(); }
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
            }
        }
    }
}

/// The remote socket address a connection's tonic connect info carries.
pub trait RemoteAddress {
    /// The peer's address, when known.
    fn remote_address(&self) -> Option<SocketAddr>;
}

impl RemoteAddress for TcpConnectInfo {
    fn remote_address(&self) -> Option<SocketAddr> {
        self.remote_addr()
    }
}

impl RemoteAddress for () {
    fn remote_address(&self) -> Option<SocketAddr> {
        None
    }
}

/// One connection after a successful mutual-TLS handshake.
#[derive(Debug)]
pub struct TlsConnection<IO> {
    stream: TlsStream<IO>,
    peer: PeerInfo,
    /// Its place among its identity's connections (none until admitted).
    _slot: Option<IdentitySlot>,
}

impl<IO> TlsConnection<IO> {
    /// Who is on the other end.
    pub fn peer(&self) -> &PeerInfo {
        &self.peer
    }
}

impl<IO> Connected for TlsConnection<IO>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    type ConnectInfo = PeerInfo;

    fn connect_info(&self) -> PeerInfo {
        self.peer.clone()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsConnection<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsConnection<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// Why one handshake did not produce a connection (logged, then dropped).
#[derive(Debug, thiserror::Error)]
enum HandshakeError {
    #[error("handshake did not finish within {0:?}")]
    Timeout(Duration),
    #[error("handshake failed: {0}")]
    Tls(io::Error),
    #[error("the client certificate names no principal")]
    NoPrincipal,
}

async fn handshake<IO>(
    io: IO,
    remote_addr: Option<SocketAddr>,
    config: Arc<ServerConfig>,
    timeout: Duration,
) -> Result<TlsConnection<IO>, HandshakeError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let accepted = tokio::time::timeout(timeout, TlsAcceptor::from(config).accept(io))
        .await
        .map_err(|_| HandshakeError::Timeout(timeout))?
        .map_err(HandshakeError::Tls)?;
    let principal = accepted
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|leaf| principal_of_certificate(leaf))
        .ok_or(HandshakeError::NoPrincipal)?;
    Ok(TlsConnection {
        stream: accepted,
        peer: PeerInfo {
            remote_addr,
            principal,
        },
        _slot: None,
    })
}

type PendingHandshake<IO> =
    Pin<Box<dyn Future<Output = (Option<IpAddr>, Option<TlsConnection<IO>>)> + Send>>;

/// A stream of mutual-TLS connections over a stream of accepted ones.
/// Handshakes run concurrently (at most [`MAX_PENDING_HANDSHAKES`], at most
/// [`MAX_PENDING_HANDSHAKES_PER_SOURCE`] from one address, see
/// [`HandshakeGate`]); a failed or slow one is logged at debug level and
/// dropped. Errors of the underlying stream pass through.
pub struct TlsIncoming<I, IO> {
    inner: Pin<Box<I>>,
    inner_done: bool,
    config: Arc<ReloadingServerConfig>,
    handshake_timeout: Duration,
    pending: FuturesUnordered<PendingHandshake<IO>>,
    gate: HandshakeGate,
    /// Connections open per identity, and how many one may hold.
    identities: Arc<Mutex<IdentityQuota>>,
    per_identity: usize,
}

impl<I, IO> TlsIncoming<I, IO> {
    /// Wraps `incoming`; handshakes use the configuration current when each
    /// connection arrives.
    pub fn new(
        incoming: I,
        config: Arc<ReloadingServerConfig>,
        handshake_timeout: Duration,
    ) -> Self {
        Self {
            inner: Box::pin(incoming),
            inner_done: false,
            config,
            handshake_timeout,
            pending: FuturesUnordered::new(),
            gate: HandshakeGate::default(),
            identities: Arc::default(),
            per_identity: MAX_CONNECTIONS_PER_IDENTITY,
        }
    }

    /// The same with at most `bound` connections per identity instead of
    /// [`MAX_CONNECTIONS_PER_IDENTITY`].
    pub fn with_connections_per_identity(mut self, bound: usize) -> Self {
        self.per_identity = bound;
        self
    }
}

impl<I, IO, IE> Stream for TlsIncoming<I, IO>
where
    I: Stream<Item = Result<IO, IE>>,
    IO: AsyncRead + AsyncWrite + Connected + Unpin + Send + 'static,
    IO::ConnectInfo: RemoteAddress,
{
    type Item = Result<TlsConnection<IO>, IE>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            while !this.inner_done && this.pending.len() < MAX_PENDING_HANDSHAKES {
                match this.inner.as_mut().poll_next(cx) {
                    Poll::Ready(Some(Ok(io))) => {
                        let remote_addr = io.connect_info().remote_address();
                        let source = remote_addr.map(|addr| addr.ip());
                        let Some(timeout) = this.gate.admit(source, this.handshake_timeout) else {
                            // Its source holds its most handshakes: closed.
                            HANDSHAKES
                                .refused_per_source
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::debug!(
                                ?remote_addr,
                                "TLS connection refused: too many handshakes from its address"
                            );
                            drop(io);
                            continue;
                        };
                        let config = this.config.current();
                        this.pending.push(Box::pin(async move {
                            match handshake(io, remote_addr, config, timeout).await {
                                Ok(connection) => (source, Some(connection)),
                                Err(error) => {
                                    if matches!(error, HandshakeError::Timeout(_)) {
                                        HANDSHAKES.timed_out.fetch_add(1, Ordering::Relaxed);
                                    }
                                    tracing::debug!(?remote_addr, %error, "TLS connection refused");
                                    (source, None)
                                }
                            }
                        }));
                    }
                    Poll::Ready(Some(Err(error))) => return Poll::Ready(Some(Err(error))),
                    Poll::Ready(None) => this.inner_done = true,
                    Poll::Pending => break,
                }
            }
            // An empty set answers `Ready(None)`; the accept loop above then
            // ran until the listener was pending, so a wake-up is registered.
            match Pin::new(&mut this.pending).poll_next(cx) {
                Poll::Ready(Some((source, connection))) => {
                    this.gate.finished(source);
                    if let Some(mut connection) = connection {
                        let principal = connection.peer.principal.clone();
                        let admitted = this
                            .identities
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .take(&principal, this.per_identity);
                        if admitted {
                            connection._slot = Some(IdentitySlot {
                                table: this.identities.clone(),
                                principal,
                            });
                            return Poll::Ready(Some(Ok(connection)));
                        }
                        HANDSHAKES
                            .refused_per_identity
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::debug!(
                            %principal,
                            "TLS connection refused: its identity holds its most connections"
                        );
                    }
                    continue;
                }
                Poll::Ready(None) if this.inner_done => return Poll::Ready(None),
                Poll::Ready(None) | Poll::Pending => return Poll::Pending,
            }
        }
    }
}

/// How a process secures its connections: mutual TLS with its files, or
/// plaintext without identities (chosen explicitly with `--insecure`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Security {
    /// Mutual TLS: listeners require client certificates from the CA
    /// bundle; outgoing connections present this process's certificate.
    MutualTls(TlsFiles),
    /// Plaintext. Every caller is anonymous: no identity, no protection.
    Insecure,
}

/// Why the TLS options do not describe a usable choice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityChoiceError {
    /// Neither TLS material nor `insecure` was given.
    #[error(
        "no TLS material: set tls_ca, tls_cert and tls_key (--tls-ca, --tls-cert, --tls-key) \
         for mutual TLS, or insecure = true (--insecure) to run plaintext without identities"
    )]
    Missing,
    /// Only some of the three files were given.
    #[error("incomplete TLS material: tls_ca, tls_cert and tls_key must all be set (missing {0})")]
    Incomplete(String),
    /// Both TLS material and `insecure` were given.
    #[error("both TLS material and insecure were given: choose one")]
    Both,
}

impl Security {
    /// The choice the options describe: all three files, or `insecure`.
    pub fn choose(
        ca: Option<&Path>,
        cert: Option<&Path>,
        key: Option<&Path>,
        insecure: bool,
    ) -> Result<Self, SecurityChoiceError> {
        let given = [ca, cert, key];
        if given.iter().all(Option::is_none) {
            return if insecure {
                Ok(Security::Insecure)
            } else {
                Err(SecurityChoiceError::Missing)
            };
        }
        if insecure {
            return Err(SecurityChoiceError::Both);
        }
        match given {
            [Some(ca), Some(cert), Some(key)] => Ok(Security::MutualTls(TlsFiles {
                ca: ca.to_path_buf(),
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
            })),
            _ => {
                let missing: Vec<&str> = ["tls_ca", "tls_cert", "tls_key"]
                    .into_iter()
                    .zip(given)
                    .filter(|(_, path)| path.is_none())
                    .map(|(name, _)| name)
                    .collect();
                Err(SecurityChoiceError::Incomplete(missing.join(", ")))
            }
        }
    }

    /// The dialer for outgoing connections: TLS presenting this process's
    /// certificate, or plaintext TCP.
    pub fn dialer(&self) -> Arc<dyn leasehold_client::transport::Dialer> {
        match self {
            Security::MutualTls(files) => Arc::new(leasehold_client::tls::TlsDialer::new(
                leasehold_client::tls::ClientTlsFiles {
                    ca: files.ca.clone(),
                    cert: files.cert.clone(),
                    key: files.key.clone(),
                },
            )),
            Security::Insecure => Arc::new(leasehold_client::transport::TcpDialer::default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::certs::{files_for, CertificateAuthority};
    use futures::StreamExt;
    use tokio::io::AsyncReadExt;

    /// A TLS listener on loopback with a member certificate of `ca`, the
    /// operator files a client can use, and the peers it accepts.
    async fn listener(
        ca: &CertificateAuthority,
        dir: &Path,
        handshake_timeout: Duration,
    ) -> (String, TlsFiles, tokio::sync::mpsc::Receiver<PeerInfo>) {
        listener_with(ca, dir, handshake_timeout, MAX_CONNECTIONS_PER_IDENTITY).await
    }

    /// [`listener`] allowing `per_identity` connections per identity.
    async fn listener_with(
        ca: &CertificateAuthority,
        dir: &Path,
        handshake_timeout: Duration,
        per_identity: usize,
    ) -> (String, TlsFiles, tokio::sync::mpsc::Receiver<PeerInfo>) {
        ca.write(dir, false).unwrap();
        let member = ca
            .issue_into(dir, &Principal::Member(1), &["127.0.0.1".into()])
            .unwrap();
        let operator = Principal::Operator("op".into());
        ca.issue_into(dir, &operator, &[]).unwrap();
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap().to_string();
        let config = ReloadingServerConfig::load(member).unwrap();
        let mut incoming = TlsIncoming::new(
            tonic::transport::server::TcpIncoming::from(tcp),
            config,
            handshake_timeout,
        )
        .with_connections_per_identity(per_identity);
        let (peers, accepted) = tokio::sync::mpsc::channel(8);
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Some(Ok(connection)) = incoming.next().await {
                let _ = peers.send(connection.peer().clone()).await;
                open.push(connection);
            }
        });
        (addr, files_for(dir, &operator), accepted)
    }

    /// A mutual-TLS connection to `addr` with `files`, kept open.
    async fn tls_open(
        addr: &str,
        files: &TlsFiles,
    ) -> io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let config = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(load_roots(&files.ca).map_err(io::Error::other)?)
            .with_client_auth_cert(
                load_certificates(&files.cert).map_err(io::Error::other)?,
                load_private_key(&files.key).map_err(io::Error::other)?,
            )
            .map_err(io::Error::other)?;
        let tcp = tokio::net::TcpStream::connect(addr).await?;
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1")
            .map_err(io::Error::other)?
            .to_owned();
        tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
    }

    async fn tls_connect(addr: &str, files: &TlsFiles) -> io::Result<()> {
        let mut tls = tls_open(addr, files).await?;
        // TLS 1.3 servers verify the client's certificate after the client
        // considers the handshake done: read once to see a refusal.
        let mut buf = [0u8; 1];
        match tokio::time::timeout(Duration::from_millis(300), tls.read(&mut buf)).await {
            Ok(Ok(0)) => Err(io::Error::other("closed by the server")),
            Ok(Err(e)) => Err(e),
            _ => Ok(()),
        }
    }

    #[test]
    fn one_source_holds_at_most_its_handshakes_and_gets_them_back() {
        let full = Duration::from_secs(5);
        let mut gate = HandshakeGate::default();
        let hoarder = Some(IpAddr::from([10, 0, 0, 1]));
        for _ in 0..MAX_PENDING_HANDSHAKES_PER_SOURCE {
            assert_eq!(gate.admit(hoarder, full), Some(full));
        }
        assert_eq!(gate.admit(hoarder, full), None, "its next one is refused");
        // Another source, and a connection without an address, still get in.
        assert!(gate
            .admit(Some(IpAddr::from([10, 0, 0, 2])), full)
            .is_some());
        assert!(gate.admit(None, full).is_some());
        assert_eq!(gate.pending(), MAX_PENDING_HANDSHAKES_PER_SOURCE + 2);
        gate.finished(hoarder);
        assert!(gate.admit(hoarder, full).is_some(), "a slot came back");
        for _ in 0..MAX_PENDING_HANDSHAKES_PER_SOURCE {
            gate.finished(hoarder);
        }
        gate.finished(Some(IpAddr::from([10, 0, 0, 2])));
        gate.finished(None);
        assert_eq!((gate.pending(), gate.sources()), (0, 0));
    }

    /// An identity holding its most connections gets its next one closed
    /// right after the handshake (counted), while another identity is
    /// served.
    #[tokio::test]
    async fn an_identity_beyond_its_connections_is_closed_and_others_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("test CA", 1).unwrap();
        let (addr, operator, mut accepted) =
            listener_with(&ca, dir.path(), Duration::from_secs(5), 2).await;
        let other = Principal::Operator("other".into());
        let other_files = ca.issue_into(dir.path(), &other, &[]).unwrap();
        let refused_before = HANDSHAKES.refused_per_identity.load(Ordering::Relaxed);
        let mut held = Vec::new();
        for _ in 0..2 {
            held.push(tls_open(&addr, &operator).await.unwrap());
            let peer = tokio::time::timeout(Duration::from_secs(2), accepted.recv())
                .await
                .unwrap()
                .unwrap();
            assert_eq!(peer.principal, Principal::Operator("op".into()));
        }
        assert!(
            tls_connect(&addr, &operator).await.is_err(),
            "a third connection of the same identity was kept"
        );
        assert!(HANDSHAKES.refused_per_identity.load(Ordering::Relaxed) > refused_before);
        tls_connect(&addr, &other_files).await.unwrap();
        let peer = tokio::time::timeout(Duration::from_secs(2), accepted.recv())
            .await
            .expect("another identity is served")
            .unwrap();
        assert_eq!(peer.principal, other);
        drop(held);
    }

    #[test]
    fn the_handshake_timeout_shrinks_as_the_listener_fills() {
        let full = Duration::from_secs(5);
        assert_eq!(timeout_under(0, full), full);
        assert_eq!(timeout_under(MAX_PENDING_HANDSHAKES / 4, full), full);
        assert_eq!(
            timeout_under(MAX_PENDING_HANDSHAKES, full),
            MIN_HANDSHAKE_TIMEOUT
        );
        assert_eq!(timeout_under(usize::MAX, full), MIN_HANDSHAKE_TIMEOUT);
        let half = timeout_under(MAX_PENDING_HANDSHAKES * 5 / 8, full);
        assert!(half < full && half > MIN_HANDSHAKE_TIMEOUT, "{half:?}");
        // Never above the configured timeout, even a short one.
        let short = Duration::from_millis(100);
        assert_eq!(timeout_under(MAX_PENDING_HANDSHAKES, short), short);
        let mut last = full;
        for pending in 0..=MAX_PENDING_HANDSHAKES {
            let timeout = timeout_under(pending, full);
            assert!(timeout <= last, "grew at {pending}");
            last = timeout;
        }
    }

    /// One host opening many connections that stall in the handshake holds
    /// at most its share of the listener: its connections beyond it are
    /// closed at once and counted, while a client from another address
    /// handshakes and is served at once.
    #[tokio::test]
    async fn stalled_handshakes_from_one_host_do_not_hold_up_others() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("test CA", 1).unwrap();
        let (addr, operator, mut accepted) =
            listener(&ca, dir.path(), Duration::from_secs(5)).await;
        let refused_before = HANDSHAKES.refused_per_source.load(Ordering::Relaxed);
        let hoarder = "127.0.0.2:0".parse::<SocketAddr>().unwrap();
        let mut stalled = Vec::new();
        for _ in 0..MAX_PENDING_HANDSHAKES_PER_SOURCE + 8 {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(hoarder).unwrap();
            let mut stream = socket.connect(addr.parse().unwrap()).await.unwrap();
            // Five bytes of a TLS record header, then nothing.
            use tokio::io::AsyncWriteExt;
            let _ = stream.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await;
            stalled.push(stream);
        }
        // The connections beyond the host's share are closed at once; the
        // others are still waiting in their handshake.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let closed: Vec<bool> = stalled
            .iter()
            .map(|stream| {
                let mut buf = [0u8; 8];
                !matches!(stream.try_read(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            })
            .collect();
        assert_eq!(
            closed.iter().filter(|c| **c).count(),
            8,
            "exactly the connections beyond its share: {closed:?}"
        );
        assert!(closed[MAX_PENDING_HANDSHAKES_PER_SOURCE..]
            .iter()
            .all(|c| *c));
        assert!(HANDSHAKES.refused_per_source.load(Ordering::Relaxed) >= refused_before + 8);
        // A client from 127.0.0.1 is served while the hoarder stalls.
        let started = std::time::Instant::now();
        tls_connect(&addr, &operator).await.unwrap();
        let peer = tokio::time::timeout(Duration::from_secs(2), accepted.recv())
            .await
            .expect("served while the other host stalls")
            .unwrap();
        assert_eq!(peer.principal, Principal::Operator("op".into()));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// Stalled handshakes from many hosts, each within its share, fill the
    /// listener: the handshake budget then shrinks to half a second, so a
    /// client from yet another address still gets in within a few seconds
    /// instead of waiting out the full timeout of every stalled connection.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stalled_handshakes_from_many_hosts_leave_room_for_a_client() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("test CA", 1).unwrap();
        let (addr, operator, mut accepted) =
            listener(&ca, dir.path(), Duration::from_secs(5)).await;
        let hosts = MAX_PENDING_HANDSHAKES / MAX_PENDING_HANDSHAKES_PER_SOURCE + 4;
        let mut stalled = Vec::new();
        for host in 0..hosts {
            let source = SocketAddr::from(([127, 0, 1, u8::try_from(host + 1).unwrap()], 0));
            for _ in 0..MAX_PENDING_HANDSHAKES_PER_SOURCE {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind(source).unwrap();
                let mut stream = socket.connect(addr.parse().unwrap()).await.unwrap();
                use tokio::io::AsyncWriteExt;
                let _ = stream.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00]).await;
                stalled.push(stream);
            }
        }
        assert!(
            stalled.len() > MAX_PENDING_HANDSHAKES,
            "more than the listener holds"
        );
        let started = std::time::Instant::now();
        let timed_out_before = HANDSHAKES.timed_out.load(Ordering::Relaxed);
        loop {
            if tls_connect(&addr, &operator).await.is_ok() {
                if let Ok(Some(peer)) =
                    tokio::time::timeout(Duration::from_millis(500), accepted.recv()).await
                {
                    assert_eq!(peer.principal, Principal::Operator("op".into()));
                    break;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(4),
                "the client waited out the full handshake timeout"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "the client waited {:?}, as long as a stalled handshake's full timeout",
            started.elapsed()
        );
        assert!(
            HANDSHAKES.timed_out.load(Ordering::Relaxed) > timed_out_before,
            "stalled handshakes were cut short"
        );
        drop(stalled);
    }

    #[tokio::test]
    async fn a_stalled_handshake_is_closed_and_does_not_hold_up_others() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("test CA", 1).unwrap();
        let (addr, operator, mut accepted) =
            listener(&ca, dir.path(), Duration::from_millis(300)).await;

        let mut stalled = tokio::net::TcpStream::connect(&addr).await.unwrap();
        // Another client handshakes while the first one says nothing.
        tls_connect(&addr, &operator).await.unwrap();
        let peer = tokio::time::timeout(Duration::from_secs(5), accepted.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(peer.principal, Principal::Operator("op".into()));
        assert!(peer.remote_addr.is_some());

        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf))
            .await
            .expect("the stalled connection is closed after the handshake timeout");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }

    #[tokio::test]
    async fn a_client_certificate_naming_no_principal_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("test CA", 1).unwrap();
        let (addr, operator, mut accepted) =
            listener(&ca, dir.path(), Duration::from_secs(5)).await;
        let nobody = ca.issue_without_principal(&[]).unwrap();
        let files = TlsFiles {
            ca: operator.ca.clone(),
            cert: dir.path().join("nobody.pem"),
            key: dir.path().join("nobody.key"),
        };
        std::fs::write(&files.cert, nobody.cert_pem).unwrap();
        std::fs::write(&files.key, nobody.key_pem).unwrap();
        assert!(tls_connect(&addr, &files).await.is_err());
        let nothing = tokio::time::timeout(Duration::from_millis(300), accepted.recv()).await;
        assert!(
            nothing.is_err(),
            "a certificate without a principal was accepted: {nothing:?}"
        );
        // The same CA's operator certificate is accepted.
        tls_connect(&addr, &operator).await.unwrap();
        assert!(accepted.recv().await.is_some());
    }
}
