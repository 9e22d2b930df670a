//! Prometheus metrics without a metrics crate: the text exposition format
//! (version 0.0.4) and a lock-free fixed-bucket [`Histogram`]. Shared by
//! the node's `/metrics` endpoint and the client crate, so a service that
//! embeds the client exports the same kinds of series under the same rules.
//! Callers keep labels bounded (per policy prefix, reason or state — never
//! per key, tenant or caller).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// The kind of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only ever increases (name ends in `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations counted into buckets (`_bucket`, `_sum`, `_count`).
    Histogram,
}

/// A document in the Prometheus text exposition format (version 0.0.4).
#[derive(Debug, Default)]
pub struct Exposition {
    text: String,
}

impl Exposition {
    /// An empty document.
    pub fn new() -> Self {
        Self::default()
    }

    /// Starts a family: its `# HELP` and `# TYPE` lines. Samples of it
    /// follow through [`Exposition::sample`].
    pub fn family(&mut self, name: &str, kind: MetricKind, help: &str) {
        debug_assert!(is_metric_name(name), "{name}");
        let kind = match kind {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.text, "# HELP {name} {help}");
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    /// One sample of the current family.
    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.text.push_str(name);
        if !labels.is_empty() {
            self.text.push('{');
            for (i, (label, value)) in labels.iter().enumerate() {
                if i > 0 {
                    self.text.push(',');
                }
                let _ = write!(self.text, "{label}=\"{}\"", escape_label_value(value));
            }
            self.text.push('}');
        }
        let _ = writeln!(self.text, " {}", format_value(value));
    }

    /// A family with one unlabelled sample.
    pub fn single(&mut self, name: &str, kind: MetricKind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    /// A histogram family: one `_bucket` sample per bound (cumulative,
    /// `le` in the histogram's unit scaled by `scale`, e.g. 1e-6 for
    /// microseconds shown as seconds) and `+Inf`, then `_sum` and `_count`.
    pub fn histogram(&mut self, name: &str, help: &str, snapshot: &HistogramSnapshot, scale: f64) {
        self.family(name, MetricKind::Histogram, help);
        self.histogram_series(name, &[], snapshot, scale);
    }

    /// The samples of one labelled series of a histogram family already
    /// started with [`Exposition::family`].
    pub fn histogram_series(
        &mut self,
        name: &str,
        labels: &[(&str, &str)],
        snapshot: &HistogramSnapshot,
        scale: f64,
    ) {
        let bucket = format!("{name}_bucket");
        let mut cumulative = 0;
        for (bound, count) in snapshot.bounds.iter().zip(&snapshot.counts) {
            cumulative += count;
            let le = format_value(*bound as f64 * scale);
            let mut with_le = labels.to_vec();
            with_le.push(("le", &le));
            self.sample(&bucket, &with_le, cumulative as f64);
        }
        let mut with_le = labels.to_vec();
        with_le.push(("le", "+Inf"));
        self.sample(&bucket, &with_le, snapshot.count as f64);
        self.sample(&format!("{name}_sum"), labels, snapshot.sum as f64 * scale);
        self.sample(&format!("{name}_count"), labels, snapshot.count as f64);
    }

    /// The document.
    pub fn finish(self) -> String {
        self.text
    }
}

/// Whether `name` is a valid Prometheus metric name.
pub fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

/// A label value with `\`, `"` and newlines escaped.
pub fn escape_label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

fn format_value(value: f64) -> String {
    if value.is_nan() {
        "NaN".into()
    } else if value.is_infinite() {
        if value > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if value.fract() == 0.0 && value.abs() < 9.007_199_254_740_992e15 {
        format!("{}", value as i64)
    } else {
        format!("{value}")
    }
}

/// Latency bucket bounds in microseconds: 100 µs to 10 s.
pub const LATENCY_BOUNDS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000,
];

/// Size bucket bounds (batch sizes, counts): powers of two to 1 024.
pub const SIZE_BOUNDS: &[u64] = &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1_024];

/// Observations counted into fixed buckets with relaxed atomics: recording
/// is a few uncontended adds, reading is a snapshot that may be torn by
/// concurrent records (each count is exact on its own; Prometheus
/// tolerates the skew between `_count` and the buckets within a scrape).
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One per bound, then the overflow bucket.
    counts: Box<[AtomicU64]>,
    sum: AtomicU64,
    count: AtomicU64,
}

