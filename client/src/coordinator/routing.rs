//! Which member a call goes to: a call's [`Target`], and [`Routing`], the
//! cache every call of a client reads and updates — the configured
//! endpoints, the leader of each shard as last seen (remembered when it
//! answers, followed when a member names it in a `NOT_LEADER` refusal,
//! forgotten when it fails), the placement known and the newest version a
//! member named, and one connection per member.

use std::collections::HashMap;

use leasehold_proto::v1::Placement;
use tonic::transport::Channel;
use tonic::Status;

use super::placement::KnownPlacement;
use crate::transport::normalize_addr;

/// Which node a call should go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// The leader of shard 0, the meta group (writes and linearizable
    /// reads not about a key; every key's on a cluster never sharded):
    /// follow hints.
    Leader,
    /// The leader of a shard (a key's calls): follow hints.
    Shard(u32),
    /// Any node, starting from the first configured endpoint (node-local calls).
    Any,
}

impl Target {
    /// Whether the call goes to a leader (and follows its hints).
    pub(super) fn is_leader(self) -> bool {
        matches!(self, Target::Leader | Target::Shard(_))
    }

    /// The shard whose leader the call goes to.
    pub(super) fn shard(self) -> Option<u32> {
        match self {
            Target::Leader => Some(0),
            Target::Shard(shard) => Some(shard),
            Target::Any => None,
        }
    }

    /// The shard whose group keeps the call's sessions (0 for calls to
    /// any node).
    pub(super) fn session_shard(self) -> u32 {
        self.shard().unwrap_or(0)
    }
}

/// Where a client's calls go, as last learnt.
#[derive(Debug)]
pub(super) struct Routing {
    endpoints: Vec<String>,
    /// Shard 0's leader.
    leader: Option<String>,
    /// The leaders of the other shards, as last seen.
    shard_leaders: HashMap<u32, String>,
    placement: KnownPlacement,
    /// The newest placement version a member named (`NOT_OWNER`, or a
    /// shard's `NOT_LEADER`): newer than `placement`'s, it is read again.
    placement_seen: u64,
    next: usize,
    channels: HashMap<String, Channel>,
}

impl Routing {
    /// Routing over `endpoints` (normalized, at least one), knowing no
    /// leader and no placement yet.
    pub(super) fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            leader: None,
            shard_leaders: HashMap::new(),
            placement: KnownPlacement::default(),
            placement_seen: 0,
            next: 0,
            channels: HashMap::new(),
        }
    }

    /// The configured endpoints.
    pub(super) fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Whether `addr` is one of the configured endpoints (not only a hint).
    pub(super) fn is_configured_endpoint(&self, addr: &str) -> bool {
        self.endpoints.iter().any(|e| e == addr)
    }

    /// The placement routed by.
    pub(super) fn placement(&self) -> &KnownPlacement {
        &self.placement
    }

    /// Whether a member has named a placement newer than the one known.
    pub(super) fn placement_is_stale(&self) -> bool {
        self.placement_seen > self.placement.version
    }

    /// Routes by `placement` (as a member answered it) and its shards'
    /// leaders, unless a newer one is known already; returns the version
    /// routed by.
    pub(super) fn adopt_placement(&mut self, placement: &Placement) -> u64 {
        let known = KnownPlacement::of(placement);
        if known.version >= self.placement.version {
            for shard in &placement.shards {
                if let (Some(_), Ok(addr)) = (shard.leader_id, normalize_addr(&shard.leader_addr)) {
                    if shard.id != 0 {
                        self.shard_leaders.insert(shard.id, addr);
                    }
                }
            }
            self.placement_seen = self.placement_seen.max(known.version);
            self.placement = known;
        }
        self.placement.version
    }

    /// Notes the placement version a refusal names (`NOT_OWNER`, a
    /// shard's `NOT_LEADER`): a newer one is read before the next call.
    pub(super) fn note_placement(&mut self, status: &Status) {
        let named =
            leasehold_proto::refusal::detail(status, leasehold_proto::refusal::PLACEMENT_VERSION)
                .and_then(|v| v.parse::<u64>().ok());
        if let Some(version) = named {
            self.placement_seen = self.placement_seen.max(version);
        }
    }

    /// The member attempt `attempt` (from 1) of a call to `target` goes
    /// to: its shard's leader when known, else a replica of the shard, else
    /// the current endpoint (any node: the endpoints in turn).
    pub(super) fn pick(&mut self, target: Target, attempt: u32) -> String {
        match target.shard() {
            Some(0) if target.is_leader() => {
                if let Some(leader) = self.leader.clone() {
                    return leader;
                }
            }
            Some(shard) if target.is_leader() => {
                if let Some(leader) = self.shard_leaders.get(&shard) {
                    return leader.clone();
                }
                let replicas = self.placement.replicas_of(shard);
                if !replicas.is_empty() {
                    let index = (attempt as usize).saturating_sub(1) % replicas.len();
                    return replicas[index].clone();
                }
            }
            _ => {}
        }
        let index = match target {
            Target::Leader | Target::Shard(_) => self.next,
            Target::Any => (attempt as usize).saturating_sub(1),
        } % self.endpoints.len();
        self.next = index;
        self.endpoints[index].clone()
    }

    /// The connection to `addr`, if one is open.
    pub(super) fn channel(&self, addr: &str) -> Option<Channel> {
        self.channels.get(addr).cloned()
    }

    /// Keeps `channel` as the connection to `addr`.
    pub(super) fn keep_channel(&mut self, addr: &str, channel: Channel) {
        self.channels.insert(addr.to_string(), channel);
    }

    /// Forgets `addr` as leader and its connection, and moves to the next endpoint.
    pub(super) fn give_up_on(&mut self, addr: &str) {
        self.channels.remove(addr);
        if self.leader.as_deref() == Some(addr) {
            self.leader = None;
        }
        self.shard_leaders.retain(|_, leader| leader != addr);
        self.next = (self.next + 1) % self.endpoints.len();
    }

    /// The leader of `target`'s shard last seen.
    pub(super) fn leader_of(&self, target: Target) -> Option<String> {
        match target.shard() {
            Some(0) | None => self.leader.clone(),
            Some(shard) => self.shard_leaders.get(&shard).cloned(),
        }
    }

    /// Remembers `addr` as the leader of `target`'s shard.
    pub(super) fn remember_leader(&mut self, target: Target, addr: &str) {
        match target.shard() {
            Some(0) | None => self.leader = Some(addr.to_string()),
            Some(shard) => {
                self.shard_leaders.insert(shard, addr.to_string());
            }
        }
    }

    /// Follows a leader hint: remembers `leader_addr` (when it parses) as
    /// the leader of `target`'s shard.
    pub(super) fn follow_hint(&mut self, target: Target, leader_addr: &str) {
        if let Ok(addr) = normalize_addr(leader_addr) {
            self.remember_leader(target, &addr);
        }
    }

    /// Forgets the leader of `target`'s shard (the next call asks around).
    pub(super) fn forget_leader(&mut self, target: Target) {
        match target.shard() {
            Some(0) | None => self.leader = None,
            Some(shard) => {
                self.shard_leaders.remove(&shard);
            }
        }
    }
}
