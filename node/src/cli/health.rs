//! `leasehold health`: one standard gRPC health check
//! (`grpc.health.v1.Health/Check`) of a member or an escrow node, for
//! container health checks and probes. It exits 0 only when the process
//! answers `SERVING` for the asked service.
//!
//! Which service to ask:
//!
//! | `--service` | `SERVING` means |
//! |---|---|
//! | `""` (default) | the process is up and serving gRPC |
//! | `leasehold.v1.Coordinator` | a member that can serve Coordinator calls (it knows a leader; never before `cluster init`) |
//! | `leasehold.v1.Escrow` | an escrow node serving its region |
//! | `envoy.service.ratelimit.v3.RateLimitService` | an escrow node serving Envoy's rate limit service (`--ratelimit-config`) |
//!
//! How it connects: the client TLS options (`--ca/--cert/--cert-key`,
//! `LEASEHOLD_CA/LEASEHOLD_CERT/LEASEHOLD_KEY`) or `--insecure`
//! (`LEASEHOLD_INSECURE=true`); when none of them is given it presents the
//! server's own certificate from `LEASEHOLD_TLS_CA/LEASEHOLD_TLS_CERT/
//! LEASEHOLD_TLS_KEY`, so a check inside a server's container needs no
//! separate identity (health answers any authenticated identity).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use leasehold_client::transport::normalize_addr;
use serde_json::json;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

use super::args::TransportArgs;
use super::error::CliError;
use super::output::{emit, OutputFormat};

/// Options of `leasehold health`.
#[derive(Debug, Clone, Args)]
pub struct HealthArgs {
    /// The member or escrow node to check, HOST:PORT (or http://HOST:PORT).
    #[arg(
        long,
        short = 'e',
        env = "LEASEHOLD_HEALTH_ENDPOINT",
        default_value = "127.0.0.1:7100"
    )]
    pub endpoint: String,
    /// The service asked about: "" (the process), `leasehold.v1.Coordinator`,
    /// `leasehold.v1.Escrow` or `envoy.service.ratelimit.v3.RateLimitService`.
    #[arg(long, env = "LEASEHOLD_HEALTH_SERVICE", default_value = "")]
    pub service: String,
    /// Deadline of the whole check (connect and answer), in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    pub timeout_ms: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
    /// How to connect; see the module documentation for the fallback to the
    /// server's own certificate.
    #[command(flatten)]
    pub transport: TransportArgs,
}

/// The server certificate files of this process's environment
/// (`LEASEHOLD_TLS_CA`, `LEASEHOLD_TLS_CERT`, `LEASEHOLD_TLS_KEY`), the ones
/// `serve` and `escrow` read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerTlsEnv {
    /// `LEASEHOLD_TLS_CA`.
    pub ca: Option<PathBuf>,
    /// `LEASEHOLD_TLS_CERT`.
    pub cert: Option<PathBuf>,
    /// `LEASEHOLD_TLS_KEY`.
    pub key: Option<PathBuf>,
}

impl ServerTlsEnv {
    /// Reads the three variables (empty values count as unset).
    pub fn from_env() -> Self {
        let var = |name: &str| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        ServerTlsEnv {
            ca: var("LEASEHOLD_TLS_CA"),
            cert: var("LEASEHOLD_TLS_CERT"),
            key: var("LEASEHOLD_TLS_KEY"),
        }
    }
}

/// How the check connects. Law: client options, when any is given, are used
/// as given (and checked as every client command checks them); only when
/// none is given does the server's own certificate stand in, and only when
/// all three of its files are named.
pub fn health_transport(
    client: &TransportArgs,
    server: &ServerTlsEnv,
) -> Result<TransportArgs, CliError> {
    let client_given = client.insecure
        || client.ca.is_some()
        || client.cert.is_some()
        || client.cert_key.is_some();
    if client_given {
        return Ok(client.clone());
    }
    match (&server.ca, &server.cert, &server.key) {
        (Some(ca), Some(cert), Some(key)) => Ok(TransportArgs {
            ca: Some(ca.clone()),
            cert: Some(cert.clone()),
            cert_key: Some(key.clone()),
            insecure: false,
        }),
        (None, None, None) => Err(CliError::Usage(
            "no TLS credentials for the health check: pass --ca, --cert and --cert-key (or set \
             LEASEHOLD_CA, LEASEHOLD_CERT, LEASEHOLD_KEY, or the server's LEASEHOLD_TLS_CA, \
             LEASEHOLD_TLS_CERT, LEASEHOLD_TLS_KEY), or --insecure for a process running plaintext"
                .into(),
        )),
        _ => Err(CliError::Usage(
            "LEASEHOLD_TLS_CA, LEASEHOLD_TLS_CERT and LEASEHOLD_TLS_KEY must be set together"
                .into(),
        )),
    }
}

