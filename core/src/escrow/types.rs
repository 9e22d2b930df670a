//! The messages and snapshots of the region escrow: what goes to and comes
//! from the coordinator, what is served to clients, and what operators read.

/// The one lease outstanding with the coordinator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTicket {
    /// Identifies the lease within this escrow; report its result with it.
    pub id: u64,
    /// Tokens to ask for.
    pub tokens: u64,
    /// The caller's monotonic time when it was sent: the base of the deadline.
    pub sent_at_ms: u64,
}

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
    /// Credits the escrow still holds for this window right after this
    /// serve: what it can admit without asking the coordinator (0 for
    /// fallback and shadow credits, which come from no grant).
    pub held_after: u64,
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
    /// Grants ignored because no lease with their id was outstanding.
    pub unexpected_grants: u64,
    /// Tokens handed back to the coordinator early (idle return, eviction).
    pub tokens_returned: u64,
    /// Tokens clients gave back that were accepted into the balance.
    pub tokens_taken_back: u64,
    /// Tokens clients tried to give back beyond what this escrow served
    /// from that window minus what already came back, or for a window it no
    /// longer holds: refused.
    pub return_tokens_refused: u64,
}

/// A snapshot of one escrow for status pages and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EscrowStatus {
    /// Credits usable now.
    pub balance: u64,
    /// The window of the held credits (coordinator epoch ms), if any.
    pub window_start_ms: Option<u64>,
    /// Lifetime left of the held credits.
    pub remaining_lifetime_ms: u64,
    /// Whether a lease is outstanding.
    pub lease_in_flight: bool,
    /// Whether the last lease failed and no grant has arrived since.
    pub coordinator_unreachable: bool,
    /// The lease size the sizer recommends now.
    pub lease_size: u64,
    /// The counters so far.
    pub counters: EscrowCounters,
}
