//! Machine-readable refusals: every error status a Leasehold server sends
//! carries a `google.rpc.ErrorInfo` in its status details (the
//! `grpc-status-details-bin` trailer) with domain [`ERROR_DOMAIN`] and one
//! [`Reason`]; the same reason travels in the `leasehold-reason` metadata
//! for clients that cannot read status details. A reason always comes with
//! the same gRPC code ([`Reason::code`]), so a client may branch on either.
//!
//! The catalogue here and the table in `proto/leasehold.proto` are one
//! contract; a test checks that the proto names every reason with its code.

use std::collections::HashMap;
use std::fmt;

use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// The `ErrorInfo.domain` of every Leasehold refusal.
pub const ERROR_DOMAIN: &str = "leasehold.v1";

/// `ErrorInfo.metadata` key: the request field a refusal is about.
pub const FIELD: &str = "field";
/// `ErrorInfo.metadata` key: the key a refusal is about.
pub const KEY: &str = "key";
/// `ErrorInfo.metadata` key: the leader's member id (`NOT_LEADER`).
pub const LEADER_ID: &str = "leader_id";
/// `ErrorInfo.metadata` key: the leader's `host:port` (`NOT_LEADER`).
pub const LEADER_ADDR: &str = "leader_addr";
/// `ErrorInfo.metadata` key: the shard that serves the key (`NOT_OWNER`).
pub const SHARD: &str = "shard";
/// `ErrorInfo.metadata` key: the placement version the refusing member
/// knows (`NOT_OWNER`).
pub const PLACEMENT_VERSION: &str = "placement_version";

macro_rules! reasons {
    ($( $(#[doc = $doc:literal])* $variant:ident = $name:literal, $code:ident; )*) => {
        /// Why a request was refused. See the module documentation.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Reason {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Reason {
            /// Every reason, in catalogue order.
            pub const ALL: &'static [Reason] = &[$(Reason::$variant),*];

            /// The `ErrorInfo.reason` (and `leasehold-reason`) text.
            pub fn as_str(self) -> &'static str {
                match self { $(Reason::$variant => $name,)* }
            }

            /// The gRPC code this reason always travels with.
            pub fn code(self) -> Code {
                match self { $(Reason::$variant => Code::$code,)* }
            }

            /// The reason named `text`, if it is one of the catalogue's.
            pub fn from_name(text: &str) -> Option<Reason> {
                match text { $($name => Some(Reason::$variant),)* _ => None }
            }
        }
    };
}

