//! [`CoordinatorClient`]: what a client holds (its routing cache,
//! sessions, retry options, node name and retry jitter), how it is built,
//! and what it tells about itself.

use std::sync::{Arc, Mutex, MutexGuard};

use leasehold_proto::v1::RequestId;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::error::CoordinatorError;
use super::options::RetryOptions;
use super::routing::{Routing, Target};
use super::session::SessionPool;
use crate::transport::{normalize_endpoints, Dialer};

/// A leader-tracking client of the coordinator's public API. Cheap to clone;
/// clones share the leader cache, connections and request-id sequence.
#[derive(Clone)]
pub struct CoordinatorClient {
    pub(super) shared: Arc<Shared>,
}

/// What the clones of one client share.
pub(super) struct Shared {
    pub(super) dialer: Arc<dyn Dialer>,
    pub(super) options: RetryOptions,
    pub(super) sessions: SessionPool,
    /// The node name pool calls carry (`PoolGrantRequest.node`); empty:
    /// none, the process is the holder.
    node_name: Mutex<String>,
    routing: Mutex<Routing>,
    jitter: Mutex<StdRng>,
}

impl std::fmt::Debug for CoordinatorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoordinatorClient")
            .field("client_id", &self.shared.sessions.client_id())
            .field("options", &self.shared.options)
            .field("routing", &self.routing().endpoints())
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
                routing: Mutex::new(Routing::new(normalized)),
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

    /// A fresh request id of this client's own session, for callers that
    /// manage retries themselves: pass it to a `*_with_id` call and reuse it
    /// when retrying the same logical request. Keep fewer than 64 of these in
    /// flight (the coordinator remembers that many responses per session).
    pub fn next_request_id(&self) -> RequestId {
        self.shared.sessions.manual_request_id()
    }

    /// The leader address last seen, if any.
    pub fn leader(&self) -> Option<String> {
        self.routing().leader_of(Target::Leader)
    }

    /// The routing cache, locked.
    pub(super) fn routing(&self) -> MutexGuard<'_, Routing> {
        // A poisoned lock only means another caller panicked mid-update of a
        // cache; the cache is still usable.
        self.shared
            .routing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The pause before retry `retry` ([`RetryOptions`], this client's
    /// jitter).
    pub(super) fn backoff(&self, retry: u32) -> std::time::Duration {
        let mut jitter = self.shared.jitter.lock().unwrap_or_else(|p| p.into_inner());
        self.shared.options.backoff(retry, &mut *jitter)
    }
}
