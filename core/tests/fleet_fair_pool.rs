//! Several regions' `fair` keys — each the key machine an escrow node runs
//! (`KeyMachine`, through its events and actions) — against the real
//! coordinator state machine's region fair pool, with exactly-once release
//! ids, under lost answers and calls that never arrive: Σ admitted per
//! window never exceeds L. At steady overload the regions split each window
//! by weight at fewer than two pool calls per region per window (each joins
//! once for its share: the leader's expected standing counts the regions
//! of the window before that have not joined yet); a region that goes away
//! leaves nothing stranded, and one that comes back is served its share
//! again from the window after.

mod fleet_support;

use std::collections::BTreeMap;

use fleet_support::region::{config, credits, Call, Region, PROBE_INTERVAL_MS};
use fleet_support::{Admissions, Coordinator, Delivery, Rng};
use leasehold_core::escrow::machine::{Action, Now};
use leasehold_core::escrow::{PendingRelease, Served, WEIGHT_SCALE};
use leasehold_core::ids::TenantId;
use leasehold_core::policy::PolicyKind;
use leasehold_core::sizer::LeaseSizer;
use leasehold_core::window::WindowBounds;
use proptest::prelude::*;

const WINDOW_MS: u64 = 1_000;
/// A fair key's batch beyond the need (its lease size).
const LEASE_SIZE: u64 = 4;
/// Reclaim after this long without a request: short, so that releases
/// happen within the scenarios (and a region at its ceiling looks again
/// after 100 ms).
const RELEASE_IDLE_MS: u64 = 20;
/// The escrow node's default `--pool-release-idle-ms` (a region at its
/// ceiling looks again after a quarter window).
const NODE_RELEASE_IDLE_MS: u64 = 1_000;
/// How long after a look at the ceiling a region with [`RELEASE_IDLE_MS`]
/// looks again.
const RE_ASK_MS: u64 = 100;

/// The regions and the coordinator share one clock here.
fn at(now_ms: u64) -> Now {
    Now {
        mono_ms: now_ms,
        wall_ms: now_ms,
    }
}

fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![
        6 => Just(Delivery::Answered),
        1 => Just(Delivery::Lost),
        1 => Just(Delivery::NotApplied),
    ]
}

struct Fleet {
    coordinator: Coordinator,
    regions: Vec<Region>,
    /// Per region.
    admitted: Admissions<usize>,
    /// Pool grant calls sent, per window of the call.
    grant_calls: BTreeMap<u64, u64>,
    /// Pool release calls sent (resends included), per window of the call.
    release_calls: BTreeMap<u64, u64>,
    /// With tracing on: each pool call.
    trace: Option<Vec<TracedCall>>,
}

/// A pool call as traced: when (ms), by which region, what it asked, and
/// every region's pool total once it was answered.
type TracedCall = (u64, usize, String, Vec<u64>);

impl Fleet {
    fn new(limit: u64, regions: usize, release_idle_ms: u64) -> Self {
        let coordinator = Coordinator::new(limit, WINDOW_MS, PolicyKind::Fair, 0);
        Fleet {
            regions: (0..regions)
                .map(|_| {
                    let config = config(LeaseSizer::Fixed(LEASE_SIZE), release_idle_ms);
                    Region::new(config, coordinator.policy.clone(), 0)
                })
                .collect(),
            coordinator,
            admitted: Admissions::default(),
            grant_calls: BTreeMap::new(),
            release_calls: BTreeMap::new(),
            trace: None,
        }
    }

    /// Performs region `r`'s `calls` at `now`, each delivered as the next of
    /// `deliveries` says (cycling; all answered when empty), and counts what
    /// its clients were admitted.
    fn perform(&mut self, r: usize, calls: Vec<Call>, deliveries: &[Delivery], now: u64) {
        let mut deliveries = deliveries.iter().copied().cycle();
        let grant_calls = &mut self.grant_calls;
        let release_calls = &mut self.release_calls;
        let window = WindowBounds::containing(now, WINDOW_MS).start_ms;
        let mut asked = Vec::new();
        self.coordinator
            .settle(r, &mut self.regions[r], calls, now, at(now), |call| {
                match call {
                    Action::SendPoolGrant {
                        want_total,
                        join_next,
                        ..
                    } => {
                        *grant_calls.entry(window).or_default() += 1;
                        let ahead = if join_next.is_some() {
                            " + join ahead"
                        } else {
                            ""
                        };
                        asked.push(format!("ask for {want_total}{ahead}"));
                    }
                    Action::SendPoolRelease(release) => {
                        *release_calls.entry(window).or_default() += 1;
                        let ahead = if release.join_next.is_some() {
                            " + join ahead"
                        } else {
                            ""
                        };
                        asked.push(format!(
                            "release {} → {}{ahead}",
                            release.from_total, release.keep_total
                        ));
                    }
                    _ => {}
                }
                deliveries.next().unwrap_or(Delivery::Answered)
            });
        for (_, answer) in self.regions[r].take_answers() {
            if let Some(served) = credits(&answer) {
                self.admitted.record(r, &served, now);
            }
        }
        if self.trace.is_some() && !asked.is_empty() {
            let totals = self.region_totals(now);
            if let Some(trace) = self.trace.as_mut() {
                trace.extend(asked.into_iter().map(|a| (now, r, a, totals.clone())));
            }
        }
    }