reasons! {
    /// A field breaks a documented rule or limit (metadata `field`).
    InvalidField = "INVALID_FIELD", InvalidArgument;
    /// The body is not a valid protobuf message of the method's request type.
    MalformedRequest = "MALFORMED_REQUEST", InvalidArgument;
    /// No policy matches the key (metadata `key`).
    NoPolicy = "NO_POLICY", NotFound;
    /// This member does not lead; metadata `leader_id` / `leader_addr` name
    /// the leader when known. Send the request there.
    NotLeader = "NOT_LEADER", FailedPrecondition;
    /// The call does not fit the key's policy kind (PoolGrant on a counter
    /// key, Lease on a fair key).
    WrongKeyKind = "WRONG_KEY_KIND", FailedPrecondition;
    /// Another shard serves the key, or its slot is moving between shards:
    /// metadata `shard` names the owner and `placement_version` the
    /// placement this member knows, and `leader_id` / `leader_addr` that
    /// shard's leader when this member knows it. Read the placement
    /// (`GetPlacement`) if it is newer than yours and send the request to
    /// the owner's leader, under a new request id.
    NotOwner = "NOT_OWNER", FailedPrecondition;
    /// A placement change was refused (a stale version, a shard that does
    /// not exist, slots this build cannot move): the message says which.
    PlacementRefused = "PLACEMENT_REFUSED", FailedPrecondition;
    /// The request id is older than its session remembers, or its session
    /// expired: it may have been executed and never will be again.
    SessionExpired = "SESSION_EXPIRED", FailedPrecondition;
    /// A membership change the cluster refuses (an unknown learner, a
    /// change already in progress, an id that is not a member).
    MembershipRejected = "MEMBERSHIP_REJECTED", FailedPrecondition;
    /// StepDown on the only voter: nobody could take over.
    NoOtherVoter = "NO_OTHER_VOTER", FailedPrecondition;
    /// A Raft message whose term jumps absurdly far ahead of the
    /// receiver's, or towards the edge of its type.
    TermOutOfRange = "TERM_OUT_OF_RANGE", FailedPrecondition;
    /// The request id already named a different request.
    RequestIdReused = "REQUEST_ID_REUSED", AlreadyExists;
    /// Init on a member that is already initialised.
    AlreadyInitialized = "ALREADY_INITIALIZED", AlreadyExists;
    /// The caller holds as many exactly-once sessions as it may.
    SessionsExhausted = "SESSIONS_EXHAUSTED", ResourceExhausted;
    /// An escrow node's key tracks as many credit holders as it may.
    HoldersExhausted = "HOLDERS_EXHAUSTED", ResourceExhausted;
    /// An escrow node tracks as many keys as it may.
    KeysExhausted = "KEYS_EXHAUSTED", ResourceExhausted;
    /// The server serves as many watch streams as it may, for this caller
    /// or in all.
    WatchStreamsExhausted = "WATCH_STREAMS_EXHAUSTED", ResourceExhausted;
    /// The request message is larger than the server accepts.
    RequestTooLarge = "REQUEST_TOO_LARGE", ResourceExhausted;
    /// The member is not initialised and knows no leader (`cluster init`).
    NotInitialized = "NOT_INITIALIZED", Unavailable;
    /// No leader is known (election in progress, or no quorum).
    NoLeader = "NO_LEADER", Unavailable;
    /// A write or a leadership check was not confirmed by a quorum in time;
    /// retrying with the same request id is safe.
    NoQuorum = "NO_QUORUM", Unavailable;
    /// The leader's queue of pending writes is full; retry with backoff.
    Overloaded = "OVERLOADED", Unavailable;
    /// The leader is handing leadership off, or a step-down is already in
    /// progress; retry shortly.
    SteppingDown = "STEPPING_DOWN", Unavailable;
    /// The server is stopping (Raft stopped, a watch ended, an actor left).
    ShuttingDown = "SHUTTING_DOWN", Unavailable;
    /// A member that has a log is still loading it: it cannot yet tell
    /// who may send it Raft messages. Retry shortly.
    Starting = "STARTING", Unavailable;
    /// (Raft) The member hosts no replica of the shard a peer message is
    /// for: not yet (the placement that gives it one is still reaching
    /// it) or no longer. The sender retries.
    ShardNotHosted = "SHARD_NOT_HOSTED", Unavailable;
    /// The key's slot is changing shards: its new owner is acquiring its
    /// windows, or this member's placement is behind the group's. Retry
    /// shortly (under the same request id).
    SlotMoving = "SLOT_MOVING", Unavailable;
    /// An escrow node could not reach the coordinator for a call that
    /// needs it and the key's outage policy does not apply.
    CoordinatorUnavailable = "COORDINATOR_UNAVAILABLE", Unavailable;
    /// The connection proved no identity on a listener that requires one.
    Unauthenticated = "UNAUTHENTICATED", Unauthenticated;
    /// The caller's identity may not call this method (see docs/security.md).
    NotPermitted = "NOT_PERMITTED", PermissionDenied;
    /// A region identity acting for another region.
    OtherRegion = "OTHER_REGION", PermissionDenied;
    /// A Raft message from a sender that is not a current member, or that
    /// claims another member's id.
    NotAMember = "NOT_A_MEMBER", PermissionDenied;
    /// A Raft message from a member id a membership change removed from
    /// the cluster: never accepted again.
    MemberRetired = "MEMBER_RETIRED", PermissionDenied;
    /// The method does not exist on this server (e.g. a coordinator call
    /// sent to an escrow node's port).
    UnknownMethod = "UNKNOWN_METHOD", Unimplemented;
    /// The request did not finish within the server's request timeout.
    RequestTimeout = "REQUEST_TIMEOUT", DeadlineExceeded;
    /// A fault inside the server; report it.
    Internal = "INTERNAL", Internal;
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A refusal with `reason`'s code, `message` for people, and an
/// `ErrorInfo` (plus `leasehold-reason` metadata) for programs.
pub fn refusal(reason: Reason, message: impl Into<String>) -> Status {
    refusal_with(reason, message, [])
}

/// [`refusal`] with `ErrorInfo.metadata` entries (e.g. [`FIELD`], [`KEY`]).
pub fn refusal_with<'a>(
    reason: Reason,
    message: impl Into<String>,
    metadata: impl IntoIterator<Item = (&'a str, String)>,
) -> Status {
    let metadata: HashMap<String, String> = metadata
        .into_iter()
        .map(|(name, value)| (name.to_string(), value))
        .collect();
    let mut status = Status::with_error_details(
        reason.code(),
        message,
        ErrorDetails::with_error_info(reason.as_str(), ERROR_DOMAIN, metadata),
    );
    status.metadata_mut().insert(
        crate::REASON_METADATA,
        MetadataValue::from_static(reason.as_str()),
    );
    status
}

/// An `INVALID_FIELD` refusal about `field`.
pub fn invalid_field(field: &str, message: impl Into<String>) -> Status {
    refusal_with(Reason::InvalidField, message, [(FIELD, field.to_string())])
}

/// The Leasehold reason a status carries: its `ErrorInfo` of domain
/// [`ERROR_DOMAIN`], else its `leasehold-reason` metadata. `None` for a
/// status from elsewhere (a proxy, the transport) or a reason this build
/// does not know.
pub fn reason_of(status: &Status) -> Option<Reason> {
    if let Some(info) = status.get_details_error_info() {
        if info.domain == ERROR_DOMAIN {
            if let Some(reason) = Reason::from_name(&info.reason) {
                return Some(reason);
            }
        }
    }
    status
        .metadata()
        .get(crate::REASON_METADATA)
        .and_then(|value| value.to_str().ok())
        .and_then(Reason::from_name)
}

/// The `ErrorInfo.metadata` entry `name` of a Leasehold refusal.
pub fn detail(status: &Status, name: &str) -> Option<String> {
    let info = status.get_details_error_info()?;
    (info.domain == ERROR_DOMAIN)
        .then(|| info.metadata.get(name).cloned())
        .flatten()
}

/// The refusal of one item of a batch (`ItemRefusal`) carrying what
/// `status` carries: code, reason, message and `ErrorInfo` metadata.
pub fn item_refusal(status: &Status) -> crate::v1::ItemRefusal {
    let info = status
        .get_details_error_info()
        .filter(|info| info.domain == ERROR_DOMAIN);
    crate::v1::ItemRefusal {
        code: status.code() as i32,
        reason: reason_of(status).map_or_else(String::new, |r| r.as_str().to_string()),
        message: status.message().to_string(),
        metadata: info.map(|info| info.metadata).unwrap_or_default(),
    }
}

/// The status an `ItemRefusal` stands for: with its `ErrorInfo` when the
/// reason is one this build knows, else a plain status with its code.
pub fn status_of_item(item: &crate::v1::ItemRefusal) -> Status {
    match Reason::from_name(&item.reason) {
        Some(reason) => refusal_with(
            reason,
            item.message.clone(),
            item.metadata
                .iter()
                .map(|(name, value)| (name.as_str(), value.clone())),
        ),
        None => Status::new(Code::from_i32(item.code), item.message.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_refusal_carries_the_status_both_ways() {
        for reason in Reason::ALL {
            let status = refusal_with(*reason, "why", [(KEY, "k".to_string())]);
            let item = item_refusal(&status);
            assert_eq!(item.code, reason.code() as i32);
            assert_eq!(item.reason, reason.as_str());
            let back = status_of_item(&item);
            assert_eq!(back.code(), reason.code());
            assert_eq!(reason_of(&back), Some(*reason));
            assert_eq!(detail(&back, KEY).as_deref(), Some("k"));
            assert_eq!(back.message(), "why");
        }
        let foreign = item_refusal(&Status::unavailable("proxy"));
        assert_eq!(foreign.reason, "");
        assert_eq!(status_of_item(&foreign).code(), Code::Unavailable);
    }

    #[test]
    fn names_are_unique_and_read_back() {
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
        for reason in Reason::ALL {
            assert_eq!(Reason::from_name(reason.as_str()), Some(*reason));
            assert_ne!(reason.code(), Code::Ok);
        }
        assert_eq!(Reason::from_name("NOT_A_REASON"), None);
    }

    #[test]
    fn every_reason_survives_the_wire() {
        for reason in Reason::ALL {
            let status = refusal_with(*reason, "why", [(KEY, "k/1".to_string())]);
            // Through the HTTP headers a server writes and a client reads.
            let mut headers = tonic::codegen::http::HeaderMap::new();
            status.add_header(&mut headers).expect("encodable");
            let read = Status::from_header_map(&headers).expect("a status");
            assert_eq!(read.code(), reason.code());
            assert_eq!(reason_of(&read), Some(*reason));
            assert_eq!(detail(&read, KEY).as_deref(), Some("k/1"));
            let info = read.get_details_error_info().expect("ErrorInfo");
            assert_eq!(info.domain, ERROR_DOMAIN);
            assert_eq!(
                read.metadata()
                    .get(crate::REASON_METADATA)
                    .and_then(|v| v.to_str().ok()),
                Some(reason.as_str())
            );
        }
    }

    #[test]
    fn statuses_from_elsewhere_have_no_reason() {
        assert_eq!(reason_of(&Status::unavailable("proxy says no")), None);
        let foreign = Status::with_error_details(
            Code::Unavailable,
            "x",
            ErrorDetails::with_error_info("NO_LEADER", "example.com", HashMap::new()),
        );
        assert_eq!(reason_of(&foreign), None);
        assert_eq!(detail(&foreign, KEY), None);
    }

    /// The proto is the contract for other languages: its table of reasons
    /// lists every reason with its code, and nothing else.
    #[test]
    fn the_proto_lists_every_reason_with_its_code() {
        let proto = include_str!("../proto/leasehold.proto");
        let table: Vec<(String, String)> = proto
            .lines()
            .filter_map(|line| line.trim().strip_prefix("//   "))
            .filter_map(|row| {
                let mut cells = row.split_whitespace();
                let name = cells.next()?;
                let code = cells.next()?;
                (name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    && code.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    && Reason::from_name(name).is_some())
                .then(|| (name.to_string(), code.to_string()))
            })
            .collect();
        for reason in Reason::ALL {
            let code = format!("{:?}", reason.code());
            let screaming = screaming_snake(&code);
            assert!(
                table
                    .iter()
                    .any(|(name, c)| name == reason.as_str() && *c == screaming),
                "proto/leasehold.proto lists {} with code {screaming}",
                reason.as_str()
            );
        }
        assert_eq!(
            table.len(),
            Reason::ALL.len(),
            "one row per reason: {table:?}"
        );
    }

    fn screaming_snake(camel: &str) -> String {
        let mut out = String::new();
        for (i, c) in camel.chars().enumerate() {
            if c.is_ascii_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_uppercase());
        }
        out
    }
}
