//! A tower [`Layer`] that admits HTTP requests through an
//! [`AdmissionGate`] before the service sees them: concurrency, rate, cost
//! and the global budget in one decision; `429 Too Many Requests` with
//! `Retry-After` and the draft `RateLimit-*` headers on a denial.
//!
//! ```
//! use leasehold_client::admission::{
//!     Admit, AdmissionGate, AdmissionLayer, ConcurrencyParams, CostAxis, InProcessLimit,
//! };
//!
//! let gate = AdmissionGate::builder()
//!     .concurrency(ConcurrencyParams::aimd(4, 32))
//!     .rate(InProcessLimit::gcra(60, 60_000))
//!     .cost(CostAxis::InProcess(InProcessLimit::token_bucket(100_000, 1_667)))
//!     .build()?;
//! // Who pays, and how much: here the `x-user` header, one unit a request.
//! let layer = AdmissionLayer::new(gate, |request: &http::Request<String>| {
//!     let user = request.headers().get("x-user")?.to_str().ok()?;
//!     Some(Admit::new(user, 1))
//! });
//! // `Router::new().route(…).layer(layer)` in axum, `ServiceBuilder::new().layer(layer)` in tower.
//! # let _ = layer;
//! # Ok::<(), leasehold_client::admission::AdmissionError>(())
//! ```
//!
//! What the layer answers:
//!
//! | the gate | the response |
//! |---|---|
//! | admits | the service's (with `RateLimit-Limit` / `RateLimit-Remaining` when [`AdmissionLayer::headers_when_admitted`] is on); the concurrency slot is held until the service's future ends (a 5xx or an error reports an overload) |
//! | denies | `429`, `Retry-After` (whole seconds, the dominant wait of every axis), `RateLimit-Limit`, `RateLimit-Remaining: 0`, `RateLimit-Reset`, and a JSON body naming the binding axis (`concurrency`, `rate`, `cost`, or `policy` for the bid-price filter) |
//! | prices the request out (its value is below its bid price) | `429` with `{"error":"priced_out","binding_axis":"policy"}` and no `Retry-After`: waiting does not help |
//! | cannot answer (the global budget's source is unreachable) | `503` with `Retry-After: 1` ([`WhenUnanswered::Deny`], the default), or the service's answer ([`WhenUnanswered::Admit`]); counted either way |
//! | the request is invalid for it (empty key, zero cost, a cost above an axis's capacity) | `400` with the reason |
//!
//! A request the classifier returns `None` for passes unadmitted (health
//! checks, say) and is counted.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{header, HeaderValue, StatusCode};
use tower::{Layer, Service};

use super::error::AdmissionError;
use super::gate::AdmissionGate;
use super::request::{AdmitOutcome, AdmitRequest};

/// What one HTTP request asks of the gate: whose budgets it spends and
/// how much. The owned form of [`AdmitRequest`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Admit {
    /// Whose rate and cost budgets it spends (a user, an API key, a model).
    pub key: String,
    /// The tenant it acts for ([`AdmitRequest::tenant`]).
    pub tenant: Option<String>,
    /// Cost units it spends, at least 1.
    pub cost: u64,
    /// What admitting it is worth, for a bid-price policy.
    pub value: Option<f64>,
    /// How long it is expected to hold its concurrency slot, in ms.
    pub hold_ms: Option<f64>,
}

impl Admit {
    /// A request of `cost` units on `key`.
    pub fn new(key: impl Into<String>, cost: u64) -> Self {
        Admit {
            key: key.into(),
            tenant: None,
            cost,
            value: None,
            hold_ms: None,
        }
    }

    /// For `tenant`.
    pub fn with_tenant(mut self, tenant: impl Into<String>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// With the value of admitting it.
    pub fn with_value(mut self, value: f64) -> Self {
        self.value = Some(value);
        self
    }

    /// With its expected hold time in milliseconds.
    pub fn with_hold_ms(mut self, hold_ms: f64) -> Self {
        self.hold_ms = Some(hold_ms);
        self
    }

    fn as_request(&self) -> AdmitRequest<'_> {
        AdmitRequest {
            key: &self.key,
            tenant: self.tenant.as_deref(),
            cost: self.cost,
            value: self.value,
            hold_ms: self.hold_ms,
        }
    }
}

