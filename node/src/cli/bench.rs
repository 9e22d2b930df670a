//! `leasehold bench`: N concurrent callers lease from one key for a fixed
//! time; prints leases per second, latency percentiles, errors, and the
//! longest stretch with no successful lease (what a client sees of a leader
//! failover when a member is killed during the run).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Args;
use leasehold_client::coordinator::{CoordinatorClient, LeaseItem};
use leasehold_client::lease_coalescer::LeaseCoalescer;
use leasehold_core::policy::{Policy, MAX_LIMIT};
use serde_json::json;
use tokio::time::Instant;

use super::args::ClientArgs;
use super::error::CliError;
use super::output::emit;

/// Options of `leasehold bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Concurrent callers.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// How long to run.
    #[arg(long, default_value_t = 10)]
    pub duration_secs: u64,
    /// The key to lease from (with `--keys`, the prefix of the keys).
    #[arg(long, default_value = "bench/key")]
    pub key: String,
    /// Spread the leases over this many keys (`KEY-0` … `KEY-{N-1}`, each
    /// caller walking them in turn) instead of one: a live window per key,
    /// to measure memory and disk against the number of live windows.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: u64,
    /// The region callers claim to be.
    #[arg(long, default_value = "bench")]
    pub region: String,
    /// Tokens per lease.
    #[arg(long, default_value_t = 1)]
    pub tokens: u64,
    /// Leases per call: above 1 each caller sends `LeaseBatch` calls of
    /// this many items (at most 64) and leases are counted per item.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub batch: u64,
    /// Send the callers' single leases through one lease coalescer per
    /// connection (what a `CoordinatorSource` does with strict checks):
    /// leases in flight together leave as `LeaseBatch` calls (4 out per
    /// connection, up to 16 when they are full); latency is then per
    /// lease. Not with `--batch`.
    #[arg(long, conflicts_with = "batch")]
    pub coalesce: bool,
    /// Client connections the callers share (default: up to 4).
    #[arg(long)]
    pub connections: Option<usize>,
    /// Do not set a policy for the key first (by default a policy with the
    /// key as prefix and a huge limit is set, so no lease is denied).
    #[arg(long)]
    pub no_setup: bool,
    /// Where to connect and how to print.
    #[command(flatten)]
    pub client: ClientArgs,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Successful leases.
    pub leases: u64,
    /// Calls that failed after the client's retries.
    pub errors: u64,
    /// Tokens granted in total.
    pub tokens_granted: u64,
    /// Wall time of the run.
    pub elapsed: Duration,
    /// Sorted latencies of successful calls (a `LeaseBatch` is one call),
    /// microseconds.
    pub latencies_us: Vec<u64>,
    /// Longest time without any successful lease, after the first one.
    pub longest_gap: Duration,
}

