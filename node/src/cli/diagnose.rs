//! Why a client command's call failed underneath: when the call failed at
//! the connection (a transport error, an unreachable or silent member) or
//! was refused as if by another service (`UNIMPLEMENTED`,
//! `PERMISSION_DENIED`, `UNAUTHENTICATED`), every endpoint is probed once
//! and the first cause found (in endpoint order) replaces the error.
//!
//! The client library's own error for such a failure depends on timing:
//! which side of a TLS handshake notices first, whether the peer's alert
//! or its close arrives before the client writes, which retry ran last. The
//! probe makes one connection whose every step it controls, so the same
//! setup gets the same answer on every run:
//!
//! 1. TCP connect (nothing listening: no diagnosis, the error stands).
//!    HTTP/2's connection preface is sent on a first connection: a server
//!    that answers it in HTTP/1 (a `--metrics-listen` port, a web server)
//!    is no gRPC server at all, and is named as such whatever the TLS
//!    settings.
//! 2. With `--ca/--cert/--cert-key`: this command's certificate is read
//!    and checked for its validity period (an expired one is named before
//!    anything is sent).
//! 3. A TLS ClientHello. The first bytes of the answer tell a TLS server (a
//!    TLS record) from a plaintext one (an HTTP/2 frame, or anything that
//!    is not TLS): TLS on one side only is named as such.
//! 4. The server's certificate is verified against `--ca` for the dialled
//!    host name, as the client does (unknown issuer, expired, not valid for
//!    the name), and its SANs and expiry are read for the message.
//! 5. After the handshake the server either talks HTTP/2 (it accepted this
//!    command's certificate), or sends a TLS alert (`unknown_ca`,
//!    `certificate_expired`, `bad_certificate`, …) or closes the connection:
//!    it refused the certificate.
//!
//! A call that has not finished within [`EARLY_PROBE_AFTER`] is probed
//! meanwhile ([`early`]): a certificate or TLS mismatch is named as soon as
//! the probe finds it, instead of after the call's retries (seconds).
//!
//! Wrong service: a gRPC health check of `leasehold.v1.Coordinator` at the
//! endpoint. A member always knows that service (`SERVING` or
//! `NOT_SERVING`); anything else answers `NOT_FOUND` (an escrow node, whose
//! health knows `leasehold.v1.Escrow` instead) or has no health service at
//! all. Health answers any authenticated identity, so the check works with
//! the certificate the refused call used.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use leasehold_client::coordinator::CoordinatorError;
use leasehold_client::tls::server_name;
use leasehold_client::transport::{normalize_endpoints, Dialer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{AlertDescription, CertificateError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::{CliError, ClientArgs, TransportArgs};
use crate::connection_adapter::{AdaptedConnection, ReadAdapter};

/// Bound on one endpoint's probe (connect, handshake, answer).
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a server has to send its alert (or close) after the handshake
/// before the probe speaks HTTP/2 to it.
const REFUSAL_WAIT: Duration = Duration::from_millis(500);
/// How long a client command's call runs before its endpoints are probed
/// meanwhile ([`early`]): most calls have answered by then.
pub const EARLY_PROBE_AFTER: Duration = Duration::from_millis(300);
/// The service every coordinator member's health knows.
const COORDINATOR_SERVICE: &str = "leasehold.v1.Coordinator";
/// The service an escrow node's health knows.
const ESCROW_SERVICE: &str = "leasehold.v1.Escrow";
/// HTTP/2's client connection preface, and an empty SETTINGS frame.
const HTTP2_PREFACE: &[u8] =
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// A cause of a failed call, found by probing its endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Diagnosis {
    /// The server speaks TLS; this command connected in plaintext.
    ServerSpeaksTls {
        /// The endpoint.
        addr: String,
    },
    /// The server answered in plaintext; this command connected with TLS.
    ServerSpeaksPlaintext {
        /// The endpoint.
        addr: String,
    },
    /// The server's certificate does not chain to a CA of `--ca`.
    ServerCertificateUntrusted {
        /// The endpoint.
        addr: String,
        /// The CA bundle it was verified against.
        ca: PathBuf,
    },
    /// The server's certificate is past its validity period.
    ServerCertificateExpired {
        /// The endpoint.
        addr: String,
        /// Its end of validity, when readable.
        not_after: Option<String>,
    },
    /// The server's certificate does not name the host it was dialled by.
    ServerCertificateWrongName {
        /// The endpoint.
        addr: String,
        /// The host dialled.
        name: String,
        /// The DNS names and IP addresses the certificate names.
        names: Vec<String>,
    },
    /// Any other reason the server's certificate failed verification.
    ServerCertificateInvalid {
        /// The endpoint.
        addr: String,
        /// The verifier's reason.
        reason: String,
    },
    /// This command's certificate is outside its validity period.
    ClientCertificateExpired {
        /// The certificate file.
        cert: PathBuf,
        /// Its validity period, as `from … until …`.
        validity: String,
    },
    /// The server refused this command's certificate in the handshake.
    ClientCertificateRefused {
        /// The endpoint.
        addr: String,
        /// The certificate file.
        cert: PathBuf,
        /// What the server said.
        why: Refusal,
    },
    /// The endpoint answers HTTP/1, not gRPC (a `/metrics` listener, a web
    /// server).
    HttpOneListener {
        /// The endpoint.
        addr: String,
        /// Its answer's status line (`HTTP/1.1 400 Bad Request`).
        status_line: String,
    },
    /// The endpoint answered gRPC but is not a coordinator member.
    WrongService {
        /// The endpoint.
        addr: String,
        /// Whether its health names an escrow node's service.
        escrow: bool,
    },
}

/// How a server refused a client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A TLS alert.
    Alert(AlertDescription),
    /// It closed the connection right after the handshake, without an alert.
    Closed,
}

