//! A state restored onto a new cluster — from a backup, or from a survivor
//! of a lost quorum — never grants in a window its source cluster may have
//! granted in, whatever that cluster did after the state was taken.
//!
//! Over random histories (leases, reconciles, pool grants and joins ahead,
//! policy changes, retries, clocks going back and forth): the source runs
//! the whole history up to its loss, a copy of its state is taken at any
//! point before, sealed as of the source's last clock plus a margin
//! (`CoordinatorState::seal_after_restore`), and runs the rest of the
//! history as the new cluster. Every window the new cluster grants in
//! (lease tokens or a pool increment) is one the source never granted in,
//! so Σ granted per window is one cluster's alone (≤ L by the other
//! properties), and the new cluster grants again once its clock passes the
//! seal.

mod coordinator_support;

use std::collections::{BTreeMap, BTreeSet};

use coordinator_support::history_gen::{gen_steps, Step};
use coordinator_support::history_model::{classify_retry, request_id_of, Model};
use coordinator_support::{key, region};
use leasehold_core::coordinator::{restore_seals, Command, CoordinatorState, Outcome, Proposal};
use leasehold_core::ids::RequestId;
use leasehold_core::policy::Policy;
use proptest::prelude::*;

/// `(key, window start)` of every window a command granted in.
type Granted = BTreeSet<(String, u64)>;

/// The first outcome of each request id the source answered: a restored
/// state answers a retry of one of them from the sessions it holds (the
/// caller's grant, answered again: not a new one).
type FirstAnswers = BTreeMap<RequestId, Outcome>;

/// The key a granting command names.
fn key_of(command: &Command) -> Option<String> {
    match command {
        Command::Lease { key, .. }
        | Command::PoolGrant { key, .. }
        | Command::PoolJoinNext { key, .. } => Some(key.to_string()),
        _ => None,
    }
}

/// The window `outcome` granted in, if it granted anything.
fn granted_window(outcome: &Outcome) -> Option<u64> {
    match outcome {
        Outcome::Lease(grant) if grant.granted > 0 => Some(grant.window_start_ms),
        Outcome::PoolGrant(grant) if grant.granted_increment > 0 => Some(grant.window_start_ms),
        _ => None,
    }
}

/// Applies `steps` from clock `stamp`, resolving commands with `model`
/// and returns the last stamp. As the source (`observe`): outcomes are
/// checked by the model and first answers recorded in `first`; as the new
/// cluster: answers equal to a first answer of the same id are replays.
/// Windows granted in go to `granted`.
fn run(
    state: &mut CoordinatorState,
    model: &mut Model,
    steps: &[Step],
    mut stamp: u64,
    observe: bool,
    first: &mut FirstAnswers,
    granted: &mut Granted,
) -> Result<u64, TestCaseError> {
    for step in steps {
        stamp = stamp.saturating_add_signed(step.stamp_delta);
        let now = state.now_ms().max(stamp);
        let commands: Vec<Command> = step
            .commands
            .iter()
            .map(|g| model.resolve(g, now))
            .collect();
        let proposal = Proposal {
            stamp_ms: stamp,
            commands,
        };
        let result = state.apply(&proposal);
        for (command, outcome) in proposal.commands.iter().zip(&result.outcomes) {
            let id = request_id_of(command).cloned();
            let replayed = !observe && id.as_ref().is_some_and(|id| first.get(id) == Some(outcome));
            if let (Some(key), Some(start), false) =
                (key_of(command), granted_window(outcome), replayed)
            {
                granted.insert((key, start));
            }
            if let (Some(id), true) = (id, observe) {
                first.entry(id).or_insert_with(|| outcome.clone());
            }
            if observe {
                let replay = match request_id_of(command).cloned() {
                    Some(id) => classify_retry(model, &id, outcome, now)?,
                    None => false,
                };
                if !replay {
                    model.observe(command, outcome, now)?;
                }
            }
        }
    }
    Ok(stamp)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn a_restored_state_never_grants_in_a_window_its_source_granted_in(
        steps in gen_steps(),
        taken in any::<prop::sample::Index>(),
        lost in any::<prop::sample::Index>(),
        margin_ms in prop_oneof![Just(0u64), 1u64..5_000],
        after in gen_steps(),
    ) {
        let taken = taken.index(steps.len() + 1);
        let lost = taken + lost.index(steps.len() - taken + 1);
        let mut source = CoordinatorState::default();
        let mut model = Model::default();
        // Every window the source granted in, before the copy too.
        let mut all_source = Granted::new();
        let mut first = FirstAnswers::new();
        let stamp = run(&mut source, &mut model, &steps[..taken], 1_000_000, true, &mut first, &mut all_source)?;
        let mut restored = source.clone();
        let stamp = run(&mut source, &mut model, &steps[taken..lost], stamp, true, &mut first, &mut all_source)?;

        let restored_at = source.now_ms() + margin_ms;
        restored.seal_after_restore(restored_at);
        prop_assert_eq!(restored.restored_at_ms(), restored_at.max(restored.now_ms()));
        // The new cluster runs the rest of this history, then another.
        let mut new_granted = Granted::new();
        let stamp = run(&mut restored, &mut model, &steps[lost..], stamp, false, &mut first, &mut new_granted)?;
        let later: Vec<Step> = after.into_iter().skip(1).collect();
        run(&mut restored, &mut model, &later, stamp, false, &mut first, &mut new_granted)?;

        let both: Vec<_> = new_granted.intersection(&all_source).collect();
        prop_assert!(both.is_empty(), "windows granted by both clusters: {:?}", both);
    }
}

