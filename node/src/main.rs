//! The `leasehold` binary: parse the command line, set up logging (and
//! trace export), run the command from the library; on failure print what
//! went wrong and what to do (JSON on stdout under `--output json`) and exit
//! with the code of `cli::failure`.

use std::process::ExitCode;

use clap::Parser;
use leasehold_node::cli::output::OutputFormat;
use leasehold_node::cli::{failure, run, runtime, Cli};
use leasehold_node::logging::{self, LogOptions};

/// The process's allocator (ADR 0014: glibc's malloc was a sixth of a
/// member's CPU under load).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// How long a command exporting traces lets its tasks finish before the
/// exporter flushes at exit.
const TRACE_SETTLE: std::time::Duration = std::time::Duration::from_millis(100);

fn main() -> ExitCode {
    let cli = Cli::parse();
    let cores = std::thread::available_parallelism().unwrap_or(std::num::NonZeroUsize::MIN);
    let tokio_env = std::env::var("TOKIO_WORKER_THREADS").ok();
    let workers = match runtime::worker_threads(
        cli.runtime.worker_threads,
        tokio_env.as_deref(),
        cli.worker_default(),
        cores,
    ) {
        Ok(workers) => workers,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers.get())
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let options = LogOptions::from_environment(&cli.log);
    // The OTLP exporter is built inside the runtime it sends on.
    let guard = match runtime.block_on(async { logging::init(&options) }) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    for warning in &guard.warnings {
        tracing::warn!("{warning}");
    }
    let client_args = cli.command.client_args().cloned();
    let result = runtime.block_on(run(cli));
    if guard.exports_traces() {
        // A span closes when its last holder lets go, and a command's
        // spans can still be held by tasks it spawned (a connection's
        // request buffer): let them run before the exporter flushes, or a
        // busy machine exports a short command's trace without its spans.
        runtime.block_on(tokio::time::sleep(TRACE_SETTLE));
    }
    drop(guard);
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let endpoints = client_args
                .as_ref()
                .map(|a| a.endpoints.clone())
                .unwrap_or_default();
            let failure = failure::describe(&e, &endpoints);
            match client_args.map(|a| a.output) {
                Some(OutputFormat::Json) => println!("{}", failure.to_json()),
                _ => eprintln!("{}", failure.to_text()),
            }
            ExitCode::from(failure.exit_code)
        }
    }
}
