//! [`EscrowSource`]: credits from a regional escrow node
//! (`leasehold.v1.Escrow`: `Acquire`, `Check`, `Return`).
//!
//! Every attempt carries a deadline (gRPC `grpc-timeout` and a local
//! timer). `Acquire` and `Return` carry the request's id and are retried on
//! transient failures with jittered exponential backoff and the *same* id,
//! so the node applies each at most once (it answers a retry with its first
//! answer); the node only takes back credits acquired under the same client
//! id. `Check` is not retried: it has no id and a repeat could spend twice.
//! After a
//! transient failure the channel is dropped and re-dialled on the next call,
//! because an HTTP/2 connection can stay wedged after a partition.
//!
//! A source may know every escrow node of its region
//! ([`EscrowSource::with_endpoints`]): the nodes serve the region
//! active-active, so after a transient failure the next attempt (and every
//! call after it) goes to the next node in turn. A retried `Acquire` that a
//! node it left had applied strands those credits at that node (they count
//! as served there, never twice); a `Return` goes to the node in use and is
//! capped there by what that node handed out.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::{BoxFuture, FutureExt};
use leasehold_proto::v1 as wire;
use leasehold_proto::v1::escrow_client::EscrowClient;
use tonic::transport::Channel;
use tracing::Instrument;

use crate::error::ClientError;
use crate::source::{AcquireRequest, CheckReply, CheckRequest, CreditSource, Grant, ReturnRequest};
use crate::transport::{normalize_endpoints, Dialer};
use crate::Decision;

/// Deadlines and retry budget of an [`EscrowSource`]: start from
/// [`EscrowSourceOptions::default`] and change what you need with the
/// `with_` methods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct EscrowSourceOptions {
    /// Deadline of one attempt.
    pub rpc_timeout: Duration,
    /// Most attempts of one `Acquire` (≥ 1).
    pub max_attempts: u32,
    /// First backoff between attempts; doubles per retry up to `backoff_max`.
    pub backoff_base: Duration,
    /// Largest backoff.
    pub backoff_max: Duration,
    /// After moving off the first node (a failure), go back to it at the
    /// start of the first acquisition this long later (returns stay where
    /// the credits came from): a node that restarted
    /// serves its callers again instead of leaving the region on one node.
    /// Should the first node still fail, the source moves on as before and
    /// tries again after the same time.
    pub return_after: Duration,
}

impl EscrowSourceOptions {
    /// Deadline of one attempt.
    pub fn with_rpc_timeout(mut self, timeout: Duration) -> Self {
        self.rpc_timeout = timeout;
        self
    }

    /// Most attempts of one `Acquire` (≥ 1).
    pub fn with_max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// First and largest backoff between attempts.
    pub fn with_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_max = max;
        self
    }

    /// How long after moving off the first node it is tried again.
    pub fn with_return_after(mut self, after: Duration) -> Self {
        self.return_after = after;
        self
    }
}

impl Default for EscrowSourceOptions {
    fn default() -> Self {
        EscrowSourceOptions {
            rpc_timeout: Duration::from_millis(1_000),
            max_attempts: 3,
            backoff_base: Duration::from_millis(20),
            backoff_max: Duration::from_millis(500),
            return_after: Duration::from_secs(2),
        }
    }
}

/// A [`CreditSource`] backed by the escrow nodes of one region.
pub struct EscrowSource {
    endpoints: Vec<String>,
    dialer: Arc<dyn Dialer>,
    options: EscrowSourceOptions,
    /// The node in use (an index into `endpoints`) and its channel, once
    /// dialled.
    route: Mutex<Route>,
}

#[derive(Default)]
struct Route {
    current: usize,
    channel: Option<Channel>,
    /// When the source last moved off the first node, while it is off it.
    left_first_at: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for EscrowSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EscrowSource")
            .field("endpoints", &self.endpoints)
            .field("addr", &self.addr())
            .field("options", &self.options)
            .finish()
    }
}

impl EscrowSource {
    /// A source talking to the escrow node at `addr` (`host:port` or
    /// `http://host:port`) through `dialer`. Dialling is lazy.
    pub fn new(
        addr: &str,
        dialer: Arc<dyn Dialer>,
        options: EscrowSourceOptions,
    ) -> Result<Self, ClientError> {
        Self::with_endpoints([addr], dialer, options)
    }

