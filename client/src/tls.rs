//! Mutual TLS for outgoing connections: [`TlsDialer`] dials `https://` with
//! this process's certificate and key and verifies the server against a CA
//! bundle.
//!
//! The files are re-read on every dial, so a rotated certificate or CA takes
//! effect on the next connection without a restart. The server's name is the
//! dialled host: server certificates carry DNS or IP SANs for the names
//! their members are dialled by. [`crate::transport::TcpDialer`]
//! stays the plaintext dialer for `--insecure` deployments.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::transport::{
    normalize_addr, ByteStream, DialError, DialFuture, Dialer, StreamDialFuture, TcpDialer,
    TcpDialerOptions,
};

/// Where a client's TLS material lives (PEM files).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA bundle the server's certificate must chain to.
    pub ca: PathBuf,
    /// This process's certificate chain (leaf first).
    pub cert: PathBuf,
    /// This process's private key.
    pub key: PathBuf,
}

/// The PEM bytes of a CA bundle, a certificate chain and a key.
type PemFiles = (Vec<u8>, Vec<u8>, Vec<u8>);

/// Dials peers over mutual TLS (HTTP/2 over TLS 1.2/1.3, ring provider).
#[derive(Debug, Clone)]
pub struct TlsDialer {
    files: ClientTlsFiles,
    tcp: TcpDialer,
}

impl TlsDialer {
    /// A dialer presenting `files` with default connection options.
    pub fn new(files: ClientTlsFiles) -> Self {
        Self::with_options(files, TcpDialerOptions::default())
    }

    /// A dialer presenting `files` with the given connection options.
    pub fn with_options(files: ClientTlsFiles, options: TcpDialerOptions) -> Self {
        Self {
            files,
            tcp: TcpDialer::new(options),
        }
    }

    /// The files this dialer reads on each dial.
    pub fn files(&self) -> &ClientTlsFiles {
        &self.files
    }

    /// The CA bundle, certificate chain and key, read now.
    fn read_files(&self, addr: &str) -> Result<PemFiles, DialError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| DialError::Credentials {
                addr: addr.to_string(),
                reason: format!("cannot read {}: {e}", path.display()),
            })
        };
        Ok((
            read(&self.files.ca)?,
            read(&self.files.cert)?,
            read(&self.files.key)?,
        ))
    }

    fn tls_config(&self, addr: &str) -> Result<ClientTlsConfig, DialError> {
        let (ca, cert, key) = self.read_files(addr)?;
        let host = server_name(addr);
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(host))
    }
}

/// A rustls client configuration presenting `cert`/`key` and trusting
/// `ca` (PEM), as tonic builds it for the gRPC channels (ring provider,
/// TLS 1.2 and 1.3), without ALPN: the stream carries no HTTP/2.
fn stream_tls_config(
    addr: &str,
    ca: &[u8],
    cert: &[u8],
    key: &[u8],
) -> Result<rustls::ClientConfig, DialError> {
    let bad = |reason: String| DialError::Credentials {
        addr: addr.to_string(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for ca_cert in CertificateDer::pem_slice_iter(ca) {
        let ca_cert = ca_cert.map_err(|e| bad(format!("CA bundle: {e}")))?;
        roots
            .add(ca_cert)
            .map_err(|e| bad(format!("CA bundle: {e}")))?;
    }
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("certificate: {e}")))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| bad(format!("key: {e}")))?;
    rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| bad(e.to_string()))
}

/// The name a server certificate must carry for `addr` (`host:port`): the
/// host, without brackets for IPv6.
pub fn server_name(addr: &str) -> String {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_string()
}

impl Dialer for TlsDialer {
    fn dial(&self, addr: &str) -> DialFuture {
        let endpoint = normalize_addr(addr).and_then(|addr| {
            let config = self.tls_config(&addr)?;
            self.tcp
                .endpoint_for_uri(&addr, format!("https://{addr}"))?
                .tls_config(config)
                .map_err(|e| DialError::Credentials {
                    addr: addr.clone(),
                    reason: e.to_string(),
                })
        });
        Box::pin(async move { Ok(endpoint?.connect_lazy()) })
    }

    fn dial_stream(&self, addr: &str) -> StreamDialFuture {
        let (dialer, addr) = (self.clone(), addr.to_string());
        Box::pin(async move {
            let addr = normalize_addr(&addr)?;
            let (ca, cert, key) = dialer.read_files(&addr)?;
            let config = stream_tls_config(&addr, &ca, &cert, &key)?;
            let name = ServerName::try_from(server_name(&addr)).map_err(|e| {
                DialError::InvalidAddress {
                    addr: addr.clone(),
                    reason: e.to_string(),
                }
            })?;
            let tcp = dialer.tcp.connect_tcp(&addr).await?;
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let handshake = connector.connect(name, tcp);
            let timeout = dialer.tcp.options().connect_timeout;
            let stream = tokio::time::timeout(timeout, handshake)
                .await
                .map_err(|_| DialError::Connect {
                    addr: addr.clone(),
                    reason: format!("no TLS handshake within {} ms", timeout.as_millis()),
                })?
                .map_err(|e| DialError::Connect {
                    addr: addr.clone(),
                    reason: format!("TLS handshake: {e}"),
                })?;
            let stream: Box<dyn ByteStream> = Box::new(stream);
            Ok(stream)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_name_is_the_dialled_host() {
        assert_eq!(server_name("n1:7100"), "n1");
        assert_eq!(server_name("127.0.0.1:7100"), "127.0.0.1");
        assert_eq!(server_name("[::1]:7100"), "::1");
    }

    #[tokio::test]
    async fn missing_files_are_a_credentials_error_naming_the_file() {
        let dialer = TlsDialer::new(ClientTlsFiles {
            ca: "/nonexistent/ca.pem".into(),
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
        });
        match dialer.dial("127.0.0.1:1").await {
            Err(DialError::Credentials { reason, .. }) => {
                assert!(reason.contains("/nonexistent/ca.pem"), "{reason}")
            }
            other => panic!("expected a credentials error, got {other:?}"),
        }
    }
}
