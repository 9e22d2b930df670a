//! What the node serves Envoy's rate limit service with: the ratelimit
//! files' domains (read again as they change), the counters `/metrics`
//! shows, and what each caller was charged (for refunds). Shared by the
//! node's state and the RLS front ([`super::rls`]), and depending on
//! neither.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use leasehold_core::metrics::{Exposition, MetricKind};
use leasehold_core::principal::Principal;
use leasehold_core::rls::refunds::RefundBook;
use leasehold_core::rls::DomainConfig;

use crate::error::NodeError;

/// What the node serves RLS with: the domains of its ratelimit files.
#[derive(Debug, Clone, PartialEq)]
pub struct RlsConfig {
    /// The files the domains were read from (for logs and status).
    pub files: Vec<PathBuf>,
    /// One configuration per domain.
    pub domains: Vec<DomainConfig>,
    /// Add the draft RateLimit headers (`x-ratelimit-limit`, `-remaining`,
    /// `-reset`) to every answer with a limit.
    pub response_headers: bool,
    /// How often the files are read again; a change that reads without a
    /// problem replaces the domains, one with problems is logged, counted
    /// and ignored (0: never).
    pub reload_interval_ms: u64,
}

/// How often ratelimit files are read again by default.
pub const DEFAULT_RELOAD_INTERVAL_MS: u64 = 5_000;

impl RlsConfig {
    /// Reads `files` (each one domain in the `envoyproxy/ratelimit`
    /// format); a problem in any, or a domain configured twice, refuses
    /// them all with every problem at its line.
    pub fn load(files: &[PathBuf], response_headers: bool) -> Result<RlsConfig, NodeError> {
        match read_domains(files) {
            Ok(domains) => Ok(RlsConfig {
                files: files.to_vec(),
                domains,
                response_headers,
                reload_interval_ms: DEFAULT_RELOAD_INTERVAL_MS,
            }),
            Err(problems) => Err(NodeError::Invalid(format!(
                "ratelimit configuration refused:\n  {}",
                problems.join("\n  ")
            ))),
        }
    }
}

/// The domains of ratelimit `files`, one per file, or every problem: each
/// file's at its lines, and a domain configured by two files (the node's
/// start, its reloads and `config check` of its TOML all read them so).
pub fn read_domains(files: &[PathBuf]) -> Result<Vec<DomainConfig>, Vec<String>> {
    let mut domains: Vec<DomainConfig> = Vec::new();
    let mut problems = Vec::new();
    for file in files {
        match crate::ratelimit_file::load(file) {
            Ok(config) if domains.iter().any(|d| d.domain == config.domain) => {
                problems.push(format!(
                    "{}: domain {:?} is configured by another file too",
                    file.display(),
                    config.domain
                ));
            }
            Ok(config) => domains.push(config),
            Err(found) => problems.extend(
                found
                    .into_iter()
                    .map(|problem| format!("{}: {problem}", file.display())),
            ),
        }
    }
    if problems.is_empty() {
        Ok(domains)
    } else {
        Err(problems)
    }
}

/// How a descriptor was answered, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    WithinLimit,
    OverLimit,
    ShadowMode,
    Unlimited,
    NoLimit,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::WithinLimit,
        Outcome::OverLimit,
        Outcome::ShadowMode,
        Outcome::Unlimited,
        Outcome::NoLimit,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Outcome::WithinLimit => "within_limit",
            Outcome::OverLimit => "over_limit",
            Outcome::ShadowMode => "shadow_mode",
            Outcome::Unlimited => "unlimited",
            Outcome::NoLimit => "no_limit",
        }
    }
}

/// Descriptors and hits, per outcome.
#[derive(Debug, Default)]
pub(super) struct OutcomeCounters {
    descriptors: [AtomicU64; 5],
    hits: AtomicU64,
}

impl OutcomeCounters {
    pub(super) fn count(&self, outcome: Outcome, hits: u64) {
        self.descriptors[outcome as usize].fetch_add(1, Ordering::Relaxed);
        self.hits.fetch_add(hits, Ordering::Relaxed);
    }
}

/// The RLS metrics: per configured domain (and one bucket for every
/// domain no file configures), per rule only where the file sets
/// `detailed_metric` — so their number is bounded by the configuration,
/// never by what requests carry.
/// Domains and rules added by a reload get counters of their own; none is
/// dropped while the process runs (a reload that removes a domain keeps its
/// series), so the count is bounded by the configurations loaded.
#[derive(Debug, Default)]
pub struct RlsMetrics {
    domains: RwLock<BTreeMap<String, Arc<OutcomeCounters>>>,
    unknown_domain: Arc<OutcomeCounters>,
    /// By rule prefix: (domain, counters).
    detailed: RwLock<HashMap<String, (String, Arc<OutcomeCounters>)>>,
    reloads: AtomicU64,
    reloads_refused: AtomicU64,
    pub(super) requests_ok: AtomicU64,
    pub(super) requests_over_limit: AtomicU64,
    pub(super) requests_refused: AtomicU64,
    pub(super) limit_overrides_ignored: AtomicU64,
    pub(super) negative_hits_ignored: AtomicU64,
    pub(super) checks_only: AtomicU64,
    pub(super) hits_unpaid: AtomicU64,
    pub(super) hits_refunded: AtomicU64,
    pub(super) refund_hits_refused: AtomicU64,
}