impl Diagnosis {
    /// The stable error code (`--output json`'s `error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            Diagnosis::ServerSpeaksTls { .. } => "server_speaks_tls",
            Diagnosis::ServerSpeaksPlaintext { .. } => "server_speaks_plaintext",
            Diagnosis::ServerCertificateUntrusted { .. } => "server_certificate_untrusted",
            Diagnosis::ServerCertificateExpired { .. } => "server_certificate_expired",
            Diagnosis::ServerCertificateWrongName { .. } => "server_certificate_wrong_name",
            Diagnosis::ServerCertificateInvalid { .. } => "server_certificate_invalid",
            Diagnosis::ClientCertificateExpired { .. } => "client_certificate_expired",
            Diagnosis::ClientCertificateRefused { .. } => "client_certificate_refused",
            Diagnosis::HttpOneListener { .. } => "http1_listener",
            Diagnosis::WrongService { .. } => "wrong_service",
        }
    }

    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            Diagnosis::ServerSpeaksTls { .. } => "drop --insecure (LEASEHOLD_INSECURE) and pass \
                --ca, --cert and --cert-key (LEASEHOLD_CA, LEASEHOLD_CERT, LEASEHOLD_KEY): the \
                cluster's CA bundle and your certificate (docs/security.md)"
                .into(),
            Diagnosis::ServerSpeaksPlaintext { .. } => "pass --insecure (LEASEHOLD_INSECURE=true) \
                instead of --ca/--cert/--cert-key for a cluster running plaintext, or run its \
                members with --tls-ca/--tls-cert/--tls-key"
                .into(),
            Diagnosis::ServerCertificateUntrusted { .. } => "pass the CA bundle that issued the \
                cluster's certificates as --ca (LEASEHOLD_CA; the ca.pem `leasehold certs mint` \
                wrote), or give the member a certificate from the CA in --ca"
                .into(),
            Diagnosis::ServerCertificateExpired { .. } => "renew the member's certificate with \
                the cluster's CA (`leasehold certs mint --ca-cert ca.pem --ca-key ca.key …`); \
                members reload their certificate files without a restart"
                .into(),
            Diagnosis::ServerCertificateWrongName { .. } => "pass an endpoint by a name the \
                certificate carries, or issue the member's certificate for this name \
                (`leasehold certs mint --dns NAME` or `--ip ADDRESS`)"
                .into(),
            Diagnosis::ServerCertificateInvalid { .. } => "issue the member a certificate from \
                the cluster's CA (`leasehold certs mint`)"
                .into(),
            Diagnosis::ClientCertificateExpired { .. } => "renew it with the cluster's CA \
                (`leasehold certs mint --ca-cert ca.pem --ca-key ca.key --operators NAME`) and \
                pass the new one as --cert/--cert-key"
                .into(),
            Diagnosis::ClientCertificateRefused { .. } => "pass a certificate issued by the \
                cluster's CA and naming an identity (`leasehold certs mint --operators NAME` for \
                admin commands, `--regions REGION` for lease and reconcile) as --cert/--cert-key"
                .into(),
            Diagnosis::HttpOneListener { .. } => "point --endpoint at a coordinator member's \
                gRPC address (what `leasehold serve --listen` binds, port 7100 in deploy/ and \
                the default), not its --metrics-listen port (7101 in deploy/) or another HTTP \
                server"
                .into(),
            Diagnosis::WrongService { .. } => "point --endpoint at a coordinator member (the \
                address `leasehold serve --listen` binds, port 7100 in deploy/), not an escrow \
                node (7200) or another service"
                .into(),
        }
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Diagnosis::ServerSpeaksTls { addr } => write!(
                f,
                "the server at {addr} speaks TLS, but this command connected in plaintext \
                 (--insecure)"
            ),
            Diagnosis::ServerSpeaksPlaintext { addr } => write!(
                f,
                "the server at {addr} speaks plaintext (it runs with --insecure), but this \
                 command connected with TLS (--ca/--cert/--cert-key)"
            ),
            Diagnosis::ServerCertificateUntrusted { addr, ca } => write!(
                f,
                "the certificate of the server at {addr} is not signed by a CA in --ca {} \
                 (TLS: unknown issuer, or a CA of that name whose key did not sign it)",
                ca.display()
            ),
            Diagnosis::ServerCertificateExpired { addr, not_after } => match not_after {
                Some(at) => write!(
                    f,
                    "the certificate of the server at {addr} expired (valid until {at})"
                ),
                None => write!(f, "the certificate of the server at {addr} expired"),
            },
            Diagnosis::ServerCertificateWrongName { addr, name, names } => {
                let names = if names.is_empty() {
                    "no DNS name or IP address".to_string()
                } else {
                    names.join(", ")
                };
                write!(
                    f,
                    "the certificate of the server at {addr} is not valid for the name {name} \
                     (it names {names})"
                )
            }
            Diagnosis::ServerCertificateInvalid { addr, reason } => write!(
                f,
                "the certificate of the server at {addr} failed verification: {reason}"
            ),
            Diagnosis::ClientCertificateExpired { cert, validity } => write!(
                f,
                "this command's certificate {} is not valid now (valid {validity})",
                cert.display()
            ),
            Diagnosis::ClientCertificateRefused { addr, cert, why } => {
                let why = match why {
                    Refusal::Alert(AlertDescription::UnknownCA) => {
                        "it is not signed by a CA the server trusts (TLS alert unknown_ca)"
                            .to_string()
                    }
                    Refusal::Alert(AlertDescription::CertificateExpired) => {
                        "the server finds it expired (TLS alert certificate_expired)".to_string()
                    }
                    Refusal::Alert(AlertDescription::CertificateRequired) => {
                        "the server requires one (TLS alert certificate_required)".to_string()
                    }
                    Refusal::Alert(alert) => format!("TLS alert {alert:?}"),
                    Refusal::Closed => "the server closed the connection right after the TLS \
                        handshake (a certificate naming no identity, or an identity holding \
                        its most connections)"
                        .to_string(),
                };
                write!(
                    f,
                    "the server at {addr} refused this command's certificate {}: {why}",
                    cert.display()
                )
            }
            Diagnosis::HttpOneListener { addr, status_line } => write!(
                f,
                "the server at {addr} answers HTTP/1 ({status_line:?}), not gRPC: it is not a \
                 coordinator member's gRPC port (a /metrics listener?)"
            ),
            Diagnosis::WrongService { addr, escrow: true } => write!(
                f,
                "the server at {addr} is an escrow node (its health serves {ESCROW_SERVICE}), \
                 not a coordinator member"
            ),
            Diagnosis::WrongService {
                addr,
                escrow: false,
            } => write!(
                f,
                "the server at {addr} does not serve {COORDINATOR_SERVICE}: it is not a \
                 coordinator member"
            ),
        }
    }
}

