//! The escrow node's config file (`leasehold escrow --config FILE`): the
//! same settings as its flags, in TOML, so a deployment can keep them in a
//! file and check it with `leasehold config check`.
//!
//! ```toml
//! region = "eu"
//! listen = "0.0.0.0:7200"
//! coordinators = ["n1:7100", "n2:7100", "n3:7100"]
//! batch = 16
//! sizer = "fixed"            # fixed | eoq | predictive
//! tls_ca = "/etc/leasehold/certs/ca.pem"
//! tls_cert = "/etc/leasehold/certs/region-eu.pem"
//! tls_key = "/etc/leasehold/certs/region-eu.key"
//!
//! [fair_throttle]            # optional: FAIR in front of these prefixes
//! prefixes = ["api/"]
//!
//! [ratelimit]                # optional: Envoy's rate limit service (RLS v3)
//! configs = ["/etc/leasehold/ratelimit/edge.yaml"]
//! response_headers = true    # the draft x-ratelimit-* headers
//! reload_interval_ms = 5000  # read the files again (0: never)
//! ```
//!
//! Unknown keys are refused. [`EscrowFile::problems`] lists every problem
//! with its field and what to do; [`EscrowFile::to_config`] builds the
//! node's [`EscrowConfig`] from a file without problems. The TLS flags and
//! their environment variables, when given, replace the file's TLS
//! settings (so a unit can keep the certificate paths in its environment).

use std::path::{Path, PathBuf};

use leasehold_core::fair_throttle::FairThrottleConfig;
use leasehold_core::ids::RegionId;
use leasehold_core::predictive_sizer::SizerKind;
use serde::{Deserialize, Serialize};

use super::config::EscrowConfig;
use super::fair_throttle::{FairThrottleRule, DEFAULT_FAIR_RETRY_AFTER_MS};
use crate::error::NodeError;
use crate::tls::Security;
use crate::toml_file::{self, FieldPath, Problem, TomlFileError};

/// Where an escrow node listens when the file does not say.
pub const DEFAULT_ESCROW_LISTEN: &str = "127.0.0.1:7201";

/// An escrow node's config file. Every field is optional in the syntax;
/// `region` and `coordinators` are required by [`problems`](Self::problems).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EscrowFile {
    /// The region this node serves (1..=64 bytes).
    pub region: Option<String>,
    /// `host:port` to listen on (default `127.0.0.1:7201`).
    pub listen: Option<String>,
    /// Coordinator members as `host:port`.
    pub coordinators: Option<Vec<String>>,
    /// Tokens per coordinator lease, ≥ 1 (default 16).
    pub batch: Option<u64>,
    /// `fixed`, `eoq` or `predictive` (default `fixed`).
    pub sizer: Option<String>,
    /// Most keys tracked at once, ≥ 1.
    pub max_keys: Option<usize>,
    /// Of those, most first requested by one caller identity, ≥ 1 (default
    /// 25000).
    pub max_keys_per_identity: Option<usize>,
    /// Probe interval while the coordinator is unreachable, ms, ≥ 1.
    pub probe_interval_ms: Option<u64>,
    /// Deadline of one coordinator call, retries included, ms, 1..=600000
    /// (default 1000).
    pub coordinator_timeout_ms: Option<u64>,
    /// A key idle this long hands its credits back, ms, ≥ 1.
    pub idle_evict_ms: Option<u64>,
    /// A `fair` key idle this long hands its unspent pool grant back, ms
    /// (0: off; default 1000).
    pub pool_release_idle_ms: Option<u64>,
    /// At shutdown, most time spent handing credits back, ms (default 5000).
    pub shutdown_drain_ms: Option<u64>,
    /// Most credit holders per key, ≥ 1.
    pub max_holders_per_key: Option<usize>,
    /// Most credit holders of one caller identity per key, ≥ 1 (default
    /// 1024).
    pub max_holders_per_identity: Option<usize>,
    /// Largest tenant weight an Acquire or Check may declare, ≥ 1 (default
    /// 1000).
    pub max_tenant_weight: Option<u64>,
    /// CA bundle (PEM) callers' certificates chain to.
    pub tls_ca: Option<PathBuf>,
    /// The region's certificate (PEM).
    pub tls_cert: Option<PathBuf>,
    /// Its private key (PEM).
    pub tls_key: Option<PathBuf>,
    /// Plaintext without identities instead of mutual TLS.
    pub insecure: Option<bool>,
    /// A fair throttle (FAIR) in front of key prefixes.
    pub fair_throttle: Option<FairThrottleFile>,
    /// Envoy's rate limit service, with these ratelimit files.
    pub ratelimit: Option<RatelimitFile>,
}