impl RlsMetrics {
    fn new(config: &RlsConfig) -> RlsMetrics {
        let metrics = RlsMetrics::default();
        metrics.register(config);
        metrics
    }

    /// Counters for every domain and `detailed_metric` rule of `config`
    /// that has none yet.
    fn register(&self, config: &RlsConfig) {
        let mut domains = self.domains.write().unwrap_or_else(PoisonError::into_inner);
        let mut detailed = self
            .detailed
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        for domain in &config.domains {
            domains.entry(domain.domain.clone()).or_default();
            for (path, _) in domain.limiting_rules() {
                if path.last().is_some_and(|rule| rule.detailed_metric) {
                    detailed
                        .entry(leasehold_core::rls::rule_prefix(&domain.domain, &path))
                        .or_insert_with(|| (domain.domain.clone(), Arc::default()));
                }
            }
        }
    }

    /// Appends the RLS families to `doc`.
    pub fn render(&self, doc: &mut Exposition) {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed) as f64;
        doc.family(
            "leasehold_escrow_rls_requests_total",
            MetricKind::Counter,
            "ShouldRateLimit requests by overall code (OK, OVER_LIMIT) or refused as invalid.",
        );
        for (code, counter) in [
            ("OK", &self.requests_ok),
            ("OVER_LIMIT", &self.requests_over_limit),
            ("refused", &self.requests_refused),
        ] {
            doc.sample(
                "leasehold_escrow_rls_requests_total",
                &[("code", code)],
                load(counter),
            );
        }
        let domains: Vec<(String, Arc<OutcomeCounters>)> = self
            .domains
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(domain, counters)| (domain.clone(), counters.clone()))
            .chain([(String::new(), self.unknown_domain.clone())])
            .collect();
        doc.family(
            "leasehold_escrow_rls_descriptors_total",
            MetricKind::Counter,
            "Request descriptors by domain (\"\": a domain no file configures) and outcome \
             (within_limit, over_limit, shadow_mode: OK where it would be over, unlimited, \
             no_limit: no rule applies).",
        );
        let mut hits = Vec::new();
        for (domain, counters) in &domains {
            for outcome in Outcome::ALL {
                doc.sample(
                    "leasehold_escrow_rls_descriptors_total",
                    &[("domain", domain), ("outcome", outcome.as_str())],
                    load(&counters.descriptors[outcome as usize]),
                );
            }
            hits.push((domain.as_str(), load(&counters.hits)));
        }
        doc.family(
            "leasehold_escrow_rls_hits_total",
            MetricKind::Counter,
            "Hits charged (hits_addend; a request's 0 counting as 1, a descriptor's 0 as none) \
             of request descriptors, by domain.",
        );
        for (domain, value) in hits {
            doc.sample(
                "leasehold_escrow_rls_hits_total",
                &[("domain", domain)],
                value,
            );
        }
        doc.family(
            "leasehold_escrow_rls_rule_descriptors_total",
            MetricKind::Counter,
            "Request descriptors by rule (its key prefix), for rules with detailed_metric.",
        );
        let mut detailed: Vec<(String, String, Arc<OutcomeCounters>)> = self
            .detailed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(rule, (domain, counters))| (rule.clone(), domain.clone(), counters.clone()))
            .collect();
        detailed.sort_by(|a, b| a.0.cmp(&b.0));
        for (rule, domain, counters) in &detailed {
            for outcome in Outcome::ALL {
                doc.sample(
                    "leasehold_escrow_rls_rule_descriptors_total",
                    &[
                        ("domain", domain),
                        ("rule", rule),
                        ("outcome", outcome.as_str()),
                    ],
                    load(&counters.descriptors[outcome as usize]),
                );
            }
        }
        doc.family(
            "leasehold_escrow_rls_reloads_total",
            MetricKind::Counter,
            "Changed ratelimit files read again: applied, or refused for problems (the domains \
             before the change kept serving).",
        );
        for (result, counter) in [
            ("applied", &self.reloads),
            ("refused", &self.reloads_refused),
        ] {
            doc.sample(
                "leasehold_escrow_rls_reloads_total",
                &[("result", result)],
                load(counter),
            );
        }
        doc.single(
            "leasehold_escrow_rls_limit_overrides_ignored_total",
            MetricKind::Counter,
            "Descriptors carrying a limit override, answered by the configured rule instead.",
            load(&self.limit_overrides_ignored),
        );
        doc.single(
            "leasehold_escrow_rls_check_only_descriptors_total",
            MetricKind::Counter,
            "Descriptors whose own hits_addend was 0: checked, spending nothing.",
            load(&self.checks_only),
        );
        doc.single(
            "leasehold_escrow_rls_hits_unpaid_total",
            MetricKind::Counter,
            "Hits of charges that found fewer left in the window than they carried: the part \
             not spent (the rest of the window was).",
            load(&self.hits_unpaid),
        );
        doc.single(
            "leasehold_escrow_rls_hits_refunded_total",
            MetricKind::Counter,
            "Hits given back by is_negative_hits descriptors (each at most what its caller was \
             charged on the key in a window not yet over).",
            load(&self.hits_refunded),
        );
        doc.single(
            "leasehold_escrow_rls_refund_hits_refused_total",
            MetricKind::Counter,
            "Hits of is_negative_hits descriptors not given back: beyond what the caller was \
             charged there, or its window over.",
            load(&self.refund_hits_refused),
        );
        doc.single(
            "leasehold_escrow_rls_negative_hits_ignored_total",
            MetricKind::Counter,
            "Descriptors with is_negative_hits that match no limited rule.",
            load(&self.negative_hits_ignored),
        );
    }

    pub(super) fn domain(&self, domain: &str) -> Arc<OutcomeCounters> {
        self.domains
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(domain)
            .unwrap_or(&self.unknown_domain)
            .clone()
    }

    pub(super) fn detailed(&self, rule_prefix: &str) -> Option<Arc<OutcomeCounters>> {
        self.detailed
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(rule_prefix)
            .map(|(_, counters)| counters.clone())
    }
}

