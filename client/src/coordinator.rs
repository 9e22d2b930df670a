//! Talking to the coordinator cluster (L3): [`CoordinatorClient`] for the
//! public API (lease, reconcile, pool grant, window reads) and [`AdminClient`]
//! for cluster and policy administration.
//!
//! The client tracks the leader: it starts with any configured endpoint,
//! follows `FAILED_PRECONDITION` leader hints (metadata
//! `leasehold-leader-id` / `leasehold-leader-addr`), remembers the leader
//! that answered, and on `UNAVAILABLE`, deadline or transport errors moves to
//! the next endpoint after a jittered exponential backoff. Every attempt has
//! its own deadline and the whole call a total budget. A retried call reuses
//! its [`RequestId`], so the coordinator
//! applies it at most once and returns the first response.
//!
//! On a sharded cluster (ADR 0025) each key's calls go to the leader of its
//! shard: the client keeps the placement (read with `GetPlacement` when a
//! member names a newer version in a refusal) and a leader per shard,
//! follows hints per shard, cuts a `LeaseBatch` by shard, and takes request
//! ids from sessions of the key's shard (each group keeps its own). A
//! cluster never sharded names no placement, and nothing of this costs a
//! call.
//!
//! Request ids come from a pool of client sessions, one request in flight
//! per session at a time (the coordinator keeps a bounded window of recent
//! responses per session, so a slow retry must never fall behind many newer
//! requests of its own session). Concurrent callers of one client each get a
//! session of their own; sessions are reused, so their number follows the
//! peak concurrency.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use leasehold_proto::refusal::status_of_item;
use leasehold_proto::v1::admin_client::AdminClient as AdminRpc;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use leasehold_proto::v1::{
    lease_item_result, GetWindowRequest, GetWindowResponse, LeaseBatchRequest, LeaseRequest,
    LeaseResponse, NextWindowJoin, PoolGrantRequest, PoolGrantResponse, PoolReleaseRequest,
    PoolReleaseResponse, ReconcileRequest, ReconcileResponse, RequestId, TenantDemand,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;
use tonic::Status;

use crate::transport::{normalize_addr, normalize_endpoints, DialError, Dialer};

mod admin;
mod error;
mod session;

pub use admin::AdminClient;

/// Items per `LeaseBatch` call: a session keeps the answers of its 64
/// highest seqs, so every item of a call stays retryable.
pub const ITEMS_PER_BATCH_CALL: usize = 64;

/// Times a `LeaseBatch` part refused item by item `NOT_LEADER` (sent to a
/// replica of its shard that does not lead it) is sent again to the leader
/// the refusals name.
const ITEM_REDIRECTS: u32 = 3;

/// One lease of a [`CoordinatorClient::lease_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseItem {
    /// The key.
    pub key: String,
    /// The region it is leased for.
    pub region: String,
    /// Tokens asked for (≥ 1).
    pub tokens: u64,
}
use error::classify;
pub use error::CoordinatorError;
/// The leader a member names when it refuses with `NOT_LEADER` (carried by
/// [`CoordinatorError::NotLeader`]).
pub use leasehold_proto::LeaderHint;
use session::{SessionGuard, SessionPool};

/// Deadlines and retry budget of a [`CoordinatorClient`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryOptions {
    /// Deadline of one attempt against one node. Keep it above the
    /// coordinator's proposal timeout so a `UNAVAILABLE` answer arrives first.
    pub call_timeout: Duration,
    /// Budget of the whole call, retries and backoff included.
    pub total_timeout: Duration,
    /// Most attempts per call (redirects count).
    pub max_attempts: u32,
    /// First backoff; doubles per retry up to `backoff_max`, fully jittered.
    pub backoff_base: Duration,
    /// Largest backoff.
    pub backoff_max: Duration,
}

impl Default for RetryOptions {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_millis(3_000),
            total_timeout: Duration::from_millis(10_000),
            max_attempts: 40,
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(250),
        }
    }
}

/// Which node a call should go to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
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
    fn is_leader(self) -> bool {
        matches!(self, Target::Leader | Target::Shard(_))
    }

    /// The shard whose leader the call goes to.
    fn shard(self) -> Option<u32> {
        match self {
            Target::Leader => Some(0),
            Target::Shard(shard) => Some(shard),
            Target::Any => None,
        }
    }
}

/// The placement of keys on shards, as last read (`GetPlacement`).
#[derive(Debug, Clone, Default)]
struct KnownPlacement {
    version: u64,
    /// `(start, end, shard)` slot runs, in slot order.
    runs: Vec<(u32, u32, u32)>,
    /// Replica addresses by shard.
    replicas: HashMap<u32, Vec<String>>,
}

