//! The commands the coordinator replicates: one log entry's payload
//! ([`Proposal`]) and its [`Command`]s, with the fingerprint that tells a
//! retry from a different request under the same id. These types cross
//! the Raft log, so they are serde types encoded with postcard; add
//! variants only at the end. What a command did is [`super::outcome`].

use serde::{Deserialize, Serialize};

use super::moves::{AcquirePart, MoveId, PlacementChange, SessionsPart};
use crate::ids::{Key, RegionId, RequestId};
use crate::policy::Policy;
use crate::principal::Principal;
use crate::shard::{ShardId, SlotMove};

/// One Raft log entry's payload: the leader's clock stamp and a batch of
/// commands (group commit). The state-machine clock becomes
/// `max(previous, stamp_ms)` before any command of the batch is applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// Leader wall-clock time when it proposed, epoch milliseconds.
    pub stamp_ms: u64,
    /// Commands applied in order; each produces one [`Outcome`](super::Outcome).
    pub commands: Vec<Command>,
}

/// A replicated command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Lease up to `tokens` of `key`'s current window for `region`.
    Lease {
        /// The budget.
        key: Key,
        /// The asking region.
        region: RegionId,
        /// Tokens wanted; must be > 0.
        tokens: u64,
        /// For exactly-once retries.
        request_id: Option<RequestId>,
        /// The authenticated caller: request ids are scoped to it, so one
        /// caller can neither replay nor exhaust another's session state.
        caller: Principal,
    },
    /// Return unused credits of `window_start_ms`; credited only while that
    /// window is current, capped at what this region was granted in it minus
    /// what it already returned; idempotent per (key, region, window).
    Reconcile {
        /// The budget.
        key: Key,
        /// The returning region.
        region: RegionId,
        /// Tokens handed back.
        leftover: u64,
        /// The window the credits were granted in.
        window_start_ms: u64,
        /// For exactly-once retries.
        request_id: Option<RequestId>,
        /// The authenticated caller: request ids are scoped to it, so one
        /// caller can neither replay nor exhaust another's session state.
        caller: Principal,
    },
    /// Region fair pool: raise this region's total grant for the current
    /// window towards `want_total` (never lowers it).
    PoolGrant {
        /// The budget (a `fair` policy).
        key: Key,
        /// The asking region.
        region: RegionId,
        /// The region's weight: Σ of its active tenants' weights, ≥ 1.
        region_weight: u64,
        /// The total grant the region would like for this window.
        want_total: u64,
        /// For exactly-once retries.
        request_id: Option<RequestId>,
        /// The authenticated caller: request ids are scoped to it, so one
        /// caller can neither replay nor exhaust another's session state.
        caller: Principal,
    },
    /// Insert or replace the policy with this prefix.
    SetPolicy(Policy),
    /// Remove the policy with exactly this prefix.
    DeletePolicy {
        /// The prefix of the policy to remove.
        prefix: String,
    },
    /// Advance the clock and collect dead windows and sessions; no other effect.
    Tick,
    /// Region fair pool: the region retires from the current window, keeping
    /// `keep_total` of its total and handing the rest back to the pool; it
    /// stops reserving a guarantee until it asks again
    /// ([`crate::pool::fair_pool::retire`]). Applied only if `from_total` is the
    /// region's current total and `window_start_ms` the live window.
    /// (Last in the enum: the encoding of the earlier variants is unchanged.)
    PoolRelease {
        /// The budget (a `fair` policy).
        key: Key,
        /// The retiring region.
        region: RegionId,
        /// The region's total as the region knows it.
        from_total: u64,
        /// What it keeps (what it already handed out), ≤ `from_total`.
        keep_total: u64,
        /// The window the totals belong to.
        window_start_ms: u64,
        /// For exactly-once retries.
        request_id: Option<RequestId>,
        /// The authenticated caller: request ids are scoped to it.
        caller: Principal,
    },
    /// Region fair pool: join the window starting at `window_start_ms`
    /// ahead of time — the window right after the live one, during the live
    /// one's last quarter — with `region_weight`, asking for `want_total`
    /// there, by the same rule as [`Command::PoolGrant`]. When
    /// `window_start_ms` is the live window (the join arrived late), it is
    /// a `PoolGrant` in it. With `retire`, the region then retires from
    /// that window keeping its whole total, as after a `PoolRelease`
    /// keeping all it holds: it reserves nothing beyond what it was
    /// granted until it asks again. (Last in the enum: storage format 4.)
    PoolJoinNext {
        /// The budget (a `fair` policy).
        key: Key,
        /// The joining region.
        region: RegionId,
        /// The region's weight, ≥ 1.
        region_weight: u64,
        /// The total grant the region would like in that window.
        want_total: u64,
        /// The start of the window joined.
        window_start_ms: u64,
        /// Retire at the total granted (weight 0) once granted.
        retire: bool,
        /// For exactly-once retries.
        request_id: Option<RequestId>,
        /// The authenticated caller: request ids are scoped to it.
        caller: Principal,
    },
    /// Meta group: change the placement, if it is at `expected_version`
    /// (see [`super::sharding`]: slots moved out of shard 0 take their
    /// keys' window state with them). Storage format 8.
    ChangePlacement {
        /// The version the change was made against.
        expected_version: u64,
        /// The change.
        change: PlacementChange,
    },
    /// A new group becomes the shard `shard` (it then serves only the
    /// slots it acquires). Storage format 8.
    BecomeShard {
        /// The shard.
        shard: ShardId,
    },
    /// One part of a move of slots into this shard. Storage format 8.
    AcquireSlots(AcquirePart),
    /// A shard other than 0 gives up the slots of the move `id` (which the
    /// meta group's placement made): their keys' window state leaves its
    /// table, frozen for the new owner to acquire. Entries format 6.
    ReleaseSlots {
        /// The move, as the meta group numbered it.
        id: MoveId,
        /// Its slots and shards.
        slots: SlotMove,
    },
    /// One part of a move's client sessions into this shard, applied
    /// before any of the move's keys (a last variant: entries format 7).
    AcquireSessions(SessionsPart),
}

