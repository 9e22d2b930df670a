//! Property tests of the fair throttle's laws (see the module docs).

use proptest::prelude::*;

use super::*;

fn config(levels: u32, buckets: u32) -> FairThrottleConfig {
    FairThrottleConfig {
        levels,
        buckets,
        ..FairThrottleConfig::default()
    }
}

fn caller(bytes: &[u8]) -> CallerId<'_> {
    CallerId::new(bytes).expect("non-empty id")
}

fn any_config() -> impl Strategy<Value = FairThrottleConfig> {
    (
        1u32..=8,
        1u32..=64,
        0.001f64..=1.0,
        0.0001f64..=1.0,
        0.0f64..5.0,
        prop_oneof![Just(LevelCombine::Min), Just(LevelCombine::Mean)],
    )
        .prop_map(
            |(levels, buckets, increment, decrement, decay_per_sec, combine)| FairThrottleConfig {
                levels,
                buckets,
                increment,
                decrement,
                decay_per_sec,
                combine,
                ..FairThrottleConfig::default()
            },
        )
}

/// One step of a random workload: a caller (by number), an outcome, and how
/// far the clock moves first (it may also go backwards).
fn any_steps() -> impl Strategy<Value = Vec<(u16, bool, i32)>> {
    prop::collection::vec((any::<u16>(), any::<bool>(), -50i32..5_000), 0..300)
}

#[test]
fn an_empty_caller_id_is_refused() {
    assert_eq!(CallerId::new(b""), Err(FairThrottleError::EmptyCallerId));
    assert!(CallerId::new(b"k").is_ok());
}

#[test]
fn absurd_configurations_never_build() {
    let bad = [
        config(0, 1000),
        config(3, 0),
        FairThrottleConfig {
            decrement: -1.0,
            ..FairThrottleConfig::default()
        },
        FairThrottleConfig {
            increment: 2.0,
            ..FairThrottleConfig::default()
        },
        FairThrottleConfig {
            increment: f64::NAN,
            ..FairThrottleConfig::default()
        },
    ];
    for config in bad {
        assert!(ThrottleStructure::new(config, 1).is_err(), "{config:?}");
        assert!(
            FairThrottleState::new(config, 0, 1, 2).is_err(),
            "{config:?}"
        );
    }
}

#[test]
fn twenty_five_exhaustions_take_a_caller_from_zero_to_one() {
    let mut structure = ThrottleStructure::new(FairThrottleConfig::default(), 7).unwrap();
    let heavy = caller(b"heavy");
    for _ in 0..24 {
        structure.record(heavy, Outcome::Exhausted, 0);
    }
    assert!(structure.throttle_probability(heavy, 0) < 1.0);
    structure.record(heavy, Outcome::Exhausted, 0);
    assert!((structure.throttle_probability(heavy, 0) - 1.0).abs() < 1e-9);
    // One success takes Pd off every cell.
    structure.record(heavy, Outcome::Success, 0);
    let p = structure.throttle_probability(heavy, 0);
    assert!((p - (1.0 - FairThrottleConfig::default().decrement)).abs() < 1e-9);
}

#[test]
fn the_mean_combine_averages_the_levels() {
    let mean = FairThrottleConfig {
        combine: LevelCombine::Mean,
        ..config(4, 8)
    };
    let mut structure = ThrottleStructure::new(mean, 3).unwrap();
    for i in 0..40u32 {
        let id = i.to_le_bytes();
        let outcome = if i % 3 == 0 {
            Outcome::Success
        } else {
            Outcome::Exhausted
        };
        structure.record(caller(&id), outcome, 0);
    }
    for i in 0..40u32 {
        let id = i.to_le_bytes();
        let levels = structure.level_probabilities(caller(&id), 0);
        let average = levels.iter().sum::<f64>() / levels.len() as f64;
        assert!((structure.throttle_probability(caller(&id), 0) - average).abs() < 1e-12);
    }
}

