//! The demand split of a fair key: what each tenant asks for per window,
//! the reports of it sent with pool calls, the leader's totals over every
//! region, and each tenant's weight here as its share of its own demand
//! (see the parent module's doc, Demand split).

use super::*;

/// Demand counts as reported: at most [`MAX_REPORTED_TENANTS`], the
/// largest first (ties by tenant).
pub(super) fn largest_first(counts: &BTreeMap<TenantId, u64>) -> Vec<(TenantId, u64)> {
    let mut largest: Vec<(TenantId, u64)> = counts.iter().map(|(t, d)| (t.clone(), *d)).collect();
    largest.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    largest.truncate(MAX_REPORTED_TENANTS);
    largest
}

/// `weight` (declared, in whole units) in thousandths, split by a
/// tenant's (own, total) demand when it spans regions: `w · own / total`,
/// at least 1.
pub(super) fn split_by(weight: u64, shares: Option<(u64, u64)>) -> u64 {
    let scaled = weight.max(1).saturating_mul(WEIGHT_SCALE);
    match shares {
        Some((own, total)) if own > 0 && total > own => {
            let share = u128::from(scaled) * u128::from(own) / u128::from(total);
            u64::try_from(share).unwrap_or(scaled).max(1)
        }
        _ => scaled,
    }
}

impl<Id: Clone> FairKey<Id> {
    /// Counts `cost` tokens asked for by `tenant` in the current window
    /// (once per request, admitted or not; at most `max_tenants` tenants).
    pub fn note_demand(&mut self, tenant: &TenantId, cost: u64) {
        if let Some(d) = self.demand.get_mut(tenant) {
            *d = d.saturating_add(cost);
        } else if self.demand.len() < self.max_tenants {
            self.demand.insert(tenant.clone(), cost);
        }
    }

    /// The demand to report with a pool ask at monotonic `now_ms`: the
    /// counts of the last window that ended — the granted window's own
    /// once its grant has expired (the ask then joins the next window),
    /// otherwise the previous window's — with its start, at most
    /// [`MAX_REPORTED_TENANTS`] tenants, the largest first.
    pub fn demand_report(&self, now_ms: u64) -> Option<(u64, Vec<(TenantId, u64)>)> {
        let ended = self
            .granted
            .as_ref()
            .filter(|g| now_ms >= g.deadline_ms)
            .map(|g| (g.window.start_ms, &self.demand));
        let (start, counts) = ended.or(self.previous.as_ref().map(|(s, c)| (*s, c)))?;
        if let Some((_, reported)) = self.reported_ahead.as_ref().filter(|(s, _)| *s == start) {
            return Some((start, reported.clone()));
        }
        Some((start, largest_first(counts)))
    }

    /// The live window's demand so far projected to its end at monotonic
    /// `now_ms` (`elapsed_ms` of `window_ms` gone), the largest first:
    /// the report a join ahead carries.
    pub(super) fn projected_report(&self, elapsed_ms: u64, window_ms: u64) -> Vec<(TenantId, u64)> {
        let elapsed_ms = elapsed_ms.clamp(1, window_ms.max(1));
        let projected: BTreeMap<TenantId, u64> = self
            .demand
            .iter()
            .map(|(tenant, d)| {
                let scaled = u128::from(*d) * u128::from(window_ms.max(1)) / u128::from(elapsed_ms);
                (tenant.clone(), u64::try_from(scaled).unwrap_or(u64::MAX))
            })
            .collect();
        largest_first(&projected)
    }

    /// Takes the tenants' demand totals over all regions for the window
    /// starting at `window_start_ms`: the settled totals a pool answer
    /// carries for the window two before the granted one. The split uses
    /// them once they match the window of the key's settled counts. The
    /// `TOTALS_WINDOWS` (3) latest windows are kept, at most
    /// [`MAX_REPORTED_TENANTS`] tenants each (the leader answers no more
    /// than a report names), whatever the answer carries.
    pub fn on_tenant_demands(&mut self, window_start_ms: u64, totals: Vec<(TenantId, u64)>) {
        if totals.is_empty() {
            return;
        }
        let older_than_kept = self.totals.len() >= TOTALS_WINDOWS
            && !self.totals.contains_key(&window_start_ms)
            && self
                .totals
                .keys()
                .next()
                .is_some_and(|oldest| *oldest > window_start_ms);
        if older_than_kept {
            return;
        }
        let held = self.totals.entry(window_start_ms).or_default();
        for (tenant, total) in totals.into_iter().take(MAX_REPORTED_TENANTS) {
            if held.len() < MAX_REPORTED_TENANTS || held.contains_key(&tenant) {
                held.insert(tenant, total);
            }
        }
        while self.totals.len() > TOTALS_WINDOWS {
            self.totals.pop_first();
        }
    }

    /// The weight `tenant` declared as `weight` has here, in thousandths:
    /// its share of its own demand in the settled window (two before the
    /// current one) when that window's totals are known — as they were
    /// when the key joined the current window, so that the split does not
    /// move under the region weight the join declared (a join's answer
    /// brings the next settled totals; they take effect at the next join).
    pub fn split_weight(&self, tenant: &TenantId, weight: u64) -> u64 {
        split_by(weight, self.shares_under(self.basis.as_ref(), tenant))
    }

    /// `tenant`'s (own, total) demand under `basis`, or in the settled
    /// window without one.
    pub(super) fn shares_under(
        &self,
        basis: Option<&SplitBasis>,
        tenant: &TenantId,
    ) -> Option<(u64, u64)> {
        match basis {
            Some(basis) => basis.get(tenant).copied(),
            None => self.live_share(tenant),
        }
    }

    /// `tenant`'s (own, total) demand in the settled window, when its
    /// totals are known.
    pub(super) fn live_share(&self, tenant: &TenantId) -> Option<(u64, u64)> {
        let (start, counts) = self.settled.as_ref()?;
        let total = self.totals.get(start)?.get(tenant).copied()?;
        Some((counts.get(tenant).copied()?, total))
    }

    /// The split of the settled window: what a window joined now is
    /// weighed by (see [`Self::split_weight`]).
    pub(super) fn settled_basis(&self) -> SplitBasis {
        self.settled
            .as_ref()
            .map(|(_, counts)| {
                counts
                    .keys()
                    .filter_map(|tenant| Some((tenant.clone(), self.live_share(tenant)?)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Freezes the split for the window being joined (see
    /// [`Self::split_weight`]).
    pub(super) fn freeze_split(&mut self) {
        self.basis = Some(self.settled_basis());
        self.ahead_basis = None;
    }

    /// The region weight of the live window's tenants other than `except`
    /// under `basis`: each at the weight it last declared, split by the
    /// basis (the weight its requests carry, for a tenant whose
    /// declaration is not kept).
    pub(super) fn tenants_weight(
        &self,
        basis: Option<&SplitBasis>,
        except: Option<&TenantId>,
    ) -> u64 {
        let Some(state) = self.granted.as_ref() else {
            return 0;
        };
        state
            .escrow
            .tenants()
            .filter(|(tenant, _, _)| Some(*tenant) != except)
            .fold(0u64, |sum, (tenant, weight, _)| {
                let split = match self.declared.get(tenant) {
                    Some(declared) => split_by(*declared, self.shares_under(basis, tenant)),
                    None => weight,
                };
                sum.saturating_add(split)
            })
    }
}
