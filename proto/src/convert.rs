//! Conversions between the wire's messages and `leasehold-core`'s types.
//!
//! The wire crate depends on the core crate and not the other way round:
//! core is pure logic without gRPC, so the conversions (and their
//! validation) live here, next to the generated types they read.
//!
//! Reading a wire message may fail: [`InvalidField`] then names the field
//! at fault as `leasehold.proto` spells it (e.g. `policy.limit`), and turns
//! into the `INVALID_ARGUMENT` / `INVALID_FIELD` refusal servers answer.
//!
//! Policies are converted here; the Coordinator service's requests, answers
//! and shared pieces (request ids, tenant demands) in [`coordinator`]; the
//! Escrow service's requests in [`escrow`].

use std::fmt;

use leasehold_core::policy::{OutagePolicy, Policy, PolicyError, PolicyKind};
use tonic::Status;

use crate::refusal::invalid_field;
use crate::v1 as pb;

pub mod coordinator;
pub mod escrow;
#[cfg(test)]
mod strategies;

/// A field of a wire message that breaks a documented rule or limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidField {
    field: &'static str,
    message: String,
}

impl InvalidField {
    /// `field` (its name as in `leasehold.proto`) is invalid because of `message`.
    pub fn new(field: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            message: message.into(),
        }
    }

    /// The field at fault, e.g. `policy.limit`.
    pub fn field(&self) -> &'static str {
        self.field
    }

    /// Why, for people.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for InvalidField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InvalidField {}

impl From<InvalidField> for Status {
    /// The `INVALID_ARGUMENT` refusal with reason `INVALID_FIELD` and
    /// `ErrorInfo.metadata["field"]` naming the field.
    fn from(error: InvalidField) -> Self {
        invalid_field(error.field, error.message)
    }
}

/// The wire field a policy's validation error is about.
fn policy_field(error: &PolicyError) -> &'static str {
    match error {
        PolicyError::Limit(_) => "policy.limit",
        PolicyError::Window(_) => "policy.window_ms",
        PolicyError::PrefixTooLong(_) => "policy.prefix",
        PolicyError::FallbackShare { .. } => "policy.fallback_tokens_per_region",
    }
}

impl TryFrom<pb::Policy> for Policy {
    type Error = InvalidField;

    /// A validated core policy: an unspecified kind is a counter, an
    /// unspecified outage mode fails closed, and every limit of
    /// [`Policy::validate`] holds.
    fn try_from(raw: pb::Policy) -> Result<Self, Self::Error> {
        let kind = match pb::PolicyKind::try_from(raw.kind) {
            Ok(pb::PolicyKind::Unspecified | pb::PolicyKind::Counter) => PolicyKind::Counter,
            Ok(pb::PolicyKind::Fair) => PolicyKind::Fair,
            Err(_) => {
                return Err(InvalidField::new(
                    "policy.kind",
                    format!("unknown policy kind {}", raw.kind),
                ))
            }
        };
        let outage = match pb::OutageMode::try_from(raw.outage) {
            Ok(pb::OutageMode::Unspecified | pb::OutageMode::FailClosed) => {
                if raw.fallback_tokens_per_region != 0 {
                    return Err(InvalidField::new(
                        "policy.fallback_tokens_per_region",
                        "fallback_tokens_per_region is only valid with the fallback outage mode",
                    ));
                }
                OutagePolicy::FailClosed
            }
            Ok(pb::OutageMode::Fallback) => OutagePolicy::Fallback {
                tokens_per_region: raw.fallback_tokens_per_region,
            },
            Err(_) => {
                return Err(InvalidField::new(
                    "policy.outage",
                    format!("unknown outage mode {}", raw.outage),
                ))
            }
        };
        let policy = Policy {
            prefix: raw.prefix,
            limit: raw.limit,
            window_ms: raw.window_ms,
            kind,
            outage,
            shadow: raw.shadow,
        };
        policy
            .validate()
            .map_err(|e| InvalidField::new(policy_field(&e), e.to_string()))?;
        Ok(policy)
    }
}

