//! Hostile clients in the simulated fleet: hosts that speak the wire
//! protocol directly (no client library to keep them honest) and try to get
//! tokens the coordinator or an escrow node never counted. They run beside
//! the honest clients and are checked by the same oracle.
//!
//! A hostile client **spends everything it is told it got**: every token
//! of every answer is recorded as its admission, labelled with the window
//! the answer names (while the answer's lifetime lasts, as any client must),
//! so an answer that hands out uncounted tokens breaks Δ. Only a repeat of
//! the very answer it already spent (a retry of the same request) is not
//! spent again. Its tricks, mixed at random per seed:
//!
//! - **changed payload**: lease under id `(c, s)`, then send `(c, s)` again
//!   with another key, region or amount (or the same request: a retry).
//! - **restart**: begin again at seq 1 with the same client id, as a
//!   process that reuses its id across restarts would, on other keys and
//!   amounts; ids it used before collide.
//! - **session flood**: open sessions under thousands of fresh client ids
//!   (bounded below the coordinator's table of 16 384, so honest clients
//!   are not locked out). In plaintext every caller is the one anonymous
//!   principal, so a larger flood could fill the shared table and make the
//!   coordinator refuse new sessions (`SESSIONS_EXHAUSTED`) to everyone;
//!   with mTLS each identity is bounded to its own quota.
//! - **over-return** (with escrow nodes): acquire 1 token, give back
//!   1 000 000 or `u64::MAX` tokens of the current window, then keep
//!   acquiring.
//!
//! On a sharded fleet a request id belongs to the shard whose key it was
//! first sent with (sessions are per shard: ADR 0025), so an id reused
//! with a key of another shard is a new request there, expected to be
//! executed once like any new one; reused within a shard it is checked as
//! above.
//!
//! Every request and its answer is recorded ([`HostileProbe`],
//! [`OverReturn`]) for [`check_hostile`](crate::invariants::check_hostile).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use leasehold_client::transport::Dialer;
use leasehold_core::escrow::ReturnClaim;
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
use leasehold_core::shard::{Placement, ShardId};
use leasehold_proto::convert::coordinator as coordinator_wire;
use leasehold_proto::convert::escrow as escrow_wire;
use leasehold_proto::refusal::Reason;
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use leasehold_proto::v1::escrow_client::EscrowClient as EscrowRpc;
use leasehold_proto::{LEADER_ADDR_METADATA, REASON_METADATA};
use rand::distributions::{Distribution, WeightedIndex};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tonic::transport::Channel;
use tonic::{Code, Status};

use super::{sim_now_ms, FleetShape, SimDialer, ESCROW_PORT, KEY};
use crate::history::{
    Admission, Expected, HostileProbe, OverReturn, ProbeAnswer, Recorder, HOSTILE_CLIENT_BASE,
};

/// A second key under the same policy: the target of changed-key replays
/// and of restarted ids.
pub const SIDE_KEY: &str = "chaos/hostile-side";
/// The key the session flood leases from (so it does not eat the honest
/// clients' budget).
pub const FLOOD_KEY: &str = "chaos/hostile-flood";
/// Sessions one hostile client opens in its flood, at most.
pub const MAX_FLOOD_SESSIONS: u64 = 1_500;
/// Flood requests in flight at once per hostile client.
const FLOOD_CONCURRENCY: usize = 16;
/// What over-returns offer back.
const OVER_RETURN_AMOUNTS: [u64; 2] = [1_000_000, u64::MAX];

fn duration_ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Hostile host name.
pub fn hostile_host(index: usize) -> String {
    format!("h{index}")
}

/// Label of the changed-payload trick's requests.
pub const CHANGED_PAYLOAD: &str = "changed_payload";
/// Label of the restart trick's requests.
pub const RESTART: &str = "restart";
/// Label of the session flood's requests.
pub const FLOOD: &str = "flood";

/// One attempt's deadline and the whole call's budget.
const CALL_TIMEOUT: Duration = Duration::from_millis(1_000);
const CALL_BUDGET: Duration = Duration::from_secs(3);

/// How the coordinator answered a lease, as the hostile client sees it.
enum LeaseAnswer {
    Granted(pb::LeaseResponse),
    Refused { code: Code, reason: String },
    NoAnswer,
}

