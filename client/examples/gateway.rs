//! An LLM-gateway-style HTTP service behind `AdmissionLayer`: one admission
//! decision across concurrency, rate and cost before the expensive call,
//! `429` with `Retry-After` and `RateLimit-*` headers when any axis denies.
//! The handler itself knows nothing of limits.
//!
//! With the global budget of a local cluster:
//!
//! ```sh
//! cargo run --release -- dev            # prints escrow nodes and certificates
//! LEASEHOLD_ESCROW=127.0.0.1:7201 \
//! LEASEHOLD_CA=… LEASEHOLD_CERT=… LEASEHOLD_KEY=… \
//!   cargo run -p leasehold-client --example gateway
//! ```
//!
//! The certificate is a service certificate of the escrow node's region
//! (`leasehold dev` writes `service-eu.pem` and its key next to the CA);
//! without the three TLS variables it dials in plaintext (`--insecure`
//! nodes). The cost axis is then the global budget of `demo/<user>` (the
//! demo policy: 1 000 tokens a minute per key, shared by every process and
//! region), leased through the region's escrow nodes. Without
//! `LEASEHOLD_ESCROW` it is an in-process token bucket per user.
//!
//! `cargo test -p leasehold-client --example gateway` runs the same service
//! under test, the global budget coming from an in-memory source.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use leasehold_client::admission::{
    AdmissionGate, AdmissionLayer, Admit, ConcurrencyParams, CostAxis, InProcessLimit,
};
use leasehold_client::transport::{Dialer, SystemClock, TcpDialer, WallClock};
use leasehold_client::{ClientId, EscrowSource, EscrowSourceOptions, Limiter, LimiterConfig};
use tower::ServiceExt;

/// Who pays and how much: the `x-user` header (keys `demo/<user>`) and
/// the `x-max-tokens` header (default 100). No user: a 400 from the gate
/// (an empty key), never an unlimited request.
fn classify(request: &Request<Body>) -> Option<Admit> {
    let header = |name: &str| request.headers().get(name)?.to_str().ok();
    let user = header("x-user").unwrap_or_default();
    let max_tokens = header("x-max-tokens")
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let key = if user.is_empty() {
        String::new()
    } else {
        format!("demo/{user}")
    };
    Some(Admit::new(key, max_tokens))
}

/// ≤ 60 requests a minute per user, 4..32 in flight, and `cost`.
fn gate(clock: Arc<dyn WallClock>, cost: CostAxis) -> AdmissionGate {
    AdmissionGate::builder()
        .clock(clock)
        .concurrency(ConcurrencyParams::aimd(4, 32))
        .rate(InProcessLimit::gcra(60, 60_000))
        .cost(cost)
        .build()
        .expect("a valid gate")
}

/// The gateway: the model call behind the admission layer.
fn router(gate: AdmissionGate) -> Router {
    Router::new()
        .route("/v1/complete", post(complete))
        .layer(AdmissionLayer::new(gate, classify))
}

/// `POST /v1/complete`: only admitted requests get here.
async fn complete() -> String {
    "completed".to_string()
}

/// The global budget through the escrow nodes at `addrs` (comma-separated).
fn global_cost(addrs: &str) -> anyhow::Result<CostAxis> {
    let env = |name: &str| std::env::var_os(name).map(std::path::PathBuf::from);
    let dialer: Arc<dyn Dialer> = match (
        env("LEASEHOLD_CA"),
        env("LEASEHOLD_CERT"),
        env("LEASEHOLD_KEY"),
    ) {
        (Some(ca), Some(cert), Some(key)) => Arc::new(leasehold_client::tls::TlsDialer::new(
            leasehold_client::tls::ClientTlsFiles { ca, cert, key },
        )),
        _ => Arc::new(TcpDialer::default()),
    };
    let source =
        EscrowSource::with_endpoints(addrs.split(','), dialer, EscrowSourceOptions::default())?;
    let config = LimiterConfig::leased(ClientId::new("gateway-example")?);
    Ok(CostAxis::Global(Limiter::new(source, config)?))
}

