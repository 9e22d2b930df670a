//! What a watch shows on a coordinator member: its own applied state, read
//! under one lock with the index it was applied to, and who it sees lead.
//!
//! On a sharded cluster (ADR 0025) a key's window is read from the group
//! that serves the key on this member (shard 0's, or a shard it hosts: a
//! key of a shard it does not host shows no window), and a prefix's
//! windows from every group it hosts, merged in key order.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use leasehold_core::coordinator::CoordinatorState;
use leasehold_core::ids::Key;
use leasehold_proto::convert::coordinator::window_response;
use leasehold_proto::v1 as pb;

use super::limits::{WatchTarget, MAX_COUNTED_KEYS, MAX_WATCHED_KEYS};
use super::watch::{Sample, Sampler, View};
use crate::coordinator::context::NodeContext;
use crate::coordinator::leader::LeaderView;
use crate::coordinator::shard::routing::{HostedApis, ShardRouting};
use leasehold_core::shard::ShardId;

/// Samples a member's applied state.
pub struct MemberSampler {
    node: Arc<NodeContext>,
    /// The shards past 0 this member hosts, and which shard a key is on.
    shards: Option<(HostedApis, Arc<ShardRouting>)>,
}

impl MemberSampler {
    /// A sampler of `node`'s state.
    pub fn new(node: Arc<NodeContext>) -> Self {
        Self { node, shards: None }
    }

    /// The same sampler reading a key from the group that serves it here
    /// (see the module doc).
    pub fn with_shards(mut self, hosted: HostedApis, routing: Arc<ShardRouting>) -> Self {
        self.shards = Some((hosted, routing));
        self
    }

    /// The groups whose state the watch of `target` reads: for a key, the
    /// one that serves it here (shard 0's when this member does not host
    /// its shard: it shows no window); for a prefix, every group hosted.
    fn groups(&self, target: &WatchTarget) -> Vec<Arc<NodeContext>> {
        let Some((hosted, routing)) = &self.shards else {
            return vec![self.node.clone()];
        };
        match target {
            WatchTarget::Key(key) => {
                let (shard, _) = routing.shard_of(key.as_str());
                let group = (shard != ShardId(0))
                    .then(|| hosted.get(shard))
                    .flatten()
                    .map_or_else(|| self.node.clone(), |api| api.context().clone());
                vec![group]
            }
            WatchTarget::Prefix(_) => std::iter::once(self.node.clone())
                .chain(
                    hosted
                        .all()
                        .into_iter()
                        .map(|(_, api)| api.context().clone()),
                )
                .collect(),
        }
    }
}

impl Sampler for MemberSampler {
    fn sample<'a>(&'a self, target: &'a WatchTarget, now_ms: u64) -> BoxFuture<'a, Sample> {
        let groups = self.groups(target);
        let mut view = View::default();
        let mut applied_index = 0u64;
        for group in &groups {
            let (part, applied) = group
                .state
                .read_applied(|state, applied| (sample(state, target, now_ms), applied));
            view.windows.extend(part.windows);
            view.matching_keys += part.matching_keys;
            view.truncated |= part.truncated;
            // Each group's applied index only grows: so does their sum.
            applied_index += applied.map_or(0, |id| id.index);
        }
        if groups.len() > 1 {
            view.windows.sort_by(|a, b| a.key.cmp(&b.key));
            view.truncated |= view.windows.len() > MAX_WATCHED_KEYS;
            view.windows.truncate(MAX_WATCHED_KEYS);
        }
        let node = groups.first().unwrap_or(&self.node);
        let (is_leader, leader_id) = match LeaderView::of(&node.raft) {
            LeaderView::Me => (true, node.id),
            LeaderView::Other { id, .. } => (false, id),
            LeaderView::Unknown { .. } => (false, 0),
        };
        let sample = Sample {
            view: View {
                served_by: node.id,
                is_leader,
                leader_id,
                ..view
            },
            applied_index,
        };
        futures::future::ready(sample).boxed()
    }
}

/// The watched windows in `state` as of `wall_now` (the later of it and the
/// state clock), clocks zeroed so that views compare by content.
fn sample(state: &CoordinatorState, target: &WatchTarget, wall_now: u64) -> View {
    let now = state.now_ms().max(wall_now);
    let window_of = |key: &Key| {
        state.window_view(key, now).ok().map(|view| {
            let mut window = window_response(key, &view);
            window.coordinator_now_ms = 0;
            window
        })
    };
    let (windows, matching_keys, truncated) = match target {
        WatchTarget::Key(key) => {
            let window = window_of(key).unwrap_or_else(|| pb::GetWindowResponse {
                key: key.to_string(),
                ..Default::default()
            });
            (vec![window], 1, false)
        }
        WatchTarget::Prefix(prefix) => {
            let (keys, matching) =
                state.live_keys_with_prefix(prefix, now, MAX_WATCHED_KEYS, MAX_COUNTED_KEYS);
            let windows = keys.iter().filter_map(window_of).collect();
            (windows, matching as u64, matching > keys.len())
        }
    };
    View {
        windows,
        matching_keys,
        truncated,
        ..View::default()
    }
}
