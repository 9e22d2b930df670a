//! Property: whatever the mode and history, every decision a limiter
//! returns is well-formed and admissions per window stay within the limit.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{assert_well_formed, FakeCoordinator};
use leasehold_client::{CheckClock, LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode};
use leasehold_core::ids::ClientId;
use proptest::prelude::*;

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![
        Just(Mode::Strict),
        Just(Mode::CachedDeny),
        (1u64..30, 0u64..5, proptest::option::of(10u64..300)).prop_map(
            |(batch, low_water, idle)| {
                let options = LeaseOptions::default()
                    .with_sizing(LeaseSizing::Fixed(batch))
                    .with_low_water(low_water)
                    .with_max_refill_rounds(8)
                    .with_clock(CheckClock::Runtime);
                Mode::Leased(match idle {
                    Some(ms) => options.with_return_idle_after(Duration::from_millis(ms)),
                    None => options,
                })
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn decisions_are_well_formed_and_bounded(
        mode in mode(),
        limit in 1u64..60,
        window_ms in 50u64..400,
        base_ms in 0u64..100_000,
        delay_seed in any::<u64>(),
        steps in proptest::collection::vec((1u64..8, 0u64..60), 1..80),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime");
        let leased = matches!(mode, Mode::Leased(_));
        runtime.block_on(async move {
            let fake = FakeCoordinator::new(limit, window_ms, base_ms);
            fake.random_delays(delay_seed, 30);
            let config = LimiterConfig::new(mode, ClientId::new("prop").expect("valid"));
            let l1 = Limiter::new(fake.clone(), config).expect("valid config");
            let mut admitted: BTreeMap<u64, u64> = BTreeMap::new();
            for (cost, pause) in steps {
                let a = l1.check_labelled("k", cost).await.expect("the fake never fails");
                assert_well_formed(&a);
                let d = a.decision;
                assert!(d.remaining <= d.limit, "{d:?}");
                if let Some(start) = a.window_start_ms {
                    assert_eq!(d.reset_at_ms, start + window_ms, "reset_at is the window end");
                    *admitted.entry(start).or_default() += cost;
                }
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            for (start, spent) in admitted {
                assert!(spent <= limit, "window {start}: admitted {spent} > L = {limit}");
            }
            let s = l1.stats();
            assert_eq!(s.errors, 0);
            if leased {
                assert!(s.admitted_tokens <= s.tokens_leased, "{s:?}");
            } else {
                assert_eq!(s.backend_calls, s.admitted + s.denied - s.denied_from_cache, "{s:?}");
            }
        });
    }
}