/// One request through the router, as the HTTP server would make it.
async fn send(app: &Router, user: &str, max_tokens: u64) -> Response {
    let request = Request::post("/v1/complete")
        .header("x-user", user)
        .header("x-max-tokens", max_tokens.to_string())
        .body(Body::empty())
        .expect("a valid request");
    app.clone()
        .oneshot(request)
        .await
        .expect("the router is infallible")
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let (cost, what) = match std::env::var("LEASEHOLD_ESCROW") {
        Ok(addrs) => (
            global_cost(&addrs)?,
            format!("the global budget via {addrs}"),
        ),
        Err(_) => (
            CostAxis::InProcess(InProcessLimit::token_bucket(1_000, 17)),
            "an in-process token bucket".to_string(),
        ),
    };
    println!("cost axis: {what}");
    let app = router(gate(Arc::new(SystemClock), cost));
    for i in 1..=12 {
        let response = send(&app, "alice", 100).await;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        println!(
            "request {i:>2}: {} retry-after {} ratelimit-reset {}",
            response.status(),
            header(header::RETRY_AFTER.as_str()),
            header("ratelimit-reset"),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use futures::future::{BoxFuture, FutureExt};
    use leasehold_client::{
        AcquireRequest, CheckReply, CheckRequest, ClientError, CreditSource, Grant, ReturnRequest,
    };

    use axum::http::StatusCode;

    use super::*;

    struct FrozenClock(AtomicU64);
    impl WallClock for FrozenClock {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn frozen() -> Arc<FrozenClock> {
        Arc::new(FrozenClock(AtomicU64::new(1_000_000)))
    }

    async fn body(response: Response) -> String {
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .expect("a small body");
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[tokio::test]
    async fn over_budget_is_429_with_retry_after_of_the_dominant_wait() {
        let cost = CostAxis::InProcess(InProcessLimit::token_bucket(100_000, 1_667));
        let app = router(gate(frozen(), cost));
        assert_eq!(send(&app, "alice", 60_000).await.status(), StatusCode::OK);
        assert_eq!(send(&app, "alice", 30_000).await.status(), StatusCode::OK);
        let denied = send(&app, "alice", 20_000).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        // 10 000 tokens left, 10 000 missing at 1 667/s: 5 999 ms → 6 s.
        assert_eq!(denied.headers()[header::RETRY_AFTER], "6");
        assert_eq!(denied.headers()["ratelimit-remaining"], "0");
        let body = body(denied).await;
        assert!(body.contains(r#""binding_axis":"cost""#), "{body}");
        // Cost is per user: another user is served.
        assert_eq!(send(&app, "bob", 20_000).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn bad_input_is_400_not_a_panic() {
        let cost = CostAxis::InProcess(InProcessLimit::token_bucket(100_000, 1_667));
        let app = router(gate(frozen(), cost));
        assert_eq!(
            send(&app, "alice", 0).await.status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            send(&app, "alice", 100_001).await.status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(send(&app, "", 1).await.status(), StatusCode::BAD_REQUEST);
    }

    /// One window of `left` tokens, as a coordinator grants them.
    struct Budget(AtomicU64);

    impl CreditSource for Budget {
        fn acquire(&self, r: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
            let granted = r.tokens.min(self.0.load(Ordering::SeqCst));
            self.0.fetch_sub(granted, Ordering::SeqCst);
            let grant = Grant {
                granted,
                limit: 1_000,
                window_start_ms: 0,
                window_end_ms: 60_000,
                remaining_lifetime_ms: 60_000,
                retry_after_ms: if granted == 0 { 30_000 } else { 0 },
            };
            async move { Ok(grant) }.boxed()
        }
        fn check(&self, _: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
            async { Err(ClientError::Unsupported("leased only".into())) }.boxed()
        }
        fn give_back(&self, r: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
            self.0.fetch_add(r.tokens, Ordering::SeqCst);
            async move { Ok(r.tokens) }.boxed()
        }
    }

    #[tokio::test]
    async fn the_global_budget_binds_across_users_of_one_key_space() {
        let budget = Arc::new(Budget(AtomicU64::new(1_000)));
        let config = LimiterConfig::leased(ClientId::new("gateway-test").expect("valid"));
        let limiter = Limiter::with_shared_source(budget.clone(), config).expect("valid");
        let app = router(gate(frozen(), CostAxis::Global(limiter)));
        let mut served = 0;
        for _ in 0..15 {
            let response = send(&app, "alice", 100).await;
            if response.status() == StatusCode::OK {
                served += 100;
            } else {
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(response.headers()[header::RETRY_AFTER], "30");
                assert!(body(response).await.contains(r#""binding_axis":"cost""#));
            }
        }
        assert_eq!(served, 1_000, "the whole budget, never more");
    }
}
