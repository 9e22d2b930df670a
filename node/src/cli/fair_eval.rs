//! `leasehold fair-eval`: the fair throttle's seeded evaluation (no cluster
//! needed). One service of capacity C per minute, one heavy hitter and many
//! modest Poisson callers, admitted first-come, through the throttle, and
//! through the throttle with idle capacity handed to throttled requests;
//! prints Jain's fairness index over admitted / max-min fair share, and
//! utilisation, one row per seed and policy.

use clap::Args;
use leasehold_core::fair_throttle::evaluation::{evaluate, AdmissionPolicy, EvaluationWorld};
use leasehold_core::fair_throttle::{FairThrottleConfig, LevelCombine};
use serde_json::json;

use super::error::CliError;
use super::output::{emit, OutputFormat};

/// Options of `leasehold fair-eval`.
#[derive(Debug, Clone, Args)]
pub struct FairEvalArgs {
    /// First seed of the simulation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// How many consecutive seeds to run.
    #[arg(long, default_value_t = 3)]
    pub seeds: u64,
    /// Simulated seconds per run.
    #[arg(long, default_value_t = 600)]
    pub duration_secs: u64,
    /// The service's capacity per minute (a token bucket).
    #[arg(long, default_value_t = 600.0)]
    pub capacity_per_min: f64,
    /// The bucket holds this many seconds of capacity.
    #[arg(long, default_value_t = 1.0)]
    pub burst_secs: f64,
    /// The heavy hitter's rate per minute.
    #[arg(long, default_value_t = 2000.0)]
    pub heavy_per_min: f64,
    /// How many modest callers.
    #[arg(long, default_value_t = 20)]
    pub modest_callers: u32,
    /// Least rate per minute of a modest caller.
    #[arg(long, default_value_t = 5.0)]
    pub modest_min_per_min: f64,
    /// Greatest rate per minute of a modest caller.
    #[arg(long, default_value_t = 30.0)]
    pub modest_max_per_min: f64,
    /// The heavy hitter takes a new identity every this many seconds.
    #[arg(long)]
    pub heavy_identity_secs: Option<f64>,
    /// Size the throttle to its population (a bucket per caller per level,
    /// `FairThrottleConfig::for_population`) instead of `--buckets`.
    #[arg(long)]
    pub population_sized: bool,
    /// Levels of the throttle.
    #[arg(long, default_value_t = FairThrottleConfig::default().levels)]
    pub levels: u32,
    /// Buckets per level.
    #[arg(long, default_value_t = FairThrottleConfig::default().buckets)]
    pub buckets: u32,
    /// Probability decay per second.
    #[arg(long, default_value_t = FairThrottleConfig::default().decay_per_sec)]
    pub decay_per_sec: f64,
    /// Seconds between rotations.
    #[arg(long, default_value_t = FairThrottleConfig::default().rotation_interval_ms / 1000)]
    pub rotation_secs: u64,
    /// Combine the levels by their mean instead of their min.
    #[arg(long)]
    pub mean: bool,
    /// Tokens kept for unthrottled callers when throttled requests use idle
    /// capacity (default: half the burst).
    #[arg(long)]
    pub idle_reserve: Option<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// Runs the evaluation and prints the table.
pub fn run(args: FairEvalArgs) -> Result<(), CliError> {
    let buckets = if args.population_sized {
        leasehold_core::fair_throttle::buckets_for_population(u64::from(args.modest_callers) + 1)
    } else {
        args.buckets
    };
    let config = FairThrottleConfig {
        levels: args.levels,
        buckets,
        decay_per_sec: args.decay_per_sec,
        rotation_interval_ms: args.rotation_secs.saturating_mul(1000),
        combine: if args.mean {
            LevelCombine::Mean
        } else {
            LevelCombine::Min
        },
        ..FairThrottleConfig::default()
    };
    config
        .validate()
        .map_err(|e| CliError::Usage(format!("throttle configuration: {e}")))?;
    let valid_rate = |r: f64| r.is_finite() && r >= 0.0;
    if !(valid_rate(args.capacity_per_min)
        && args.capacity_per_min > 0.0
        && valid_rate(args.burst_secs)
        && valid_rate(args.heavy_per_min)
        && valid_rate(args.modest_min_per_min)
        && valid_rate(args.modest_max_per_min)
        && args.modest_min_per_min <= args.modest_max_per_min
        && args.duration_secs > 0
        && args
            .heavy_identity_secs
            .is_none_or(|s| s.is_finite() && s > 0.0))
    {
        return Err(CliError::Usage(
            "rates must be finite and ≥ 0 (capacity > 0), modest min ≤ max, duration > 0, \
             --heavy-identity-secs > 0"
                .into(),
        ));
    }
    if args.idle_reserve.is_some_and(|r| !valid_rate(r)) {
        return Err(CliError::Usage(
            "--idle-reserve must be finite and ≥ 0".into(),
        ));
    }

    let mut rows = Vec::new();
    for seed in args.seed..args.seed.saturating_add(args.seeds.max(1)) {
        let world = EvaluationWorld {
            capacity_per_min: args.capacity_per_min,
            burst_secs: args.burst_secs,
            heavy_per_min: args.heavy_per_min,
            modest_callers: args.modest_callers,
            modest_per_min: (args.modest_min_per_min, args.modest_max_per_min),
            duration_secs: args.duration_secs,
            seed,
            heavy_identity_secs: args.heavy_identity_secs,
        };
        let policies = [
            AdmissionPolicy::FirstCome,
            AdmissionPolicy::Fair(config),
            AdmissionPolicy::FairWorkConserving {
                config,
                idle_reserve: args
                    .idle_reserve
                    .unwrap_or_else(|| world.burst_tokens() / 2.0),
            },
        ];
        for policy in policies {
            let report = evaluate(&world, &policy);
            rows.push(json!({
                "seed": seed,
                "policy": report.policy,
                "jain_all": report.jain_all(),
                "jain_within_share": report.jain_within_share(),
                "utilisation": report.utilisation(),
                "modest_satisfaction": report.modest_satisfaction(),
                "heavy_admitted_per_min": report.heavy_admitted_per_min(&world),
                "fair_denials": report.fair_denials,
                "idle_admissions": report.idle_admissions,
            }));
        }
    }

    let text = || {
        let mut out = format!(
            "{:>4}  {:<11} {:>9} {:>12} {:>11} {:>9} {:>10} {:>12} {:>10}\n",
            "seed",
            "policy",
            "jain(all)",
            "jain(≤share)",
            "utilisation",
            "modest %",
            "heavy/min",
            "fair-denied",
            "idle-admit"
        );
        for row in &rows {
            out.push_str(&format!(
                "{:>4}  {:<11} {:>9.3} {:>12.3} {:>10.2}% {:>8.1}% {:>10.1} {:>12} {:>10}\n",
                row["seed"].as_u64().unwrap_or(0),
                row["policy"].as_str().unwrap_or(""),
                row["jain_all"].as_f64().unwrap_or(0.0),
                row["jain_within_share"].as_f64().unwrap_or(0.0),
                row["utilisation"].as_f64().unwrap_or(0.0) * 100.0,
                row["modest_satisfaction"].as_f64().unwrap_or(0.0) * 100.0,
                row["heavy_admitted_per_min"].as_f64().unwrap_or(0.0),
                row["fair_denials"].as_u64().unwrap_or(0),
                row["idle_admissions"].as_u64().unwrap_or(0),
            ));
        }
        out.trim_end().to_string()
    };
    emit(args.output, json!({ "runs": rows }), text);
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::super::{Cli, Command};
    use super::*;

    fn parse(args: &[&str]) -> FairEvalArgs {
        let cli = Cli::try_parse_from(std::iter::once("leasehold").chain(args.iter().copied()))
            .expect("parses");
        let Command::FairEval(args) = cli.command else {
            panic!("parsed the wrong command")
        };
        args
    }

    #[test]
    fn runs_with_the_defaults_and_refuses_absurd_parameters() {
        assert!(run(parse(&[
            "fair-eval",
            "--seeds",
            "1",
            "--duration-secs",
            "30"
        ]))
        .is_ok());
        for bad in [
            &["fair-eval", "--levels", "0"][..],
            &["fair-eval", "--buckets", "0"],
            &["fair-eval", "--decay-per-sec", "NaN"],
            &["fair-eval", "--capacity-per-min", "0"],
            &["fair-eval", "--idle-reserve=-1"],
            &["fair-eval", "--heavy-identity-secs", "0"],
        ] {
            assert!(
                matches!(run(parse(bad)), Err(CliError::Usage(_))),
                "{bad:?}"
            );
        }
    }
}