impl TryFrom<&pb::Policy> for Policy {
    type Error = InvalidField;

    /// As the conversion of an owned wire policy.
    fn try_from(raw: &pb::Policy) -> Result<Self, Self::Error> {
        Policy::try_from(raw.clone())
    }
}

/// A message's required `policy`: a validated core policy, or the field
/// `policy` named when it is missing.
pub fn required_policy(raw: Option<pb::Policy>) -> Result<Policy, InvalidField> {
    let raw = raw.ok_or_else(|| InvalidField::new("policy", "policy is required"))?;
    Policy::try_from(raw)
}

impl From<&Policy> for pb::Policy {
    /// A core policy on the wire, with its kind and outage mode spelled
    /// out (never `UNSPECIFIED`).
    fn from(policy: &Policy) -> Self {
        let (outage, fallback) = match policy.outage {
            OutagePolicy::FailClosed => (pb::OutageMode::FailClosed, 0),
            OutagePolicy::Fallback { tokens_per_region } => {
                (pb::OutageMode::Fallback, tokens_per_region)
            }
        };
        let kind = match policy.kind {
            PolicyKind::Counter => pb::PolicyKind::Counter,
            PolicyKind::Fair => pb::PolicyKind::Fair,
        };
        pb::Policy {
            prefix: policy.prefix.clone(),
            limit: policy.limit,
            window_ms: policy.window_ms,
            kind: kind as i32,
            outage: outage as i32,
            fallback_tokens_per_region: fallback,
            shadow: policy.shadow,
        }
    }
}

impl From<Policy> for pb::Policy {
    /// As the conversion of a borrowed core policy.
    fn from(policy: Policy) -> Self {
        pb::Policy::from(&policy)
    }
}

