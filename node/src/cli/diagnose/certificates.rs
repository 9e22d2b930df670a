//! The certificates of a connection probe: a verifier that verifies the
//! server's certificate as the client does while recording why it failed
//! ([`Recorder`]), the client configuration presenting this command's
//! certificate, and what a certificate says about itself (names, validity)
//! for the diagnosis.

use std::path::Path;
use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use super::diagnosis::Diagnosis;

/// The diagnosis of a server certificate that failed verification.
pub(super) fn server_certificate(
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
pub(super) fn utc(seconds: i64) -> String {
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
pub(super) fn own_certificate_out_of_date(cert: &Path) -> Option<Diagnosis> {
    let chain = crate::tls::load_certificates(cert).ok()?;
    let facts = CertificateFacts::of(chain.first()?)?;
    (!facts.valid_now).then(|| Diagnosis::ClientCertificateExpired {
        cert: cert.to_path_buf(),
        validity: format!("from {} until {}", facts.not_before, facts.not_after),
    })
}

pub(super) fn webpki_verifier(ca: &Path) -> Option<Arc<WebPkiServerVerifier>> {
    let roots = crate::tls::load_roots(ca).ok()?;
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), crate::tls::crypto_provider())
        .build()
        .ok()
}

/// A client configuration as the TLS dialer's (ring, TLS 1.2 and 1.3,
/// ALPN h2), verifying with `verifier` and presenting the certificate of
/// `files` when given.
pub(super) fn client_config(
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
pub(super) struct Recorder {
    inner: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
    presented: Mutex<Option<Vec<u8>>>,
}

impl Recorder {
    pub(super) fn new(inner: Option<Arc<WebPkiServerVerifier>>) -> Self {
        Self {
            inner,
            provider: crate::tls::crypto_provider(),
            presented: Mutex::new(None),
        }
    }

    pub(super) fn presented(&self) -> Option<Vec<u8>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_sans_read_as_addresses() {
        assert_eq!(ip_of(&[127, 0, 0, 1]).as_deref(), Some("127.0.0.1"));
        assert_eq!(ip_of(&[0; 16]).as_deref(), Some("::"));
        assert_eq!(ip_of(&[1, 2, 3]), None);
    }
}
