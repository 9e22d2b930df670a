//! The leader hint: who a member that does not lead believes leads.
//!
//! A member that is not the leader refuses writes and linearizable reads
//! with `FAILED_PRECONDITION`, reason `NOT_LEADER`, and names the leader
//! twice, as `leasehold.proto` documents: in the refusal's `ErrorInfo`
//! metadata (`leader_id`, `leader_addr`) and in the response's trailing
//! metadata (`leasehold-leader-id`, `leasehold-leader-addr`). Either part
//! is absent while unknown. [`LeaderHint`] writes and reads both, so the
//! server, the client library and the tools agree on one format.

use tonic::metadata::{MetadataMap, MetadataValue};
use tonic::Status;

use crate::refusal::{self, refusal_with, Reason, LEADER_ADDR, LEADER_ID};
use crate::{LEADER_ADDR_METADATA, LEADER_ID_METADATA};

/// The leader a member names: its id and `host:port`, each when known.
/// An empty address is no address.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LeaderHint {
    /// The leader's member id.
    pub leader_id: Option<u64>,
    /// The leader's `host:port`, as the other members reach it.
    pub leader_addr: Option<String>,
}

impl LeaderHint {
    /// A hint naming `leader_id` at `leader_addr` (an empty address counts
    /// as unknown).
    pub fn new(leader_id: Option<u64>, leader_addr: Option<String>) -> Self {
        Self {
            leader_id,
            leader_addr: leader_addr.filter(|addr| !addr.is_empty()),
        }
    }

    /// Whether the hint names nothing (no leader known).
    pub fn is_empty(&self) -> bool {
        self.leader_id.is_none() && self.leader_addr.is_none()
    }

    /// The hint in `leasehold-leader-id` / `leasehold-leader-addr`
    /// metadata; a missing or unreadable entry is unknown.
    pub fn from_metadata(metadata: &MetadataMap) -> Self {
        let text = |name: &str| {
            metadata
                .get(name)
                .and_then(|value| value.to_str().ok())
                .map(str::to_string)
        };
        Self::new(
            text(LEADER_ID_METADATA).and_then(|id| id.parse().ok()),
            text(LEADER_ADDR_METADATA),
        )
    }

    /// The hint in a refusal's `ErrorInfo` metadata (`leader_id`,
    /// `leader_addr`; domain `leasehold.v1` only).
    pub fn from_error_info(status: &Status) -> Self {
        Self::new(
            refusal::detail(status, LEADER_ID).and_then(|id| id.parse().ok()),
            refusal::detail(status, LEADER_ADDR),
        )
    }

    /// The hint a status carries: each part from its metadata, else from
    /// its `ErrorInfo`. Empty for a status without a hint.
    pub fn from_status(status: &Status) -> Self {
        let metadata = Self::from_metadata(status.metadata());
        if metadata.leader_id.is_some() && metadata.leader_addr.is_some() {
            return metadata;
        }
        let details = Self::from_error_info(status);
        Self {
            leader_id: metadata.leader_id.or(details.leader_id),
            leader_addr: metadata.leader_addr.or(details.leader_addr),
        }
    }

    /// Writes the known parts as `leasehold-leader-id` /
    /// `leasehold-leader-addr`, replacing what was there; an address that
    /// cannot be a metadata value is left out.
    pub fn write_metadata(&self, metadata: &mut MetadataMap) {
        if let Some(id) = self.leader_id {
            if let Ok(value) = MetadataValue::try_from(id.to_string()) {
                metadata.insert(LEADER_ID_METADATA, value);
            }
        }
        if let Some(value) = self
            .leader_addr
            .as_deref()
            .and_then(|addr| MetadataValue::try_from(addr).ok())
        {
            metadata.insert(LEADER_ADDR_METADATA, value);
        }
    }

    /// Adds the hint to `status`'s metadata (see [`Self::write_metadata`]).
    pub fn attach(&self, status: &mut Status) {
        self.write_metadata(status.metadata_mut());
    }

    /// The `ErrorInfo.metadata` entries of the hint (`leader_id`,
    /// `leader_addr`), for [`refusal_with`].
    pub fn error_info(&self) -> Vec<(&'static str, String)> {
        let mut entries = Vec::with_capacity(2);
        if let Some(id) = self.leader_id {
            entries.push((LEADER_ID, id.to_string()));
        }
        if let Some(addr) = &self.leader_addr {
            entries.push((LEADER_ADDR, addr.clone()));
        }
        entries
    }

