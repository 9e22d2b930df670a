//! The repeat-suppressing filter in front of the log writer: lines go
//! through one shared [`RepeatLimiter`] keyed by callsite and message
//! text (so "replication to member 2 lost" and "… member 3 lost" are
//! different lines, and a retry loop repeating one line is one key); a
//! background thread writes the "N similar lines suppressed" summaries
//! once per interval.
//!
//! What is limited: WARN and ERROR lines of every crate, and INFO lines of
//! other crates than Leasehold's (openraft's, when enabled). Leasehold's
//! own INFO lines are one per state change and are never suppressed, nor
//! are DEBUG and TRACE lines (whoever enables them wants them all), nor
//! the summaries themselves.
//!
//! Dropped outright: openraft WARN lines known to describe a harmless race
//! ([`BENIGN_OPENRAFT_WARNINGS`]) — say, a vote response that arrives
//! after its candidate already won — so a healthy cluster logs nothing at
//! WARN; `RUST_LOG=openraft=debug` shows openraft's own account of them.

use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use tracing::callsite::Identifier;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Metadata};
use tracing_subscriber::layer::{Context, Filter};

use super::repeats::{RepeatLimiter, RepeatPolicy, Summary, Verdict};

/// Target of the summary lines (never suppressed).
pub const SUMMARY_TARGET: &str = "leasehold::log_summary";

/// Longest sample of a suppressed line kept for its summary, in bytes.
const SAMPLE_BYTES: usize = 200;

/// A line as the limiter keys it (callsite and message text), with what
/// the summary says about it.
#[derive(Clone)]
struct CallsiteKey {
    id: Identifier,
    message: String,
    metadata: &'static Metadata<'static>,
}

impl PartialEq for CallsiteKey {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id && self.message == other.message
    }
}
impl Eq for CallsiteKey {}
impl std::hash::Hash for CallsiteKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
        self.message.hash(state);
    }
}

/// Whether lines of this level and target go through the limiter.
fn is_limited(metadata: &Metadata<'_>) -> bool {
    let level = *metadata.level();
    if metadata.target() == SUMMARY_TARGET || level > Level::INFO {
        return false;
    }
    level < Level::INFO || !metadata.target().starts_with("leasehold")
}

/// Beginnings of openraft WARN messages that describe a harmless race, not
/// a fault: a vote response or request that arrives after the vote it
/// answers changed (every election with three members answering at once).
pub const BENIGN_OPENRAFT_WARNINGS: &[&str] = &["A message will be ignored because vote changed"];

/// Whether a line of `target` at `level` with `message` is a known
/// harmless openraft warning (see [`BENIGN_OPENRAFT_WARNINGS`]).
pub fn is_benign(target: &str, level: Level, message: &str) -> bool {
    level == Level::WARN
        && target.starts_with("openraft")
        && BENIGN_OPENRAFT_WARNINGS
            .iter()
            .any(|start| message.starts_with(start))
}

type SharedLimiter = Arc<Mutex<RepeatLimiter<CallsiteKey>>>;

/// The per-layer filter that suppresses repeats (see the module doc).
#[derive(Clone)]
pub struct RepeatFilter {
    limiter: SharedLimiter,
    started: Instant,
}

impl RepeatFilter {
    /// A filter with `policy`, and the thread that writes its summaries
    /// every `policy.interval_ms` (it ends when the filter is dropped).
    pub fn spawn(policy: RepeatPolicy) -> Self {
        let filter = Self {
            limiter: Arc::new(Mutex::new(RepeatLimiter::new(policy))),
            started: Instant::now(),
        };
        let weak = Arc::downgrade(&filter.limiter);
        let started = filter.started;
        let interval = Duration::from_millis(policy.interval_ms.max(1));
        let spawned = std::thread::Builder::new()
            .name("log-summaries".into())
            .spawn(move || write_summaries(weak, started, interval));
        if let Err(e) = spawned {
            eprintln!("warning: repeated log lines will be suppressed without summaries: {e}");
        }
        filter
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Writes the summaries of what is still held back (at exit, so no
    /// count is lost).
    pub fn flush(&self) {
        let now = self.now_ms();
        let summaries = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain_summaries(now);
        for summary in summaries {
            write_summary(&summary, now);
        }
    }
}

impl<S> Filter<S> for RepeatFilter {
    fn enabled(&self, _: &Metadata<'_>, _: &Context<'_, S>) -> bool {
        true
    }

    fn event_enabled(&self, event: &Event<'_>, _: &Context<'_, S>) -> bool {
        let metadata = event.metadata();
        if !is_limited(metadata) {
            return true;
        }
        let message = message_of(event);
        if is_benign(metadata.target(), *metadata.level(), &message) {
            return false;
        }
        let key = CallsiteKey {
            id: metadata.callsite(),
            message,
            metadata,
        };
        let now = self.now_ms();
        let verdict = self
            .limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observe(&key, now, || key.message.clone());
        verdict == Verdict::Write
    }
}

/// The message of `event` (or its first field), cut to [`SAMPLE_BYTES`].
fn message_of(event: &Event<'_>) -> String {
    struct Message(String, bool);
    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}");
                self.1 = true;
            } else if !self.1 && self.0.is_empty() {
                self.0 = format!("{}={value:?}", field.name());
            }
        }
    }
    let mut message = Message(String::new(), false);
    event.record(&mut message);
    super::format::truncate(&mut message.0, SAMPLE_BYTES);
    message.0
}

