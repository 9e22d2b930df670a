//! The table of key actors of an escrow node, bounded by `max_keys`: a
//! request for a new key when it is full is refused with
//! `RESOURCE_EXHAUSTED` (never an unbounded map, never over-admission);
//! idle actors hand their credits back and leave the table after
//! `idle_evict_ms`, making room.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use leasehold_proto::refusal::{refusal, Reason};
use tokio::sync::oneshot;
use tonic::Status;

use super::actor::{KeyHandle, KeyRequest, KeyView};
use super::shared::EscrowShared;

/// The key actors of one escrow node.
#[derive(Debug)]
pub struct KeyTable {
    /// What every actor shares.
    pub shared: Arc<EscrowShared>,
    actors: Mutex<HashMap<String, KeyHandle>>,
    /// This table, for the actors' eviction callback.
    me: Weak<KeyTable>,
}

impl KeyTable {
    /// An empty table over `shared`.
    pub fn new(shared: Arc<EscrowShared>) -> Arc<Self> {
        Arc::new_cyclic(|me| KeyTable {
            shared,
            actors: Mutex::new(HashMap::new()),
            me: me.clone(),
        })
    }

    /// Removes `key`'s actor from the table (it is stopping).
    pub fn forget(&self, key: &str) {
        if self
            .actors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key)
            .is_some()
        {
            self.shared.note_evicted();
        }
    }

    fn handle(self: &Arc<Self>, key: &str) -> Result<KeyHandle, Status> {
        let mut actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(handle) = actors.get(key) {
            return Ok(handle.clone());
        }
        if actors.len() >= self.shared.config.max_keys {
            return Err(refusal(Reason::KeysExhausted, format!(
                "this escrow node already tracks its maximum of {} keys; idle keys are released after {} ms",
                self.shared.config.max_keys, self.shared.config.idle_evict_ms
            )));
        }
        let handle = KeyHandle::spawn(key.to_string(), self.shared.clone(), {
            let table = self.me.clone();
            Arc::new(move |key: &str| {
                if let Some(table) = table.upgrade() {
                    table.forget(key);
                }
            })
        });
        actors.insert(key.to_string(), handle.clone());
        Ok(handle)
    }

    /// Sends `key`'s actor the request `make` builds and waits for its answer
    /// (starting the actor if needed).
    pub async fn ask<T>(
        self: &Arc<Self>,
        key: &str,
        make: impl Fn(oneshot::Sender<T>) -> KeyRequest,
    ) -> Result<T, Status> {
        // An actor that stopped between lookup and send is replaced once.
        for _ in 0..2 {
            let handle = self.handle(key)?;
            let (reply, answer) = oneshot::channel();
            if handle.send(make(reply)).await.is_ok() {
                if let Ok(value) = answer.await {
                    return Ok(value);
                }
            }
            self.forget(key);
        }
        Err(refusal(
            Reason::ShuttingDown,
            "the key's actor stopped; retry",
        ))
    }

    /// Stops every actor and waits, at most `deadline`, until each has
    /// handed its credits back (final reconciles, pool releases); returns
    /// how many were still running when it stopped waiting.
    pub async fn return_everything(&self, deadline: std::time::Duration) -> usize {
        let handles: Vec<KeyHandle> = self
            .actors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain()
            .map(|(_, h)| h)
            .collect();
        drop(handles);
        self.shared.wait_for_actors(deadline).await
    }

    /// The views of the keys a watch of `target` shows (see
    /// [`KeyView`]), in key order: the key itself (its view when this node
    /// holds it), or the first `max` held keys under a prefix; and how many
    /// held keys match, counted up to `count_up_to`. Reads what the actors
    /// published; sends them nothing.
    pub fn key_views(
        &self,
        target: &crate::monitor::WatchTarget,
        max: usize,
        count_up_to: usize,
    ) -> (Vec<(String, Option<KeyView>)>, usize) {
        use crate::monitor::WatchTarget;
        let actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        match target {
            WatchTarget::Key(key) => {
                let view = actors.get(key.as_str()).map(KeyHandle::view);
                (vec![(key.to_string(), view)], 1)
            }
            WatchTarget::Prefix(prefix) => {
                let mut keys: Vec<&String> = actors
                    .keys()
                    .filter(|key| key.starts_with(prefix.as_str()))
                    .collect();
                keys.sort();
                let matching = keys.len().min(count_up_to);
                let views = keys
                    .into_iter()
                    .take(max)
                    .map(|key| (key.clone(), actors.get(key).map(KeyHandle::view)))
                    .collect();
                (views, matching)
            }
        }
    }

    /// Keys with a live actor.
    pub fn active_keys(&self) -> u64 {
        self.actors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len() as u64
    }
}
