//! Simulated clients: a control host that forms the cluster, sets the
//! policy and reads windows (linearizably) while the load runs; and client
//! hosts, one leased [`Limiter`] each, recording every admission with its
//! window label and every acknowledged grant.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::future::BoxFuture;
use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::transport::Dialer;
use leasehold_client::{
    AcquireRequest, CheckReply, CheckRequest, ClientError, CoordinatorSource, CreditSource, Grant,
    LeaseOptions, LeaseSizing, Limiter, LimiterConfig, Mode, ReturnRequest,
};
use leasehold_client::{EscrowSource, EscrowSourceOptions};
use leasehold_core::ids::{ClientId, RegionId};
use leasehold_proto::v1 as pb;
use rand::{Rng, SeedableRng};
use tonic::Code;

use super::{sim_now_ms, sim_retry_options, FleetShape, SimDialer, KEY};
use crate::history::{AckedGrant, Admission, RecordedReply, Recorder, WindowObservation};

/// A safety mechanism deliberately broken, to show the suite catches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Weakening {
    /// Nothing broken.
    None,
    /// Clients believe every grant lives one window longer than it does.
    CreditsOutliveWindow,
    /// Members' disks acknowledge flushes before the data is durable.
    AcknowledgeBeforeDurable,
}

/// Client host name.
pub fn client_host(index: usize) -> String {
    format!("c{index}")
}

/// Records acknowledged coordinator grants (and applies a client-side
/// weakening). Through an escrow node the grants seen are the node's
/// credits, not coordinator acknowledgements, so they are not recorded.
pub(crate) struct RecordingSource<S> {
    inner: S,
    record_acks: bool,
    recorder: Recorder,
    weakening: Weakening,
    window_ms: u64,
    /// The run's real time, epoch ms (simulated or wall clock).
    now_ms: fn() -> u64,
    /// Whether old ids are resent ([`RESEND_OLD_EVERY`]).
    resend_old_ids: bool,
    /// The latest requests answered, oldest first, with their first
    /// reply and when it came (at most [`OLD_IDS_KEPT`]).
    answered: Mutex<VecDeque<(AcquireRequest, String, u64)>>,
}

/// Every this many requests (by sequence number), the request is sent a
/// second time after its reply, as a duplicate delivery would; both replies
/// are recorded for the exactly-once check.
const DUPLICATE_EVERY: u64 = 4;

/// Every this many requests (by sequence number), the oldest id still kept
/// in [`RecordingSource::answered`] is sent again, as a client that timed
/// out long ago, or a proxy replaying, would: by then its key may have
/// moved to another shard, whose answer must be the first one.
const RESEND_OLD_EVERY: u64 = 5;

/// Answered ids kept for resending: fewer than a coordinator session keeps
/// (64), so every resent id must still be answered as it first was.
const OLD_IDS_KEPT: usize = 48;

/// Ids are resent only this long after their answer: well inside the
/// retention a session promises (60 s), past which clients must not retry.
const RESEND_WITHIN_MS: u64 = 30_000;

/// A reply as the exactly-once check compares it: tokens granted, the
/// window, and the grant's lifetime (which the coordinator's clock at
/// execution fixes, so a second execution of the id shows a different one
/// even where it grants as much in the same window).
fn render_grant(grant: &Grant) -> String {
    format!(
        "{}@{}~{}",
        grant.granted, grant.window_start_ms, grant.remaining_lifetime_ms
    )
}

impl<S: CreditSource> RecordingSource<S> {
    /// A source recording what `inner` answers; `record_acks`: whether
    /// its grants are coordinator acknowledgements (and its ids worth
    /// sending twice).
    pub(crate) fn new(
        inner: S,
        record_acks: bool,
        recorder: Recorder,
        weakening: Weakening,
        window_ms: u64,
        now_ms: fn() -> u64,
    ) -> Self {
        RecordingSource {
            inner,
            record_acks,
            recorder,
            weakening,
            window_ms,
            now_ms,
            resend_old_ids: false,
            answered: Mutex::new(VecDeque::new()),
        }
    }

    /// The same, also resending old ids ([`RESEND_OLD_EVERY`]) where
    /// `resend` holds.
    pub(crate) fn resending_old_ids(mut self, resend: bool) -> Self {
        self.resend_old_ids = resend;
        self
    }

    /// Sends `request` again and records both replies (a resend that fails
    /// says nothing about exactly-once: a network error, or an id the
    /// session no longer keeps).
    async fn send_again(&self, request: AcquireRequest, first: &str) {
        let request_id = format!("{}/{}", request.request_id.client, request.request_id.seq);
        if let Ok(again) = self.inner.acquire(request).await {
            self.recorder.reply(RecordedReply {
                request_id: request_id.clone(),
                reply: first.to_string(),
            });
            self.recorder.reply(RecordedReply {
                request_id,
                reply: render_grant(&again),
            });
        }
    }