/// The name a serving status is known by in the gRPC health protocol.
pub fn status_name(status: ServingStatus) -> &'static str {
    status.as_str_name()
}

/// Runs `leasehold health`.
pub async fn run(args: HealthArgs) -> Result<(), CliError> {
    let endpoint =
        normalize_addr(&args.endpoint).map_err(|e| CliError::Usage(format!("--endpoint: {e}")))?;
    let dialer = health_transport(&args.transport, &ServerTlsEnv::from_env())?.dialer()?;
    let deadline = Duration::from_millis(args.timeout_ms.max(1));
    let service_label = if args.service.is_empty() {
        "the process".to_string()
    } else {
        format!("service {}", args.service)
    };
    let check = async {
        let channel = dialer
            .dial(&endpoint)
            .await
            .map_err(|e| CliError::Failed(format!("health check of {endpoint}: {e}")))?;
        HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: args.service.clone(),
            })
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| match status.code() {
                tonic::Code::NotFound => CliError::Failed(format!(
                    "{endpoint} does not know {service_label} (health answers NOT_FOUND)"
                )),
                code => CliError::Failed(format!(
                    "health check of {endpoint}: {code:?}: {}",
                    status.message()
                )),
            })
    };
    let response = tokio::time::timeout(deadline, check).await.map_err(|_| {
        CliError::Failed(format!(
            "health check of {endpoint}: no answer within {} ms",
            deadline.as_millis()
        ))
    })??;
    let status = ServingStatus::try_from(response.status).unwrap_or(ServingStatus::Unknown);
    if status != ServingStatus::Serving {
        return Err(CliError::Failed(format!(
            "{endpoint}: {service_label} is {}",
            status_name(status)
        )));
    }
    emit(
        args.output,
        json!({"endpoint": endpoint, "service": args.service, "status": status_name(status)}),
        || format!("{endpoint}: {service_label} is SERVING"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server_env(ca: Option<&str>, cert: Option<&str>, key: Option<&str>) -> ServerTlsEnv {
        ServerTlsEnv {
            ca: ca.map(PathBuf::from),
            cert: cert.map(PathBuf::from),
            key: key.map(PathBuf::from),
        }
    }

    #[test]
    fn client_options_win_over_the_server_certificate() {
        let client = TransportArgs {
            ca: Some("op-ca.pem".into()),
            cert: Some("op.pem".into()),
            cert_key: Some("op.key".into()),
            insecure: false,
        };
        let chosen = health_transport(
            &client,
            &server_env(Some("ca.pem"), Some("m.pem"), Some("m.key")),
        )
        .unwrap();
        assert_eq!(chosen.cert.as_deref(), Some(std::path::Path::new("op.pem")));

        let plaintext = health_transport(
            &TransportArgs::insecure(),
            &server_env(Some("ca.pem"), Some("m.pem"), Some("m.key")),
        )
        .unwrap();
        assert!(plaintext.insecure && plaintext.cert.is_none());
    }

    #[test]
    fn the_server_certificate_stands_in_when_no_client_option_is_given() {
        let chosen = health_transport(
            &TransportArgs::default(),
            &server_env(Some("ca.pem"), Some("m.pem"), Some("m.key")),
        )
        .unwrap();
        assert_eq!(chosen.ca.as_deref(), Some(std::path::Path::new("ca.pem")));
        assert_eq!(chosen.cert.as_deref(), Some(std::path::Path::new("m.pem")));
        assert_eq!(
            chosen.cert_key.as_deref(),
            Some(std::path::Path::new("m.key"))
        );
        assert!(!chosen.insecure);
        assert!(chosen.dialer().is_ok());
    }

    #[test]
    fn missing_or_partial_credentials_are_refused_with_what_to_set() {
        let none = health_transport(&TransportArgs::default(), &ServerTlsEnv::default())
            .unwrap_err()
            .to_string();
        assert!(none.contains("LEASEHOLD_TLS_CA") && none.contains("--insecure"));
        let partial = health_transport(
            &TransportArgs::default(),
            &server_env(Some("ca.pem"), None, Some("m.key")),
        )
        .unwrap_err()
        .to_string();
        assert!(partial.contains("must be set together"), "{partial}");
        let half_client = TransportArgs {
            ca: Some("ca.pem".into()),
            ..TransportArgs::default()
        };
        let chosen = health_transport(&half_client, &ServerTlsEnv::default()).unwrap();
        assert!(chosen.dialer().is_err());
    }
}
