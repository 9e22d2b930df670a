//! Bid-price (joint-LP) admission: admit a request only if its value
//! clears the shadow price of the budgets it consumes,
//!
//! ```text
//! admit ⟺ value ≥ p_R + p_C·cost (+ p_K·hold)
//! ```
//!
//! where `(p_R, p_C, p_K)` are the optimal duals of the workload's fluid
//! LP: request types `i` arrive `weight_i` times over the horizon and the
//! LP chooses admit fractions `x_i ∈ [0, 1]` maximising `Σ wᵢ·vᵢ·xᵢ` under
//! `Σ wᵢ·xᵢ ≤ R` (requests), `Σ wᵢ·cᵢ·xᵢ ≤ C` (cost) and, by Little's law,
//! `Σ wᵢ·hᵢ·xᵢ ≤ K` (concurrency-time: `K = L·T` for `L` slots over `T`).
//!
//! [`solve_fluid_lp`] minimises the LP dual
//! `D(p) = R·p_R + C·p_C + K·p_K + Σ wᵢ·max(0, vᵢ − p·aᵢ)` over `p ≥ 0`,
//! a convex piecewise-linear function of at most three variables, by
//! enumerating the vertices of its arrangement. **Degenerate duals**: when
//! a whole segment of prices is optimal (the common case: a type sits
//! exactly on its price), the solver returns the centroid of the optimal
//! vertices, a price strictly inside the optimal set, so no type is
//! admitted or rejected by a floating-point tie.
//!
//! **Types on their price.** When the optimum is unique and a type sits
//! exactly on its price, the LP admits that type *in part* (the budget it
//! leaves after the types above their price). Admitting all of it would be
//! marginal admission again; the filter instead admits requests on their
//! price at the LP's fraction ([`FluidLpSolution::tied_fraction`]),
//! deterministically: the `k`-th such request is admitted when
//! `⌊fraction·k⌋` exceeds those admitted so far, so after any `k` of them
//! `⌊fraction·k⌋` were admitted. A request below its price is *priced out*
//! ([`BidVerdict::PricedOut`]); one on its price and not admitted is
//! *rationed* ([`BidVerdict::Rationed`]).
//!
//! Laws (property-tested below):
//! - **strictly more selective than marginal-AND**: the filter only ever
//!   removes admissions (it runs after the axes' own checks), so it cannot
//!   breach any limit;
//! - **weak duality**: `D(p) ≥ D(p*)` for every `p ≥ 0`;
//! - **fail-open on hold**: a missing, negative or non-finite `hold` adds
//!   no concurrency term, so a request is never rejected because of it;
//! - **sample-then-price keeps the prior floor**: learned duals are adopted
//!   only if they earn strictly more than the prior's on the observed
//!   sample.

use super::AdmissionConfigError;

/// One request type of a workload model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestType {
    /// Cost units one request spends (≥ 0).
    pub cost: f64,
    /// What admitting one is worth (≥ 0).
    pub value: f64,
    /// How many arrive over the horizon (> 0; only ratios to the budgets
    /// matter).
    pub weight: f64,
    /// How long one holds a concurrency slot (≥ 0; 0 when unknown).
    pub hold: f64,
}

/// A workload model: request types and the budgets over one horizon.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    /// The request types.
    pub types: Vec<RequestType>,
    /// Requests admissible over the horizon (`None`: no rate budget).
    pub rate_budget: Option<f64>,
    /// Cost units admissible over the horizon.
    pub cost_budget: f64,
    /// Concurrency-time `K = L·T` (`None`: concurrency not priced).
    pub concurrency_budget: Option<f64>,
}

/// Most distinct request types a workload may have (the solver enumerates
/// `O((n+3)³)` vertices).
pub const MAX_TYPES: usize = 128;

impl Workload {
    /// Checks every number is finite and in range.
    pub fn validate(&self) -> Result<(), AdmissionConfigError> {
        if self.types.is_empty() || self.types.len() > MAX_TYPES {
            return Err(AdmissionConfigError::Workload(format!(
                "needs 1..={MAX_TYPES} request types, got {}",
                self.types.len()
            )));
        }
        for (i, t) in self.types.iter().enumerate() {
            let ok = t.cost.is_finite()
                && t.cost >= 0.0
                && t.value.is_finite()
                && t.value >= 0.0
                && t.weight.is_finite()
                && t.weight > 0.0
                && t.hold.is_finite()
                && t.hold >= 0.0;
            if !ok {
                return Err(AdmissionConfigError::Workload(format!(
                    "type {i} needs finite cost, value, hold >= 0 and weight > 0: {t:?}"
                )));
            }
        }
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(self.cost_budget) {
            return Err(AdmissionConfigError::NotPositive("cost_budget"));
        }
        if self.rate_budget.is_some_and(|b| !positive(b)) {
            return Err(AdmissionConfigError::NotPositive("rate_budget"));
        }
        if self.concurrency_budget.is_some_and(|b| !positive(b)) {
            return Err(AdmissionConfigError::NotPositive("concurrency_budget"));
        }
        Ok(())
    }

