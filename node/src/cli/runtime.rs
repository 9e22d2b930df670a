//! How many tokio worker threads a command runs on (ADR 0016).
//!
//! A coordinator member's work is mostly serial — one Raft core, one state
//! machine, one log flusher — plus per-connection gRPC framing; `bench`
//! drives one or a few connections. On a 16-core host the tokio default
//! (one worker per core) made three members burn 179 µs of CPU per lease
//! at 256 single leases in flight where 4 workers each burnt 96 µs, for the same
//! throughput, because idle workers park and are woken for every task that
//! becomes ready; `bench` over one connection reached 40k single leases/s
//! on 4 workers and 31k on 16 (its HTTP/2 connection's shared state is
//! contended by every worker). So those two commands default to at most
//! [`DEFAULT_CAPPED_WORKERS`] workers; every other command keeps tokio's
//! default. The choice, most specific first:
//!
//! 1. `--worker-threads N` (or `LEASEHOLD_WORKER_THREADS`);
//! 2. `TOKIO_WORKER_THREADS`, tokio's own variable;
//! 3. the command's default: `min(cores, 4)` for `serve` and `bench`, the
//!    number of cores otherwise.

use std::num::NonZeroUsize;

use clap::Args;

/// The worker count `serve` and `bench` use by default on a host with more
/// cores than this.
pub const DEFAULT_CAPPED_WORKERS: usize = 4;

/// The global runtime flag of every command.
#[derive(Debug, Clone, Default, Args)]
pub struct RuntimeArgs {
    /// Tokio worker threads for this process (default: min(cores, 4) for
    /// `serve` and `bench`, one per core otherwise; `TOKIO_WORKER_THREADS`
    /// is honoured when this is unset; at most 1 024).
    #[arg(long, global = true, env = "LEASEHOLD_WORKER_THREADS")]
    pub worker_threads: Option<NonZeroUsize>,
}

/// Whether a command's default worker count is capped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerDefault {
    /// `min(cores, DEFAULT_CAPPED_WORKERS)`.
    Capped,
    /// One worker per core (tokio's default).
    PerCore,
}

/// The most worker threads a process may ask for (a typo such as
/// `--worker-threads 40000` is refused, not attempted).
pub const MAX_WORKER_THREADS: usize = 1_024;

/// Why [`worker_threads`] refused the flag or the environment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadWorkerThreads {
    /// `TOKIO_WORKER_THREADS` is not a whole number above 0.
    #[error("TOKIO_WORKER_THREADS must be a whole number above 0, got {0:?}")]
    NotANumber(String),
    /// More than [`MAX_WORKER_THREADS`].
    #[error("{asked} worker threads asked for ({by}); at most {MAX_WORKER_THREADS}")]
    TooMany {
        /// How many.
        asked: usize,
        /// Where: the flag or the variable.
        by: &'static str,
    },
}