    /// A source over every escrow node of one region (`host:port` or
    /// `http://host:port` each; duplicates count once), starting with the
    /// first: after a transient failure it moves on to the next node in
    /// turn, and goes back to the first once
    /// [`EscrowSourceOptions::return_after`] has passed (order the
    /// endpoints differently per caller to spread callers over the
    /// region's nodes). Dialling is lazy.
    pub fn with_endpoints<I, S>(
        endpoints: I,
        dialer: Arc<dyn Dialer>,
        options: EscrowSourceOptions,
    ) -> Result<Self, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let normalized = normalize_endpoints(endpoints)
            .map_err(|e| ClientError::InvalidInput(e.to_string().into()))?;
        if normalized.is_empty() {
            return Err(ClientError::InvalidInput(
                "at least one escrow node endpoint is needed".into(),
            ));
        }
        if options.max_attempts == 0 {
            return Err(ClientError::InvalidInput(
                "max_attempts must be at least 1".into(),
            ));
        }
        if options.rpc_timeout.is_zero() {
            return Err(ClientError::InvalidInput(
                "rpc_timeout must be positive".into(),
            ));
        }
        Ok(EscrowSource {
            endpoints: normalized,
            dialer,
            options,
            route: Mutex::new(Route::default()),
        })
    }

    /// The normalised address of the node in use.
    pub fn addr(&self) -> String {
        let current = crate::limiter::lock(&self.route).current;
        self.endpoints[current].clone()
    }

    /// Every node this source may use, normalised, in turn order.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    async fn client(&self) -> Result<EscrowClient<Channel>, ClientError> {
        let (current, cached) = {
            let route = crate::limiter::lock(&self.route);
            (route.current, route.channel.clone())
        };
        let channel = match cached {
            Some(channel) => channel,
            None => {
                let channel = self
                    .dialer
                    .dial(&self.endpoints[current])
                    .await
                    .map_err(|e| ClientError::Unavailable(e.to_string().into()))?;
                let mut route = crate::limiter::lock(&self.route);
                if route.current == current {
                    route.channel = Some(channel.clone());
                }
                channel
            }
        };
        Ok(EscrowClient::new(channel))
    }

    /// Drops the cached channel and moves on to the next node, so the next
    /// call dials afresh (the same node when there is only one).
    fn forget_channel(&self) {
        let mut route = crate::limiter::lock(&self.route);
        route.channel = None;
        route.current = (route.current + 1) % self.endpoints.len();
        route.left_first_at = (route.current != 0).then(tokio::time::Instant::now);
    }

    /// At the start of an acquisition: back to the first node once
    /// [`EscrowSourceOptions::return_after`] has passed since leaving it.
    fn return_to_first_when_due(&self) {
        let mut route = crate::limiter::lock(&self.route);
        if let Some(left) = route.left_first_at {
            if left.elapsed() >= self.options.return_after {
                route.current = 0;
                route.channel = None;
                route.left_first_at = None;
            }
        }
    }

    /// Runs one attempt with its deadline; forgets the channel on a
    /// transient failure.
    async fn attempt<T, F, Fut>(&self, call: F) -> Result<T, ClientError>
    where
        F: FnOnce(EscrowClient<Channel>, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let timeout = self.options.rpc_timeout;
        let result = match self.client().await {
            Err(e) => Err(e),
            Ok(client) => match tokio::time::timeout(timeout, call(client, timeout)).await {
                Ok(Ok(response)) => Ok(response.into_inner()),
                Ok(Err(status)) => Err(ClientError::from(status)),
                Err(_) => Err(ClientError::DeadlineExceeded(timeout)),
            },
        };
        if result.as_ref().is_err_and(ClientError::is_transient) {
            self.forget_channel();
        }
        result
    }

    /// The pause before retry number `retry` (from 0): exponential, capped,
    /// jittered into `[d/2, d]`. The jitter is a hash of the request's
    /// sequence number and the retry, not a random draw, so a seeded
    /// simulation replays the same pauses.
    fn backoff(&self, retry: u32, salt: u64) -> Duration {
        let base = self.options.backoff_base.as_millis().max(1);
        let grown = base.saturating_mul(1u128 << retry.min(16));
        let cap = self.options.backoff_max.as_millis().max(1);
        let millis = u64::try_from(grown.min(cap)).unwrap_or(u64::MAX);
        let half = millis / 2;
        let jitter = splitmix64(salt ^ u64::from(retry)) % (millis - half + 1);
        Duration::from_millis(half + jitter)
    }

    /// Runs `call` until it succeeds, fails for good, or the attempts run
    /// out; every attempt sends the same message (and so the same id).
    async fn with_retries<M, T, F, Fut>(
        &self,
        message: M,
        salt: u64,
        call: F,
    ) -> Result<T, ClientError>
    where
        M: Clone,
        F: Fn(EscrowClient<Channel>, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let mut attempt = 0;
        loop {
            let message = message.clone();
            let result = self
                .attempt(|client, timeout| call(client, with_deadline(message, timeout)))
                .await;
            match result {
                Ok(response) => return Ok(response),
                Err(e) if e.is_transient() && attempt + 1 < self.options.max_attempts => {
                    tokio::time::sleep(self.backoff(attempt, salt)).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    #[tracing::instrument(
        name = "leasehold.escrow.acquire",
        level = "debug",
        skip_all,
        fields(otel.kind = "client", key = %request.key.as_str(), tokens = request.tokens)
    )]
    async fn acquire_with_retries(&self, request: AcquireRequest) -> Result<Grant, ClientError> {
        // Only an acquisition goes back to the first node: a return goes
        // where the credits came from.
        self.return_to_first_when_due();
        let message = wire::AcquireRequest {
            key: request.key.as_str().to_string(),
            tenant: tenant_name(request.tenant.as_ref()),
            weight: request.weight,
            tokens: request.tokens,
            request_id: Some(wire::RequestId::from(&request.request_id)),
        };
        let response = self
            .with_retries(
                message,
                request.request_id.seq,
                |mut client, message| async move { client.acquire(message).await },
            )
            .await?;
        Ok(grant_from_wire(&response))
    }

    #[tracing::instrument(
        name = "leasehold.escrow.return",
        level = "debug",
        skip_all,
        fields(otel.kind = "client", key = %request.key.as_str(), tokens = request.tokens)
    )]
    async fn return_with_retries(&self, request: ReturnRequest) -> Result<u64, ClientError> {
        let message = wire::ReturnRequest {
            key: request.key.as_str().to_string(),
            tenant: tenant_name(request.tenant.as_ref()),
            tokens: request.tokens,
            window_start_ms: request.window_start_ms,
            request_id: Some(wire::RequestId::from(&request.request_id)),
        };
        let response = self
            .with_retries(
                message,
                request.request_id.seq,
                |mut client, message| async move { client.r#return(message).await },
            )
            .await?;
        Ok(response.accepted)
    }
}

