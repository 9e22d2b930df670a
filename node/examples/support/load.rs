//! What the comparison load generators (`redis_lease_load`,
//! `etcd_lease_load`) share: their command line and the latency
//! percentiles they print.

use std::time::Duration;

use anyhow::{bail, Context, Result};

/// One run: `in_flight` leases outstanding over one connection to `target`,
/// keys spread over `keys`, for `duration`.
pub struct LoadArgs {
    /// `host:port` of the system under load.
    pub target: String,
    /// Leases outstanding at once.
    pub in_flight: usize,
    /// Distinct keys.
    pub keys: u64,
    /// How long to run.
    pub duration: Duration,
    /// L per key per window.
    pub limit: u64,
    /// Window length.
    pub window_ms: u64,
    /// Tokens per lease.
    pub tokens: u64,
}

/// Reads `--<target_flag> HOST:PORT --in-flight N --keys N --duration-secs N
/// --limit N --window-ms N --tokens N` (each optional) from the process
/// arguments; `default_target` when the target is not given.
pub fn parse_load_args(target_flag: &str, default_target: &str) -> Result<LoadArgs> {
    let mut args = LoadArgs {
        target: default_target.into(),
        in_flight: 1,
        keys: 1_000,
        duration: Duration::from_secs(5),
        limit: 1 << 48,
        window_ms: 60_000,
        tokens: 1,
    };
    let mut words = std::env::args().skip(1);
    while let Some(flag) = words.next() {
        let value = words
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--in-flight" => args.in_flight = value.parse()?,
            "--keys" => args.keys = value.parse()?,
            "--duration-secs" => args.duration = Duration::from_secs(value.parse()?),
            "--limit" => args.limit = value.parse()?,
            "--window-ms" => args.window_ms = value.parse()?,
            "--tokens" => args.tokens = value.parse()?,
            other if other.strip_prefix("--") == Some(target_flag) => args.target = value,
            other => bail!("unknown flag {other}"),
        }
    }
    if args.in_flight == 0 || args.keys == 0 || args.window_ms == 0 {
        bail!("--in-flight, --keys and --window-ms must be at least 1");
    }
    Ok(args)
}

/// The `latency_ms` object of a report: p50, p90, p99 and max of
/// latencies sorted in µs, in ms.
pub fn latency_report(sorted_us: &[u64]) -> serde_json::Value {
    serde_json::json!({
        "p50": percentile_ms(sorted_us, 0.50),
        "p90": percentile_ms(sorted_us, 0.90),
        "p99": percentile_ms(sorted_us, 0.99),
        "max": percentile_ms(sorted_us, 1.0),
    })
}

/// The `q` quantile of latencies sorted in µs, in ms (nearest rank).
pub fn percentile_ms(sorted_us: &[u64], q: f64) -> f64 {
    if sorted_us.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted_us.len() as f64).ceil() as usize).clamp(1, sorted_us.len());
    sorted_us[rank - 1] as f64 / 1_000.0
}
