//! The load client of `deploy/test-compose.sh`: drives a deployed cluster
//! (the compose file's three members and two escrow nodes, on mutual TLS)
//! and checks what it saw.
//!
//! - `load`: leased limiters of service `--service` spend `--key` through
//!   every `--escrow REGION=HOST:PORT` for `--duration-secs`, recording each
//!   admission with its window; meanwhile one task leases `--kept-key`
//!   straight from the coordinator as region `--kept-region` and sums the
//!   grants the coordinator acknowledged. At the end it prints one line per
//!   window (Σ admitted against `--limit`), the longest stretch each region
//!   went without an admission, and the line
//!   `ACKNOWLEDGED <key> <window_start_ms> <tokens>`; it fails when a window
//!   admitted more than `--limit` or a region admitted nothing.
//! - `rls`: Envoy's rate limit service on every `--escrow` node, as Envoy
//!   calls it (`ShouldRateLimit`, with a service certificate of each
//!   node's region), one descriptor `--entry KEY=VALUE` of `--domain`, for
//!   `--duration-secs`: OK answers per window (aligned to `--window-ms`)
//!   summed over every node; it fails when a window had more than
//!   `--limit`, when no answer was OK, or when an answer lacked the draft
//!   RateLimit headers.
//! - `verify`: after a restart, reads `--key`'s window (linearizable) and
//!   fails unless it is the window the grants were acknowledged in and its
//!   Σ granted is at least the acknowledged tokens: no acknowledged grant
//!   was lost.
//!
//! Certificates follow `leasehold certs mint`'s names under `--certs-dir`:
//! `ca.pem`, `service-<service>-<region>.{pem,key}` for the escrow nodes and
//! `region-<region>.{pem,key}` for the coordinator.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use leasehold_client::coordinator::{CoordinatorClient, RetryOptions};
use leasehold_client::tls::{ClientTlsFiles, TlsDialer};
use leasehold_client::transport::Dialer;
use leasehold_client::{
    EscrowSource, EscrowSourceOptions, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode,
};
use leasehold_core::ids::ClientId;

/// Load and checks against a deployed Leasehold cluster.
#[derive(Debug, Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Spend a key through escrow nodes and lease a second key directly.
    Load(LoadArgs),
    /// Check that a key's window still holds every acknowledged grant.
    Verify(VerifyArgs),
    /// Ask Envoy's rate limit service on every escrow node; Σ OK ≤ L per window.
    Rls(RlsArgs),
}

#[derive(Debug, Clone, Args)]
struct RlsArgs {
    #[command(flatten)]
    certs: Certs,
    /// A region's escrow nodes as REGION=HOST:PORT[,HOST:PORT…]; repeat.
    #[arg(long = "escrow", value_parser = parse_escrow, required = true)]
    escrows: Vec<(String, String)>,
    /// The service whose certificates call the escrow nodes (as Envoy).
    #[arg(long, default_value = "envoy")]
    service: String,
    /// The rate limit domain.
    #[arg(long)]
    domain: String,
    /// The descriptor's one entry, KEY=VALUE.
    #[arg(long)]
    entry: String,
    /// The rule's requests per unit (L).
    #[arg(long)]
    limit: u64,
    /// The rule's window (its unit), in milliseconds.
    #[arg(long)]
    window_ms: u64,
    /// Callers per escrow node.
    #[arg(long, default_value_t = 2)]
    callers_per_escrow: usize,
    /// How long to ask.
    #[arg(long)]
    duration_secs: u64,
}

#[derive(Debug, Clone, Args)]
struct Certs {
    /// Directory of `leasehold certs mint`'s files.
    #[arg(long, default_value = "/certs")]
    certs_dir: PathBuf,
}

impl Certs {
    fn dialer(&self, stem: &str) -> Arc<dyn Dialer> {
        Arc::new(TlsDialer::new(ClientTlsFiles {
            ca: self.certs_dir.join("ca.pem"),
            cert: self.certs_dir.join(format!("{stem}.pem")),
            key: self.certs_dir.join(format!("{stem}.key")),
        }))
    }
}