    fn request(
        &mut self,
        r: usize,
        tenant: &TenantId,
        weight: u64,
        cost: u64,
        deliveries: &[Delivery],
        now: u64,
    ) {
        let (_, calls) = self.regions[r].acquire(Some(tenant.clone()), weight, cost, at(now));
        self.perform(r, calls, deliveries, now);
    }

    /// What the coordinator's pool has granted in the window of `now`
    /// (0 before any grant).
    fn pool_granted(&self, now: u64) -> u64 {
        let key = self.coordinator.key.clone();
        self.coordinator
            .state
            .window_view(&key, now)
            .map_or(0, |view| view.granted)
    }

    /// Each region's pool total in the window of `now` (0 for a region
    /// that has not asked in it).
    fn region_totals(&self, now: u64) -> Vec<u64> {
        let key = self.coordinator.key.clone();
        let view = self.coordinator.state.window_view(&key, now).ok();
        (0..self.regions.len())
            .map(|r| {
                let name = fleet_support::region(r).to_string();
                view.as_ref()
                    .and_then(|view| view.regions.iter().find(|v| v.region == name))
                    .map_or(0, |v| v.granted)
            })
            .collect()
    }

    /// The largest number admitted in any window, with that window.
    fn most_admitted(&self) -> Option<(u64, u64)> {
        self.admitted
            .totals()
            .into_iter()
            .max_by_key(|(_, admitted)| *admitted)
    }

    /// Region `r`'s timer, if it is due at `now`: a release of an idle
    /// key's grant (or its resend), delivered as `delivery` says.
    fn tick(&mut self, r: usize, delivery: Delivery, now: u64) {
        let calls = self.regions[r].tick(at(now));
        self.perform(r, calls, &[delivery], now);
    }
}

#[derive(Debug, Clone)]
enum Op {
    Request {
        region: usize,
        tenant: usize,
        weight: u64,
        cost: u64,
        calls: Vec<Delivery>,
    },
    /// The region's timer fires (when due): reclaim, or a release's resend.
    Tick { region: usize, delivery: Delivery },
}

fn op() -> impl Strategy<Value = (Op, u64)> {
    let request = (
        0usize..3,
        0usize..3,
        1u64..4,
        1u64..4,
        proptest::collection::vec(delivery(), 1..5),
    )
        .prop_map(|(region, tenant, weight, cost, calls)| Op::Request {
            region,
            tenant,
            weight,
            cost,
            calls,
        });
    let tick = (0usize..3, delivery()).prop_map(|(region, delivery)| Op::Tick { region, delivery });
    (
        prop_oneof![6 => request, 2 => tick],
        prop_oneof![4 => Just(0u64), 3 => 1u64..40, 1 => 100u64..700],
    )
}

fn tenant(i: usize) -> TenantId {
    TenantId::new(format!("t{i}")).expect("valid tenant")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Whatever is lost, retried or released, Σ admitted per window ≤ L,
    /// and the pool never grants past L.
    #[test]
    fn regions_never_admit_past_the_limit(
        limit in 3u64..80,
        ops in proptest::collection::vec(op(), 1..160),
    ) {
        let mut fleet = Fleet::new(limit, 3, RELEASE_IDLE_MS);
        let mut now = 5_000u64;
        for (op, advance) in ops {
            now += advance;
            match op {
                Op::Request { region, tenant: t, weight, cost, calls } => {
                    fleet.request(region, &tenant(t), weight, cost, &calls, now)
                }
                Op::Tick { region, delivery } => fleet.tick(region, delivery, now),
            }
            let granted = fleet.pool_granted(now);
            prop_assert!(granted <= limit, "the pool granted {} > {}", granted, limit);
        }
        if let Some((window, admitted)) = fleet.most_admitted() {
            prop_assert!(admitted <= limit, "window {}: {} admitted > {}", window, admitted, limit);
        }
    }

    /// With every call answered, a region that went idle and released
    /// lets the busy one use what it did not admit.
    #[test]
    fn an_idle_regions_release_goes_to_the_busy_one(limit in 20u64..200) {
        let mut fleet = Fleet::new(limit, 2, RELEASE_IDLE_MS);
        let now = 10_000;
        let answered = [Delivery::Answered];
        // r0 joins and admits a little; r1 then takes what the pool gives.
        for _ in 0..2 {
            fleet.request(0, &tenant(0), 1, 1, &answered, now);
        }
        for _ in 0..limit {
            fleet.request(1, &tenant(1), 1, 1, &answered, now);
        }
        let before = fleet.admitted.of(now, &1);
        prop_assert!(before <= limit - limit / 2 + 1, "r1 got {} while r0 held its half", before);
        // r0 has been idle long enough: it releases what it did not admit.
        fleet.tick(0, Delivery::Answered, now + RELEASE_IDLE_MS);
        let released = fleet.regions[0].machine().fair().and_then(|f| f.pending_release().cloned());
        prop_assert_eq!(released, None);
        for _ in 0..limit {
            fleet.request(1, &tenant(1), 1, 1, &answered, now + RE_ASK_MS + 2);
        }
        let after = fleet.admitted.of(now, &1);
        prop_assert_eq!(after, limit - 2, "r1 should get everything r0 did not admit");
    }
}