impl CreditSource for EscrowSource {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        self.acquire_with_retries(request).boxed()
    }

    fn check(&self, request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        let message = wire::CheckRequest {
            key: request.key.as_str().to_string(),
            tenant: tenant_name(request.tenant.as_ref()),
            weight: request.weight,
            cost: request.cost,
        };
        let span = tracing::debug_span!(
            "leasehold.escrow.check",
            otel.kind = "client",
            key = %request.key.as_str(),
            cost = request.cost
        );
        async move {
            let response = self
                .attempt(|mut client, timeout| async move {
                    client.check(with_deadline(message, timeout)).await
                })
                .await?;
            let decision = response
                .decision
                .ok_or_else(|| ClientError::Protocol("Check answered without a decision".into()))?;
            Ok(CheckReply {
                decision: decision_from_wire(&decision),
                window_start_ms: response.window_start_ms,
            })
        }
        .instrument(span)
        .boxed()
    }

    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        self.return_with_retries(request).boxed()
    }
}

/// A 64-bit mixing function (splitmix64's finaliser).
fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn tenant_name(tenant: Option<&leasehold_core::ids::TenantId>) -> String {
    tenant.map(|t| t.as_str().to_string()).unwrap_or_default()
}

fn with_deadline<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    crate::transport::outgoing(message, timeout)
}

/// Converts an `Acquire` answer.
pub fn grant_from_wire(response: &wire::AcquireResponse) -> Grant {
    Grant {
        granted: response.granted,
        limit: response.limit,
        window_start_ms: response.window_start_ms,
        window_end_ms: response.window_end_ms,
        remaining_lifetime_ms: response.remaining_lifetime_ms,
        retry_after_ms: response.retry_after_ms,
    }
}

/// Converts a wire decision.
pub fn decision_from_wire(d: &wire::Decision) -> Decision {
    Decision {
        allowed: d.allowed,
        limit: d.limit,
        remaining: d.remaining,
        reset_at_ms: d.reset_at_ms,
        retry_after_ms: d.retry_after_ms,
    }
}
