//! Traces across the tiers, recorded with an in-memory span exporter: a
//! lease through an escrow node continues the client's trace on the
//! coordinator (same trace id, down to the Raft proposal), and a denied
//! request carries its denial reason on its spans. And the binary's
//! `--otlp-endpoint` delivers spans to an OTLP/gRPC collector.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use leasehold_client::transport::TcpDialer;
use leasehold_client::{AcquireRequest, CreditSource, EscrowSource, EscrowSourceOptions};
use leasehold_core::ids::{ClientId, Key, RequestId};
use leasehold_node::telemetry::{self, Telemetry, DENIAL_REASON, DENIED_WINDOW_EXHAUSTED};
use opentelemetry::trace::TraceId;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SpanData};
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

use crate::escrow::EscrowNode;
use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

fn acquire(seq: u64, tokens: u64) -> Result<AcquireRequest> {
    Ok(AcquireRequest {
        key: Key::new("traced/k")?,
        tenant: None,
        weight: 1,
        tokens,
        request_id: RequestId {
            client: ClientId::new("traced-service")?,
            seq,
        },
    })
}

fn trace_of(spans: &[SpanData], name: &str) -> Option<TraceId> {
    spans
        .iter()
        .find(|span| span.name == name)
        .map(|span| span.span_context.trace_id())
}

fn names_in(spans: &[SpanData], trace: TraceId) -> Vec<String> {
    spans
        .iter()
        .filter(|span| span.span_context.trace_id() == trace)
        .map(|span| span.name.to_string())
        .collect()
}

fn denial_reasons(spans: &[SpanData], trace: TraceId, name: &str) -> Vec<String> {
    spans
        .iter()
        .filter(|span| span.span_context.trace_id() == trace && span.name == name)
        .flat_map(|span| span.attributes.iter())
        .filter(|kv| kv.key.as_str() == DENIAL_REASON)
        .map(|kv| kv.value.to_string())
        .collect()
}

#[test]
fn a_lease_through_an_escrow_node_continues_the_clients_trace() -> Result<()> {
    let exporter = InMemorySpanExporter::default();
    let telemetry = Telemetry::with_exporter(exporter.clone());
    telemetry::install_propagator();
    let subscriber = tracing_subscriber::registry().with(telemetry::span_layer(telemetry.tracer()));
    // One thread: every task of the cluster, the escrow node and the
    // client runs under this subscriber.
    let _default = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
        cluster
            .client()?
            .admin()
            .set_policy(counter_policy("traced/", 5, LONG_WINDOW_MS))
            .await?;
        let escrow = EscrowNode::start(&cluster, "eu", |c| c.batch = 5).await?;
        let source = EscrowSource::new(
            &escrow.addr,
            Arc::new(TcpDialer::default()),
            EscrowSourceOptions::default(),
        )?;

        let granted = source
            .acquire(acquire(1, 5)?)
            .instrument(tracing::info_span!(target: "leasehold_test", "service.granted"))
            .await?;
        ensure!(
            granted.granted == 5,
            "the whole limit is granted: {granted:?}"
        );
        let denied = source
            .acquire(acquire(2, 1)?)
            .instrument(tracing::info_span!(target: "leasehold_test", "service.denied"))
            .await?;
        ensure!(denied.granted == 0, "the window is used up: {denied:?}");

        // Server spans end as their responses are sent: wait for them.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let spans = exporter.get_finished_spans()?;
            let done = ["service.granted", "service.denied"].iter().all(|root| {
                trace_of(&spans, root).is_some_and(|trace| {
                    names_in(&spans, trace)
                        .iter()
                        .any(|n| n == "escrow.acquire")
                })
            });
            if done || tokio::time::Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        escrow.stop().await;
        cluster.stop_all().await?;
        Ok::<_, anyhow::Error>(())
    })?;

    let spans = exporter.get_finished_spans()?;
    let granted = trace_of(&spans, "service.granted").context("the client's span was exported")?;
    let names = names_in(&spans, granted);
    for expected in [
        "leasehold.escrow.acquire",
        "/leasehold.v1.Escrow/Acquire",
        "escrow.acquire",
        "leasehold.coordinator.lease",
        "/leasehold.v1.Coordinator/Lease",
        "coordinator.lease",
        "coordinator.propose",
        "raft.client_write",
    ] {
        ensure!(
            names.iter().any(|name| name == expected),
            "{expected} is in the client's trace; it has {names:?}"
        );
    }

    let denied = trace_of(&spans, "service.denied").context("the denied request's span")?;
    ensure!(denied != granted, "each request is its own trace");
    let reasons = denial_reasons(&spans, denied, "escrow.acquire");
    ensure!(
        reasons == [DENIED_WINDOW_EXHAUSTED],
        "the escrow node's span says why it denied: {reasons:?}"
    );
    let reasons = denial_reasons(&spans, denied, "coordinator.lease");
    ensure!(
        reasons == [DENIED_WINDOW_EXHAUSTED],
        "the coordinator's span says why it granted nothing: {reasons:?}"
    );
    telemetry.shutdown();
    Ok(())
}

/// A collector that keeps every export request it receives.
#[derive(Clone, Default)]
struct FakeCollector(Arc<std::sync::Mutex<Vec<ExportTraceServiceRequest>>>);

#[tonic::async_trait]
impl TraceService for FakeCollector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0
            .lock()
            .map_err(|_| tonic::Status::internal("poisoned"))?
            .push(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_exports_spans_to_an_otlp_endpoint() -> Result<()> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let collector = FakeCollector::default();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    // A client command against a cluster that is not there: it fails, and
    // its span is exported when the process exits.
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["window", "--key", "k", "--insecure", "-e", "127.0.0.1:1"])
            .args(["--timeout-ms", "200", "--otlp-endpoint"])
            .arg(format!("http://{addr}"))
            .env_remove("RUST_LOG")
            .env_remove("OTEL_SERVICE_NAME")
            .output()
    })
    .await??;
    ensure!(!output.status.success(), "no cluster answers");
    server.abort();
    let requests = collector
        .0
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    let mut names = Vec::new();
    let mut services = Vec::new();
    for resource_spans in requests.iter().flat_map(|r| r.resource_spans.iter()) {
        for attribute in resource_spans
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
        {
            if attribute.key == "service.name" {
                services.push(format!("{:?}", attribute.value));
            }
        }
        for scope in &resource_spans.scope_spans {
            names.extend(scope.spans.iter().map(|span| span.name.clone()));
        }
    }
    ensure!(
        names
            .iter()
            .any(|name| name == "leasehold.coordinator.get_window"),
        "the client call's span reached the collector: {names:?} (stderr: {})",
        String::from_utf8_lossy(&output.stderr)
    );
    ensure!(
        services.iter().all(|service| service.contains("leasehold")) && !services.is_empty(),
        "exported as service leasehold: {services:?}"
    );
    Ok(())
}
