//! The escrow of one region for one key (L2), sans IO.
//!
//! The escrow holds credits the coordinator granted for one window and
//! serves them to the region's clients. Rules:
//! - At most one coordinator lease in flight: [`RegionEscrow::lease_to_send`]
//!   returns a lease only when none is outstanding; a grant is credited
//!   exactly once, by [`RegionEscrow::on_grant`].
//! - Credits die with their window, on the coordinator's timeline: the local
//!   deadline is the monotonic time the lease was *sent* plus the remaining
//!   lifetime the coordinator returned (DESIGN §4). Nothing is served at or
//!   after it, and what is served carries the lifetime that remains.
//! - A grant for a newer window replaces the held credits (the old window is
//!   over on the coordinator). A grant that arrives already dead, or for an
//!   older window than the one held, is not credited: it is handed back to
//!   its own window ([`Reconcile`]), which the coordinator forfeits or credits.
//! - Idle credits can be returned early while their window is current.
//! - Outage: after a failed lease the escrow does not ask again until
//!   `probe_interval_ms` has passed (one probe per interval, not one per
//!   request). `fail_closed` serves what it holds, then denies with a retry
//!   hint; `fallback` additionally admits up to a static share per window
//!   while the coordinator is unreachable.
//!
//! Times here are the caller's monotonic milliseconds; window bounds are the
//! coordinator's epoch milliseconds and are only compared with each other.

use crate::policy::OutagePolicy;

/// A grant as the coordinator returned it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoordinatorGrant {
    /// Tokens granted.
    pub granted: u64,
    /// The window the grant belongs to (coordinator epoch ms).
    pub window_start_ms: u64,
    /// Its end.
    pub window_end_ms: u64,
    /// `window_end − coordinator_now` when the grant was applied.
    pub remaining_lifetime_ms: u64,
}

/// Credits to hand back to the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconcile {
    /// The window they were granted in.
    pub window_start_ms: u64,
    /// How many.
    pub leftover: u64,
}

/// Credits served to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// Tokens handed out (≤ asked).
    pub granted: u64,
    /// Their window.
    pub window_start_ms: u64,
    /// Its end (coordinator epoch ms).
    pub window_end_ms: u64,
    /// Lifetime left, to pass down as a relative deadline.
    pub remaining_lifetime_ms: u64,
    /// True when served from the outage fallback share rather than a grant.
    pub from_fallback: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    window_start_ms: u64,
    window_end_ms: u64,
    balance: u64,
    deadline_ms: u64,
}

/// Counters an operator reads in the escrow node's status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EscrowCounters {
    /// Leases sent to the coordinator.
    pub leases_sent: u64,
    /// Leases that failed (unreachable, timeout).
    pub leases_failed: u64,
    /// Tokens credited from grants.
    pub tokens_credited: u64,
    /// Tokens of grants not credited (arrived dead or stale).
    pub tokens_not_credited: u64,
    /// Tokens served to clients.
    pub tokens_served: u64,
    /// Tokens that expired unspent.
    pub tokens_expired: u64,
    /// Requests denied because the coordinator was unreachable.
    pub outage_denials: u64,
    /// Tokens admitted from the fallback share.
    pub fallback_tokens: u64,
}

/// One region's escrow of one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionEscrow {
    batch: u64,
    probe_interval_ms: u64,
    outage_policy: OutagePolicy,
    held: Option<Held>,
    in_flight_since: Option<u64>,
    unreachable_since: Option<u64>,
    next_probe_ms: u64,
    fallback_window: Option<(u64, u64)>,
    counters: EscrowCounters,
}

impl RegionEscrow {
    /// An empty escrow leasing `batch` tokens at a time (at least 1).
    pub fn new(batch: u64, probe_interval_ms: u64, outage_policy: OutagePolicy) -> Self {
        RegionEscrow {
            batch: batch.max(1),
            probe_interval_ms: probe_interval_ms.max(1),
            outage_policy,
            held: None,
            in_flight_since: None,
            unreachable_since: None,
            next_probe_ms: 0,
            fallback_window: None,
            counters: EscrowCounters::default(),
        }
    }

    /// Changes the outage policy (a policy update from the coordinator).
    pub fn set_outage_policy(&mut self, outage_policy: OutagePolicy) {
        self.outage_policy = outage_policy;
    }

    /// Changes the lease size.
    pub fn set_batch(&mut self, batch: u64) {
        self.batch = batch.max(1);
    }

    /// The counters so far.
    pub fn counters(&self) -> EscrowCounters {
        self.counters
    }

    /// Whether the last lease failed and no grant has arrived since.
    pub fn coordinator_unreachable(&self) -> bool {
        self.unreachable_since.is_some()
    }

    /// Credits usable at `now_ms` (expired ones are dropped first).
    pub fn balance(&mut self, now_ms: u64) -> u64 {
        self.expire(now_ms);
        self.held.map_or(0, |h| h.balance)
    }

    fn expire(&mut self, now_ms: u64) {
        if let Some(h) = self.held {
            if now_ms >= h.deadline_ms {
                self.counters.tokens_expired += h.balance;
                self.held = None;
            }
        }
    }

    /// Serves up to `tokens` from held credits.
    pub fn serve(&mut self, tokens: u64, now_ms: u64) -> Option<Served> {
        self.expire(now_ms);
        let h = self.held.as_mut()?;
        let granted = tokens.min(h.balance);
        if granted == 0 {
            return None;
        }
        h.balance -= granted;
        self.counters.tokens_served += granted;
        Some(Served {
            granted,
            window_start_ms: h.window_start_ms,
            window_end_ms: h.window_end_ms,
            remaining_lifetime_ms: h.deadline_ms - now_ms,
            from_fallback: false,
        })
    }