/// `error` of a command that called `client`'s endpoints, replaced by the
/// cause a probe of the endpoints finds, if any.
pub async fn explain(error: CoordinatorError, client: &ClientArgs) -> CliError {
    let Ok(endpoints) = normalize_endpoints(&client.endpoints) else {
        return error.into();
    };
    let found = match &error {
        CoordinatorError::Transport { .. }
        | CoordinatorError::Unavailable { .. }
        | CoordinatorError::DeadlineExceeded { .. } => {
            let transport = &client.transport;
            first_found(&endpoints, |addr| async move {
                probe_connection(&addr, transport).await
            })
            .await
        }
        CoordinatorError::Rpc {
            code:
                tonic::Code::Unimplemented
                | tonic::Code::PermissionDenied
                | tonic::Code::Unauthenticated,
            ..
        } => match client.transport.dialer() {
            Ok(dialer) => {
                let dialer = &dialer;
                first_found(&endpoints, |addr| async move {
                    probe_service(&addr, dialer).await
                })
                .await
            }
            Err(_) => None,
        },
        _ => None,
    };
    match found {
        Some(diagnosis) => CliError::Diagnosed(diagnosis),
        None => error.into(),
    }
}

/// What the connection probe finds at `client`'s endpoints while its call
/// is still retrying ([`probe_connection`] on each, the first cause in
/// endpoint order): a setup that cannot work is named without waiting for
/// the call's retries to give up. `None` when every endpoint connects as
/// it should (or cannot be reached at all: the call's retries decide).
pub async fn early(client: &ClientArgs) -> Option<Diagnosis> {
    let endpoints = normalize_endpoints(&client.endpoints).ok()?;
    let transport = &client.transport;
    first_found(&endpoints, |addr| async move {
        probe_connection(&addr, transport).await
    })
    .await
}