/// What the layer does when the gate cannot answer (its global cost axis
/// could not reach the budget's source).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WhenUnanswered {
    /// `503 Service Unavailable` with `Retry-After: 1`: the budget is never
    /// exceeded (fail closed). The default.
    #[default]
    Deny,
    /// Pass the request to the service unadmitted (fail open): the service
    /// stays up while the budget's source is down, and the budget may be
    /// exceeded meanwhile.
    Admit,
}

/// What the layer counted since it was built (shared by its services).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmissionLayerStats {
    /// Requests the gate admitted.
    pub admitted: u64,
    /// Requests answered `429`.
    pub denied: u64,
    /// Requests the classifier did not limit (passed unadmitted).
    pub unclassified: u64,
    /// Requests the gate could not answer, then answered `503`.
    pub unanswered_denied: u64,
    /// Requests the gate could not answer, then passed unadmitted.
    pub unanswered_admitted: u64,
    /// Requests answered `400` (invalid for the gate).
    pub invalid: u64,
}

#[derive(Debug, Default)]
struct Counters {
    admitted: AtomicU64,
    denied: AtomicU64,
    unclassified: AtomicU64,
    unanswered_denied: AtomicU64,
    unanswered_admitted: AtomicU64,
    invalid: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Admits each request through an [`AdmissionGate`] before the inner
/// service sees it. See the [module documentation](self).
#[derive(Clone)]
pub struct AdmissionLayer<F> {
    gate: AdmissionGate,
    classify: F,
    when_unanswered: WhenUnanswered,
    allowed_headers: bool,
    counters: Arc<Counters>,
}

impl<F> std::fmt::Debug for AdmissionLayer<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionLayer")
            .field("gate", &self.gate)
            .field("when_unanswered", &self.when_unanswered)
            .field("allowed_headers", &self.allowed_headers)
            .finish_non_exhaustive()
    }
}

impl<F> AdmissionLayer<F> {
    /// A layer admitting through `gate`; `classify` says what each request
    /// asks (`None`: pass it unadmitted).
    pub fn new(gate: AdmissionGate, classify: F) -> Self {
        AdmissionLayer {
            gate,
            classify,
            when_unanswered: WhenUnanswered::Deny,
            allowed_headers: false,
            counters: Arc::default(),
        }
    }

    /// What to do when the gate cannot answer (default: deny with `503`).
    pub fn when_unanswered(mut self, when: WhenUnanswered) -> Self {
        self.when_unanswered = when;
        self
    }

    /// Whether admitted responses carry `RateLimit-Limit` and
    /// `RateLimit-Remaining` (default false; denials always carry theirs).
    /// The remaining is the combined decision's: the tightest axis, and for
    /// a leased global cost axis the credits this process holds, a lower
    /// bound of what the window has left.
    pub fn headers_when_admitted(mut self, on: bool) -> Self {
        self.allowed_headers = on;
        self
    }

    /// The gate it admits through.
    pub fn gate(&self) -> &AdmissionGate {
        &self.gate
    }

    /// What the layer and its services counted.
    pub fn stats(&self) -> AdmissionLayerStats {
        let c = &self.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        AdmissionLayerStats {
            admitted: get(&c.admitted),
            denied: get(&c.denied),
            unclassified: get(&c.unclassified),
            unanswered_denied: get(&c.unanswered_denied),
            unanswered_admitted: get(&c.unanswered_admitted),
            invalid: get(&c.invalid),
        }
    }
}

impl<S, F: Clone> Layer<S> for AdmissionLayer<F> {
    type Service = AdmissionService<S, F>;

