//! Several regions' fair keys against one in-process region fair pool with
//! exactly-once request ids, under lost answers and calls that never
//! arrive: Σ admitted per window never exceeds L.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;
use crate::fair_pool::RegionFairPool;
use crate::ids::RegionId;

const WINDOW_MS: u64 = 1_000;
const LEASE_SIZE: u64 = 4;
const RE_ASK_MS: u64 = 50;

/// What becomes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    /// Applied and answered.
    Answered,
    /// Applied, answer lost (the caller sees a failure).
    Lost,
    /// Never arrived.
    NotApplied,
}

fn delivery() -> impl Strategy<Value = Delivery> {
    prop_oneof![
        6 => Just(Delivery::Answered),
        1 => Just(Delivery::Lost),
        1 => Just(Delivery::NotApplied),
    ]
}

/// The coordinator: the pool plus the first answer of every release id.
struct Coordinator {
    pool: RegionFairPool,
    limit: u64,
    releases: HashMap<u64, ReleaseAnswer>,
}

impl Coordinator {
    fn grant(&mut self, region: &RegionId, weight: u64, want: u64, now: u64) -> PoolAnswer {
        let total = self
            .pool
            .grant(region, weight, want, now)
            .expect("weight ≥ 1");
        let window = WindowBounds::containing(now, WINDOW_MS);
        PoolAnswer {
            granted_total: total,
            limit: self.limit,
            window,
            remaining_lifetime_ms: window.end_ms - now,
            standing: self.pool.standing(region),
        }
    }

    fn release(
        &mut self,
        region: &RegionId,
        pending: &PendingRelease<u64>,
        now: u64,
    ) -> ReleaseAnswer {
        if let Some(first) = self.releases.get(&pending.request_id) {
            return *first;
        }
        let answer = if WindowBounds::containing(now, WINDOW_MS) != pending.window {
            ReleaseAnswer::WindowEnded
        } else {
            match self
                .pool
                .retire(region, pending.from_total, pending.keep_total, now)
            {
                Some(released) => ReleaseAnswer::Released { released },
                None => ReleaseAnswer::StaleTotal {
                    granted_total: self
                        .pool
                        .stats()
                        .regions
                        .iter()
                        .find(|(id, _)| id == region)
                        .map_or(0, |(_, m)| m.granted),
                },
            }
        };
        self.releases.insert(pending.request_id, answer);
        answer
    }
}

struct Region {
    name: RegionId,
    key: FairKey<u64>,
    admitted: BTreeMap<u64, u64>,
}

struct Fleet {
    coordinator: Coordinator,
    regions: Vec<Region>,
    next_id: u64,
    /// Pool grant calls sent, per window of the call.
    grant_calls: BTreeMap<u64, u64>,
    /// Whether a pending release is resent before any pool call (the rule
    /// under test); off only to show what breaks without it.
    resend_first: bool,
}

impl Fleet {
    fn new(limit: u64, regions: usize, resend_first: bool) -> Self {
        Fleet {
            coordinator: Coordinator {
                pool: RegionFairPool::new(limit, WINDOW_MS).expect("valid pool"),
                limit,
                releases: HashMap::new(),
            },
            regions: (0..regions)
                .map(|i| Region {
                    name: RegionId::new(format!("r{i}")).expect("valid region"),
                    key: FairKey::new(8),
                    admitted: BTreeMap::new(),
                })
                .collect(),
            next_id: 0,
            grant_calls: BTreeMap::new(),
            resend_first,
        }
    }

    /// Sends `region`'s pending release; true when it was answered.
    fn send_release(&mut self, r: usize, delivery: Delivery, now: u64) -> bool {
        let Some(pending) = self.regions[r].key.pending_release().cloned() else {
            return true;
        };
        if delivery == Delivery::NotApplied {
            return false;
        }
        let answer = self
            .coordinator
            .release(&self.regions[r].name, &pending, now);
        if delivery == Delivery::Lost {
            return false;
        }
        self.regions[r].key.on_release_answer(answer);
        true
    }