type Domains = HashMap<String, DomainConfig>;

fn domains_of(config: &RlsConfig) -> Arc<Domains> {
    Arc::new(
        config
            .domains
            .iter()
            .map(|d| (d.domain.clone(), d.clone()))
            .collect(),
    )
}

/// The RLS state of a node: its domains (replaced by a reload) and metrics.
#[derive(Debug)]
pub struct RlsState {
    domains: RwLock<Arc<Domains>>,
    /// Fixed for the process (a reload changes the domains only).
    pub(super) response_headers: bool,
    config: Mutex<RlsConfig>,
    /// What `/metrics` shows.
    pub metrics: RlsMetrics,
    /// What each caller was charged per key in the current window.
    refunds: Mutex<RefundBook<Principal>>,
}

impl RlsState {
    /// The state serving `config`.
    pub fn new(config: &RlsConfig) -> RlsState {
        RlsState {
            domains: RwLock::new(domains_of(config)),
            response_headers: config.response_headers,
            config: Mutex::new(config.clone()),
            metrics: RlsMetrics::new(config),
            refunds: Mutex::new(RefundBook::default()),
        }
    }

    pub(super) fn lock_refunds(&self) -> std::sync::MutexGuard<'_, RefundBook<Principal>> {
        self.refunds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn domains(&self) -> Arc<Domains> {
        self.domains
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Reads the files again; serves what they say now if it differs and
    /// reads without a problem. Returns whether the domains changed.
    pub fn reload(&self) -> Result<bool, NodeError> {
        let current = self
            .config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let read = RlsConfig::load(&current.files, current.response_headers);
        let mut fresh = match read {
            Ok(fresh) => fresh,
            Err(e) => {
                self.metrics.reloads_refused.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        if fresh.domains == current.domains {
            return Ok(false);
        }
        fresh.reload_interval_ms = current.reload_interval_ms;
        self.metrics.register(&fresh);
        *self.domains.write().unwrap_or_else(PoisonError::into_inner) = domains_of(&fresh);
        *self.config.lock().unwrap_or_else(PoisonError::into_inner) = fresh;
        self.metrics.reloads.fetch_add(1, Ordering::Relaxed);
        Ok(true)
    }
}

/// Reads `state`'s files again every `reload_interval_ms` (not at all when
/// 0): a change replaces the domains; problems are logged once per change
/// and the domains before it keep serving.
pub async fn reload_periodically(state: Arc<RlsState>) {
    let interval_ms = state
        .config
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .reload_interval_ms;
    if interval_ms == 0 {
        return;
    }
    let mut last_problem = None;
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(interval_ms)).await;
        match state.reload() {
            Ok(true) => {
                last_problem = None;
                let domains: Vec<String> = state.domains().keys().cloned().collect();
                tracing::info!(?domains, "ratelimit configuration reloaded");
            }
            Ok(false) => last_problem = None,
            Err(e) => {
                let problem = e.to_string();
                if last_problem.as_ref() != Some(&problem) {
                    tracing::warn!(error = %problem,
                        "ratelimit configuration changed with problems; still serving the previous one");
                    last_problem = Some(problem);
                }
            }
        }
    }
}