/// A bare coordinator caller: follows leader hints and moves on from
/// members that do not answer, retrying the *same* request (same id) until
/// it is answered, refused or the budget ends. Reads the refusal reason
/// from the response metadata.
struct RawCoordinator {
    members: Vec<String>,
    routing: Mutex<Routing>,
}

#[derive(Default)]
struct Routing {
    leader: Option<String>,
    next: usize,
    channels: HashMap<String, Channel>,
}

impl RawCoordinator {
    fn routing(&self) -> std::sync::MutexGuard<'_, Routing> {
        self.routing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn pick(&self) -> String {
        let routing = self.routing();
        if let Some(leader) = routing.leader.clone() {
            return leader;
        }
        let index = routing.next % self.members.len();
        self.members[index].clone()
    }

    fn give_up_on(&self, addr: &str) {
        let mut routing = self.routing();
        routing.channels.remove(addr);
        if routing.leader.as_deref() == Some(addr) {
            routing.leader = None;
        }
        routing.next = (routing.next + 1) % self.members.len();
    }

    async fn channel(&self, addr: &str) -> Option<Channel> {
        if let Some(channel) = self.routing().channels.get(addr) {
            return Some(channel.clone());
        }
        let channel = SimDialer.dial(addr).await.ok()?;
        self.routing()
            .channels
            .insert(addr.to_string(), channel.clone());
        Some(channel)
    }

    async fn lease(&self, request: pb::LeaseRequest) -> LeaseAnswer {
        let deadline = tokio::time::Instant::now() + CALL_BUDGET;
        let mut backoff_ms = 20;
        while tokio::time::Instant::now() < deadline {
            let addr = self.pick();
            let Some(channel) = self.channel(&addr).await else {
                self.give_up_on(&addr);
                continue;
            };
            let mut call = tonic::Request::new(request.clone());
            call.set_timeout(CALL_TIMEOUT);
            let status =
                match tokio::time::timeout(CALL_TIMEOUT, CoordinatorRpc::new(channel).lease(call))
                    .await
                {
                    Ok(Ok(response)) => {
                        self.routing().leader = Some(addr);
                        return LeaseAnswer::Granted(response.into_inner());
                    }
                    Ok(Err(status)) => status,
                    Err(_) => Status::deadline_exceeded("no answer in time"),
                };
            let hint = metadata(&status, LEADER_ADDR_METADATA);
            let reason = metadata(&status, REASON_METADATA);
            // Refusals about this member's role or health (and transport
            // failures, which carry no reason) are retried elsewhere; the
            // rest are about the request and are the answer.
            let about_the_member = matches!(
                Reason::from_name(&reason),
                None | Some(
                    Reason::NotLeader
                        | Reason::NoLeader
                        | Reason::NotInitialized
                        | Reason::NoQuorum
                        | Reason::Overloaded
                        | Reason::SteppingDown
                        | Reason::ShuttingDown
                        | Reason::RequestTimeout
                )
            );
            match status.code() {
                Code::FailedPrecondition if about_the_member && !hint.is_empty() => {
                    self.routing().leader = Some(hint);
                }
                Code::Unavailable
                | Code::DeadlineExceeded
                | Code::Cancelled
                | Code::Unknown
                | Code::Internal
                | Code::Aborted
                | Code::FailedPrecondition
                    if about_the_member =>
                {
                    self.give_up_on(&addr);
                }
                code => return LeaseAnswer::Refused { code, reason },
            }
            tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
            backoff_ms = (backoff_ms * 2).min(200);
        }
        LeaseAnswer::NoAnswer
    }
}

fn metadata(status: &Status, key: &str) -> String {
    status
        .metadata()
        .get(key)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

/// `granted@window_start`: the effect of an answer, as compared.
fn render_effect(response: &pb::LeaseResponse) -> String {
    format!("{}@{}", response.granted, response.window_start_ms)
}

/// A request id within the shard it was sent to: (shard, client id, seq).
type ScopedId = (ShardId, String, u64);

/// One lease a hostile client sends: id and payload.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LeaseCall {
    client_id: String,
    seq: u64,
    key: &'static str,
    region: String,
    tokens: u64,
}

