//! Deterministic simulations of the whole Leasehold system and the checks
//! that it keeps its promises whatever fails.
//!
//! # Layout
//! - [`history`]: what a run records (admissions with their key and window
//!   label, acknowledged grants, linearizable window reads, hostile
//!   clients' requests and answers, faults).
//! - [`invariants`]: one file per promise (Δ = 0, no forgotten grant,
//!   credits die with their window, exactly-once, hostile callers get
//!   refusals, liveness, utilisation), each unit-tested on synthetic
//!   histories that break it.
//! - [`plan`]: the plain data a run is described by (fleet shape, faults,
//!   scenario); `sim` runs them and `scenario` names them, so `scenario`
//!   depends on `sim` and not the reverse.
//! - [`sim`]: the turmoil fleet: real coordinator members on power-loss
//!   disks, real leased client limiters, hostile clients speaking the wire
//!   protocol directly, simulated network and clocks.
//! - [`scenario`]: the catalogue of named scenarios, seeded runs (on
//!   [`sim`]), reports.
//! - [`processes`]: the same checks against real `leasehold` processes on
//!   loopback (`kill -9`, `SIGSTOP` / `SIGCONT`, restarts, concurrent load).
//!
//! The `leasehold-chaos` binary runs scenarios across seeds and prints a
//! table; `docs/testing.md` explains how to run and replay.
#![deny(missing_docs)]

pub mod history;
pub mod invariants;
pub mod plan;
pub mod processes;
pub mod scenario;
pub mod sim;