#[derive(Debug, Clone, Args)]
struct LoadArgs {
    #[command(flatten)]
    certs: Certs,
    /// A region's escrow nodes as REGION=HOST:PORT[,HOST:PORT…]; repeat for
    /// each region. Each limiter goes through all of them, starting at a
    /// different one, and moves on when one fails.
    #[arg(long = "escrow", value_parser = parse_escrow, required = true)]
    escrows: Vec<(String, String)>,
    /// The service whose certificates call the escrow nodes.
    #[arg(long, default_value = "app")]
    service: String,
    /// The key spent through the escrow nodes.
    #[arg(long)]
    key: String,
    /// Its policy's limit L per window.
    #[arg(long)]
    limit: u64,
    /// Limiters per escrow node.
    #[arg(long, default_value_t = 2)]
    clients_per_escrow: usize,
    /// Pause after each admission, in milliseconds (sets the demand).
    #[arg(long, default_value_t = 5)]
    pause_ms: u64,
    /// How long to generate load.
    #[arg(long)]
    duration_secs: u64,
    /// Coordinator members (HOST:PORT, comma-separated) for the direct leases.
    #[arg(long, value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// The key leased directly from the coordinator.
    #[arg(long)]
    kept_key: String,
    /// The region whose certificate leases `--kept-key`.
    #[arg(long, default_value = "eu")]
    kept_region: String,
    /// Interval between direct leases, in milliseconds.
    #[arg(long, default_value_t = 100)]
    kept_interval_ms: u64,
}

#[derive(Debug, Clone, Args)]
struct VerifyArgs {
    #[command(flatten)]
    certs: Certs,
    /// Coordinator members (HOST:PORT, comma-separated).
    #[arg(long, value_delimiter = ',', required = true)]
    coordinator: Vec<String>,
    /// The region whose certificate reads the window.
    #[arg(long, default_value = "eu")]
    region: String,
    /// The key whose grants were acknowledged.
    #[arg(long)]
    key: String,
    /// The window they were acknowledged in.
    #[arg(long)]
    window_start_ms: u64,
    /// Tokens acknowledged in it.
    #[arg(long)]
    acknowledged: u64,
    /// How long to keep asking while the cluster comes back, in seconds.
    #[arg(long, default_value_t = 60)]
    wait_secs: u64,
}

fn parse_escrow(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((region, addr)) if !region.is_empty() && !addr.is_empty() => {
            Ok((region.to_string(), addr.to_string()))
        }
        _ => Err(format!(
            "expected REGION=HOST:PORT[,HOST:PORT…], got {text:?}"
        )),
    }
}

fn wall_now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// What the clients saw: admissions per (window start, region) with the
/// wall-clock time of each region's admissions, and acknowledged grants.
#[derive(Debug, Default)]
struct Tally {
    /// Σ admitted per window start, per region.
    admitted: BTreeMap<u64, BTreeMap<String, u64>>,
    /// Wall-clock times of admissions, per region (for the longest gap).
    admitted_at: BTreeMap<String, Vec<u64>>,
    /// Σ acknowledged direct grants per window start.
    acknowledged: BTreeMap<u64, u64>,
    /// Failed checks or leases (transport errors, timeouts).
    errors: u64,
}

impl Tally {
    fn admit(&mut self, region: &str, window_start_ms: u64, at_ms: u64) {
        *self
            .admitted
            .entry(window_start_ms)
            .or_default()
            .entry(region.to_string())
            .or_default() += 1;
        self.admitted_at
            .entry(region.to_string())
            .or_default()
            .push(at_ms);
    }

    /// Windows whose Σ admitted over every region exceeds `limit`, with that Σ.
    fn over_limit(&self, limit: u64) -> Vec<(u64, u64)> {
        self.admitted
            .iter()
            .map(|(start, regions)| (*start, regions.values().sum::<u64>()))
            .filter(|(_, total)| *total > limit)
            .collect()
    }

    /// The longest stretch without an admission of `region` between
    /// `from_ms` and `to_ms` (the whole span when it admitted nothing).
    fn longest_gap_ms(&self, region: &str, from_ms: u64, to_ms: u64) -> u64 {
        let mut times = self.admitted_at.get(region).cloned().unwrap_or_default();
        times.sort_unstable();
        let mut longest = 0;
        let mut previous = from_ms;
        for at in times.into_iter().chain(std::iter::once(to_ms)) {
            longest = longest.max(at.saturating_sub(previous));
            previous = previous.max(at);
        }
        longest
    }
}