/// The `[ratelimit]` table: Envoy's rate limit service (RLS v3) on the
/// node's listener.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RatelimitFile {
    /// `envoyproxy/ratelimit` configuration files, one domain each.
    pub configs: Vec<PathBuf>,
    /// Add the draft RateLimit headers to answers (default false).
    pub response_headers: Option<bool>,
    /// Read the files again this often, ms (0: never; default 5000).
    pub reload_interval_ms: Option<u64>,
}

/// The `[fair_throttle]` table: which prefixes, and the throttle's
/// parameters (each optional, the core defaults otherwise).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FairThrottleFile {
    /// Key prefixes fronted (non-empty, distinct).
    pub prefixes: Vec<String>,
    /// Levels, 1..=32.
    pub levels: Option<u32>,
    /// Buckets per level.
    pub buckets: Option<u32>,
    /// What an exhaustion adds to each cell, in (0, 1].
    pub increment: Option<f64>,
    /// What a success takes off each cell, in (0, 1].
    pub decrement: Option<f64>,
    /// Decay rate per second, ≥ 0.
    pub decay_per_sec: Option<f64>,
    /// Live/shadow rotation interval, ms.
    pub rotation_ms: Option<u64>,
    /// Retry hint of a throttled request, ms, ≥ 1.
    pub retry_after_ms: Option<u64>,
    /// Idle capacity: unleased credits above which throttled requests pass.
    pub idle_reserve: Option<u64>,
}

impl EscrowFile {
    /// Reads and parses a file (syntax and unknown keys; see
    /// [`problems`](Self::problems) for the values).
    pub fn load(path: &Path) -> Result<Self, TomlFileError> {
        toml_file::load(path)
    }