    /// The `NOT_LEADER` refusal carrying this hint both ways (`ErrorInfo`
    /// and metadata), with `message` for people.
    pub fn not_leader(&self, message: impl Into<String>) -> Status {
        let mut status = refusal_with(Reason::NotLeader, message, self.error_info());
        self.attach(&mut status);
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tonic::Code;

    /// Through the HTTP headers a server writes and a client reads.
    fn over_the_wire(status: &Status) -> Status {
        let mut headers = tonic::codegen::http::HeaderMap::new();
        status.add_header(&mut headers).expect("encodable");
        Status::from_header_map(&headers).expect("a status")
    }

    #[test]
    fn a_not_leader_refusal_names_the_leader_in_both_places() {
        let hint = LeaderHint::new(Some(2), Some("10.0.0.2:7100".into()));
        let status = over_the_wire(&hint.not_leader("not the leader"));
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(refusal::reason_of(&status), Some(Reason::NotLeader));
        assert_eq!(status.metadata().get(LEADER_ID_METADATA).unwrap(), "2");
        assert_eq!(
            status.metadata().get(LEADER_ADDR_METADATA).unwrap(),
            "10.0.0.2:7100"
        );
        assert_eq!(refusal::detail(&status, LEADER_ID).as_deref(), Some("2"));
        assert_eq!(
            refusal::detail(&status, LEADER_ADDR).as_deref(),
            Some("10.0.0.2:7100")
        );
        assert_eq!(LeaderHint::from_metadata(status.metadata()), hint);
        assert_eq!(LeaderHint::from_error_info(&status), hint);
        assert_eq!(LeaderHint::from_status(&status), hint);
        assert_eq!(status.message(), "not the leader");
    }

    #[test]
    fn an_unknown_part_is_left_out() {
        let id_only = LeaderHint::new(Some(3), None);
        let status = id_only.not_leader("x");
        assert!(status.metadata().get(LEADER_ADDR_METADATA).is_none());
        assert_eq!(refusal::detail(&status, LEADER_ADDR), None);
        assert_eq!(LeaderHint::from_status(&status), id_only);
        assert_eq!(LeaderHint::new(Some(3), Some(String::new())), id_only);

        let none = LeaderHint::default();
        assert!(none.is_empty());
        assert!(!id_only.is_empty());
        let status = none.not_leader("x");
        assert!(status.metadata().get(LEADER_ID_METADATA).is_none());
        assert!(LeaderHint::from_status(&status).is_empty());
        assert!(LeaderHint::from_status(&Status::failed_precondition("x")).is_empty());
    }

    #[test]
    fn metadata_alone_or_error_info_alone_is_read() {
        let hint = LeaderHint::new(Some(1), Some("n1:7100".into()));
        let mut plain = Status::failed_precondition("not the leader");
        hint.attach(&mut plain);
        assert_eq!(LeaderHint::from_status(&over_the_wire(&plain)), hint);

        let details_only = refusal_with(Reason::NotLeader, "not the leader", hint.error_info());
        assert!(LeaderHint::from_metadata(details_only.metadata()).is_empty());
        assert_eq!(LeaderHint::from_status(&details_only), hint);
    }

    #[test]
    fn an_unreadable_id_is_unknown() {
        let mut status = Status::failed_precondition("x");
        status
            .metadata_mut()
            .insert(LEADER_ID_METADATA, MetadataValue::from_static("two"));
        assert!(LeaderHint::from_status(&status).is_empty());
    }

    proptest! {
        /// Every hint survives the wire, read from either place.
        #[test]
        fn every_hint_survives_the_wire(
            leader_id in proptest::option::of(any::<u64>()),
            leader_addr in proptest::option::of("[a-z0-9.-]{1,20}:[0-9]{1,5}"),
        ) {
            let hint = LeaderHint::new(leader_id, leader_addr);
            let status = over_the_wire(&hint.not_leader("not the leader"));
            prop_assert_eq!(LeaderHint::from_metadata(status.metadata()), hint.clone());
            prop_assert_eq!(LeaderHint::from_error_info(&status), hint.clone());
            prop_assert_eq!(LeaderHint::from_status(&status), hint);
        }
    }
}