    fn request(
        &mut self,
        r: usize,
        tenant: &TenantId,
        weight: u64,
        cost: u64,
        calls: &[Delivery],
        now: u64,
    ) {
        let mut calls = calls.iter().copied().cycle();
        for _ in 0..8 {
            match self.regions[r]
                .key
                .decide(tenant, weight, cost, LEASE_SIZE, now)
            {
                FairStep::Admit { served, .. } => {
                    *self.regions[r]
                        .admitted
                        .entry(served.window_start_ms)
                        .or_default() += served.granted;
                    return;
                }
                FairStep::Deny { .. } => return,
                FairStep::Join {
                    region_weight,
                    want_total,
                }
                | FairStep::Ask {
                    region_weight,
                    want_total,
                } => {
                    if self.resend_first
                        && !self.send_release(r, calls.next().unwrap_or(Delivery::Answered), now)
                    {
                        return;
                    }
                    let delivery = calls.next().unwrap_or(Delivery::Answered);
                    *self
                        .grant_calls
                        .entry(WindowBounds::containing(now, WINDOW_MS).start_ms)
                        .or_default() += 1;
                    if delivery == Delivery::NotApplied {
                        return;
                    }
                    let answer = self.coordinator.grant(
                        &self.regions[r].name,
                        region_weight,
                        want_total,
                        now,
                    );
                    if delivery == Delivery::Lost {
                        return;
                    }
                    self.regions[r]
                        .key
                        .on_pool_answer(answer, want_total, now, now, RE_ASK_MS);
                }
            }
        }
    }

    fn release(&mut self, r: usize, delivery: Delivery, now: u64) {
        if self.regions[r].key.pending_release().is_none() {
            self.next_id += 1;
            let id = self.next_id;
            if self.regions[r].key.begin_release(id, now).is_none() {
                return;
            }
        }
        self.send_release(r, delivery, now);
    }

