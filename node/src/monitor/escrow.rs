//! What a watch shows on an escrow node: the keys it holds, as their actors
//! last published them ([`KeyView`]) — what the coordinator granted this
//! region in the window, its pool weight, and for `fair` keys each
//! tenant's use. Read without messaging the actors, so watching changes
//! nothing (not even an idle key's eviction).

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use leasehold_proto::v1 as pb;

use super::limits::{WatchTarget, MAX_COUNTED_KEYS, MAX_WATCHED_KEYS};
use super::watch::{Sample, Sampler, View};
use crate::escrow::actor::KeyView;
use crate::escrow::table::KeyTable;

/// Samples an escrow node's keys.
pub struct EscrowSampler {
    table: Arc<KeyTable>,
}

impl EscrowSampler {
    /// A sampler of the node whose keys `table` holds.
    pub fn new(table: Arc<KeyTable>) -> Self {
        Self { table }
    }
}

impl Sampler for EscrowSampler {
    fn sample<'a>(&'a self, target: &'a WatchTarget, _now_ms: u64) -> BoxFuture<'a, Sample> {
        let (views, matching) = self
            .table
            .key_views(target, MAX_WATCHED_KEYS, MAX_COUNTED_KEYS);
        let shared = &self.table.shared;
        let region = shared.config.region.to_string();
        let mut windows = Vec::new();
        let mut tenants = Vec::new();
        for (key, view) in views {
            let policy = shared.keys.policy_for(&key).map(|p| pb::Policy::from(&p));
            let (window, key_tenants) = window_of(&key, policy, view, &region);
            windows.push(window);
            tenants.extend(key_tenants);
        }
        let truncated = matches!(target, WatchTarget::Prefix(_)) && matching > windows.len();
        let sample = Sample {
            view: View {
                windows,
                tenants,
                matching_keys: matching as u64,
                truncated,
                region,
                ..View::default()
            },
            applied_index: 0,
        };
        futures::future::ready(sample).boxed()
    }
}

/// One key's row (and its tenants) from what its actor published.
fn window_of(
    key: &str,
    policy: Option<pb::Policy>,
    view: Option<KeyView>,
    region: &str,
) -> (pb::GetWindowResponse, Option<pb::KeyTenants>) {
    let Some(view) = view else {
        let limit = policy.as_ref().map_or(0, |p| p.limit);
        let window = pb::GetWindowResponse {
            key: key.to_string(),
            policy,
            limit,
            ..Default::default()
        };
        return (window, None);
    };
    let (window_start_ms, window_end_ms) = view
        .window
        .map_or((0, 0), |bounds| (bounds.start_ms, bounds.end_ms));
    let window = pb::GetWindowResponse {
        key: key.to_string(),
        policy,
        limit: view.limit,
        window_start_ms,
        window_end_ms,
        granted: view.granted,
        returned: 0,
        regions: vec![pb::RegionUsage {
            region: region.to_string(),
            granted: view.granted,
            returned: 0,
            pool_weight: view.region_weight,
        }],
        coordinator_now_ms: 0,
        would_deny_tokens: 0,
        would_deny_requests: 0,
    };
    let tenants = (view.tenant_count > 0).then(|| pb::KeyTenants {
        key: key.to_string(),
        tenant_count: view.tenant_count,
        tenants: view
            .tenants
            .into_iter()
            .map(|(tenant, weight, admitted)| pb::TenantUsage {
                tenant,
                weight,
                admitted,
            })
            .collect(),
    });
    (window, tenants)
}
