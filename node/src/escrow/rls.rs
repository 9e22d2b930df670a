//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`,
//! RLS v3) on the escrow node: `ShouldRateLimit` answers every descriptor
//! from the node's escrow, with no coordinator call per request.
//!
//! The node reads `envoyproxy/ratelimit` configuration files
//! (`--ratelimit-config`, [`crate::ratelimit_file`]); each request's
//! descriptors are planned by the pure rules of
//! [`leasehold_core::rls::answer`] and each limited descriptor is charged
//! on its Leasehold key: all its hits or, when fewer are left, what is
//! left (recorded, as upstream records every hit, but never beyond the
//! limit, so the global budget's Δ = 0 holds behind Envoy exactly as it
//! does for the node's own clients); a descriptor whose own `hits_addend`
//! is 0 is check-only and spends nothing. The keys' policies come from the cluster: apply
//! the same files with `leasehold policy apply` (docs/envoy.md).
//!
//! Requests the node cannot answer are refused `INVALID_ARGUMENT` (reason
//! `INVALID_FIELD`): an empty `domain`, no `descriptors`, more than
//! [`MAX_DESCRIPTORS`] descriptors or [`MAX_ENTRIES`] entries in one, an
//! entry with an empty key. A descriptor's `limit` override is not honoured:
//! the descriptor is answered by the rule it matches, as without one (the
//! cluster's policy governs, so every region enforces one limit); it is
//! counted. A descriptor with `is_negative_hits` is a refund, answered `OK`
//! without a limit: it gives back at most what its caller was charged on
//! the key in a window not yet over
//! ([`leasehold_core::rls::refunds::RefundBook`], on this node), and the
//! escrow at most what it served there and has not taken back.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as WireUnit, Code as WireCode, DescriptorStatus, RateLimit as WireLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as WireDuration;
use leasehold_core::escrow::machine::Acquired;
use leasehold_core::metrics::{Exposition, MetricKind};
use leasehold_core::principal::Principal;
use leasehold_core::rls::answer::{
    descriptor_hits, draft_headers, overall_over_limit, plan_request, unpaid_hits, Code,
    DescriptorAnswer, EscrowOutcome, Plan, RequestDescriptor,
};
use leasehold_core::rls::refunds::RefundBook;
use leasehold_core::rls::{DomainConfig, Unit};
use leasehold_proto::refusal::invalid_field;
use tonic::{Request, Response, Status};

use super::service::EscrowApi;
use crate::error::NodeError;
use leasehold_core::escrow::machine::Serving;