    fn remember(&self, request: AcquireRequest, reply: String) {
        let mut answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        answered.push_back((request, reply, (self.now_ms)()));
        while answered.len() > OLD_IDS_KEPT {
            answered.pop_front();
        }
    }

    /// The oldest id kept that may still be resent, with its first reply.
    fn oldest_answered(&self) -> Option<(AcquireRequest, String)> {
        let now_ms = (self.now_ms)();
        let mut answered = self.answered.lock().unwrap_or_else(PoisonError::into_inner);
        while answered
            .front()
            .is_some_and(|(_, _, at_ms)| now_ms.saturating_sub(*at_ms) > RESEND_WITHIN_MS)
        {
            answered.pop_front();
        }
        answered
            .front()
            .map(|(request, reply, _)| (request.clone(), reply.clone()))
    }
}

impl<S: CreditSource> CreditSource for RecordingSource<S> {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        Box::pin(async move {
            let seq = request.request_id.seq;
            let copy = self.record_acks.then(|| request.clone());
            let mut grant = self.inner.acquire(request).await?;
            if let Some(request) = copy {
                let reply = render_grant(&grant);
                if seq.is_multiple_of(DUPLICATE_EVERY) {
                    self.send_again(request.clone(), &reply).await;
                }
                if self.resend_old_ids && seq.is_multiple_of(RESEND_OLD_EVERY) {
                    if let Some((old, first)) = self.oldest_answered() {
                        self.send_again(old, &first).await;
                    }
                }
                self.remember(request, reply);
            }
            if self.record_acks && grant.granted > 0 {
                self.recorder.acked(AckedGrant {
                    granted: grant.granted,
                    window_start_ms: grant.window_start_ms,
                    at_ms: (self.now_ms)(),
                });
            }
            if self.weakening == Weakening::CreditsOutliveWindow {
                grant.remaining_lifetime_ms += self.window_ms;
            }
            Ok(grant)
        })
    }

    fn check(&self, request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        self.inner.check(request)
    }

    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        self.inner.give_back(request)
    }
}

/// One linearizable read of [`KEY`]'s window, recorded with the time it was
/// sent (`now_ms`: the run's real time); a failed read records nothing.
pub(crate) async fn observe_window(
    client: &CoordinatorClient,
    recorder: &Recorder,
    now_ms: fn() -> u64,
) {
    let read_at_ms = now_ms();
    if let Ok(window) = client.get_window(KEY).await {
        recorder.observe(WindowObservation {
            window_start_ms: window.window_start_ms,
            read_at_ms,
            granted: window.granted,
        });
    }
}

/// How long into each window the clients of a sparse region ask.
const SPARSE_ACTIVE_MS: u64 = 100;

