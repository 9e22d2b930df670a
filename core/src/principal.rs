//! Who is calling: the identity a process proves with its mTLS certificate,
//! and what each kind of identity may do.
//!
//! A certificate names its holder with one SAN URI of the form
//! `spiffe://<trust domain>/<kind>/<name>`:
//!
//! | URI path | principal | may call |
//! |---|---|---|
//! | `member/<id>` | [`Principal::Member`] | the Raft peer service (while a member) |
//! | `operator/<name>` | [`Principal::Operator`] | Admin, GetWindow |
//! | `region/<region>` | [`Principal::Region`] | Lease, Reconcile, PoolGrant for its own region; GetWindow; ListPolicies |
//! | `service/<name>@<region>` | [`Principal::Service`] | the Escrow API of its region's escrow nodes |
//!
//! The trust domain is not interpreted: trust comes from the CA bundle a
//! process is configured with. [`Principal::Anonymous`] is the caller on a
//! listener running with `--insecure` (no client certificates): such a
//! listener authorises nothing by identity.
//!
//! Laws (property-tested below): `parse(p.to_uri()) == p` for every valid
//! principal; parsing never panics and rejects anything not of the forms
//! above.

use serde::{Deserialize, Serialize};

use crate::ids::{IdError, RegionId};

/// URI scheme of principal names in certificates.
pub const PRINCIPAL_URI_SCHEME: &str = "spiffe://";
/// Trust domain written by [`Principal::to_uri`].
pub const DEFAULT_TRUST_DOMAIN: &str = "leasehold";
/// Longest operator or service name, in bytes.
pub const MAX_PRINCIPAL_NAME_BYTES: usize = 64;

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Principal {
    /// No identity: the listener runs without client certificates (`--insecure`).
    Anonymous,
    /// A coordinator cluster member (Raft peer) with this node id.
    Member(u64),
    /// A human or automation operating the cluster (Admin API).
    Operator(String),
    /// The escrow nodes of one region (L2).
    Region(RegionId),
    /// A service (L1) of a region, calling that region's escrow nodes.
    Service {
        /// The service's name.
        name: String,
        /// The region it runs in.
        region: RegionId,
    },
}

/// Why a principal URI was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    /// Not `spiffe://<trust domain>/<kind>/<name>`.
    #[error("principal {uri:?} is not of the form spiffe://<trust domain>/<kind>/<name>")]
    Malformed {
        /// The URI as given.
        uri: String,
    },
    /// The kind is not member, operator, region or service.
    #[error("principal {uri:?}: unknown kind {kind:?} (member, operator, region, service)")]
    UnknownKind {
        /// The URI as given.
        uri: String,
        /// The kind found.
        kind: String,
    },
    /// The name part is invalid for its kind.
    #[error("principal {uri:?}: {reason}")]
    BadName {
        /// The URI as given.
        uri: String,
        /// What is wrong.
        reason: String,
    },
}

