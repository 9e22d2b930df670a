//! Validated identifiers. Bad input is a typed error, never a panic.

use serde::{Deserialize, Serialize};

/// Longest key accepted, in bytes (DESIGN §1).
pub const MAX_KEY_BYTES: usize = 256;
/// Longest region id accepted, in bytes (DESIGN §1).
pub const MAX_REGION_BYTES: usize = 64;
/// Longest tenant id accepted, in bytes.
pub const MAX_TENANT_BYTES: usize = 256;
/// Longest client id (of a request id) accepted, in bytes.
pub const MAX_CLIENT_ID_BYTES: usize = 128;

/// Why an identifier was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The identifier was empty.
    #[error("{what} must not be empty")]
    Empty {
        /// Which identifier.
        what: &'static str,
    },
    /// The identifier was longer than allowed.
    #[error("{what} is {len} bytes, longer than the maximum of {max}")]
    TooLong {
        /// Which identifier.
        what: &'static str,
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
}

fn check(what: &'static str, s: &str, max: usize) -> Result<(), IdError> {
    if s.is_empty() {
        return Err(IdError::Empty { what });
    }
    if s.len() > max {
        return Err(IdError::TooLong {
            what,
            len: s.len(),
            max,
        });
    }
    Ok(())
}

macro_rules! id_newtype {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:expr) => {
        $(#[$doc])*
        ///
        /// Shared, not copied: a clone is a reference count (a state's
        /// copy for a snapshot, a key in several tables of one state).
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub struct $name(std::sync::Arc<str>);

        impl $name {
            /// Validates and wraps the identifier (one allocation: the
            /// shared copy of `s`).
            pub fn new(s: impl AsRef<str>) -> Result<Self, IdError> {
                let s = s.as_ref();
                check($what, s, $max)?;
                Ok(Self(s.into()))
            }
            /// The identifier as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_newtype!(
    /// A budget's name: UTF-8, 1..=256 bytes.
    Key, "key", MAX_KEY_BYTES
);
id_newtype!(
    /// A stable region id: 1..=64 bytes.
    RegionId, "region", MAX_REGION_BYTES
);
id_newtype!(
    /// A tenant inside a region: 1..=256 bytes.
    TenantId, "tenant", MAX_TENANT_BYTES
);
id_newtype!(
    /// The id of one client session for exactly-once retries: 1..=128 bytes.
    ClientId, "client id", MAX_CLIENT_ID_BYTES
);

/// Identifies one logical request for exactly-once effects: a retry reuses it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RequestId {
    /// The calling client session.
    pub client: ClientId,
    /// Monotonic per client; a retry carries the same number.
    pub seq: u64,
}