/// The first diagnosis, in endpoint order, of probes run concurrently.
async fn first_found<F, Fut>(endpoints: &[String], probe: F) -> Option<Diagnosis>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Option<Diagnosis>>,
{
    let probes = endpoints.iter().map(|addr| {
        let probe = probe(addr.clone());
        async move {
            tokio::time::timeout(PROBE_TIMEOUT, probe)
                .await
                .ok()
                .flatten()
        }
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .flatten()
        .next()
}

/// Whether the endpoint at `addr` is a coordinator member, by its gRPC
/// health (see the module documentation).
pub async fn probe_service(addr: &str, dialer: &Arc<dyn Dialer>) -> Option<Diagnosis> {
    let channel = dialer.dial(addr).await.ok()?;
    let mut health = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest {
        service: service.to_string(),
    };
    match health.check(check(COORDINATOR_SERVICE)).await {
        Ok(_) => None,
        Err(status) if status.code() == tonic::Code::NotFound => {
            let escrow = health.check(check(ESCROW_SERVICE)).await.is_ok();
            Some(Diagnosis::WrongService {
                addr: addr.to_string(),
                escrow,
            })
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            Some(Diagnosis::WrongService {
                addr: addr.to_string(),
                escrow: false,
            })
        }
        Err(_) => None,
    }
}

/// What connecting to `addr` as `transport` says goes wrong (see the module
/// documentation), if anything.
pub async fn probe_connection(addr: &str, transport: &TransportArgs) -> Option<Diagnosis> {
    if let Some(status_line) = http_one_status_line(addr).await {
        return Some(Diagnosis::HttpOneListener {
            addr: addr.to_string(),
            status_line,
        });
    }
    let tcp = TcpStream::connect(addr).await.ok()?;
    let _ = tcp.set_nodelay(true);
    let files = match (&transport.ca, &transport.cert, &transport.cert_key) {
        (Some(ca), Some(cert), Some(key)) if !transport.insecure => {
            Some((ca.as_path(), cert.as_path(), key.as_path()))
        }
        _ => None,
    };
    if let Some((_, cert, _)) = files {
        if let Some(expired) = own_certificate_out_of_date(cert) {
            return Some(expired);
        }
    }
    let verifier = Arc::new(Recorder::new(match files {
        Some((ca, _, _)) => Some(webpki_verifier(ca)?),
        None => None,
    }));
    let config = client_config(verifier.clone(), files)?;
    let first_bytes = Arc::new(Mutex::new(Vec::new()));
    let stream = AdaptedConnection::new(tcp, KeepFirstBytes(first_bytes.clone()));
    let host = server_name(addr);
    let name = ServerName::try_from(host.clone()).ok()?;
    let handshake = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await;
    let reply = first_bytes
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let addr = addr.to_string();
    let Some((ca, cert, _)) = files else {
        // Plaintext command: only a TLS server is a diagnosis.
        return is_tls_record(&reply).then_some(Diagnosis::ServerSpeaksTls { addr });
    };
    match handshake {
        Ok(mut stream) => refusal_after_handshake(&mut stream).await.map(|why| {
            Diagnosis::ClientCertificateRefused {
                addr,
                cert: cert.to_path_buf(),
                why,
            }
        }),
        Err(error) => match rustls_error(&error) {
            Some(rustls::Error::InvalidCertificate(problem)) => Some(server_certificate(
                addr,
                &host,
                ca,
                problem,
                verifier.presented().as_deref(),
            )),
            Some(rustls::Error::AlertReceived(alert)) if is_tls_record(&reply) => {
                Some(Diagnosis::ClientCertificateRefused {
                    addr,
                    cert: cert.to_path_buf(),
                    why: Refusal::Alert(*alert),
                })
            }
            _ if !reply.is_empty() && !is_tls_record(&reply) => {
                Some(Diagnosis::ServerSpeaksPlaintext { addr })
            }
            _ => None,
        },
    }
}

/// The status line the server at `addr` answers HTTP/2's connection
/// preface with, when it answers in HTTP/1 (a gRPC server, plaintext or
/// TLS, never does: it sends a SETTINGS frame, a TLS alert, or closes).
async fn http_one_status_line(addr: &str) -> Option<String> {
    let mut tcp = TcpStream::connect(addr).await.ok()?;
    tcp.write_all(HTTP2_PREFACE).await.ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    let read_line = async {
        while !answer.contains(&b'\n') && answer.len() < buf.len() {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(read) => answer.extend_from_slice(&buf[..read]),
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_WAIT, read_line).await;
    http_one_status(&answer)
}

/// The status line of `answer` when it opens an HTTP/1 response.
fn http_one_status(answer: &[u8]) -> Option<String> {
    if !answer.starts_with(b"HTTP/1.") {
        return None;
    }
    let line = answer.split(|b| *b == b'\n').next().unwrap_or_default();
    Some(String::from_utf8_lossy(line).trim_end().to_string())
}

/// After a handshake whose server certificate verified: `None` when the
/// server talks HTTP/2 (it accepted this certificate), else how it refused.
async fn refusal_after_handshake<S>(stream: &mut S) -> Option<Refusal>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut buf = [0u8; 64];
    // A refusing server sends its alert (or closes) at once; an accepting
    // one may wait for the client's first bytes.
    if let Ok(read) = tokio::time::timeout(REFUSAL_WAIT, stream.read(&mut buf)).await {
        return refusal_of(read);
    }
    if stream.write_all(HTTP2_PREFACE).await.is_err() || stream.flush().await.is_err() {
        // Closed in between: read what it said last.
        return refusal_of(stream.read(&mut buf).await).or(Some(Refusal::Closed));
    }
    tokio::time::timeout(PROBE_TIMEOUT, stream.read(&mut buf))
        .await
        .ok()
        .and_then(refusal_of)
}

fn refusal_of(read: io::Result<usize>) -> Option<Refusal> {
    match read {
        Ok(0) => Some(Refusal::Closed),
        Ok(_) => None,
        Err(error) => Some(match rustls_error(&error) {
            Some(rustls::Error::AlertReceived(alert)) => Refusal::Alert(*alert),
            _ => Refusal::Closed,
        }),
    }
}

/// The rustls error inside an IO error of a TLS stream.
fn rustls_error(error: &io::Error) -> Option<&rustls::Error> {
    error.get_ref()?.downcast_ref::<rustls::Error>()
}

/// Whether `bytes` open a TLS record (handshake or alert, TLS 1.x).
fn is_tls_record(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

fn server_certificate(
    addr: String,
    host: &str,
    ca: &Path,
    problem: &CertificateError,
    presented: Option<&[u8]>,
) -> Diagnosis {
    let facts = presented.and_then(CertificateFacts::of);
    match problem {
        // A CA of another cluster under the same name (two `certs mint`
        // runs) is found as the issuer, and its signature does not verify.
        CertificateError::UnknownIssuer | CertificateError::BadSignature => {
            Diagnosis::ServerCertificateUntrusted {
                addr,
                ca: ca.to_path_buf(),
            }
        }
        CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
            Diagnosis::ServerCertificateExpired {
                addr,
                not_after: facts.map(|f| f.not_after),
            }
        }
        CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
            Diagnosis::ServerCertificateWrongName {
                addr,
                name: host.to_string(),
                names: facts.map(|f| f.names).unwrap_or_default(),
            }
        }
        other => Diagnosis::ServerCertificateInvalid {
            addr,
            reason: format!("{other:?}"),
        },
    }
}

/// What a certificate says about itself.
struct CertificateFacts {
    not_before: String,
    not_after: String,
    valid_now: bool,
    names: Vec<String>,
}

impl CertificateFacts {
    fn of(der: &[u8]) -> Option<Self> {
        use x509_parser::extensions::GeneralName;
        let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
        let validity = cert.validity();
        let names = cert
            .subject_alternative_name()
            .ok()
            .flatten()
            .map(|san| {
                san.value
                    .general_names
                    .iter()
                    .filter_map(|name| match name {
                        GeneralName::DNSName(dns) => Some((*dns).to_string()),
                        GeneralName::IPAddress(bytes) => ip_of(bytes),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default();
        Some(Self {
            not_before: utc(validity.not_before.timestamp()),
            not_after: utc(validity.not_after.timestamp()),
            valid_now: validity.is_valid(),
            names,
        })
    }
}

fn ip_of(bytes: &[u8]) -> Option<String> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes)
            .ok()
            .map(|b| std::net::Ipv4Addr::from(b).to_string()),
        16 => <[u8; 16]>::try_from(bytes)
            .ok()
            .map(|b| std::net::Ipv6Addr::from(b).to_string()),
        _ => None,
    }
}

/// `seconds` since the epoch as `YYYY-MM-DD HH:MM:SS UTC`.
fn utc(seconds: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(seconds) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02} {:02}:{:02}:{:02} UTC",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{seconds} s after the epoch"),
    }
}