    /// Every problem of the values, each with its field and what to do.
    pub fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let mut error = |key: &str, problem: String, fix: &str| {
            problems.push(Problem::error(FieldPath::top(key), problem, fix));
        };
        match &self.region {
            None => error("region", "is required".into(), "set region = \"<name>\""),
            Some(region) => {
                if let Err(e) = RegionId::new(region.as_str()) {
                    error(
                        "region",
                        e.to_string(),
                        "use a region name of 1 to 64 bytes",
                    );
                }
            }
        }
        if let Err(e) = leasehold_client::transport::normalize_addr(self.listen()) {
            error(
                "listen",
                e.to_string(),
                "write host:port, e.g. \"0.0.0.0:7200\"",
            );
        }
        match &self.coordinators {
            None => error(
                "coordinators",
                "is required".into(),
                "list every coordinator member: coordinators = [\"n1:7100\", \"n2:7100\"]",
            ),
            Some(list) if list.is_empty() => error(
                "coordinators",
                "is empty".into(),
                "list every coordinator member as host:port",
            ),
            Some(list) => {
                for addr in list {
                    if let Err(e) = leasehold_client::transport::normalize_addr(addr) {
                        error(
                            "coordinators",
                            e.to_string(),
                            "write each member as host:port",
                        );
                    }
                }
            }
        }
        let at_least_one = [
            ("batch", self.batch.map(|v| v as u128)),
            ("max_keys", self.max_keys.map(|v| v as u128)),
            (
                "max_keys_per_identity",
                self.max_keys_per_identity.map(|v| v as u128),
            ),
            ("probe_interval_ms", self.probe_interval_ms.map(u128::from)),
            (
                "coordinator_timeout_ms",
                self.coordinator_timeout_ms.map(u128::from),
            ),
            ("idle_evict_ms", self.idle_evict_ms.map(u128::from)),
            (
                "max_holders_per_key",
                self.max_holders_per_key.map(|v| v as u128),
            ),
            (
                "max_holders_per_identity",
                self.max_holders_per_identity.map(|v| v as u128),
            ),
            ("max_tenant_weight", self.max_tenant_weight.map(u128::from)),
        ];
        for (key, value) in at_least_one {
            if value == Some(0) {
                error(
                    key,
                    "must be at least 1".into(),
                    "set it to 1 or more, or remove it to use the default",
                );
            }
        }
        if let Some(sizer) = &self.sizer {
            if let Err(e) = sizer.parse::<SizerKind>() {
                error(
                    "sizer",
                    e.to_string(),
                    "use \"fixed\", \"eoq\" or \"predictive\"",
                );
            }
        }
        if let Err(e) = self.security_choice() {
            error(
                "tls_ca",
                e.to_string(),
                "set all three of tls_ca, tls_cert and tls_key, or insecure = true \
                 (or give the TLS flags when starting)",
            );
        }
        if self
            .ratelimit
            .as_ref()
            .is_some_and(|r| r.configs.is_empty())
        {
            error(
                "ratelimit",
                "names no configuration file".into(),
                "list the ratelimit files: configs = [\"/etc/leasehold/ratelimit/edge.yaml\"], \
                 or remove the table",
            );
        }
        if let Some(ratelimit) = &self.ratelimit {
            problems.extend(ratelimit.problems());
        }
        if let Some(fair) = &self.fair_throttle {
            problems.extend(fair.problems());
        }
        problems
    }

    fn listen(&self) -> &str {
        self.listen.as_deref().unwrap_or(DEFAULT_ESCROW_LISTEN)
    }

    /// Whether the file says anything about TLS.
    pub fn names_security(&self) -> bool {
        self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_key.is_some()
            || self.insecure.is_some()
    }

    /// The file's TLS choice (an error when it names none or half of one).
    pub fn security_choice(&self) -> Result<Security, crate::tls::SecurityChoiceError> {
        Security::choose(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
            self.insecure.unwrap_or(false),
        )
    }

    /// The node's configuration; `security` replaces the file's TLS
    /// settings when given. Refused with the first problem, if any.
    pub fn to_config(&self, security: Option<Security>) -> Result<EscrowConfig, NodeError> {
        let ignore_tls = security.is_some();
        let first = self
            .problems()
            .into_iter()
            .find(|p| !(ignore_tls && p.field.key == "tls_ca"));
        if let Some(problem) = first {
            return Err(NodeError::Invalid(format!(
                "escrow config {}: {} ({})",
                problem.field, problem.problem, problem.fix
            )));
        }
        let region = RegionId::new(self.region.clone().unwrap_or_default())
            .map_err(|e| NodeError::Invalid(format!("escrow config region: {e}")))?;
        let mut config = EscrowConfig::new(
            region,
            self.listen().to_string(),
            self.coordinators.clone().unwrap_or_default(),
        );
        config.batch = self.batch.unwrap_or(config.batch);
        if let Some(sizer) = &self.sizer {
            config.sizer = sizer
                .parse()
                .map_err(|e| NodeError::Invalid(format!("escrow config sizer: {e}")))?;
        }
        config.max_keys = self.max_keys.unwrap_or(config.max_keys);
        config.max_keys_per_identity = self
            .max_keys_per_identity
            .unwrap_or(config.max_keys_per_identity);
        config.probe_interval_ms = self.probe_interval_ms.unwrap_or(config.probe_interval_ms);
        config.coordinator_timeout_ms = self
            .coordinator_timeout_ms
            .unwrap_or(config.coordinator_timeout_ms);
        config.idle_evict_ms = self.idle_evict_ms.unwrap_or(config.idle_evict_ms);
        config.pool_release_idle_ms = self
            .pool_release_idle_ms
            .unwrap_or(config.pool_release_idle_ms);
        config.shutdown_drain_ms = self.shutdown_drain_ms.unwrap_or(config.shutdown_drain_ms);
        config.holder_limits.max_holders = self
            .max_holders_per_key
            .unwrap_or(config.holder_limits.max_holders);
        config.holder_limits.max_holders_per_principal = self
            .max_holders_per_identity
            .unwrap_or(config.holder_limits.max_holders_per_principal);
        config.max_tenant_weight = self.max_tenant_weight.unwrap_or(config.max_tenant_weight);
        config.security = match security {
            Some(security) => Some(security),
            None => Some(
                self.security_choice()
                    .map_err(|e| NodeError::Invalid(format!("escrow config: {e}")))?,
            ),
        };
        if let Some(fair) = &self.fair_throttle {
            config.fair_throttle = fair.rules();
        }
        if let Some(ratelimit) = &self.ratelimit {
            let mut rls = super::rls::RlsConfig::load(
                &ratelimit.configs,
                ratelimit.response_headers.unwrap_or(false),
            )?;
            rls.reload_interval_ms = ratelimit
                .reload_interval_ms
                .unwrap_or(super::rls::DEFAULT_RELOAD_INTERVAL_MS);
            config.rls = Some(rls);
        }
        config.validate()?;
        Ok(config)
    }
}