fn valid_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > MAX_PRINCIPAL_NAME_BYTES {
        return Err(format!(
            "the name is {} bytes, longer than {MAX_PRINCIPAL_NAME_BYTES}",
            name.len()
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(format!(
            "name {name:?} may hold only ASCII letters, digits, '-', '_' and '.'"
        ));
    }
    Ok(())
}

fn region(name: &str) -> Result<RegionId, String> {
    valid_name(name)?;
    RegionId::new(name).map_err(|e: IdError| e.to_string())
}

impl Principal {
    /// Parses a certificate SAN URI (see the module doc).
    pub fn parse_uri(uri: &str) -> Result<Principal, PrincipalError> {
        let malformed = || PrincipalError::Malformed {
            uri: uri.to_string(),
        };
        let rest = uri
            .strip_prefix(PRINCIPAL_URI_SCHEME)
            .ok_or_else(malformed)?;
        let (domain, path) = rest.split_once('/').ok_or_else(malformed)?;
        if domain.is_empty() {
            return Err(malformed());
        }
        let (kind, name) = path.split_once('/').ok_or_else(malformed)?;
        let bad = |reason: String| PrincipalError::BadName {
            uri: uri.to_string(),
            reason,
        };
        match kind {
            "member" => {
                let digits_only = !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit());
                let id = name
                    .parse::<u64>()
                    .ok()
                    .filter(|id| digits_only && *id > 0)
                    .ok_or_else(|| bad(format!("member id {name:?} is not a number ≥ 1")))?;
                Ok(Principal::Member(id))
            }
            "operator" => {
                valid_name(name).map_err(bad)?;
                Ok(Principal::Operator(name.to_string()))
            }
            "region" => Ok(Principal::Region(region(name).map_err(bad)?)),
            "service" => {
                let (service, in_region) = name.split_once('@').ok_or_else(|| {
                    bad(format!(
                        "service {name:?} is not of the form <name>@<region>"
                    ))
                })?;
                valid_name(service).map_err(bad)?;
                Ok(Principal::Service {
                    name: service.to_string(),
                    region: region(in_region).map_err(bad)?,
                })
            }
            other => Err(PrincipalError::UnknownKind {
                uri: uri.to_string(),
                kind: other.to_string(),
            }),
        }
    }

    /// The principal among a certificate's SAN URIs: the first that parses.
    pub fn from_uris<'a>(uris: impl IntoIterator<Item = &'a str>) -> Option<Principal> {
        uris.into_iter()
            .find_map(|uri| Principal::parse_uri(uri).ok())
    }

    /// The SAN URI that names this principal (trust domain `leasehold`);
    /// `None` for [`Principal::Anonymous`], which has no certificate.
    pub fn to_uri(&self) -> Option<String> {
        let path = match self {
            Principal::Anonymous => return None,
            Principal::Member(id) => format!("member/{id}"),
            Principal::Operator(name) => format!("operator/{name}"),
            Principal::Region(region) => format!("region/{region}"),
            Principal::Service { name, region } => format!("service/{name}@{region}"),
        };
        Some(format!(
            "{PRINCIPAL_URI_SCHEME}{DEFAULT_TRUST_DOMAIN}/{path}"
        ))
    }

    /// The region this principal belongs to, if any (regions and services).
    pub fn region(&self) -> Option<&RegionId> {
        match self {
            Principal::Region(region) | Principal::Service { region, .. } => Some(region),
            _ => None,
        }
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.to_uri() {
            Some(uri) => f.write_str(&uri),
            None => f.write_str("anonymous"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_each_kind() {
        assert_eq!(
            Principal::parse_uri("spiffe://leasehold/member/3").unwrap(),
            Principal::Member(3)
        );
        assert_eq!(
            Principal::parse_uri("spiffe://prod.example/operator/alice").unwrap(),
            Principal::Operator("alice".into())
        );
        assert_eq!(
            Principal::parse_uri("spiffe://leasehold/region/eu-west").unwrap(),
            Principal::Region(RegionId::new("eu-west").unwrap())
        );
        assert_eq!(
            Principal::parse_uri("spiffe://leasehold/service/checkout@eu").unwrap(),
            Principal::Service {
                name: "checkout".into(),
                region: RegionId::new("eu").unwrap()
            }
        );
    }

    #[test]
    fn rejects_what_is_not_a_principal() {
        for bad in [
            "",
            "https://leasehold/member/3",
            "spiffe://",
            "spiffe:///member/3",
            "spiffe://leasehold",
            "spiffe://leasehold/member",
            "spiffe://leasehold/member/0",
            "spiffe://leasehold/member/+3",
            "spiffe://leasehold/member/3x",
            "spiffe://leasehold/member/99999999999999999999999",
            "spiffe://leasehold/admin/root",
            "spiffe://leasehold/operator/",
            "spiffe://leasehold/operator/a b",
            "spiffe://leasehold/operator/a/b",
            "spiffe://leasehold/region/",
            "spiffe://leasehold/service/checkout",
            "spiffe://leasehold/service/@eu",
            "spiffe://leasehold/service/checkout@",
        ] {
            assert!(Principal::parse_uri(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn the_first_parsable_uri_names_the_holder() {
        let uris = ["https://example.com/x", "spiffe://leasehold/region/us"];
        assert_eq!(
            Principal::from_uris(uris),
            Some(Principal::Region(RegionId::new("us").unwrap()))
        );
        assert_eq!(Principal::from_uris(["urn:nothing"]), None);
        assert_eq!(Principal::Anonymous.to_uri(), None);
        assert_eq!(Principal::Anonymous.to_string(), "anonymous");
    }

    fn name() -> impl Strategy<Value = String> {
        "[A-Za-z0-9._-]{1,64}"
    }

    fn principal() -> impl Strategy<Value = Principal> {
        prop_oneof![
            (1u64..).prop_map(Principal::Member),
            name().prop_map(Principal::Operator),
            name().prop_map(|r| Principal::Region(RegionId::new(r).unwrap())),
            (name(), name()).prop_map(|(n, r)| Principal::Service {
                name: n,
                region: RegionId::new(r).unwrap()
            }),
        ]
    }

    proptest! {
        /// Every principal survives its own URI.
        #[test]
        fn uri_round_trips(p in principal()) {
            let uri = p.to_uri().unwrap();
            prop_assert_eq!(Principal::parse_uri(&uri).unwrap(), p);
        }

        /// Arbitrary text never panics the parser; what parses round-trips.
        #[test]
        fn arbitrary_text_parses_or_is_refused(s in ".{0,120}") {
            if let Ok(p) = Principal::parse_uri(&s) {
                prop_assert_eq!(Principal::parse_uri(&p.to_uri().unwrap()).unwrap(), p);
            }
        }

        /// Structured near-misses: any kind word and any name.
        #[test]
        fn near_misses_never_panic(kind in "[a-z]{0,10}", n in ".{0,80}") {
            let _ = Principal::parse_uri(&format!("spiffe://leasehold/{kind}/{n}"));
        }
    }
}
