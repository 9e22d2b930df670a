//! An escrow node's configuration ([`EscrowConfig`]) and its checks, and
//! the name the node goes by across its restarts ([`default_node_name`]).

use leasehold_core::escrow::HolderLimits;
use leasehold_core::ids::RegionId;
use leasehold_core::predictive_sizer::SizerKind;

use super::fair_throttle::{self, FairThrottleRule};
use super::rls_state::RlsConfig;
use crate::error::NodeError;
use crate::net::ServerLimits;
use crate::tls::Security;

/// The default bound on a tenant's declared weight ([`EscrowConfig::max_tenant_weight`]).
pub const DEFAULT_MAX_TENANT_WEIGHT: u64 = 1_000;

/// Configuration of one escrow node.
#[derive(Debug, Clone)]
pub struct EscrowConfig {
    /// The region this node serves.
    pub region: RegionId,
    /// `host:port` to listen on.
    pub listen: String,
    /// Coordinator members to lease from.
    pub coordinators: Vec<String>,
    /// Tokens per coordinator lease (at least the request's size); the
    /// starting size of the learning sizers.
    pub batch: u64,
    /// How each key's lease size is chosen: a fixed `batch`, the online EOQ
    /// learner (`leasehold_core::sizer`), or Hedge over a
    /// prediction-following expert and the EOQ learner
    /// (`leasehold_core::predictive_sizer`); the learners observe the
    /// tokens served per window.
    pub sizer: SizerKind,
    /// While the coordinator is unreachable, one probe per this interval.
    pub probe_interval_ms: u64,
    /// Most keys tracked at once; new keys beyond it get `RESOURCE_EXHAUSTED`.
    pub max_keys: usize,
    /// Of those, most first requested by one caller identity (TLS): its
    /// new keys beyond it get `RESOURCE_EXHAUSTED`, and only its own.
    pub max_keys_per_identity: usize,
    /// Most tenants tracked per `fair` key; the oldest is evicted beyond it
    /// and its use keeps counting, so a tenant flood cannot over-admit.
    pub max_tenants: usize,
    /// The largest tenant `weight` an Acquire or Check may declare (≥ 1).
    /// A request above it is refused with `INVALID_ARGUMENT` (reason
    /// `INVALID_FIELD`, field `weight`) before anything is admitted, so one
    /// service cannot declare its way to nearly all of its region's fair
    /// share, nor inflate its region's pool weight (Σ tenant weights).
    pub max_tenant_weight: u64,
    /// A key's actor returns its credits and stops after this long idle.
    pub idle_evict_ms: u64,
    /// Reclaim: a `fair` key without requests for this long hands the
    /// unspent part of its pool grant back (`PoolRelease`) while its window
    /// is current; 0 turns it off (a grant is then kept to the window's end).
    pub pool_release_idle_ms: u64,
    /// At shutdown, how long the node may spend handing credits back
    /// (final reconciles and pool releases) before it stops anyway.
    pub shutdown_drain_ms: u64,
    /// Bounds of each key's credit holders (caller, client id): holders per
    /// key (a new one beyond it gets `RESOURCE_EXHAUSTED`), answers and
    /// credit entries remembered per holder, how long an answer is kept.
    pub holder_limits: HolderLimits,
    /// How often policies are re-read from the cluster.
    pub policy_refresh_ms: u64,
    /// Deadline of one coordinator call, retries included: a call keeps
    /// retrying (following leader hints, backing off 10–100 ms) until it,
    /// so a leader change shorter than it is not an outage.
    pub coordinator_timeout_ms: u64,
    /// Connection cap, first-byte deadline, stream and request limits of
    /// the Escrow listener (see [`crate::net`]).
    pub limits: ServerLimits,
    /// Mutual TLS (the region's certificate, presented to clients and to
    /// the coordinator) or `Insecure`; `None` refuses to start on TCP.
    pub security: Option<Security>,
    /// Keys fronted by a fair throttle (FAIR), by key prefix: callers that
    /// keep finding the key's budget gone are throttled before it is gone.
    /// Empty: no key is.
    pub fair_throttle: Vec<FairThrottleRule>,
    /// Seed of the fair throttles' random source (hash seeds and draws);
    /// `None`: the OS's. Simulations set it so that a seed replays.
    pub fair_throttle_rng_seed: Option<u64>,
    /// Seed of the coordinator client's random choices (which member it
    /// tries first, retry jitter); `None`: the OS's. Simulations set it so
    /// that a seed replays.
    pub coordinator_rng_seed: Option<u64>,
    /// `host:port` of the Prometheus `/metrics` listener (plain HTTP; none
    /// when unset).
    pub metrics_listen: Option<String>,
    /// Envoy's rate limit service (RLS v3) with these domains, on the
    /// node's listener; not served when `None`.
    pub rls: Option<RlsConfig>,
    /// The name this node keeps across its restarts, sent with its pool
    /// calls (`PoolGrantRequest.node`) so that the coordinator counts its
    /// region weight once however often it restarts. `None`: each process
    /// start is a holder of its own. `leasehold escrow` sets
    /// `--node-name`, by default [`default_node_name`].
    pub node_name: Option<String>,
}