    fn budgets(&self) -> [Option<f64>; 3] {
        [
            self.rate_budget,
            Some(self.cost_budget),
            self.concurrency_budget,
        ]
    }

    /// The total weight (arrivals over the horizon).
    pub fn total_weight(&self) -> f64 {
        self.types.iter().map(|t| t.weight).sum()
    }
}

/// Bid prices: the shadow price of one request, one cost unit and one unit
/// of hold time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Duals {
    /// Price of one request (`p_R`).
    pub rate: f64,
    /// Price of one cost unit (`p_C`).
    pub cost: f64,
    /// Price of one unit of hold time (`p_K`).
    pub concurrency: f64,
}

impl Duals {
    /// Checks every price is finite and ≥ 0.
    pub fn validate(&self) -> Result<(), AdmissionConfigError> {
        for (name, v) in [
            ("rate dual", self.rate),
            ("cost dual", self.cost),
            ("concurrency dual", self.concurrency),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(AdmissionConfigError::OutOfRange {
                    name,
                    range: "[0, ∞)",
                    value: v,
                });
            }
        }
        Ok(())
    }

    /// The bid price of a request: `p_R + p_C·cost (+ p_K·hold)`. A missing,
    /// negative or non-finite hold adds nothing (fail-open).
    pub fn price(&self, cost: f64, hold: Option<f64>) -> f64 {
        let hold_term = match hold {
            Some(h) if h.is_finite() && h >= 0.0 => self.concurrency * h,
            _ => 0.0,
        };
        self.rate + self.cost * cost + hold_term
    }

    /// Whether a request clears its bid price (ties admit; a relative
    /// tolerance of 1e-9 absorbs rounding).
    pub fn admits(&self, value: f64, cost: f64, hold: Option<f64>) -> bool {
        self.standing(value, cost, hold) != Standing::Below
    }

    /// Where a request's value stands against its bid price (within a
    /// relative tolerance of 1e-9).
    pub fn standing(&self, value: f64, cost: f64, hold: Option<f64>) -> Standing {
        standing(value, self.price(cost, hold))
    }
}

/// Where a value stands against a price.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// Above its price: the LP admits all of its type.
    Above,
    /// On its price: the LP may admit its type in part.
    OnPrice,
    /// Below its price: the LP admits none of its type.
    Below,
}

fn standing(value: f64, price: f64) -> Standing {
    let tolerance = 1e-9 * price.abs().max(1.0);
    if value > price + tolerance {
        Standing::Above
    } else if value >= price - tolerance {
        Standing::OnPrice
    } else {
        Standing::Below
    }
}

/// What the filter says of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BidVerdict {
    /// Admit it.
    Admit,
    /// On its price, and its type's fraction is admitted for now: a later
    /// request like it may be admitted.
    Rationed,
    /// Below its price: no request like it is admitted at these prices.
    PricedOut,
}

/// The fluid LP's optimal duals and value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FluidLpSolution {
    /// Bid prices strictly inside the optimal dual set when it is not a
    /// single point.
    pub duals: Duals,
    /// The LP's optimal value (by strong duality, `D(p*)`): the fluid
    /// benchmark regret is measured against.
    pub objective: f64,
    /// The fraction of the requests on their price the LP admits: what
    /// every budget leaves after the types above their price, over what
    /// the types on their price would take (1 when none is on its price).
    pub tied_fraction: f64,
}

/// The share of the types on their price (at `duals`) that fits in what
/// the types above their price leave of every budget, in `[0, 1]`.
pub fn tied_fraction(workload: &Workload, duals: Duals) -> f64 {
    let budgets = workload.budgets();
    let (mut above, mut tied) = ([0.0f64; 3], [0.0f64; 3]);
    let mut any_tied = false;
    for t in &workload.types {
        let uses = [t.weight, t.weight * t.cost, t.weight * t.hold];
        let into = match duals.standing(t.value, t.cost, Some(t.hold)) {
            Standing::Above => &mut above,
            Standing::OnPrice => {
                any_tied = true;
                &mut tied
            }
            Standing::Below => continue,
        };
        for (sum, used) in into.iter_mut().zip(uses) {
            *sum += used;
        }
    }
    if !any_tied {
        return 1.0;
    }
    let mut fraction: f64 = 1.0;
    for j in 0..3 {
        if let Some(budget) = budgets[j] {
            if tied[j] > 0.0 {
                fraction = fraction.min((budget - above[j]).max(0.0) / tied[j]);
            }
        }
    }
    if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        1.0
    }
}