    fn layer(&self, inner: S) -> Self::Service {
        AdmissionService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service an [`AdmissionLayer`] wraps around another.
#[derive(Clone)]
pub struct AdmissionService<S, F> {
    inner: S,
    layer: AdmissionLayer<F>,
}

impl<S, F> std::fmt::Debug for AdmissionService<S, F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdmissionService")
            .field("layer", &self.layer)
            .finish_non_exhaustive()
    }
}

/// The future an [`AdmissionService`] returns.
pub type AdmissionFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send + 'static>>;

impl<S, F, ReqBody, ResBody> Service<http::Request<ReqBody>> for AdmissionService<S, F>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    F: Fn(&http::Request<ReqBody>) -> Option<Admit> + Clone + Send + Sync + 'static,
    ReqBody: Send + 'static,
    ResBody: From<String> + Send + 'static,
{
    type Response = http::Response<ResBody>;
    type Error = S::Error;
    type Future = AdmissionFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let admit = (self.layer.classify)(&request);
        // The clone that was driven to readiness serves this request.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        let counters = Arc::clone(&layer.counters);
        Box::pin(async move {
            let Some(admit) = admit else {
                Counters::bump(&counters.unclassified);
                return inner.call(request).await;
            };
            let outcome = match layer.gate.admit(admit.as_request()).await {
                Ok(outcome) => outcome,
                Err(AdmissionError::Backend(error)) => {
                    return match layer.when_unanswered {
                        WhenUnanswered::Admit => {
                            Counters::bump(&counters.unanswered_admitted);
                            inner.call(request).await
                        }
                        WhenUnanswered::Deny => {
                            Counters::bump(&counters.unanswered_denied);
                            Ok(unanswered(&error.to_string()))
                        }
                    };
                }
                Err(invalid) => {
                    Counters::bump(&counters.invalid);
                    return Ok(plain(StatusCode::BAD_REQUEST, invalid.to_string()));
                }
            };
            if !outcome.decision.allowed {
                Counters::bump(&counters.denied);
                return Ok(too_many_requests(&outcome));
            }
            Counters::bump(&counters.admitted);
            let answer = inner.call(request).await;
            let overloaded = match &answer {
                Ok(response) => response.status().is_server_error(),
                Err(_) => true,
            };
            outcome.release.release(overloaded);
            answer.map(|mut response| {
                if layer.allowed_headers {
                    let headers = response.headers_mut();
                    headers.insert("ratelimit-limit", number(outcome.decision.limit));
                    headers.insert("ratelimit-remaining", number(outcome.decision.remaining));
                }
                response
            })
        })
    }
}

fn number(n: u64) -> HeaderValue {
    HeaderValue::from(n)
}

fn plain<B: From<String>>(status: StatusCode, body: String) -> http::Response<B> {
    let mut response = http::Response::new(B::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn unanswered<B: From<String>>(reason: &str) -> http::Response<B> {
    let mut response = plain(
        StatusCode::SERVICE_UNAVAILABLE,
        format!("admission could not be decided: {reason}"),
    );
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

/// The `429` of a denial: its wait, its limit and the binding axis. A
/// request priced out by the bid-price policy gets no `Retry-After`:
/// waiting does not help.
fn too_many_requests<B: From<String>>(outcome: &AdmitOutcome) -> http::Response<B> {
    if outcome.priced_out {
        let mut response = http::Response::new(B::from(
            r#"{"error":"priced_out","binding_axis":"policy"}"#.to_string(),
        ));
        *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        return response;
    }
    let retry_after = outcome.retry_after_secs().unwrap_or(1);
    let binding = match outcome.binding_axis {
        Some(axis) => axis.as_str(),
        None => "policy",
    };
    let body = format!(
        r#"{{"error":"rate_limited","binding_axis":"{binding}","retry_after_ms":{}}}"#,
        outcome.decision.retry_after_ms.max(1)
    );
    let mut response = http::Response::new(B::from(body));
    *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::RETRY_AFTER, number(retry_after));
    headers.insert("ratelimit-limit", number(outcome.decision.limit));
    headers.insert("ratelimit-remaining", number(0));
    headers.insert("ratelimit-reset", number(retry_after));
    response
}