impl RatelimitFile {
    /// Every problem of the files it names (read now), at their lines, and
    /// a domain named by two of them.
    fn problems(&self) -> Vec<Problem> {
        match super::rls::read_domains(&self.configs) {
            Ok(_) => Vec::new(),
            Err(problems) => problems
                .into_iter()
                .map(|problem| {
                    Problem::error(
                        FieldPath::in_table("ratelimit", "configs"),
                        problem,
                        "fix the file: `leasehold config check FILE` lists its problems",
                    )
                })
                .collect(),
        }
    }
}

impl FairThrottleFile {
    fn throttle_config(&self) -> FairThrottleConfig {
        let defaults = FairThrottleConfig::default();
        FairThrottleConfig {
            levels: self.levels.unwrap_or(defaults.levels),
            buckets: self.buckets.unwrap_or(defaults.buckets),
            increment: self.increment.unwrap_or(defaults.increment),
            decrement: self.decrement.unwrap_or(defaults.decrement),
            decay_per_sec: self.decay_per_sec.unwrap_or(defaults.decay_per_sec),
            rotation_interval_ms: self.rotation_ms.unwrap_or(defaults.rotation_interval_ms),
            ..defaults
        }
    }

    /// One rule per prefix.
    pub fn rules(&self) -> Vec<FairThrottleRule> {
        let config = self.throttle_config();
        self.prefixes
            .iter()
            .map(|prefix| FairThrottleRule {
                prefix: prefix.clone(),
                config,
                idle_reserve: self.idle_reserve,
                retry_after_ms: self.retry_after_ms.unwrap_or(DEFAULT_FAIR_RETRY_AFTER_MS),
            })
            .collect()
    }