/// Why a pending release goes first. r0's release never arrives; r0 is
/// busy again. The machine resends the release before its next pool ask,
/// so the pool never answers a grant under a release still out: the window
/// holds. The same calls with the grant first (applied to the coordinator
/// in that order) let r0 spend the total the grant answers, and the
/// release, applied after, hands those spent tokens to r1.
#[test]
fn a_release_retried_after_a_grant_would_over_admit() {
    let outcome = |grant_first: bool| {
        let mut fleet = Fleet::new(10, 2, RELEASE_IDLE_MS);
        let now = 20_000;
        let answered = [Delivery::Answered];
        // r0 joins with 1, then asks for a batch (1 + 4 = 5), admits 2.
        for _ in 0..2 {
            fleet.request(0, &tenant(0), 1, 1, &answered, now);
        }
        // r1 joins and takes the other half.
        for _ in 0..10 {
            fleet.request(1, &tenant(1), 1, 1, &answered, now);
        }
        // r0 goes idle: its release (from 5, keep 2) never arrives.
        let idle = now + RELEASE_IDLE_MS;
        let calls = fleet.regions[0].tick(at(idle));
        let lost: PendingRelease<u64> = match calls.as_slice() {
            [Action::SendPoolRelease(pending)] => pending.clone(),
            other => panic!("expected a release, got {other:?}"),
        };
        assert_eq!((lost.from_total, lost.keep_total), (5, 2));
        fleet.perform(0, calls, &[Delivery::NotApplied], idle);
        // r0 is busy again once it may call the coordinator again.
        let retry = idle + PROBE_INTERVAL_MS + 1;
        if grant_first {
            // The grant answers r0's total (5), which it spends; then the
            // release's retry applies (the total is 5 again).
            let grant: Call = Action::SendPoolGrant {
                call: u64::MAX,
                region_weight: WEIGHT_SCALE,
                want_total: 5,
                want_more: 0,
                demand_window_ms: 0,
                demands: Vec::new(),
                join_next: None,
            };
            fleet.coordinator.answer(0, &grant, retry);
            let spent = Served {
                granted: 5 - fleet.admitted.of(now, &0),
                window_start_ms: now,
                window_end_ms: now + WINDOW_MS,
                remaining_lifetime_ms: WINDOW_MS,
                from_fallback: false,
                held_after: 0,
            };
            fleet.admitted.record(0, &spent, retry);
            let release = fleet.regions[0].tick(at(retry));
            let resent = matches!(release.as_slice(), [Action::SendPoolRelease(pending)] if *pending == lost);
            assert!(resent, "expected the release's resend, got {release:?}");
            fleet.perform(0, release, &answered, retry);
        } else {
            // The machine resends the release first, then asks the pool;
            // it spends what the pool then grants.
            for _ in 0..5 {
                fleet.request(0, &tenant(0), 1, 1, &answered, retry);
            }
            assert_eq!(fleet.admitted.of(now, &0), 5);
        }
        // r1 looks again and takes what was released.
        for _ in 0..10 {
            fleet.request(1, &tenant(1), 1, 1, &answered, retry + 1);
        }
        fleet.admitted.totals().values().copied().max().unwrap_or(0)
    };
    assert!(
        outcome(true) > 10,
        "with the grant first the window is over-admitted"
    );
    assert!(outcome(false) <= 10);
}