async fn load(args: LoadArgs) -> Result<()> {
    if args.limit == 0 || args.duration_secs == 0 || args.clients_per_escrow == 0 {
        bail!("--limit, --duration-secs and --clients-per-escrow must be at least 1");
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let start_ms = wall_now_ms();
    let end_ms = start_ms + args.duration_secs * 1_000;
    let mut tasks = Vec::new();
    for (region, addr) in &args.escrows {
        let dialer = args
            .certs
            .dialer(&format!("service-{}-{region}", args.service));
        for index in 0..args.clients_per_escrow {
            let mut nodes: Vec<&str> = addr.split(',').collect();
            let turn = index % nodes.len();
            nodes.rotate_left(turn);
            let source =
                EscrowSource::with_endpoints(nodes, dialer.clone(), EscrowSourceOptions::default())
                    .with_context(|| format!("escrow nodes {addr}"))?;
            let mode = Mode::Leased(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(8)));
            let client_id = ClientId::new(format!("load-{region}-{index}-{start_ms}"))?;
            let mut config = LimiterConfig::new(mode, client_id);
            config.call_timeout = Duration::from_secs(2);
            let limiter = Limiter::new(source, config)?;
            let (tally, region, key, pause) = (
                tally.clone(),
                region.clone(),
                args.key.clone(),
                Duration::from_millis(args.pause_ms),
            );
            tasks.push(tokio::spawn(async move {
                while wall_now_ms() < end_ms {
                    match limiter.check_labelled(&key, 1).await {
                        Ok(admission) => match admission.window_start_ms {
                            Some(window) if admission.decision.allowed => {
                                lock(&tally).admit(&region, window, wall_now_ms());
                                tokio::time::sleep(pause).await;
                            }
                            _ => {
                                let wait = admission.decision.retry_after_ms.clamp(5, 100);
                                tokio::time::sleep(Duration::from_millis(wait)).await;
                            }
                        },
                        Err(_) => {
                            lock(&tally).errors += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                }
            }));
        }
    }
    {
        let client = CoordinatorClient::with_options(
            &args.coordinator,
            args.certs.dialer(&format!("region-{}", args.kept_region)),
            RetryOptions {
                total_timeout: Duration::from_secs(5),
                ..RetryOptions::default()
            },
        )?;
        let (tally, key, region, interval) = (
            tally.clone(),
            args.kept_key.clone(),
            args.kept_region.clone(),
            Duration::from_millis(args.kept_interval_ms),
        );
        tasks.push(tokio::spawn(async move {
            while wall_now_ms() < end_ms {
                match client.lease(&key, &region, 1).await {
                    Ok(grant) => {
                        *lock(&tally)
                            .acknowledged
                            .entry(grant.window_start_ms)
                            .or_default() += grant.granted;
                    }
                    Err(_) => lock(&tally).errors += 1,
                }
                tokio::time::sleep(interval).await;
            }
        }));
    }
    for task in tasks {
        task.await.context("a load task panicked")?;
    }
    let tally = lock(&tally);
    report(&args, &tally, start_ms, end_ms)
}

fn lock(tally: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn report(args: &LoadArgs, tally: &Tally, start_ms: u64, end_ms: u64) -> Result<()> {
    for (window, regions) in &tally.admitted {
        let total: u64 = regions.values().sum();
        let per_region: Vec<String> = regions.iter().map(|(r, n)| format!("{r}={n}")).collect();
        println!(
            "window {window}: admitted {total:>5} of {} ({})",
            args.limit,
            per_region.join(" ")
        );
    }
    let mut failures = Vec::new();
    for (window, total) in tally.over_limit(args.limit) {
        failures.push(format!(
            "window {window} admitted {total} > L = {}",
            args.limit
        ));
    }
    for (region, _) in &args.escrows {
        let admitted: u64 = tally
            .admitted
            .values()
            .filter_map(|regions| regions.get(region))
            .sum();
        let gap = tally.longest_gap_ms(region, start_ms, end_ms);
        println!(
            "region {region}: admitted {admitted}, longest stretch without an admission {gap} ms"
        );
        if admitted == 0 {
            failures.push(format!(
                "nothing was admitted through the {region} escrow node"
            ));
        }
    }
    println!(
        "windows {}, most admitted in one window {} (L = {}), failed calls {}",
        tally.admitted.len(),
        tally
            .admitted
            .values()
            .map(|r| r.values().sum::<u64>())
            .max()
            .unwrap_or(0),
        args.limit,
        tally.errors
    );
    match tally.acknowledged.iter().max_by_key(|(_, tokens)| **tokens) {
        Some((window, tokens)) => {
            if tally.acknowledged.len() > 1 {
                println!(
                    "note: direct grants of {} span {} windows; the largest is checked",
                    args.kept_key,
                    tally.acknowledged.len()
                );
            }
            println!("ACKNOWLEDGED {} {window} {tokens}", args.kept_key);
        }
        None => failures.push(format!(
            "the coordinator acknowledged no direct lease of {}",
            args.kept_key
        )),
    }
    if failures.is_empty() {
        Ok(())
    } else {
        bail!(failures.join("; "))
    }
}

async fn verify(args: VerifyArgs) -> Result<()> {
    let client = CoordinatorClient::with_options(
        &args.coordinator,
        args.certs.dialer(&format!("region-{}", args.region)),
        RetryOptions::default(),
    )?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait_secs);
    let window = loop {
        match client.get_window(&args.key).await {
            Ok(window) => break window,
            Err(e) if tokio::time::Instant::now() >= deadline => {
                return Err(e).with_context(|| format!("reading the window of {}", args.key))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    };
    println!(
        "{}: window {} granted {} (limit {}); acknowledged before the restart: {} in window {}",
        args.key,
        window.window_start_ms,
        window.granted,
        window.limit,
        args.acknowledged,
        args.window_start_ms
    );
    kept_verdict(
        window.window_start_ms,
        window.granted,
        window.limit,
        args.window_start_ms,
        args.acknowledged,
    )
}

/// Whether a window read after the restart keeps every acknowledged grant:
/// the same window, Σ granted ≥ acknowledged, and Σ granted ≤ L.
fn kept_verdict(
    window_start_ms: u64,
    granted: u64,
    limit: u64,
    acknowledged_window_ms: u64,
    acknowledged: u64,
) -> Result<()> {
    if window_start_ms != acknowledged_window_ms {
        bail!(
            "the window moved on ({acknowledged_window_ms} → {window_start_ms}): \
             the acknowledged grants cannot be compared; run again"
        );
    }
    if granted < acknowledged {
        bail!("acknowledged grants lost: the window holds {granted} < {acknowledged} acknowledged");
    }
    if granted > limit {
        bail!("the window granted {granted} > L = {limit}");
    }
    Ok(())
}

/// OK answers per window start, and what else was seen.
#[derive(Debug, Default)]
struct RlsTally {
    ok: BTreeMap<u64, u64>,
    over_limit: u64,
    errors: u64,
    without_headers: u64,
}

async fn rls(args: RlsArgs) -> Result<()> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

    let (key, value) = args
        .entry
        .split_once('=')
        .context("--entry must be KEY=VALUE")?;
    if args.limit == 0 || args.window_ms == 0 || args.duration_secs == 0 {
        bail!("--limit, --window-ms and --duration-secs must be at least 1");
    }
    let request = RateLimitRequest {
        domain: args.domain.clone(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.to_string(),
                value: value.to_string(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    };
    let tally = Arc::new(Mutex::new(RlsTally::default()));
    let end = tokio::time::Instant::now() + Duration::from_secs(args.duration_secs);
    let mut tasks = Vec::new();
    for (region, addrs) in &args.escrows {
        let dialer = args
            .certs
            .dialer(&format!("service-{}-{region}", args.service));
        for addr in addrs.split(',') {
            let channel = dialer
                .dial(addr)
                .await
                .with_context(|| format!("dialing {addr}"))?;
            for _ in 0..args.callers_per_escrow {
                let mut client = RateLimitServiceClient::new(channel.clone());
                let (request, tally, window_ms) = (request.clone(), tally.clone(), args.window_ms);
                tasks.push(tokio::spawn(async move {
                    while tokio::time::Instant::now() < end {
                        let answer = client.should_rate_limit(request.clone()).await;
                        let at = wall_now_ms();
                        {
                            let mut tally = tally.lock().unwrap_or_else(|e| e.into_inner());
                            match answer.map(tonic::Response::into_inner) {
                                Ok(answer) => {
                                    if !answer
                                        .response_headers_to_add
                                        .iter()
                                        .any(|h| h.key == "x-ratelimit-limit")
                                    {
                                        tally.without_headers += 1;
                                    }
                                    if answer.overall_code == Code::Ok as i32 {
                                        let reset = answer
                                            .statuses
                                            .first()
                                            .and_then(|s| s.duration_until_reset)
                                            .map_or(0, |d| {
                                                d.seconds.max(0) as u64 * 1_000
                                                    + u64::from(d.nanos.max(0) as u32 / 1_000_000)
                                            });
                                        let start =
                                            leasehold_core::rls::answer::admitted_window_start(
                                                at, reset, window_ms,
                                            );
                                        *tally.ok.entry(start).or_default() += 1;
                                    } else {
                                        tally.over_limit += 1;
                                    }
                                }
                                Err(_) => tally.errors += 1,
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                }));
            }
        }
    }
    for task in tasks {
        task.await?;
    }
    let tally = tally.lock().unwrap_or_else(|e| e.into_inner());
    for (start, ok) in &tally.ok {
        println!("window {start}: {ok} OK of L = {}", args.limit);
    }
    let total: u64 = tally.ok.values().sum();
    println!(
        "RLS {total} OK, {} OVER_LIMIT, {} errors, {} without headers",
        tally.over_limit, tally.errors, tally.without_headers
    );
    rls_verdict(&tally, args.limit)
}

/// Fails on a window over `limit`, on no OK at all, and on answers without
/// the draft headers.
fn rls_verdict(tally: &RlsTally, limit: u64) -> Result<()> {
    if let Some((start, ok)) = tally.ok.iter().find(|(_, ok)| **ok > limit) {
        bail!("window {start}: {ok} OK answers > L = {limit}");
    }
    if tally.ok.is_empty() {
        bail!("no answer was OK");
    }
    if tally.without_headers > 0 {
        bail!("{} answers lacked x-ratelimit-limit", tally.without_headers);
    }
    Ok(())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let result = match Cli::parse().command {
        Command::Load(args) => load(args).await,
        Command::Verify(args) => verify(args).await,
        Command::Rls(args) => rls(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("FAIL: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rls_verdict_fails_over_the_limit_without_answers_or_headers() {
        let mut tally = RlsTally::default();
        assert!(rls_verdict(&tally, 10).is_err(), "no OK at all");
        tally.ok.insert(0, 10);
        tally.ok.insert(1_000, 3);
        assert!(rls_verdict(&tally, 10).is_ok());
        tally.ok.insert(2_000, 11);
        assert!(rls_verdict(&tally, 10).is_err(), "11 > 10");
        tally.ok.insert(2_000, 1);
        tally.without_headers = 1;
        assert!(rls_verdict(&tally, 10).is_err(), "headers missing");
    }

    #[test]
    fn a_window_over_the_limit_is_reported_with_its_sum_over_regions() {
        let mut tally = Tally::default();
        for _ in 0..6 {
            tally.admit("eu", 1_000, 1_100);
        }
        for _ in 0..5 {
            tally.admit("us", 1_000, 1_200);
        }
        tally.admit("us", 2_000, 2_100);
        assert_eq!(tally.over_limit(10), vec![(1_000, 11)]);
        assert!(tally.over_limit(11).is_empty());
    }

    #[test]
    fn the_longest_gap_covers_the_edges_of_the_run() {
        let mut tally = Tally::default();
        for at in [1_500, 1_600, 4_600] {
            tally.admit("eu", 1_000, at);
        }
        assert_eq!(tally.longest_gap_ms("eu", 1_000, 5_000), 3_000);
        assert_eq!(tally.longest_gap_ms("eu", 1_000, 9_000), 4_400);
        assert_eq!(tally.longest_gap_ms("us", 1_000, 5_000), 4_000);
    }

    #[test]
    fn a_lost_acknowledged_grant_fails_the_verdict() {
        assert!(kept_verdict(10, 50, 100, 10, 50).is_ok());
        assert!(kept_verdict(10, 60, 100, 10, 50).is_ok());
        assert!(kept_verdict(10, 49, 100, 10, 50).is_err());
        assert!(kept_verdict(10, 101, 100, 10, 50).is_err());
        assert!(kept_verdict(20, 50, 100, 10, 50).is_err());
    }

    #[test]
    fn escrow_arguments_name_a_region_and_an_address() {
        assert_eq!(
            parse_escrow("eu=escrow-eu:7200"),
            Ok(("eu".into(), "escrow-eu:7200".into()))
        );
        assert!(parse_escrow("escrow-eu:7200").is_err());
        assert!(parse_escrow("=x:1").is_err());
    }
}
