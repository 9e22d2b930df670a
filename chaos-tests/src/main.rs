//! `leasehold-chaos`: runs the simulated fleet through its fault scenarios
//! across seeds — or, with `--processes`, real `leasehold` processes on
//! loopback through theirs — prints a table, and exits non-zero on any
//! violation.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use leasehold_chaos::processes::{self, ProcessOptions};
use leasehold_chaos::scenario::{self, replay_command, ScenarioReport};
use leasehold_chaos::sim::Weakening;

/// Run Leasehold chaos scenarios and check its invariants.
/// `println!` that ends the process quietly (status 1: nothing verified
/// was reported) when stdout is gone, e.g. piped into `head`.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        if writeln!(std::io::stdout(), $($arg)*).is_err() {
            std::process::exit(1);
        }
    }};
}

#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Scenario name, or `all`.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// How many seeds per scenario.
    #[arg(long, default_value_t = 4)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    from_seed: u64,
    /// Spread the keys over this many shards (Raft groups) at setup, the
    /// load's key on the last one, in every scenario, simulated or with
    /// `--processes` (1: never sharded).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    shards: u32,
    /// List the scenarios and exit.
    #[arg(long)]
    list: bool,
    /// Deliberately break a safety mechanism, to see the suite catch it:
    /// `credits-outlive-window` or `ack-before-durable`.
    #[arg(long, value_parser = parse_weakening, default_value = "none")]
    weaken: Weakening,
    /// Print each run's faults and per-window admissions (use with one seed).
    #[arg(long)]
    verbose: bool,
    /// Run real `leasehold` processes on loopback (kill -9, SIGSTOP/SIGCONT,
    /// restarts) instead of the simulation; `--seeds` runs each scenario
    /// that many times.
    #[arg(long)]
    processes: bool,
    /// The `leasehold` binary for `--processes` (default: the one next to
    /// this executable).
    #[arg(long, requires = "processes")]
    binary: Option<PathBuf>,
    /// Seconds of load per run with `--processes`.
    #[arg(long, default_value_t = 12, requires = "processes")]
    load_secs: u64,
    /// Coordinator members with `--processes` (3 to 9; odd sizes tolerate
    /// the most failures).
    #[arg(long, default_value_t = 3, requires = "processes",
          value_parser = clap::value_parser!(u64).range(3..=9))]
    members: u64,
    /// With `--processes`: one-way delay (ms) on every link into a
    /// coordinator member (a delaying proxy in front of each), so a round
    /// trip between a region and the cluster, or between members, is twice
    /// this.
    #[arg(long, default_value_t = 0)]
    link_delay_ms: u64,
    /// With `--processes`: client limiters in the runner (default 4).
    #[arg(long, requires = "processes", value_parser = clap::value_parser!(u64).range(1..=512))]
    clients: Option<u64>,
    /// With `--processes`: the longest pause (ms) of a client after each
    /// admission (each pause drawn from 0 up to it; 1: as fast as it can,
    /// to saturate the host).
    #[arg(long, requires = "processes", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    client_pause_ms: Option<u64>,
    /// With `--processes`: L per window (default 300).
    #[arg(long)]
    limit: Option<u64>,
    /// With `--processes`: the window's length in ms, for every scenario
    /// (default: the scenario's own, else 1 000).
    #[arg(long)]
    window_ms: Option<u64>,
}

fn parse_weakening(s: &str) -> Result<Weakening, String> {
    match s {
        "none" => Ok(Weakening::None),
        "credits-outlive-window" => Ok(Weakening::CreditsOutliveWindow),
        "ack-before-durable" => Ok(Weakening::AcknowledgeBeforeDurable),
        other => Err(format!(
            "unknown weakening {other:?}: none, credits-outlive-window, ack-before-durable"
        )),
    }
}

/// What the hostile clients tried, for the scenarios that have them.
fn print_hostile_table(reports: &[ScenarioReport]) {
    let hostile: Vec<&ScenarioReport> = reports
        .iter()
        .filter(|r| r.hostile_probes_checked + r.sessions_flooded + r.over_returns > 0)
        .collect();
    if hostile.is_empty() {
        return;
    }
    out!(
        "{:<30} {:>15} {:>16} {:>12}",
        "hostile clients",
        "reused checked",
        "sessions flooded",
        "over-returns"
    );
    for r in hostile {
        out!(
            "{:<30} {:>15} {:>16} {:>12}",
            r.name,
            r.hostile_probes_checked,
            r.sessions_flooded,
            r.over_returns
        );
    }
}

fn print_table(reports: &[ScenarioReport]) {
    out!(
        "{:<30} {:>6} {:>8} {:>11} {:>11} {:>8} {:>11} {:>12}",
        "scenario",
        "seeds",
        "windows",
        "admissions",
        "duplicates",
        "max Σ/L",
        "violations",
        "utilisation"
    );
    for r in reports {
        out!(
            "{:<30} {:>6} {:>8} {:>11} {:>11} {:>8.3} {:>11} {:>11.1}%",
            r.name,
            r.seeds,
            r.windows_checked,
            r.admissions,
            r.duplicates_checked,
            r.max_ratio,
            r.violations.len(),
            r.utilisation * 100.0
        );
    }
}

