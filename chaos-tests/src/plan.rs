//! The plain data that describes a simulated run: the fleet's shape
//! ([`FleetShape`]), the faults injected into it ([`Fault`], with its
//! operator actions [`MembershipAction`]) and the named [`Scenario`] that
//! bundles them.
//!
//! It depends on no other module of the crate: `sim` runs a [`Scenario`]
//! and `scenario` holds the catalogue of them and runs one across seeds,
//! both on top of these types (and `sim` re-exports the fleet's, `scenario`
//! the scenario's, under their old paths).

use std::time::Duration;

/// Shape of one simulated run.
#[derive(Debug, Clone)]
pub struct FleetShape {
    /// Coordinator members that form the cluster (3 or 5).
    pub members: u64,
    /// Further member hosts, started uninitialised, that join only when a
    /// [`MembershipAction::JoinSpares`] fault adds them (ids after `members`).
    pub spare_members: u64,
    /// Client hosts (regions), each with one leased limiter.
    pub clients: usize,
    /// L.
    pub limit: u64,
    /// Window length.
    pub window_ms: u64,
    /// How long clients generate load, simulated.
    pub load: Duration,
    /// Regional escrow nodes between clients and the cluster (0: clients
    /// lease from the coordinator directly). Client `c` uses node `c % n`.
    pub escrow_nodes: usize,
    /// The key's policy is `fair`: escrow nodes draw their region's share
    /// of L from the coordinator's region fair pool (weighted max-min)
    /// instead of leasing batches (needs escrow nodes).
    pub fair: bool,
    /// Hostile client hosts (`sim::hostile`) beside the honest ones: they
    /// reuse request ids with changed payloads and across restarts, flood
    /// sessions and (with escrow nodes) give back more than they hold.
    pub hostile_clients: usize,
    /// Escrow nodes front the key with a fair throttle (FAIR), seeded from
    /// the run's seed: node 0 plain, the others also with idle capacity
    /// (reserve 0). FAIR only turns admissions into denials, so Δ = 0 must
    /// still hold (needs escrow nodes).
    pub fair_throttle: bool,
    /// Escrow nodes' reclaim: a `fair` key idle this long hands its unspent
    /// pool grant back (0: off).
    pub pool_release_idle_ms: u64,
    /// Region 0's clients ask only in the first 100 ms of each window and
    /// then fall silent until the next: a region that joins the pool,
    /// takes a little and goes idle (what reclaim is for).
    pub sparse_region_0: bool,
    /// Region 0's clients pause 30–60 ms after each admission (about a
    /// third of a fair share of the default L each): a light region
    /// beside heavy ones, which hands back its margins late in each
    /// window while the heavy one looks for them (and the leader lapses
    /// the reserves in the last eighth).
    pub light_region_0: bool,
    /// Escrow node 1 serves region 0 beside node 0 (two nodes, one region,
    /// active-active) instead of a region of its own.
    pub second_node_in_region_0: bool,
    /// Clients are Envoy's rate limit filter: each asks its escrow node's
    /// rate limit service (`ShouldRateLimit`, one hit) for the descriptor
    /// of [`crate::sim::rls`], whose rule allows `limit` per window (the
    /// window must be a unit's: 1 s, 1 min, 1 h or 1 day).
    pub rls: bool,
    /// The key's outage policy: `fallback` with this many tokens per region
    /// per window (0: `fail_closed`). The Δ oracle then allows the window
    /// `escrow_nodes ×` this beyond L, as the policy documents.
    pub fallback_tokens_per_region: u64,
    /// Raft groups the keys are spread over (1: never sharded). With more,
    /// the control host spreads the slots evenly at setup, the load's key
    /// on the last shard ([`crate::sim::shards`]), and a leader fault hits
    /// that shard's leader.
    pub shards: u32,
    /// Clients leasing from the coordinator also resend, every fifth
    /// request, the oldest id they still keep (up to 48 requests back,
    /// 30 s): by then its key may have moved to another shard, whose
    /// answer must be the first one (the shard operation scenarios).
    pub resend_old_ids: bool,
}

impl Default for FleetShape {
    fn default() -> Self {
        FleetShape {
            members: 3,
            spare_members: 0,
            clients: 4,
            limit: 120,
            window_ms: 1_000,
            load: Duration::from_secs(12),
            escrow_nodes: 0,
            fair: false,
            hostile_clients: 0,
            fair_throttle: false,
            pool_release_idle_ms: 150,
            sparse_region_0: false,
            light_region_0: false,
            second_node_in_region_0: false,
            rls: false,
            fallback_tokens_per_region: 0,
            shards: 1,
            resend_old_ids: false,
        }
    }
}

impl FleetShape {
    /// Every member host id, the initial voters first, then the spares.
    pub fn member_ids(&self) -> std::ops::RangeInclusive<u64> {
        1..=self.members + self.spare_members
    }

