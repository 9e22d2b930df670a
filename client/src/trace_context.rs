//! W3C trace context in gRPC metadata: every call this crate makes carries
//! the current span's `traceparent` (and `tracestate`), so a service's
//! trace continues through the escrow node and the coordinator.
//!
//! Injection goes through OpenTelemetry's global propagator, as usual for
//! OpenTelemetry: register `TraceContextPropagator` with
//! `opentelemetry::global::set_text_map_propagator` and install a
//! `tracing-opentelemetry` layer, and this crate's spans
//! (`leasehold.escrow.acquire`, `leasehold.coordinator.lease`, …) join the
//! service's traces. Without them nothing is injected and nothing is
//! spent. The `leasehold` binary registers the W3C propagator itself and
//! extracts with [`extract_from_headers`].

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::Context;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Writes propagation fields into gRPC metadata (ASCII keys and values;
/// anything else is skipped).
pub struct MetadataInjector<'a>(pub &'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

/// Reads propagation fields from gRPC metadata.
pub struct MetadataExtractor<'a>(pub &'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// Reads propagation fields from HTTP headers (a server's view of the
/// same metadata).
pub struct HeaderExtractor<'a>(pub &'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|key| key.as_str()).collect()
    }
}

/// Injects `context` into `metadata` with the global propagator.
pub fn inject(context: &Context, metadata: &mut MetadataMap) {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(context, &mut MetadataInjector(metadata))
    });
}

/// The context the global propagator finds in `metadata`.
pub fn extract(metadata: &MetadataMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&MetadataExtractor(metadata))
    })
}

/// The context the global propagator finds in HTTP `headers`.
pub fn extract_from_headers(headers: &http::HeaderMap) -> Context {
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.extract(&HeaderExtractor(headers))
    })
}

/// Injects the current span's context into `metadata`: what every call
/// this crate makes carries ([`crate::transport::outgoing`]).
pub fn inject_current(metadata: &mut MetadataMap) {
    inject(&tracing::Span::current().context(), metadata);
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use proptest::prelude::*;
    use std::time::Duration;

    use crate::transport::outgoing;

    fn remote(trace: u128, span: u64, sampled: bool) -> Context {
        let flags = if sampled {
            TraceFlags::SAMPLED
        } else {
            TraceFlags::default()
        };
        Context::new().with_remote_span_context(SpanContext::new(
            TraceId::from_bytes(trace.to_be_bytes()),
            SpanId::from_bytes(span.to_be_bytes()),
            flags,
            true,
            TraceState::default(),
        ))
    }

    #[test]
    fn traceparent_is_written_as_w3c_says() {
        let propagator = TraceContextPropagator::new();
        let mut metadata = MetadataMap::new();
        propagator.inject_context(
            &remote(0x0af7651916cd43dd8448eb211c80319c, 0xb7ad6b7169203331, true),
            &mut MetadataInjector(&mut metadata),
        );
        assert_eq!(
            metadata.get("traceparent").unwrap(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        );
    }

    #[test]
    fn garbage_traceparent_gives_no_parent() {
        let propagator = TraceContextPropagator::new();
        let mut metadata = MetadataMap::new();
        metadata.insert("traceparent", "00-not-a-trace-01".parse().unwrap());
        let context = propagator.extract(&MetadataExtractor(&metadata));
        assert!(!context.span().span_context().is_valid());
    }

    proptest! {
        /// Injecting into tonic metadata and extracting from it (as metadata
        /// or as the server's HTTP headers) gives back the same trace id,
        /// span id and sampling decision.
        #[test]
        fn trace_context_round_trips_through_tonic_metadata(
            trace in 1u128.., span in 1u64.., sampled: bool
        ) {
            let propagator = TraceContextPropagator::new();
            let sent = remote(trace, span, sampled);
            let mut metadata = MetadataMap::new();
            propagator.inject_context(&sent, &mut MetadataInjector(&mut metadata));
            let headers = metadata.clone().into_headers();
            for received in [
                propagator.extract(&MetadataExtractor(&metadata)),
                propagator.extract(&HeaderExtractor(&headers)),
            ] {
                let got = received.span().span_context().clone();
                let want = sent.span().span_context().clone();
                prop_assert_eq!(got.trace_id(), want.trace_id());
                prop_assert_eq!(got.span_id(), want.span_id());
                prop_assert_eq!(got.is_sampled(), want.is_sampled());
                prop_assert!(got.is_remote());
            }
        }
    }

    #[test]
    fn outgoing_requests_carry_the_current_span_through_the_global_propagator() {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt;
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("caller");
            let _entered = span.enter();
            let request = outgoing((), Duration::from_millis(5));
            let received = extract(request.metadata());
            assert_eq!(
                received.span().span_context().trace_id(),
                span.context().span().span_context().trace_id()
            );
            assert!(received.span().span_context().is_valid());
            assert!(request.metadata().get("grpc-timeout").is_some());
        });
    }
}
