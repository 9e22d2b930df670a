//! `PoolGrant`: the region fair pool over a `fair` key's current window.
//!
//! The arithmetic is [`crate::pool::fair_pool::next_grant`] with `L` = the window's
//! *effective* limit (so a lowered limit also caps pool grants), over the
//! window's regions in sorted order. The asking region joins the active set on
//! its first call in the window (even with `want_total == 0`), and its weight
//! is refreshed on every call (the leader's desk writes there the sum over
//! the region's holders, [`crate::pool::holder_weights`]; the state machine
//! knows nothing of holders). Regions that only hold lease grants (after a
//! kind change) take part with weight 0: their grants are held, they reserve
//! nothing more. Since every grant satisfies `granted_r ≤ L − Σ_{j≠r}
//! granted_j`, `Σ granted ≤ L` holds for the window.
//!
//! Shadow mode: the region's total becomes `max(want_total, fair total)`
//! and the part beyond the fair total is counted as would-deny in the
//! window and in the policy's tally ([`crate::shadow::decide`]).
//!
//! Refused without any state change: `region_weight == 0` (`InvalidArgument`),
//! no governing policy (`NoPolicy`), a `counter` key (`WrongKind`), a new
//! region beyond [`super::MAX_REGIONS_PER_WINDOW`] (`InvalidArgument`).
//!
//! `PoolRelease` (reclaim): the region's total drops from `from_total` to
//! `keep_total` and its pool weight to 0 ([`crate::pool::fair_pool::retire`]), in
//! the live window only. Decision table, first matching row wins:
//!
//! | condition | outcome | state change |
//! |---|---|---|
//! | `keep_total > from_total` | `Rejected(InvalidArgument)` | none |
//! | no governing policy | `Rejected(NoPolicy)` | none |
//! | a `counter` key | `Rejected(WrongKind)` | none |
//! | `window_start_ms` is not the live window's start | `WindowEnded` | none |
//! | `from_total` ≠ the region's total | `StaleTotal` (with the real total) | none |
//! | otherwise | `Released`, `from_total − keep_total` | total = keep, weight = 0 |
//!
//! (A region that credited lease grants back through `Reconcile` before a
//! kind change keeps at least what it credited back.)
//!
//! A release never raises a total, so `Σ granted ≤ L` still holds; the
//! tokens it frees go to the regions that ask next, by weighted max-min over
//! `L −` what retired regions keep.
//!
//! `PoolJoinNext` (a join ahead of time): a `PoolGrant` in the window that
//! starts at `window_start_ms`, which must be one of
//!
//! | `window_start_ms` names | when | the grant goes to |
//! |---|---|---|
//! | the live window | any time | the live window (a late join) |
//! | the window after the live one | the live one's last [`NEXT_WINDOW_JOIN_SHARE`]-th | the next window, opened now if needed ([`super::windows`]) |
//! | the window a grant would open now | no window is live | that window, opened now |
//!
//! and is otherwise refused (`InvalidArgument`) without any state change,
//! as are the `PoolGrant` refusals. With `retire`, the region's weight in
//! that window drops to 0 once granted: it holds its total and reserves
//! nothing more, as after a `PoolRelease` keeping all it holds. The next window's limit is the policy's
//! when it opens (lowered by later policy changes, like a live one's), its
//! regions are those that joined it ahead, and its grants follow the same
//! rule, so `Σ granted ≤ L` holds for it as for any window; it becomes the
//! live window when the current one ends, with what it granted.

use super::lease::MAX_REGIONS_PER_WINDOW;
use super::outcome::{
    CommandError, Outcome, PoolGrantOutcome, PoolReleaseDisposition, PoolReleaseOutcome,
};
use super::region_uses::RegionUses;
use super::state::CoordinatorState;
use super::windows::{RegionUse, WindowRecord};
use crate::ids::{Key, RegionId};
use crate::policy::{Policy, PolicyKind};
use crate::pool::fair_pool::{next_grant, retire, PoolMember};
use crate::shadow;
use crate::window::WindowBounds;

/// A window's next one may be joined ahead during the live window's last
/// `1 / NEXT_WINDOW_JOIN_SHARE` (`PoolJoinNext`).
pub const NEXT_WINDOW_JOIN_SHARE: u64 = 4;

