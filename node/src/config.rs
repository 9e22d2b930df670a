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
//! tls_ca = "/etc/leasehold/ca.pem"
//! tls_cert = "/etc/leasehold/member.pem"
//! tls_key = "/etc/leasehold/member.key"
//! ```
//!
//! [`serve`](crate::coordinator::serve) needs either the three TLS files or
//! `insecure = true` ([`NodeConfig::security`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::coordinator::network;
use crate::net::{self, ServerLimits};

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

/// A member id as every command that names one takes it: at least 1 (0
/// is no member). `field` names the option in the error.
pub fn validate_member_id(field: &'static str, id: u64) -> Result<(), ConfigError> {
    if id == 0 {
        return Err(invalid(field, "must be set to a node id of at least 1"));
    }
    Ok(())
}

/// A member address as every command that names one takes it: HOST:PORT
/// (or http://HOST:PORT). `field` names the option in the error.
pub fn validate_member_addr(field: &'static str, addr: &str) -> Result<(), ConfigError> {
    leasehold_client::transport::normalize_addr(addr)
        .map(drop)
        .map_err(|e| invalid(field, format!("must be host:port ({e})")))
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
    /// Leader heartbeat interval; also openraft's per-append RPC deadline,
    /// so it must exceed the worst round trip between members plus a
    /// follower's fsync (the default, 100 ms, leaves room for a loaded
    /// 2-core host).
    pub heartbeat_ms: u64,
    /// Lower bound of the randomised election timeout. A follower that
    /// loses its leader starts an election after `election_timeout_max_ms`
    /// (openraft's leader lease) plus a random timeout in
    /// `[election_timeout_min_ms, election_timeout_max_ms)`: that sum
    /// bounds failover time. With the defaults (110–220 ms) a follower
    /// campaigns 330–440 ms after its last contact with the leader — three
    /// to four missed heartbeats — and failover takes about 0.43 s.
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
    /// Capacity, in commands, of the queue in front of the batcher (the
    /// items of a `LeaseBatch` count one each); a full queue answers
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
    /// Most log entries in one `AppendEntries` (openraft's
    /// `max_payload_entries`); with `max_batch_commands` it sizes the peer
    /// message limit (see `coordinator::network::peer_message_limit_bytes`).
    pub raft_max_payload_entries: u64,
    /// Bytes of one snapshot chunk (openraft's `snapshot_max_chunk_size`).
    pub snapshot_chunk_bytes: u64,
    /// Most connections open at once; beyond it new ones are closed at once
    /// (counter `connections_refused_at_capacity`).
    pub max_connections: usize,
    /// A connection that sends no byte within this long of its accept is
    /// closed (counter `connections_closed_idle_before_first_byte`).
    pub first_byte_timeout_ms: u64,
    /// HTTP/2 `SETTINGS_MAX_CONCURRENT_STREAMS` advertised per connection.
    pub max_concurrent_streams: u32,
    /// Longest a request may take, body included (at least every other
    /// timeout of this file, so it only cuts requests nothing else bounds).
    pub request_timeout_ms: u64,
    /// Largest request message of the public services (Coordinator, Admin);
    /// larger ones get `RESOURCE_EXHAUSTED` (counter `requests_refused_too_large`).
    pub max_request_bytes: usize,
    /// CA bundle (PEM) that clients' and peers' certificates must chain to.
    pub tls_ca: Option<PathBuf>,
    /// This member's certificate chain (PEM): a `member/<id>` SAN URI and
    /// the DNS/IP names it is dialled by. Also presented to peers.
    pub tls_cert: Option<PathBuf>,
    /// This member's private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Run plaintext without identities instead of mutual TLS.
    pub insecure: bool,
    /// `host:port` of the Prometheus `/metrics` listener (plain HTTP, its own
    /// port; none when unset). Bind it to a private interface.
    pub metrics_listen: Option<String>,
    /// The ids of the members of the cluster this member joins. While it
    /// has no membership yet it accepts Raft messages only from them (on
    /// TLS, none at all when unset); once the cluster's log reaches it, its
    /// membership decides. See the joining procedure in docs/security.md.
    pub join_members: Vec<u64>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            id: 0,
            listen: String::new(),
            data_dir: PathBuf::new(),
            heartbeat_ms: 100,
            election_timeout_min_ms: 110,
            election_timeout_max_ms: 220,
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
            raft_max_payload_entries: DEFAULT_RAFT_MAX_PAYLOAD_ENTRIES,
            snapshot_chunk_bytes: DEFAULT_SNAPSHOT_CHUNK_BYTES,
            max_connections: net::DEFAULT_MAX_CONNECTIONS,
            first_byte_timeout_ms: net::DEFAULT_FIRST_BYTE_TIMEOUT_MS,
            max_concurrent_streams: net::DEFAULT_MAX_CONCURRENT_STREAMS,
            request_timeout_ms: net::DEFAULT_REQUEST_TIMEOUT_MS,
            max_request_bytes: net::DEFAULT_MAX_REQUEST_BYTES,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            insecure: false,
            metrics_listen: None,
            join_members: Vec::new(),
        }
    }
}

/// Default of [`NodeConfig::raft_max_payload_entries`]: with 1 024 commands
/// per entry, an `AppendEntries` of at most 8 MiB.
pub const DEFAULT_RAFT_MAX_PAYLOAD_ENTRIES: u64 = 8;