/// The LP dual objective `D(p)` at prices `p` (rate, cost, concurrency).
pub fn dual_objective(workload: &Workload, p: Duals) -> f64 {
    let budgets = workload.budgets();
    let prices = [p.rate, p.cost, p.concurrency];
    let mut d = 0.0;
    for j in 0..3 {
        if let Some(b) = budgets[j] {
            d += b * prices[j];
        }
    }
    for t in &workload.types {
        let price = p.rate * budgets[0].map_or(0.0, |_| 1.0)
            + p.cost * t.cost
            + p.concurrency * budgets[2].map_or(0.0, |_| t.hold);
        d += t.weight * (t.value - price).max(0.0);
    }
    d
}

/// Solves the fluid LP of `workload` for its bid prices.
pub fn solve_fluid_lp(workload: &Workload) -> Result<FluidLpSolution, AdmissionConfigError> {
    workload.validate()?;
    let budgets = workload.budgets();
    // The priced dimensions: 0 = rate, 1 = cost, 2 = concurrency.
    let dims: Vec<usize> = (0..3).filter(|&j| budgets[j].is_some()).collect();
    let d = dims.len();
    // Hyperplanes `a·p = b` over the priced dimensions: one per type
    // (value = price) and one per dimension (price = 0).
    let mut planes: Vec<(Vec<f64>, f64)> = Vec::new();
    for t in &workload.types {
        let full = [1.0, t.cost, t.hold];
        planes.push((dims.iter().map(|&j| full[j]).collect(), t.value));
    }
    for k in 0..d {
        let mut a = vec![0.0; d];
        a[k] = 1.0;
        planes.push((a, 0.0));
    }
    let to_duals = |p: &[f64]| {
        let mut full = [0.0; 3];
        for (k, &j) in dims.iter().enumerate() {
            full[j] = p[k].max(0.0);
        }
        Duals {
            rate: full[0],
            cost: full[1],
            concurrency: full[2],
        }
    };
    let mut vertices: Vec<(Duals, f64)> = Vec::new();
    for_each_subset(planes.len(), d, |subset| {
        let a: Vec<Vec<f64>> = subset.iter().map(|&i| planes[i].0.clone()).collect();
        let b: Vec<f64> = subset.iter().map(|&i| planes[i].1).collect();
        if let Some(p) = solve_square(a, b) {
            if p.iter().all(|&x| x.is_finite() && x >= -1e-12) {
                let duals = to_duals(&p);
                vertices.push((duals, dual_objective(workload, duals)));
            }
        }
    });
    let best = vertices.iter().map(|v| v.1).fold(f64::INFINITY, f64::min);
    if !best.is_finite() {
        return Err(AdmissionConfigError::Workload(
            "the fluid LP has no finite optimum".into(),
        ));
    }
    let tolerance = 1e-9 * best.abs().max(1.0);
    let mut optimal: Vec<Duals> = Vec::new();
    for (duals, value) in vertices {
        let seen = optimal.iter().any(|o| same_point(o, &duals));
        if value <= best + tolerance && !seen {
            optimal.push(duals);
        }
    }
    let n = optimal.len() as f64;
    let centroid = Duals {
        rate: optimal.iter().map(|p| p.rate).sum::<f64>() / n,
        cost: optimal.iter().map(|p| p.cost).sum::<f64>() / n,
        concurrency: optimal.iter().map(|p| p.concurrency).sum::<f64>() / n,
    };
    Ok(FluidLpSolution {
        duals: centroid,
        objective: best,
        tied_fraction: tied_fraction(workload, centroid),
    })
}

fn same_point(a: &Duals, b: &Duals) -> bool {
    let close = |x: f64, y: f64| (x - y).abs() <= 1e-12 * x.abs().max(y.abs()).max(1.0);
    close(a.rate, b.rate) && close(a.cost, b.cost) && close(a.concurrency, b.concurrency)
}

/// Calls `f` with every `k`-subset of `0..n` (lexicographic).
fn for_each_subset(n: usize, k: usize, mut f: impl FnMut(&[usize])) {
    if k > n {
        return;
    }
    let mut idx: Vec<usize> = (0..k).collect();
    loop {
        f(&idx);
        let mut i = k;
        loop {
            if i == 0 {
                return;
            }
            i -= 1;
            if idx[i] != i + n - k {
                break;
            }
            if i == 0 {
                return;
            }
        }
        idx[i] += 1;
        for j in i + 1..k {
            idx[j] = idx[j - 1] + 1;
        }
    }
}