/// This command's certificate, when its validity period excludes now.
fn own_certificate_out_of_date(cert: &Path) -> Option<Diagnosis> {
    let chain = crate::tls::load_certificates(cert).ok()?;
    let facts = CertificateFacts::of(chain.first()?)?;
    (!facts.valid_now).then(|| Diagnosis::ClientCertificateExpired {
        cert: cert.to_path_buf(),
        validity: format!("from {} until {}", facts.not_before, facts.not_after),
    })
}

fn webpki_verifier(ca: &Path) -> Option<Arc<WebPkiServerVerifier>> {
    let roots = crate::tls::load_roots(ca).ok()?;
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), crate::tls::crypto_provider())
        .build()
        .ok()
}

/// A client configuration as the TLS dialer's (ring, TLS 1.2 and 1.3,
/// ALPN h2), verifying with `verifier` and presenting the certificate of
/// `files` when given.
fn client_config(
    verifier: Arc<Recorder>,
    files: Option<(&Path, &Path, &Path)>,
) -> Option<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(crate::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .ok()?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match files {
        Some((_, cert, key)) => builder
            .with_client_auth_cert(
                crate::tls::load_certificates(cert).ok()?,
                crate::tls::load_private_key(key).ok()?,
            )
            .ok()?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Some(config)
}

/// Verifies server certificates with the real verifier (none: refuses every
/// one, for a plaintext command that only asks whether the server speaks
/// TLS) and keeps the end-entity certificate presented, for the message.
#[derive(Debug)]
struct Recorder {
    inner: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
    presented: Mutex<Option<Vec<u8>>>,
}

impl Recorder {
    fn new(inner: Option<Arc<WebPkiServerVerifier>>) -> Self {
        Self {
            inner,
            provider: crate::tls::crypto_provider(),
            presented: Mutex::new(None),
        }
    }

    fn presented(&self) -> Option<Vec<u8>> {
        self.presented
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        *self
            .presented
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(end_entity.to_vec());
        match &self.inner {
            Some(inner) => {
                inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
            }
            None => Err(rustls::Error::General(
                "a plaintext command's probe goes no further".into(),
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Keeps the first bytes read from a connection ([`FIRST_BYTES`] at most).
struct KeepFirstBytes(Arc<Mutex<Vec<u8>>>);

/// How many first bytes [`KeepFirstBytes`] keeps.
const FIRST_BYTES: usize = 16;

impl<S: AsyncRead + Unpin> ReadAdapter<S> for KeepFirstBytes {
    fn poll_read(
        &mut self,
        inner: Pin<&mut S>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = inner.poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let mut seen = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let room = FIRST_BYTES.saturating_sub(seen.len());
            let new = &buf.filled()[before..];
            seen.extend_from_slice(&new[..new.len().min(room)]);
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_records_are_told_from_http2_frames() {
        assert!(is_tls_record(&[0x16, 0x03, 0x03, 0x00, 0x7a]));
        assert!(is_tls_record(&[0x15, 0x03, 0x03, 0x00, 0x02]));
        // An HTTP/2 SETTINGS frame, as a plaintext server's first bytes.
        assert!(!is_tls_record(&[0x00, 0x00, 0x12, 0x04, 0x00]));
        assert!(!is_tls_record(b"HTTP/1.1 400"));
        assert!(!is_tls_record(&[]));
    }

    #[test]
    fn every_diagnosis_has_a_code_a_message_naming_the_endpoint_and_a_hint() {
        let addr = "10.0.0.1:7100".to_string();
        let cert = PathBuf::from("/certs/operator-admin.pem");
        for diagnosis in [
            Diagnosis::ServerSpeaksTls { addr: addr.clone() },
            Diagnosis::ServerSpeaksPlaintext { addr: addr.clone() },
            Diagnosis::ServerCertificateUntrusted {
                addr: addr.clone(),
                ca: "/certs/ca.pem".into(),
            },
            Diagnosis::ServerCertificateExpired {
                addr: addr.clone(),
                not_after: Some(utc(0)),
            },
            Diagnosis::ServerCertificateWrongName {
                addr: addr.clone(),
                name: "10.0.0.1".into(),
                names: vec!["n1".into()],
            },
            Diagnosis::ServerCertificateInvalid {
                addr: addr.clone(),
                reason: "BadSignature".into(),
            },
            Diagnosis::ClientCertificateRefused {
                addr: addr.clone(),
                cert: cert.clone(),
                why: Refusal::Alert(AlertDescription::UnknownCA),
            },
            Diagnosis::HttpOneListener {
                addr: addr.clone(),
                status_line: "HTTP/1.1 400 Bad Request".into(),
            },
            Diagnosis::WrongService {
                addr: addr.clone(),
                escrow: true,
            },
        ] {
            assert!(diagnosis.to_string().contains(&addr), "{diagnosis}");
            assert!(!diagnosis.code().is_empty());
            assert!(!diagnosis.hint().is_empty());
        }
        let expired = Diagnosis::ClientCertificateExpired {
            cert: cert.clone(),
            validity: "from a until b".into(),
        };
        assert!(expired.to_string().contains("operator-admin.pem"));
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
    }

    #[test]
    fn http_one_answers_are_told_from_grpc_and_tls() {
        assert_eq!(
            http_one_status(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n").as_deref(),
            Some("HTTP/1.1 400 Bad Request")
        );
        assert_eq!(
            http_one_status(b"HTTP/1.0 200 OK").as_deref(),
            Some("HTTP/1.0 200 OK")
        );
        // An HTTP/2 SETTINGS frame, a TLS alert, nothing.
        assert_eq!(http_one_status(&[0, 0, 0, 4, 0, 0, 0, 0, 0]), None);
        assert_eq!(http_one_status(&[0x15, 0x03, 0x03, 0, 2, 2, 50]), None);
        assert_eq!(http_one_status(b""), None);
        assert_eq!(http_one_status(b"HTTP/2 200"), None);
    }

    #[test]
    fn ip_sans_read_as_addresses() {
        assert_eq!(ip_of(&[127, 0, 0, 1]).as_deref(), Some("127.0.0.1"));
        assert_eq!(ip_of(&[0; 16]).as_deref(), Some("::"));
        assert_eq!(ip_of(&[1, 2, 3]), None);
    }
}
