//! Repeat suppression, as pure logic: which log lines of one callsite get
//! written and how many were held back since the last summary.
//!
//! A [`RepeatLimiter`] counts the lines of each key (in the binary: a
//! `tracing` callsite) in fixed windows of [`RepeatPolicy::interval_ms`]
//! starting at the key's first line: the first [`RepeatPolicy::burst`]
//! lines of a window are written, the rest are suppressed and counted.
//! [`RepeatLimiter::drain_summaries`] hands out, once per key, how many
//! lines were suppressed since the previous drain (with the last of them as
//! a sample), so a flood becomes a few lines plus one "N similar lines
//! suppressed" line per interval. Time comes in as an argument.
//!
//! Laws (property-tested below):
//! - at most `burst` lines of a key are written per window, so at most
//!   `2 · burst` in any span of `interval_ms`;
//! - nothing is lost from the count: for every key, written + suppressed
//!   = observed, and Σ drained + still pending = suppressed;
//! - a key seen at most once per `interval_ms` is never suppressed;
//! - keys do not affect each other.

use std::collections::HashMap;
use std::hash::Hash;

/// How much of a repeating line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatPolicy {
    /// Lines of one key written per window (at least 1).
    pub burst: u32,
    /// Length of a window, milliseconds (at least 1).
    pub interval_ms: u64,
}

impl Default for RepeatPolicy {
    /// One line per key per 30 s: a member that is down costs each of
    /// openraft's retry lines its first occurrence and then one summary
    /// per 30 s.
    fn default() -> Self {
        Self {
            burst: 1,
            interval_ms: 30_000,
        }
    }
}

/// Whether one line is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Write it.
    Write,
    /// Hold it back; it is counted for the next summary.
    Suppress,
}

/// How many lines of one key were suppressed since the previous drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary<K> {
    /// The key (callsite).
    pub key: K,
    /// Lines suppressed since the previous summary of this key.
    pub suppressed: u64,
    /// The last suppressed line, as the caller described it.
    pub sample: String,
    /// When the first of them was suppressed (ms, the caller's clock).
    pub since_ms: u64,
}

#[derive(Debug, Clone)]
struct Entry {
    window_start_ms: u64,
    written_in_window: u32,
    pending: u64,
    pending_since_ms: u64,
    sample: String,
    last_seen_ms: u64,
}

/// Per-key windows and suppressed counts (see the module doc).
#[derive(Debug, Clone)]
pub struct RepeatLimiter<K> {
    policy: RepeatPolicy,
    entries: HashMap<K, Entry>,
}

