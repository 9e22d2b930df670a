//! The table of key actors of an escrow node, bounded by `max_keys`: a
//! request for a new key when it is full is refused with
//! `RESOURCE_EXHAUSTED` (never an unbounded map, never over-admission);
//! idle actors hand their credits back and leave the table after
//! `idle_evict_ms`, making room. A key counts against the caller identity
//! whose request created it, and one identity creates at most
//! `max_keys_per_identity` of them ([`crate::auth::IdentityQuota`]): one service that
//! floods the node with keys is refused alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use leasehold_core::principal::Principal;
use leasehold_proto::refusal::{refusal, Reason};
use tokio::sync::oneshot;
use tonic::Status;

use super::actor::{KeyHandle, KeyRequest, KeyView};
use super::shared::EscrowShared;
use crate::auth::IdentityQuota;

/// The key actors of one escrow node.
#[derive(Debug)]
pub struct KeyTable {
    /// What every actor shares.
    pub shared: Arc<EscrowShared>,
    actors: Mutex<Actors>,
    /// This table, for the actors' eviction callback.
    me: Weak<KeyTable>,
}

/// The running actors, each with the identity whose request created it.
#[derive(Debug, Default)]
struct Actors {
    handles: HashMap<String, (KeyHandle, Principal)>,
    created: IdentityQuota,
}

impl KeyTable {
    /// An empty table over `shared`.
    pub fn new(shared: Arc<EscrowShared>) -> Arc<Self> {
        Arc::new_cyclic(|me| KeyTable {
            shared,
            actors: Mutex::new(Actors::default()),
            me: me.clone(),
        })
    }

    /// Removes `key`'s actor from the table (it is stopping).
    pub fn forget(&self, key: &str) {
        let mut actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, creator)) = actors.handles.remove(key) {
            actors.created.give_back(&creator);
            drop(actors);
            self.shared.keys.note_evicted();
        }
    }

    fn handle(self: &Arc<Self>, key: &str, caller: &Principal) -> Result<KeyHandle, Status> {
        let mut actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((handle, _)) = actors.handles.get(key) {
            return Ok(handle.clone());
        }
        if actors.handles.len() >= self.shared.config.max_keys {
            return Err(refusal(Reason::KeysExhausted, format!(
                "this escrow node already tracks its maximum of {} keys; idle keys are released after {} ms",
                self.shared.config.max_keys, self.shared.config.idle_evict_ms
            )));
        }
        let max = self.shared.config.max_keys_per_identity;
        if !actors.created.take(caller, max) {
            self.shared.keys.note_identity_keys_refused();
            return Err(refusal(Reason::KeysExhausted, format!(
                "{caller} already created its maximum of {max} keys on this escrow node; idle keys are released after {} ms",
                self.shared.config.idle_evict_ms
            )));
        }
        let handle = KeyHandle::spawn(key.to_string(), self.shared.keys.clone(), {
            let table = self.me.clone();
            Arc::new(move |key: &str| {
                if let Some(table) = table.upgrade() {
                    table.forget(key);
                }
            })
        });
        actors
            .handles
            .insert(key.to_string(), (handle.clone(), caller.clone()));
        Ok(handle)
    }

    /// Sends `key`'s actor the request `make` builds and waits for its answer
    /// (starting the actor if needed, counted against `caller`).
    pub async fn ask<T>(
        self: &Arc<Self>,
        (key, caller): (&str, &Principal),
        make: impl Fn(oneshot::Sender<T>) -> KeyRequest,
    ) -> Result<T, Status> {
        // An actor that stopped between lookup and send is replaced once.
        for _ in 0..2 {
            let handle = self.handle(key, caller)?;
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
        let handles: Vec<KeyHandle> = {
            let mut actors = self.actors.lock().unwrap_or_else(PoisonError::into_inner);
            actors.created = IdentityQuota::default();
            actors.handles.drain().map(|(_, (h, _))| h).collect()
        };
        drop(handles);
        self.shared.keys.wait_for_actors(deadline).await
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
                let view = actors.handles.get(key.as_str()).map(|(h, _)| h.view());
                (vec![(key.to_string(), view)], 1)
            }
            WatchTarget::Prefix(prefix) => {
                let mut keys: Vec<&String> = actors
                    .handles
                    .keys()
                    .filter(|key| key.starts_with(prefix.as_str()))
                    .collect();
                keys.sort();
                let matching = keys.len().min(count_up_to);
                let views = keys
                    .into_iter()
                    .take(max)
                    .map(|key| (key.clone(), actors.handles.get(key).map(|(h, _)| h.view())))
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
            .handles
            .len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_identity_takes_at_most_its_keys_and_gets_them_back() {
        let mut quota = IdentityQuota::default();
        let flood = Principal::Operator("flood".into());
        let other = Principal::Operator("other".into());
        assert!(quota.take(&flood, 2));
        assert!(quota.take(&flood, 2));
        assert!(!quota.take(&flood, 2), "its third key is refused");
        assert!(quota.take(&other, 2), "another identity is not");
        for _ in 0..5 {
            assert!(
                quota.take(&Principal::Anonymous, 2),
                "anonymous is not counted"
            );
        }
        assert_eq!(quota.of(&Principal::Anonymous), 0);
        quota.give_back(&flood);
        assert_eq!(quota.of(&flood), 1);
        assert!(quota.take(&flood, 2), "a key gone is a key back");
        quota.give_back(&flood);
        quota.give_back(&flood);
        quota.give_back(&flood);
        assert_eq!(quota.of(&flood), 0);
        assert!(!quota.take(&other, 0));
        assert_eq!(
            quota.identities(),
            1,
            "nothing kept for identities without keys"
        );
    }
}