impl LeaseCall {
    /// The id, scoped to the shard of the call's key.
    fn id(&self, placement: &Placement) -> ScopedId {
        (
            placement.shard_of(self.key),
            self.client_id.clone(),
            self.seq,
        )
    }

    fn payload(&self) -> String {
        format!("{} {} tokens {}", self.key, self.region, self.tokens)
    }

    fn request(&self) -> pb::LeaseRequest {
        let key = Key::new(self.key).expect("hostile keys are valid");
        let region = RegionId::new(self.region.clone()).expect("hostile regions are valid");
        let id = request_id(&self.client_id, self.seq);
        coordinator_wire::lease_request(&key, &region, self.tokens, Some(&id))
    }
}

/// What one hostile client knows and does.
struct Hostile {
    index: usize,
    recorder: Recorder,
    coordinator: RawCoordinator,
    escrow: Option<String>,
    /// Its client id; kept across its "restarts".
    client_id: String,
    next_seq: u64,
    /// The first answer to each id within its shard, with the payload it
    /// was for.
    answered: Mutex<HashMap<ScopedId, (String, String)>>,
    /// The fleet's placement (its keys' shards).
    placement: Placement,
    /// Fresh ids handed out (flood sessions, escrow holders).
    fresh: u64,
    rng: StdRng,
}

impl Hostile {
    fn client(&self) -> usize {
        HOSTILE_CLIENT_BASE + self.index
    }

    fn region(&self) -> String {
        format!("region-{}", hostile_host(self.index))
    }

    fn take_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    fn fresh_id(&mut self, what: &str) -> String {
        self.fresh += 1;
        format!("{}-{what}-{}", self.client_id, self.fresh)
    }

    /// Records tokens as spent, if their lifetime has not run out.
    fn spend(&self, key: &'static str, granted: u64, window: (u64, u64), deadline_ms: u64) {
        let now = sim_now_ms();
        // Hostile scenarios run on true clocks: the coordinator's window end
        // is real time too, and bounds a replayed answer's stale lifetime.
        if granted > 0 && now < deadline_ms.min(window.1) {
            self.recorder.admit(Admission {
                client: self.client(),
                key,
                cost: granted,
                window_start_ms: window.0,
                at_ms: now,
            });
        }
    }