/// The all-level collision rate of random callers against `heavy_hitters`
/// heavy hitters, averaged over `batches` structures with distinct seeds
/// (the formula is an expectation over where the heavy hitters land).
fn measured_collision_rate(
    levels: u32,
    buckets: u32,
    heavy_hitters: u32,
    batches: u32,
    trials_per_batch: u32,
) -> f64 {
    let mut collisions = 0u32;
    for batch in 0..batches {
        let seed = 0x5eed_u32.wrapping_add(batch.wrapping_mul(0x2545_f491));
        let structure = ThrottleStructure::new(config(levels, buckets), seed).unwrap();
        let heavy: Vec<Vec<u32>> = (0..heavy_hitters)
            .map(|h| {
                let id = format!("heavy-{h}");
                structure
                    .cell_indices(caller(id.as_bytes()))
                    .as_slice()
                    .to_vec()
            })
            .collect();
        for t in 0..trials_per_batch {
            let id = format!("caller-{t}");
            let mine = structure.cell_indices(caller(id.as_bytes()));
            // Colliding on a level = some heavy hitter shares that level's bucket.
            let all = mine
                .as_slice()
                .iter()
                .enumerate()
                .all(|(level, bucket)| heavy.iter().any(|h| h[level] == *bucket));
            collisions += u32::from(all);
        }
    }
    f64::from(collisions) / f64::from(batches * trials_per_batch)
}

#[test]
fn the_levels_are_independent_one_heavy_hitter() {
    // Double hashing would give about 1/B² = 1/64 here; independent levels
    // give (1/B)^L = 1/512.
    let rate = measured_collision_rate(3, 8, 1, 20, 10_000);
    let formula = all_level_collision_probability(1, 8, 3);
    assert!(
        (rate / formula - 1.0).abs() < 0.15,
        "measured {rate}, formula {formula}"
    );
}

#[test]
fn the_levels_are_independent_across_hash_groups() {
    // Five levels take words from two Murmur3 calls.
    let rate = measured_collision_rate(5, 4, 1, 30, 10_000);
    let formula = all_level_collision_probability(1, 4, 5);
    assert!(
        (rate / formula - 1.0).abs() < 0.15,
        "measured {rate}, formula {formula}"
    );
}

#[test]
fn the_collision_rate_with_many_heavy_hitters_matches_the_formula() {
    let rate = measured_collision_rate(3, 64, 16, 400, 500);
    let formula = all_level_collision_probability(16, 64, 3);
    assert!(
        (rate / formula - 1.0).abs() < 0.15,
        "measured {rate}, formula {formula}"
    );
}

