//! Configuration of one coordinator member: identity, listener, data
//! directory, Raft timing, group commit and snapshot policy.
//!
//! A [`NodeConfig`] comes from an optional TOML file (every field optional,
//! unknown fields refused) overridden by command-line flags, and is checked by
//! [`NodeConfig::validate`] before anything starts. Durations are integer
//! milliseconds.
//!
//! ```toml
//! id = 1
//! listen = "0.0.0.0:7100"
//! data_dir = "/var/lib/leasehold"
//! heartbeat_ms = 100
//! proposal_timeout_ms = 2000
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for a [`NodeConfig`].
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's explanation.
        message: String,
    },
    /// A field has a value that cannot work.
    #[error("invalid config: {field} {problem}")]
    Invalid {
        /// The field's name as written in the file.
        field: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

fn invalid(field: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        problem: problem.into(),
    }
}

/// Everything one coordinator member needs to start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// This member's Raft node id (≥ 1, unique in the cluster).
    pub id: u64,
    /// `host:port` the gRPC listener binds (Coordinator, Admin, Raft, health).
    pub listen: String,
    /// Directory of the Raft log and state machine.
    pub data_dir: PathBuf,
    /// Leader heartbeat interval; also openraft's per-append RPC deadline.
    pub heartbeat_ms: u64,
    /// Lower bound of the randomised election timeout. A follower that
    /// loses its leader starts an election after `election_timeout_max_ms`
    /// (openraft's leader lease) plus a random timeout in
    /// `[election_timeout_min_ms, election_timeout_max_ms)`: that sum
    /// bounds failover time.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomised election timeout (also the leader lease).
    pub election_timeout_max_ms: u64,
    /// How long a write waits for its proposal to commit before `UNAVAILABLE`.
    pub proposal_timeout_ms: u64,
    /// How long a linearizable read waits for the leader to confirm itself.
    pub read_timeout_ms: u64,
    /// Deadline of membership changes and initialisation.
    pub admin_timeout_ms: u64,
    /// Most commands in one Raft entry (group commit).
    pub max_batch_commands: usize,
    /// Capacity of the queue in front of the batcher; a full queue answers
    /// `UNAVAILABLE` (back-pressure) instead of queueing without bound.
    pub batch_queue_capacity: usize,
    /// Most proposals replicating at once. One is fastest when every member
    /// fsyncs to the same kind of disk: the next batch simply grows while
    /// the current one commits (see docs/benchmarks.md).
    pub max_inflight_proposals: usize,
    /// Take a snapshot (and compact the log) after this many new entries.
    pub snapshot_every_entries: u64,
    /// Log entries kept behind a snapshot for slightly lagging followers.
    pub logs_kept_after_snapshot: u64,
    /// The leader proposes a clock tick this often when idle, so dead
    /// windows are collected (0 disables).
    pub tick_interval_ms: u64,
    /// Deadline of one snapshot chunk transfer.
    pub install_snapshot_timeout_ms: u64,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            id: 0,
            listen: String::new(),
            data_dir: PathBuf::new(),
            heartbeat_ms: 50,
            election_timeout_min_ms: 200,
            election_timeout_max_ms: 400,
            proposal_timeout_ms: 2_000,
            read_timeout_ms: 2_000,
            admin_timeout_ms: 10_000,
            max_batch_commands: 1_024,
            batch_queue_capacity: 16_384,
            max_inflight_proposals: 1,
            snapshot_every_entries: 10_000,
            logs_kept_after_snapshot: 1_000,
            tick_interval_ms: 5_000,
            install_snapshot_timeout_ms: 5_000,
        }
    }
}

