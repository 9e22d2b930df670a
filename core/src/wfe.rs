//! In-region weighted-fair escrow (WFE) for `fair` keys.
//!
//! One region's escrow node splits the budget the region fair pool granted
//! it (`budget`, ≤ L) among the region's tenants in weighted max-min
//! proportion, reclaiming idle tenants' surplus for backlogged ones.
//!
//! Rules (integers; products in u128):
//! - `W = Σ` weights of the tenants active this window, `g_t = floor(w_t·budget/W)`.
//! - Within its guarantee (`used_t + cost ≤ g_t`) a tenant is admitted,
//!   subject to `Σ used + cost ≤ budget`.
//! - Past it, a tenant may borrow at most `cost` per call (the DRR quantum)
//!   out of the unreserved budget `budget − Σ used − Σ_j max(0, g_j − used_j)`:
//!   every tenant's unclaimed guarantee stays reserved for it. A call that
//!   straddles the caller's guarantee spends its own reserve for the part
//!   below `g_t` and borrows only the part above. (The original subtracted
//!   only the *others'* reserves, so a straddling call with cost > 1 counted
//!   its own reserve twice and ate into other tenants' guarantees, breaking
//!   T2 and T4 for costs above 1; with unit cost both rules agree.)
//! - When short, the region asks the pool for
//!   `min(L, Σ used + reserve_of_others + cost)` with region weight `W`
//!   (the GPS-decomposition condition: a region weighs the sum of its
//!   tenants' weights, so the two levels together approximate one flat
//!   weighted max-min over every tenant of every region).
//! - A tenant spanning several regions must declare in each region the share
//!   `w_{t,r} = w_t · d_{t,r} / d_t` of its weight, where `d_{t,r}` is its
//!   demand in region r over the previous window (as its own services report
//!   it); declaring the full weight everywhere over-serves it about k-fold.
//!   [`split_weight`] does the integer split (Σ of the shares is exactly
//!   `w_t`); scale every tenant's weight by the same factor (say 1000) first
//!   so the rounding stays negligible.
//! - The tenant table is bounded: when full, the oldest tenant is evicted and
//!   its `used` keeps counting (`evicted_used`), so a flood of unique tenants
//!   can neither exhaust memory nor over-admit.
//! - Windows only move forward: a grant or request for a window older than
//!   the current one changes nothing (and the request is denied).
//!
//! Theorems (property-tested in `wfe/tests.rs` and `tests/wfe_theorems.rs`,
//! for tenants that all joined before a round-robin backlog):
//! - T1 `Σ used ≤ budget ≤ L`, for any order, weights, costs and pool.
//! - T2 with unit cost a backlogged tenant gets at least `g_t`; with a
//!   uniform cost c, `used_t + c > g_t`.
//! - T3 with unit cost, under backlog `Σ used = L`; with a uniform cost c,
//!   `L − Σ used ≤ n·(c − 1)` (each tenant's remainder below one call).
//! - T4 with a uniform cost c, `|a_i/w_i − a_j/w_j| ≤ c·(1/w_i + 1/w_j)`.

use std::collections::BTreeMap;

mod split;
pub use split::split_weight;

use crate::decision::Decision;
use crate::ids::{RegionId, TenantId};
use crate::pool::fair_pool::RegionFairPool;
use crate::window::WindowBounds;

/// Most pool round trips one check may make before deciding.
pub const MAX_POOL_ASKS_PER_CHECK: usize = 64;

/// Where a region's budget comes from: the region fair pool (through the
/// coordinator, or in-process in tests).
pub trait PoolAccess {
    /// Asks for the region's total grant to become `want_total` with weight
    /// `region_weight`; returns the region's new total (never smaller than
    /// before within a window).
    fn grant(&mut self, region_weight: u64, want_total: u64) -> u64;
}

/// A fixed budget of L: the single-region (non-federated) escrow.
#[derive(Debug, Clone, Copy)]
pub struct WholeBudget(pub u64);

impl PoolAccess for WholeBudget {
    fn grant(&mut self, _region_weight: u64, _want_total: u64) -> u64 {
        self.0
    }
}

/// A pool that grants nothing new but remembers what was asked: lets an
/// async caller run [`WeightedFairEscrow::check`], perform the ask it wanted
/// over the network, [`observe_grant`](WeightedFairEscrow::observe_grant)
/// the answer and decide again.
#[derive(Debug, Clone, Copy)]
pub struct RecordedAsk {
    /// The budget to keep answering with.
    pub current: u64,
    /// The last `(region_weight, want_total)` asked, if any.
    pub asked: Option<(u64, u64)>,
}

impl PoolAccess for RecordedAsk {
    fn grant(&mut self, region_weight: u64, want_total: u64) -> u64 {
        self.asked = Some((region_weight, want_total));
        self.current
    }
}