    /// Σ admitted per window over every region.
    fn admitted_per_window(&self) -> BTreeMap<u64, u64> {
        let mut sums = BTreeMap::new();
        for region in &self.regions {
            for (window, admitted) in &region.admitted {
                *sums.entry(*window).or_default() += admitted;
            }
        }
        sums
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
    Release {
        region: usize,
        delivery: Delivery,
    },
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
    let release =
        (0usize..3, delivery()).prop_map(|(region, delivery)| Op::Release { region, delivery });
    (
        prop_oneof![6 => request, 2 => release],
        prop_oneof![4 => Just(0u64), 3 => 1u64..40, 1 => 100u64..700],
    )
}

fn tenant(i: usize) -> TenantId {
    TenantId::new(format!("t{i}")).expect("valid tenant")
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Whatever is lost, retried or released, Σ admitted per window ≤ L,
    /// and the pool never grants past L.
    #[test]
    fn regions_never_admit_past_the_limit(
        limit in 3u64..80,
        ops in proptest::collection::vec(op(), 1..160),
    ) {
        let mut fleet = Fleet::new(limit, 3, true);
        let mut now = 5_000u64;
        for (op, advance) in ops {
            now += advance;
            match op {
                Op::Request { region, tenant: t, weight, cost, calls } => {
                    fleet.request(region, &tenant(t), weight, cost, &calls, now)
                }
                Op::Release { region, delivery } => fleet.release(region, delivery, now),
            }
            prop_assert!(fleet.coordinator.pool.stats().total_granted <= limit);
        }
        for (window, admitted) in fleet.admitted_per_window() {
            prop_assert!(admitted <= limit, "window {}: {} admitted > {}", window, admitted, limit);
        }
    }

    /// With every call answered, a region that went idle and released
    /// lets the busy one use what it did not admit.
    #[test]
    fn an_idle_regions_release_goes_to_the_busy_one(limit in 20u64..200) {
        let mut fleet = Fleet::new(limit, 2, true);
        let now = 10_000;
        let answered = [Delivery::Answered];
        // r0 joins and admits a little; r1 then takes what the pool gives.
        for _ in 0..2 {
            fleet.request(0, &tenant(0), 1, 1, &answered, now);
        }
        for _ in 0..limit {
            fleet.request(1, &tenant(1), 1, 1, &answered, now);
        }
        let before = fleet.regions[1].admitted.values().sum::<u64>();
        prop_assert!(before <= limit - limit / 2 + 1, "r1 got {} while r0 held its half", before);
        fleet.release(0, Delivery::Answered, now + 1);
        for _ in 0..limit {
            fleet.request(1, &tenant(1), 1, 1, &answered, now + RE_ASK_MS + 2);
        }
        let after = fleet.regions[1].admitted.values().sum::<u64>();
        prop_assert_eq!(after, limit - 2, "r1 should get everything r0 did not admit");
    }
}

/// Why a pending release goes first: a release that never arrived, then a
/// grant the region spends, then the release's retry — applied, since the
/// region's total is again what the release names — hands the spent tokens
/// to another region. Resending before the grant settles it first.
#[test]
fn a_release_retried_after_a_grant_would_over_admit() {
    let outcome = |resend_first: bool| {
        let mut fleet = Fleet::new(10, 2, resend_first);
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
        // r0's release (from 5, keep 2) never arrives.
        fleet.release(0, Delivery::NotApplied, now);
        // r0 is busy again: a grant answers its total (5), and it spends it.
        for _ in 0..5 {
            fleet.request(0, &tenant(0), 1, 1, &answered, now + 1);
        }
        // The release's retry now applies (the total is 5 again) and r1
        // takes the 3 "released" tokens r0 already spent.
        fleet.release(0, Delivery::Answered, now + 2);
        for _ in 0..10 {
            fleet.request(1, &tenant(1), 1, 1, &answered, now + 2 + RE_ASK_MS);
        }
        fleet
            .admitted_per_window()
            .values()
            .copied()
            .max()
            .unwrap_or(0)
    };
    assert!(
        outcome(false) > 10,
        "without the rule the window is over-admitted"
    );
    assert!(outcome(true) <= 10);
}

/// Three regions of weights 1, 2, 3 each asking far beyond the limit,
/// every call answered: after the first windows each window is used in
/// full, split by weight, at two pool calls per region per window (the
/// warm start joins for half the previous guarantee and asks for the rest
/// next; a region held at its share stops looking).
#[test]
fn steady_overload_costs_two_pool_calls_per_region_per_window() {
    let limit = 600;
    let mut fleet = Fleet::new(limit, 3, true);
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
    let calls: u64 = steady
        .iter()
        .map(|w| fleet.grant_calls.get(w).copied().unwrap_or(0))
        .sum();
    let per_window = calls as f64 / steady.len() as f64;
    assert!(
        per_window <= 6.0,
        "{per_window} pool calls per window at steady state"
    );
    for w in &steady {
        let shares: Vec<u64> = fleet
            .regions
            .iter()
            .map(|r| r.admitted.get(w).copied().unwrap_or(0))
            .collect();
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

/// Region 0 serves two tenants of weight 1, region 1 one of weight 2,
/// all far beyond the limit; region 1 always joins first and the first
/// tenant of region 0 always makes region 0's join: the join declares both
/// of region 0's tenants, so the regions split L evenly although a window
/// costs one call or two.
#[test]
fn a_join_weighs_every_tenant_of_the_region() {
    let limit = 600;
    let mut fleet = Fleet::new(limit, 2, true);
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
        let shares: Vec<u64> = fleet
            .regions
            .iter()
            .map(|r| r.admitted.get(&w).copied().unwrap_or(0))
            .collect();
        assert!(
            shares[0].abs_diff(300) <= 12 && shares[1].abs_diff(300) <= 12,
            "window {w}: {shares:?}"
        );
    }
}

/// A tenant's demand of one window is reported when the next is joined,
/// and the settled totals (two windows back) the pool answers split its
/// weight by its share of its demand.
#[test]
fn a_spanning_tenant_weighs_its_share_of_its_demand() {
    let mut key: FairKey<u64> = FairKey::new(8);
    let answer = |start: u64, now: u64| PoolAnswer {
        granted_total: 100,
        limit: 1_000,
        window: WindowBounds {
            start_ms: start,
            end_ms: start + WINDOW_MS,
        },
        remaining_lifetime_ms: start + WINDOW_MS - now,
        standing: None,
    };
    key.on_pool_answer(answer(0, 10), 10, 10, 10, RE_ASK_MS);
    key.note_demand(&tenant(1), 30);
    key.note_demand(&tenant(2), 10);
    key.note_demand(&tenant(1), 10);
    // Nothing to report while the first window runs; full weights.
    assert_eq!(key.demand_report(500), None);
    assert_eq!(key.split_weight(&tenant(1), 2), 2 * WEIGHT_SCALE);
    // Its grant expired: a join reports the window that just ended.
    let ended = Some((0, vec![(tenant(1), 40), (tenant(2), 10)]));
    assert_eq!(key.demand_report(WINDOW_MS + 5), ended);
    key.on_pool_answer(
        answer(WINDOW_MS, WINDOW_MS + 5),
        10,
        WINDOW_MS + 5,
        WINDOW_MS + 5,
        RE_ASK_MS,
    );
    // Within the next window, asks report the same (previous) window.
    assert_eq!(key.demand_report(WINDOW_MS + 6), ended);
    key.note_demand(&tenant(1), 5);
    let later = 2 * WINDOW_MS + 5;
    key.on_pool_answer(answer(2 * WINDOW_MS, later), 10, later, later, RE_ASK_MS);
    // t1 asked here for 40 of its 80: half its weight; t2 only here: all of it.
    key.on_tenant_demands(0, vec![(tenant(1), 80), (tenant(2), 10)]);
    assert_eq!(key.split_weight(&tenant(1), 2), WEIGHT_SCALE);
    assert_eq!(key.split_weight(&tenant(2), 3), 3 * WEIGHT_SCALE);
    assert_eq!(key.split_weight(&tenant(3), 1), WEIGHT_SCALE);
    // The region weight asked for carries the split weight.
    match key.decide(&tenant(1), 2, 200, LEASE_SIZE, later + 1) {
        FairStep::Ask { region_weight, .. } => assert_eq!(region_weight, WEIGHT_SCALE),
        other => panic!("expected an ask, got {other:?}"),
    }
    // Totals of a window other than the settled one (0) do not split.
    key.on_tenant_demands(WINDOW_MS, vec![(tenant(1), 80)]);
    assert_eq!(key.split_weight(&tenant(1), 2), 2 * WEIGHT_SCALE);
}

/// An answer naming more tenants than any report can (a buggy or hostile
/// coordinator) is kept to [`MAX_REPORTED_TENANTS`]: memory stays bounded.
#[test]
fn demand_totals_from_an_answer_are_bounded() {
    let mut key: FairKey<u64> = FairKey::new(8);
    let flood = |n: usize| (0..n).map(|i| (tenant(i), 1)).collect::<Vec<_>>();
    key.on_tenant_demands(0, flood(10_000));
    key.on_tenant_demands(0, flood(20_000).split_off(10_000));
    let held = key.totals.as_ref().map_or(0, |(_, totals)| totals.len());
    assert_eq!(held, MAX_REPORTED_TENANTS);
}

proptest! {
    /// The split weights of one tenant over the regions that reported it
    /// add up to its declared weight (in thousandths, within rounding).
    #[test]
    fn split_weights_add_up_to_the_declared_weight(
        weight in 1u64..1_000,
        demands in proptest::collection::vec(1u64..10_000, 1..6),
    ) {
        let total: u64 = demands.iter().sum();
        let mut sum = 0;
        for own in &demands {
            let mut key: FairKey<u64> = FairKey::new(8);
            let answer = |start: u64| PoolAnswer {
                granted_total: 1,
                limit: 1,
                window: WindowBounds { start_ms: start, end_ms: start + WINDOW_MS },
                remaining_lifetime_ms: WINDOW_MS,
                standing: None,
            };
            key.on_pool_answer(answer(0), 1, 0, 0, RE_ASK_MS);
            key.note_demand(&tenant(0), *own);
            key.on_pool_answer(answer(WINDOW_MS), 1, WINDOW_MS, WINDOW_MS, RE_ASK_MS);
            key.on_pool_answer(answer(2 * WINDOW_MS), 1, 2 * WINDOW_MS, 2 * WINDOW_MS, RE_ASK_MS);
            key.on_tenant_demands(0, vec![(tenant(0), total)]);
            sum += key.split_weight(&tenant(0), weight);
        }
        let declared = weight * WEIGHT_SCALE;
        prop_assert!(sum <= declared + demands.len() as u64 && sum + demands.len() as u64 >= declared,
            "shares {} vs declared {}", sum, declared);
    }
}
