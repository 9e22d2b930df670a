//! The Leasehold client library (L1): what services embed to ask "may this
//! request proceed?" against a global, per-window budget.
//!
//! A [`Limiter`] answers `check(key, cost)` with a [`Decision`] in one of
//! three [`Mode`]s: `Strict` (every check asks the backend), `CachedDeny`
//! (denials are cached until their retry-after) or `Leased` (credits are
//! leased in batches and spent locally, coupled to the coordinator window
//! that granted them: no credit is ever spent after its window's end as
//! the coordinator measures it, whatever the host clocks say).
//!
//! Credits come from a [`CreditSource`]: a regional escrow node
//! ([`EscrowSource`]), the coordinator directly ([`CoordinatorSource`]), or
//! anything else implementing the trait (tests use in-memory fakes).
//!
//! ```
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use futures::future::{BoxFuture, FutureExt};
//! use leasehold_client::{
//!     AcquireRequest, CheckReply, CheckRequest, ClientError, ClientId, CreditSource, Grant,
//!     LeaseOptions, LeaseSizing, Limiter, LimiterConfig, ReturnRequest,
//! };
//!
//! /// A one-window source with a fixed budget, for illustration.
//! struct Budget(AtomicU64);
//!
//! impl CreditSource for Budget {
//!     fn acquire(&self, r: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
//!         let left = self.0.load(Ordering::SeqCst);
//!         let granted = r.tokens.min(left);
//!         self.0.fetch_sub(granted, Ordering::SeqCst);
//!         let grant = Grant {
//!             granted, limit: 10, window_start_ms: 0, window_end_ms: 60_000,
//!             remaining_lifetime_ms: 60_000, retry_after_ms: if granted == 0 { 1_000 } else { 0 },
//!         };
//!         async move { Ok(grant) }.boxed()
//!     }
//!     fn check(&self, _: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
//!         async { Err(ClientError::Unsupported("leased only".into())) }.boxed()
//!     }
//!     fn give_back(&self, r: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
//!         self.0.fetch_add(r.tokens, Ordering::SeqCst);
//!         async move { Ok(r.tokens) }.boxed()
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = LimiterConfig::leased(ClientId::new("doc-example")?)
//!     .with_lease(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(4)));
//! let limiter = Limiter::new(Budget(AtomicU64::new(10)), config)?;
//!
//! let mut admitted = 0;
//! for _ in 0..12 {
//!     let decision = limiter.check("api:search", 1).await?;
//!     if decision.allowed {
//!         admitted += 1;
//!     } else {
//!         assert!(decision.retry_after_ms >= 1);
//!     }
//! }
//! assert_eq!(admitted, 10); // never more than the budget
//! assert_eq!(limiter.stats().refills, 4); // 4 + 4 + 2, then one empty grant
//! # Ok(())
//! # }
//! ```
//!
//! # Connecting to Leasehold
//!
//! A service usually leases from the escrow nodes of its region:
//!
//! ```no_run
//! use std::sync::Arc;
//! use leasehold_client::transport::TcpDialer;
//! use leasehold_client::{ClientId, EscrowSource, EscrowSourceOptions, Limiter, LimiterConfig};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let source = EscrowSource::with_endpoints(
//!     ["escrow-a.eu:7201", "escrow-b.eu:7201"], // the region's nodes, active-active
//!     Arc::new(TcpDialer::default()),           // or `tls::TlsDialer` (feature `tls`)
//!     EscrowSourceOptions::default(),
//! )?;
//! let limiter = Limiter::new(source, LimiterConfig::leased(ClientId::new("checkout")?))?;
//! let decision = limiter.check("tenant:acme/api", 1).await?;
//! if !decision.allowed {
//!     // 429 with Retry-After: decision.retry_after_ms
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//!
//! A denial is a [`Decision`], never an error. A [`ClientError`] means the
//! question could not be answered; [`ClientError::is_transient`] says
//! whether a retry may help, [`ClientError::reason`] gives the server's
//! refusal reason (`NO_POLICY`, `WRONG_KEY_KIND`, …) and the gRPC status is
//! its [`source`](std::error::Error::source). Configuration is validated
//! when a limiter is built ([`ConfigError`]).
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tls` | yes | [`tls::TlsDialer`]: mutual TLS (rustls, ring) |
//! | `otel` | yes | every call carries the current span's W3C `traceparent` ([`trace_context`]) |
//! | `admission` | yes | [`admission::AdmissionGate`] and its tower layer |
//! | `fair` | yes | [`FairThrottle`] |
//!
//! `default-features = false` keeps the limiter, its sources and the
//! coordinator client: 85 crates in the dependency tree instead of 102
//! (`docs/client.md`, "Features", has the build times and the command).
//!
//! # The check clock
//!
//! In leased mode a check with credits held decides in-process: it finds
//! its key's credits in a per-thread cache of recently checked keys and
//! spends them with one compare-and-swap, provided their deadline is still
//! ahead. [`LeaseOptions::clock`] says what it reads to know that. The
//! default, [`CheckClock::Auto`], reads a bound on the clock from the CPU's
//! cycle counter that is never earlier than the clock (see
//! [`cycle_counter_status`] and ADR 0015) while tokio's clock is real time,
//! and tokio's clock itself once a test pauses it.
//! [`CheckClock::Runtime`] always reads tokio's clock (a third dearer per
//! check); [`CheckClock::CycleCounter`] always the counter (real time only).
//!
//! # Layout
//! - [`admission`] — [`AdmissionGate`](admission::AdmissionGate): one
//!   decision across concurrency, rate and cost (and a tenant), and
//!   [`AdmissionLayer`](admission::AdmissionLayer), the gate as a tower
//!   layer in front of an HTTP service.
//! - [`limiter`] — the [`Limiter`] and its modes (leased, strict, cached-deny,
//!   idle returns).
//! - [`wallet`] — the sans-IO credit bookkeeping of one key (property-tested).
//! - [`source`] — the [`CreditSource`] seam and its messages.
//! - [`escrow_source`] / [`coordinator_source`] — the two network backends.
//! - [`decision`] — [`Decision`] (from core), its combine algebra, and
//!   [`Admission`] (a decision plus its window label).
//! - [`config`], [`sizing`], [`stats`], [`error`] — options, lease sizing,
//!   counters and typed errors.
//! - [`fair_throttle`] — [`FairThrottle`]: constant-memory fairness among
//!   many anonymous callers in front of any limited resource.
//! - [`static_partition`] — the uncoordinated static-split baseline.
//! - [`transport`] — the [`Dialer`](transport::Dialer) and
//!   [`WallClock`](transport::WallClock) seams (TCP or simulated).
//! - [`coordinator`] — [`CoordinatorClient`](coordinator::CoordinatorClient)
//!   with leader tracking, redirects and retries.
//! - [`trace_context`] — W3C `traceparent` in every call's gRPC metadata
//!   (the current span's, through OpenTelemetry's global propagator).
#![deny(missing_docs)]
// The front page links every feature's items; without them some links dangle.
#![cfg_attr(
    not(all(
        feature = "tls",
        feature = "otel",
        feature = "admission",
        feature = "fair"
    )),
    allow(rustdoc::broken_intra_doc_links)
)]

#[cfg(feature = "admission")]
pub mod admission;
pub mod config;
pub mod coordinator;
pub mod coordinator_source;
pub mod decision;
pub mod error;
pub mod escrow_source;
#[cfg(feature = "fair")]
pub mod fair_throttle;
pub mod lease_coalescer;
pub mod limiter;
pub mod sizing;
pub mod source;
pub mod static_partition;
pub mod stats;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "otel")]
pub mod trace_context;
pub mod transport;
pub mod wallet;

pub use config::{incarnation_id, CheckClock, LeaseOptions, LimiterConfig, Mode};
pub use coordinator_source::CoordinatorSource;
pub use decision::{combine, Admission, Decision};
pub use error::{ClientError, ConfigError, Detail, Reason};
pub use escrow_source::{EscrowSource, EscrowSourceOptions};
#[cfg(feature = "fair")]
pub use fair_throttle::{
    FairAdmission, FairGate, FairThrottle, FairThrottleOptions, FairThrottleStats,
    ProtectedResource,
};
/// The structures' parameters of a [`FairThrottle`] and a request's outcome.
#[cfg(feature = "fair")]
pub use leasehold_core::fair_throttle::{FairThrottleConfig, FairThrottleError, Outcome};
/// The names a limiter is given: its client id, the keys it checks, the
/// tenant it acts for (validated: non-empty, bounded length).
pub use leasehold_core::ids::{ClientId, IdError, Key, TenantId};
/// The parameters of the adaptive lease sizers ([`LeaseSizing::eoq`],
/// [`LeaseSizing::predictive`]).
pub use leasehold_core::predictive_sizer::PredictiveParams;
pub use leasehold_core::sizer::EoqParams;
pub use limiter::counter_clock::{status as cycle_counter_status, CycleCounterStatus};
pub use limiter::Limiter;
pub use sizing::LeaseSizing;
pub use source::{AcquireRequest, CheckReply, CheckRequest, CreditSource, Grant, ReturnRequest};
pub use static_partition::StaticPartition;
pub use stats::LimiterStats;