impl Command {
    /// The caller and request id of a command that carries one.
    pub fn request(&self) -> Option<(&Principal, &RequestId)> {
        match self {
            Command::Lease {
                request_id, caller, ..
            }
            | Command::Reconcile {
                request_id, caller, ..
            }
            | Command::PoolGrant {
                request_id, caller, ..
            }
            | Command::PoolRelease {
                request_id, caller, ..
            }
            | Command::PoolJoinNext {
                request_id, caller, ..
            } => request_id.as_ref().map(|id| (caller, id)),
            _ => None,
        }
    }

    /// The hash slot of the key a request command is about (`None` for
    /// commands about no key): what a session records with its answer, so
    /// the answer moves with the key's slot.
    pub fn slot(&self) -> Option<crate::shard::Slot> {
        self.key().map(|key| crate::shard::slot_of(key.as_str()))
    }

    /// The key a request command is about (`None` for commands about no
    /// key).
    pub fn key(&self) -> Option<&Key> {
        match self {
            Command::Lease { key, .. }
            | Command::Reconcile { key, .. }
            | Command::PoolGrant { key, .. }
            | Command::PoolRelease { key, .. }
            | Command::PoolJoinNext { key, .. } => Some(key),
            _ => None,
        }
    }

    /// A stable 64-bit fingerprint of what the command asks for (its kind,
    /// key, region and amounts; not its request id or caller). A retry
    /// must carry the same fingerprint as the request its id first named.
    ///
    /// FNV-1a over a length-prefixed encoding: identical on every replica
    /// and every build, unlike `std`'s randomly seeded hasher.
    pub fn fingerprint(&self) -> u64 {
        let mut hash = Fnv1a::default();
        match self {
            Command::Lease {
                key,
                region,
                tokens,
                ..
            } => {
                hash.tag(1);
                hash.text(key.as_str());
                hash.text(region.as_str());
                hash.number(*tokens);
            }
            Command::Reconcile {
                key,
                region,
                leftover,
                window_start_ms,
                ..
            } => {
                hash.tag(2);
                hash.text(key.as_str());
                hash.text(region.as_str());
                hash.number(*leftover);
                hash.number(*window_start_ms);
            }
            Command::PoolGrant {
                key,
                region,
                region_weight,
                want_total,
                ..
            } => {
                hash.tag(3);
                hash.text(key.as_str());
                hash.text(region.as_str());
                hash.number(*region_weight);
                hash.number(*want_total);
            }
            Command::SetPolicy(policy) => {
                hash.tag(4);
                hash.text(&policy.prefix);
            }
            Command::DeletePolicy { prefix } => {
                hash.tag(5);
                hash.text(prefix);
            }
            Command::Tick => hash.tag(6),
            Command::PoolRelease {
                key,
                region,
                from_total,
                keep_total,
                window_start_ms,
                ..
            } => {
                hash.tag(7);
                hash.text(key.as_str());
                hash.text(region.as_str());
                hash.number(*from_total);
                hash.number(*keep_total);
                hash.number(*window_start_ms);
            }
            Command::PoolJoinNext {
                key,
                region,
                region_weight,
                want_total,
                window_start_ms,
                retire,
                ..
            } => {
                hash.tag(8);
                hash.text(key.as_str());
                hash.text(region.as_str());
                hash.number(*region_weight);
                hash.number(*want_total);
                hash.number(*window_start_ms);
                hash.number(u64::from(*retire));
            }
            Command::ChangePlacement {
                expected_version, ..
            } => {
                hash.tag(9);
                hash.number(*expected_version);
            }
            Command::BecomeShard { shard } => {
                hash.tag(10);
                hash.number(u64::from(shard.0));
            }
            Command::AcquireSlots(part) => {
                hash.tag(11);
                hash.number(part.id.version);
                hash.number(u64::from(part.id.index));
                hash.number(part.first_key);
            }
            Command::AcquireSessions(part) => {
                hash.tag(13);
                hash.number(part.id.version);
                hash.number(u64::from(part.id.index));
                hash.number(part.first);
            }
            Command::ReleaseSlots { id, slots } => {
                hash.tag(12);
                hash.number(id.version);
                hash.number(u64::from(id.index));
                hash.number(u64::from(slots.start));
                hash.number(u64::from(slots.end));
            }
        }
        hash.finish()
    }
}

/// 64-bit FNV-1a, fed with tagged, length-prefixed fields.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv1a {
    fn bytes(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn tag(&mut self, tag: u8) {
        self.bytes(&[tag]);
    }
    fn number(&mut self, n: u64) {
        self.bytes(&n.to_le_bytes());
    }
    fn text(&mut self, s: &str) {
        self.number(s.len() as u64);
        self.bytes(s.as_bytes());
    }
    fn finish(&self) -> u64 {
        self.0
    }
}