    /// The lease to send now for a shortage of `want` tokens, if any: none
    /// while one is in flight, or while an outage waits for its next probe.
    /// The caller must report the result with `on_grant` or `on_lease_failed`.
    pub fn lease_to_send(&mut self, want: u64, now_ms: u64) -> Option<u64> {
        if self.in_flight_since.is_some() {
            return None;
        }
        if self.unreachable_since.is_some() && now_ms < self.next_probe_ms {
            return None;
        }
        self.in_flight_since = Some(now_ms);
        self.counters.leases_sent += 1;
        Some(want.max(self.batch))
    }

    /// Whether a lease is outstanding.
    pub fn lease_in_flight(&self) -> bool {
        self.in_flight_since.is_some()
    }

    /// A grant arrived for the lease sent at `sent_at_ms`. Credits it once,
    /// or returns it to its own window when it cannot be credited.
    pub fn on_grant(&mut self, grant: CoordinatorGrant, now_ms: u64) -> Option<Reconcile> {
        let sent_at_ms = self.in_flight_since.take().unwrap_or(now_ms);
        self.unreachable_since = None;
        self.fallback_window = None;
        self.expire(now_ms);
        if grant.granted == 0 {
            return None;
        }
        let deadline_ms = sent_at_ms.saturating_add(grant.remaining_lifetime_ms);
        let stale = self
            .held
            .is_some_and(|h| grant.window_start_ms < h.window_start_ms);
        if now_ms >= deadline_ms || stale {
            self.counters.tokens_not_credited += grant.granted;
            return Some(Reconcile {
                window_start_ms: grant.window_start_ms,
                leftover: grant.granted,
            });
        }
        self.counters.tokens_credited += grant.granted;
        match self.held.as_mut() {
            Some(h) if h.window_start_ms == grant.window_start_ms => {
                h.balance += grant.granted;
                // Keep the earlier (safer) deadline.
                h.deadline_ms = h.deadline_ms.min(deadline_ms);
            }
            _ => {
                if let Some(old) = self.held {
                    self.counters.tokens_expired += old.balance;
                }
                self.held = Some(Held {
                    window_start_ms: grant.window_start_ms,
                    window_end_ms: grant.window_end_ms,
                    balance: grant.granted,
                    deadline_ms,
                });
            }
        }
        None
    }

    /// The lease failed (unreachable, timeout, no quorum).
    pub fn on_lease_failed(&mut self, now_ms: u64) {
        self.in_flight_since = None;
        self.counters.leases_failed += 1;
        if self.unreachable_since.is_none() {
            self.unreachable_since = Some(now_ms);
        }
        self.next_probe_ms = now_ms.saturating_add(self.probe_interval_ms);
    }

    /// While the coordinator is unreachable: serve from the fallback share
    /// (policy `fallback`) for the local window `[start, start + window_ms)`
    /// computed on the caller's clock, or count a denial (`fail_closed`).
    pub fn serve_outage(
        &mut self,
        tokens: u64,
        local_window_start_ms: u64,
        window_ms: u64,
    ) -> Option<Served> {
        if !self.coordinator_unreachable() {
            return None;
        }
        let OutagePolicy::Fallback { tokens_per_region } = self.outage_policy else {
            self.counters.outage_denials += 1;
            return None;
        };
        let used = match self.fallback_window {
            Some((start, used)) if start == local_window_start_ms => used,
            _ => 0,
        };
        let granted = tokens.min(tokens_per_region.saturating_sub(used));
        if granted == 0 {
            self.counters.outage_denials += 1;
            return None;
        }
        self.fallback_window = Some((local_window_start_ms, used + granted));
        self.counters.fallback_tokens += granted;
        Some(Served {
            granted,
            window_start_ms: local_window_start_ms,
            window_end_ms: local_window_start_ms + window_ms,
            remaining_lifetime_ms: window_ms,
            from_fallback: true,
        })
    }

    /// Takes back `tokens` a client returned for `window_start_ms`; accepted
    /// only while that window's credits are still alive here.
    pub fn take_back(&mut self, tokens: u64, window_start_ms: u64, now_ms: u64) -> u64 {
        self.expire(now_ms);
        match self.held.as_mut() {
            Some(h) if h.window_start_ms == window_start_ms => {
                h.balance += tokens;
                tokens
            }
            _ => 0,
        }
    }

    /// Hands every held credit back to the coordinator (idle return or
    /// eviction). Returns what to reconcile, if anything.
    pub fn return_all(&mut self, now_ms: u64) -> Option<Reconcile> {
        self.expire(now_ms);
        let h = self.held.take()?;
        (h.balance > 0).then_some(Reconcile {
            window_start_ms: h.window_start_ms,
            leftover: h.balance,
        })
    }

    /// Milliseconds until the next probe may be sent (0 when it may now).
    pub fn retry_after_ms(&self, now_ms: u64) -> u64 {
        if self.unreachable_since.is_some() {
            self.next_probe_ms.saturating_sub(now_ms).max(1)
        } else {
            self.held
                .map_or(1, |h| h.deadline_ms.saturating_sub(now_ms).max(1))
        }
    }
}

#[cfg(test)]
mod tests;