impl BenchReport {
    /// Successful leases per second.
    pub fn rate(&self) -> f64 {
        self.leases as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The `q`-quantile latency in milliseconds (nearest rank).
    pub fn percentile_ms(&self, q: f64) -> f64 {
        if self.latencies_us.is_empty() {
            return 0.0;
        }
        let rank = ((q * self.latencies_us.len() as f64).ceil() as usize)
            .clamp(1, self.latencies_us.len());
        self.latencies_us[rank - 1] as f64 / 1_000.0
    }
}

#[derive(Default)]
struct Shared {
    leases: u64,
    errors: u64,
    tokens: u64,
    last_success: Option<Instant>,
    longest_gap: Duration,
}

/// Runs the load and returns the measurements.
pub async fn measure(clients: Vec<CoordinatorClient>, args: &BenchArgs) -> BenchReport {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let started = Instant::now();
    let until = started + Duration::from_secs(args.duration_secs);
    let coalescers: Vec<Option<LeaseCoalescer>> = clients
        .iter()
        .map(|client| args.coalesce.then(|| LeaseCoalescer::spawn(client.clone())))
        .collect();
    let mut workers = Vec::new();
    for worker in 0..args.concurrency.max(1) {
        let client = clients[worker % clients.len()].clone();
        let coalescer = coalescers[worker % clients.len()].clone();
        let shared = shared.clone();
        let (key, region, tokens) = (args.key.clone(), args.region.clone(), args.tokens);
        let batch = usize::try_from(args.batch).unwrap_or(1).max(1);
        let keys = args.keys.max(1);
        let workers_count = args.concurrency.max(1) as u64;
        // Caller w leases KEY-w, KEY-(w + callers), ... so the callers
        // cover the keys between them without repeating each other.
        let mut next_key = worker as u64;
        let mut key_at = move || {
            if keys == 1 {
                return key.clone();
            }
            let chosen = format!("{key}-{}", next_key % keys);
            next_key = next_key.wrapping_add(workers_count);
            chosen
        };
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < until {
                let items: Vec<LeaseItem> = (0..batch)
                    .map(|_| LeaseItem {
                        key: key_at(),
                        region: region.clone(),
                        tokens,
                    })
                    .collect();
                let key = items[0].key.clone();
                let sent = Instant::now();
                // (items leased, tokens granted) of the call.
                let result = if let Some(coalescer) = &coalescer {
                    coalescer
                        .lease(&key, &region, tokens)
                        .await
                        .map(|response| (1, response.granted))
                } else if batch == 1 {
                    client
                        .lease(&key, &region, tokens)
                        .await
                        .map(|response| (1, response.granted))
                } else {
                    client.lease_batch(&items).await.and_then(|answers| {
                        answers
                            .into_iter()
                            .try_fold((0, 0), |(n, granted), answer| {
                                answer.map(|response| (n + 1, granted + response.granted))
                            })
                    })
                };
                let done = Instant::now();
                let failed = {
                    let mut shared = shared.lock().unwrap_or_else(|p| p.into_inner());
                    match result {
                        Ok((leased, granted)) => {
                            latencies
                                .push(u64::try_from((done - sent).as_micros()).unwrap_or(u64::MAX));
                            shared.leases += leased;
                            shared.tokens += granted;
                            if let Some(last) = shared.last_success {
                                let gap = done.saturating_duration_since(last);
                                shared.longest_gap = shared.longest_gap.max(gap);
                            }
                            shared.last_success =
                                Some(shared.last_success.map_or(done, |last| last.max(done)));
                            None
                        }
                        Err(error) => {
                            shared.errors += 1;
                            Some(error)
                        }
                    }
                };
                if let Some(error) = failed {
                    tracing::debug!(%error, "lease failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            latencies
        }));
    }
    let mut latencies_us = Vec::new();
    for worker in workers {
        if let Ok(mut latencies) = worker.await {
            latencies_us.append(&mut latencies);
        }
    }
    latencies_us.sort_unstable();
    let shared = shared.lock().unwrap_or_else(|p| p.into_inner());
    BenchReport {
        leases: shared.leases,
        errors: shared.errors,
        tokens_granted: shared.tokens,
        elapsed: started.elapsed(),
        latencies_us,
        longest_gap: shared.longest_gap,
    }
}

/// Runs `leasehold bench`.
pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    if args.concurrency == 0 || args.duration_secs == 0 || args.tokens == 0 {
        return Err(CliError::Usage(
            "--concurrency, --duration-secs and --tokens must be at least 1".into(),
        ));
    }
    let connections = args.connections.unwrap_or(args.concurrency.min(4)).max(1);
    let clients = (0..connections)
        .map(|_| args.client.client())
        .collect::<Result<Vec<_>, _>>()?;
    if !args.no_setup {
        let policy = Policy::counter(args.key.clone(), MAX_LIMIT, 60_000);
        clients[0].admin().set_policy(policy).await?;
    }
    let report = measure(clients, &args).await;
    let json = json!({
        "concurrency": args.concurrency,
        "batch": args.batch,
        "coalesce": args.coalesce,
        "keys": args.keys,
        "duration_secs": report.elapsed.as_secs_f64(),
        "leases": report.leases,
        "errors": report.errors,
        "tokens_granted": report.tokens_granted,
        "leases_per_sec": report.rate(),
        "latency_ms": {
            "p50": report.percentile_ms(0.50),
            "p90": report.percentile_ms(0.90),
            "p99": report.percentile_ms(0.99),
            "max": report.percentile_ms(1.0),
        },
        "longest_gap_ms": report.longest_gap.as_secs_f64() * 1_000.0,
    });
    emit(args.client.output, json, || {
        format!(
            "concurrency {}, batch {}, {:.1} s: {} leases ({:.0}/s), {} errors\nlatency ms per call: p50 {:.2}  p90 {:.2}  p99 {:.2}  max {:.2}\nlongest gap between successful leases: {:.1} ms",
            args.concurrency,
            args.batch,
            report.elapsed.as_secs_f64(),
            report.leases,
            report.rate(),
            report.errors,
            report.percentile_ms(0.50),
            report.percentile_ms(0.90),
            report.percentile_ms(0.99),
            report.percentile_ms(1.0),
            report.longest_gap.as_secs_f64() * 1_000.0,
        )
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let report = BenchReport {
            leases: 4,
            errors: 0,
            tokens_granted: 4,
            elapsed: Duration::from_secs(2),
            latencies_us: vec![1_000, 2_000, 3_000, 4_000],
            longest_gap: Duration::ZERO,
        };
        assert_eq!(report.percentile_ms(0.5), 2.0);
        assert_eq!(report.percentile_ms(0.99), 4.0);
        assert_eq!(report.percentile_ms(1.0), 4.0);
        assert_eq!(report.rate(), 2.0);
    }
}
