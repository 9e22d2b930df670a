//! An LLM-gateway-style HTTP handler: one admission decision across
//! concurrency, rate and cost before the expensive call, `429` with
//! `Retry-After` when any axis denies.
//!
//! `cargo run -p leasehold-client --example gateway` drives a few requests
//! through the router in process; `cargo test -p leasehold-client --example
//! gateway` runs the same handler under test. In a real service the cost
//! axis would be `CostAxis::Global(limiter)`, the global budget through a
//! leased `Limiter` against the region's escrow node.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use leasehold_client::admission::{AdmissionGate, AdmitRequest, CostAxis, InProcessLimit};
use leasehold_client::transport::{SystemClock, WallClock};
use leasehold_core::admission::concurrency::ConcurrencyParams;
use tower::ServiceExt;

/// The gate the gateway admits with: ≤ 60 requests a minute and ≤ 100 000
/// tokens (refilled at 1 667 a second) per user, 4..32 in flight.
fn gate(clock: Arc<dyn WallClock>) -> AdmissionGate {
    AdmissionGate::builder()
        .clock(clock)
        .concurrency(ConcurrencyParams::aimd(4, 32))
        .rate(InProcessLimit::gcra(60, 60_000))
        .cost(CostAxis::InProcess(InProcessLimit::token_bucket(
            100_000, 1_667,
        )))
        .build()
        .expect("a valid gate")
}

fn router(gate: AdmissionGate) -> Router {
    Router::new()
        .route("/v1/complete", post(complete))
        .with_state(gate)
}

/// `POST /v1/complete` with `x-user` and `x-max-tokens` headers.
async fn complete(State(gate): State<AdmissionGate>, headers: HeaderMap) -> Response {
    let user = header_str(&headers, "x-user").unwrap_or("anonymous");
    let max_tokens = header_str(&headers, "x-max-tokens")
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    let outcome = match gate.admit(AdmitRequest::new(user, max_tokens)).await {
        Ok(outcome) => outcome,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    if let Some(retry_after) = outcome.retry_after_secs() {
        let body = format!(
            r#"{{"error":"rate_limited","binding_axis":"{}","retryAfterMs":{}}}"#,
            outcome.binding_axis.map_or("policy", |a| a.as_str()),
            outcome.decision.retry_after_ms
        );
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [(header::RETRY_AFTER, retry_after.to_string())],
            body,
        )
            .into_response();
    }
    // If this future is dropped (the client hung up), dropping the release
    // handle frees the slot; an error path would call `release(true)`.
    let answer = call_model(max_tokens).await;
    outcome.release.release(false);
    (StatusCode::OK, answer).into_response()
}

async fn call_model(max_tokens: u64) -> String {
    format!("completed with up to {max_tokens} tokens")
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
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
async fn main() {
    let app = router(gate(Arc::new(SystemClock)));
    for (user, tokens) in [("alice", 60_000), ("alice", 30_000), ("alice", 20_000)] {
        let response = send(&app, user, tokens).await;
        let retry_after = response.headers().get(header::RETRY_AFTER).cloned();
        println!("{user} {tokens}: {} {retry_after:?}", response.status());
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    struct FrozenClock(AtomicU64);
    impl WallClock for FrozenClock {
        fn now_ms(&self) -> u64 {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn over_budget_is_429_with_retry_after_of_the_dominant_wait() {
        let app = router(gate(Arc::new(FrozenClock(AtomicU64::new(1_000_000)))));
        assert_eq!(send(&app, "alice", 60_000).await.status(), StatusCode::OK);
        assert_eq!(send(&app, "alice", 30_000).await.status(), StatusCode::OK);
        let denied = send(&app, "alice", 20_000).await;
        assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
        // 10 000 tokens left, 10 000 missing at 1 667/s: 5 999 ms → 6 s.
        assert_eq!(denied.headers()[header::RETRY_AFTER], "6");
        let body = axum::body::to_bytes(denied.into_body(), 1 << 16)
            .await
            .expect("a small body");
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(r#""binding_axis":"cost""#), "{body}");
        // Cost is per user: another user is served.
        assert_eq!(send(&app, "bob", 20_000).await.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn bad_input_is_400_not_a_panic() {
        let app = router(gate(Arc::new(FrozenClock(AtomicU64::new(0)))));
        assert_eq!(
            send(&app, "alice", 0).await.status(),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            send(&app, "alice", 100_001).await.status(),
            StatusCode::BAD_REQUEST
        );
    }
}