    fn problems(&self) -> Vec<Problem> {
        let mut problems = Vec::new();
        let field = |key: &str| FieldPath::in_table("fair_throttle", key);
        if self.prefixes.is_empty() {
            problems.push(Problem::error(
                field("prefixes"),
                "names no prefix",
                "list the key prefixes to front, e.g. prefixes = [\"api/\"], or remove the table",
            ));
        }
        for (i, prefix) in self.prefixes.iter().enumerate() {
            if prefix.is_empty() {
                problems.push(Problem::error(
                    field("prefixes"),
                    "an empty prefix",
                    "give each prefix at least one byte",
                ));
            } else if self.prefixes[..i].contains(prefix) {
                problems.push(Problem::error(
                    field("prefixes"),
                    format!("{prefix:?} is listed twice"),
                    "list each prefix once",
                ));
            }
        }
        if self.retry_after_ms == Some(0) {
            problems.push(Problem::error(
                field("retry_after_ms"),
                "must be at least 1",
                "set it to 1 or more",
            ));
        }
        if let Err(e) = self.throttle_config().validate() {
            problems.push(Problem::error(
                field(""),
                e.to_string(),
                "see the --fair-* flags of `leasehold escrow --help` for each parameter's range",
            ));
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_complete_file_builds_the_config_and_flags_replace_its_tls() {
        let file: EscrowFile = toml::from_str(
            "region = \"eu\"\nlisten = \"0.0.0.0:7200\"\ncoordinators = [\"n1:7100\"]\n\
             batch = 8\nsizer = \"eoq\"\nmax_tenant_weight = 50\ninsecure = true\n\
             [fair_throttle]\nprefixes = [\"api/\"]\nlevels = 4\n",
        )
        .unwrap();
        assert!(file.problems().is_empty(), "{:?}", file.problems());
        let config = file.to_config(None).unwrap();
        assert_eq!(config.region.as_str(), "eu");
        assert_eq!(config.batch, 8);
        assert_eq!(config.sizer, SizerKind::Eoq);
        assert_eq!(config.max_tenant_weight, 50);
        assert_eq!(config.security, Some(Security::Insecure));
        assert_eq!(config.fair_throttle[0].config.levels, 4);
        let files = crate::tls::TlsFiles {
            ca: "/ca".into(),
            cert: "/c".into(),
            key: "/k".into(),
        };
        let replaced = file
            .to_config(Some(Security::MutualTls(files.clone())))
            .unwrap();
        assert_eq!(replaced.security, Some(Security::MutualTls(files)));
    }

    #[test]
    fn a_ratelimit_table_serves_its_files_and_an_empty_one_is_a_problem() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("edge.yaml");
        std::fs::write(
            &path,
            "domain: edge\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
        )
        .unwrap();
        let text = format!(
            "region = \"eu\"\ncoordinators = [\"n1:7100\"]\ninsecure = true\n\
             [ratelimit]\nconfigs = [{:?}]\nresponse_headers = true\nreload_interval_ms = 250\n",
            path.display().to_string()
        );
        let file: EscrowFile = toml::from_str(&text).unwrap();
        assert!(file.problems().is_empty(), "{:?}", file.problems());
        let rls = file.to_config(None).unwrap().rls.expect("RLS served");
        assert_eq!(rls.domains[0].domain, "edge");
        assert!(rls.response_headers);
        assert_eq!(rls.reload_interval_ms, 250);
        let empty: EscrowFile = toml::from_str(
            "region = \"eu\"\ncoordinators = [\"n1:7100\"]\ninsecure = true\n[ratelimit]\n",
        )
        .unwrap();
        assert!(empty
            .problems()
            .iter()
            .any(|p| p.field.to_string() == "ratelimit"));
        std::fs::write(&path, "domain: edge\nquota_mode: true\n").unwrap();
        let refused = file
            .to_config(None)
            .expect_err("a broken ratelimit file refuses to start");
        assert!(refused.to_string().contains("quota_mode"), "{refused}");
        // `config check` of the node's file reads the ratelimit files too.
        let found = file.problems();
        assert!(
            found
                .iter()
                .any(|p| p.field.to_string() == "ratelimit.configs"
                    && p.problem.contains("quota_mode")
                    && p.problem.contains("line 2")),
            "{found:?}"
        );
        let missing: EscrowFile = toml::from_str(
            "region = \"eu\"\ncoordinators = [\"n1:7100\"]\ninsecure = true\n\
             [ratelimit]\nconfigs = [\"/nonexistent/edge.yaml\"]\n",
        )
        .unwrap();
        assert!(missing
            .problems()
            .iter()
            .any(|p| p.problem.contains("/nonexistent/edge.yaml")));
    }

    #[test]
    fn every_problem_is_listed_and_the_config_refused() {
        let file: EscrowFile = toml::from_str(
            "listen = \"nowhere\"\ncoordinators = [\"n1\"]\nbatch = 0\nsizer = \"psychic\"\n\
             max_tenant_weight = 0\n\
             tls_ca = \"/ca.pem\"\n[fair_throttle]\nprefixes = [\"\", \"a\", \"a\"]\nlevels = 0\n",
        )
        .unwrap();
        let fields: Vec<String> = file
            .problems()
            .iter()
            .map(|p| p.field.to_string())
            .collect();
        for expected in [
            "region",
            "listen",
            "coordinators",
            "batch",
            "sizer",
            "max_tenant_weight",
            "tls_ca",
            "fair_throttle.prefixes",
            "fair_throttle",
        ] {
            assert!(
                fields.iter().any(|f| f == expected),
                "{expected} missing from {fields:?}"
            );
        }
        assert!(file.to_config(None).is_err());
        assert!(toml::from_str::<EscrowFile>("regoin = \"eu\"").is_err());
    }
}