/// Every region of a window but `region`, as pool members, in sorted order.
fn pool_members_besides<'a>(
    regions: &'a RegionUses<RegionUse>,
    region: &'a RegionId,
) -> impl Iterator<Item = PoolMember> + Clone + 'a {
    regions
        .iter()
        .filter(move |(id, _)| *id != region)
        .map(|(_, used)| PoolMember {
            weight: used.pool_weight,
            granted: used.granted,
        })
}

/// The pool grant rule in one window `record` (see the module doc):
/// `region`'s new total and the would-deny count of a shadow policy.
/// Refused (`InvalidArgument`), changing nothing, when the region is new
/// and the window already tracks [`MAX_REGIONS_PER_WINDOW`] regions.
fn grant_in(
    record: &mut WindowRecord,
    region: &RegionId,
    region_weight: u64,
    want_total: u64,
    shadow: bool,
    now_ms: u64,
) -> Result<(PoolGrantOutcome, u64), CommandError> {
    if !record.regions.contains_key(region) && record.regions.len() >= MAX_REGIONS_PER_WINDOW {
        return Err(CommandError::InvalidArgument(format!(
            "window already tracks {MAX_REGIONS_PER_WINDOW} regions"
        )));
    }
    let current = record.regions.get(region).map_or(0, |used| used.granted);
    let asker = PoolMember {
        weight: region_weight,
        granted: current,
    };
    let others = pool_members_besides(&record.regions, region);
    // The fair total never lowers the region's grant (>= current).
    let fair_total = next_grant(record.limit, asker, want_total, others);
    let verdict = shadow::decide(want_total.max(fair_total), fair_total, shadow);
    let granted_total = verdict.granted;
    let used = record.regions.entry_or_default(region);
    used.pool_weight = region_weight;
    used.granted = granted_total;
    record.granted = record
        .granted
        .saturating_add(granted_total.saturating_sub(current));
    record.shadow.record(verdict.would_deny);
    let grant = PoolGrantOutcome {
        granted_total,
        granted_increment: granted_total.saturating_sub(current),
        limit: record.limit,
        window_start_ms: record.bounds.start_ms,
        window_end_ms: record.bounds.end_ms,
        coordinator_now_ms: now_ms,
    };
    Ok((grant, verdict.would_deny))
}

/// A pool grant's refusals before any state change, in this order: a
/// region weight of 0, no policy for `key`, a counter key. The policy
/// otherwise.
fn grant_policy<'a>(
    key: &Key,
    policy: Option<&'a Policy>,
    region_weight: u64,
) -> Result<&'a Policy, CommandError> {
    if region_weight == 0 {
        return Err(CommandError::InvalidArgument(
            "region_weight must be at least 1".to_string(),
        ));
    }
    let Some(policy) = policy else {
        return Err(CommandError::NoPolicy(key.to_string()));
    };
    if policy.kind != PolicyKind::Fair {
        return Err(CommandError::WrongKind(
            "key is counter: use Lease".to_string(),
        ));
    }
    Ok(policy)
}

/// A read-only view of one key's pool window ([`CoordinatorState::pool_view`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolView {
    /// The window.
    pub bounds: WindowBounds,
    /// Its effective limit.
    pub limit: u64,
    /// Whether the governing policy is in shadow mode.
    pub shadow: bool,
    /// Every region of the window with its pool weight and total, in
    /// sorted order (weight 0: retired, or holding lease grants only).
    pub regions: Vec<(RegionId, PoolMember)>,
}

impl PoolView {
    /// The view of a window `record` under a policy in shadow mode or not.
    fn of(record: &WindowRecord, shadow: bool) -> PoolView {
        PoolView {
            bounds: record.bounds,
            limit: record.limit,
            shadow,
            regions: record
                .regions
                .iter()
                .map(|(id, used)| {
                    (
                        id.clone(),
                        PoolMember {
                            weight: used.pool_weight,
                            granted: used.granted,
                        },
                    )
                })
                .collect(),
        }
    }
}