proptest! {
    /// Constant memory: no number of callers changes what the cells take.
    #[test]
    fn memory_is_constant_whatever_the_callers(
        config in any_config(),
        callers in 0usize..3_000,
        seed in any::<u32>(),
    ) {
        let mut state = FairThrottleState::new(config, 0, seed, seed ^ 1).unwrap();
        let before = state.memory_bytes();
        prop_assert_eq!(before as u64, 2 * config.structure_bytes());
        for i in 0..callers {
            let id = format!("ip-10.0.{}.{}", i / 256, i % 256);
            let outcome = if i % 2 == 0 { Outcome::Exhausted } else { Outcome::Success };
            state.record(caller(id.as_bytes()), outcome, i as u64);
            let _ = state.decide(caller(id.as_bytes()), i as u64, i as u64);
            state.rotate_if_due(i as u64 * 1_000, i as u32);
        }
        prop_assert_eq!(state.memory_bytes(), before);
    }

    /// Bounded: every level and every caller's probability stays in [0, 1].
    #[test]
    fn probabilities_stay_in_the_unit_interval(
        config in any_config(),
        steps in any_steps(),
        seed in any::<u32>(),
    ) {
        let mut structure = ThrottleStructure::new(config, seed).unwrap();
        let mut now: u64 = 1_000;
        for (who, exhausted, dt) in steps {
            now = now.saturating_add_signed(i64::from(dt));
            let id = (who % 32).to_le_bytes();
            let outcome = if exhausted { Outcome::Exhausted } else { Outcome::Success };
            structure.record(caller(&id), outcome, now);
            for p in structure.level_probabilities(caller(&id), now) {
                prop_assert!((0.0..=1.0).contains(&p), "{p}");
            }
            let p = structure.throttle_probability(caller(&id), now);
            prop_assert!((0.0..=1.0).contains(&p), "{p}");
        }
    }

    /// Monotone outcomes, against the decayed value at the same instant.
    #[test]
    fn outcomes_move_every_cell_the_right_way(
        config in any_config(),
        steps in any_steps(),
        exhausted in any::<bool>(),
    ) {
        let mut structure = ThrottleStructure::new(config, 11).unwrap();
        let mut now: u64 = 0;
        for (who, ex, dt) in steps {
            now = now.saturating_add_signed(i64::from(dt));
            let id = (who % 16).to_le_bytes();
            structure.record(caller(&id), if ex { Outcome::Exhausted } else { Outcome::Success }, now);
        }
        let id = b"probe";
        let before = structure.level_probabilities(caller(id), now);
        let outcome = if exhausted { Outcome::Exhausted } else { Outcome::Success };
        structure.record(caller(id), outcome, now);
        let after = structure.level_probabilities(caller(id), now);
        for (b, a) in before.iter().zip(&after) {
            if exhausted {
                prop_assert!(a >= b && (a - (b + config.increment).min(1.0)).abs() < 1e-12);
            } else {
                prop_assert!(a <= b && (a - (b - config.decrement).max(0.0)).abs() < 1e-12);
            }
        }
    }

    /// Decay: a fully throttled caller falls below ε after ln(1/ε)/λ seconds
    /// with no outcome at all, and is then admitted by most draws.
    #[test]
    fn decay_lets_a_fully_throttled_caller_return(
        decay_per_sec in 0.001f64..1.0,
        epsilon in 0.001f64..0.5,
        draw in any::<u64>(),
    ) {
        let config = FairThrottleConfig { decay_per_sec, ..FairThrottleConfig::default() };
        let mut structure = ThrottleStructure::new(config, 5).unwrap();
        let heavy = caller(b"heavy");
        for _ in 0..30 {
            structure.record(heavy, Outcome::Exhausted, 0);
        }
        prop_assert!((structure.throttle_probability(heavy, 0) - 1.0).abs() < 1e-9);
        prop_assert!(!structure.decide(heavy, 0, draw).admit);
        let wait_ms = ((1.0 / epsilon).ln() / decay_per_sec * 1000.0).ceil() as u64 + 1;
        let later = structure.throttle_probability(heavy, wait_ms);
        prop_assert!(later < epsilon, "{later} after {wait_ms} ms");
        // Any draw at or above ε admits.
        let verdict = structure.decide(heavy, wait_ms, draw);
        prop_assert_eq!(verdict.admit, unit_interval(draw) >= later);
    }

    /// Probability 0 admits every draw; probability 1 throttles every draw.
    #[test]
    fn the_extremes_are_certain(draw in any::<u64>()) {
        let mut structure = ThrottleStructure::new(FairThrottleConfig::default(), 9).unwrap();
        prop_assert!(structure.decide(caller(b"new"), 0, draw).admit);
        for _ in 0..25 {
            structure.record(caller(b"heavy"), Outcome::Exhausted, 0);
        }
        prop_assert!(!structure.decide(caller(b"heavy"), 0, draw).admit);
    }

    /// Bounded collision penalty: after a rotation an innocent caller's
    /// probability is raised by a heavy hitter's exhaustions only if it
    /// shares all its cells with the heavy hitter under the new live seed;
    /// and after a second rotation without traffic nothing is throttled.
    #[test]
    fn a_collision_lasts_at_most_until_the_next_rotation(
        levels in 1u32..=5,
        buckets in 1u32..=4,
        seeds in any::<(u32, u32, u32, u32)>(),
        heavy in prop::collection::vec(any::<u8>(), 1..12),
        innocent in prop::collection::vec(any::<u8>(), 1..12),
    ) {
        prop_assume!(heavy != innocent);
        let config = FairThrottleConfig { decay_per_sec: 0.0, ..config(levels, buckets) };
        let (live_seed, shadow_seed, fresh, fresher) = seeds;
        let mut state = FairThrottleState::new(config, 0, live_seed, shadow_seed).unwrap();
        let (heavy, innocent) = (caller(&heavy), caller(&innocent));
        for _ in 0..25 {
            state.record(heavy, Outcome::Exhausted, 10);
        }
        let shares_all = |s: &ThrottleStructure| s.cell_indices(heavy) == s.cell_indices(innocent);
        // Before: the innocent is throttled exactly when it shares every cell.
        let before = state.throttle_probability(innocent, 20);
        prop_assert_eq!(before > 0.0, shares_all(state.live()));
        // Same outcomes reached the shadow.
        prop_assert!((state.shadow().throttle_probability(heavy, 20) - 1.0).abs() < 1e-9);

        prop_assert!(!state.rotate_if_due(config.rotation_interval_ms - 1, fresh));
        prop_assert!(state.rotate_if_due(config.rotation_interval_ms, fresh));
        let after = state.throttle_probability(innocent, config.rotation_interval_ms);
        prop_assert_eq!(after > 0.0, shares_all(state.live()));
        prop_assert_eq!(state.live().seed(), shadow_seed);
        prop_assert_eq!(state.shadow().seed(), fresh);

        state.rotate(2 * config.rotation_interval_ms, fresher);
        prop_assert_eq!(state.throttle_probability(innocent, 2 * config.rotation_interval_ms), 0.0);
        prop_assert_eq!(state.throttle_probability(heavy, 2 * config.rotation_interval_ms), 0.0);
        prop_assert_eq!(state.rotations(), 2);
    }
}
