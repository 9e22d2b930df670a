//! What a watch stream may watch ([`WatchTarget`], validated from the
//! wire) and how many streams a caller and a server may hold at once
//! ([`WatchSlots`]), with the bounds they enforce.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use leasehold_core::ids::{Key, MAX_KEY_BYTES};
use leasehold_core::principal::Principal;
use leasehold_proto::refusal::{invalid_field, refusal, Reason};
use leasehold_proto::v1 as pb;
use tonic::Status;

/// Most keys one prefix watch shows (the first ones in key order).
pub const MAX_WATCHED_KEYS: usize = 64;
/// A prefix watch counts its matching keys up to this many.
pub const MAX_COUNTED_KEYS: usize = 10_000;
/// Most concurrent watch streams of one caller identity.
pub const MAX_STREAMS_PER_CALLER: usize = 4;
/// Most concurrent watch streams of one server.
pub const MAX_STREAMS_PER_SERVER: usize = 64;

/// What one stream watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    /// One key.
    Key(Key),
    /// Every key starting with this prefix (may be empty: every key).
    Prefix(String),
}

impl WatchTarget {
    /// Validates a wire request: exactly one of key (1..=256 bytes) or
    /// prefix (0..=256 bytes).
    pub fn from_wire(request: &pb::WatchRequest) -> Result<Self, Status> {
        match &request.target {
            Some(pb::watch_request::Target::Key(key)) => Key::new(key.as_str())
                .map(WatchTarget::Key)
                .map_err(|e| invalid_field("key", format!("key: {e}"))),
            Some(pb::watch_request::Target::Prefix(prefix)) if prefix.len() > MAX_KEY_BYTES => {
                Err(invalid_field(
                    "prefix",
                    format!(
                        "prefix is {} bytes, longer than the maximum key length of {MAX_KEY_BYTES}",
                        prefix.len()
                    ),
                ))
            }
            Some(pb::watch_request::Target::Prefix(prefix)) => {
                Ok(WatchTarget::Prefix(prefix.clone()))
            }
            None => Err(invalid_field(
                "target",
                "watch needs a key or a prefix (an empty prefix watches every key)",
            )),
        }
    }
}

/// Counts the open watch streams per caller and in all; a stream holds a
/// [`WatchSlot`] for as long as it runs.
#[derive(Debug)]
pub struct WatchSlots {
    per_caller: usize,
    total: usize,
    open: Mutex<HashMap<String, usize>>,
}

impl Default for WatchSlots {
    fn default() -> Self {
        Self::new(MAX_STREAMS_PER_CALLER, MAX_STREAMS_PER_SERVER)
    }
}

impl WatchSlots {
    /// At most `per_caller` streams per caller identity and `total` in all.
    pub fn new(per_caller: usize, total: usize) -> Self {
        WatchSlots {
            per_caller,
            total,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A slot for one more stream of `caller`, or `RESOURCE_EXHAUSTED`
    /// (reason `WATCH_STREAMS_EXHAUSTED`) when the caller or the server
    /// holds as many as it may.
    pub fn open(self: &Arc<Self>, caller: &Principal) -> Result<WatchSlot, Status> {
        let name = caller.to_string();
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let all: usize = open.values().sum();
        let mine = open.get(&name).copied().unwrap_or(0);
        if mine >= self.per_caller || all >= self.total {
            return Err(refusal(
                Reason::WatchStreamsExhausted,
                format!(
                    "{caller} has {mine} watch streams open here ({all} in all); at most {} per caller \
                     and {} per server: close one first",
                    self.per_caller, self.total
                ),
            ));
        }
        *open.entry(name.clone()).or_insert(0) += 1;
        Ok(WatchSlot {
            slots: self.clone(),
            caller: name,
        })
    }

    /// Streams open now, in all.
    pub fn open_streams(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .sum()
    }
}

/// One open stream's place in [`WatchSlots`]; given back when dropped.
#[derive(Debug)]
pub struct WatchSlot {
    slots: Arc<WatchSlots>,
    caller: String,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self
            .slots
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = open.get_mut(&self.caller) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                open.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_proto::v1::watch_request::Target;

    fn request(target: Option<Target>) -> pb::WatchRequest {
        pb::WatchRequest { target }
    }

    #[test]
    fn targets_are_validated() {
        assert_eq!(
            WatchTarget::from_wire(&request(Some(Target::Key("k".into())))).unwrap(),
            WatchTarget::Key(Key::new("k").unwrap())
        );
        assert_eq!(
            WatchTarget::from_wire(&request(Some(Target::Prefix(String::new())))).unwrap(),
            WatchTarget::Prefix(String::new())
        );
        for bad in [
            None,
            Some(Target::Key(String::new())),
            Some(Target::Key("k".repeat(257))),
            Some(Target::Prefix("p".repeat(257))),
        ] {
            let error = WatchTarget::from_wire(&request(bad.clone())).unwrap_err();
            assert_eq!(error.code(), tonic::Code::InvalidArgument, "{bad:?}");
        }
    }

    #[test]
    fn slots_are_bounded_per_caller_and_in_all_and_come_back() {
        let slots = Arc::new(WatchSlots::new(2, 3));
        let alice = Principal::Operator("alice".into());
        let bob = Principal::Operator("bob".into());
        let a1 = slots.open(&alice).unwrap();
        let _a2 = slots.open(&alice).unwrap();
        let refused = slots.open(&alice).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            leasehold_proto::refusal::reason_of(&refused),
            Some(Reason::WatchStreamsExhausted)
        );
        let _b1 = slots.open(&bob).unwrap();
        assert!(slots.open(&bob).is_err(), "the server holds its 3");
        assert_eq!(slots.open_streams(), 3);
        drop(a1);
        assert_eq!(slots.open_streams(), 2);
        assert!(
            slots.open(&bob).is_ok(),
            "a closed stream gives its slot back"
        );
    }
}