fn write_summaries(
    limiter: Weak<Mutex<RepeatLimiter<CallsiteKey>>>,
    started: Instant,
    every: Duration,
) {
    loop {
        std::thread::sleep(every);
        let Some(limiter) = limiter.upgrade() else {
            return;
        };
        let now = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let summaries = limiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain_summaries(now);
        drop(limiter);
        for summary in summaries {
            write_summary(&summary, now);
        }
    }
}

fn write_summary(summary: &Summary<CallsiteKey>, now_ms: u64) {
    let metadata = summary.key.metadata;
    let seconds = now_ms
        .saturating_sub(summary.since_ms)
        .div_ceil(1_000)
        .max(1);
    let location = format!(
        "{}:{}",
        metadata.file().unwrap_or("?"),
        metadata.line().unwrap_or(0)
    );
    macro_rules! summary_line {
        ($level:expr) => {
            tracing::event!(
                target: SUMMARY_TARGET,
                $level,
                suppressed = summary.suppressed,
                seconds,
                of_target = metadata.target(),
                of_level = %metadata.level(),
                callsite = %location,
                last = %summary.sample,
                "{} similar log lines suppressed in the last {} s",
                summary.suppressed,
                seconds
            )
        };
    }
    match *metadata.level() {
        Level::ERROR | Level::WARN => summary_line!(Level::WARN),
        _ => summary_line!(Level::INFO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Subscriber;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;

    /// Counts the events the filtered layer lets through.
    #[derive(Clone, Default)]
    struct Written(Arc<Mutex<Vec<String>>>);

    impl<S: Subscriber> tracing_subscriber::Layer<S> for Written {
        fn on_event(&self, event: &Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
            self.0.lock().unwrap().push(message_of(event));
        }
    }

    #[test]
    fn benign_openraft_races_are_dropped_and_nothing_else() {
        let written = Written::default();
        let filter = RepeatFilter::spawn(RepeatPolicy::default());
        let subscriber =
            tracing_subscriber::registry().with(written.clone().with_filter(filter.clone()));
        let race = "A message will be ignored because vote changed: msg sent by vote: T1-N1:committed; current my vote: None; when (VoteResponse)";
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(target: "openraft::core::raft_core", "{race}");
            tracing::warn!(target: "leasehold_node::coordinator", "{race}");
            tracing::error!(target: "openraft::core::raft_core", "{race}");
            tracing::warn!(target: "openraft::core::raft_core", "Timeout expired");
        });
        let lines = written.0.lock().unwrap().clone();
        assert_eq!(
            lines.len(),
            3,
            "only the openraft WARN race is dropped: {lines:?}"
        );
        assert!(is_benign("openraft::core::raft_core", Level::WARN, race));
        assert!(!is_benign("openraft::core::raft_core", Level::ERROR, race));
        assert!(!is_benign("leasehold_node", Level::WARN, race));
    }

    #[test]
    fn repeats_are_cut_per_message_and_own_info_lines_pass() {
        let written = Written::default();
        let filter = RepeatFilter::spawn(RepeatPolicy {
            burst: 2,
            interval_ms: 60_000,
        });
        let subscriber =
            tracing_subscriber::registry().with(written.clone().with_filter(filter.clone()));
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..50 {
                for peer in [2, 3] {
                    tracing::warn!(target: "openraft::replication", "error replication to target={peer}");
                }
                tracing::info!(target: "leasehold_node::escrow", "escrow node serving");
                tracing::debug!(target: "openraft::replication", "heartbeat");
            }
        });
        let lines = written.0.lock().unwrap().clone();
        let count = |text: &str| lines.iter().filter(|l| l.as_str() == text).count();
        assert_eq!(count("error replication to target=2"), 2);
        assert_eq!(count("error replication to target=3"), 2);
        assert_eq!(
            count("escrow node serving"),
            50,
            "Leasehold's own INFO lines are not limited"
        );
        assert_eq!(count("heartbeat"), 50, "DEBUG lines are not limited");
        let pending: u64 = filter
            .limiter
            .lock()
            .unwrap()
            .drain_summaries(0)
            .iter()
            .map(|summary| summary.suppressed)
            .sum();
        assert_eq!(
            pending, 96,
            "every suppressed line is counted for its summary"
        );
    }
}
