//! `leasehold serve`: run one coordinator member until Ctrl-C / SIGTERM.
//! Flags override the config file; the result is validated before start.

use std::path::PathBuf;

use clap::Args;

use super::args::ServerTlsArgs;
use super::error::CliError;
use super::signal::shutdown_signal;
use crate::config::NodeConfig;

/// Options of `leasehold serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// This member's node id (≥ 1).
    #[arg(long)]
    pub id: Option<u64>,
    /// Derive the id from the host name's trailing ordinal plus one
    /// (`leasehold-0` → 1), as in a Kubernetes StatefulSet.
    #[arg(long, conflicts_with = "id")]
    pub id_from_hostname: bool,
    /// HOST:PORT to listen on.
    #[arg(long)]
    pub listen: Option<String>,
    /// Directory of the Raft log and state machine.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// TOML config file; flags given here override its values.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// HOST:PORT of the Prometheus `/metrics` listener (plain HTTP; bind a
    /// private interface). Off when unset.
    #[arg(long, env = "LEASEHOLD_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// The ids of the cluster's current members when this member joins an
    /// existing cluster, or of all founding members (comma-separated):
    /// until the cluster's log reaches it, it accepts Raft messages only
    /// from them.
    #[arg(long, value_delimiter = ',', env = "LEASEHOLD_JOIN_MEMBERS")]
    pub join_members: Vec<u64>,
    /// Mutual TLS material, or --insecure. `{id}` in a path stands for this
    /// member's id (`--tls-cert /certs/member-{id}.pem`).
    #[command(flatten)]
    pub tls: ServerTlsArgs,
}

impl ServeArgs {
    /// The effective configuration: file (or defaults), then flags, validated.
    pub fn resolve(&self) -> Result<NodeConfig, CliError> {
        let mut config = match &self.config {
            Some(path) => NodeConfig::from_file(path)?,
            None => NodeConfig::default(),
        };
        if let Some(id) = self.id {
            config.id = id;
        }
        if self.id_from_hostname {
            let hostname =
                hostname().ok_or_else(|| CliError::Usage("cannot read the host name".into()))?;
            config.id = id_from_hostname(&hostname).ok_or_else(|| {
                CliError::Usage(format!("host name {hostname:?} does not end in -<ordinal>"))
            })?;
        }
        if let Some(listen) = &self.listen {
            config.listen = listen.clone();
        }
        if let Some(addr) = &self.metrics_listen {
            config.metrics_listen = Some(addr.clone());
        }
        if let Some(data_dir) = &self.data_dir {
            config.data_dir = data_dir.clone();
        }
        if !self.join_members.is_empty() {
            config.join_members = self.join_members.clone();
        }
        if let Some(path) = &self.tls.tls_ca {
            config.tls_ca = Some(path.clone());
        }
        if let Some(path) = &self.tls.tls_cert {
            config.tls_cert = Some(path.clone());
        }
        if let Some(path) = &self.tls.tls_key {
            config.tls_key = Some(path.clone());
        }
        config.insecure |= self.tls.insecure;
        for path in [
            &mut config.tls_ca,
            &mut config.tls_cert,
            &mut config.tls_key,
        ]
        .into_iter()
        .flatten()
        {
            *path = with_member_id(path, config.id);
        }
        config.validate()?;
        config.security()?;
        Ok(config)
    }
}

fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
}

/// `path` with every `{id}` replaced by member id `id`: one setting names
/// each member's own file (`/certs/member-{id}.pem`), as in a StatefulSet
/// whose pods share their arguments.
pub fn with_member_id(path: &std::path::Path, id: u64) -> PathBuf {
    match path.to_str() {
        Some(text) if text.contains("{id}") => PathBuf::from(text.replace("{id}", &id.to_string())),
        _ => path.to_path_buf(),
    }
}

/// `name-<n>` → `n + 1`.
pub fn id_from_hostname(hostname: &str) -> Option<u64> {
    let (_, ordinal) = hostname.rsplit_once('-')?;
    ordinal.parse::<u64>().ok()?.checked_add(1)
}

/// Runs `leasehold serve`.
pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    let config = args.resolve()?;
    tracing::info!(id = config.id, listen = %config.listen, data_dir = %config.data_dir.display(), "starting");
    crate::coordinator::serve(config, shutdown_signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> ServeArgs {
        ServeArgs {
            id: None,
            id_from_hostname: false,
            listen: None,
            data_dir: None,
            config: None,
            metrics_listen: None,
            join_members: Vec::new(),
            tls: ServerTlsArgs {
                insecure: true,
                ..ServerTlsArgs::default()
            },
        }
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("node.toml");
        std::fs::write(
            &file,
            "id = 1\nlisten = \"0.0.0.0:7100\"\ndata_dir = \"/data\"\nproposal_timeout_ms = 500\n",
        )
        .unwrap();
        let config = ServeArgs {
            id: Some(4),
            config: Some(file),
            ..args()
        }
        .resolve()
        .unwrap();
        assert_eq!(config.id, 4);
        assert_eq!(config.listen, "0.0.0.0:7100");
        assert_eq!(config.proposal_timeout_ms, 500);
    }

    #[test]
    fn missing_identity_is_a_clear_error() {
        let error = ServeArgs {
            listen: Some("127.0.0.1:1".into()),
            data_dir: Some("/tmp/x".into()),
            ..args()
        }
        .resolve()
        .unwrap_err();
        assert!(error.to_string().contains("id"), "{error}");
    }

    #[test]
    fn neither_tls_nor_insecure_is_refused_naming_both() {
        let error = ServeArgs {
            id: Some(1),
            listen: Some("127.0.0.1:1".into()),
            data_dir: Some("/tmp/x".into()),
            tls: ServerTlsArgs::default(),
            ..args()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("--tls-ca") && error.contains("--insecure"),
            "{error}"
        );
    }

    #[test]
    fn tls_paths_name_the_members_own_files() {
        let config = ServeArgs {
            id: Some(3),
            listen: Some("127.0.0.1:1".into()),
            data_dir: Some("/tmp/x".into()),
            tls: ServerTlsArgs {
                tls_ca: Some("/certs/ca.pem".into()),
                tls_cert: Some("/certs/member-{id}.pem".into()),
                tls_key: Some("/certs/member-{id}.key".into()),
                insecure: false,
            },
            ..args()
        }
        .resolve()
        .unwrap();
        assert_eq!(config.tls_cert, Some("/certs/member-3.pem".into()));
        assert_eq!(config.tls_key, Some("/certs/member-3.key".into()));
        assert_eq!(config.tls_ca, Some("/certs/ca.pem".into()));
    }

    #[test]
    fn ordinals_become_ids() {
        assert_eq!(id_from_hostname("leasehold-0"), Some(1));
        assert_eq!(id_from_hostname("a-b-12"), Some(13));
        assert_eq!(id_from_hostname("leasehold"), None);
        assert_eq!(id_from_hostname("leasehold-x"), None);
    }
}