/// The number of worker threads: the flag, else `TOKIO_WORKER_THREADS`
/// (`tokio_env`, its raw value), else the command's default on `cores`.
pub fn worker_threads(
    flag: Option<NonZeroUsize>,
    tokio_env: Option<&str>,
    default: WorkerDefault,
    cores: NonZeroUsize,
) -> Result<NonZeroUsize, BadWorkerThreads> {
    let within = |asked: NonZeroUsize, by| {
        if asked.get() > MAX_WORKER_THREADS {
            Err(BadWorkerThreads::TooMany {
                asked: asked.get(),
                by,
            })
        } else {
            Ok(asked)
        }
    };
    if let Some(n) = flag {
        return within(n, "--worker-threads");
    }
    if let Some(raw) = tokio_env {
        let n = raw
            .trim()
            .parse::<NonZeroUsize>()
            .map_err(|_| BadWorkerThreads::NotANumber(raw.to_string()))?;
        return within(n, "TOKIO_WORKER_THREADS");
    }
    Ok(match default {
        WorkerDefault::PerCore => cores,
        WorkerDefault::Capped => {
            cores.min(NonZeroUsize::new(DEFAULT_CAPPED_WORKERS).expect("the cap is above zero"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nz(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn members_and_bench_use_at_most_four_workers_by_default() {
        for (cores, expected) in [(1, 1), (2, 2), (4, 4), (16, 4), (64, 4)] {
            assert_eq!(
                worker_threads(None, None, WorkerDefault::Capped, nz(cores)),
                Ok(nz(expected))
            );
        }
        assert_eq!(
            worker_threads(None, None, WorkerDefault::PerCore, nz(16)),
            Ok(nz(16))
        );
    }

    #[test]
    fn tokio_variable_is_honoured_and_checked() {
        assert_eq!(
            worker_threads(None, Some("12"), WorkerDefault::Capped, nz(16)),
            Ok(nz(12))
        );
        for bad in ["0", "-1", "many", ""] {
            assert_eq!(
                worker_threads(None, Some(bad), WorkerDefault::Capped, nz(16)),
                Err(BadWorkerThreads::NotANumber(bad.to_string()))
            );
        }
        assert_eq!(
            worker_threads(None, Some("40000"), WorkerDefault::Capped, nz(16)),
            Err(BadWorkerThreads::TooMany {
                asked: 40_000,
                by: "TOKIO_WORKER_THREADS"
            })
        );
        assert_eq!(
            worker_threads(Some(nz(1_025)), None, WorkerDefault::Capped, nz(16)),
            Err(BadWorkerThreads::TooMany {
                asked: 1_025,
                by: "--worker-threads"
            })
        );
        assert_eq!(
            worker_threads(Some(nz(1_024)), None, WorkerDefault::Capped, nz(16)),
            Ok(nz(1_024))
        );
    }

    #[test]
    fn the_flag_is_global_and_serve_and_bench_are_capped() {
        use clap::Parser;
        let parse = |args: &[&str]| crate::cli::Cli::try_parse_from(args).unwrap();
        let bench = parse(&["leasehold", "bench", "--worker-threads", "3"]);
        assert_eq!(bench.runtime.worker_threads, Some(nz(3)));
        assert_eq!(bench.worker_default(), WorkerDefault::Capped);
        let before = parse(&["leasehold", "--worker-threads", "5", "serve", "--insecure"]);
        assert_eq!(before.runtime.worker_threads, Some(nz(5)));
        assert_eq!(before.worker_default(), WorkerDefault::Capped);
        let demo = parse(&["leasehold", "demo"]);
        assert_eq!(demo.runtime.worker_threads, None);
        assert_eq!(demo.worker_default(), WorkerDefault::PerCore);
        assert!(
            crate::cli::Cli::try_parse_from(["leasehold", "bench", "--worker-threads", "0"])
                .is_err()
        );
    }

    proptest! {
        #[test]
        fn the_flag_wins_and_the_default_never_exceeds_the_cores(
            flag in proptest::option::of(1usize..512),
            env in proptest::option::of(1usize..512),
            cores in 1usize..512,
            capped in any::<bool>(),
        ) {
            let default = if capped { WorkerDefault::Capped } else { WorkerDefault::PerCore };
            let env_text = env.map(|n| n.to_string());
            let chosen = worker_threads(flag.map(nz), env_text.as_deref(), default, nz(cores))
                .unwrap()
                .get();
            match (flag, env) {
                (Some(f), _) => prop_assert_eq!(chosen, f),
                (None, Some(e)) => prop_assert_eq!(chosen, e),
                (None, None) => {
                    prop_assert!(chosen <= cores);
                    if capped {
                        prop_assert_eq!(chosen, cores.min(DEFAULT_CAPPED_WORKERS));
                    } else {
                        prop_assert_eq!(chosen, cores);
                    }
                }
            }
        }
    }
}