/// Most descriptors in one request.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries in one descriptor.
pub const MAX_ENTRIES: usize = 32;

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
enum Outcome {
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
struct OutcomeCounters {
    descriptors: [AtomicU64; 5],
    hits: AtomicU64,
}

impl OutcomeCounters {
    fn count(&self, outcome: Outcome, hits: u64) {
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
    requests_ok: AtomicU64,
    requests_over_limit: AtomicU64,
    requests_refused: AtomicU64,
    limit_overrides_ignored: AtomicU64,
    negative_hits_ignored: AtomicU64,
    checks_only: AtomicU64,
    hits_unpaid: AtomicU64,
    hits_refunded: AtomicU64,
    refund_hits_refused: AtomicU64,
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

    fn domain(&self, domain: &str) -> Arc<OutcomeCounters> {
        self.domains
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(domain)
            .unwrap_or(&self.unknown_domain)
            .clone()
    }

    fn detailed(&self, rule_prefix: &str) -> Option<Arc<OutcomeCounters>> {
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
    response_headers: bool,
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

    fn lock_refunds(&self) -> std::sync::MutexGuard<'_, RefundBook<Principal>> {
        self.refunds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn domains(&self) -> Arc<Domains> {
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

/// The gRPC face of RLS on the escrow node.
#[derive(Debug, Clone)]
pub struct RateLimitApi {
    escrow: EscrowApi,
    state: Arc<RlsState>,
}

impl RateLimitApi {
    /// RLS answered from `escrow`'s keys with `state`'s domains.
    pub fn new(escrow: EscrowApi, state: Arc<RlsState>) -> Self {
        RateLimitApi { escrow, state }
    }

    /// One refund (an `is_negative_hits` descriptor planned `plan`) by
    /// `caller`: what it was charged on the key in a window not yet over,
    /// at most, given back through the escrow's capped take-back.
    async fn refund(&self, plan: &Plan, caller: &Principal) -> Result<(), Status> {
        let metrics = &self.state.metrics;
        let Plan::Limited(limited) = plan else {
            metrics
                .negative_hits_ignored
                .fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let now_ms = self.escrow.wall_ms();
        let refundable =
            self.state
                .lock_refunds()
                .refundable(&limited.key, caller, limited.hits, now_ms);
        let accepted = match refundable {
            Some(refund) => {
                let settled = self
                    .escrow
                    .refund(
                        &limited.key,
                        refund.tokens,
                        refund.window_start_ms,
                        caller.clone(),
                    )
                    .await?;
                self.state.lock_refunds().refunded(
                    &limited.key,
                    caller,
                    refund.window_start_ms,
                    settled.accepted,
                );
                settled.accepted
            }
            None => 0,
        };
        metrics.hits_refunded.fetch_add(accepted, Ordering::Relaxed);
        metrics
            .refund_hits_refused
            .fetch_add(limited.hits - accepted, Ordering::Relaxed);
        Ok(())
    }
}

fn wire_unit(unit: Unit) -> WireUnit {
    match unit {
        Unit::Second => WireUnit::Second,
        Unit::Minute => WireUnit::Minute,
        Unit::Hour => WireUnit::Hour,
        Unit::Day => WireUnit::Day,
        Unit::Week => WireUnit::Week,
        Unit::Month => WireUnit::Month,
        Unit::Year => WireUnit::Year,
    }
}

fn wire_status(answer: &DescriptorAnswer) -> DescriptorStatus {
    DescriptorStatus {
        code: match answer.code {
            Code::Ok => WireCode::Ok,
            Code::OverLimit => WireCode::OverLimit,
        } as i32,
        current_limit: answer
            .current_limit
            .map(|(requests_per_unit, unit)| WireLimit {
                name: String::new(),
                requests_per_unit,
                unit: wire_unit(unit) as i32,
            }),
        limit_remaining: answer.limit_remaining,
        duration_until_reset: answer.until_reset_ms.map(|ms| WireDuration {
            seconds: i64::try_from(ms / 1_000).unwrap_or(i64::MAX),
            nanos: i32::try_from(ms % 1_000 * 1_000_000).unwrap_or(0),
        }),
        quota: None,
    }
}

/// One descriptor of a request, read.
struct ReadDescriptor<'a> {
    entries: Vec<(&'a str, &'a str)>,
    /// Its own `hits_addend`, else the request's.
    hits: u64,
    /// `is_negative_hits`.
    negative: bool,
}

/// A request's descriptors as entries and hits, refusing what cannot be
/// answered.
fn read_descriptors(request: &RateLimitRequest) -> Result<Vec<ReadDescriptor<'_>>, Status> {
    if request.domain.is_empty() {
        return Err(invalid_field(
            "domain",
            "the rate limit domain must not be empty",
        ));
    }
    if request.descriptors.is_empty() {
        return Err(invalid_field(
            "descriptors",
            "the rate limit descriptor list must not be empty",
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(invalid_field(
            "descriptors",
            format!(
                "{} descriptors; at most {MAX_DESCRIPTORS} in one request",
                request.descriptors.len()
            ),
        ));
    }
    request
        .descriptors
        .iter()
        .enumerate()
        .map(|(i, descriptor)| {
            if descriptor.entries.len() > MAX_ENTRIES {
                return Err(invalid_field(
                    "descriptors.entries",
                    format!(
                        "descriptor {i} has {} entries; at most {MAX_ENTRIES}",
                        descriptor.entries.len()
                    ),
                ));
            }
            let entries = descriptor
                .entries
                .iter()
                .map(|entry| {
                    if entry.key.is_empty() {
                        Err(invalid_field(
                            "descriptors.entries.key",
                            format!("descriptor {i} has an entry with an empty key"),
                        ))
                    } else {
                        Ok((entry.key.as_str(), entry.value.as_str()))
                    }
                })
                .collect::<Result<Vec<_>, Status>>()?;
            let hits = descriptor_hits(
                descriptor.hits_addend.as_ref().map(|hits| hits.value),
                request.hits_addend,
            );
            Ok(ReadDescriptor {
                entries,
                hits,
                negative: descriptor.is_negative_hits,
            })
        })
        .collect()
}

#[tonic::async_trait]
impl RateLimitService for RateLimitApi {
    #[tracing::instrument(name = "rls.should_rate_limit", level = "debug", skip_all, fields(
        domain = %request.get_ref().domain, descriptors = request.get_ref().descriptors.len()))]
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let caller = crate::auth::caller(&request);
        let request = request.into_inner();
        let metrics = &self.state.metrics;
        let descriptors = match read_descriptors(&request) {
            Ok(descriptors) => descriptors,
            Err(status) => {
                metrics.requests_refused.fetch_add(1, Ordering::Relaxed);
                return Err(status);
            }
        };
        let overrides = request
            .descriptors
            .iter()
            .filter(|d| d.limit.is_some())
            .count();
        metrics
            .limit_overrides_ignored
            .fetch_add(overrides as u64, Ordering::Relaxed);
        let domains = self.state.domains();
        let config = domains.get(&request.domain);
        // A negative-hits descriptor takes no part (not even in `replaces`).
        let counted: Vec<RequestDescriptor> = descriptors
            .iter()
            .filter(|d| !d.negative)
            .map(|d| RequestDescriptor {
                entries: &d.entries,
                hits: d.hits,
            })
            .collect();
        let mut counted_plans = plan_request(config, &counted).into_iter();
        let plans: Vec<Plan> = descriptors
            .iter()
            .map(|d| {
                if d.negative {
                    Plan::NoLimit
                } else {
                    counted_plans.next().unwrap_or(Plan::NoLimit)
                }
            })
            .collect();
        // Refunds, planned by the same rules among themselves: each gives
        // back at most what this caller was charged on its key in a window
        // not yet over, and the escrow at most what it served there.
        let refunds: Vec<RequestDescriptor> = descriptors
            .iter()
            .filter(|d| d.negative)
            .map(|d| RequestDescriptor {
                entries: &d.entries,
                hits: d.hits,
            })
            .collect();
        for plan in plan_request(config, &refunds) {
            self.refund(&plan, &caller).await?;
        }
        let outcomes = futures::future::try_join_all(plans.iter().map(|plan| {
            let caller = caller.clone();
            async move {
                let Plan::Limited(limited) = plan else {
                    return Ok(EscrowOutcome::NotAsked);
                };
                if !limited.asks_escrow() {
                    return Ok(EscrowOutcome::NotAsked);
                }
                // A check-only descriptor probes one hit and spends
                // nothing; a charge spends all its hits or what is left.
                let (tokens, serving) = if limited.check_only() {
                    (1, Serving::Probe)
                } else {
                    (limited.hits, Serving::Charge)
                };
                let acquired = self
                    .escrow
                    .admit(&limited.key, tokens, caller.clone(), serving)
                    .await?;
                if let (Serving::Charge, Acquired::Credits { served, .. }) = (serving, &acquired) {
                    if served.granted > 0 && !served.from_fallback {
                        self.state.lock_refunds().charge(
                            (&limited.key, &caller),
                            (served.window_start_ms, served.window_end_ms),
                            served.granted,
                            self.escrow.wall_ms(),
                        );
                    }
                }
                Ok::<_, Status>(match acquired {
                    Acquired::Credits {
                        served,
                        limit,
                        shadow_would_deny,
                    } => EscrowOutcome::Admitted {
                        spent: served.granted,
                        limit,
                        held_after: served.held_after,
                        window_end_ms: served.window_end_ms,
                        shadow_would_deny,
                    },
                    Acquired::Denied {
                        limit,
                        window_end_ms,
                        ..
                    } => EscrowOutcome::Denied {
                        limit,
                        window_end_ms,
                    },
                })
            }
        }))
        .await
        .inspect_err(|_| {
            metrics.requests_refused.fetch_add(1, Ordering::Relaxed);
        })?;
        let now_ms = self.escrow.wall_ms();
        let answers: Vec<DescriptorAnswer> = plans
            .iter()
            .zip(outcomes)
            .map(|(plan, outcome)| {
                if let Plan::Limited(limited) = plan {
                    if limited.check_only() {
                        metrics.checks_only.fetch_add(1, Ordering::Relaxed);
                    }
                }
                metrics
                    .hits_unpaid
                    .fetch_add(unpaid_hits(plan, outcome), Ordering::Relaxed);
                DescriptorAnswer::of(plan, outcome, now_ms)
            })
            .collect();
        let domain_counters = metrics.domain(&request.domain);
        for (plan, answer) in plans.iter().zip(&answers) {
            let (outcome, hits, detailed) = match plan {
                Plan::NoLimit => (Outcome::NoLimit, 0, None),
                Plan::Unlimited => (Outcome::Unlimited, 0, None),
                Plan::Limited(limited) => (
                    if answer.code == Code::OverLimit {
                        Outcome::OverLimit
                    } else if answer.shadow_would_deny {
                        Outcome::ShadowMode
                    } else {
                        Outcome::WithinLimit
                    },
                    limited.hits,
                    limited
                        .detailed_metric
                        .then(|| metrics.detailed(&limited.rule_prefix))
                        .flatten(),
                ),
            };
            domain_counters.count(outcome, hits);
            if let Some(counters) = detailed {
                counters.count(outcome, hits);
            }
        }
        let over = overall_over_limit(&answers);
        let counter = if over {
            &metrics.requests_over_limit
        } else {
            &metrics.requests_ok
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let response_headers_to_add = if self.state.response_headers {
            draft_headers(&answers)
                .into_iter()
                .map(|(key, value)| HeaderValue {
                    key: key.to_string(),
                    value,
                    raw_value: Vec::new(),
                })
                .collect()
        } else {
            Vec::new()
        };
        Ok(Response::new(RateLimitResponse {
            overall_code: if over {
                WireCode::OverLimit
            } else {
                WireCode::Ok
            } as i32,
            statuses: answers.iter().map(wire_status).collect(),
            response_headers_to_add,
            ..RateLimitResponse::default()
        }))
    }
}