    /// Sends one lease and records it; spends what it was told it got
    /// unless the answer repeats the one it already spent. Returns the
    /// answer's effect if it was answered.
    async fn lease(&self, trick: &'static str, call: LeaseCall) -> Option<String> {
        let expected = match self
            .answered
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&call.id(&self.placement))
        {
            None => Expected::Fresh,
            Some((payload, answer)) if *payload == call.payload() => {
                Expected::ReplayOf(answer.clone())
            }
            Some(_) => Expected::Refusal,
        };
        let sent_at = sim_now_ms();
        let (answer, effect) = match self.coordinator.lease(call.request()).await {
            LeaseAnswer::Granted(response) => {
                let effect = render_effect(&response);
                if expected != Expected::ReplayOf(effect.clone()) {
                    self.spend(
                        call.key,
                        response.granted,
                        (response.window_start_ms, response.window_end_ms),
                        sent_at.saturating_add(response.remaining_lifetime_ms),
                    );
                }
                self.answered
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .entry(call.id(&self.placement))
                    .or_insert_with(|| (call.payload(), effect.clone()));
                (ProbeAnswer::Answered(effect.clone()), Some(effect))
            }
            LeaseAnswer::Refused { code, reason } => (
                ProbeAnswer::Refused {
                    code: format!("{code:?}"),
                    reason,
                },
                None,
            ),
            LeaseAnswer::NoAnswer => (ProbeAnswer::NoAnswer, None),
        };
        self.recorder.hostile_probe(HostileProbe {
            client: self.client(),
            trick,
            request_id: format!("{}/{}", call.client_id, call.seq),
            request: call.payload(),
            expected,
            answer,
        });
        effect
    }

    /// Leases under a new seq, then sends the same id again with another
    /// key, region or amount (or unchanged: a retry).
    async fn changed_payload(&mut self) {
        let first = LeaseCall {
            client_id: self.client_id.clone(),
            seq: self.take_seq(),
            key: KEY,
            region: self.region(),
            tokens: self.rng.gen_range(1..=8),
        };
        if self.lease(CHANGED_PAYLOAD, first.clone()).await.is_none() {
            return;
        }
        for _ in 0..self.rng.gen_range(1..=3) {
            let mut again = first.clone();
            match self.rng.gen_range(0..4) {
                0 => again.key = SIDE_KEY,
                1 => again.tokens = first.tokens + self.rng.gen_range(1..=40),
                2 => again.region = format!("{}-elsewhere", self.region()),
                _ => {}
            }
            self.lease(CHANGED_PAYLOAD, again).await;
        }
    }

    /// Starts again from seq 1 under the same client id, on other keys and
    /// amounts, as a process that reuses its id after a restart would.
    async fn restart(&mut self) {
        self.next_seq = 1;
        for _ in 0..self.rng.gen_range(3..=10) {
            let call = LeaseCall {
                client_id: self.client_id.clone(),
                seq: self.take_seq(),
                key: if self.rng.gen_bool(0.5) {
                    SIDE_KEY
                } else {
                    KEY
                },
                region: self.region(),
                tokens: self.rng.gen_range(1..=30),
            };
            self.lease(RESTART, call).await;
        }
    }

    /// Opens `sessions` sessions, one fresh client id each.
    async fn flood(&mut self, sessions: u64) {
        let calls: Vec<LeaseCall> = (0..sessions)
            .map(|_| LeaseCall {
                client_id: self.fresh_id("flood"),
                seq: 1,
                key: FLOOD_KEY,
                region: self.region(),
                tokens: 1,
            })
            .collect();
        let this = &*self;
        futures::stream::iter(calls)
            .for_each_concurrent(FLOOD_CONCURRENCY, |call| async move {
                this.lease(FLOOD, call).await;
            })
            .await;
    }

    /// Acquires 1 token as a fresh holder, offers back far more than that,
    /// then keeps acquiring (and spending) as another holder.
    async fn over_return(&mut self, escrow: &str) {
        let Some(channel) = SimDialer.dial(escrow).await.ok() else {
            return;
        };
        let mut rpc = EscrowRpc::new(channel);
        let holder = self.fresh_id("holder");
        let Some((granted, window, deadline_ms)) = acquire(&mut rpc, &holder, 1, 1).await else {
            return;
        };
        if granted == 0 {
            return;
        }
        let offered = OVER_RETURN_AMOUNTS[self.rng.gen_range(0..OVER_RETURN_AMOUNTS.len())];
        let accepted = give_back(&mut rpc, over_return_request(&holder, window.0, offered)).await;
        self.recorder.over_return(OverReturn {
            client: self.client(),
            window_start_ms: window.0,
            held: granted,
            offered,
            accepted,
        });
        self.spend(KEY, granted.saturating_sub(accepted), window, deadline_ms);
        let spender = self.fresh_id("spender");
        for seq in 1..=self.rng.gen_range(5..=20) {
            let tokens = self.rng.gen_range(1..=16);
            if let Some((granted, window, deadline_ms)) =
                acquire(&mut rpc, &spender, seq, tokens).await
            {
                self.spend(KEY, granted, window, deadline_ms);
            }
            tokio::time::sleep(Duration::from_millis(self.rng.gen_range(2..10))).await;
        }
    }
}

/// One `Escrow.Acquire` of [`KEY`]: (granted, (window start, window end),
/// deadline), or nothing when it was not answered.
async fn acquire(
    rpc: &mut EscrowRpc<Channel>,
    holder: &str,
    seq: u64,
    tokens: u64,
) -> Option<(u64, (u64, u64), u64)> {
    let sent_at = sim_now_ms();
    let id = request_id(holder, seq);
    let request = escrow_wire::acquire_request(&key(), None, 1, tokens, Some(&id));
    let mut call = tonic::Request::new(request);
    call.set_timeout(CALL_TIMEOUT);
    let response = tokio::time::timeout(CALL_TIMEOUT, rpc.acquire(call))
        .await
        .ok()?
        .ok()?
        .into_inner();
    Some((
        response.granted,
        (response.window_start_ms, response.window_end_ms),
        sent_at.saturating_add(response.remaining_lifetime_ms),
    ))
}

