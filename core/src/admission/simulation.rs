//! Seeded synthetic workloads and the regret benchmarks that measure the
//! bid-price filter against marginal-AND (the gates of `docs/admission.md`).
//!
//! Everything is deterministic given the seed: the random source is a
//! SplitMix64 stream passed in by value, never a global.
//!
//! Regret is `1 − earned / benchmark`, against two benchmarks, always
//! named: the **fluid** LP value of the prior (what the seed's table uses)
//! and the **hindsight** optimum of the realised stream (an exact
//! knapsack over the type counts).

use super::bid_price::{replay_value, BidPriceFilter, Budgets, Observed, RequestType, Workload};

/// The knife-edge workload of docs/admission.md: 1 000 small requests
/// (cost 10, value 1) and 1 000 large ones (cost 100, value 5) against a
/// cost budget. Between budgets of 10 000 and 110 000 the LP admits the
/// large type in part, at exactly its price.
pub fn knife_edge_workload(cost_budget: f64) -> Workload {
    Workload {
        types: vec![
            RequestType {
                cost: 10.0,
                value: 1.0,
                weight: 1_000.0,
                hold: 0.0,
            },
            RequestType {
                cost: 100.0,
                value: 5.0,
                weight: 1_000.0,
                hold: 0.0,
            },
        ],
        rate_budget: None,
        cost_budget,
        concurrency_budget: None,
    }
}

