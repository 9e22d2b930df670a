//! The newest entries of the Raft log, kept in memory as they were appended.
//!
//! Two readers follow the tail of the log on every member: the state
//! machine, which applies each entry once it commits, and (on the leader)
//! one replication stream per follower. Without this window each of them
//! reads the entry back from the storage engine and decodes it — on the
//! leader three decodes of every entry it has just encoded. [`RecentEntries`]
//! answers those reads with clones of the appended entries instead.
//!
//! It is a cache, never a source of truth: it holds one contiguous run of
//! indexes that equals what the log holds there, or answers nothing. Every
//! change to the log reaches it — appends after they are written, truncation
//! and purging before they are — and a request it cannot answer whole falls
//! through to the engine. It is bounded by the encoded size of what it holds
//! (oldest entries leave first), so a burst of large entries costs at most
//! that much memory.

use std::collections::VecDeque;

/// A bounded window of the newest log entries, by index.
#[derive(Debug)]
pub struct RecentEntries<E> {
    /// `(index, encoded size, entry)`, indexes consecutive and increasing.
    entries: VecDeque<(u64, usize, E)>,
    /// Sum of the encoded sizes held.
    bytes: usize,
    /// Most encoded bytes held at once.
    capacity_bytes: usize,
}

impl<E: Clone> RecentEntries<E> {
    /// An empty window holding at most `capacity_bytes` of encoded entries.
    pub fn new(capacity_bytes: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            bytes: 0,
            capacity_bytes,
        }
    }

    /// Records entries just written to the log, in index order, with their
    /// encoded sizes. Entries that do not continue the held run replace it
    /// (the log was rewritten there, or the window had been dropped).
    pub fn appended(&mut self, written: impl IntoIterator<Item = (u64, usize, E)>) {
        for (index, size, entry) in written {
            let continues = self
                .entries
                .back()
                .is_none_or(|(last, _, _)| last.checked_add(1) == Some(index));
            if !continues {
                self.clear();
            }
            self.entries.push_back((index, size, entry));
            self.bytes = self.bytes.saturating_add(size);
            while self.bytes > self.capacity_bytes {
                match self.entries.pop_front() {
                    Some((_, size, _)) => self.bytes -= size,
                    None => break,
                }
            }
        }
    }

    /// Forgets every entry at `index` and after (the log is being
    /// truncated there).
    pub fn truncate_from(&mut self, index: u64) {
        while self
            .entries
            .back()
            .is_some_and(|(last, _, _)| *last >= index)
        {
            if let Some((_, size, _)) = self.entries.pop_back() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets every entry at `index` and before (the log is being purged
    /// up to there).
    pub fn purge_through(&mut self, index: u64) {
        while self
            .entries
            .front()
            .is_some_and(|(first, _, _)| *first <= index)
        {
            if let Some((_, size, _)) = self.entries.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// Forgets everything (after a failed write, say).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Clones of the entries with indexes in `start..end`, if the window
    /// holds every one of them; `None` sends the reader to the engine.
    pub fn get(&self, start: u64, end: u64) -> Option<Vec<E>> {
        let (first, _, _) = self.entries.front()?;
        let (last, _, _) = self.entries.back()?;
        if start >= end || start < *first || end > last.checked_add(1)? {
            return None;
        }
        let skip = usize::try_from(start - first).ok()?;
        let take = usize::try_from(end - start).ok()?;
        Some(
            self.entries
                .range(skip..skip + take)
                .map(|(_, _, entry)| entry.clone())
                .collect(),
        )
    }

    /// Encoded bytes held now.
    #[cfg(test)]
    pub fn held_bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// One change to the log or one read of it.
    #[derive(Debug, Clone)]
    enum Op {
        /// Append `count` entries of `size` bytes after the log's end, or
        /// (`gap`) somewhere that does not continue it.
        Append {
            count: u64,
            size: usize,
            gap: u64,
        },
        Truncate {
            back: u64,
        },
        Purge {
            forward: u64,
        },
        Clear,
        Read {
            from_back: u64,
            len: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1u64..6, 1usize..40, prop_oneof![3 => Just(0u64), 1 => 1u64..4])
                .prop_map(|(count, size, gap)| Op::Append { count, size, gap }),
            1 => (0u64..8).prop_map(|back| Op::Truncate { back }),
            1 => (0u64..8).prop_map(|forward| Op::Purge { forward }),
            1 => Just(Op::Clear),
            5 => (0u64..12, 0u64..8).prop_map(|(from_back, len)| Op::Read { from_back, len }),
        ]
    }

    proptest! {
        /// Whatever the window answers equals what the log holds; it never
        /// holds more than its capacity; and with room to spare it answers
        /// every read of the run appended since the last rewrite.
        #[test]
        fn answers_only_what_the_log_holds(
            ops in prop::collection::vec(op(), 1..80),
            capacity in 0usize..200,
        ) {
            // The model: the log itself, index → (write generation, index).
            let mut log: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
            let mut window = RecentEntries::new(capacity);
            let mut generation = 0u32;
            for op in ops {
                match op {
                    Op::Append { count, size, gap } => {
                        generation += 1;
                        let start = log.keys().next_back().map_or(1, |last| last + 1) + gap;
                        let written: Vec<_> = (start..start + count)
                            .map(|index| (index, size, (generation, index)))
                            .collect();
                        for (index, _, entry) in &written {
                            log.insert(*index, *entry);
                        }
                        window.appended(written);
                    }
                    Op::Truncate { back } => {
                        let end = log.keys().next_back().map_or(0, |last| last + 1);
                        let from = end.saturating_sub(back);
                        window.truncate_from(from);
                        log.retain(|index, _| *index < from);
                    }
                    Op::Purge { forward } => {
                        let first = log.keys().next().copied().unwrap_or(0);
                        let through = first + forward;
                        window.purge_through(through);
                        log.retain(|index, _| *index > through);
                    }
                    Op::Clear => window.clear(),
                    Op::Read { from_back, len } => {
                        let end = log.keys().next_back().map_or(0, |last| last + 1);
                        let start = end.saturating_sub(from_back);
                        if let Some(got) = window.get(start, start + len) {
                            let want: Vec<_> = (start..start + len)
                                .map(|index| log.get(&index).copied())
                                .collect();
                            prop_assert_eq!(got.into_iter().map(Some).collect::<Vec<_>>(), want);
                        }
                    }
                }
                prop_assert!(window.held_bytes() <= capacity);
            }
        }
    }

    #[test]
    fn a_read_of_the_tail_is_answered_from_memory() {
        let mut window = RecentEntries::new(1_000);
        window.appended((1..=5).map(|index| (index, 10, index * 100)));
        assert_eq!(window.get(3, 6), Some(vec![300, 400, 500]));
        assert_eq!(window.get(1, 2), Some(vec![100]));
        // Past the end, before the start, or empty: the engine answers.
        assert_eq!(window.get(5, 7), None);
        assert_eq!(window.get(0, 2), None);
        assert_eq!(window.get(4, 4), None);
    }

    #[test]
    fn the_oldest_entries_leave_when_full() {
        let mut window = RecentEntries::new(25);
        window.appended((1..=5).map(|index| (index, 10, index)));
        assert_eq!(window.held_bytes(), 20);
        assert_eq!(window.get(4, 6), Some(vec![4, 5]));
        assert_eq!(window.get(3, 4), None);
    }

    #[test]
    fn a_rewritten_tail_is_not_served_from_before_the_rewrite() {
        let mut window = RecentEntries::new(1_000);
        window.appended((1..=5).map(|index| (index, 10, (1, index))));
        window.truncate_from(4);
        window.appended((4..=6).map(|index| (index, 10, (2, index))));
        assert_eq!(window.get(3, 7), Some(vec![(1, 3), (2, 4), (2, 5), (2, 6)]));
        // An append that does not continue the run replaces it.
        window.appended([(9, 10, (3, 9))]);
        assert_eq!(window.get(6, 7), None);
        assert_eq!(window.get(9, 10), Some(vec![(3, 9)]));
    }
}