/// The over-return: `tokens` of [`KEY`]'s window `window_start_ms`, as
/// `holder`'s next request.
fn over_return_request(holder: &str, window_start_ms: u64, tokens: u64) -> pb::ReturnRequest {
    let claim = ReturnClaim {
        tenant: None,
        window_start_ms,
        tokens,
    };
    // The holder's second request: its Acquire was seq 1.
    escrow_wire::return_request(&key(), &claim, &request_id(holder, 2))
}

/// [`KEY`], the key hostile escrow calls use.
fn key() -> Key {
    Key::new(KEY).expect("the simulation's key is valid")
}

/// The request id `(client_id, seq)`; hostile client ids are valid ones
/// (their tricks are in how they reuse them).
fn request_id(client_id: &str, seq: u64) -> RequestId {
    RequestId {
        client: ClientId::new(client_id).expect("hostile client ids are valid"),
        seq,
    }
}

/// One `Escrow.Return`: the tokens accepted (0 when refused or unanswered).
async fn give_back(rpc: &mut EscrowRpc<Channel>, request: pb::ReturnRequest) -> u64 {
    let mut call = tonic::Request::new(request);
    call.set_timeout(CALL_TIMEOUT);
    match tokio::time::timeout(CALL_TIMEOUT, rpc.r#return(call)).await {
        Ok(Ok(response)) => response.into_inner().accepted,
        _ => 0,
    }
}

/// Adds `shape.hostile_clients` hostile hosts to `sim`; they start once
/// `ready` is set and stop at `load_end_ms`.
pub fn spawn_hostile_clients(
    sim: &mut turmoil::Sim<'_>,
    shape: &FleetShape,
    members: &[String],
    seed: u64,
    recorder: &Recorder,
    ready: &Arc<AtomicBool>,
    load_end_ms: u64,
) {
    for index in 0..shape.hostile_clients {
        let (members, recorder, ready, escrow_nodes) = (
            members.to_vec(),
            recorder.clone(),
            ready.clone(),
            shape.escrow_nodes,
        );
        let hostile_seed = seed.wrapping_mul(131).wrapping_add(7 + index as u64);
        let placement = super::shards::spread_placement(shape);
        let load_start_ms = load_end_ms.saturating_sub(duration_ms(shape.load));
        sim.client(hostile_host(index), async move {
            let mut rng = StdRng::seed_from_u64(hostile_seed);
            // This seed's mix of tricks (weights: changed payload, restart,
            // over-return), and when the flood comes (from 1 s into the
            // load to 4 s before its end).
            let weights = [
                rng.gen_range(1..=6u32),
                rng.gen_range(1..=2u32),
                if escrow_nodes > 0 {
                    rng.gen_range(1..=4u32)
                } else {
                    0
                },
            ];
            let tricks = WeightedIndex::new(weights)?;
            let flood_sessions = rng.gen_range(MAX_FLOOD_SESSIONS / 2..=MAX_FLOOD_SESSIONS);
            let flood_at_ms = rng.gen_range(
                load_start_ms + 1_000
                    ..=load_end_ms.saturating_sub(4_000).max(load_start_ms + 1_000),
            );
            let mut hostile = Hostile {
                index,
                recorder,
                coordinator: RawCoordinator {
                    members,
                    routing: Mutex::new(Routing::default()),
                },
                escrow: (escrow_nodes > 0)
                    .then(|| format!("{}:{ESCROW_PORT}", super::escrow_host(index % escrow_nodes))),
                client_id: format!("{}-{hostile_seed:x}", hostile_host(index)),
                next_seq: 1,
                answered: Mutex::default(),
                placement,
                fresh: 0,
                rng,
            };
            while !ready.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let mut flooded = false;
            while sim_now_ms() < load_end_ms {
                if !flooded && sim_now_ms() >= flood_at_ms {
                    flooded = true;
                    hostile.flood(flood_sessions).await;
                    continue;
                }
                let trick = tricks.sample(&mut hostile.rng);
                match (trick, hostile.escrow.clone()) {
                    (2, Some(escrow)) => hostile.over_return(&escrow).await,
                    (1, _) => hostile.restart().await,
                    _ => hostile.changed_payload().await,
                }
                let pause = hostile.rng.gen_range(10..60);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            Ok(())
        });
    }
}
