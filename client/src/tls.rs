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

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::transport::{
    normalize_addr, DialError, DialFuture, Dialer, TcpDialer, TcpDialerOptions,
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

    fn tls_config(&self, addr: &str) -> Result<ClientTlsConfig, DialError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| DialError::Credentials {
                addr: addr.to_string(),
                reason: format!("cannot read {}: {e}", path.display()),
            })
        };
        let ca = read(&self.files.ca)?;
        let cert = read(&self.files.cert)?;
        let key = read(&self.files.key)?;
        let host = server_name(addr);
        Ok(ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(host))
    }
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