impl NodeConfig {
    /// Reads a TOML file; fields it leaves out keep their defaults.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses TOML text; the error is the parser's message.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Checks every field; a config that passes can start a member.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id == 0 {
            return Err(invalid("id", "must be set to a node id of at least 1"));
        }
        leasehold_client::transport::normalize_addr(&self.listen)
            .map_err(|e| invalid("listen", format!("must be host:port ({e})")))?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must be set"));
        }
        positive("heartbeat_ms", self.heartbeat_ms)?;
        if self.election_timeout_min_ms <= self.heartbeat_ms {
            return Err(invalid(
                "election_timeout_min_ms",
                format!(
                    "({}) must be greater than heartbeat_ms ({})",
                    self.election_timeout_min_ms, self.heartbeat_ms
                ),
            ));
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            return Err(invalid(
                "election_timeout_max_ms",
                format!(
                    "({}) must be greater than election_timeout_min_ms ({})",
                    self.election_timeout_max_ms, self.election_timeout_min_ms
                ),
            ));
        }
        positive("proposal_timeout_ms", self.proposal_timeout_ms)?;
        positive("read_timeout_ms", self.read_timeout_ms)?;
        positive("admin_timeout_ms", self.admin_timeout_ms)?;
        positive(
            "install_snapshot_timeout_ms",
            self.install_snapshot_timeout_ms,
        )?;
        positive("max_batch_commands", self.max_batch_commands as u64)?;
        positive("max_inflight_proposals", self.max_inflight_proposals as u64)?;
        if self.batch_queue_capacity < self.max_batch_commands {
            return Err(invalid(
                "batch_queue_capacity",
                format!(
                    "({}) must be at least max_batch_commands ({})",
                    self.batch_queue_capacity, self.max_batch_commands
                ),
            ));
        }
        positive("snapshot_every_entries", self.snapshot_every_entries)?;
        Ok(())
    }

    /// The openraft configuration derived from this one.
    pub fn raft_config(&self) -> Result<Arc<openraft::Config>, ConfigError> {
        let config = openraft::Config {
            cluster_name: "leasehold".to_string(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_max_ms,
            install_snapshot_timeout: self.install_snapshot_timeout_ms,
            snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(self.snapshot_every_entries),
            max_in_snapshot_log_to_keep: self.logs_kept_after_snapshot,
            ..Default::default()
        };
        let config = config
            .validate()
            .map_err(|e| invalid("raft", e.to_string()))?;
        Ok(Arc::new(config))
    }

    /// [`proposal_timeout_ms`](Self::proposal_timeout_ms) as a duration.
    pub fn proposal_timeout(&self) -> Duration {
        Duration::from_millis(self.proposal_timeout_ms)
    }

    /// [`read_timeout_ms`](Self::read_timeout_ms) as a duration.
    pub fn read_timeout(&self) -> Duration {
        Duration::from_millis(self.read_timeout_ms)
    }

    /// [`admin_timeout_ms`](Self::admin_timeout_ms) as a duration.
    pub fn admin_timeout(&self) -> Duration {
        Duration::from_millis(self.admin_timeout_ms)
    }
}

fn positive(field: &'static str, value: u64) -> Result<(), ConfigError> {
    if value == 0 {
        return Err(invalid(field, "must be greater than 0"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> NodeConfig {
        NodeConfig {
            id: 1,
            listen: "127.0.0.1:7101".into(),
            data_dir: "/tmp/x".into(),
            ..NodeConfig::default()
        }
    }

    #[test]
    fn defaults_plus_identity_are_valid_and_convert_to_openraft() {
        valid().validate().unwrap();
        let raft = valid().raft_config().unwrap();
        assert_eq!(raft.heartbeat_interval, 50);
        assert_eq!(
            raft.snapshot_policy,
            openraft::SnapshotPolicy::LogsSinceLast(10_000)
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases: Vec<(NodeConfig, &str)> = vec![
            (NodeConfig { id: 0, ..valid() }, "id"),
            (
                NodeConfig {
                    listen: "nope".into(),
                    ..valid()
                },
                "listen",
            ),
            (
                NodeConfig {
                    data_dir: PathBuf::new(),
                    ..valid()
                },
                "data_dir",
            ),
            (
                NodeConfig {
                    heartbeat_ms: 0,
                    ..valid()
                },
                "heartbeat_ms",
            ),
            (
                NodeConfig {
                    election_timeout_min_ms: 50,
                    ..valid()
                },
                "election_timeout_min_ms",
            ),
            (
                NodeConfig {
                    election_timeout_max_ms: 200,
                    ..valid()
                },
                "election_timeout_max_ms",
            ),
            (
                NodeConfig {
                    proposal_timeout_ms: 0,
                    ..valid()
                },
                "proposal_timeout_ms",
            ),
            (
                NodeConfig {
                    max_batch_commands: 0,
                    ..valid()
                },
                "max_batch_commands",
            ),
            (
                NodeConfig {
                    batch_queue_capacity: 1,
                    ..valid()
                },
                "batch_queue_capacity",
            ),
            (
                NodeConfig {
                    snapshot_every_entries: 0,
                    ..valid()
                },
                "snapshot_every_entries",
            ),
        ];
        for (config, field) in cases {
            match config.validate() {
                Err(ConfigError::Invalid { field: named, .. }) => assert_eq!(named, field),
                other => panic!("expected {field} to be refused, got {other:?}"),
            }
        }
    }

    #[test]
    fn toml_fills_defaults_and_refuses_unknown_fields() {
        let config =
            NodeConfig::from_toml("id = 3\nlisten = \"n3:7100\"\ndata_dir = \"/data\"\n").unwrap();
        assert_eq!(config.id, 3);
        assert_eq!(
            config.proposal_timeout_ms,
            NodeConfig::default().proposal_timeout_ms
        );
        config.validate().unwrap();
        assert!(NodeConfig::from_toml("idd = 3")
            .unwrap_err()
            .contains("idd"));
    }
}
