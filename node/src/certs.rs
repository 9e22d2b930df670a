//! Certificates for Leasehold identities: a certificate authority (new, or
//! loaded from its PEM certificate and key) that issues one certificate per
//! [`Principal`], with the principal's SAN URI, the DNS names and IP
//! addresses it is dialled by, and both server and client authentication
//! usages (members and escrow nodes are both).
//!
//! Used by `leasehold certs mint` (files for compose and Kubernetes
//! deployments) and by `leasehold dev` / `leasehold demo` (a throwaway CA
//! under their data directory). Files are written as `ca.pem` (and
//! `ca.key`), and `<identity>.pem` / `<identity>.key` per identity, where
//! `<identity>` is [`file_stem`]: `member-1`, `operator-admin`,
//! `region-eu`, `service-checkout-eu`.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use leasehold_core::principal::Principal;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::tls::TlsFiles;

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// The certificate library refused the parameters or key.
    #[error("cannot create certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The anonymous principal has no certificate.
    #[error("the anonymous principal has no certificate")]
    Anonymous,
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The file name (without extension) of `principal`'s certificate and key.
pub fn file_stem(principal: &Principal) -> String {
    match principal {
        Principal::Anonymous => "anonymous".into(),
        Principal::Member(id) => format!("member-{id}"),
        Principal::Operator(name) => format!("operator-{name}"),
        Principal::Region(region) => format!("region-{region}"),
        Principal::Service { name, region } => format!("service-{name}-{region}"),
    }
}

/// The TLS files of `principal` in `dir`, as [`mint`] writes them.
pub fn files_for(dir: &Path, principal: &Principal) -> TlsFiles {
    let stem = file_stem(principal);
    TlsFiles {
        ca: dir.join("ca.pem"),
        cert: dir.join(format!("{stem}.pem")),
        key: dir.join(format!("{stem}.key")),
    }
}

/// A certificate and its private key, PEM-encoded.
#[derive(Debug, Clone)]
pub struct IssuedCertificate {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

/// A CA that issues identity certificates.
#[derive(Debug)]
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    key_pem: String,
    validity_days: i64,
}

impl CertificateAuthority {
    /// A new CA named `name`; it and the certificates it issues are valid
    /// for `validity_days` (from an hour ago, for clock skew).
    pub fn generate(name: &str, validity_days: u32) -> Result<Self, CertError> {
        let key = KeyPair::generate()?;
        let key_pem = key.serialize_pem();
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, name);
        params.distinguished_name = subject;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        set_validity(&mut params, i64::from(validity_days));
        let cert_pem = params.self_signed(&key)?.pem();
        let issuer = Issuer::new(params, key);
        Ok(Self {
            issuer,
            cert_pem,
            key_pem,
            validity_days: i64::from(validity_days),
        })
    }

    /// An existing CA from its PEM certificate and key; issued
    /// certificates are valid for `validity_days`.
    pub fn load(cert_path: &Path, key_path: &Path, validity_days: u32) -> Result<Self, CertError> {
        let cert_pem = std::fs::read_to_string(cert_path).map_err(io_error(cert_path))?;
        let key_pem = std::fs::read_to_string(key_path).map_err(io_error(key_path))?;
        let issuer = Issuer::from_ca_cert_pem(&cert_pem, KeyPair::from_pem(&key_pem)?)?;
        Ok(Self {
            issuer,
            cert_pem,
            key_pem,
            validity_days: i64::from(validity_days),
        })
    }

    /// The CA certificate (the bundle every process trusts).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate for `principal`, also valid as a server for `names`
    /// (DNS names or IP addresses).
    pub fn issue(
        &self,
        principal: &Principal,
        names: &[String],
    ) -> Result<IssuedCertificate, CertError> {
        let uri = principal.to_uri().ok_or(CertError::Anonymous)?;
        self.issue_with(Some(uri), &principal.to_string(), names)
    }

    /// A certificate naming no principal (to test that it is refused).
    #[cfg(test)]
    pub(crate) fn issue_without_principal(
        &self,
        names: &[String],
    ) -> Result<IssuedCertificate, CertError> {
        self.issue_with(None, "nobody", names)
    }

    fn issue_with(
        &self,
        uri: Option<String>,
        common_name: &str,
        names: &[String],
    ) -> Result<IssuedCertificate, CertError> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::default();
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, common_name);
        params.distinguished_name = subject;
        if let Some(uri) = uri {
            params.subject_alt_names.push(SanType::URI(uri.try_into()?));
        }
        for name in names {
            params.subject_alt_names.push(match name.parse::<IpAddr>() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) => SanType::DnsName(name.clone().try_into()?),
            });
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, self.validity_days);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCertificate {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes `ca.pem` (and `ca.key` when `with_key`) into `dir`.
    pub fn write(&self, dir: &Path, with_key: bool) -> Result<(), CertError> {
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        write_file(&dir.join("ca.pem"), &self.cert_pem, false)?;
        if with_key {
            write_file(&dir.join("ca.key"), &self.key_pem, true)?;
        }
        Ok(())
    }

    /// Issues `principal`'s certificate and writes it into `dir` (see
    /// [`files_for`]); returns the files.
    pub fn issue_into(
        &self,
        dir: &Path,
        principal: &Principal,
        names: &[String],
    ) -> Result<TlsFiles, CertError> {
        let issued = self.issue(principal, names)?;
        let files = files_for(dir, principal);
        std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        write_file(&files.cert, &issued.cert_pem, false)?;
        write_file(&files.key, &issued.key_pem, true)?;
        Ok(files)
    }
}