/// What a [`Histogram`] held when read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Upper bounds (inclusive) of the finite buckets, ascending.
    pub bounds: &'static [u64],
    /// Observations per finite bucket (not cumulative).
    pub counts: Vec<u64>,
    /// Observations above the last bound.
    pub overflow: u64,
    /// Σ of every observation (saturating).
    pub sum: u64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending upper bounds).
    pub fn new(bounds: &'static [u64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
            count: AtomicU64::new(0),
        }
    }

    /// A latency histogram over [`LATENCY_BOUNDS_US`] (record microseconds).
    pub fn latency() -> Self {
        Self::new(LATENCY_BOUNDS_US)
    }

    /// Counts one observation.
    pub fn record(&self, value: u64) {
        let bucket = self.bounds.partition_point(|bound| *bound < value);
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |sum| {
                Some(sum.saturating_add(value))
            });
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one duration, in microseconds.
    pub fn record_duration(&self, elapsed: std::time::Duration) {
        self.record(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
    }

    /// The counts as of now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let counts: Vec<u64> = self
            .counts
            .iter()
            .map(|count| count.load(Ordering::Relaxed))
            .collect();
        let (finite, overflow) = counts.split_at(self.bounds.len());
        HistogramSnapshot {
            bounds: self.bounds,
            counts: finite.to_vec(),
            overflow: overflow[0],
            sum: self.sum.load(Ordering::Relaxed),
            count: self.count.load(Ordering::Relaxed),
        }
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::latency()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn families_render_help_type_and_samples() {
        let mut doc = Exposition::new();
        doc.family("leasehold_x_total", MetricKind::Counter, "Things.");
        doc.sample("leasehold_x_total", &[("prefix", "a/\"b\"")], 3.0);
        doc.single("leasehold_y", MetricKind::Gauge, "A level.", 0.5);
        let text = doc.finish();
        assert_eq!(
            text,
            "# HELP leasehold_x_total Things.\n# TYPE leasehold_x_total counter\n\
             leasehold_x_total{prefix=\"a/\\\"b\\\"\"} 3\n\
             # HELP leasehold_y A level.\n# TYPE leasehold_y gauge\nleasehold_y 0.5\n"
        );
    }

    #[test]
    fn a_histogram_renders_cumulative_buckets_sum_and_count() {
        let histogram = Histogram::new(&[10, 100]);
        for value in [5, 10, 11, 1_000] {
            histogram.record(value);
        }
        let mut doc = Exposition::new();
        doc.histogram("h_seconds", "Latency.", &histogram.snapshot(), 1e-3);
        assert_eq!(
            doc.finish(),
            "# HELP h_seconds Latency.\n# TYPE h_seconds histogram\n\
             h_seconds_bucket{le=\"0.01\"} 2\n\
             h_seconds_bucket{le=\"0.1\"} 3\n\
             h_seconds_bucket{le=\"+Inf\"} 4\n\
             h_seconds_sum 1.026\n\
             h_seconds_count 4\n"
        );
    }

    proptest! {
        /// Whatever a label value holds, the sample stays one line whose
        /// quoted value unescapes back to it.
        #[test]
        fn any_label_value_stays_on_one_line_and_round_trips(value in ".{0,40}") {
            let mut doc = Exposition::new();
            doc.sample("m", &[("l", &value)], 1.0);
            let text = doc.finish();
            prop_assert_eq!(text.matches('\n').count(), 1);
            let quoted = text.strip_prefix("m{l=\"").and_then(|t| t.strip_suffix("\"} 1\n"));
            let quoted = quoted.expect("sample shape");
            let mut unescaped = String::new();
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                if c == '\\' {
                    match chars.next() {
                        Some('n') => unescaped.push('\n'),
                        Some(other) => unescaped.push(other),
                        None => prop_assert!(false, "dangling escape"),
                    }
                } else {
                    prop_assert!(c != '"', "unescaped quote");
                    unescaped.push(c);
                }
            }
            prop_assert_eq!(unescaped, value);
        }

        /// Whatever is recorded, each observation lands in exactly one
        /// bucket: the first whose bound is at least the value.
        #[test]
        fn every_observation_lands_in_its_bucket(values in proptest::collection::vec(any::<u64>(), 0..200)) {
            let histogram = Histogram::latency();
            for value in &values {
                histogram.record(*value);
            }
            let snapshot = histogram.snapshot();
            prop_assert_eq!(snapshot.count, values.len() as u64);
            prop_assert_eq!(snapshot.counts.iter().sum::<u64>() + snapshot.overflow, snapshot.count);
            let expected_sum = values.iter().fold(0u64, |sum, v| sum.saturating_add(*v));
            prop_assert_eq!(snapshot.sum, expected_sum);
            for (i, bound) in LATENCY_BOUNDS_US.iter().enumerate() {
                let lower = if i == 0 { 0 } else { LATENCY_BOUNDS_US[i - 1] + 1 };
                let expected = values.iter().filter(|v| (lower..=*bound).contains(*v)).count() as u64;
                prop_assert_eq!(snapshot.counts[i], expected, "bucket le={}", bound);
            }
        }
    }
}