/// A `ChangePlacementRequest` as the meta group's command: the version it
/// was made against and the change. Refused `INVALID_FIELD` without a
/// change, with a shard id of 0 where a new or other shard is meant, or
/// without replicas where a shard needs them.
pub fn placement_change(
    raw: pb::ChangePlacementRequest,
) -> Result<(u64, leasehold_core::coordinator::sharding::PlacementChange), InvalidField> {
    use leasehold_core::coordinator::sharding::PlacementChange;
    use leasehold_core::shard::ShardId;
    use pb::change_placement_request::Change;

    let not_zero = |field: &'static str, shard: u32| {
        if shard == 0 {
            Err(InvalidField::new(
                field,
                "shard 0 is the meta group: it is never added, removed or re-replicated",
            ))
        } else {
            Ok(ShardId(shard))
        }
    };
    let some_replicas = |field: &'static str, replicas: Vec<u64>| {
        if replicas.is_empty() || replicas.contains(&0) {
            Err(InvalidField::new(
                field,
                "a shard needs at least one replica, each a member id (>= 1)",
            ))
        } else {
            Ok(replicas)
        }
    };
    let change = match raw.change {
        None => return Err(InvalidField::new("change", "a change is required")),
        Some(Change::AddShard(add)) => PlacementChange::AddShard {
            shard: not_zero("add_shard.shard", add.shard)?,
            replicas: some_replicas("add_shard.replicas", add.replicas)?,
        },
        Some(Change::SetReplicas(set)) => PlacementChange::SetReplicas {
            shard: not_zero("set_replicas.shard", set.shard)?,
            replicas: some_replicas("set_replicas.replicas", set.replicas)?,
        },
        Some(Change::RemoveShard(remove)) => PlacementChange::RemoveShard {
            shard: not_zero("remove_shard.shard", remove.shard)?,
        },
        Some(Change::MoveSlots(moved)) => PlacementChange::MoveSlots {
            start: moved.start,
            end: moved.end,
            to: ShardId(moved.to),
        },
        Some(Change::Split(split)) => PlacementChange::Split {
            shard: ShardId(split.shard),
            into: not_zero("split.into", split.into)?,
            replicas: some_replicas("split.replicas", split.replicas)?,
        },
    };
    Ok((raw.expected_version, change))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::refusal::{self, Reason};
    use leasehold_core::policy::{MAX_LIMIT, MAX_WINDOW_MS};
    use proptest::prelude::*;
    use tonic::Code;

    /// Every field name a policy conversion may report.
    const POLICY_FIELDS: &[&str] = &[
        "policy.prefix",
        "policy.limit",
        "policy.window_ms",
        "policy.kind",
        "policy.outage",
        "policy.fallback_tokens_per_region",
    ];

    fn valid_policy() -> impl Strategy<Value = Policy> {
        (
            "\\PC{0,64}".prop_filter("at most 256 bytes", |p: &String| p.len() <= 256),
            prop_oneof![1u64..=1_000, 1u64..=MAX_LIMIT, Just(MAX_LIMIT)],
            prop_oneof![1u64..=60_000, 1u64..=MAX_WINDOW_MS, Just(MAX_WINDOW_MS)],
            any::<bool>(),
            proptest::option::of(any::<u64>()),
            any::<bool>(),
        )
            .prop_map(|(prefix, limit, window_ms, fair, share, shadow)| Policy {
                prefix,
                limit,
                window_ms,
                kind: if fair {
                    PolicyKind::Fair
                } else {
                    PolicyKind::Counter
                },
                outage: match share {
                    Some(share) => OutagePolicy::Fallback {
                        tokens_per_region: share % (limit + 1),
                    },
                    None => OutagePolicy::FailClosed,
                },
                shadow,
            })
    }

    fn any_wire_policy() -> impl Strategy<Value = pb::Policy> {
        let number = prop_oneof![
            Just(0u64),
            Just(1u64),
            Just(MAX_LIMIT),
            Just(MAX_LIMIT + 1),
            Just(MAX_WINDOW_MS),
            Just(MAX_WINDOW_MS + 1),
            Just(u64::MAX),
            any::<u64>(),
        ];
        let enumeration = prop_oneof![Just(0i32), Just(1), Just(2), Just(3), any::<i32>()];
        (
            prop_oneof![
                "\\PC{0,16}",
                Just("p".repeat(256)),
                Just("p".repeat(257)),
                Just("é".repeat(129)),
            ],
            number.clone(),
            number.clone(),
            enumeration.clone(),
            enumeration,
            number,
            any::<bool>(),
        )
            .prop_map(
                |(prefix, limit, window_ms, kind, outage, fallback_tokens_per_region, shadow)| {
                    pb::Policy {
                        prefix,
                        limit,
                        window_ms,
                        kind,
                        outage,
                        fallback_tokens_per_region,
                        shadow,
                    }
                },
            )
    }

    proptest! {
        /// core → wire → core is the identity for every valid policy.
        #[test]
        fn every_valid_policy_round_trips(policy in valid_policy()) {
            prop_assert_eq!(policy.validate(), Ok(()));
            let wire = pb::Policy::from(&policy);
            prop_assert_eq!(Policy::try_from(&wire), Ok(policy.clone()));
            prop_assert_eq!(Policy::try_from(wire), Ok(policy));
        }

        /// Any wire policy either converts to a valid policy that goes back
        /// to the same wire policy (up to UNSPECIFIED spelled out), or names
        /// one of the policy's fields; it never panics.
        #[test]
        fn any_wire_policy_converts_or_names_a_field(raw in any_wire_policy()) {
            match Policy::try_from(&raw) {
                Ok(policy) => {
                    prop_assert_eq!(policy.validate(), Ok(()));
                    let back = pb::Policy::from(&policy);
                    let spelled = pb::Policy {
                        kind: raw.kind.max(pb::PolicyKind::Counter as i32),
                        outage: raw.outage.max(pb::OutageMode::FailClosed as i32),
                        ..raw.clone()
                    };
                    prop_assert_eq!(back, spelled);
                }
                Err(error) => {
                    prop_assert!(POLICY_FIELDS.contains(&error.field()), "{:?}", error);
                    prop_assert!(!error.message().is_empty());
                    let status = Status::from(error.clone());
                    prop_assert_eq!(status.code(), Code::InvalidArgument);
                    prop_assert_eq!(refusal::reason_of(&status), Some(Reason::InvalidField));
                    let field = refusal::detail(&status, refusal::FIELD);
                    prop_assert_eq!(field.as_deref(), Some(error.field()));
                    prop_assert_eq!(status.message(), error.message());
                }
            }
        }
    }

    fn counter(prefix: &str, limit: u64, window_ms: u64) -> Policy {
        Policy {
            prefix: prefix.to_string(),
            limit,
            window_ms,
            kind: PolicyKind::Counter,
            outage: OutagePolicy::FailClosed,
            shadow: false,
        }
    }

    #[test]
    fn each_invalid_field_is_named_with_its_message() {
        let valid = pb::Policy::from(&counter("p/", 10, 1_000));
        let cases = [
            (
                pb::Policy {
                    limit: 0,
                    ..valid.clone()
                },
                "policy.limit",
                "limit must be between 1 and 281474976710656, got 0",
            ),
            (
                pb::Policy {
                    window_ms: 0,
                    ..valid.clone()
                },
                "policy.window_ms",
                "window_ms must be between 1 and 31622400000, got 0",
            ),
            (
                pb::Policy {
                    prefix: "p".repeat(257),
                    ..valid.clone()
                },
                "policy.prefix",
                "prefix is 257 bytes, longer than the maximum key length of 256",
            ),
            (
                pb::Policy {
                    kind: 99,
                    ..valid.clone()
                },
                "policy.kind",
                "unknown policy kind 99",
            ),
            (
                pb::Policy {
                    outage: 99,
                    ..valid.clone()
                },
                "policy.outage",
                "unknown outage mode 99",
            ),
            (
                pb::Policy {
                    fallback_tokens_per_region: 1,
                    ..valid.clone()
                },
                "policy.fallback_tokens_per_region",
                "fallback_tokens_per_region is only valid with the fallback outage mode",
            ),
            (
                pb::Policy {
                    outage: pb::OutageMode::Fallback as i32,
                    fallback_tokens_per_region: 11,
                    ..valid.clone()
                },
                "policy.fallback_tokens_per_region",
                "fallback tokens_per_region (11) must not exceed the limit (10)",
            ),
        ];
        for (raw, field, message) in cases {
            let error = Policy::try_from(&raw).unwrap_err();
            assert_eq!((error.field(), error.message()), (field, message));
            assert_eq!(error.to_string(), message);
        }
    }

    #[test]
    fn a_missing_required_policy_names_the_field() {
        let error = required_policy(None).unwrap_err();
        assert_eq!(
            (error.field(), error.message()),
            ("policy", "policy is required")
        );
        let policy = counter("p/", 5, 100);
        assert_eq!(required_policy(Some(pb::Policy::from(&policy))), Ok(policy));
        let zero = pb::Policy::from(&counter("p/", 5, 100));
        let error = required_policy(Some(pb::Policy { limit: 0, ..zero })).unwrap_err();
        assert_eq!(error.field(), "policy.limit");
    }

    #[test]
    fn unspecified_kind_and_outage_read_as_counter_and_fail_closed() {
        let raw = pb::Policy {
            prefix: "p/".into(),
            limit: 5,
            window_ms: 100,
            ..Default::default()
        };
        assert_eq!(Policy::try_from(raw), Ok(counter("p/", 5, 100)));
    }
}