/// Adds the control host and the client hosts to `sim`; returns the flag
/// the control host sets once the cluster is formed and the policy set.
/// The honest clients ask nothing while `quiet` is set.
#[allow(clippy::too_many_arguments)]
pub fn spawn_clients(
    sim: &mut turmoil::Sim<'_>,
    shape: &FleetShape,
    members: &[String],
    seed: u64,
    recorder: &Recorder,
    leader: &Arc<AtomicU64>,
    setup_time: Duration,
    weakening: Weakening,
    quiet: &Arc<AtomicBool>,
) -> Arc<AtomicBool> {
    let ready = Arc::new(AtomicBool::new(false));
    let load_end_ms =
        super::SIM_EPOCH_MS + u64::try_from((setup_time + shape.load).as_millis()).unwrap_or(0);
    let dialer: Arc<dyn Dialer> = Arc::new(SimDialer);

    {
        let (members, dialer, recorder, leader, ready, shape) = (
            members.to_vec(),
            dialer.clone(),
            recorder.clone(),
            leader.clone(),
            ready.clone(),
            shape.clone(),
        );
        sim.client("ctl", async move {
            let client =
                CoordinatorClient::with_seed(members.clone(), dialer, sim_retry_options(), seed)?;
            let admin = client.admin();
            // Spare members (after the first `shape.members`) join later.
            let ids: Vec<(u64, String)> = members
                .iter()
                .take(usize::try_from(shape.members).unwrap_or(usize::MAX))
                .enumerate()
                .map(|(i, a)| (i as u64 + 1, a.clone()))
                .collect();
            loop {
                match admin.init(&ids).await {
                    Ok(()) => break,
                    Err(e) if e.code() == Code::AlreadyExists => break,
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
            if shape.rls {
                let unit = super::rls::unit_of(shape.window_ms)
                    .ok_or("an rls fleet's window must be a unit's")?;
                for policy in super::rls::domain(shape.limit, unit).policies() {
                    while admin.set_policy(pb::Policy::from(&policy)).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            let policy = if shape.fair {
                leasehold_core::policy::Policy::fair("chaos/", shape.limit, shape.window_ms)
            } else {
                leasehold_core::policy::Policy::counter("chaos/", shape.limit, shape.window_ms)
            };
            let policy = pb::Policy::from(match shape.fallback_tokens_per_region {
                0 => policy,
                share => policy.with_outage(leasehold_core::policy::OutagePolicy::Fallback {
                    tokens_per_region: share,
                }),
            });
            while admin.set_policy(policy.clone()).await.is_err() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let sharded = shape.shards > 1;
            if sharded {
                super::shards::spread(&admin, &client, &shape, load_end_ms).await?;
            }
            ready.store(true, Ordering::SeqCst);
            while sim_now_ms() < load_end_ms + 1_000 {
                let current = if sharded {
                    super::shards::key_shard_leader(&admin).await
                } else {
                    admin.status().await.ok().and_then(|s| s.current_leader)
                };
                if let Some(id) = current {
                    leader.store(id, Ordering::SeqCst);
                }
                observe_window(&client, &recorder, sim_now_ms).await;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            recorder.load_ended(load_end_ms);
            Ok(())
        });
    }

    for index in 0..shape.clients {
        let (members, dialer, recorder, ready, quiet, window_ms, escrow_nodes, rls) = (
            members.to_vec(),
            dialer.clone(),
            recorder.clone(),
            ready.clone(),
            quiet.clone(),
            shape.window_ms,
            shape.escrow_nodes,
            shape.rls,
        );
        let resend_old_ids = shape.resend_old_ids;
        // Region 0's clients of a sparse fleet ask only early in each window.
        let sparse = shape.sparse_region_0 && escrow_nodes > 0 && index % escrow_nodes == 0;
        // Region 0's clients of a light fleet pause between admissions.
        let light = shape.light_region_0 && escrow_nodes > 0 && index % escrow_nodes == 0;
        let client_seed = seed.wrapping_mul(31).wrapping_add(index as u64);
        sim.client(client_host(index), async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(client_seed);
            while !ready.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            if rls && escrow_nodes > 0 {
                let addr = format!(
                    "{}:{}",
                    super::escrow_host(index % escrow_nodes),
                    super::ESCROW_PORT
                );
                super::rls::ask_until(index, addr, window_ms, load_end_ms, recorder, rng)
                    .await
                    .map_err(|e| e.to_string())?;
                return Ok(());
            }
            let source: Arc<dyn CreditSource> = if escrow_nodes == 0 {
                let client = CoordinatorClient::with_seed(
                    members,
                    dialer,
                    sim_retry_options(),
                    client_seed,
                )?;
                let region = RegionId::new(format!("region-{index}"))?;
                let inner = CoordinatorSource::new(client, region);
                Arc::new(
                    RecordingSource::new(
                        inner,
                        true,
                        recorder.clone(),
                        weakening,
                        window_ms,
                        sim_now_ms,
                    )
                    .resending_old_ids(resend_old_ids),
                )
            } else {
                let addr = format!(
                    "{}:{}",
                    super::escrow_host(index % escrow_nodes),
                    super::ESCROW_PORT
                );
                let inner = EscrowSource::new(&addr, dialer, EscrowSourceOptions::default())?;
                Arc::new(RecordingSource::new(
                    inner,
                    false,
                    recorder.clone(),
                    weakening,
                    window_ms,
                    sim_now_ms,
                ))
            };
            let batch = rng.gen_range(4..=24);
            let mode = Mode::Leased(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(batch)));
            let mut config = LimiterConfig::new(
                mode,
                ClientId::new(format!("{}-{client_seed}", client_host(index)))?,
            );
            config.call_timeout = Duration::from_secs(3);
            // Seeded ids, unique per run: keep replays reproducible.
            config.fresh_incarnation = false;
            let limiter = Limiter::with_shared_source(source, config)?;
            while sim_now_ms() < load_end_ms {
                if quiet.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                let into_window = sim_now_ms() % window_ms;
                if sparse && into_window >= SPARSE_ACTIVE_MS.min(window_ms / 2) {
                    let jitter = rng.gen_range(0..20);
                    tokio::time::sleep(Duration::from_millis(window_ms - into_window + jitter))
                        .await;
                    continue;
                }
                match limiter.check_labelled(KEY, 1).await {
                    Ok(admission) => {
                        if let (true, Some(window_start_ms)) =
                            (admission.decision.allowed, admission.window_start_ms)
                        {
                            recorder.admit(Admission {
                                client: index,
                                key: KEY,
                                cost: 1,
                                window_start_ms,
                                at_ms: sim_now_ms(),
                            });
                            let pause = if light { 30..60 } else { 2..8 };
                            tokio::time::sleep(Duration::from_millis(rng.gen_range(pause))).await;
                        } else {
                            let wait = admission.decision.retry_after_ms.clamp(5, 50);
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            Ok(())
        });
    }
    ready
}