/// Solves `a·x = b` for a square system by Gaussian elimination with
/// partial pivoting; `None` when singular.
fn solve_square(mut a: Vec<Vec<f64>>, mut b: Vec<f64>) -> Option<Vec<f64>> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))?;
        let scale = a.iter().map(|r| r[col].abs()).fold(0.0, f64::max);
        if a[pivot][col].abs() <= 1e-12 * scale.max(1e-300) || scale == 0.0 {
            return None;
        }
        a.swap(col, pivot);
        b.swap(col, pivot);
        let pivot_row = a[col].clone();
        for row in 0..n {
            if row != col {
                let factor = a[row][col] / pivot_row[col];
                if factor != 0.0 {
                    for (x, p) in a[row][col..].iter_mut().zip(&pivot_row[col..]) {
                        *x -= factor * p;
                    }
                    b[row] -= factor * b[col];
                }
            }
        }
    }
    Some((0..n).map(|i| b[i] / a[i][i]).collect())
}

/// One observed request, as the sample-then-price mode records it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    /// Its cost.
    pub cost: f64,
    /// Its value.
    pub value: f64,
    /// Its hold (0 when unknown or invalid).
    pub hold: f64,
}

/// What the sample-then-price mode decided once its window filled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Repricing {
    /// Still observing.
    Sampling,
    /// The learned duals earned more on the sample: adopted.
    Adopted(Duals),
    /// The prior earned at least as much on the sample: kept.
    KeptPrior,
}

#[derive(Debug, Clone, PartialEq)]
struct SampleThenPrice {
    prior: Workload,
    window: usize,
    observed: Vec<Observed>,
    outcome: Repricing,
}

/// The bid-price filter: static duals, or sample-then-price (Devanur–Hayes)
/// that prices the first `window` requests with the prior, then re-solves
/// the fluid LP on what it saw and adopts the learned duals only if they
/// beat the prior on that sample — then freezes.
#[derive(Debug, Clone, PartialEq)]
pub struct BidPriceFilter {
    duals: Duals,
    adaptive: Option<SampleThenPrice>,
    /// The fraction of requests on their price admitted.
    tied_fraction: f64,
    /// Requests on their price seen, and admitted, under these duals.
    tied_seen: u64,
    tied_admitted: u64,
}

impl BidPriceFilter {
    /// A filter with precomputed duals (validated finite and ≥ 0); every
    /// request on its price is admitted.
    pub fn with_duals(duals: Duals) -> Result<Self, AdmissionConfigError> {
        duals.validate()?;
        Ok(BidPriceFilter {
            duals,
            adaptive: None,
            tied_fraction: 1.0,
            tied_seen: 0,
            tied_admitted: 0,
        })
    }