impl<K: Hash + Eq + Clone> RepeatLimiter<K> {
    /// A limiter with `policy` (a zero burst or interval counts as 1).
    pub fn new(policy: RepeatPolicy) -> Self {
        Self {
            policy: RepeatPolicy {
                burst: policy.burst.max(1),
                interval_ms: policy.interval_ms.max(1),
            },
            entries: HashMap::new(),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> RepeatPolicy {
        self.policy
    }

    /// Decides one line of `key` at `now_ms`; `sample` describes the line
    /// and is called only when the line is suppressed.
    pub fn observe(&mut self, key: &K, now_ms: u64, sample: impl FnOnce() -> String) -> Verdict {
        let policy = self.policy;
        let entry = self.entries.entry(key.clone()).or_insert(Entry {
            window_start_ms: now_ms,
            written_in_window: 0,
            pending: 0,
            pending_since_ms: now_ms,
            sample: String::new(),
            last_seen_ms: now_ms,
        });
        entry.last_seen_ms = entry.last_seen_ms.max(now_ms);
        if now_ms >= entry.window_start_ms.saturating_add(policy.interval_ms) {
            entry.window_start_ms = now_ms;
            entry.written_in_window = 0;
        }
        if entry.written_in_window < policy.burst {
            entry.written_in_window += 1;
            return Verdict::Write;
        }
        if entry.pending == 0 {
            entry.pending_since_ms = now_ms;
        }
        entry.pending += 1;
        entry.sample = sample();
        Verdict::Suppress
    }

    /// The suppressed counts of every key with lines held back since the
    /// previous drain, reset to zero; keys idle for two intervals are
    /// forgotten.
    pub fn drain_summaries(&mut self, now_ms: u64) -> Vec<Summary<K>> {
        let mut summaries = Vec::new();
        for (key, entry) in &mut self.entries {
            if entry.pending > 0 {
                summaries.push(Summary {
                    key: key.clone(),
                    suppressed: entry.pending,
                    sample: std::mem::take(&mut entry.sample),
                    since_ms: entry.pending_since_ms,
                });
                entry.pending = 0;
            }
        }
        let forget_before = now_ms.saturating_sub(self.policy.interval_ms.saturating_mul(2));
        self.entries
            .retain(|_, entry| entry.pending > 0 || entry.last_seen_ms >= forget_before);
        summaries
    }

    /// Lines of `key` suppressed and not yet drained.
    pub fn pending(&self, key: &K) -> u64 {
        self.entries.get(key).map_or(0, |entry| entry.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(burst: u32, interval_ms: u64) -> RepeatPolicy {
        RepeatPolicy { burst, interval_ms }
    }

    #[test]
    fn a_flood_is_cut_to_the_burst_and_summarised_once() {
        let mut limiter = RepeatLimiter::new(policy(3, 1_000));
        let verdicts: Vec<_> = (0..100)
            .map(|i| limiter.observe(&"replication", i, || format!("line {i}")))
            .collect();
        assert_eq!(verdicts.iter().filter(|v| **v == Verdict::Write).count(), 3);
        let summaries = limiter.drain_summaries(100);
        assert_eq!(
            summaries,
            vec![Summary {
                key: "replication",
                suppressed: 97,
                sample: "line 99".into(),
                since_ms: 3,
            }]
        );
        assert!(limiter.drain_summaries(101).is_empty(), "drained once");
        assert_eq!(
            limiter.observe(&"replication", 1_000, String::new),
            Verdict::Write,
            "a new window writes again"
        );
    }

    #[test]
    fn idle_keys_are_forgotten_but_pending_counts_are_not() {
        let mut limiter = RepeatLimiter::new(policy(1, 10));
        limiter.observe(&1, 0, String::new);
        limiter.observe(&1, 1, String::new);
        assert_eq!(limiter.drain_summaries(1_000).len(), 1);
        assert_eq!(limiter.pending(&1), 0);
        assert!(
            limiter.entries.is_empty(),
            "idle key forgotten after its summary"
        );
    }

    fn events() -> impl Strategy<Value = Vec<(u8, u64)>> {
        // (key, time step): times are cumulative, so nondecreasing.
        prop::collection::vec((0u8..4, 0u64..40), 0..400)
    }

    proptest! {
        #[test]
        fn at_most_burst_per_window_and_twice_that_in_any_span(
            burst in 1u32..6, interval in 1u64..200, steps in events()
        ) {
            let mut limiter = RepeatLimiter::new(policy(burst, interval));
            let mut now = 0;
            let mut written: HashMap<u8, Vec<u64>> = HashMap::new();
            for (key, step) in steps {
                now += step;
                if limiter.observe(&key, now, String::new) == Verdict::Write {
                    written.entry(key).or_default().push(now);
                }
            }
            for times in written.values() {
                for (i, &start) in times.iter().enumerate() {
                    let in_span = times[i..].iter().take_while(|&&t| t < start + interval).count();
                    prop_assert!(in_span as u32 <= 2 * burst, "{in_span} lines in one span of {interval} ms");
                }
            }
        }

        #[test]
        fn nothing_is_lost_from_the_count(
            burst in 1u32..6, interval in 1u64..200, steps in events(), drain_every in 1usize..50
        ) {
            let mut limiter = RepeatLimiter::new(policy(burst, interval));
            let mut now = 0;
            let mut observed: HashMap<u8, u64> = HashMap::new();
            let mut written: HashMap<u8, u64> = HashMap::new();
            let mut suppressed: HashMap<u8, u64> = HashMap::new();
            let mut drained: HashMap<u8, u64> = HashMap::new();
            for (i, (key, step)) in steps.into_iter().enumerate() {
                now += step;
                *observed.entry(key).or_default() += 1;
                match limiter.observe(&key, now, String::new) {
                    Verdict::Write => *written.entry(key).or_default() += 1,
                    Verdict::Suppress => *suppressed.entry(key).or_default() += 1,
                }
                if i % drain_every == 0 {
                    for summary in limiter.drain_summaries(now) {
                        prop_assert!(summary.suppressed > 0);
                        *drained.entry(summary.key).or_default() += summary.suppressed;
                    }
                }
            }
            for (key, total) in &observed {
                let w = written.get(key).copied().unwrap_or(0);
                let s = suppressed.get(key).copied().unwrap_or(0);
                prop_assert_eq!(w + s, *total);
                let d = drained.get(key).copied().unwrap_or(0);
                prop_assert_eq!(d + limiter.pending(key), s);
            }
        }

        #[test]
        fn a_key_seen_once_per_interval_is_never_suppressed(
            burst in 1u32..4, interval in 1u64..100, gaps in prop::collection::vec(0u64..100, 1..100)
        ) {
            let mut limiter = RepeatLimiter::new(policy(burst, interval));
            let mut now = 0;
            for gap in gaps {
                now += interval + gap;
                prop_assert_eq!(limiter.observe(&"rare", now, String::new), Verdict::Write);
            }
        }

        #[test]
        fn keys_do_not_affect_each_other(burst in 1u32..4, interval in 1u64..100, steps in events()) {
            let mut shared = RepeatLimiter::new(policy(burst, interval));
            let mut alone = RepeatLimiter::new(policy(burst, interval));
            let mut now = 0;
            for (key, step) in steps {
                now += step;
                let verdict = shared.observe(&key, now, String::new);
                if key == 0 {
                    prop_assert_eq!(verdict, alone.observe(&key, now, String::new));
                }
            }
        }
    }
}
