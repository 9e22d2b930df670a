//! What a watch shows on a coordinator member: its own applied state, read
//! under one lock with the index it was applied to, and who it sees lead.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use leasehold_core::coordinator::CoordinatorState;
use leasehold_core::ids::Key;
use leasehold_proto::convert::coordinator::window_response;
use leasehold_proto::v1 as pb;

use super::watch::{Sample, Sampler, View};
use super::{WatchTarget, MAX_COUNTED_KEYS, MAX_WATCHED_KEYS};
use crate::coordinator::context::NodeContext;
use crate::coordinator::leader::LeaderView;

/// Samples a member's applied state.
pub struct MemberSampler {
    node: Arc<NodeContext>,
}

impl MemberSampler {
    /// A sampler of `node`'s state.
    pub fn new(node: Arc<NodeContext>) -> Self {
        Self { node }
    }
}

impl Sampler for MemberSampler {
    fn sample<'a>(&'a self, target: &'a WatchTarget, now_ms: u64) -> BoxFuture<'a, Sample> {
        let node = &self.node;
        let (view, applied) = node
            .state
            .read_applied(|state, applied| (sample(state, target, now_ms), applied));
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
            applied_index: applied.map_or(0, |id| id.index),
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
