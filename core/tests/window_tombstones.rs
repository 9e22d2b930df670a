//! Window tombstones: a key's window start never repeats, whatever the
//! sequence of policy changes (window lengths growing and shrinking,
//! policies deleted and re-set), leases and ticks; and a key's tombstone is
//! collected after its own window length, not after the longest window of
//! any policy.

mod coordinator_support;

use std::collections::BTreeMap;

use coordinator_support::*;
use leasehold_core::coordinator::{Command, CoordinatorState, Outcome};
use proptest::prelude::*;

const PREFIXES: [&str; 3] = ["", "a", "ab"];
const KEYS: [&str; 4] = ["a", "ab", "abc", "b"];
const WINDOWS: [u64; 7] = [1, 3, 10, 25, 60, 200, 1_000];

#[derive(Debug, Clone)]
enum Step {
    SetPolicy { prefix: usize, window: usize },
    DeletePolicy { prefix: usize },
    Lease { key: usize },
    Tick,
}

fn gen_step() -> impl Strategy<Value = (u64, Step)> {
    let step = prop_oneof![
        2 => (0..PREFIXES.len(), 0..WINDOWS.len())
            .prop_map(|(prefix, window)| Step::SetPolicy { prefix, window }),
        1 => (0..PREFIXES.len()).prop_map(|prefix| Step::DeletePolicy { prefix }),
        6 => (0..KEYS.len()).prop_map(|key| Step::Lease { key }),
        1 => Just(Step::Tick),
    ];
    // Clock advances: mostly small, sometimes past every window length.
    let advance = prop_oneof![4 => 0u64..30, 1 => 0u64..2_500];
    (advance, step)
}

/// A key's windows seen so far: its last (start, end).
type LastWindow = BTreeMap<&'static str, (u64, u64)>;

fn check_grant(
    last: &mut LastWindow,
    key: &'static str,
    now: u64,
    start: u64,
    end: u64,
) -> Result<(), TestCaseError> {
    prop_assert!(
        start <= now && now < end,
        "window [{start}, {end}) does not contain {now}"
    );
    if let Some(&(last_start, last_end)) = last.get(key) {
        if start == last_start {
            prop_assert_eq!(end, last_end, "one start labels two windows of {}", key);
        } else {
            prop_assert!(
                start > last_start && start >= last_end,
                "{key}: window [{start}, {end}) after [{last_start}, {last_end})"
            );
        }
    }
    last.insert(key, (start, end));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Δ's precondition: `(key, start)` names one window ever, across any
    /// interleaving of window-length changes, deletions, leases and ticks.
    #[test]
    fn a_window_start_never_repeats_for_a_key_across_policy_changes_leases_and_ticks(
        steps in proptest::collection::vec(gen_step(), 1..120)
    ) {
        let mut state = CoordinatorState::default();
        let mut now = 1_000u64;
        let mut last = LastWindow::new();
        for (advance, step) in steps {
            now += advance;
            let command = match step {
                Step::SetPolicy { prefix, window } => {
                    counter(PREFIXES[prefix], 1_000, WINDOWS[window])
                }
                Step::DeletePolicy { prefix } => Command::DeletePolicy {
                    prefix: PREFIXES[prefix].to_string(),
                },
                Step::Lease { key } => lease(KEYS[key], "us", 1),
                Step::Tick => Command::Tick,
            };
            let key = match step {
                Step::Lease { key } => Some(KEYS[key]),
                _ => None,
            };
            if let (Outcome::Lease(grant), Some(key)) = (run(&mut state, now, command), key) {
                check_grant(&mut last, key, now, grant.window_start_ms, grant.window_end_ms)?;
            }
        }
    }

    /// A minute key next to a daily policy: its tombstone is gone once its
    /// own window length has passed after its window's end, and not before.
    #[test]
    fn a_keys_tombstone_is_collected_after_its_own_window_not_the_longest_policy(
        window in 1u64..100_000,
        at in 0u64..1_000_000,
        long_window in 200_000u64..=leasehold_core::policy::MAX_WINDOW_MS,
    ) {
        let mut state = CoordinatorState::default();
        run(&mut state, at, counter("daily/", 10, long_window));
        run(&mut state, at, counter("short/", 10, window));
        let daily_end = match run(&mut state, at, lease("daily/k", "us", 1)) {
            Outcome::Lease(grant) => grant.window_end_ms,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        let end = match run(&mut state, at, lease("short/k", "us", 1)) {
            Outcome::Lease(grant) => grant.window_end_ms,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        prop_assert_eq!(state.tracked_keys(), 2);
        // Only while the daily window still lives is the comparison meaningful.
        prop_assume!(end + window < daily_end);
        // Just before end + window the tombstone keeps the start floor.
        run(&mut state, end + window - 1, Command::Tick);
        prop_assert_eq!(state.tracked_keys(), 2, "short key's tombstone dropped early");
        // At end + window it is collected; the daily key's window still lives.
        run(&mut state, end + window, Command::Tick);
        prop_assert_eq!(state.tracked_keys(), 1, "short key's tombstone outlived its window");
        prop_assert_eq!(state.live_windows(), 1);
    }
}

#[test]
fn a_key_whose_window_grows_after_its_tombstone_is_gone_starts_after_its_last_end() {
    let mut state = CoordinatorState::default();
    run(&mut state, 0, counter("day/", 10, 86_400_000));
    run(&mut state, 0, counter("k/", 10, 60_000));
    run(&mut state, 150_000, lease("day/x", "us", 1));
    // [120 000, 180 000): its tombstone lives until 240 000.
    run(&mut state, 150_000, lease("k/a", "us", 1));
    run(&mut state, 240_000, Command::Tick);
    assert_eq!(state.tracked_keys(), 1, "collected after its own minute");
    // The window grows to an hour: the aligned hour [0, 3 600 000) would
    // reopen time k/a already used; the growth floor keeps it after 180 000.
    run(&mut state, 250_000, counter("k/", 10, 3_600_000));
    match run(&mut state, 250_000, lease("k/a", "us", 1)) {
        Outcome::Lease(grant) => {
            assert_eq!(
                (grant.window_start_ms, grant.window_end_ms),
                (180_000, 3_600_000)
            );
        }
        other => panic!("{other:?}"),
    }
    // A key with no history under an unchanged policy keeps its aligned start.
    match run(&mut state, 250_000, lease("day/y", "us", 1)) {
        Outcome::Lease(grant) => assert_eq!(grant.window_start_ms, 0),
        other => panic!("{other:?}"),
    }
}