/// Three regions of weights 1, 2, 3 each asking far beyond the limit,
/// every call answered: after the first windows each window is used in
/// full, split by weight, at two pool calls per region per window (the
/// warm start joins for half the previous guarantee and asks for the rest
/// next; a region held at its share stops looking).
#[test]
fn steady_overload_costs_at_most_five_pool_calls_for_three_regions_per_window() {
    let limit = 600;
    let mut fleet = Fleet::new(limit, 3, NODE_RELEASE_IDLE_MS);
    let answered = [Delivery::Answered];
    let weights = [1u64, 2, 3];
    let start = 10 * WINDOW_MS;
    let windows = 20;
    // One request per region every 100 µs on average: 10 per ms in all,
    // ~16× the limit.
    for step in 0..windows * WINDOW_MS * 10 {
        let now = start + step / 10;
        let r = (step % 3) as usize;
        fleet.request(r, &tenant(r), weights[r], 1, &answered, now);
    }
    let steady: Vec<u64> = (5..windows).map(|w| start + w * WINDOW_MS).collect();
    // The first window ramps from nothing: a handful of asks, each half
    // as large again as the budget.
    let first = fleet.grant_calls.get(&start).copied().unwrap_or(0);
    assert!(first <= 50, "{first} pool calls in the first window");
    // Each region joins once for its whole share; the two that join
    // before every region has look once more when the leader stops
    // expecting the others (one may have gone): 5 calls, not 6.
    for w in &steady {
        let calls = fleet.grant_calls.get(w).copied().unwrap_or(0);
        assert!(
            (3..=5).contains(&calls),
            "{calls} pool calls in window {w} at steady state"
        );
    }
    for w in &steady {
        let shares: Vec<u64> = (0..3).map(|r| fleet.admitted.of(*w, &r)).collect();
        let total: u64 = shares.iter().sum();
        assert!(total * 100 >= limit * 99, "window {w}: {total} of {limit}");
        assert!(total <= limit);
        for (i, got) in shares.iter().enumerate() {
            let ideal = limit * weights[i] / 6;
            assert!(
                got.abs_diff(ideal) <= limit / 50,
                "window {w}: region {i} got {got}, ideal {ideal}"
            );
        }
    }
}

/// Three regions of weights 1, 2, 3 in steady overload; region 2 goes
/// quiet in window 8 and comes back in window 12. The window it left is
/// still used to ≥ 99 % by the other two (the leader stops expecting it a
/// quarter window in, and they look again then), split 1:2. The window it
/// returns in it may get nothing (the others joined for their shares
/// before it came, and grants are never taken back); from the next one on
/// every region is within 2 % of L of its weighted share again: the
/// leader caps the others' joins while it is expected.
#[test]
fn a_region_that_leaves_strands_nothing_and_one_that_returns_is_served_again() {
    let limit = 600;
    let mut fleet = Fleet::new(limit, 3, NODE_RELEASE_IDLE_MS);
    let answered = [Delivery::Answered];
    let weights = [1u64, 2, 3];
    let start = 10 * WINDOW_MS;
    let (leaves, returns, windows) = (8, 12, 18);
    for step in 0..windows * WINDOW_MS * 10 {
        let now = start + step / 10;
        let r = (step % 3) as usize;
        let window = (now - start) / WINDOW_MS;
        if r == 2 && (leaves..returns).contains(&window) {
            // Its timer still fires (a join ahead to hand back).
            fleet.tick(r, Delivery::Answered, now);
            continue;
        }
        fleet.request(r, &tenant(r), weights[r], 1, &answered, now);
    }
    let shares = |fleet: &Fleet, w: u64| -> Vec<u64> {
        (0..3)
            .map(|r| fleet.admitted.of(start + w * WINDOW_MS, &r))
            .collect()
    };
    for w in leaves..returns {
        let got = shares(&fleet, w);
        let total: u64 = got.iter().sum();
        assert!(
            total * 100 >= limit * 99 && total <= limit,
            "window {w}: {got:?}"
        );
        assert_eq!(got[2], 0);
        if w > leaves {
            assert!(
                got[0].abs_diff(limit / 3) <= limit / 50,
                "window {w}: {got:?}"
            );
        }
    }
    for w in returns + 1..windows {
        let got = shares(&fleet, w);
        let total: u64 = got.iter().sum();
        assert!(
            total * 100 >= limit * 99 && total <= limit,
            "window {w}: {got:?}"
        );
        for (i, share) in got.iter().enumerate() {
            let ideal = limit * weights[i] / 6;
            assert!(
                share.abs_diff(ideal) <= limit / 50,
                "window {w}: region {i} got {share}, ideal {ideal} ({got:?})"
            );
        }
    }
}

/// Region 0 serves two tenants of weight 1, region 1 one of weight 2,
/// all far beyond the limit; region 1 always joins first and the first
/// tenant of region 0 always makes region 0's join: the join declares both
/// of region 0's tenants, so the regions split L evenly although a window
/// costs one call or two.
#[test]
fn a_join_weighs_every_tenant_of_the_region() {
    let limit = 600;
    let mut fleet = Fleet::new(limit, 2, NODE_RELEASE_IDLE_MS);
    let answered = [Delivery::Answered];
    let start = 10 * WINDOW_MS;
    let windows = 12;
    for step in 0..windows * WINDOW_MS * 6 {
        let now = start + step / 6;
        match step % 3 {
            0 => fleet.request(1, &tenant(2), 2, 1, &answered, now),
            1 => fleet.request(0, &tenant(0), 1, 1, &answered, now),
            _ => fleet.request(0, &tenant(1), 1, 1, &answered, now),
        }
    }
    for w in (4..windows).map(|w| start + w * WINDOW_MS) {
        let shares: Vec<u64> = (0..2).map(|r| fleet.admitted.of(w, &r)).collect();
        assert!(
            shares[0].abs_diff(300) <= 12 && shares[1].abs_diff(300) <= 12,
            "window {w}: {shares:?}"
        );
    }
}

