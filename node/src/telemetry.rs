//! OpenTelemetry traces: the W3C trace-context propagator, the OTLP/gRPC
//! exporter behind `--otlp-endpoint`, the `tracing` layer that turns
//! Leasehold's spans into OpenTelemetry spans, and the server side of
//! propagation ([`server_span`]: the span of each incoming call, child of
//! the caller's `traceparent`).
//!
//! Spans of one admission, outermost first: the client crate's
//! `leasehold.escrow.acquire` (or `leasehold.coordinator.lease` without an
//! escrow node) → the escrow node's server span (named after the method,
//! `/leasehold.v1.Escrow/Acquire`) and `escrow.acquire` → its
//! `leasehold.coordinator.lease` → the coordinator's server span
//! (`/leasehold.v1.Coordinator/Lease`) and `coordinator.lease` → `coordinator.propose` (waiting in group
//! commit) → `raft.client_write` (the batch: replicated, committed and
//! applied on the leader; linked to every request it carries). A refusal
//! puts [`DENIAL_REASON`] on the span that refused.
//!
//! Request spans are at DEBUG level: with no exporter and the default log
//! filter they are never created, so they cost nothing.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;
use tracing::{Level, Metadata};
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// The span attribute naming why a request was refused or denied.
pub const DENIAL_REASON: &str = "leasehold.denial_reason";

/// Denial reason: the window's limit is used up (the grant is 0).
pub const DENIED_WINDOW_EXHAUSTED: &str = "WINDOW_EXHAUSTED";
/// Denial reason: the escrow node's fair throttle refused the caller.
pub const DENIED_FAIR_THROTTLED: &str = "FAIR_THROTTLED";
/// Denial reason: the coordinator is unreachable and the key's outage
/// policy denies.
pub const DENIED_COORDINATOR_UNREACHABLE: &str = "COORDINATOR_UNREACHABLE";

/// How long a process waits at exit for its last spans to be exported. The
/// SDK's default (5 s) is not always enough on a loaded host, where the
/// exporter's first call also opens its connection.
pub const FLUSH_AT_EXIT: std::time::Duration = std::time::Duration::from_secs(15);

/// Service name of exported spans unless `OTEL_SERVICE_NAME` says otherwise.
pub const SERVICE_NAME: &str = "leasehold";

/// Makes W3C trace context (`traceparent`, `tracestate`) the process's
/// propagator, which the client crate injects into every call's metadata
/// and [`server_span`] extracts.
pub fn install_propagator() {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
}

/// Why traces cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The endpoint is not an `http://` or `https://` URL.
    #[error(
        "OTLP endpoint {0:?} must be an http:// or https:// URL, e.g. http://otel-collector:4317"
    )]
    BadEndpoint(String),
    /// The exporter refused its configuration.
    #[error("cannot build the OTLP exporter: {0}")]
    Exporter(String),
}

/// The tracer provider exporting over OTLP; [`shutdown`](Self::shutdown)
/// flushes what is still buffered.
#[derive(Debug)]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Batches spans and sends them over OTLP/gRPC to `endpoint`. Must be
    /// called inside a tokio runtime, which must outlive it.
    pub fn otlp(endpoint: &str) -> Result<Self, TelemetryError> {
        let endpoint = endpoint.trim();
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(TelemetryError::BadEndpoint(endpoint.to_string()));
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        Ok(Self { provider })
    }

    /// A provider over any span exporter, exporting each span as it ends
    /// (tests use an in-memory exporter).
    pub fn with_exporter(exporter: impl opentelemetry_sdk::trace::SpanExporter + 'static) -> Self {
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter)
            .with_resource(resource())
            .build();
        Self { provider }
    }

    /// The tracer Leasehold's spans are recorded with.
    pub fn tracer(&self) -> SdkTracer {
        self.provider.tracer("leasehold")
    }

    /// Flushes and stops the exporter, waiting at most [`FLUSH_AT_EXIT`]
    /// for the collector to take what is still buffered.
    ///
    /// The flush comes first, on its own: the batch processor's shutdown
    /// reports success whatever its last export did, and a short-lived
    /// process (a CLI command) lost its spans in about a third of runs
    /// when only shut down (`traces::the_binary_exports_spans_to_an_otlp_endpoint`
    /// failed 6 of 15 runs; 37 of 37 passed with the flush first).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.force_flush() {
            eprintln!("warning: traces not exported at exit: {e}");
        }
        if let Err(e) = self.provider.shutdown_with_timeout(FLUSH_AT_EXIT) {
            eprintln!("warning: traces not flushed at exit: {e}");
        }
    }
}

fn resource() -> Resource {
    let builder = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_some() {
        builder.build()
    } else {
        builder.with_service_name(SERVICE_NAME).build()
    }
}

/// Whether a callsite feeds the trace layer: spans of Leasehold's crates
/// from DEBUG up, and their events from INFO up (span events).
pub fn is_traced(metadata: &Metadata<'_>) -> bool {
    let ours = metadata.target().starts_with("leasehold");
    let level = *metadata.level();
    ours && (level <= Level::INFO || (metadata.is_span() && level <= Level::DEBUG))
}

/// The layer recording Leasehold's spans with `tracer`, filtered by
/// [`is_traced`] whatever the log filter says.
pub fn span_layer<S>(tracer: SdkTracer) -> impl Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span> + Send + Sync,
{
    tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter_fn(is_traced))
}

/// The span of one incoming gRPC call (for tonic's `trace_fn`; exported
/// under the method's path, e.g. `/leasehold.v1.Coordinator/Lease`), child of
/// the `traceparent` in its headers when there is one. Raft and health
/// calls get none: they are the cluster's heartbeat, not requests.
pub fn server_span(request: &http::Request<()>) -> tracing::Span {
    let path = request.uri().path();
    if path.starts_with("/leasehold.v1.Raft/") || path.starts_with("/grpc.health.") {
        return tracing::Span::none();
    }
    let span = tracing::debug_span!(
        "grpc.server",
        otel.name = path,
        otel.kind = "server",
        rpc.system = "grpc",
        rpc.method = path,
    );
    if span.is_disabled() {
        return span;
    }
    let parent = leasehold_client::trace_context::extract_from_headers(request.headers());
    if let Err(e) = span.set_parent(parent) {
        tracing::debug!(error = %e, "trace context not attached");
    }
    span
}

/// Records `reason` as the current span's [`DENIAL_REASON`] attribute.
pub fn record_denial(reason: &str) {
    tracing::Span::current().set_attribute(DENIAL_REASON, reason.to_string());
}

/// Records a refused call on the current span: its `leasehold-reason`
/// metadata when it has one, its gRPC code otherwise.
pub fn record_refusal(status: &tonic::Status) {
    let reason = status
        .metadata()
        .get(leasehold_proto::REASON_METADATA)
        .and_then(|value| value.to_str().ok())
        .map(str::to_string)
        .unwrap_or_else(|| format!("{:?}", status.code()));
    record_denial(&reason);
}
