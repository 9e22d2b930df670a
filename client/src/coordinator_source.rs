//! [`CoordinatorSource`]: credits leased from the coordinator (L3)
//! directly, without a regional escrow node.
//!
//! `Acquire` becomes a coordinator `Lease` for this source's region (the
//! [`CoordinatorClient`] follows the leader and retries with the same
//! request id); `Return` becomes `Reconcile`. A strict `Check` is a `Lease`
//! of exactly the cost: allowed when fully granted, otherwise denied and any
//! partial grant is reconciled back. The coordinator reports no global
//! remaining count, so strict decisions from this source carry
//! `remaining = 0` (a valid lower bound).
//!
//! Strict checks that are in flight together leave together: they go
//! through one [`LeaseCoalescer`] per source (started on the first check),
//! so concurrent checks of any keys become `LeaseBatch` calls, each
//! carrying whatever queued meanwhile (the coalescer's module says how
//! many go out at once), and a lone check is still one plain `Lease`.
//! Each check's answer is its own item's, exactly as if sent alone.
//!
//! An `Acquire` goes under the limiter's own request id, so the
//! coordinator holds one session per limiter. It forgets that session
//! when the limiter has been idle for a minute (no outcome of it left to
//! keep), and then refuses every later seq of it (`SESSION_EXPIRED`: it
//! opens a session only at one of its first seqs). The source then
//! renames the limiter's session from that seq on
//! (`ForgottenSessions`) and sends the request again under the new
//! name: the refused id was never executed (a limiter sends each id in
//! one call, retried for seconds), and a second send of any id maps to the
//! same renamed id, so every id is still executed at most once.
//!
//! `fair` keys are leased per tenant through an escrow node's weighted-fair
//! escrow; asking the coordinator for one, or naming a tenant, is
//! [`ClientError::Unsupported`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use futures::future::{BoxFuture, FutureExt};
use leasehold_core::ids::RegionId;
use leasehold_proto::v1 as wire;

use crate::coordinator::{CoordinatorClient, CoordinatorError};
use crate::decision::{allowed, denied};
use crate::error::ClientError;
use crate::lease_coalescer::LeaseCoalescer;
use crate::source::{AcquireRequest, CheckReply, CheckRequest, CreditSource, Grant, ReturnRequest};

/// A [`CreditSource`] leasing from the coordinator for one region.
#[derive(Debug, Clone)]
pub struct CoordinatorSource {
    client: CoordinatorClient,
    region: RegionId,
    /// The strict checks' coalescer, started by the first check (inside
    /// the runtime that runs it); shared by clones.
    strict_checks: Arc<OnceLock<LeaseCoalescer>>,
    /// Limiter sessions the coordinator forgot, renamed; shared by clones.
    forgotten: Arc<ForgottenSessions>,
}

/// The limiter sessions the coordinator has forgotten, each renamed from
/// the seq it was refused at: `(name, seq)` with `seq ≥ from_seq` goes
/// out as `(renamed, seq − from_seq + 1)`, so the renamed session opens
/// at seq 1 and a resend of an id maps to the same id. One entry per
/// limiter session (a source serves one limiter, or a few).
#[derive(Debug, Default)]
pub(crate) struct ForgottenSessions(Mutex<HashMap<String, Renamed>>);

#[derive(Debug, Clone)]
struct Renamed {
    name: String,
    from_seq: u64,
    renewals: u64,
}

impl ForgottenSessions {
    fn renames(&self) -> std::sync::MutexGuard<'_, HashMap<String, Renamed>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The id `id` goes out as.
    pub(crate) fn outgoing(&self, id: &wire::RequestId) -> wire::RequestId {
        match self.renames().get(&id.client_id) {
            Some(renamed) if id.seq >= renamed.from_seq => wire::RequestId {
                client_id: renamed.name.clone(),
                seq: id.seq - renamed.from_seq + 1,
            },
            _ => id.clone(),
        }
    }

    /// Renames `id`'s session from `id.seq` on, the coordinator having
    /// refused `id` as of a session it does not hold; returns the id it
    /// goes out as now. An id before the current renaming keeps its name.
    pub(crate) fn rename_from(&self, id: &wire::RequestId) -> wire::RequestId {
        let mut renames = self.renames();
        let renewals = match renames.get(&id.client_id) {
            Some(renamed) if id.seq < renamed.from_seq => return id.clone(),
            Some(renamed) => renamed.renewals + 1,
            None => 1,
        };
        let renamed = Renamed {
            name: renamed_session(&id.client_id, renewals),
            from_seq: id.seq,
            renewals,
        };
        let out = wire::RequestId {
            client_id: renamed.name.clone(),
            seq: 1,
        };
        renames.insert(id.client_id.clone(), renamed);
        out
    }
}