/// Default of [`NodeConfig::snapshot_chunk_bytes`] (openraft's own default).
pub const DEFAULT_SNAPSHOT_CHUNK_BYTES: u64 = 3 * 1024 * 1024;

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
        validate_member_id("id", self.id)?;
        if self.join_members.contains(&0) {
            return Err(invalid("join_members", "member ids are at least 1"));
        }
        validate_member_addr("listen", &self.listen)?;
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
        positive("raft_max_payload_entries", self.raft_max_payload_entries)?;
        positive("snapshot_chunk_bytes", self.snapshot_chunk_bytes)?;
        let limit = self.peer_message_limit_bytes()?;
        if limit > network::MAX_PEER_MESSAGE_BYTES {
            return Err(invalid(
                "raft_max_payload_entries",
                format!(
                    "× max_batch_commands × {} bytes, or snapshot_chunk_bytes, makes peer messages of {limit} bytes, above the ceiling of {} bytes",
                    network::MAX_ENCODED_COMMAND_BYTES,
                    network::MAX_PEER_MESSAGE_BYTES
                ),
            ));
        }
        self.server_limits()
            .validate()
            .map_err(|e| invalid(e.field, e.problem))?;
        let longest_own_deadline = [
            self.proposal_timeout_ms,
            self.read_timeout_ms,
            self.admin_timeout_ms,
            self.install_snapshot_timeout_ms,
        ]
        .into_iter()
        .max()
        .unwrap_or(0);
        if self.request_timeout_ms < longest_own_deadline {
            return Err(invalid(
                "request_timeout_ms",
                format!(
                    "({}) must be at least the longest other timeout ({longest_own_deadline})",
                    self.request_timeout_ms
                ),
            ));
        }
        Ok(())
    }

    /// The largest peer (Raft) message this member sends or accepts, derived
    /// from `raft_max_payload_entries`, `max_batch_commands` and
    /// `snapshot_chunk_bytes`.
    pub fn peer_message_limit_bytes(&self) -> Result<usize, ConfigError> {
        network::peer_message_limit_bytes(
            self.raft_max_payload_entries,
            self.max_batch_commands,
            self.snapshot_chunk_bytes,
        )
        .ok_or_else(|| invalid("raft_max_payload_entries", "peer message size overflows"))
    }

    /// The listener and gRPC server limits of this member.
    pub fn server_limits(&self) -> ServerLimits {
        ServerLimits {
            max_connections: self.max_connections,
            first_byte_timeout_ms: self.first_byte_timeout_ms,
            max_concurrent_streams: self.max_concurrent_streams,
            request_timeout_ms: self.request_timeout_ms,
            max_request_bytes: self.max_request_bytes,
        }
    }

    /// How the member secures its connections: the three TLS files, or
    /// `insecure`; anything else is refused with the options to set.
    pub fn security(&self) -> Result<crate::tls::Security, ConfigError> {
        crate::tls::Security::choose(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.insecure,
        )
        .map_err(|e| invalid("tls", e.to_string()))
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
            max_payload_entries: self.raft_max_payload_entries,
            snapshot_max_chunk_size: self.snapshot_chunk_bytes,
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
        assert_eq!(raft.heartbeat_interval, 100);
        assert_eq!(raft.election_timeout_min, 110);
        assert_eq!(raft.election_timeout_max, 220);
        assert_eq!(
            raft.snapshot_policy,
            openraft::SnapshotPolicy::LogsSinceLast(10_000)
        );
        assert_eq!(raft.max_payload_entries, DEFAULT_RAFT_MAX_PAYLOAD_ENTRIES);
        assert_eq!(raft.snapshot_max_chunk_size, DEFAULT_SNAPSHOT_CHUNK_BYTES);
    }

    #[test]
    fn the_default_peer_message_limit_is_nine_mib_not_sixty_four() {
        let limit = valid().peer_message_limit_bytes().unwrap();
        assert_eq!(limit, 9 * 1024 * 1024);
        assert!(limit < network::MAX_PEER_MESSAGE_BYTES);
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
                    // Not greater than the minimum (110).
                    election_timeout_max_ms: 110,
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
            (
                NodeConfig {
                    raft_max_payload_entries: 1_000,
                    ..valid()
                },
                "raft_max_payload_entries",
            ),
            (
                NodeConfig {
                    max_connections: 0,
                    ..valid()
                },
                "max_connections",
            ),
            (
                NodeConfig {
                    first_byte_timeout_ms: 0,
                    ..valid()
                },
                "first_byte_timeout_ms",
            ),
            (
                NodeConfig {
                    max_concurrent_streams: 0,
                    ..valid()
                },
                "max_concurrent_streams",
            ),
            (
                NodeConfig {
                    request_timeout_ms: 1_000,
                    ..valid()
                },
                "request_timeout_ms",
            ),
            (
                NodeConfig {
                    max_request_bytes: 0,
                    ..valid()
                },
                "max_request_bytes",
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
    fn security_needs_all_three_files_or_insecure() {
        let error = valid().security().unwrap_err().to_string();
        assert!(
            error.contains("tls_ca") && error.contains("--insecure"),
            "{error}"
        );
        let insecure = NodeConfig {
            insecure: true,
            ..valid()
        };
        assert_eq!(insecure.security().unwrap(), crate::tls::Security::Insecure);
        let partial = NodeConfig {
            tls_ca: Some("/ca.pem".into()),
            ..valid()
        };
        let error = partial.security().unwrap_err().to_string();
        assert!(error.contains("tls_cert, tls_key"), "{error}");
        let both = NodeConfig {
            tls_ca: Some("/ca.pem".into()),
            tls_cert: Some("/c.pem".into()),
            tls_key: Some("/k.pem".into()),
            insecure: true,
            ..valid()
        };
        assert!(both.security().is_err());
        let tls = NodeConfig::from_toml(
            "tls_ca = \"/ca.pem\"\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n",
        )
        .unwrap();
        assert!(matches!(
            tls.security().unwrap(),
            crate::tls::Security::MutualTls(_)
        ));
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