/// The name an escrow node listening on `listen` goes by when none is
/// given: `<host name>:<port>` — a pod's name in Kubernetes, which its
/// container restarts keep, and unique among the processes of one host,
/// which listen on different ports. At most 128 bytes.
pub fn default_node_name(listen: &str) -> String {
    node_name_of(&host_name(), listen)
}

/// This host's name: the kernel's, else `HOSTNAME`, else `escrow`.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
        .filter(|name| !name.is_empty())
        .or_else(|| {
            std::env::var("HOSTNAME")
                .ok()
                .filter(|name| !name.is_empty())
        })
        .unwrap_or_else(|| "escrow".to_string())
}

/// `<host>:<port of listen>` (the pure part of [`default_node_name`]).
pub fn node_name_of(host: &str, listen: &str) -> String {
    let port = listen.rsplit_once(':').map_or(listen, |(_, port)| port);
    cut_to_node_name(format!("{host}:{port}"))
}

/// `name` cut to the 128 bytes a node name may have, at a character
/// boundary.
pub fn cut_to_node_name(mut name: String) -> String {
    let mut end = name.len().min(leasehold_core::ids::MAX_CLIENT_ID_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name.truncate(end);
    name
}

/// The longest deadline of one coordinator call (10 minutes): a longer one
/// would hold a waiting request past any caller's patience, and one near
/// `u64::MAX` ms would overflow the clock.
pub const MAX_COORDINATOR_TIMEOUT_MS: u64 = 600_000;

impl EscrowConfig {
    /// Defaults for `region` listening on `listen`, leasing from `coordinators`.
    pub fn new(region: RegionId, listen: String, coordinators: Vec<String>) -> Self {
        EscrowConfig {
            region,
            listen,
            coordinators,
            batch: 16,
            sizer: SizerKind::Fixed,
            probe_interval_ms: 1_000,
            max_keys: 100_000,
            max_keys_per_identity: 25_000,
            max_tenants: 10_000,
            max_tenant_weight: DEFAULT_MAX_TENANT_WEIGHT,
            idle_evict_ms: 30_000,
            pool_release_idle_ms: 1_000,
            shutdown_drain_ms: 5_000,
            holder_limits: HolderLimits::default(),
            policy_refresh_ms: 2_000,
            coordinator_timeout_ms: 1_000,
            limits: ServerLimits::default(),
            security: None,
            fair_throttle: Vec::new(),
            fair_throttle_rng_seed: None,
            coordinator_rng_seed: None,
            metrics_listen: None,
            rls: None,
            node_name: None,
        }
    }

    /// Checks every field.
    pub fn validate(&self) -> Result<(), NodeError> {
        let bad =
            |field: &str, why: &str| Err(NodeError::Invalid(format!("escrow {field}: {why}")));
        if self.coordinators.is_empty() {
            return bad("coordinator", "at least one coordinator member is needed");
        }
        if let Some(name) = &self.node_name {
            if let Err(e) = leasehold_core::ids::ClientId::new(name) {
                return Err(NodeError::Invalid(format!("escrow node-name: {e}")));
            }
        }
        if self.batch == 0 {
            return bad("batch", "must be at least 1");
        }
        if self.max_keys == 0 {
            return bad("max-keys", "must be at least 1");
        }
        if self.max_keys_per_identity == 0 {
            return bad("max-keys-per-identity", "must be at least 1");
        }
        if self.max_tenant_weight == 0 {
            return bad("max-tenant-weight", "must be at least 1");
        }
        if self.holder_limits.max_holders == 0 {
            return bad("max-holders-per-key", "must be at least 1");
        }
        if self.holder_limits.max_holders_per_principal == 0 {
            return bad("max-holders-per-identity", "must be at least 1");
        }
        if self.probe_interval_ms == 0 || self.coordinator_timeout_ms == 0 {
            return bad("intervals", "must be at least 1 ms");
        }
        if self.coordinator_timeout_ms > MAX_COORDINATOR_TIMEOUT_MS {
            return bad(
                "coordinator-timeout-ms",
                &format!("must be at most {MAX_COORDINATOR_TIMEOUT_MS} ms"),
            );
        }
        fair_throttle::validate_rules(&self.fair_throttle)?;
        self.limits
            .validate()
            .map_err(|e| NodeError::Invalid(format!("escrow {e}")))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> EscrowConfig {
        EscrowConfig::new(
            RegionId::new("eu").expect("valid region"),
            "127.0.0.1:0".into(),
            vec!["127.0.0.1:7100".into()],
        )
    }

    #[test]
    fn the_coordinator_timeout_is_between_1_ms_and_ten_minutes() {
        let mut config = config();
        for (timeout, valid) in [(0, false), (1, true), (MAX_COORDINATOR_TIMEOUT_MS, true)] {
            config.coordinator_timeout_ms = timeout;
            assert_eq!(config.validate().is_ok(), valid, "{timeout} ms");
        }
        config.coordinator_timeout_ms = u64::MAX;
        let error = config
            .validate()
            .expect_err("a deadline past any clock is refused");
        assert!(
            error.to_string().contains("coordinator-timeout-ms"),
            "{error}"
        );
    }

    #[test]
    fn max_tenant_weight_defaults_to_1000_and_must_be_at_least_1() {
        let mut config = config();
        assert_eq!(config.max_tenant_weight, 1_000);
        assert!(config.validate().is_ok());
        config.max_tenant_weight = 0;
        let error = config.validate().expect_err("a zero bound is refused");
        assert!(error.to_string().contains("max-tenant-weight"), "{error}");
        config.max_tenant_weight = 1;
        assert!(config.validate().is_ok());
        config.max_tenant_weight = u64::MAX;
        assert!(config.validate().is_ok());
    }

    #[test]
    fn a_node_name_is_the_host_and_port_within_128_bytes_and_is_checked() {
        assert_eq!(
            node_name_of("escrow-7f9c", "0.0.0.0:7201"),
            "escrow-7f9c:7201"
        );
        assert_eq!(node_name_of("h", "[::1]:7201"), "h:7201");
        let long = node_name_of(&"é".repeat(100), "0.0.0.0:7201");
        assert!(long.len() <= 128 && long.starts_with('é'), "{long}");
        assert!(!default_node_name("127.0.0.1:7201").is_empty());
        let mut config = config();
        config.node_name = Some(String::new());
        let error = config.validate().expect_err("an empty name is refused");
        assert!(error.to_string().contains("node-name"), "{error}");
        config.node_name = Some("n".repeat(129));
        assert!(config.validate().is_err());
        config.node_name = Some(default_node_name(&config.listen));
        assert!(config.validate().is_ok());
    }
}
