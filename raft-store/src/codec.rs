//! Versioned on-disk encoding: every persisted value is a postcard varint
//! format version followed by the postcard body of that version.
//!
//! Law: `decode(encode(v)) == v` for every persisted type, and bytes whose
//! version this build does not know decode to
//! [`CodecError::UnknownVersion`], never to a panic or a silent default.
//! A future format bumps [`Persisted::FORMAT_VERSION`] and teaches
//! [`Persisted::decode_version`] to read (and migrate) the older versions.

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Failure to encode or decode a persisted value.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The stored bytes carry a format version this build cannot read.
    #[error("{kind}: unknown format version {found} (this build reads up to {supported})")]
    UnknownVersion {
        /// What was being decoded.
        kind: &'static str,
        /// The version found in the bytes.
        found: u32,
        /// The newest version this build understands.
        supported: u32,
    },
    /// The bytes are not a valid encoding of the value.
    #[error("{kind}: malformed bytes: {source}")]
    Malformed {
        /// What was being decoded.
        kind: &'static str,
        /// The postcard error.
        #[source]
        source: postcard::Error,
    },
    /// The value could not be encoded.
    #[error("{kind}: cannot encode: {source}")]
    Encode {
        /// What was being encoded.
        kind: &'static str,
        /// The postcard error.
        #[source]
        source: postcard::Error,
    },
}

/// A value stored with a leading format version.
pub trait Persisted: Serialize + DeserializeOwned {
    /// Human-readable name used in errors.
    const KIND: &'static str;
    /// The version this build writes.
    const FORMAT_VERSION: u32;

    /// Decodes a body written with format `version`. The default reads only
    /// the current version; types that changed override it to migrate.
    fn decode_version(version: u32, body: &[u8]) -> Result<Self, CodecError> {
        if version != Self::FORMAT_VERSION {
            return Err(CodecError::UnknownVersion {
                kind: Self::KIND,
                found: version,
                supported: Self::FORMAT_VERSION,
            });
        }
        postcard::from_bytes(body).map_err(|source| CodecError::Malformed {
            kind: Self::KIND,
            source,
        })
    }
}

/// Encodes `value` as `version ‖ postcard(value)`.
pub fn encode<T: Persisted>(value: &T) -> Result<Vec<u8>, CodecError> {
    let encode_error = |source| CodecError::Encode {
        kind: T::KIND,
        source,
    };
    let mut bytes = postcard::to_stdvec(&T::FORMAT_VERSION).map_err(encode_error)?;
    let body = postcard::to_stdvec(value).map_err(encode_error)?;
    bytes.extend_from_slice(&body);
    Ok(bytes)
}

/// Decodes bytes written by [`encode`] (of this or an older known version).
pub fn decode<T: Persisted>(bytes: &[u8]) -> Result<T, CodecError> {
    let (version, body) =
        postcard::take_from_bytes::<u32>(bytes).map_err(|source| CodecError::Malformed {
            kind: T::KIND,
            source,
        })?;
    T::decode_version(version, body)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        a: u64,
        b: String,
    }

    impl Persisted for Sample {
        const KIND: &'static str = "sample";
        const FORMAT_VERSION: u32 = 3;
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn encode_then_decode_is_identity(a in any::<u64>(), b in ".{0,32}") {
            let value = Sample { a, b };
            let bytes = encode(&value).expect("encode");
            prop_assert_eq!(decode::<Sample>(&bytes).expect("decode"), value);
        }

        #[test]
        fn any_other_version_is_a_typed_error(version in any::<u32>().prop_filter("not current", |v| *v != 3)) {
            let mut bytes = postcard::to_stdvec(&version).expect("encode version");
            bytes.extend(postcard::to_stdvec(&Sample { a: 1, b: "x".into() }).expect("encode body"));
            let is_unknown_version = matches!(
                decode::<Sample>(&bytes),
                Err(CodecError::UnknownVersion { found, supported: 3, .. }) if found == version
            );
            prop_assert!(is_unknown_version);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode::<Sample>(&bytes);
        }
    }

    #[test]
    fn empty_input_is_malformed() {
        assert!(matches!(
            decode::<Sample>(&[]),
            Err(CodecError::Malformed { .. })
        ));
    }
}