/// The seal's rule, exhaustively on a small grid: a window is sealed
/// exactly when it starts before the restore plus its length, and never
/// without a restore.
#[test]
fn the_seal_covers_the_window_live_at_the_restore_and_the_next_one() {
    for restored_at in [0u64, 1, 5, 10, 1 << 62] {
        for window_ms in [1u64, 3, 10] {
            for start in 0u64..40 {
                let sealed = restore_seals(restored_at, start, window_ms);
                let expected = restored_at != 0
                    && u128::from(start) < u128::from(restored_at) + u128::from(window_ms);
                assert_eq!(
                    sealed, expected,
                    "restored {restored_at}, window {window_ms}, start {start}"
                );
            }
        }
    }
    // Aligned windows of length 10, restore at 25: [20, 30) is live, [30,
    // 40) may have been joined ahead, [40, 50) is fresh.
    assert!(restore_seals(25, 20, 10));
    assert!(restore_seals(25, 30, 10));
    assert!(!restore_seals(25, 40, 10));
}

/// A sealed window answers its acknowledged grants and nothing more;
/// returns are still credited; the window after the next one grants the
/// whole limit again.
#[test]
fn a_sealed_key_grants_again_from_the_window_after_the_next() {
    let mut state = CoordinatorState::default();
    let lease = |state: &mut CoordinatorState, stamp_ms: u64, tokens: u64| {
        let proposal = Proposal {
            stamp_ms,
            commands: vec![Command::Lease {
                key: key("api/k"),
                region: region("eu"),
                tokens,
                request_id: None,
                caller: leasehold_core::principal::Principal::Region(region("eu")),
            }],
        };
        match state.apply(&proposal).outcomes.remove(0) {
            Outcome::Lease(grant) => grant,
            other => panic!("{other:?}"),
        }
    };
    state.apply(&Proposal {
        stamp_ms: 1_000,
        commands: vec![Command::SetPolicy(Policy::counter("api/", 10, 1_000))],
    });
    assert_eq!(lease(&mut state, 1_100, 4).granted, 4);
    state.seal_after_restore(1_500);
    assert_eq!(state.restored_at_ms(), 1_500);
    let sealed = lease(&mut state, 1_600, 1);
    assert_eq!((sealed.granted, sealed.limit), (0, 0));
    let view = state
        .window_view(&key("api/k"), 1_600)
        .expect("a policy governs it");
    assert_eq!((view.granted, view.limit), (4, 0));
    // [2000, 3000) starts before 1500 + 1000: it may have been the old
    // cluster's; [3000, 4000) is fresh.
    assert_eq!(lease(&mut state, 2_100, 1).granted, 0);
    let fresh = lease(&mut state, 3_000, 10);
    assert_eq!(
        (fresh.granted, fresh.limit, fresh.window_start_ms),
        (10, 10, 3_000)
    );
    // A later restore moves the seal forward, never back.
    state.seal_after_restore(1_000);
    assert_eq!(state.restored_at_ms(), 3_000);
}
