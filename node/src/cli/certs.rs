//! `leasehold certs mint`: a CA (new, or an existing one's certificate and
//! key) and one certificate per member, region, operator and service, as
//! PEM files for compose, Kubernetes or manual deployments.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use leasehold_core::ids::RegionId;

use super::error::CliError;
use crate::certs::{file_stem, mint, CertificateAuthority, MintPlan};

/// `leasehold certs …`.
#[derive(Debug, Clone, Args)]
pub struct CertsArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: CertsCommand,
}

/// The `certs` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum CertsCommand {
    /// Write ca.pem, and a certificate and key for every identity named.
    Mint(MintArgs),
}

/// Options of `leasehold certs mint`.
#[derive(Debug, Clone, Args)]
pub struct MintArgs {
    /// Directory to write into (created if missing; certificates are
    /// replaced, a CA never: a CA already there issues, see --ca-cert).
    #[arg(long)]
    pub out: PathBuf,
    /// Member ids (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub members: Vec<u64>,
    /// Regions whose escrow nodes get a certificate.
    #[arg(long, value_delimiter = ',')]
    pub regions: Vec<String>,
    /// Operator names.
    #[arg(long, value_delimiter = ',')]
    pub operators: Vec<String>,
    /// Services as NAME@REGION.
    #[arg(long, value_delimiter = ',')]
    pub services: Vec<String>,
    /// DNS names members and escrow nodes are dialled by.
    #[arg(long, value_delimiter = ',')]
    pub dns: Vec<String>,
    /// IP addresses members and escrow nodes are dialled by.
    #[arg(long, value_delimiter = ',')]
    pub ip: Vec<std::net::IpAddr>,
    /// Issue with this existing CA certificate (with --ca-key) instead of a
    /// new CA. Without it, the CA already in --out (ca.pem and ca.key)
    /// issues; a new CA is made only where --out holds none.
    #[arg(long, requires = "ca_key")]
    pub ca_cert: Option<PathBuf>,
    /// The existing CA's private key.
    #[arg(long, requires = "ca_cert")]
    pub ca_key: Option<PathBuf>,
    /// Days the certificates (and a new CA) are valid.
    #[arg(long, default_value_t = 365)]
    pub days: u32,
    /// Do nothing when the output directory already holds a ca.pem (for
    /// one-shot jobs that run on every start).
    #[arg(long)]
    pub if_absent: bool,
}

impl MintArgs {
    /// The identities to issue.
    pub fn plan(&self) -> Result<MintPlan, CliError> {
        let region = |name: &str| {
            RegionId::new(name).map_err(|e| CliError::Usage(format!("region {name:?}: {e}")))
        };
        let services = self
            .services
            .iter()
            .map(|service| {
                let (name, region_name) = service.split_once('@').ok_or_else(|| {
                    CliError::Usage(format!("service {service:?} is not NAME@REGION"))
                })?;
                Ok((name.to_string(), region(region_name)?))
            })
            .collect::<Result<Vec<_>, CliError>>()?;
        let mut server_names = self.dns.clone();
        server_names.extend(self.ip.iter().map(ToString::to_string));
        if server_names.is_empty() && !(self.members.is_empty() && self.regions.is_empty()) {
            return Err(CliError::Usage(
                "member and escrow node certificates must name the hosts they are dialled by: \
                 pass --dns NAME,… and/or --ip ADDRESS,… (a server certificate naming no host \
                 is refused by every client)"
                    .into(),
            ));
        }
        let plan = MintPlan {
            members: self.members.clone(),
            regions: self
                .regions
                .iter()
                .map(|r| region(r))
                .collect::<Result<_, _>>()?,
            operators: self.operators.clone(),
            services,
            server_names,
        };
        for principal in plan.principals() {
            let uri = principal.to_uri().unwrap_or_default();
            leasehold_core::principal::Principal::parse_uri(&uri)
                .map_err(|e| CliError::Usage(e.to_string()))?;
        }
        Ok(plan)
    }
}