/// One region's seat at an in-process [`RegionFairPool`].
#[derive(Debug)]
pub struct PoolSeat<'a> {
    /// The shared pool.
    pub pool: &'a mut RegionFairPool,
    /// This region.
    pub region: &'a RegionId,
    /// The current time, epoch ms.
    pub now_ms: u64,
}

impl PoolAccess for PoolSeat<'_> {
    fn grant(&mut self, region_weight: u64, want_total: u64) -> u64 {
        self.pool
            .grant(self.region, region_weight.max(1), want_total, self.now_ms)
            .unwrap_or(0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct TenantUse {
    weight: u64,
    used: u64,
    joined_seq: u64,
}

/// The weighted-fair escrow of one region for one `fair` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightedFairEscrow {
    limit: u64,
    max_tenants: usize,
    window: Option<WindowBounds>,
    budget: u64,
    evicted_used: u64,
    next_seq: u64,
    tenants: BTreeMap<TenantId, TenantUse>,
}

fn guarantee(weight: u64, budget: u64, total_weight: u128) -> u64 {
    if total_weight == 0 {
        return 0;
    }
    u64::try_from(u128::from(weight) * u128::from(budget) / total_weight).unwrap_or(u64::MAX)
}

impl WeightedFairEscrow {
    /// An escrow for a key of limit `limit` keeping at most `max_tenants`
    /// tenants (at least 1).
    pub fn new(limit: u64, max_tenants: usize) -> Self {
        WeightedFairEscrow {
            limit,
            max_tenants: max_tenants.max(1),
            window: None,
            budget: 0,
            evicted_used: 0,
            next_seq: 0,
            tenants: BTreeMap::new(),
        }
    }

    /// The key's limit L (from the first grant).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// The region's budget (pool grant) for the current window.
    pub fn budget(&self) -> u64 {
        self.budget
    }

    /// Moves to `window` (dropping the previous window's state) and raises
    /// the budget to the region's pool grant `total` (never lowers it, never
    /// above L). For callers that talk to the pool asynchronously. A grant
    /// for a window older than the current one is ignored: it must not bring
    /// back a dead window's budget with its tenants' use forgotten.
    pub fn observe_grant(&mut self, window: WindowBounds, total: u64) {
        if !self.roll(window) {
            return;
        }
        self.budget = self.budget.max(total.min(self.limit));
    }

    /// The region retired from the pool in `window` keeping `keep_total`
    /// (a `PoolRelease`): the budget drops to it, never below what was
    /// already admitted and never above the budget. Another window's
    /// retirement changes nothing. A later grant raises the budget again.
    pub fn retire(&mut self, window: WindowBounds, keep_total: u64) {
        if self.window != Some(window) {
            return;
        }
        self.budget = keep_total.max(self.total_used()).min(self.budget);
    }

    /// The current window, if any request was decided yet.
    pub fn window(&self) -> Option<WindowBounds> {
        self.window
    }

    /// Σ used this window, evicted tenants included.
    pub fn total_used(&self) -> u64 {
        self.evicted_used + self.tenants.values().map(|t| t.used).sum::<u64>()
    }

    /// Tokens `tenant` was admitted this window (0 if unknown or evicted).
    pub fn used_by(&self, tenant: &TenantId) -> u64 {
        self.tenants.get(tenant).map_or(0, |t| t.used)
    }

    /// Tenants currently tracked, in tenant order, with their weight and
    /// the tokens they were admitted this window.
    pub fn tenants(&self) -> impl Iterator<Item = (&TenantId, u64, u64)> {
        self.tenants
            .iter()
            .map(|(tenant, used)| (tenant, used.weight, used.used))
    }

    /// Tenants currently tracked.
    pub fn tenant_count(&self) -> usize {
        self.tenants.len()
    }

    /// The region weight: Σ active tenant weights (saturating).
    pub fn region_weight(&self) -> u64 {
        u64::try_from(self.total_weight()).unwrap_or(u64::MAX)
    }

    fn total_weight(&self) -> u128 {
        self.tenants.values().map(|t| u128::from(t.weight)).sum()
    }

    /// Moves to `window` if it is not older than the current one; returns
    /// whether `window` is now current.
    fn roll(&mut self, window: WindowBounds) -> bool {
        match self.window {
            Some(current) if current == window => true,
            Some(current) if window.start_ms < current.start_ms => false,
            _ => {
                self.window = Some(window);
                self.budget = 0;
                self.evicted_used = 0;
                self.tenants.clear();
                true
            }
        }
    }

    fn upsert(&mut self, tenant: &TenantId, weight: u64) {
        if let Some(t) = self.tenants.get_mut(tenant) {
            t.weight = weight;
            return;
        }
        if self.tenants.len() >= self.max_tenants {
            let oldest = self
                .tenants
                .iter()
                .min_by_key(|(_, t)| t.joined_seq)
                .map(|(id, _)| id.clone());
            if let Some(id) = oldest {
                if let Some(gone) = self.tenants.remove(&id) {
                    self.evicted_used += gone.used;
                }
            }
        }
        self.next_seq += 1;
        self.tenants.insert(
            tenant.clone(),
            TenantUse {
                weight,
                used: 0,
                joined_seq: self.next_seq,
            },
        );
    }

    /// Σ_{j≠asker} max(0, g_j − used_j).
    fn reserve_of_others(&self, asker: &TenantId) -> u64 {
        let w = self.total_weight();
        self.tenants
            .iter()
            .filter(|(id, _)| *id != asker)
            .map(|(_, t)| guarantee(t.weight, self.budget, w).saturating_sub(t.used))
            .sum()
    }

    /// The ceiling `tenant` may reach with this call, and its guarantee.
    fn ceiling(&self, tenant: &TenantId, cost: u64) -> Option<(u64, u64)> {
        let t = self.tenants.get(tenant)?;
        let g = guarantee(t.weight, self.budget, self.total_weight());
        let l_rem = self.budget.saturating_sub(self.total_used());
        if cost > l_rem {
            return None;
        }
        if t.used + cost <= g {
            return Some((g, g));
        }
        // The part of the call within the guarantee uses the caller's own
        // unclaimed reserve; only the part beyond it borrows, and only from
        // what nobody (the caller included) has reserved.
        let own_reserve = g.saturating_sub(t.used);
        let borrow_available = l_rem
            .saturating_sub(self.reserve_of_others(tenant))
            .saturating_sub(own_reserve);
        let wanted = (t.used + cost).saturating_sub(g);
        let grantable = wanted.min(cost).min(borrow_available).min(l_rem);
        Some((g + grantable, g))
    }

    /// The most of `cost` tokens `tenant` could be admitted now from the
    /// budget held (0 when none, or when the tenant is unknown): the
    /// largest `c ≤ cost` that [`Self::check`] would admit without asking
    /// the pool. Admission is monotone in the cost (a smaller cost stays
    /// within `l_rem`, within the guarantee or within what may be
    /// borrowed), so this searches by halves.
    pub fn admissible(&self, tenant: &TenantId, cost: u64) -> u64 {
        let (mut admitted, mut refused) = (0u64, cost.saturating_add(1));
        while refused - admitted > 1 {
            let middle = admitted + (refused - admitted) / 2;
            if self.would_admit(tenant, middle) {
                admitted = middle;
            } else {
                refused = middle;
            }
        }
        admitted
    }

    fn would_admit(&self, tenant: &TenantId, cost: u64) -> bool {
        let used = self.used_by(tenant);
        self.ceiling(tenant, cost)
            .is_some_and(|(ceil, _)| used + cost <= ceil)
    }

    /// Decides one request of `cost` tokens by `tenant` (weight ≥ 1) in
    /// `window` at `now_ms`, asking `pool` for more budget when short.
    /// `cost` must be ≥ 1 (validated at the edge; 0 is treated as 1).
    pub fn check(
        &mut self,
        tenant: &TenantId,
        weight: u64,
        cost: u64,
        window: WindowBounds,
        now_ms: u64,
        pool: &mut impl PoolAccess,
    ) -> Decision {
        let cost = cost.max(1);
        if !self.roll(window) {
            // A request labelled with a window older than the current one:
            // that window is over, nothing may be spent in it.
            return Decision {
                allowed: false,
                limit: 0,
                remaining: 0,
                reset_at_ms: window.end_ms,
                retry_after_ms: 1,
            };
        }
        self.upsert(tenant, weight.max(1));
        for _ in 0..MAX_POOL_ASKS_PER_CHECK {
            if self.budget >= self.limit || self.would_admit(tenant, cost) {
                break;
            }
            let need = self.limit.min(
                self.total_used()
                    .saturating_add(self.reserve_of_others(tenant))
                    .saturating_add(cost),
            );
            let granted = pool.grant(self.region_weight(), need).min(self.limit);
            if granted <= self.budget {
                break;
            }
            self.budget = granted;
        }
        let used = self.used_by(tenant);
        let retry_after_ms = window.end_ms.saturating_sub(now_ms).max(1);
        match self.ceiling(tenant, cost) {
            Some((ceil, _)) if used + cost <= ceil => {
                if let Some(t) = self.tenants.get_mut(tenant) {
                    t.used += cost;
                }
                Decision {
                    allowed: true,
                    limit: ceil,
                    remaining: ceil - (used + cost),
                    reset_at_ms: window.end_ms,
                    retry_after_ms: 0,
                }
            }
            Some((ceil, _)) => Decision {
                allowed: false,
                limit: ceil,
                remaining: ceil.saturating_sub(used),
                reset_at_ms: window.end_ms,
                retry_after_ms,
            },
            None => {
                let g = guarantee(weight.max(1), self.budget, self.total_weight());
                Decision {
                    allowed: false,
                    limit: g.max(used),
                    remaining: g.saturating_sub(used),
                    reset_at_ms: window.end_ms,
                    retry_after_ms,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
