//! `leasehold escrow`: run a regional escrow node (L2), configured by
//! flags or by a TOML file (`--config`, [`EscrowFile`]).

use clap::Args;
use leasehold_core::fair_throttle::FairThrottleConfig;
use leasehold_core::ids::RegionId;

use super::args::ServerTlsArgs;
use super::error::CliError;
use super::signal::shutdown_signal;
use crate::error::NodeError;
use crate::escrow::config_file::EscrowFile;
use crate::escrow::fair_throttle::DEFAULT_FAIR_RETRY_AFTER_MS;
use crate::escrow::{serve_escrow, EscrowConfig, FairThrottleRule};
use crate::tls::Security;
use leasehold_core::predictive_sizer::SizerKind;

/// Arguments of `leasehold escrow`.
#[derive(Debug, Clone, Args)]
pub struct EscrowArgs {
    /// TOML config file holding every setting below (see
    /// deploy/config/escrow.example.toml); only the TLS flags (or their
    /// LEASEHOLD_TLS_* variables) may be given with it, and replace its TLS
    /// settings.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "region", "listen", "coordinators", "batch", "sizer", "eoq", "max_keys", "max_keys_per_identity",
        "probe_interval_ms", "coordinator_timeout_ms", "idle_evict_ms", "pool_release_idle_ms", "shutdown_drain_ms",
        "max_holders_per_key", "max_holders_per_identity", "max_tenant_weight", "fair_throttle",
        "ratelimit_configs",
    ])]
    pub config: Option<std::path::PathBuf>,
    /// The region this node serves (1..=64 bytes).
    #[arg(long, required_unless_present = "config")]
    pub region: Option<String>,
    /// HOST:PORT to listen on.
    #[arg(long, default_value = "127.0.0.1:7201")]
    pub listen: String,
    /// The name this node keeps across its restarts (1..=128 bytes), sent
    /// with its pool calls so that the coordinator counts the node's share
    /// of its region's weight once however often it restarts; unique among
    /// the escrow nodes running at a time. Default: `<host name>:<listen
    /// port>` (a pod's name in Kubernetes). May be given with --config.
    #[arg(long, env = "LEASEHOLD_NODE_NAME")]
    pub node_name: Option<String>,
    /// HOST:PORT of the Prometheus `/metrics` listener (plain HTTP; bind a
    /// private interface). Off when unset; may be given with --config.
    #[arg(long, env = "LEASEHOLD_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Coordinator member(s) as HOST:PORT; repeat or comma-separate.
    #[arg(
        long = "coordinator",
        value_delimiter = ',',
        required_unless_present = "config"
    )]
    pub coordinators: Vec<String>,
    /// Tokens per coordinator lease (the starting size of the learning sizers).
    #[arg(long, default_value_t = 16)]
    pub batch: u64,
    /// How each key's lease size is chosen: `fixed` (--batch), `eoq` (learned
    /// online from the demand per window) or `predictive` (Hedge over
    /// following the predicted demand and the EOQ learner).
    #[arg(long, default_value_t = SizerKind::Fixed)]
    pub sizer: SizerKind,
    /// Shorthand for `--sizer eoq`.
    #[arg(long, conflicts_with = "sizer")]
    pub eoq: bool,
    /// Most keys tracked at once.
    #[arg(long, default_value_t = 100_000)]
    pub max_keys: usize,
    /// Of those, most first requested by one caller identity (TLS
    /// listener): its new keys beyond it are refused (KEYS_EXHAUSTED), and
    /// only its own, so one service cannot fill the node's key table for
    /// the others of its region. Plaintext callers share no identity.
    #[arg(long, default_value_t = 25_000)]
    pub max_keys_per_identity: usize,
    /// While the coordinator is unreachable, probe it this often (ms).
    #[arg(long, default_value_t = 1_000)]
    pub probe_interval_ms: u64,
    /// Deadline of one coordinator call, retries through a leader change
    /// included (ms, 1..=600000): a leader change shorter than it is not an
    /// outage.
    #[arg(long, default_value_t = 1_000)]
    pub coordinator_timeout_ms: u64,
    /// Release a key's credits after it has been idle this long (ms).
    #[arg(long, default_value_t = 30_000)]
    pub idle_evict_ms: u64,
    /// Reclaim: a `fair` key without requests for this long hands the
    /// unspent part of its region's pool grant back while the window is
    /// current, for busier regions to use (ms; 0: off).
    #[arg(long, default_value_t = 1_000)]
    pub pool_release_idle_ms: u64,
    /// At shutdown, most time spent handing credits back (final reconciles
    /// and pool releases) before stopping anyway (ms).
    #[arg(long, default_value_t = 5_000)]
    pub shutdown_drain_ms: u64,
    /// Most credit holders (caller, client id) per key; a new holder beyond
    /// it is refused until holders' windows end.
    #[arg(long, default_value_t = 4_096)]
    pub max_holders_per_key: usize,
    /// Most credit holders (client ids in use) of one caller identity per
    /// key, on a TLS listener; its new holder beyond it is refused
    /// (HOLDERS_EXHAUSTED) and only its own, so one service cannot lock
    /// the others of its region out of a key. Callers of a plaintext
    /// listener share no identity and are bounded by --max-holders-per-key
    /// alone.
    #[arg(long, default_value_t = 1_024)]
    pub max_holders_per_identity: usize,
    /// Largest tenant weight an Acquire or Check may declare (≥ 1); a
    /// request above it is refused (INVALID_ARGUMENT, field `weight`), so
    /// no service can claim most of its region's fair share.
    #[arg(long, default_value_t = crate::escrow::DEFAULT_MAX_TENANT_WEIGHT)]
    pub max_tenant_weight: u64,
    /// Mutual TLS material (the region's certificate), or --insecure.
    #[command(flatten)]
    pub tls: ServerTlsArgs,
    /// Front keys under this prefix with a fair throttle (FAIR): callers
    /// that keep finding the key's budget gone are throttled before it is
    /// gone (denied with reason FAIR_THROTTLED). Repeat for more prefixes;
    /// the --fair-* parameters apply to all of them.
    #[arg(long = "fair-throttle", value_name = "PREFIX")]
    pub fair_throttle: Vec<String>,
    /// Fair throttle: levels (cells per caller), 1..=32.
    #[arg(long, default_value_t = FairThrottleConfig::default().levels, requires = "fair_throttle")]
    pub fair_levels: u32,
    /// Fair throttle: buckets per level, 1..=2^24 (levels × buckets ≤ 2^24).
    #[arg(long, default_value_t = FairThrottleConfig::default().buckets, requires = "fair_throttle")]
    pub fair_buckets: u32,
    /// Fair throttle: what an exhaustion adds to each cell (Pi), in (0, 1].
    #[arg(long, default_value_t = FairThrottleConfig::default().increment, requires = "fair_throttle")]
    pub fair_increment: f64,
    /// Fair throttle: what a success takes off each cell (Pd), in (0, 1].
    #[arg(long, default_value_t = FairThrottleConfig::default().decrement, requires = "fair_throttle")]
    pub fair_decrement: f64,
    /// Fair throttle: exponential decay rate of the cells, per second, ≥ 0.
    #[arg(long, default_value_t = FairThrottleConfig::default().decay_per_sec, requires = "fair_throttle")]
    pub fair_decay_per_sec: f64,
    /// Fair throttle: live/shadow rotation interval (ms), ≥ 1.
    #[arg(long, default_value_t = FairThrottleConfig::default().rotation_interval_ms, requires = "fair_throttle")]
    pub fair_rotation_ms: u64,
    /// Fair throttle: retry hint of a throttled request (ms), ≥ 1.
    #[arg(long, default_value_t = DEFAULT_FAIR_RETRY_AFTER_MS, requires = "fair_throttle")]
    pub fair_retry_after_ms: u64,
    /// Fair throttle idle capacity: a request the throttle refuses still
    /// reaches the escrow while the key holds more than this many unleased
    /// credits. Unset: throttled requests are always denied.
    #[arg(long, requires = "fair_throttle")]
    pub fair_idle_reserve: Option<u64>,
    /// Serve Envoy's rate limit service (RLS v3,
    /// `envoy.service.ratelimit.v3.RateLimitService`) on the node's
    /// listener, matching requests against this `envoyproxy/ratelimit`
    /// configuration file (one domain per file; repeat for more). Apply the
    /// same files to the cluster with `leasehold policy apply`.
    #[arg(long = "ratelimit-config", value_name = "FILE")]
    pub ratelimit_configs: Vec<std::path::PathBuf>,
    /// Add the draft RateLimit headers (`x-ratelimit-limit`, `-remaining`,
    /// `-reset`) to RLS answers.
    #[arg(long, requires = "ratelimit_configs")]
    pub ratelimit_response_headers: bool,
    /// Read the ratelimit files again this often (ms; 0: never): a change
    /// that reads without a problem is served at once, one with problems
    /// is logged and the previous rules keep serving.
    #[arg(long, default_value_t = crate::escrow::rls::DEFAULT_RELOAD_INTERVAL_MS)]
    pub ratelimit_reload_ms: u64,
}