/// Where the unused tokens of the windows under 99 % sat at their end
/// (the light-worlds report's `FAIR_DIAG`).
#[derive(Debug, Default)]
struct LostTokens {
    windows: u64,
    /// Granted to regions that were served all they asked and not spent:
    /// margins kept to the end.
    held_by_the_served: u64,
    /// Granted to regions denied part of what they asked and not spent:
    /// granted too late to spend.
    held_by_the_short: u64,
    /// Granted to no region.
    unclaimed: u64,
}

/// One region of a random demand world: its weight and its chance, per
/// thousand, of a request each millisecond (cost 1) before and after the
/// demand shifts.
#[derive(Debug, Clone, Copy)]
struct Demand {
    weight: u64,
    per_mille_before: u64,
    per_mille_after: u64,
}

fn demand_world() -> impl Strategy<Value = Vec<Demand>> {
    let rate = prop_oneof![
        2 => 20u64..200,    // light: 20–200 requests per window
        3 => 800u64..1_000, // heavy: beyond any share of L
        1 => Just(0u64),    // quiet
    ];
    proptest::collection::vec(
        (1u64..4, rate.clone(), rate).prop_map(|(weight, before, after)| Demand {
            weight,
            per_mille_before: before,
            per_mille_after: after,
        }),
        2..5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Random demand worlds (2–4 regions of random weights, each heavy —
    /// far beyond any share of L —, light — 20 to 200 requests a window —
    /// or quiet, which it is switching half way), every call answered,
    /// reclaim at the node's default, once each demand regime has run
    /// three windows. Heavy and quiet regions only: every window uses at
    /// least 99 % of what it could (L, or all the requests offered when
    /// they are fewer) at no more than 2·k − 1 pool calls for k active
    /// regions (5 per 600 admissions for three: under 10 per 1 000). With
    /// light regions — which hand back the guarantee their pace does not
    /// need a quarter window in (raising to that need first when they hold
    /// less, or joining it retired ahead), and what is left of their margin
    /// an eighth before the end —
    /// at least 80 % over the steady windows of a world (1 343 worlds: lowest
    /// 98.0 %, one in a hundred under 99.3 %, median 99.9 %; one window in
    /// 49 under 99 %. Before the raise, the late check and a roster that
    /// remembers retired regions: lowest 75 %, one in twenty under 87 %, a
    /// third of the windows under 99 %), at most 6 calls per region
    /// (measured: 5).
    #[test]
    fn random_demand_worlds_use_the_window_at_few_calls(
        world in demand_world(),
        seed in 0u64..1_000,
    ) {
        let limit = 600;
        let regions = world.len();
        let mut fleet = Fleet::new(limit, regions, NODE_RELEASE_IDLE_MS);
        let answered = [Delivery::Answered];
        let start = 10 * WINDOW_MS;
        let (windows, shift) = (14u64, 7u64);
        let mut rng = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let mut offered: BTreeMap<u64, u64> = BTreeMap::new();
        for now in start..start + windows * WINDOW_MS {
            let window = (now - start) / WINDOW_MS;
            for (r, demand) in world.iter().enumerate() {
                let per_mille = if window < shift {
                    demand.per_mille_before
                } else {
                    demand.per_mille_after
                };
                rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                if (rng >> 33) % 1_000 < per_mille {
                    *offered.entry(WindowBounds::containing(now, WINDOW_MS).start_ms).or_default() += 1;
                    fleet.request(r, &tenant(r), demand.weight, 1, &answered, now);
                }
                fleet.tick(r, Delivery::Answered, now);
            }
        }
        let steady: Vec<u64> = (3..shift).chain(shift + 3..windows).map(|w| start + w * WINDOW_MS).collect();
        let (mut admitted, mut calls) = (0, 0);
        let (mut used_sum, mut could_sum) = (0u64, 0u64);
        let light_world = world.iter().any(|d| {
            (1..500).contains(&d.per_mille_before) || (1..500).contains(&d.per_mille_after)
        });
        for w in &steady {
            let total = fleet.admitted.total(*w);
            let could = limit.min(offered.get(w).copied().unwrap_or(0));
            prop_assert!(total <= limit);
            prop_assert!(
                light_world || total * 100 >= could * 99,
                "window {}: {} admitted of {} possible ({:?})", w, total, could, world
            );
            used_sum += total;
            could_sum += could;
            admitted += total;
            // Each active region joins once; those that joined before every
            // expected region had look once more when the leader stops
            // expecting them: at most 2·active − 1 calls.
            let regime_after = *w >= start + shift * WINDOW_MS;
            let active = world
                .iter()
                .filter(|d| if regime_after { d.per_mille_after > 0 } else { d.per_mille_before > 0 })
                .count() as u64;
            let window_calls = fleet.grant_calls.get(w).copied().unwrap_or(0);
            // A region asking less than its share also hands back the
            // guarantee it does not need, and may ask and hand back again.
            let light = world.iter().any(|d| {
                let rate = if regime_after { d.per_mille_after } else { d.per_mille_before };
                (1..500).contains(&rate)
            });
            let bound = if light { 6 * active } else { (2 * active).saturating_sub(1).max(1) };
            prop_assert!(
                window_calls <= bound,
                "window {}: {} pool calls for {} active regions ({:?})", w, window_calls, active, world
            );
            calls += window_calls;
        }
        prop_assert!(calls <= admitted, "{} calls for {} admissions", calls, admitted);
        prop_assert!(
            used_sum * 100 >= could_sum * if light_world { 80 } else { 99 },
            "{} admitted of {} possible over the steady windows ({:?})", used_sum, could_sum, world
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// Random demand worlds as above, with every pool call — joins, asks,
    /// the light regions' raises and hand-backs, the late hand-backs and
    /// looks, and the releases' resends — answered, lost after being
    /// applied, or never applied, at random: Σ admitted per window never
    /// exceeds L, and the pool never grants past it.
    #[test]
    fn lost_and_unapplied_calls_never_admit_past_the_limit(
        world in demand_world(),
        seed in 0u64..1_000,
        lost_per_mille in 0u64..300,
    ) {
        let limit = 600;
        let mut fleet = Fleet::new(limit, world.len(), NODE_RELEASE_IDLE_MS);
        let start = 10 * WINDOW_MS;
        let (windows, shift) = (6u64, 3u64);
        let mut rng = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let mut next = move || {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            (rng >> 33) % 1_000
        };
        let fate = |draw: u64| {
            if draw < lost_per_mille / 2 {
                Delivery::Lost
            } else if draw < lost_per_mille {
                Delivery::NotApplied
            } else {
                Delivery::Answered
            }
        };
        for now in start..start + windows * WINDOW_MS {
            let window = (now - start) / WINDOW_MS;
            for (r, demand) in world.iter().enumerate() {
                let per_mille = if window < shift {
                    demand.per_mille_before
                } else {
                    demand.per_mille_after
                };
                if next() < per_mille {
                    let deliveries = [fate(next()), fate(next())];
                    fleet.request(r, &tenant(r), demand.weight, 1, &deliveries, now);
                }
                let delivery = fate(next());
                fleet.tick(r, delivery, now);
            }
            let granted = fleet.pool_granted(now);
            prop_assert!(granted <= limit, "the pool granted {} > {}", granted, limit);
        }
        if let Some((window, admitted)) = fleet.most_admitted() {
            prop_assert!(admitted <= limit, "window {}: {} admitted > {}", window, admitted, limit);
        }
    }
}

/// Worlds with light regions, reported: per world, the share of what its
/// steady windows could use (L, or all the requests offered when fewer)
/// that they used; the windows under 99 %; each region's shortfall against
/// the weighted max-min (water-fill) of the demand it was offered; and the
/// pool calls (grants and releases) per 1 000 admissions. Worlds as in
/// [`demand_world`] (2–4 regions of weight 1–3, each heavy, light or
/// quiet, switching half way), drawn from a fixed seed, every call
/// answered. 24 worlds by default;
/// One window under 99 % of a light world (`FAIR_TRACE`): each region's
/// weight, requests per thousand ms, pool total at the window's end,
/// admissions and requests, then the pool calls from the last quarter of
/// the window before on, with every region's total once each was
/// answered.
fn print_window(
    world: &[Demand],
    shifted: bool,
    totals: &[u64],
    fleet: &Fleet,
    demand: impl Fn(usize) -> u64,
    window_start: u64,
    calls: &[TracedCall],
) {
    let regions: Vec<String> = totals
        .iter()
        .enumerate()
        .map(|(r, granted)| {
            let d = world[r];
            let rate = if shifted {
                d.per_mille_after
            } else {
                d.per_mille_before
            };
            format!(
                "r{r} (w{} {rate}‰) held {granted} admitted {} of {}",
                d.weight,
                fleet.admitted.of(window_start, &r),
                demand(r)
            )
        })
        .collect();
    println!(
        "window at {window_start}: {} admitted; {}",
        fleet.admitted.total(window_start),
        regions.join(" | ")
    );
    let from = window_start.saturating_sub(WINDOW_MS / 4);
    for (at, r, asked, totals) in calls
        .iter()
        .filter(|(at, ..)| (from..window_start + WINDOW_MS).contains(at))
    {
        let offset = *at as i64 - window_start as i64;
        println!("  {offset:+5} ms r{r} {asked} → totals {totals:?}");
    }
}

/// `FAIR_WORLDS=1343 cargo test --release -p leasehold-core --test fleet_fair_pool light_worlds -- --nocapture`
/// for the figures in docs/benchmarks.md (`FAIR_SCALE=10` for the same
/// worlds at L = 6 000 with ten times the requests; `FAIR_DIAG=1` for where
/// the under-99 % windows' unused tokens sat at their end, `FAIR_TRACE=1`
/// to print each of those windows with its pool calls). Asserts Σ ≤ L
/// per window, at least 97 % per world (1 343 worlds: 98.0 % at the
/// lowest), a 99th-percentile shortfall under a tenth of L, and at most 10
/// pool calls per 1 000 admissions over all worlds at L = 600 (the joins
/// ahead: 13.9 without them), and at most one window in twenty under
/// 99 %.
#[test]
fn light_worlds_use_their_windows_and_keep_regions_near_their_share() {
    use leasehold_core::water_fill::{water_fill, Claim};
    let worlds: usize = std::env::var("FAIR_WORLDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(24);
    // FAIR_SCALE=k: L = 600·k and up to k requests a millisecond per
    // region (the same worlds, k times the requests, each of cost 1).
    let scale: u64 = std::env::var("FAIR_SCALE")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(1)
        .max(1);
    let limit = 600 * scale;
    let (windows, shift) = (14u64, 7u64);
    let start = 10 * WINDOW_MS;
    let mut draw = Rng::new(7);
    let (mut per_world, mut window_shares, mut shortfalls) = (Vec::new(), Vec::new(), Vec::new());
    let (mut calls, mut admissions) = (0u64, 0u64);
    // FAIR_DIAG=1: where the under-99 % windows' unused tokens sat at
    // their end (only windows that could use all of L).
    let diagnose = std::env::var("FAIR_DIAG").is_ok();
    // FAIR_TRACE=1: each such window's regions and pool calls.
    let trace = std::env::var("FAIR_TRACE").is_ok();
    let mut lost = LostTokens::default();
    while per_world.len() < worlds {
        let regions = 2 + draw.below(3) as usize;
        let rate = |draw: &mut Rng| match draw.below(6) {
            0 | 1 => 20 + draw.below(180),
            2..=4 => 800 + draw.below(200),
            _ => 0,
        };
        let world: Vec<Demand> = (0..regions)
            .map(|_| Demand {
                weight: 1 + draw.below(3),
                per_mille_before: rate(&mut draw),
                per_mille_after: rate(&mut draw),
            })
            .collect();
        let light = |rate: u64| (1..500).contains(&rate);
        if !world
            .iter()
            .any(|d| light(d.per_mille_before) || light(d.per_mille_after))
        {
            continue;
        }
        let mut fleet = Fleet::new(limit, regions, NODE_RELEASE_IDLE_MS);
        if trace {
            fleet.trace = Some(Vec::new());
        }
        let mut offered: BTreeMap<(u64, usize), u64> = BTreeMap::new();
        // Each region's pool total at each window's end (FAIR_DIAG).
        let mut held: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for now in start..start + windows * WINDOW_MS {
            let window = (now - start) / WINDOW_MS;
            let window_start = WindowBounds::containing(now, WINDOW_MS).start_ms;
            for (r, demand) in world.iter().enumerate() {
                let per_mille = if window < shift {
                    demand.per_mille_before
                } else {
                    demand.per_mille_after
                };
                for _ in 0..scale {
                    if draw.below(1_000) < per_mille {
                        *offered.entry((window_start, r)).or_default() += 1;
                        fleet.request(r, &tenant(r), demand.weight, 1, &[], now);
                    }
                }
                fleet.tick(r, Delivery::Answered, now);
            }
            if diagnose && now % WINDOW_MS == WINDOW_MS - 1 {
                held.insert(window_start, fleet.region_totals(now));
            }
        }
        let (mut used, mut could) = (0u64, 0u64);
        for w in (3..shift).chain(shift + 3..windows) {
            let window_start = start + w * WINDOW_MS;
            let total = fleet.admitted.total(window_start);
            assert!(total <= limit, "{total} admitted in a window of {limit}");
            let demand = |r: usize| offered.get(&(window_start, r)).copied().unwrap_or(0);
            let can = limit.min((0..regions).map(demand).sum());
            if can == 0 {
                continue;
            }
            window_shares.push(total as f64 / can as f64);
            if let Some(totals) = held.get(&window_start).filter(|_| can == limit) {
                if total * 100 < can * 99 {
                    if let Some(calls) = fleet.trace.as_ref() {
                        print_window(
                            &world,
                            w >= shift,
                            totals,
                            &fleet,
                            demand,
                            window_start,
                            calls,
                        );
                    }
                    lost.windows += 1;
                    lost.unclaimed += limit.saturating_sub(totals.iter().sum());
                    for (r, granted) in totals.iter().enumerate() {
                        let got = fleet.admitted.of(window_start, &r);
                        let unspent = granted.saturating_sub(got);
                        if demand(r) > got {
                            lost.held_by_the_short += unspent;
                        } else {
                            lost.held_by_the_served += unspent;
                        }
                    }
                }
            }
            (used, could) = (used + total, could + can);
            let claims: Vec<Claim> = (0..regions)
                .map(|r| Claim {
                    weight: world[r].weight,
                    demand: demand(r),
                })
                .collect();
            for (r, ideal) in water_fill(limit, &claims).into_iter().enumerate() {
                let short = ideal.saturating_sub(fleet.admitted.of(window_start, &r));
                shortfalls.push(short as f64 / limit as f64);
            }
            calls += fleet.grant_calls.get(&window_start).copied().unwrap_or(0)
                + fleet.release_calls.get(&window_start).copied().unwrap_or(0);
            admissions += total;
        }
        per_world.push(used as f64 / could.max(1) as f64);
    }
    let sorted = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v
    };
    let at = |v: &[f64], q: f64| v[((v.len() - 1) as f64 * q) as usize];
    let (per_world, window_shares, shortfalls) =
        (sorted(per_world), sorted(window_shares), sorted(shortfalls));
    let under = window_shares.iter().filter(|s| **s < 0.99).count();
    println!(
        "{} worlds: per world lowest {:.3}, 1st percentile {:.3}, 5th {:.3}, median {:.3}; \
         windows under 99 %: {} of {}; shortfall against max-min, 99th percentile {:.3} of L; \
         {:.1} pool calls per 1 000 admissions",
        per_world.len(),
        at(&per_world, 0.0),
        at(&per_world, 0.01),
        at(&per_world, 0.05),
        at(&per_world, 0.5),
        under,
        window_shares.len(),
        at(&shortfalls, 0.99),
        1_000.0 * calls as f64 / admissions.max(1) as f64,
    );
    if diagnose {
        let per_window = |tokens: u64| tokens as f64 / lost.windows.max(1) as f64;
        println!(
            "{} windows under 99 % that could use L: unused tokens a window held by regions \
             served all they asked {:.1}, held by regions short of their asks {:.1}, \
             granted to no region {:.1}",
            lost.windows,
            per_window(lost.held_by_the_served),
            per_window(lost.held_by_the_short),
            per_window(lost.unclaimed),
        );
    }
    assert!(
        at(&per_world, 0.0) >= 0.97,
        "a world used {:.3}",
        at(&per_world, 0.0)
    );
    assert!(
        calls * 100 <= admissions,
        "{calls} pool calls for {admissions} admissions"
    );
    assert!(
        under * 20 <= window_shares.len(),
        "{under} windows of {} under 99 %",
        window_shares.len()
    );
    assert!(
        at(&shortfalls, 0.99) < 0.1,
        "shortfall {:.3}",
        at(&shortfalls, 0.99)
    );
}

/// What handing back costs: a weight-1 region asking 100 a window beside
/// an equal heavy one hands back the guarantee it does not need; when its
/// demand jumps to 950 a window half way through a window, it is served
/// only what the pool still has free for the rest of that window (the
/// heavy region took the rest), and its full share from the next window
/// on. Σ admitted ≤ L throughout.
#[test]
fn a_region_whose_demand_jumps_after_handing_back_gets_its_share_from_the_next_window() {
    let limit = 600;
    let mut fleet = Fleet::new(limit, 2, NODE_RELEASE_IDLE_MS);
    let start = 10 * WINDOW_MS;
    let jump_window = 8u64;
    let mut rng = 12_345u64;
    for now in start..start + 12 * WINDOW_MS {
        let (window, into) = ((now - start) / WINDOW_MS, (now - start) % WINDOW_MS);
        for r in 0..2 {
            let jumped = window > jump_window || (window == jump_window && into >= WINDOW_MS / 2);
            let per_mille = if r == 1 || jumped { 950 } else { 100 };
            rng = rng
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            if (rng >> 33) % 1_000 < per_mille {
                fleet.request(r, &tenant(r), 1, 1, &[], now);
            }
            fleet.tick(r, Delivery::Answered, now);
        }
    }
    let window = |w: u64| start + w * WINDOW_MS;
    for w in 5..12 {
        assert!(fleet.admitted.total(window(w)) <= limit);
    }
    // Light: all of its ~100, the heavy region the rest of L.
    for w in 5..jump_window {
        assert!(
            fleet.admitted.total(window(w)) * 100 >= limit * 99,
            "window {w}"
        );
    }
    // The jump window: at least what it asked for before the jump (what
    // it kept at its hand-back; 107 here, of a 300 share).
    let jumped = fleet.admitted.of(window(jump_window), &0);
    assert!(jumped >= 100, "{jumped} admitted in the jump window");
    // From the next window on: its weighted share, 300 of 600.
    for w in jump_window + 1..12 {
        let got = fleet.admitted.of(window(w), &0);
        assert!((294..=306).contains(&got), "window {w}: {got}");
    }
}