/// A SplitMix64 random stream (deterministic, seedable, no dependency).
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream starting at `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A two-type Markov stream of `n` type indices with lag-one
/// autocorrelation `rho ∈ [−1, 1]`: the next arrival repeats the previous
/// type with probability `(1 + rho) / 2`; the first is 50/50. `rho = −1`
/// alternates, `0` is independent, `+1` is one type forever.
pub fn markov_stream(rng: &mut SplitMix64, n: usize, rho: f64) -> Vec<usize> {
    let stay = ((1.0 + rho) / 2.0).clamp(0.0, 1.0);
    let mut out = Vec::with_capacity(n);
    let mut current = usize::from(rng.next_f64() < 0.5);
    for i in 0..n {
        if i > 0 && rng.next_f64() >= stay {
            current = 1 - current;
        }
        out.push(current);
    }
    out
}

/// The requests of a stream of type indices.
pub fn realise(stream: &[usize], types: &[RequestType]) -> Vec<Observed> {
    stream
        .iter()
        .map(|&i| Observed {
            cost: types[i].cost,
            value: types[i].value,
            hold: types[i].hold,
        })
        .collect()
}

/// The best value any subset of a two-type stream can earn within the
/// request and cost budgets (exact: for each count of type 0, the most of
/// type 1 that still fits).
pub fn hindsight_two_types(stream: &[usize], types: &[RequestType; 2], budgets: Budgets) -> f64 {
    let counts = [
        stream.iter().filter(|&&i| i == 0).count() as f64,
        stream.iter().filter(|&&i| i == 1).count() as f64,
    ];
    let rate = budgets.rate.unwrap_or(f64::INFINITY);
    let mut best: f64 = 0.0;
    let mut k0 = 0.0;
    while k0 <= counts[0] {
        let cost_left = budgets.cost - k0 * types[0].cost;
        let rate_left = rate - k0;
        if cost_left < 0.0 || rate_left < 0.0 {
            break;
        }
        let by_cost = if types[1].cost > 0.0 {
            (cost_left / types[1].cost).floor()
        } else {
            f64::INFINITY
        };
        let k1 = counts[1].min(by_cost).min(rate_left.floor());
        best = best.max(k0 * types[0].value + k1 * types[1].value);
        k0 += 1.0;
    }
    best
}

/// Regrets of marginal-AND and of a bid-price filter on one workload
/// family, averaged over seeds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RegretRow {
    /// The autocorrelation.
    pub rho: f64,
    /// Mean regret of marginal-AND against the fluid value.
    pub marginal_vs_fluid: f64,
    /// Mean regret of the filter against the fluid value.
    pub bid_price_vs_fluid: f64,
    /// Mean regret of marginal-AND against hindsight.
    pub marginal_vs_hindsight: f64,
    /// Mean regret of the filter against hindsight.
    pub bid_price_vs_hindsight: f64,
    /// Smallest and largest per-seed advantage (marginal − filter) against
    /// hindsight: the spread.
    pub advantage_vs_hindsight_range: (f64, f64),
}

impl RegretRow {
    /// ε against the fluid value (positive: the filter wins).
    pub fn advantage_vs_fluid(&self) -> f64 {
        self.marginal_vs_fluid - self.bid_price_vs_fluid
    }
    /// ε against hindsight.
    pub fn advantage_vs_hindsight(&self) -> f64 {
        self.marginal_vs_hindsight - self.bid_price_vs_hindsight
    }
}

/// Runs `seeds` two-type Markov streams of `n` arrivals at `rho` through
/// marginal-AND and (a fresh copy per stream of) the bid-price `filter`.
pub fn regret_row(
    types: &[RequestType; 2],
    budgets: Budgets,
    fluid_value: f64,
    filter: &BidPriceFilter,
    n: usize,
    rho: f64,
    seeds: std::ops::Range<u64>,
) -> RegretRow {
    let count = seeds.end.saturating_sub(seeds.start).max(1) as f64;
    let mut sums = [0.0; 4];
    let mut range = (f64::INFINITY, f64::NEG_INFINITY);
    for seed in seeds {
        let mut rng = SplitMix64::new(seed);
        let stream = markov_stream(&mut rng, n, rho);
        let requests = realise(&stream, types);
        let marginal = replay_value(&requests, budgets, |_| true);
        let mut filter = filter.clone();
        let bid = replay_value(&requests, budgets, |o| {
            filter.admits(o.value, o.cost, Some(o.hold))
        });
        let hindsight = hindsight_two_types(&stream, types, budgets);
        let regret = |earned: f64, benchmark: f64| {
            if benchmark > 0.0 {
                1.0 - earned / benchmark
            } else {
                0.0
            }
        };
        let row = [
            regret(marginal, fluid_value),
            regret(bid, fluid_value),
            regret(marginal, hindsight),
            regret(bid, hindsight),
        ];
        for (s, r) in sums.iter_mut().zip(row) {
            *s += r;
        }
        let advantage = row[2] - row[3];
        range = (range.0.min(advantage), range.1.max(advantage));
    }
    RegretRow {
        rho,
        marginal_vs_fluid: sums[0] / count,
        bid_price_vs_fluid: sums[1] / count,
        marginal_vs_hindsight: sums[2] / count,
        bid_price_vs_hindsight: sums[3] / count,
        advantage_vs_hindsight_range: range,
    }
}

/// One arrival of a slot-holding stream.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimedRequest {
    /// Arrival time.
    pub at: f64,
    /// The request.
    pub request: Observed,
}

/// Replays arrivals against `slots` concurrency slots (a request holds its
/// slot for `hold`); admits when a slot is free and `policy` agrees.
/// Returns the value earned.
pub fn replay_with_slots(
    arrivals: &[TimedRequest],
    slots: usize,
    mut policy: impl FnMut(&Observed) -> bool,
) -> f64 {
    let mut busy_until: Vec<f64> = Vec::with_capacity(slots);
    let mut earned = 0.0;
    for a in arrivals {
        busy_until.retain(|&end| end > a.at);
        if busy_until.len() < slots && policy(&a.request) {
            busy_until.push(a.at + a.request.hold);
            earned += a.request.value;
        }
    }
    earned
}

/// Arrivals of the hold-time-hog workload over `[0, horizon)`: one per
/// time unit (evenly spaced) or Poisson with rate 1; each is the long type
/// with probability `long_share`.
pub fn hog_arrivals(
    rng: &mut SplitMix64,
    short: Observed,
    long: Observed,
    long_share: f64,
    horizon: f64,
    poisson: bool,
) -> Vec<TimedRequest> {
    let mut out = Vec::new();
    let mut t = 0.0;
    loop {
        t += if poisson {
            -(1.0 - rng.next_f64()).ln()
        } else {
            1.0
        };
        if t >= horizon {
            return out;
        }
        let request = if rng.next_f64() < long_share {
            long
        } else {
            short
        };
        out.push(TimedRequest { at: t, request });
    }
}

/// The most value any subset of `arrivals` can earn on `slots` slots when
/// every request has the same value (the hold-time-hog workload): the
/// largest number of intervals `[at, at + hold)` schedulable on `slots`
/// identical slots, by the exact greedy (by end time, each into the slot
/// that freed latest before it starts), times that value.
pub fn hindsight_equal_value_slots(arrivals: &[TimedRequest], slots: usize) -> f64 {
    let Some(first) = arrivals.first() else {
        return 0.0;
    };
    let value = first.request.value;
    let mut by_end: Vec<(f64, f64)> = arrivals
        .iter()
        .map(|a| (a.at + a.request.hold, a.at))
        .collect();
    by_end.sort_by(|x, y| x.0.total_cmp(&y.0));
    let mut free_at = vec![f64::NEG_INFINITY; slots];
    let mut count = 0usize;
    for (end, start) in by_end {
        // The slot that freed latest at or before `start`.
        let best = free_at
            .iter()
            .enumerate()
            .filter(|(_, &f)| f <= start)
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i);
        if let Some(i) = best {
            free_at[i] = end;
            count += 1;
        }
    }
    value * count as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(at: f64, hold: f64) -> TimedRequest {
        TimedRequest {
            at,
            request: Observed {
                cost: 1.0,
                value: 1.0,
                hold,
            },
        }
    }

    #[test]
    fn hindsight_schedules_the_most_intervals() {
        // One slot: a long interval covering two short ones; the best is
        // the two short ones.
        let arrivals = [at(0.0, 10.0), at(1.0, 2.0), at(4.0, 2.0)];
        assert_eq!(hindsight_equal_value_slots(&arrivals, 1), 2.0);
        assert_eq!(hindsight_equal_value_slots(&arrivals, 2), 3.0);
        // First-come-first-served on one slot takes only the long one.
        assert_eq!(replay_with_slots(&arrivals, 1, |_| true), 1.0);
    }

    #[test]
    fn markov_streams_alternate_or_lock_as_rho_says() {
        let mut rng = SplitMix64::new(1);
        let alternating = markov_stream(&mut rng, 100, -1.0);
        assert!(alternating.windows(2).all(|w| w[0] != w[1]));
        let locked = markov_stream(&mut rng, 100, 1.0);
        assert!(locked.iter().all(|&t| t == locked[0]));
    }
}