impl EscrowArgs {
    /// `--node-name`, or the default for a node listening on `listen`.
    fn node_name(&self, listen: &str) -> String {
        self.node_name
            .clone()
            .unwrap_or_else(|| crate::escrow::default_node_name(listen))
    }

    /// The node configuration these arguments describe.
    pub fn config(&self) -> Result<EscrowConfig, CliError> {
        if let Some(path) = &self.config {
            let file = EscrowFile::load(path).map_err(|e| NodeError::Invalid(e.to_string()))?;
            let tls = &self.tls;
            let flags_name_tls = tls.tls_ca.is_some()
                || tls.tls_cert.is_some()
                || tls.tls_key.is_some()
                || tls.insecure;
            let security = flags_name_tls
                .then(|| {
                    Security::choose(
                        tls.tls_ca.as_deref(),
                        tls.tls_cert.as_deref(),
                        tls.tls_key.as_deref(),
                        tls.insecure,
                    )
                })
                .transpose()
                .map_err(|e| CliError::Usage(e.to_string()))?;
            let mut config = file.to_config(security)?;
            if let Some(addr) = &self.metrics_listen {
                config.metrics_listen = Some(addr.clone());
            }
            config.node_name = Some(self.node_name(&config.listen));
            return Ok(config);
        }
        let region = RegionId::new(self.region.clone().unwrap_or_default())
            .map_err(|e| CliError::Usage(e.to_string()))?;
        let mut config = EscrowConfig::new(region, self.listen.clone(), self.coordinators.clone());
        config.batch = self.batch;
        config.sizer = if self.eoq { SizerKind::Eoq } else { self.sizer };
        config.max_keys = self.max_keys;
        config.max_keys_per_identity = self.max_keys_per_identity;
        config.probe_interval_ms = self.probe_interval_ms;
        config.coordinator_timeout_ms = self.coordinator_timeout_ms;
        config.idle_evict_ms = self.idle_evict_ms;
        config.pool_release_idle_ms = self.pool_release_idle_ms;
        config.shutdown_drain_ms = self.shutdown_drain_ms;
        config.holder_limits.max_holders = self.max_holders_per_key;
        config.holder_limits.max_holders_per_principal = self.max_holders_per_identity;
        config.max_tenant_weight = self.max_tenant_weight;
        config.metrics_listen = self.metrics_listen.clone();
        config.node_name = Some(self.node_name(&config.listen));
        config.security = Some(
            Security::choose(
                self.tls.tls_ca.as_deref(),
                self.tls.tls_cert.as_deref(),
                self.tls.tls_key.as_deref(),
                self.tls.insecure,
            )
            .map_err(|e| CliError::Usage(e.to_string()))?,
        );
        let fair = FairThrottleConfig {
            levels: self.fair_levels,
            buckets: self.fair_buckets,
            increment: self.fair_increment,
            decrement: self.fair_decrement,
            decay_per_sec: self.fair_decay_per_sec,
            rotation_interval_ms: self.fair_rotation_ms,
            ..FairThrottleConfig::default()
        };
        config.fair_throttle = self
            .fair_throttle
            .iter()
            .map(|prefix| FairThrottleRule {
                prefix: prefix.clone(),
                config: fair,
                idle_reserve: self.fair_idle_reserve,
                retry_after_ms: self.fair_retry_after_ms,
            })
            .collect();
        if !self.ratelimit_configs.is_empty() {
            let mut rls = crate::escrow::rls::RlsConfig::load(
                &self.ratelimit_configs,
                self.ratelimit_response_headers,
            )?;
            rls.reload_interval_ms = self.ratelimit_reload_ms;
            config.rls = Some(rls);
        }
        config.validate()?;
        Ok(config)
    }
}

/// Runs the escrow node until Ctrl-C or SIGTERM.
pub async fn run(args: EscrowArgs) -> Result<(), CliError> {
    let config = args.config()?;
    serve_escrow(config, shutdown_signal()).await?;
    Ok(())
}
