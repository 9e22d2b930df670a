//! Envoy's rate limit service on the wire: the `ShouldRateLimit` route
//! served with a decoder that reads a request's domain and descriptor
//! entries as bytes.
//!
//! The generated server decodes `RateLimitRequest` with protobuf's
//! `string` rules, so one header value that is not UTF-8 fails the whole
//! call: Envoy answers 500 with `failure_mode_deny`, and with its default
//! (fail open) lets the request through unlimited — a caller would choose
//! its bytes and bypass the limit. [`RateLimitServer`] serves the same
//! route (`/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`),
//! the same messages and limits, but decodes through [`WireRequest`]
//! (the same field numbers, entries as bytes) and turns each byte string
//! into text by [`leasehold_core::rls::wire_text`]: a value that is not
//! UTF-8 is limited like any other, under a key of its own. Everything
//! else of the request decodes as the generated type would, unknown
//! fields skipped.

use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use leasehold_core::rls::wire_text;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder};
use tonic::codegen::{http, Body, BoxFuture, StdError};
use tonic::server::NamedService;
use tonic::Status;
use tonic_prost::ProstEncoder;

/// The route of `ShouldRateLimit`.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// `envoy.service.ratelimit.v3.RateLimitRequest` with its strings read as
/// bytes (field numbers as in Envoy's proto).
#[derive(Clone, PartialEq, Message)]
pub struct WireRequest {
    /// `domain`.
    #[prost(bytes = "vec", tag = "1")]
    pub domain: Vec<u8>,
    /// `descriptors`.
    #[prost(message, repeated, tag = "2")]
    pub descriptors: Vec<WireDescriptor>,
    /// `hits_addend`.
    #[prost(uint32, tag = "3")]
    pub hits_addend: u32,
}

/// `envoy.extensions.common.ratelimit.v3.RateLimitDescriptor`, its entries
/// read as bytes.
#[derive(Clone, PartialEq, Message)]
pub struct WireDescriptor {
    /// `entries`.
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<WireEntry>,
    /// `limit`.
    #[prost(message, optional, tag = "2")]
    pub limit: Option<RateLimitOverride>,
    /// `hits_addend`.
    #[prost(message, optional, tag = "3")]
    pub hits_addend: Option<UInt64Value>,
    /// `is_negative_hits`.
    #[prost(bool, tag = "4")]
    pub is_negative_hits: bool,
}

/// One descriptor entry, as bytes.
#[derive(Clone, PartialEq, Message)]
pub struct WireEntry {
    /// `key`.
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// `value`.
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

impl From<WireRequest> for RateLimitRequest {
    fn from(wire: WireRequest) -> Self {
        RateLimitRequest {
            domain: wire_text(wire.domain),
            descriptors: wire
                .descriptors
                .into_iter()
                .map(|descriptor| RateLimitDescriptor {
                    entries: descriptor
                        .entries
                        .into_iter()
                        .map(|entry| Entry {
                            key: wire_text(entry.key),
                            value: wire_text(entry.value),
                        })
                        .collect(),
                    limit: descriptor.limit,
                    hits_addend: descriptor.hits_addend,
                    is_negative_hits: descriptor.is_negative_hits,
                })
                .collect(),
            hits_addend: wire.hits_addend,
        }
    }
}

/// Decodes a [`WireRequest`] and hands on the [`RateLimitRequest`] it reads
/// as; encodes responses as the generated codec does.
#[derive(Debug, Clone, Copy, Default)]
pub struct WireCodec;

/// The decoding half of [`WireCodec`].
#[derive(Debug, Clone, Copy, Default)]
pub struct WireDecoder;

impl Decoder for WireDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Self::Item>, Self::Error> {
        WireRequest::decode(buf)
            .map(|wire| Some(wire.into()))
            .map_err(|e| Status::internal(format!("malformed RateLimitRequest: {e}")))
    }
}

impl Codec for WireCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = WireDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        WireDecoder
    }
}

/// The `RateLimitService` server over [`WireCodec`] (see the module doc).
#[derive(Debug)]
pub struct RateLimitServer<T> {
    inner: Arc<T>,
    max_decoding_message_size: Option<usize>,
    max_encoding_message_size: Option<usize>,
}

impl<T> Clone for RateLimitServer<T> {
    fn clone(&self) -> Self {
        RateLimitServer {
            inner: self.inner.clone(),
            max_decoding_message_size: self.max_decoding_message_size,
            max_encoding_message_size: self.max_encoding_message_size,
        }
    }
}

impl<T> RateLimitServer<T> {
    /// Serves `inner`.
    pub fn new(inner: T) -> Self {
        RateLimitServer {
            inner: Arc::new(inner),
            max_decoding_message_size: None,
            max_encoding_message_size: None,
        }
    }

    /// Refuses requests larger than `limit` bytes.
    #[must_use]
    pub fn max_decoding_message_size(mut self, limit: usize) -> Self {
        self.max_decoding_message_size = Some(limit);
        self
    }

    /// Refuses to send responses larger than `limit` bytes.
    #[must_use]
    pub fn max_encoding_message_size(mut self, limit: usize) -> Self {
        self.max_encoding_message_size = Some(limit);
        self
    }
}

impl<T> NamedService for RateLimitServer<T> {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

/// One `ShouldRateLimit` call handed to the service.
struct ShouldRateLimit<T>(Arc<T>);

impl<T: RateLimitService> tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit<T> {
    type Response = RateLimitResponse;
    type Future = BoxFuture<tonic::Response<RateLimitResponse>, Status>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let inner = self.0.clone();
        Box::pin(async move { inner.should_rate_limit(request).await })
    }
}

impl<T, B> tower::Service<http::Request<B>> for RateLimitServer<T>
where
    T: RateLimitService,
    B: Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async move { Ok(Status::unimplemented("").into_http()) });
        }
        let (inner, decoding, encoding) = (
            self.inner.clone(),
            self.max_decoding_message_size,
            self.max_encoding_message_size,
        );
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(WireCodec)
                .apply_max_message_size_config(decoding, encoding);
            Ok(grpc.unary(ShouldRateLimit(inner), request).await)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_encoded_by_envoys_types_reads_back_the_same() {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "remote_address".into(),
                    value: "10.0.0.1".into(),
                }],
                limit: Some(RateLimitOverride {
                    requests_per_unit: 7,
                    unit: 2,
                }),
                hits_addend: Some(UInt64Value { value: 0 }),
                is_negative_hits: true,
            }],
            hits_addend: 3,
        };
        let bytes = request.encode_to_vec();
        let read: RateLimitRequest = WireRequest::decode(&bytes[..]).unwrap().into();
        assert_eq!(read, request);
    }

    #[test]
    fn a_value_that_is_not_utf8_is_read_not_refused() {
        let wire = WireRequest {
            domain: b"edge".to_vec(),
            descriptors: vec![WireDescriptor {
                entries: vec![WireEntry {
                    key: b"x-user".to_vec(),
                    value: vec![b'a', 0xff, b'b'],
                }],
                ..Default::default()
            }],
            hits_addend: 0,
        };
        let bytes = wire.encode_to_vec();
        // The generated type refuses these bytes outright.
        assert!(RateLimitRequest::decode(&bytes[..]).is_err());
        let read: RateLimitRequest = WireRequest::decode(&bytes[..]).unwrap().into();
        assert_eq!(read.descriptors[0].entries[0].value, "a\u{FFFD}FFb");
    }
}