/// Runs `leasehold certs …`.
pub fn run(args: CertsArgs) -> Result<(), CliError> {
    match args.command {
        CertsCommand::Mint(args) => mint_files(&args),
    }
}

fn mint_files(args: &MintArgs) -> Result<(), CliError> {
    let plan = args.plan()?;
    if args.if_absent && args.out.join("ca.pem").exists() {
        println!(
            "{} exists: nothing minted",
            args.out.join("ca.pem").display()
        );
        return Ok(());
    }
    let failed = |e: crate::certs::CertError| CliError::Failed(e.to_string());
    let (here_cert, here_key) = (args.out.join("ca.pem"), args.out.join("ca.key"));
    let ca = match (&args.ca_cert, &args.ca_key) {
        (Some(cert), Some(key)) => {
            CertificateAuthority::load(cert, key, args.days).map_err(failed)?
        }
        // Minting into a folder that holds a CA issues with it: a new CA
        // would leave every certificate it issued chained to a deleted key.
        _ if here_cert.exists() && here_key.exists() => {
            println!(
                "issuing with the CA already in {} (ca.pem, ca.key)",
                args.out.display()
            );
            CertificateAuthority::load(&here_cert, &here_key, args.days).map_err(failed)?
        }
        _ if here_cert.exists() => {
            return Err(CliError::Conflict(format!(
                "{} holds a CA certificate but not its key: pass the CA as --ca-cert and \
                 --ca-key, or mint into another --out (a new CA here would replace the one \
                 every identity chains to)",
                args.out.display()
            )));
        }
        _ => {
            // A name of its own: two clusters' CAs are told apart by name,
            // in a certificate dump and in a verifier's error.
            let name = format!("Leasehold CA {:08x}", rand::random::<u32>());
            let ca = CertificateAuthority::generate(&name, args.days).map_err(failed)?;
            ca.write(&args.out, true).map_err(failed)?;
            println!(
                "new CA {name:?}: {} (keep {} offline: it signs every identity)",
                args.out.join("ca.pem").display(),
                args.out.join("ca.key").display()
            );
            ca
        }
    };
    for (principal, files) in mint(&ca, &args.out, &plan).map_err(failed)? {
        println!(
            "{:<28} {} {}",
            principal.to_string(),
            files.cert.display(),
            files.key.display()
        );
        debug_assert_eq!(
            files.cert.file_stem().and_then(|s| s.to_str()),
            Some(file_stem(&principal).as_str())
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::{load_server_config, principal_of_certificate};
    use leasehold_core::principal::Principal;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    fn args(out: PathBuf) -> MintArgs {
        MintArgs {
            out,
            members: vec![1, 2],
            regions: vec!["eu".into()],
            operators: vec!["admin".into()],
            services: vec!["checkout@eu".into()],
            dns: vec!["localhost".into()],
            ip: vec!["127.0.0.1".parse().unwrap()],
            ca_cert: None,
            ca_key: None,
            days: 30,
            if_absent: false,
        }
    }

    #[test]
    fn mint_writes_a_ca_and_one_usable_certificate_per_identity() {
        let dir = tempfile::tempdir().unwrap();
        mint_files(&args(dir.path().to_path_buf())).unwrap();
        for (stem, principal) in [
            ("member-2", Principal::Member(2)),
            ("operator-admin", Principal::Operator("admin".into())),
            ("region-eu", Principal::Region(RegionId::new("eu").unwrap())),
        ] {
            let pem = std::fs::read(dir.path().join(format!("{stem}.pem"))).unwrap();
            let der = CertificateDer::from_pem_slice(&pem).unwrap();
            assert_eq!(principal_of_certificate(&der), Some(principal));
        }
        let service = crate::certs::files_for(
            dir.path(),
            &Principal::Service {
                name: "checkout".into(),
                region: RegionId::new("eu").unwrap(),
            },
        );
        load_server_config(&service).unwrap();
        assert!(dir.path().join("ca.key").exists());

        let ca_before = std::fs::read(dir.path().join("ca.pem")).unwrap();
        mint_files(&MintArgs {
            if_absent: true,
            ..args(dir.path().to_path_buf())
        })
        .unwrap();
        assert_eq!(std::fs::read(dir.path().join("ca.pem")).unwrap(), ca_before);
    }

    #[test]
    fn minting_again_into_a_folder_issues_with_its_ca_and_never_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        mint_files(&args(dir.path().to_path_buf())).unwrap();
        let ca_files = |dir: &std::path::Path| {
            (
                std::fs::read(dir.join("ca.pem")).unwrap(),
                std::fs::read(dir.join("ca.key")).unwrap(),
            )
        };
        let before = ca_files(dir.path());
        mint_files(&MintArgs {
            members: vec![4, 5, 6],
            ..args(dir.path().to_path_buf())
        })
        .unwrap();
        assert_eq!(ca_files(dir.path()), before, "the CA was replaced");
        // Member 5's certificate chains to the CA member 1's does.
        let ca = crate::tls::TlsFiles {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("member-5.pem"),
            key: dir.path().join("member-5.key"),
        };
        load_server_config(&ca).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            {
                let mut roots = rustls::RootCertStore::empty();
                let pem = std::fs::read(dir.path().join("ca.pem")).unwrap();
                roots
                    .add(CertificateDer::from_pem_slice(&pem).unwrap())
                    .unwrap();
                std::sync::Arc::new(roots)
            },
            std::sync::Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let pem = std::fs::read(dir.path().join("member-5.pem")).unwrap();
        let member_5 = CertificateDer::from_pem_slice(&pem).unwrap();
        verifier
            .verify_client_cert(&member_5, &[], rustls_pki_types::UnixTime::now())
            .expect("member 5 chains to the folder's CA");

        // A CA certificate without its key: refused, nothing written.
        std::fs::remove_file(dir.path().join("ca.key")).unwrap();
        let refused = mint_files(&MintArgs {
            members: vec![7],
            ..args(dir.path().to_path_buf())
        });
        assert!(matches!(refused, Err(CliError::Conflict(_))), "{refused:?}");
        assert!(!dir.path().join("member-7.pem").exists());
        assert_eq!(std::fs::read(dir.path().join("ca.pem")).unwrap(), before.0);
    }

    #[test]
    fn each_new_ca_has_a_name_of_its_own() {
        let subject = |dir: &std::path::Path| {
            let pem = std::fs::read(dir.join("ca.pem")).unwrap();
            let der = CertificateDer::from_pem_slice(&pem).unwrap();
            let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
            cert.subject().to_string()
        };
        let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        mint_files(&args(one.path().to_path_buf())).unwrap();
        mint_files(&args(two.path().to_path_buf())).unwrap();
        let (one, two) = (subject(one.path()), subject(two.path()));
        assert!(one.starts_with("CN=Leasehold CA "), "{one}");
        assert_ne!(one, two);
    }

    #[test]
    fn server_certificates_must_name_a_host() {
        let dir = tempfile::tempdir().unwrap();
        for (members, regions) in [(vec![4], vec![]), (vec![], vec!["eu".to_string()])] {
            let nameless = MintArgs {
                members,
                regions,
                dns: vec![],
                ip: vec![],
                ..args(dir.path().to_path_buf())
            };
            assert!(matches!(nameless.plan(), Err(CliError::Usage(m)) if m.contains("--dns")));
        }
        // Operators and services are clients only: no host to name.
        let clients = MintArgs {
            members: vec![],
            regions: vec![],
            dns: vec![],
            ip: vec![],
            ..args(dir.path().to_path_buf())
        };
        clients.plan().unwrap();
    }

    #[test]
    fn malformed_identities_are_usage_errors() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = args(dir.path().to_path_buf());
        bad.services = vec!["checkout".into()];
        assert!(matches!(bad.plan(), Err(CliError::Usage(_))));
        let mut bad = args(dir.path().to_path_buf());
        bad.operators = vec!["has/slash".into()];
        assert!(matches!(bad.plan(), Err(CliError::Usage(_))));
    }
}
