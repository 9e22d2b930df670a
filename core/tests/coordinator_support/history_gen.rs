//! Random command histories for the coordinator property tests: what to
//! generate (keys, regions, policies, clients, retries, clock jumps).

use proptest::prelude::*;

pub const KEYS: [&str; 4] = ["c/a", "c/b", "f/a", "zz"];
pub const REGIONS: [&str; 3] = ["us", "eu", "ap"];
pub const PREFIXES: [&str; 4] = ["", "c/", "f/", "c/a"];
pub const WINDOWS: [u64; 3] = [500, 1_000, 3_000];
pub const CLIENTS: [&str; 4] = ["c0", "c1", "c2", "c3"];

/// Which window a generated reconcile names, resolved against what the run has seen.
#[derive(Debug, Clone)]
pub enum WindowPick {
    Latest,
    Previous,
    AlignedBack(u64),
}

/// Which window a generated `PoolJoinNext` names.
#[derive(Debug, Clone)]
pub enum NextPick {
    /// The one after the latest window (or the aligned one after now).
    Next,
    /// The latest window (or the aligned one containing now).
    Latest,
    /// An aligned window `n` windows of 500 ms back.
    AlignedBack(u64),
}

#[derive(Debug, Clone)]
pub enum Gen {
    Lease {
        key: usize,
        region: usize,
        tokens: u64,
        client: Option<usize>,
    },
    Reconcile {
        key: usize,
        region: usize,
        leftover: u64,
        window: WindowPick,
        client: Option<usize>,
    },
    Pool {
        key: usize,
        region: usize,
        weight: u64,
        want: u64,
        client: Option<usize>,
    },
    /// Retire from the pool: `from` is the model's view of the region's
    /// total (plus `stale`), keeping `keep_pct` % of it.
    Release {
        key: usize,
        region: usize,
        stale: u64,
        keep_pct: u64,
        window: WindowPick,
        client: Option<usize>,
    },
    /// Join a window ahead: `window` names the live window's end (the
    /// next window), its start, or an aligned window further back.
    JoinNext {
        key: usize,
        region: usize,
        weight: u64,
        want: u64,
        window: NextPick,
        retire: bool,
        client: Option<usize>,
    },
    SetPolicy {
        prefix: usize,
        limit: u64,
        window: usize,
        fair: bool,
    },
    DeletePolicy {
        prefix: usize,
    },
    Tick,
    Retry(usize),
}

#[derive(Debug, Clone)]
pub struct Step {
    pub stamp_delta: i64,
    pub commands: Vec<Gen>,
}

fn gen_command() -> impl Strategy<Value = Gen> {
    let client = prop::option::of(0..CLIENTS.len());
    let amount = prop_oneof![1 => Just(0u64), 9 => 1u64..12];
    let weight = prop_oneof![1 => Just(0u64), 9 => 1u64..5];
    let pick = prop_oneof![
        6 => Just(WindowPick::Latest),
        1 => Just(WindowPick::Previous),
        1 => (0u64..4).prop_map(WindowPick::AlignedBack),
    ];
    prop_oneof![
        8 => (0..KEYS.len(), 0..REGIONS.len(), amount.clone(), client.clone())
            .prop_map(|(key, region, tokens, client)| Gen::Lease { key, region, tokens, client }),
        5 => (0..KEYS.len(), 0..REGIONS.len(), amount, pick.clone(), client.clone()).prop_map(
            |(key, region, leftover, window, client)| Gen::Reconcile { key, region, leftover, window, client }
        ),
        5 => (0..KEYS.len(), 0..REGIONS.len(), weight, 0u64..40, client.clone())
            .prop_map(|(key, region, weight, want, client)| Gen::Pool { key, region, weight, want, client }),
        3 => (0..KEYS.len(), 0..REGIONS.len(), prop_oneof![6 => Just(0u64), 1 => 1u64..3],
              prop_oneof![1 => Just(101u64), 9 => 0u64..=100], pick, client.clone())
            .prop_map(|(key, region, stale, keep_pct, window, client)| Gen::Release {
                key, region, stale, keep_pct, window, client,
            }),
        4 => (0..KEYS.len(), 0..REGIONS.len(), prop_oneof![1 => Just(0u64), 9 => 1u64..5], 0u64..40,
              prop_oneof![
                  6 => Just(NextPick::Next),
                  2 => Just(NextPick::Latest),
                  1 => (0u64..3).prop_map(NextPick::AlignedBack),
              ],
              any::<bool>(),
              client)
            .prop_map(|(key, region, weight, want, window, retire, client)| Gen::JoinNext {
                key, region, weight, want, window, retire, client,
            }),
        2 => gen_policy(),
        1 => (0..PREFIXES.len()).prop_map(|prefix| Gen::DeletePolicy { prefix }),
        1 => Just(Gen::Tick),
        3 => any::<usize>().prop_map(Gen::Retry),
    ]
}

fn gen_policy() -> impl Strategy<Value = Gen> {
    (
        0..PREFIXES.len(),
        prop_oneof![1 => Just(0u64), 12 => 1u64..30],
        0..WINDOWS.len(),
        any::<bool>(),
    )
        .prop_map(|(prefix, limit, window, fair)| Gen::SetPolicy {
            prefix,
            limit,
            window,
            fair,
        })
}

/// A first step installing a counter policy for every key and a fair one for
/// `f/`, then random steps; stamps mostly advance a little, sometimes a lot,
/// sometimes go back.
pub fn gen_steps() -> impl Strategy<Value = Vec<Step>> {
    let setup =
        (1u64..30, 0..WINDOWS.len(), 1u64..30, 0..WINDOWS.len()).prop_map(|(l1, w1, l2, w2)| {
            Step {
                stamp_delta: 0,
                commands: vec![
                    Gen::SetPolicy {
                        prefix: 0,
                        limit: l1,
                        window: w1,
                        fair: false,
                    },
                    Gen::SetPolicy {
                        prefix: 2,
                        limit: l2,
                        window: w2,
                        fair: true,
                    },
                ],
            }
        });
    let delta = prop_oneof![6 => 0i64..300, 2 => 300i64..3_000, 1 => -2_000i64..0];
    let step =
        (delta, prop::collection::vec(gen_command(), 1..4)).prop_map(|(stamp_delta, commands)| {
            Step {
                stamp_delta,
                commands,
            }
        });
    (setup, prop::collection::vec(step, 1..50)).prop_map(|(first, mut rest)| {
        rest.insert(0, first);
        rest
    })
}