/// `name-r<n>`, `name` shortened (on a character boundary) to fit a
/// client id's bytes.
fn renamed_session(name: &str, renewals: u64) -> String {
    let suffix = format!("-r{renewals}");
    let mut end = name
        .len()
        .min(leasehold_core::ids::MAX_CLIENT_ID_BYTES - suffix.len());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", &name[..end])
}

impl CoordinatorSource {
    /// A source leasing for `region` through `client`.
    pub fn new(client: CoordinatorClient, region: RegionId) -> Self {
        CoordinatorSource {
            client,
            region,
            strict_checks: Arc::new(OnceLock::new()),
            forgotten: Arc::default(),
        }
    }

    /// Calls made for strict checks so far (`LeaseBatch` and plain
    /// `Lease`), and checks sent: fewer calls than checks is coalescing.
    pub fn strict_check_calls(&self) -> (u64, u64) {
        self.strict_checks
            .get()
            .map(|coalescer| {
                let stats = coalescer.stats();
                (
                    stats.calls.load(std::sync::atomic::Ordering::Relaxed),
                    stats.items_per_call.snapshot().sum,
                )
            })
            .unwrap_or((0, 0))
    }

    /// The region this source leases for.
    pub fn region(&self) -> &RegionId {
        &self.region
    }

    async fn lease(
        &self,
        key: &str,
        tokens: u64,
        request_id: wire::RequestId,
    ) -> Result<Grant, ClientError> {
        let region = self.region.as_str();
        let sent = self.forgotten.outgoing(&request_id);
        let response = match self.client.lease_with_id(key, region, tokens, sent).await {
            Err(error) if error.is_session_expired() => {
                let renamed = self.forgotten.rename_from(&request_id);
                tracing::debug!(
                    session = %request_id.client_id,
                    renamed = %renamed.client_id,
                    "the coordinator forgot the limiter's session; renamed"
                );
                self.client
                    .lease_with_id(key, region, tokens, renamed)
                    .await
            }
            answer => answer,
        }
        .map_err(|e| client_error(key, e))?;
        Ok(grant_from_lease(&response))
    }
}

impl CreditSource for CoordinatorSource {
    fn acquire(&self, request: AcquireRequest) -> BoxFuture<'_, Result<Grant, ClientError>> {
        async move {
            reject_tenant(&request.tenant)?;
            let id = wire::RequestId::from(&request.request_id);
            self.lease(request.key.as_str(), request.tokens, id).await
        }
        .boxed()
    }

    fn check(&self, request: CheckRequest) -> BoxFuture<'_, Result<CheckReply, ClientError>> {
        async move {
            reject_tenant(&request.tenant)?;
            let key = request.key.as_str();
            let coalescer = self
                .strict_checks
                .get_or_init(|| LeaseCoalescer::spawn(self.client.clone()));
            let response = coalescer
                .lease(key, self.region.as_str(), request.cost)
                .await
                .map_err(|e| client_error(key, e))?;
            let grant = grant_from_lease(&response);
            let decision = if grant.granted >= request.cost {
                allowed(grant.limit, 0, grant.window_end_ms)
            } else {
                if grant.granted > 0 {
                    // Best effort: an unreturned partial grant is forfeited,
                    // which is safe.
                    let _ = self
                        .client
                        .reconcile(
                            key,
                            self.region.as_str(),
                            grant.granted,
                            grant.window_start_ms,
                        )
                        .await;
                }
                denied(
                    grant.limit,
                    0,
                    grant.window_end_ms,
                    grant.remaining_lifetime_ms,
                )
            };
            Ok(CheckReply {
                decision,
                window_start_ms: grant.window_start_ms,
            })
        }
        .boxed()
    }

    fn give_back(&self, request: ReturnRequest) -> BoxFuture<'_, Result<u64, ClientError>> {
        async move {
            reject_tenant(&request.tenant)?;
            let key = request.key.as_str();
            let response = self
                .client
                .reconcile(
                    key,
                    self.region.as_str(),
                    request.tokens,
                    request.window_start_ms,
                )
                .await
                .map_err(|e| client_error(key, e))?;
            Ok(response.credited)
        }
        .boxed()
    }
}

