//! The options client and server commands share: where a client command
//! connects and how it prints ([`ClientArgs`], [`TransportArgs`]), and a
//! server process's mutual TLS ([`ServerTlsArgs`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use leasehold_client::coordinator::{CoordinatorClient, RetryOptions};
use leasehold_client::tls::{ClientTlsFiles, TlsDialer};
use leasehold_client::transport::{Dialer, TcpDialer};

use super::error::CliError;
use super::output::OutputFormat;

/// Where a client command connects, and how it prints.
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Coordinator member(s) as HOST:PORT (or http://HOST:PORT); repeat or comma-separate.
    #[arg(
        long = "endpoint",
        short = 'e',
        value_delimiter = ',',
        default_value = "127.0.0.1:7100",
        env = "LEASEHOLD_ENDPOINT"
    )]
    pub endpoints: Vec<String>,
    /// Total time budget of the call, retries included, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub timeout_ms: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// How to connect (mutual TLS or plaintext).
    #[command(flatten)]
    pub transport: TransportArgs,
}

/// How a client command connects: mutual TLS with a CA bundle, a
/// certificate and its key, or plaintext with `--insecure`.
#[derive(Debug, Clone, Default, Args)]
pub struct TransportArgs {
    /// CA bundle (PEM) the cluster's certificates chain to.
    #[arg(long, visible_alias = "tls-ca", env = "LEASEHOLD_CA")]
    pub ca: Option<PathBuf>,
    /// Your certificate (PEM), e.g. an operator's.
    #[arg(long, visible_alias = "tls-cert", env = "LEASEHOLD_CERT")]
    pub cert: Option<PathBuf>,
    /// Your certificate's private key (PEM). (`--key` names the limited key.)
    #[arg(long = "cert-key", visible_alias = "tls-key", env = "LEASEHOLD_KEY")]
    pub cert_key: Option<PathBuf>,
    /// Connect in plaintext, without a certificate (clusters run with --insecure).
    #[arg(long, env = "LEASEHOLD_INSECURE")]
    pub insecure: bool,
}

impl TransportArgs {
    /// Plaintext, for clusters running with `--insecure`.
    pub fn insecure() -> Self {
        Self {
            insecure: true,
            ..Self::default()
        }
    }

    /// Mutual TLS with these files.
    pub fn tls(files: &crate::tls::TlsFiles) -> Self {
        Self {
            ca: Some(files.ca.clone()),
            cert: Some(files.cert.clone()),
            cert_key: Some(files.key.clone()),
            insecure: false,
        }
    }

    /// The dialer these options describe.
    pub fn dialer(&self) -> Result<Arc<dyn Dialer>, CliError> {
        match (&self.ca, &self.cert, &self.cert_key, self.insecure) {
            (None, None, None, true) => Ok(Arc::new(TcpDialer::default())),
            (Some(ca), Some(cert), Some(key), false) => {
                Ok(Arc::new(TlsDialer::new(ClientTlsFiles {
                    ca: ca.clone(),
                    cert: cert.clone(),
                    key: key.clone(),
                })))
            }
            (None, None, None, false) => Err(CliError::Usage(
                "no TLS credentials: pass --ca, --cert and --cert-key (or set LEASEHOLD_CA, \
                 LEASEHOLD_CERT, LEASEHOLD_KEY), or --insecure for a cluster running plaintext"
                    .into(),
            )),
            (_, _, _, true) => Err(CliError::Usage(
                "--insecure and --ca/--cert/--cert-key were both given: choose one".into(),
            )),
            _ => Err(CliError::Usage(
                "--ca, --cert and --cert-key must be given together".into(),
            )),
        }
    }
}

/// Mutual TLS of a server process (`serve`, `escrow`): its CA bundle,
/// certificate and key, or `--insecure`.
#[derive(Debug, Clone, Default, Args)]
pub struct ServerTlsArgs {
    /// CA bundle (PEM) that callers' certificates must chain to.
    #[arg(long, env = "LEASEHOLD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This process's certificate (PEM), also presented to the servers it calls.
    #[arg(long, env = "LEASEHOLD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This process's private key (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Serve and call in plaintext, without identities: no protection against
    /// callers on the network. For tests and trusted local setups only.
    #[arg(long)]
    pub insecure: bool,
}

impl ClientArgs {
    /// A coordinator client for these endpoints.
    pub fn client(&self) -> Result<CoordinatorClient, CliError> {
        self.client_with_call_timeout(RetryOptions::default().call_timeout)
    }

    /// A coordinator client for these endpoints whose tries may each take
    /// up to `call_timeout` (within the total budget).
    pub fn client_with_call_timeout(
        &self,
        call_timeout: Duration,
    ) -> Result<CoordinatorClient, CliError> {
        let total = Duration::from_millis(self.timeout_ms.max(1));
        let options = RetryOptions {
            total_timeout: total,
            call_timeout: call_timeout.min(total),
            ..RetryOptions::default()
        };
        Ok(CoordinatorClient::with_options(
            &self.endpoints,
            self.transport.dialer()?,
            options,
        )?)
    }
}