/// The scenarios `wanted` names (`all`: every one), or exit status 2 after
/// naming the known ones.
fn select<S>(
    wanted: &str,
    all: Vec<S>,
    name: fn(&S) -> &'static str,
    kind: &str,
) -> Result<Vec<S>, ExitCode> {
    if wanted == "all" {
        return Ok(all);
    }
    let names: Vec<&str> = all.iter().map(name).collect();
    match all.into_iter().find(|s| name(s) == wanted) {
        Some(s) => Ok(vec![s]),
        None => {
            eprintln!("unknown {kind} {wanted:?}; known: {}", names.join(", "));
            Err(ExitCode::from(2))
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // `RUST_LOG=leasehold_node=info` (or any filter) prints what the
    // members and escrow nodes log, on stderr, with the simulated hosts'
    // spans.
    if let Ok(filter) = std::env::var("RUST_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    if args.processes {
        return run_processes(&args);
    }
    let scenarios = match select(&args.scenario, scenario::all(), |s| s.name, "scenario") {
        Ok(scenarios) => scenarios,
        Err(code) => return code,
    };
    let scenarios: Vec<_> = scenarios
        .into_iter()
        .map(|s| scenario::with_shards(s, args.shards))
        .collect();
    if args.list {
        for s in &scenarios {
            out!("{}", s.name);
        }
        return ExitCode::SUCCESS;
    }
    let mut reports = Vec::new();
    for s in &scenarios {
        if args.verbose {
            for seed in args.from_seed..args.from_seed + args.seeds {
                let outcome = leasehold_chaos::sim::run(s, seed, args.weaken);
                out!("{} seed {seed}:", s.name);
                for fault in &outcome.history.faults {
                    out!("  fault {fault}");
                }
                for (start, admitted) in outcome.history.admitted_per_window() {
                    out!(
                        "  window {start}: {admitted} admitted of {}",
                        outcome.history.limit
                    );
                }
            }
        }
        let report = scenario::run_seeds(s, args.seeds, args.from_seed, args.weaken);
        for (seed, v) in &report.violations {
            eprintln!(
                "VIOLATION {} seed {seed}: {}: {}",
                s.name, v.invariant, v.detail
            );
            eprintln!("  replay: {}", replay_command(s, *seed));
        }
        for (seed, e) in &report.errors {
            eprintln!("SIMULATION ERROR {} seed {seed}: {e}", s.name);
            eprintln!("  replay: {}", replay_command(s, *seed));
        }
        reports.push(report);
    }
    print_table(&reports);
    print_hostile_table(&reports);
    let failed = reports
        .iter()
        .any(|r| !r.violations.is_empty() || !r.errors.is_empty());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn run_processes(args: &Args) -> ExitCode {
    let scenarios = match select(
        &args.scenario,
        processes::scenarios(),
        |s| s.name,
        "process scenario",
    ) {
        Ok(scenarios) => scenarios,
        Err(code) => return code,
    };
    if args.list {
        for s in &scenarios {
            out!("{}", s.name);
        }
        return ExitCode::SUCCESS;
    }
    let Some(binary) = args.binary.clone().or_else(processes::sibling_binary) else {
        eprintln!("no leasehold binary next to this executable; pass --binary PATH");
        return ExitCode::from(2);
    };
    if args.weaken == Weakening::AcknowledgeBeforeDurable {
        eprintln!(
            "--weaken ack-before-durable needs the simulated disks; it has no --processes form"
        );
        return ExitCode::from(2);
    }
    let mut options = ProcessOptions::new(binary);
    options.load = Duration::from_secs(args.load_secs.max(1));
    options.members = args.members;
    options.link_delay_ms = args.link_delay_ms;
    options.shards = args.shards;
    if let Some(limit) = args.limit {
        options.limit = limit;
    }
    if let Some(clients) = args.clients {
        options.clients = usize::try_from(clients).unwrap_or(options.clients);
    }
    if let Some(pause) = args.client_pause_ms {
        options.client_pause_ms = (0, pause);
    }
    options.weakening = args.weaken;
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut reports = Vec::new();
    for s in &scenarios {
        let mut s = s.clone();
        if let Some(window_ms) = args.window_ms.filter(|w| *w > 0) {
            s.window_ms = Some(window_ms);
        }
        let s = &s;
        let mut report = ScenarioReport::new(s.name, args.seeds);
        for seed in args.from_seed..args.from_seed + args.seeds {
            match runtime.block_on(processes::run(s, &options, seed)) {
                Ok(outcome) => {
                    let history = &outcome.history;
                    if args.verbose {
                        out!("{} run {seed}:", s.name);
                        for fault in &history.faults {
                            out!("  fault {fault}");
                        }
                        for (start, admitted) in history.admitted_per_window() {
                            out!("  window {start}: {admitted} admitted of {}", history.limit);
                        }
                    }
                    let first_fault = s.faults.first().map_or(history.load_end_ms, |(at, _)| {
                        outcome.load_start_ms + u64::try_from(at.as_millis()).unwrap_or(0)
                    });
                    report.add_run(
                        seed,
                        history,
                        outcome.violations,
                        (outcome.load_start_ms + 1_000, first_fault),
                    );
                }
                Err(e) => report.errors.push((seed, format!("{e:#}"))),
            }
        }
        report.finish();
        for (seed, v) in &report.violations {
            eprintln!(
                "VIOLATION {} run {seed}: {}: {}",
                s.name, v.invariant, v.detail
            );
        }
        for (seed, e) in &report.errors {
            eprintln!("RUN ERROR {} run {seed}: {e}", s.name);
        }
        reports.push(report);
    }
    print_table(&reports);
    let failed = reports
        .iter()
        .any(|r| !r.violations.is_empty() || !r.errors.is_empty());
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