impl CoordinatorState {
    /// `key`'s pool window as of `now_ms`, read-only: the live window's
    /// bounds, effective limit and regions, or — when no window is live —
    /// the bounds and limit of the one a pool call would open, with no
    /// regions. `None` for a key without a governing `fair` policy.
    pub fn pool_view(&self, key: &Key, now_ms: u64) -> Option<PoolView> {
        let policy = self.policies.lookup(key.as_str())?;
        if policy.kind != PolicyKind::Fair {
            return None;
        }
        let view = match self.windows.live(key, now_ms) {
            Some(record) => PoolView::of(record, policy.shadow),
            None => {
                let bounds = self.windows.next_bounds(key, policy.window_ms, now_ms);
                PoolView {
                    bounds,
                    limit: self.windows.opening_limit(&bounds, policy),
                    shadow: policy.shadow,
                    regions: Vec::new(),
                }
            }
        };
        Some(view)
    }

    /// `key`'s pool window starting at `window_start_ms` as of `now_ms`,
    /// read-only: the live window's view ([`Self::pool_view`]) when that
    /// is the one, or the view of the window after the live one — its
    /// record when a region joined it ahead, else its bounds and the
    /// policy's limit with no regions. `None` for any other window or a
    /// key without a governing `fair` policy.
    pub fn pool_view_at(&self, key: &Key, window_start_ms: u64, now_ms: u64) -> Option<PoolView> {
        let live = self.pool_view(key, now_ms)?;
        if live.bounds.start_ms == window_start_ms {
            return Some(live);
        }
        if live.bounds.end_ms != window_start_ms || self.windows.live(key, now_ms).is_none() {
            return None;
        }
        let policy = self.policies.lookup(key.as_str())?;
        // (A next window that became live before any collection rolled it
        // is still filed as the next one: it is the live view, not this.)
        let next = self
            .windows
            .next(key)
            .filter(|record| record.bounds.start_ms == window_start_ms);
        let view = match next {
            Some(record) => PoolView::of(record, policy.shadow),
            None => {
                let bounds = self
                    .windows
                    .next_bounds(key, policy.window_ms, live.bounds.end_ms);
                PoolView {
                    bounds,
                    limit: self.windows.opening_limit(&bounds, policy),
                    shadow: policy.shadow,
                    regions: Vec::new(),
                }
            }
        };
        Some(view)
    }

    pub(super) fn pool_grant(
        &mut self,
        key: &Key,
        region: &RegionId,
        region_weight: u64,
        want_total: u64,
    ) -> Outcome {
        let policy = match grant_policy(key, self.policies.lookup(key.as_str()), region_weight) {
            Ok(policy) => policy,
            Err(refusal) => return Outcome::Rejected(refusal),
        };
        let now = self.now_ms;
        let record = self.windows.live_or_create(key, policy, now);
        let shadow = policy.shadow;
        let prefix = policy.prefix.clone();
        let granted = grant_in(record, region, region_weight, want_total, shadow, now);
        self.shadow_recorded(&prefix, granted)
    }

    /// A grant's outcome, its shadow decision recorded under `prefix`.
    fn shadow_recorded(
        &mut self,
        prefix: &str,
        granted: Result<(PoolGrantOutcome, u64), CommandError>,
    ) -> Outcome {
        match granted {
            Ok((grant, would_deny)) => {
                self.record_shadow(prefix, would_deny);
                Outcome::PoolGrant(grant)
            }
            Err(refusal) => Outcome::Rejected(refusal),
        }
    }

    pub(super) fn pool_join_next(
        &mut self,
        key: &Key,
        region: &RegionId,
        region_weight: u64,
        want_total: u64,
        window_start_ms: u64,
        retire: bool,
    ) -> Outcome {
        let outcome =
            self.pool_join_window(key, region, region_weight, want_total, window_start_ms);
        if let (true, Outcome::PoolGrant(grant)) = (retire, &outcome) {
            // Retired at its total: weight 0, nothing else changes.
            let now = self.now_ms;
            let record = if self.windows.live(key, now).map(|r| r.bounds.start_ms)
                == Some(grant.window_start_ms)
            {
                self.windows.live_mut(key, now)
            } else {
                self.windows.next_mut(key)
            };
            if let Some(used) = record.and_then(|record| record.regions.get_mut(region)) {
                used.pool_weight = 0;
            }
        }
        outcome
    }