    /// The same filter admitting `fraction` (in `[0, 1]`) of the requests
    /// on their price.
    pub fn with_tied_fraction(mut self, fraction: f64) -> Result<Self, AdmissionConfigError> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(AdmissionConfigError::OutOfRange {
                name: "tied fraction",
                range: "[0, 1]",
                value: fraction,
            });
        }
        self.tied_fraction = fraction;
        Ok(self)
    }

    /// A filter with the duals of `workload`'s fluid LP, admitting the
    /// LP's fraction of the requests on their price.
    pub fn from_workload(workload: &Workload) -> Result<Self, AdmissionConfigError> {
        let solution = solve_fluid_lp(workload)?;
        Self::with_duals(solution.duals)?.with_tied_fraction(solution.tied_fraction)
    }

    /// The fraction of the requests on their price it admits.
    pub fn tied_fraction(&self) -> f64 {
        self.tied_fraction
    }

    /// Sample-then-price, starting from the prior `workload` (its budgets
    /// are per horizon of `workload.total_weight()` arrivals).
    pub fn sample_then_price(
        workload: &Workload,
        window: usize,
    ) -> Result<Self, AdmissionConfigError> {
        if window == 0 {
            return Err(AdmissionConfigError::NotPositive("sample window"));
        }
        let mut filter = Self::from_workload(workload)?;
        filter.adaptive = Some(SampleThenPrice {
            prior: workload.clone(),
            window,
            observed: Vec::with_capacity(window.min(1 << 16)),
            outcome: Repricing::Sampling,
        });
        Ok(filter)
    }

    /// The duals in force now.
    pub fn duals(&self) -> Duals {
        self.duals
    }

    /// What sample-then-price decided (`None` for a static filter).
    pub fn repricing(&self) -> Option<Repricing> {
        self.adaptive.as_ref().map(|a| a.outcome)
    }

    /// Whether to admit a request: [`BidPriceFilter::decide`] said
    /// [`BidVerdict::Admit`].
    pub fn admits(&mut self, value: f64, cost: f64, hold: Option<f64>) -> bool {
        self.decide(value, cost, hold) == BidVerdict::Admit
    }

    /// What to do with a request (and, while sampling, record it). The
    /// caller checks `value` is finite and ≥ 0.
    pub fn decide(&mut self, value: f64, cost: f64, hold: Option<f64>) -> BidVerdict {
        let verdict = match self.duals.standing(value, cost, hold) {
            Standing::Above => BidVerdict::Admit,
            Standing::Below => BidVerdict::PricedOut,
            Standing::OnPrice => {
                self.tied_seen += 1;
                let due = (self.tied_fraction * self.tied_seen as f64 + 1e-9).floor() as u64;
                if due > self.tied_admitted {
                    self.tied_admitted += 1;
                    BidVerdict::Admit
                } else {
                    BidVerdict::Rationed
                }
            }
        };
        if let Some(a) = &mut self.adaptive {
            if a.outcome == Repricing::Sampling {
                let hold = hold.filter(|h| h.is_finite() && *h >= 0.0).unwrap_or(0.0);
                a.observed.push(Observed { cost, value, hold });
                if a.observed.len() >= a.window {
                    let (outcome, learned_fraction) = reprice(&a.prior, self.duals, &a.observed);
                    a.outcome = outcome;
                    a.observed = Vec::new();
                    if let Repricing::Adopted(learned) = a.outcome {
                        self.duals = learned;
                        self.tied_fraction = learned_fraction;
                        self.tied_seen = 0;
                        self.tied_admitted = 0;
                    }
                }
            }
        }
        verdict
    }
}

/// Re-solves on the sample and compares learned against prior duals by
/// replaying the sample with the budgets scaled to its length; with the
/// learned fraction of requests on their price.
fn reprice(prior: &Workload, prior_duals: Duals, sample: &[Observed]) -> (Repricing, f64) {
    let n = sample.len() as f64;
    let horizon = prior.total_weight();
    let mut types: Vec<RequestType> = Vec::new();
    for o in sample {
        match types
            .iter_mut()
            .find(|t| t.cost == o.cost && t.value == o.value && t.hold == o.hold)
        {
            Some(t) => t.weight += horizon / n,
            None => types.push(RequestType {
                cost: o.cost,
                value: o.value,
                weight: horizon / n,
                hold: o.hold,
            }),
        }
    }
    let empirical = Workload {
        types,
        ..prior.clone()
    };
    let Ok(learned) = solve_fluid_lp(&empirical) else {
        return (Repricing::KeptPrior, 1.0);
    };
    let scale = n / horizon;
    let budgets = Budgets {
        rate: prior.rate_budget.map(|b| b * scale),
        cost: prior.cost_budget * scale,
        concurrency: prior.concurrency_budget.map(|b| b * scale),
    };
    let earned = |duals: Duals| {
        replay_value(sample, budgets, |o| {
            duals.admits(o.value, o.cost, Some(o.hold))
        })
    };
    let outcome = if earned(learned.duals) > earned(prior_duals) + 1e-9 {
        Repricing::Adopted(learned.duals)
    } else {
        Repricing::KeptPrior
    };
    (outcome, learned.tied_fraction)
}

/// Budgets of one replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Budgets {
    /// Requests (`None`: unlimited).
    pub rate: Option<f64>,
    /// Cost units.
    pub cost: f64,
    /// Hold time (`None`: unlimited).
    pub concurrency: Option<f64>,
}

/// The value a policy earns on `stream` when every admission must also fit
/// the remaining budgets (marginal-AND is `policy = |_| true`).
pub fn replay_value(
    stream: &[Observed],
    budgets: Budgets,
    mut policy: impl FnMut(&Observed) -> bool,
) -> f64 {
    let (mut rate, mut cost, mut hold) = (
        budgets.rate.unwrap_or(f64::INFINITY),
        budgets.cost,
        budgets.concurrency.unwrap_or(f64::INFINITY),
    );
    let mut earned = 0.0;
    for o in stream {
        if rate >= 1.0 && cost >= o.cost && hold >= o.hold && policy(o) {
            rate -= 1.0;
            cost -= o.cost;
            hold -= o.hold;
            earned += o.value;
        }
    }
    earned
}

#[cfg(test)]
mod tests;
