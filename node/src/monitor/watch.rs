//! `Monitor.Watch`, for any server that can sample what a target looks
//! like ([`Sampler`]: a coordinator member's applied state,
//! [`MemberSampler`](super::member::MemberSampler), or an escrow node's
//! keys, [`EscrowSampler`](super::escrow::EscrowSampler)). Each stream has
//! a task that samples every
//! [`SAMPLE_INTERVAL_MS`](super::cadence::SAMPLE_INTERVAL_MS) and
//! publishes the view when [`Cadence`] says so.
//!
//! Back-pressure: the task publishes into a `tokio::sync::watch` channel,
//! which holds one value; the response stream yields the newest value each
//! time the transport asks for the next message. A slow reader therefore
//! gets the newest view, never a queue, and each update's `skipped` counts
//! the views published since the previous one it received.
//!
//! On a member, a watch by a member certificate is served only while that
//! member is in the cluster's current membership ([`MemberGate`]): a
//! removed member's certificate, which nothing revokes, reads nothing.
//!
//! A stream ends when its reader goes away (the task notices the closed
//! channel and stops, giving its [`WatchSlot`] back) or when the server
//! begins to shut down (the stream's last message is `UNAVAILABLE`), so a
//! watch never holds a graceful shutdown open.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::Stream;
use leasehold_client::transport::WallClock;
use leasehold_proto::refusal::{refusal, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::monitor_server::Monitor;
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::{Request, Response, Status};

use super::cadence::{Cadence, SAMPLE_INTERVAL_MS};
use super::limits::{WatchSlot, WatchSlots, WatchTarget};
use crate::auth::caller;
use leasehold_core::principal::Principal;

/// The stream of updates one `Watch` call returns.
pub type UpdateStream = Pin<Box<dyn Stream<Item = Result<pb::WatchUpdate, Status>> + Send>>;

/// What one sample shows: compared with the last one sent to decide
/// whether it is news, so it leaves out the clocks (windows carry
/// `coordinator_now_ms = 0`; the loop stamps them when it sends).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct View {
    /// The watched windows, in key order.
    pub windows: Vec<pb::GetWindowResponse>,
    /// Per-tenant use of `fair` keys (escrow nodes).
    pub tenants: Vec<pb::KeyTenants>,
    /// Keys matching a prefix watch (counted up to the bound).
    pub matching_keys: u64,
    /// Whether more keys match than are shown.
    pub truncated: bool,
    /// The member that sampled (0 for an escrow node).
    pub served_by: u64,
    /// Whether it leads.
    pub is_leader: bool,
    /// The leader it follows (0: none known).
    pub leader_id: u64,
    /// The region of an escrow node (empty for a member).
    pub region: String,
}

/// A sample: the view and the applied index it was taken at (not part of
/// the comparison: it moves with every clock tick).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// What the target looks like.
    pub view: View,
    /// Last log index applied (0 for an escrow node).
    pub applied_index: u64,
}

/// Something a watch can sample.
pub trait Sampler: Send + Sync + 'static {
    /// One sample of `target` as of the wall clock `now_ms`.
    fn sample<'a>(&'a self, target: &'a WatchTarget, now_ms: u64) -> BoxFuture<'a, Sample>;
}

/// Whether member `id` is in the current membership (voters and
/// learners).
pub type MemberGate = Arc<dyn Fn(u64) -> bool + Send + Sync>;

/// Serves `leasehold.v1.Monitor` over a [`Sampler`].
pub struct MonitorApi<S> {
    sampler: Arc<S>,
    clock: Arc<dyn WallClock>,
    slots: Arc<WatchSlots>,
    closing: watch::Receiver<bool>,
    /// `Some` on a member: member callers must be in the membership.
    members: Option<MemberGate>,
}

