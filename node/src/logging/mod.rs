//! Logs of the `leasehold` binary: text or JSON lines on stderr, colour
//! only on a terminal, repeats of one callsite suppressed and summarised,
//! openraft's verbose lines kept out unless asked for, and (with an OTLP
//! endpoint) spans exported as traces.
//!
//! - [`repeats`]: the pure rate limiter per callsite (property-tested).
//! - [`suppress`]: the `tracing` filter around it and the summary thread.
//! - [`format`]: the text fields and JSON lines, values cut and escaped.
//!
//! [`init`] installs all of it as the process's subscriber; the
//! [`LogOptions`] come from the global flags `--log-format` and
//! `--otlp-endpoint` (see `docs/operations.md`, "Logs" and "Traces").

pub mod format;
pub mod repeats;
pub mod suppress;

use std::ffi::OsStr;

use clap::{Args, ValueEnum};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::telemetry::{self, Telemetry};
use repeats::RepeatPolicy;
use suppress::RepeatFilter;

/// What is logged when `RUST_LOG` is unset: warnings and errors of every
/// crate, and Leasehold's own lines from INFO up.
pub const DEFAULT_FILTER: &str = "warn,leasehold_node=info,leasehold=info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (coloured on a terminal).
    #[default]
    Text,
    /// One JSON object per line, never coloured.
    Json,
}

/// The global logging and tracing flags of every command.
#[derive(Debug, Clone, Default, Args)]
pub struct LogArgs {
    /// How log lines on stderr are written.
    #[arg(
        long,
        global = true,
        value_enum,
        env = "LEASEHOLD_LOG_FORMAT",
        default_value_t = LogFormat::Text
    )]
    pub log_format: LogFormat,
    /// Export spans as OpenTelemetry traces over OTLP/gRPC to this
    /// collector URL (e.g. http://otel-collector:4317); off when unset.
    #[arg(long, global = true, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
}

/// Everything [`init`] needs, already decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogOptions {
    /// Text or JSON.
    pub format: LogFormat,
    /// Whether text lines may carry ANSI colour.
    pub color: bool,
    /// The `EnvFilter` directives in force.
    pub directives: String,
    /// The OTLP collector, when traces are exported.
    pub otlp_endpoint: Option<String>,
}

impl LogOptions {
    /// The options for `args` in this process's environment (`RUST_LOG`,
    /// `NO_COLOR`, whether stderr is a terminal).
    pub fn from_environment(args: &LogArgs) -> Self {
        use std::io::IsTerminal;
        let rust_log = std::env::var("RUST_LOG").ok();
        let no_color = std::env::var_os("NO_COLOR");
        Self {
            format: args.log_format,
            color: use_color(
                args.log_format,
                std::io::stderr().is_terminal(),
                no_color.as_deref(),
            ),
            directives: filter_directives(rust_log.as_deref()),
            otlp_endpoint: args
                .otlp_endpoint
                .clone()
                .filter(|endpoint| !endpoint.trim().is_empty()),
        }
    }
}

/// Colour only for text written to a terminal, and never while `NO_COLOR`
/// is set to anything but the empty string (<https://no-color.org>).
pub fn use_color(format: LogFormat, stderr_is_terminal: bool, no_color: Option<&OsStr>) -> bool {
    let no_color_set = no_color.is_some_and(|value| !value.is_empty());
    format == LogFormat::Text && stderr_is_terminal && !no_color_set
}

/// The filter directives for `RUST_LOG` (or [`DEFAULT_FILTER`] without it).
/// openraft's own INFO and DEBUG lines (state dumps of several KB, a line
/// per heartbeat) stay off unless the directives name `openraft`; its
/// warnings and errors stay on (rate-limited), and Leasehold logs the
/// state changes that matter itself.
pub fn filter_directives(rust_log: Option<&str>) -> String {
    match rust_log.map(str::trim) {
        None | Some("") => DEFAULT_FILTER.to_string(),
        Some(directives) if directives.contains("openraft") => directives.to_string(),
        Some(directives) => format!("{directives},openraft=warn"),
    }
}

