//! Properties of the coordinator state machine over random command sequences:
//! several keys, regions and clients; leases, reconciles, pool grants, policy
//! changes (limit up and down, window length, kind, deletes), ticks, retried
//! request ids, and clock stamps jumping backward and forward.
//!
//! Checked against a model built only from the commands and their outcomes:
//! - grant conservation: for every window ever created, every grant leaves
//!   `Σ granted − Σ credited ≤ min(limit of the key's policy at any time during
//!   the window so far)`, and the outcome's `limit` equals that minimum. (Tokens
//!   granted before a limit decrease are not revoked, so between a decrease and
//!   the window's end the outstanding amount is bounded by
//!   `max(minimum limit, outstanding at the decrease)` and never grows past it.)
//! - per region, returned ≤ granted; pool totals never shrink;
//! - a key's windows never overlap and their starts strictly increase;
//! - the state's own view of a live window equals the model's accounting;
//! - retries return the first outcome, and a run with retries ends in the same
//!   state as the run without them;
//! - determinism: two replicas agree, and a postcard snapshot taken midway and
//!   restored continues identically;
//! - boundedness: once the clock passes every window and retention, nothing is held.

mod coordinator_support;

use coordinator_support::history_gen::{gen_steps, Step};
use coordinator_support::history_model::{classify_retry, request_id_of, Model};
use leasehold_core::coordinator::{
    Command, CoordinatorState, Outcome, Proposal, SESSION_MIN_RETAIN_MS,
};
use proptest::prelude::*;

/// A checked run: the concrete proposals, their outcomes, for each command
/// whether it was a replayed retry, and the final state.
type CheckedRun = (
    Vec<Proposal>,
    Vec<Vec<Outcome>>,
    Vec<Vec<bool>>,
    CoordinatorState,
);

/// Runs generated steps, checking every outcome against the model.
fn run_checked(steps: &[Step]) -> Result<CheckedRun, TestCaseError> {
    let mut state = CoordinatorState::default();
    let mut model = Model::default();
    let mut stamp: u64 = 1_000_000;
    let (mut proposals, mut outcomes, mut replays) = (Vec::new(), Vec::new(), Vec::new());
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
        prop_assert_eq!(state.now_ms(), now, "clock must be max(previous, stamp)");
        prop_assert_eq!(result.outcomes.len(), proposal.commands.len());
        let mut replayed = Vec::new();
        for (command, outcome) in proposal.commands.iter().zip(&result.outcomes) {
            let is_replay = match request_id_of(command).cloned() {
                None => false,
                Some(id) => classify_retry(&mut model, &id, outcome, now)?,
            };
            if !is_replay {
                model.observe(command, outcome, now)?;
            }
            replayed.push(is_replay);
        }
        model.check_views(&state)?;
        proposals.push(proposal);
        outcomes.push(result.outcomes);
        replays.push(replayed);
    }
    Ok((proposals, outcomes, replays, state))
}

fn replay(state: &mut CoordinatorState, proposals: &[Proposal]) -> Vec<Vec<Outcome>> {
    proposals.iter().map(|p| state.apply(p).outcomes).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 160, ..ProptestConfig::default() })]

    /// Conservation, per-region caps, window laws, views and retries (see the module doc).
    #[test]
    fn invariants_hold_over_random_histories(steps in gen_steps()) {
        run_checked(&steps)?;
    }

    /// Two replicas agree; a snapshot restored midway continues identically;
    /// once the clock passes everything, nothing is held.
    #[test]
    fn apply_is_deterministic_and_snapshots_roundtrip(steps in gen_steps(), cut in any::<prop::sample::Index>()) {
        let (proposals, outcomes, _, state) = run_checked(&steps)?;
        let mut replica = CoordinatorState::default();
        prop_assert_eq!(&replay(&mut replica, &proposals), &outcomes);
        prop_assert_eq!(&replica, &state);

        let cut = cut.index(proposals.len() + 1);
        let mut first_half = CoordinatorState::default();
        let mut seen = replay(&mut first_half, &proposals[..cut]);
        let bytes = postcard::to_stdvec(&first_half).expect("state encodes");
        let mut restored: CoordinatorState = postcard::from_bytes(&bytes).expect("state decodes");
        prop_assert_eq!(&restored, &first_half);
        seen.extend(replay(&mut restored, &proposals[cut..]));
        prop_assert_eq!(&seen, &outcomes);
        prop_assert_eq!(&restored, &state);

        let far = state.now_ms() + SESSION_MIN_RETAIN_MS + 10 * 3_000;
        restored.apply(&Proposal { stamp_ms: far, commands: vec![Command::Tick] });
        prop_assert_eq!((restored.live_windows(), restored.tracked_keys(), restored.client_sessions()), (0, 0, 0));
    }

    /// Removing every replayed retry leaves the final state unchanged, and
    /// every other non-`Tick` outcome identical.
    #[test]
    fn retries_change_nothing(steps in gen_steps()) {
        let (proposals, outcomes, replays, state) = run_checked(&steps)?;
        let mut without = CoordinatorState::default();
        for ((proposal, outs), flags) in proposals.iter().zip(&outcomes).zip(&replays) {
            let kept: Vec<(Command, Outcome)> = proposal
                .commands
                .iter()
                .zip(outs)
                .zip(flags)
                .filter(|(_, replayed)| !**replayed)
                .map(|((c, o), _)| (c.clone(), o.clone()))
                .collect();
            let result = without.apply(&Proposal { stamp_ms: proposal.stamp_ms, commands: kept.iter().map(|(c, _)| c.clone()).collect() });
            for ((command, expected), got) in kept.iter().zip(&result.outcomes) {
                if !matches!(command, Command::Tick) {
                    prop_assert_eq!(got, expected);
                }
            }
        }
        prop_assert_eq!(&without, &state);
    }
}