impl<S: Sampler> MonitorApi<S> {
    /// The service; `closing` turns true when the server begins to shut
    /// down, which ends every stream.
    pub fn new(
        sampler: Arc<S>,
        clock: Arc<dyn WallClock>,
        slots: Arc<WatchSlots>,
        closing: watch::Receiver<bool>,
    ) -> Self {
        Self {
            sampler,
            clock,
            slots,
            closing,
            members: None,
        }
    }

    /// The same service serving member callers only while `members` says
    /// they are in the current membership.
    pub fn with_member_gate(mut self, members: MemberGate) -> Self {
        self.members = Some(members);
        self
    }
}

#[tonic::async_trait]
impl<S: Sampler> Monitor for MonitorApi<S> {
    type WatchStream = UpdateStream;

    async fn watch(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<UpdateStream>, Status> {
        let who = caller(&request);
        if let (Principal::Member(id), Some(members)) = (&who, &self.members) {
            if !members(*id) {
                return Err(refusal(
                    Reason::NotAMember,
                    format!("member {id} is not in the cluster's current membership"),
                ));
            }
        }
        let target = WatchTarget::from_wire(request.get_ref())?;
        let slot = self.slots.open(&who)?;
        let (publish, updates) = watch::channel(None);
        tokio::spawn(sample_until_done(
            self.sampler.clone(),
            self.clock.clone(),
            target,
            publish,
            self.closing.clone(),
            slot,
        ));
        Ok(Response::new(deliver(updates)))
    }
}

/// Samples every interval and publishes what [`Cadence`] lets through,
/// until the reader goes away or the server shuts down.
async fn sample_until_done<S: Sampler>(
    sampler: Arc<S>,
    clock: Arc<dyn WallClock>,
    target: WatchTarget,
    publish: watch::Sender<Option<pb::WatchUpdate>>,
    mut closing: watch::Receiver<bool>,
    _slot: WatchSlot,
) {
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_millis(SAMPLE_INTERVAL_MS));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut cadence = Cadence::new();
    let mut sequence = 0;
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = publish.closed() => return,
            _ = closing.wait_for(|closing| *closing) => return,
        }
        let wall_now = clock.now_ms();
        let Sample {
            view,
            applied_index,
        } = sampler.sample(&target, wall_now).await;
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        if !cadence.due(&view, elapsed_ms) {
            continue;
        }
        sequence += 1;
        let update = pb::WatchUpdate {
            windows: view
                .windows
                .iter()
                .cloned()
                .map(|mut window| {
                    window.coordinator_now_ms = window.coordinator_now_ms.max(wall_now);
                    window
                })
                .collect(),
            matching_keys: view.matching_keys,
            truncated: view.truncated,
            served_by: view.served_by,
            is_leader: view.is_leader,
            leader_id: view.leader_id,
            applied_index,
            sequence,
            skipped: 0,
            sampled_at_ms: wall_now,
            region: view.region.clone(),
            tenants: view.tenants.clone(),
        };
        if publish.send(Some(update)).is_err() {
            return;
        }
        cadence.sent(view, elapsed_ms);
    }
}

/// The response stream: the newest published update each time the
/// transport asks, with `skipped` set to the updates it never saw; ends
/// with `UNAVAILABLE` when the sampling task stops because the server
/// shuts down.
fn deliver(updates: watch::Receiver<Option<pb::WatchUpdate>>) -> UpdateStream {
    let state = (updates, 0u64, false);
    Box::pin(futures::stream::unfold(
        state,
        |(mut updates, last_sequence, ended)| async move {
            if ended {
                return None;
            }
            loop {
                if updates.changed().await.is_err() {
                    let stopped = refusal(
                        Reason::ShuttingDown,
                        "this server stopped serving the watch (shutting down); \
                         watch another member",
                    );
                    return Some((Err(stopped), (updates, last_sequence, true)));
                }
                let Some(mut update) = updates.borrow_and_update().clone() else {
                    continue;
                };
                update.skipped = update.sequence.saturating_sub(last_sequence + 1);
                let sequence = update.sequence;
                return Some((Ok(update), (updates, sequence, false)));
            }
        },
    ))
}