/// What must outlive the program's work: when dropped, writes the
/// summaries of lines still held back and flushes exported spans (see
/// [`Telemetry`]).
#[must_use = "dropping the guard stops trace export"]
pub struct LogGuard {
    telemetry: Option<Telemetry>,
    repeats: RepeatFilter,
    /// What [`init`] could not do as asked (a bad `RUST_LOG`, an unusable
    /// OTLP endpoint): the caller logs these once logging is up.
    pub warnings: Vec<String>,
}

impl LogGuard {
    /// Whether spans are exported (an OTLP endpoint is set).
    pub fn exports_traces(&self) -> bool {
        self.telemetry.is_some()
    }
}

impl Drop for LogGuard {
    fn drop(&mut self) {
        self.repeats.flush();
        if let Some(telemetry) = self.telemetry.take() {
            telemetry.shutdown();
        }
    }
}

/// Installs the process's subscriber: the log layer on stderr (filtered by
/// `options.directives`, repeats suppressed per [`RepeatPolicy::default`])
/// and, with an OTLP endpoint, the trace-export layer. Call it inside a
/// tokio runtime when exporting (the gRPC exporter runs on it). A bad
/// filter falls back to [`DEFAULT_FILTER`] and a bad endpoint to no
/// export, each with a warning in [`LogGuard::warnings`]; the error is
/// only that a subscriber was already installed.
pub fn init(options: &LogOptions) -> Result<LogGuard, String> {
    let mut warnings = Vec::new();
    let env_filter = EnvFilter::try_new(&options.directives).unwrap_or_else(|e| {
        warnings.push(format!(
            "RUST_LOG {:?} is not a valid filter ({e}); using {DEFAULT_FILTER:?}",
            options.directives
        ));
        EnvFilter::new(DEFAULT_FILTER)
    });
    let repeats = RepeatFilter::spawn(RepeatPolicy::default());
    let log_layer = match options.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(options.color)
            .fmt_fields(format::TextFields)
            .with_filter(repeats.clone())
            .with_filter(env_filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .event_format(format::JsonLines)
            .fmt_fields(format::TextFields)
            .with_filter(repeats.clone())
            .with_filter(env_filter)
            .boxed(),
    };
    telemetry::install_propagator();
    let telemetry = match &options.otlp_endpoint {
        None => None,
        Some(endpoint) => match Telemetry::otlp(endpoint) {
            Ok(telemetry) => Some(telemetry),
            Err(e) => {
                warnings.push(format!("traces are not exported: {e}"));
                None
            }
        },
    };
    let otel_layer = telemetry
        .as_ref()
        .map(|telemetry| telemetry::span_layer(telemetry.tracer()));
    tracing_subscriber::registry()
        .with(log_layer)
        .with(otel_layer)
        .try_init()
        .map_err(|e| format!("cannot install the log subscriber: {e}"))?;
    Ok(LogGuard {
        telemetry,
        repeats,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_for_text_on_a_terminal_without_no_color() {
        assert!(use_color(LogFormat::Text, true, None));
        assert!(!use_color(LogFormat::Text, false, None));
        assert!(!use_color(LogFormat::Json, true, None));
        assert!(!use_color(LogFormat::Text, true, Some(OsStr::new("1"))));
        assert!(
            use_color(LogFormat::Text, true, Some(OsStr::new(""))),
            "an empty NO_COLOR does not count"
        );
    }

    #[test]
    fn openraft_info_stays_off_unless_named() {
        assert_eq!(filter_directives(None), DEFAULT_FILTER);
        assert_eq!(filter_directives(Some(" ")), DEFAULT_FILTER);
        assert_eq!(filter_directives(Some("info")), "info,openraft=warn");
        assert_eq!(
            filter_directives(Some("info,openraft=debug")),
            "info,openraft=debug"
        );
        for directives in [filter_directives(Some("info")), DEFAULT_FILTER.into()] {
            assert!(EnvFilter::try_new(&directives).is_ok(), "{directives}");
        }
    }
}