    fn pool_join_window(
        &mut self,
        key: &Key,
        region: &RegionId,
        region_weight: u64,
        want_total: u64,
        window_start_ms: u64,
    ) -> Outcome {
        let now = self.now_ms;
        let Some(policy) = self.policies.lookup(key.as_str()) else {
            return self.pool_grant(key, region, region_weight, want_total);
        };
        let live = self.windows.live(key, now).map(|record| record.bounds);
        let opens_now = self.windows.next_bounds(key, policy.window_ms, now);
        let target = match live {
            Some(bounds) if bounds.start_ms == window_start_ms => None,
            Some(bounds) if bounds.end_ms == window_start_ms => Some(bounds),
            None if opens_now.start_ms == window_start_ms => None,
            _ => {
                return Outcome::Rejected(CommandError::InvalidArgument(format!(
                    "window_start_ms {window_start_ms} is neither the key's live window nor the one after it"
                )))
            }
        };
        let Some(live) = target else {
            // The window joined is the current one: a plain grant in it.
            return self.pool_grant(key, region, region_weight, want_total);
        };
        let length = live.end_ms.saturating_sub(live.start_ms);
        if now < live.end_ms.saturating_sub(length / NEXT_WINDOW_JOIN_SHARE) {
            return Outcome::Rejected(CommandError::InvalidArgument(format!(
                "the window starting at {window_start_ms} may be joined ahead only in the last \
                 1/{NEXT_WINDOW_JOIN_SHARE} of the one before"
            )));
        }
        // The same refusals as a grant in the live window, before any
        // state change.
        let policy = match grant_policy(key, Some(policy), region_weight) {
            Ok(policy) => policy,
            Err(refusal) => return Outcome::Rejected(refusal),
        };
        let shadow = policy.shadow;
        let prefix = policy.prefix.clone();
        let Some(record) = self.windows.next_or_create(key, policy, now) else {
            return Outcome::Rejected(CommandError::InvalidArgument(
                "the key has no live window to join the next of".to_string(),
            ));
        };
        let granted = grant_in(record, region, region_weight, want_total, shadow, now);
        self.shadow_recorded(&prefix, granted)
    }

    pub(super) fn pool_release(
        &mut self,
        key: &Key,
        region: &RegionId,
        from_total: u64,
        keep_total: u64,
        window_start_ms: u64,
    ) -> Outcome {
        if keep_total > from_total {
            return Outcome::Rejected(CommandError::InvalidArgument(format!(
                "keep_total {keep_total} exceeds from_total {from_total}"
            )));
        }
        let Some(policy) = self.policies.lookup(key.as_str()) else {
            return Outcome::Rejected(CommandError::NoPolicy(key.to_string()));
        };
        if policy.kind != PolicyKind::Fair {
            return Outcome::Rejected(CommandError::WrongKind(
                "key is counter: use Reconcile".to_string(),
            ));
        }
        let now = self.now_ms;
        let answer = |disposition, released, granted_total, start, end| {
            Outcome::PoolRelease(PoolReleaseOutcome {
                disposition,
                released,
                granted_total,
                window_start_ms: start,
                window_end_ms: end,
            })
        };
        let Some(record) = self.windows.live_mut(key, now) else {
            return answer(PoolReleaseDisposition::WindowEnded, 0, 0, 0, 0);
        };
        let (start, end) = (record.bounds.start_ms, record.bounds.end_ms);
        if start != window_start_ms {
            return answer(PoolReleaseDisposition::WindowEnded, 0, 0, start, end);
        }
        let (current, returned) =
            record
                .regions
                .get(region)
                .map_or((PoolMember::default(), 0), |used| {
                    (
                        PoolMember {
                            weight: used.pool_weight,
                            granted: used.granted,
                        },
                        used.returned,
                    )
                });
        // Lease grants a region credited back before a kind change stay
        // counted: a release never takes the total below them.
        let keep_total = keep_total.max(returned).min(from_total);
        let Some(retired) = retire(current, from_total, keep_total) else {
            return answer(
                PoolReleaseDisposition::StaleTotal,
                0,
                current.granted,
                start,
                end,
            );
        };
        let released = from_total - keep_total;
        if let Some(used) = record.regions.get_mut(region) {
            used.pool_weight = retired.weight;
            used.granted = retired.granted;
            record.granted = record.granted.saturating_sub(released);
        }
        answer(
            PoolReleaseDisposition::Released,
            released,
            retired.granted,
            start,
            end,
        )
    }
}