impl KnownPlacement {
    fn shard_of(&self, key: &str) -> u32 {
        if self.runs.is_empty() {
            return 0;
        }
        let slot = u32::from(leasehold_core::shard::slot_of(key));
        self.runs
            .iter()
            .find(|(start, end, _)| *start <= slot && slot < *end)
            .map_or(0, |(_, _, shard)| *shard)
    }
}

#[derive(Debug)]
struct Routing {
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

struct Shared {
    dialer: Arc<dyn Dialer>,
    options: RetryOptions,
    sessions: SessionPool,
    /// The node name pool calls carry (`PoolGrantRequest.node`); empty:
    /// none, the process is the holder.
    node_name: Mutex<String>,
    routing: Mutex<Routing>,
    jitter: Mutex<StdRng>,
}

/// A leader-tracking client of the coordinator's public API. Cheap to clone;
/// clones share the leader cache, connections and request-id sequence.
#[derive(Clone)]
pub struct CoordinatorClient {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CoordinatorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorClient")
            .field("client_id", &self.shared.sessions.client_id())
            .field("options", &self.shared.options)
            .field("routing", &self.routing().endpoints)
            .finish()
    }
}

impl CoordinatorClient {
    /// A client of the cluster reachable at `endpoints` (`host:port` or
    /// `http://host:port`), with default [`RetryOptions`].
    pub fn new<I, S>(endpoints: I, dialer: Arc<dyn Dialer>) -> Result<Self, CoordinatorError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::with_options(endpoints, dialer, RetryOptions::default())
    }

    /// A client with explicit deadlines and retry budget.
    pub fn with_options<I, S>(
        endpoints: I,
        dialer: Arc<dyn Dialer>,
        options: RetryOptions,
    ) -> Result<Self, CoordinatorError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::with_seed(endpoints, dialer, options, rand::thread_rng().gen())
    }

    /// A client whose id and retry jitter come from `seed`: the same seed
    /// gives the same request ids and backoffs (for seeded simulations).
    pub fn with_seed<I, S>(
        endpoints: I,
        dialer: Arc<dyn Dialer>,
        options: RetryOptions,
        seed: u64,
    ) -> Result<Self, CoordinatorError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let normalized = normalize_endpoints(endpoints)?;
        if normalized.is_empty() {
            return Err(CoordinatorError::NoEndpoints);
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let client_id = format!("c{:016x}", rng.gen::<u64>());
        Ok(Self {
            shared: Arc::new(Shared {
                dialer,
                options,
                sessions: SessionPool::new(client_id),
                node_name: Mutex::new(String::new()),
                jitter: Mutex::new(rng),
                routing: Mutex::new(Routing {
                    endpoints: normalized,
                    leader: None,
                    shard_leaders: HashMap::new(),
                    placement: KnownPlacement::default(),
                    placement_seen: 0,
                    next: 0,
                    channels: HashMap::new(),
                }),
            }),
        })
    }

    /// Names the node this client's pool calls speak for
    /// (`PoolGrantRequest.node`, `PoolReleaseRequest.node`): a name the
    /// caller keeps across its restarts, such as its pod or host name, so
    /// that the leader counts its region weight once however often it
    /// restarts. Without one, each client (each process start) is a holder
    /// of its own. Refused when not 1..=128 bytes; clones share it.
    pub fn set_node_name(&self, name: &str) -> Result<(), CoordinatorError> {
        leasehold_core::ids::ClientId::new(name)
            .map_err(|e| CoordinatorError::InvalidArgument(format!("node name: {e}")))?;
        *self
            .shared
            .node_name
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = name.to_string();
        Ok(())
    }

    /// The node name pool calls carry (empty: none).
    pub fn node_name(&self) -> String {
        self.shared
            .node_name
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// This client's id: the `client_id` of ids from
    /// [`next_request_id`](Self::next_request_id), and the prefix of its
    /// pooled sessions' ids.
    pub fn client_id(&self) -> &str {
        self.shared.sessions.client_id()
    }

    /// How many pooled sessions this client has opened (its peak
    /// concurrency, plus one per session renewed).
    pub fn sessions_opened(&self) -> u64 {
        self.shared.sessions.opened()
    }

    /// How many sessions a group had forgotten (`SESSION_EXPIRED`: idle
    /// for a minute, or never opened) this client replaced: pooled
    /// sessions retired, its own session renamed.
    pub fn sessions_renewed(&self) -> u64 {
        self.shared.sessions.renewed()
    }

    fn checkout_session(&self, target: Target) -> SessionGuard<'_> {
        self.shared
            .sessions
            .checkout_in(target.shard().unwrap_or(0))
    }

    /// Sends one logical request (`send`, under the id it is given) in a
    /// pooled session of `target`'s group, in a new session once more if
    /// the group has forgotten the first ([`session::send_in_session`]).
    async fn in_session<R, F, Fut>(&self, target: Target, send: F) -> Result<R, CoordinatorError>
    where
        F: FnMut(RequestId) -> Fut,
        Fut: Future<Output = Result<R, CoordinatorError>>,
    {
        session::send_in_session(
            &self.shared.sessions,
            target.shard().unwrap_or(0),
            CoordinatorError::is_session_expired,
            send,
        )
        .await
    }

    /// Renames this client's own session when `answer` says a group has
    /// forgotten the session `request_id` (a caller-managed id) is of:
    /// the caller's request is refused (its outcome is the caller's to
    /// judge), the next ids of [`next_request_id`](Self::next_request_id)
    /// open a session again.
    fn renew_own_session_on_expiry<R>(
        &self,
        request_id: &RequestId,
        answer: &Result<R, CoordinatorError>,
    ) {
        if matches!(answer, Err(error) if error.is_session_expired())
            && self.shared.sessions.renew_manual(&request_id.client_id)
        {
            tracing::debug!(session = %request_id.client_id, "own session forgotten by a group; renamed");
        }
    }

    /// The shard of `key` as this client knows the placement (0 on a
    /// cluster never sharded, or before any member named a placement).
    pub fn shard_of(&self, key: &str) -> u32 {
        self.routing().placement.shard_of(key)
    }

    /// The placement version this client routes by (0: never sharded).
    pub fn placement_version(&self) -> u64 {
        self.routing().placement.version
    }

    /// Where `key`'s calls go: its shard's leader. The placement is read
    /// again first when a member has named a newer one.
    async fn target_for(&self, key: &str) -> Target {
        let stale = {
            let routing = self.routing();
            routing.placement_seen > routing.placement.version
        };
        if stale {
            if let Err(error) = self.refresh_placement().await {
                tracing::debug!(%error, "placement not read; routing by the one known");
            }
        }
        Target::Shard(self.shard_of(key))
    }

    /// Reads the placement from any member (`GetPlacement`) and routes by
    /// it from now on.
    pub async fn refresh_placement(&self) -> Result<u64, CoordinatorError> {
        let placement = self
            .call(Target::Any, move |channel, timeout| {
                let request = with_timeout(leasehold_proto::v1::GetPlacementRequest {}, timeout);
                async move { CoordinatorRpc::new(channel).get_placement(request).await }
            })
            .await?;
        let known = KnownPlacement {
            version: placement.version,
            runs: placement
                .slots
                .iter()
                .map(|run| (run.start, run.end, run.shard))
                .collect(),
            replicas: placement
                .shards
                .iter()
                .map(|shard| {
                    let addrs = shard
                        .replica_addrs
                        .iter()
                        .filter_map(|member| normalize_addr(&member.addr).ok())
                        .collect();
                    (shard.id, addrs)
                })
                .collect(),
        };
        let mut routing = self.routing();
        if known.version >= routing.placement.version {
            for shard in &placement.shards {
                if let (Some(_), Ok(addr)) = (shard.leader_id, normalize_addr(&shard.leader_addr)) {
                    if shard.id != 0 {
                        routing.shard_leaders.insert(shard.id, addr);
                    }
                }
            }
            routing.placement_seen = routing.placement_seen.max(known.version);
            routing.placement = known;
        }
        Ok(routing.placement.version)
    }

    /// A fresh request id of this client's own session, for callers that
    /// manage retries themselves: pass it to a `*_with_id` call and reuse it
    /// when retrying the same logical request. Keep fewer than 64 of these in
    /// flight (the coordinator remembers that many responses per session).
    pub fn next_request_id(&self) -> RequestId {
        self.shared.sessions.manual_request_id()
    }

    /// [`next_request_id`](Self::next_request_id) for a call about `key`:
    /// an id of this client's own session in the group of `key`'s shard,
    /// as this client knows the placement (each group keeps its own
    /// sessions).
    pub fn next_request_id_for(&self, key: &str) -> RequestId {
        let shard = self.shard_of(key);
        self.shared.sessions.manual_request_id_in(shard)
    }

    /// The leader address last seen, if any.
    pub fn leader(&self) -> Option<String> {
        self.routing().leader.clone()
    }

    /// The leader of `target`'s shard last seen.
    fn leader_of(&self, target: Target) -> Option<String> {
        let routing = self.routing();
        match target.shard() {
            Some(0) | None => routing.leader.clone(),
            Some(shard) => routing.shard_leaders.get(&shard).cloned(),
        }
    }

    /// An admin client sharing this client's routing and connections.
    pub fn admin(&self) -> AdminClient {
        AdminClient::from_client(self.clone())
    }

    /// Leases up to `tokens` of `key`'s current window for `region`.
    pub async fn lease(
        &self,
        key: &str,
        region: &str,
        tokens: u64,
    ) -> Result<LeaseResponse, CoordinatorError> {
        let target = self.target_for(key).await;
        self.in_session(target, |request_id| {
            self.lease_to(target, key, region, tokens, request_id)
        })
        .await
    }

    /// [`lease`](Self::lease) with an explicit request id.
    pub async fn lease_with_id(
        &self,
        key: &str,
        region: &str,
        tokens: u64,
        request_id: RequestId,
    ) -> Result<LeaseResponse, CoordinatorError> {
        let target = self.target_for(key).await;
        let answer = self
            .lease_to(target, key, region, tokens, request_id.clone())
            .await;
        self.renew_own_session_on_expiry(&request_id, &answer);
        answer
    }

    #[tracing::instrument(name = "leasehold.coordinator.lease", level = "debug", skip_all, fields(otel.kind = "client", key, region, tokens))]
    async fn lease_to(
        &self,
        target: Target,
        key: &str,
        region: &str,
        tokens: u64,
        request_id: RequestId,
    ) -> Result<LeaseResponse, CoordinatorError> {
        let request = LeaseRequest {
            key: key.to_string(),
            region: region.to_string(),
            tokens,
            request_id: Some(request_id),
        };
        self.call(target, move |channel, timeout| {
            let request = with_timeout(request.clone(), timeout);
            async move { CoordinatorRpc::new(channel).lease(request).await }
        })
        .await
    }

    /// Leases for many keys in one `LeaseBatch` call per 64 items: one
    /// answer per item, in order — the grant, or the error that item alone
    /// would have got. Each item has its own request id (one session per
    /// call), so a retried call is exactly-once per item. Whole-call
    /// failures (no leader, no quorum, after the retries) are the outer
    /// error.
    #[tracing::instrument(name = "leasehold.coordinator.lease_batch", level = "debug", skip_all, fields(otel.kind = "client", items = items.len()))]
    pub async fn lease_batch(
        &self,
        items: &[LeaseItem],
    ) -> Result<Vec<Result<LeaseResponse, CoordinatorError>>, CoordinatorError> {
        let mut answers: Vec<Option<Result<LeaseResponse, CoordinatorError>>> =
            items.iter().map(|_| None).collect();
        let all: Vec<usize> = (0..items.len()).collect();
        self.lease_batch_round(items, &all, &mut answers).await?;
        // Items refused NOT_LEADER by a shard they were not sent to (a
        // member routed them by a placement this client did not know yet,
        // or another caller of this client has just read) go once more,
        // split by the placement known now (read again first if a member
        // named a newer one). Nothing refused NOT_LEADER was executed.
        let refused: Vec<usize> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Some(Err(CoordinatorError::NotLeader { .. }))))
            .map(|(index, _)| index)
            .collect();
        if !refused.is_empty() {
            self.lease_batch_round(items, &refused, &mut answers)
                .await?;
        }
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(CoordinatorError::Rpc {
                        code: tonic::Code::Internal,
                        message: "an item without a result".into(),
                    })
                })
            })
            .collect())
    }

    /// Leases `items[i]` for each `i` of `indices`, cut by shard (the
    /// placement read first if a member named a newer one), into
    /// `answers[i]`.
    async fn lease_batch_round(
        &self,
        items: &[LeaseItem],
        indices: &[usize],
        answers: &mut [Option<Result<LeaseResponse, CoordinatorError>>],
    ) -> Result<(), CoordinatorError> {
        if let Some(&first) = indices.first() {
            // Reads the placement if a member named a newer one.
            self.target_for(&items[first].key).await;
        }
        let mut by_shard: std::collections::BTreeMap<u32, Vec<usize>> =
            std::collections::BTreeMap::new();
        for &index in indices {
            by_shard
                .entry(self.shard_of(&items[index].key))
                .or_default()
                .push(index);
        }
        // Every part at once: a batch over S shards takes one round trip,
        // not S (each part is its own group's, on its own leader).
        let parts: Vec<(u32, Vec<usize>)> = by_shard
            .into_iter()
            .flat_map(|(shard, indices)| {
                indices
                    .chunks(ITEMS_PER_BATCH_CALL)
                    .map(|chunk| (shard, chunk.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let calls = parts.iter().map(|(shard, chunk)| {
            let part: Vec<LeaseItem> = chunk.iter().map(|&i| items[i].clone()).collect();
            async move { self.lease_batch_call(Target::Shard(*shard), &part).await }
        });
        let answered = futures::future::join_all(calls).await;
        for ((_, chunk), results) in parts.iter().zip(answered) {
            for (&index, result) in chunk.iter().zip(results?) {
                answers[index] = Some(result);
            }
        }
        Ok(())
    }

    /// One `LeaseBatch` call of at most [`ITEMS_PER_BATCH_CALL`] items of
    /// one shard, in a pooled session; items refused `SESSION_EXPIRED` go
    /// once more in a new session (as [`in_session`](Self::in_session)).
    async fn lease_batch_call(
        &self,
        target: Target,
        chunk: &[LeaseItem],
    ) -> Result<Vec<Result<LeaseResponse, CoordinatorError>>, CoordinatorError> {
        let mut session = self.checkout_session(target);
        let mut results = self.lease_batch_in(target, chunk, &mut session).await?;
        let forgotten: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Err(error) if error.is_session_expired()))
            .map(|(index, _)| index)
            .collect();
        if forgotten.is_empty() {
            return Ok(results);
        }
        tracing::debug!(
            items = forgotten.len(),
            "session forgotten by its group; sending its items in a new one"
        );
        session.retire();
        let mut fresh = self.shared.sessions.open_in(target.shard().unwrap_or(0));
        let again: Vec<LeaseItem> = forgotten.iter().map(|&i| chunk[i].clone()).collect();
        let answers = self.lease_batch_in(target, &again, &mut fresh).await?;
        for (index, answer) in forgotten.into_iter().zip(answers) {
            results[index] = answer;
        }
        Ok(results)
    }

    /// One `LeaseBatch` call of `chunk` (one shard's) under ids of
    /// `session`.
    async fn lease_batch_in(
        &self,
        target: Target,
        chunk: &[LeaseItem],
        session: &mut SessionGuard<'_>,
    ) -> Result<Vec<Result<LeaseResponse, CoordinatorError>>, CoordinatorError> {
        let request = LeaseBatchRequest {
            items: chunk
                .iter()
                .map(|item| LeaseRequest {
                    key: item.key.clone(),
                    region: item.region.clone(),
                    tokens: item.tokens,
                    request_id: Some(session.request_id()),
                })
                .collect(),
        };
        // A member that hosts the shard but does not lead it answers the
        // call and refuses every item NOT_LEADER (a batch is cut by shard:
        // a part is one group's): follow the hint and send the part again,
        // with the same request ids (exactly-once per item).
        let mut redirect = 0;
        loop {
            let request = request.clone();
            let response = self
                .call(target, move |channel, timeout| {
                    let request = with_timeout(request.clone(), timeout);
                    async move { CoordinatorRpc::new(channel).lease_batch(request).await }
                })
                .await?;
            if response.results.len() != chunk.len() {
                return Err(CoordinatorError::Rpc {
                    code: tonic::Code::Internal,
                    message: format!(
                        "{} results for {} items",
                        response.results.len(),
                        chunk.len()
                    ),
                });
            }
            let leader = self.leader_of(target).unwrap_or_default();
            // The shard a NOT_LEADER names, when it is not this part's.
            let mut elsewhere = false;
            let results: Vec<Result<LeaseResponse, CoordinatorError>> = response
                .results
                .into_iter()
                .map(|result| match result.result {
                    Some(lease_item_result::Result::Granted(grant)) => Ok(grant),
                    Some(lease_item_result::Result::Refused(refused)) => {
                        let status = status_of_item(&refused);
                        self.note_placement(&status);
                        let named = leasehold_proto::refusal::detail(
                            &status,
                            leasehold_proto::refusal::SHARD,
                        )
                        .and_then(|shard| shard.parse::<u32>().ok())
                        .unwrap_or(0);
                        let error = classify(&leader, status);
                        if Some(named) != target.shard() {
                            elsewhere = true;
                            // Remembered for the shard it leads.
                            if let CoordinatorError::NotLeader { hint, .. } = &error {
                                if let Some(addr) = &hint.leader_addr {
                                    self.follow_hint(Target::Shard(named), addr);
                                }
                            }
                        }
                        Err(error)
                    }
                    None => Err(CoordinatorError::Rpc {
                        code: tonic::Code::Internal,
                        message: "an item without a result".into(),
                    }),
                })
                .collect();
            let not_led = results
                .iter()
                .all(|r| matches!(r, Err(CoordinatorError::NotLeader { .. })));
            if !not_led || elsewhere || redirect == ITEM_REDIRECTS {
                return Ok(results);
            }
            let hint = results.iter().find_map(|r| match r {
                Err(CoordinatorError::NotLeader { hint, .. }) => hint.leader_addr.clone(),
                _ => None,
            });
            match hint {
                Some(addr) if addr != leader => self.follow_hint(target, &addr),
                _ => {
                    self.forget_leader(target);
                    tokio::time::sleep(self.backoff(redirect)).await;
                }
            }
            redirect += 1;
        }
    }

    /// Returns `leftover` unused credits of the window starting at `window_start_ms`.
    #[tracing::instrument(name = "leasehold.coordinator.reconcile", level = "debug", skip_all, fields(otel.kind = "client", key, region, leftover))]
    pub async fn reconcile(
        &self,
        key: &str,
        region: &str,
        leftover: u64,
        window_start_ms: u64,
    ) -> Result<ReconcileResponse, CoordinatorError> {
        let target = self.target_for(key).await;
        self.in_session(target, |request_id| {
            let request = ReconcileRequest {
                key: key.to_string(),
                region: region.to_string(),
                leftover,
                window_start_ms,
                request_id: Some(request_id),
            };
            self.call(target, move |channel, timeout| {
                let request = with_timeout(request.clone(), timeout);
                async move { CoordinatorRpc::new(channel).reconcile(request).await }
            })
        })
        .await
    }

    /// Raises `region`'s fair-pool grant of `key` towards `want_total`.
    pub async fn pool_grant(
        &self,
        key: &str,
        region: &str,
        region_weight: u64,
        want_total: u64,
    ) -> Result<PoolGrantResponse, CoordinatorError> {
        self.pool_grant_reporting(key, region, region_weight, want_total, 0, Vec::new())
            .await
    }

    /// [`pool_grant`](Self::pool_grant) with a report of the region's
    /// tenants' demand in the window starting at `demand_window_start_ms`;
    /// the answer's `tenant_demands` are their totals over all regions (see
    /// the proto's `PoolGrantRequest.tenant_demands`).
    #[tracing::instrument(name = "leasehold.coordinator.pool_grant", level = "debug", skip_all, fields(otel.kind = "client", key, region, want_total))]
    pub async fn pool_grant_reporting(
        &self,
        key: &str,
        region: &str,
        region_weight: u64,
        want_total: u64,
        demand_window_start_ms: u64,
        tenant_demands: Vec<TenantDemand>,
    ) -> Result<PoolGrantResponse, CoordinatorError> {
        self.pool_grant_joining_next(
            key,
            region,
            region_weight,
            want_total,
            demand_window_start_ms,
            tenant_demands,
            None,
        )
        .await
    }

    /// [`pool_grant_reporting`](Self::pool_grant_reporting) that also joins
    /// the key's next window ahead with `join_next` (see the proto's
    /// `NextWindowJoin`): the answer's `next_window` is the grant there, or
    /// `next_window_refused` says why there is none.
    #[allow(clippy::too_many_arguments)]
    pub async fn pool_grant_joining_next(
        &self,
        key: &str,
        region: &str,
        region_weight: u64,
        want_total: u64,
        demand_window_start_ms: u64,
        tenant_demands: Vec<TenantDemand>,
        join_next: Option<NextWindowJoin>,
    ) -> Result<PoolGrantResponse, CoordinatorError> {
        self.pool_grant_asking_more(
            key,
            region,
            region_weight,
            (want_total, 0),
            demand_window_start_ms,
            tenant_demands,
            join_next,
        )
        .await
    }

    /// [`pool_grant_joining_next`](Self::pool_grant_joining_next) asking
    /// for `(want_total, want_more)`: `want_more` tokens more than the
    /// region holds when the leader takes the call up, at least
    /// `want_total` in all (the proto's `PoolGrantRequest.want_more`; 0:
    /// the total alone). Every pool call of this client names it as the
    /// holder (`PoolGrantRequest.holder`).
    #[allow(clippy::too_many_arguments)]
    pub async fn pool_grant_asking_more(
        &self,
        key: &str,
        region: &str,
        region_weight: u64,
        (want_total, want_more): (u64, u64),
        demand_window_start_ms: u64,
        tenant_demands: Vec<TenantDemand>,
        join_next: Option<NextWindowJoin>,
    ) -> Result<PoolGrantResponse, CoordinatorError> {
        let target = self.target_for(key).await;
        let node = self.node_name();
        self.in_session(target, |request_id| {
            let request = PoolGrantRequest {
                key: key.to_string(),
                region: region.to_string(),
                region_weight,
                want_total,
                request_id: Some(request_id),
                tenant_demands: tenant_demands.clone(),
                demand_window_start_ms,
                join_next: join_next.clone(),
                // This client is one holder (its node, when named, else
                // its process): the leader sums a region's weight over its
                // holders (the proto's PoolGrantRequest.node and .holder).
                holder: self.shared.sessions.client_id().to_string(),
                node: node.clone(),
                want_more,
            };
            self.call(target, move |channel, timeout| {
                let request = with_timeout(request.clone(), timeout);
                async move { CoordinatorRpc::new(channel).pool_grant(request).await }
            })
        })
        .await
    }

    /// Retires `region` from `key`'s pool in `window_start_ms`, keeping
    /// `keep_total` of `from_total` (reclaim), under an explicit request id
    /// (from [`next_request_id`](Self::next_request_id)): until the answer
    /// comes, the caller spends at most `keep_total`, and it retries the
    /// same id before any other pool call of the key (see the proto).
    #[tracing::instrument(name = "leasehold.coordinator.pool_release", level = "debug", skip_all, fields(otel.kind = "client", key, region))]
    pub async fn pool_release_with_id(
        &self,
        key: &str,
        region: &str,
        from_total: u64,
        keep_total: u64,
        window_start_ms: u64,
        request_id: RequestId,
    ) -> Result<PoolReleaseResponse, CoordinatorError> {
        self.pool_release_joining_next(
            key,
            region,
            from_total,
            keep_total,
            window_start_ms,
            request_id,
            None,
        )
        .await
    }

    /// [`pool_release_with_id`](Self::pool_release_with_id) that also joins
    /// the key's next window ahead with `join_next` (as
    /// [`pool_grant_joining_next`](Self::pool_grant_joining_next)); a resend
    /// carries the same join.
    #[allow(clippy::too_many_arguments)]
    pub async fn pool_release_joining_next(
        &self,
        key: &str,
        region: &str,
        from_total: u64,
        keep_total: u64,
        window_start_ms: u64,
        request_id: RequestId,
        join_next: Option<NextWindowJoin>,
    ) -> Result<PoolReleaseResponse, CoordinatorError> {
        let request = PoolReleaseRequest {
            key: key.to_string(),
            region: region.to_string(),
            from_total,
            keep_total,
            window_start_ms,
            request_id: Some(request_id.clone()),
            join_next,
            holder: self.shared.sessions.client_id().to_string(),
            node: self.node_name(),
        };
        let target = self.target_for(key).await;
        let answer = self
            .call(target, move |channel, timeout| {
                let request = with_timeout(request.clone(), timeout);
                async move { CoordinatorRpc::new(channel).pool_release(request).await }
            })
            .await;
        self.renew_own_session_on_expiry(&request_id, &answer);
        answer
    }

    /// A linearizable view of `key`'s current window.
    #[tracing::instrument(name = "leasehold.coordinator.get_window", level = "debug", skip_all, fields(otel.kind = "client", key))]
    pub async fn get_window(&self, key: &str) -> Result<GetWindowResponse, CoordinatorError> {
        let request = GetWindowRequest {
            key: key.to_string(),
        };
        let target = self.target_for(key).await;
        self.call(target, move |channel, timeout| {
            let request = with_timeout(request.clone(), timeout);
            async move { CoordinatorRpc::new(channel).get_window(request).await }
        })
        .await
    }

    pub(crate) fn admin_rpc(channel: Channel) -> AdminRpc<Channel> {
        AdminRpc::new(channel)
    }

    fn routing(&self) -> MutexGuard<'_, Routing> {
        // A poisoned lock only means another caller panicked mid-update of a
        // cache; the cache is still usable.
        self.shared
            .routing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn pick(&self, target: Target, attempt: u32) -> String {
        let mut routing = self.routing();
        match target.shard() {
            Some(0) if target.is_leader() => {
                if let Some(leader) = routing.leader.clone() {
                    return leader;
                }
            }
            Some(shard) if target.is_leader() => {
                if let Some(leader) = routing.shard_leaders.get(&shard) {
                    return leader.clone();
                }
                if let Some(replicas) = routing.placement.replicas.get(&shard) {
                    if !replicas.is_empty() {
                        let index = (attempt as usize).saturating_sub(1) % replicas.len();
                        return replicas[index].clone();
                    }
                }
            }
            _ => {}
        }
        let index = match target {
            Target::Leader | Target::Shard(_) => routing.next,
            Target::Any => (attempt as usize).saturating_sub(1),
        } % routing.endpoints.len();
        routing.next = index;
        routing.endpoints[index].clone()
    }

    async fn channel(&self, addr: &str) -> Result<Channel, DialError> {
        if let Some(channel) = self.routing().channels.get(addr) {
            return Ok(channel.clone());
        }
        let channel = self.shared.dialer.dial(addr).await?;
        self.routing()
            .channels
            .insert(addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// Forgets `addr` as leader and its connection, and moves to the next endpoint.
    fn give_up_on(&self, addr: &str) {
        let mut routing = self.routing();
        routing.channels.remove(addr);
        if routing.leader.as_deref() == Some(addr) {
            routing.leader = None;
        }
        routing.shard_leaders.retain(|_, leader| leader != addr);
        routing.next = (routing.next + 1) % routing.endpoints.len();
    }

    fn endpoint_count(&self) -> usize {
        self.routing().endpoints.len()
    }

    fn is_configured_endpoint(&self, addr: &str) -> bool {
        self.routing().endpoints.iter().any(|e| e == addr)
    }

    fn follow_hint(&self, target: Target, leader_addr: &str) {
        if let Ok(addr) = normalize_addr(leader_addr) {
            self.remember_leader(target, &addr);
        }
    }

    /// Forgets the leader of `target`'s shard (the next call asks around).
    fn forget_leader(&self, target: Target) {
        let mut routing = self.routing();
        match target.shard() {
            Some(0) | None => routing.leader = None,
            Some(shard) => {
                routing.shard_leaders.remove(&shard);
            }
        }
    }

    fn remember_leader(&self, target: Target, addr: &str) {
        let mut routing = self.routing();
        match target.shard() {
            Some(0) | None => routing.leader = Some(addr.to_string()),
            Some(shard) => {
                routing.shard_leaders.insert(shard, addr.to_string());
            }
        }
    }

    /// Notes the placement version a refusal names (`NOT_OWNER`, a
    /// shard's `NOT_LEADER`): a newer one is read before the next call.
    fn note_placement(&self, status: &Status) {
        let named =
            leasehold_proto::refusal::detail(status, leasehold_proto::refusal::PLACEMENT_VERSION)
                .and_then(|v| v.parse::<u64>().ok());
        if let Some(version) = named {
            let mut routing = self.routing();
            routing.placement_seen = routing.placement_seen.max(version);
        }
    }

    fn backoff(&self, retry: u32) -> Duration {
        let options = &self.shared.options;
        let exp = options.backoff_base.saturating_mul(1u32 << retry.min(16));
        let cap = exp.min(options.backoff_max);
        let millis = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX).max(1);
        let mut rng = self.shared.jitter.lock().unwrap_or_else(|p| p.into_inner());
        Duration::from_millis(rng.gen_range(millis / 2..=millis))
    }

    /// Runs `rpc` against the target node with per-attempt deadlines, leader
    /// hints and jittered retries until success, a terminal error or the budget ends.
    pub(crate) async fn call<R, F, Fut>(
        &self,
        target: Target,
        mut rpc: F,
    ) -> Result<R, CoordinatorError>
    where
        F: FnMut(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let options = self.shared.options;
        let started = tokio::time::Instant::now();
        let deadline = started + options.total_timeout;
        let mut attempt = 0u32;
        let mut redirects_in_a_row = 0u32;
        // Leader hints whose host name does not resolve from here (a
        // container-internal name, say): never followed again by this call.
        let mut unresolvable_hints: Vec<String> = Vec::new();
        let mut useless_hints_in_a_row = 0usize;
        loop {
            attempt += 1;
            let addr = self.pick(target, attempt);
            let now = tokio::time::Instant::now();
            let per_call = options
                .call_timeout
                .min(deadline.saturating_duration_since(now));
            let error = match self.channel(&addr).await {
                Err(e @ (DialError::InvalidAddress { .. } | DialError::Credentials { .. })) => {
                    return Err(e.into())
                }
                Err(e) => CoordinatorError::Transport {
                    addr: addr.clone(),
                    message: e.to_string(),
                },
                Ok(channel) => match tokio::time::timeout(per_call, rpc(channel, per_call)).await {
                    Ok(Ok(response)) => {
                        if target.is_leader() {
                            self.remember_leader(target, &addr);
                        }
                        return Ok(response.into_inner());
                    }
                    Ok(Err(status)) => {
                        self.note_placement(&status);
                        classify(&addr, status)
                    }
                    Err(_) => CoordinatorError::DeadlineExceeded {
                        addr: addr.clone(),
                        after: per_call,
                    },
                },
            };
            let mut pause = true;
            match &error {
                CoordinatorError::NotLeader {
                    hint:
                        LeaderHint {
                            leader_addr: Some(leader),
                            ..
                        },
                    ..
                } if target.is_leader()
                    && unresolvable_hints
                        .iter()
                        .any(|hint| normalize_addr(leader).is_ok_and(|l| &l == hint)) =>
                {
                    // Every configured endpoint points at a leader this
                    // machine cannot resolve: no retry can help.
                    useless_hints_in_a_row += 1;
                    self.give_up_on(&addr);
                    if useless_hints_in_a_row >= self.endpoint_count() {
                        return Err(CoordinatorError::LeaderUnresolvable {
                            leader_addr: leader.clone(),
                            via: addr,
                        });
                    }
                    pause = false;
                }
                CoordinatorError::NotLeader {
                    hint:
                        LeaderHint {
                            leader_addr: Some(leader),
                            ..
                        },
                    ..
                } if target.is_leader() => {
                    self.follow_hint(target, leader);
                    redirects_in_a_row += 1;
                    // Follow a fresh hint at once; back off if hints go round in circles.
                    pause = redirects_in_a_row > 2;
                }
                e if e.is_retryable() => {
                    if e.is_name_resolution_failure() && !self.is_configured_endpoint(&addr) {
                        unresolvable_hints.push(addr.clone());
                    }
                    redirects_in_a_row = 0;
                    self.give_up_on(&addr);
                }
                _ => return Err(error),
            }
            let wait = if pause {
                self.backoff(attempt)
            } else {
                Duration::ZERO
            };
            let resume = tokio::time::Instant::now() + wait;
            if attempt >= options.max_attempts || resume >= deadline {
                tracing::debug!(attempt, %error, "coordinator call gave up");
                return Err(error);
            }
            tracing::debug!(attempt, %error, ?wait, "coordinator call retrying");
            tokio::time::sleep(wait).await;
        }
    }
}

fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    crate::transport::outgoing(message, timeout)
}

#[cfg(test)]
mod tests;
