//! What a probe of an endpoint finds ([`Diagnosis`]): each cause with its
//! stable code, its message naming the endpoint (and the file or names
//! involved) and a hint of what to do.

use std::fmt;
use std::path::PathBuf;

use rustls::AlertDescription;

/// The service every coordinator member's health knows.
pub(super) const COORDINATOR_SERVICE: &str = "leasehold.v1.Coordinator";
/// The service an escrow node's health knows.
pub(super) const ESCROW_SERVICE: &str = "leasehold.v1.Escrow";

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::diagnose::certificates::utc;

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
}