    /// Time before the load starts: the cluster forms and takes its
    /// policies (3 s), and a sharded fleet spreads its slots (3 s more).
    pub fn setup_time(&self) -> Duration {
        Duration::from_secs(if self.shards > 1 { 6 } else { 3 })
    }
}

/// One membership change for the operator host to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MembershipAction {
    /// Every spare member joins as a learner, then becomes a voter.
    JoinSpares,
    /// Voter `id` (0: the current leader) is removed from the cluster.
    RemoveVoter(u64),
    /// The current leader steps down (admin `StepDown`) and another voter
    /// is elected.
    StepDown,
    /// A new shard (`shard`, replicated by `replicas`) is added and the
    /// hash slot of the load's key moves to it from shard 0, with the
    /// key's live window (`leasehold shard add` + `shard move`).
    MoveKeyToNewShard {
        /// The new shard's id.
        shard: u32,
        /// Its three replicas.
        replicas: [u64; 3],
    },
    /// The shard serving the load's key is split into a new shard (the
    /// next id) on the same replicas (shard 0: members 1 to 3); where the
    /// split leaves the key behind, its slot moves on to the new shard
    /// (`leasehold shard split`, then `shard move`). Done once the key is
    /// served again.
    SplitKeyShard,
    /// The replicas of the shard serving the load's key change so that
    /// its current leader is not one of them: the leader gives way to the
    /// lowest member that is not a replica (`leasehold shard replicas`).
    /// Done once the key is served again.
    DropKeyShardLeader,
}

/// One injected fault. Member `0` means "the current leader".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Cut a member off from every other host (both directions).
    Isolate(u64),
    /// Repair every partition made by `Isolate`.
    HealAll,
    /// Crash a member and drop its unflushed writes (power loss).
    PowerLoss(u64),
    /// Power loss on every member at once.
    PowerLossAll,
    /// Restart every member that is down.
    RestartAll,
    /// Hold a member's messages to the other members for a while.
    Pause {
        /// Which member.
        member: u64,
        /// For how long.
        for_ms: u64,
    },
    /// Release a paused member (scheduled by `Pause`).
    Resume(u64),
    /// Cut escrow node `n` (a region) off from every member.
    CutRegion(usize),
    /// Escrow node `n`'s process crashes (`kill -9`): its memory and its
    /// calls in flight are lost; it stays down until `RestartEscrow`.
    CrashEscrow(usize),
    /// Escrow node `n` stops gracefully (SIGTERM): it hands back what it
    /// holds, then its process ends; it stays down until `RestartEscrow`.
    DrainEscrow(usize),
    /// Escrow node `n` starts again as a new process (nothing in memory, a
    /// client id of its own); a running one is crashed first.
    RestartEscrow(usize),
    /// A member's messages to the other members are dropped, while it still
    /// hears them (one-way partition; 0 = the current leader).
    MuteOneWay(u64),
    /// Every link, each simulated tick, breaks with this probability (per
    /// mille), dropping the messages in flight, and is repaired the next
    /// tick; `HealAll` ends it.
    Loss(u32),
    /// Every message (members, escrow nodes, clients) is delayed by up to
    /// this many milliseconds instead of 15; `HealAll` ends it.
    Delay(u64),
    /// The current leader and the fewest other members that still leave it
    /// in a minority are cut off from the rest of the members (clients
    /// still reach both sides); `HealAll` repairs it.
    SplitLeaderMinority,
    /// A membership change, carried out through the admin API by an
    /// operator host while the load runs.
    Membership(MembershipAction),
    /// The honest clients stop asking for a while (a night's lull, a
    /// deploy): every process stays up, no session of theirs is used.
    QuietClients {
        /// For how long.
        for_ms: u64,
    },
    /// The clients ask again (scheduled by `QuietClients`).
    ClientsBack,
}

/// A named scenario.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Name used on the command line.
    pub name: &'static str,
    /// Fleet shape.
    pub shape: FleetShape,
    /// Faults, at times counted from the start of the load.
    pub faults: Vec<(Duration, Fault)>,
    /// Per-member wall-clock offsets (ahead of real time), by member id − 1.
    pub member_clock_offsets_ms: Vec<u64>,
    /// Per-member clock drift in parts per million, by member id − 1.
    pub member_clock_drift_ppm: Vec<i64>,
    /// After the last heal, admissions must resume within this.
    pub liveness_bound_ms: u64,
}

impl Scenario {
    /// The wall-clock offset of member `id`.
    pub fn clock_offset_ms(&self, id: u64) -> u64 {
        usize::try_from(id.saturating_sub(1))
            .ok()
            .and_then(|i| self.member_clock_offsets_ms.get(i).copied())
            .unwrap_or(0)
    }

    /// The clock drift of member `id`, parts per million.
    pub fn clock_drift_ppm(&self, id: u64) -> i64 {
        usize::try_from(id.saturating_sub(1))
            .ok()
            .and_then(|i| self.member_clock_drift_ppm.get(i).copied())
            .unwrap_or(0)
    }
}