fn reject_tenant(tenant: &Option<leasehold_core::ids::TenantId>) -> Result<(), ClientError> {
    match tenant {
        None => Ok(()),
        Some(t) => Err(ClientError::Unsupported(
            format!(
            "tenant {t}: per-tenant credits need an escrow node; the coordinator leases per region"
        )
            .into(),
        )),
    }
}

/// Converts a coordinator `Lease` answer; an empty grant's retry hint is the
/// rest of the window (nothing more is granted before it ends).
pub fn grant_from_lease(response: &wire::LeaseResponse) -> Grant {
    Grant {
        granted: response.granted,
        limit: response.limit,
        window_start_ms: response.window_start_ms,
        window_end_ms: response.window_end_ms,
        remaining_lifetime_ms: response.remaining_lifetime_ms,
        retry_after_ms: if response.granted == 0 {
            response.remaining_lifetime_ms.max(1)
        } else {
            0
        },
    }
}

/// Maps a coordinator error onto the client's error kinds.
fn client_error(key: &str, e: CoordinatorError) -> ClientError {
    match e {
        CoordinatorError::NoEndpoints
        | CoordinatorError::Address(_)
        | CoordinatorError::InvalidArgument(_) => ClientError::InvalidInput(e.to_string().into()),
        CoordinatorError::NotFound(m) => ClientError::NoPolicy(m.into()),
        // Sent again under a renamed session, and forgotten again at once
        // (a coordinator restored from an old backup, say): the next
        // request goes under the new name.
        CoordinatorError::FailedPrecondition {
            reason: Some(leasehold_proto::refusal::Reason::SessionExpired),
            message,
        } => ClientError::Unavailable(
            format!("the coordinator does not hold this client's session ({message}); retry")
                .into(),
        ),
        CoordinatorError::FailedPrecondition { message: m, reason } => ClientError::Unsupported(
            crate::error::Detail::new(format!(
                "key {key:?} cannot be leased from the coordinator directly ({m}); \
                 `fair` keys are served by escrow nodes"
            ))
            .with_reason(reason),
        ),
        CoordinatorError::NotLeader { .. }
        | CoordinatorError::Unavailable { .. }
        | CoordinatorError::Transport { .. }
        | CoordinatorError::LeaderUnresolvable { .. } => {
            ClientError::Unavailable(e.to_string().into())
        }
        CoordinatorError::DeadlineExceeded { after, .. } => ClientError::DeadlineExceeded(after),
        CoordinatorError::AlreadyExists(_) | CoordinatorError::Rpc { .. } => {
            ClientError::Protocol(e.to_string().into())
        }
    }
}

#[cfg(test)]
mod forgotten_session_tests {
    use super::*;

    fn id(client: &str, seq: u64) -> wire::RequestId {
        wire::RequestId {
            client_id: client.into(),
            seq,
        }
    }

    #[test]
    fn ids_before_a_renaming_keep_their_name_and_later_ones_follow_it() {
        let forgotten = ForgottenSessions::default();
        assert_eq!(forgotten.outgoing(&id("a", 5)), id("a", 5));
        assert_eq!(forgotten.rename_from(&id("a", 80)), id("a-r1", 1));
        assert_eq!(forgotten.outgoing(&id("a", 79)), id("a", 79));
        assert_eq!(forgotten.outgoing(&id("a", 80)), id("a-r1", 1));
        assert_eq!(forgotten.outgoing(&id("a", 95)), id("a-r1", 16));
        assert_eq!(forgotten.outgoing(&id("b", 95)), id("b", 95));
        assert_eq!(
            forgotten.rename_from(&id("a", 70)),
            id("a", 70),
            "an id from before the renaming is not renamed again"
        );
        assert_eq!(forgotten.rename_from(&id("a", 200)), id("a-r2", 1));
        assert_eq!(forgotten.outgoing(&id("a", 201)), id("a-r2", 2));
    }

    #[test]
    fn a_renamed_session_fits_a_client_id() {
        let long = "é".repeat(64);
        let renamed = renamed_session(&long, 12);
        assert!(renamed.len() <= leasehold_core::ids::MAX_CLIENT_ID_BYTES);
        assert!(renamed.ends_with("-r12"));
        assert!(leasehold_core::ids::ClientId::new(renamed).is_ok());
    }
}
