//! The fair throttle at 1 000, 10 000 and 100 000 callers: every modest
//! caller at 6 requests a minute, one heavy hitter sending a tenth of
//! their total, capacity 95% of the modest demand; the heavy hitter keeps
//! one identity or takes a new one every 5 s. First-come admission, the
//! throttle with its default geometry (3 × 1 000 cells) and the throttle
//! sized to its population (`FairThrottleConfig::for_population`: 3 × N
//! cells), each using idle capacity (reserve: half the 1 s burst).
//!
//! `cargo run -p leasehold-core --release --example fair_scale [SECONDS]`
//! (default 300 simulated seconds per run; docs/fair-throttle.md).

use leasehold_core::fair_throttle::evaluation::{evaluate, AdmissionPolicy, EvaluationWorld};
use leasehold_core::fair_throttle::FairThrottleConfig;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: u64 = match std::env::args().nth(1) {
        Some(s) => s.parse()?,
        None => 300,
    };
    println!(
        "| callers | heavy identity | policy | cells | memory | modest % of demand | heavy % of demand | Jain (all) |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for callers in [1_000u32, 10_000, 100_000] {
        let modest_per_min = 6.0;
        let modest_total = f64::from(callers) * modest_per_min;
        for identity in [None, Some(5.0)] {
            let world = EvaluationWorld {
                capacity_per_min: 0.95 * modest_total,
                burst_secs: 1.0,
                heavy_per_min: 0.1 * modest_total,
                modest_callers: callers,
                modest_per_min: (modest_per_min, modest_per_min),
                duration_secs: seconds,
                seed: 1,
                heavy_identity_secs: identity,
            };
            let idle_reserve = world.burst_tokens() / 2.0;
            let sized = FairThrottleConfig::for_population(u64::from(callers))?;
            let policies = [
                ("first-come", None),
                ("fair, default", Some(FairThrottleConfig::default())),
                ("fair, sized", Some(sized)),
            ];
            for (name, config) in policies {
                let policy = match config {
                    None => AdmissionPolicy::FirstCome,
                    Some(config) => AdmissionPolicy::FairWorkConserving {
                        config,
                        idle_reserve,
                    },
                };
                let report = evaluate(&world, &policy);
                let heavy = report.callers[0];
                let (cells, memory) = match config {
                    None => ("-".to_string(), "-".to_string()),
                    Some(c) => (
                        format!("{} × {}", c.levels, c.buckets),
                        format!(
                            "{} KB",
                            2 * u64::from(c.levels) * u64::from(c.buckets) * 16 / 1000
                        ),
                    ),
                };
                println!(
                    "| {callers} | {} | {name} | {cells} | {memory} | {:.1}% | {:.1}% | {:.3} |",
                    match identity {
                        None => "one".to_string(),
                        Some(s) => format!("new every {s} s"),
                    },
                    100.0 * report.modest_satisfaction(),
                    100.0 * heavy.admitted as f64 / heavy.demand.max(1) as f64,
                    report.jain_all(),
                );
            }
        }
    }
    Ok(())
}