fn set_validity(params: &mut CertificateParams, days: i64) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(days.max(1));
}

/// Writes `contents` to `path` atomically (a temporary file renamed over
/// it, so a reloading process never reads half a file); private keys are
/// readable by the owner only.
fn write_file(path: &Path, contents: &str, private: bool) -> Result<(), CertError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(io_error(&tmp))?;
    #[cfg(unix)]
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
            .map_err(io_error(&tmp))?;
    }
    #[cfg(not(unix))]
    let _ = private;
    std::fs::rename(&tmp, path).map_err(io_error(path))
}

/// Everything `leasehold certs mint` (or a dev cluster) needs issued.
#[derive(Debug, Clone, Default)]
pub struct MintPlan {
    /// Member ids.
    pub members: Vec<u64>,
    /// Regions (escrow nodes).
    pub regions: Vec<leasehold_core::ids::RegionId>,
    /// Operator names.
    pub operators: Vec<String>,
    /// Services as `(name, region)`.
    pub services: Vec<(String, leasehold_core::ids::RegionId)>,
    /// DNS names and IP addresses put in member and region certificates.
    pub server_names: Vec<String>,
}

impl MintPlan {
    /// Every principal of the plan.
    pub fn principals(&self) -> Vec<Principal> {
        let mut all: Vec<Principal> = self
            .members
            .iter()
            .map(|id| Principal::Member(*id))
            .collect();
        all.extend(self.regions.iter().cloned().map(Principal::Region));
        all.extend(self.operators.iter().cloned().map(Principal::Operator));
        all.extend(
            self.services
                .iter()
                .map(|(name, region)| Principal::Service {
                    name: name.clone(),
                    region: region.clone(),
                }),
        );
        all
    }
}

/// Issues every certificate of `plan` with `ca` into `dir`; members and
/// regions also carry `plan.server_names`. Returns `(principal, files)`.
pub fn mint(
    ca: &CertificateAuthority,
    dir: &Path,
    plan: &MintPlan,
) -> Result<Vec<(Principal, TlsFiles)>, CertError> {
    ca.write(dir, false)?;
    plan.principals()
        .into_iter()
        .map(|principal| {
            let names: &[String] = match principal {
                Principal::Member(_) | Principal::Region(_) => &plan.server_names,
                _ => &[],
            };
            let files = ca.issue_into(dir, &principal, names)?;
            Ok((principal, files))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::principal_of_certificate;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    #[test]
    fn issued_certificates_name_their_principal() {
        let ca = CertificateAuthority::generate("test CA", 1).unwrap();
        for principal in [
            Principal::Member(3),
            Principal::Operator("alice".into()),
            Principal::Region(leasehold_core::ids::RegionId::new("eu").unwrap()),
            Principal::Service {
                name: "checkout".into(),
                region: leasehold_core::ids::RegionId::new("eu").unwrap(),
            },
        ] {
            let issued = ca
                .issue(&principal, &["localhost".into(), "127.0.0.1".into()])
                .unwrap();
            let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
            assert_eq!(principal_of_certificate(&der), Some(principal));
        }
        assert!(matches!(
            ca.issue(&Principal::Anonymous, &[]),
            Err(CertError::Anonymous)
        ));
    }

    #[test]
    fn a_loaded_ca_issues_certificates_that_chain_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::generate("test CA", 1).unwrap();
        ca.write(dir.path(), true).unwrap();
        let loaded =
            CertificateAuthority::load(&dir.path().join("ca.pem"), &dir.path().join("ca.key"), 1)
                .unwrap();
        let files = loaded
            .issue_into(dir.path(), &Principal::Member(1), &["localhost".into()])
            .unwrap();
        crate::tls::load_server_config(&files).unwrap();
    }

    #[test]
    fn certificate_garbage_names_no_principal() {
        assert_eq!(principal_of_certificate(b""), None);
        assert_eq!(principal_of_certificate(&[0x30, 0x82, 0xff]), None);
    }
}
