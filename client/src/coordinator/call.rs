//! The one generic call every RPC of a [`CoordinatorClient`] goes
//! through. [`call`](CoordinatorClient::call) picks a member for the
//! call's [`Target`], dials it or reuses its connection, gives each attempt
//! its deadline, maps refusals to [`CoordinatorError`]s, follows leader
//! hints and retries after a jittered backoff until an answer, a terminal
//! error or the end of the budget. [`send`](CoordinatorClient::send) sends
//! any [`Unary`] request through it;
//! [`send_exactly_once`](CoordinatorClient::send_exactly_once) sends a
//! request that changes state under a request id ([`RequestIds`]): of a
//! pooled session, or the caller's.

use std::future::Future;
use std::time::Duration;

use leasehold_proto::v1::RequestId;
use leasehold_proto::LeaderHint;
use tonic::transport::Channel;
use tonic::Status;

use super::client::CoordinatorClient;
use super::error::{classify, CoordinatorError};
use super::routing::Target;
use super::rpc::Unary;
use super::session;
use crate::transport::{normalize_addr, outgoing, DialError};

/// Where the request id of a call that changes state comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum RequestIds {
    /// A pooled session of the target's group, one request in flight per
    /// session; a new session once more when the group has forgotten the
    /// first ([`session::send_in_session`]).
    Pooled,
    /// The caller's (from
    /// [`next_request_id`](CoordinatorClient::next_request_id)): a refusal
    /// because a group has forgotten its session is the caller's to judge,
    /// and renames this client's own session.
    Callers(RequestId),
}

impl CoordinatorClient {
    /// Sends `request` to `target` ([`call`](Self::call)).
    pub(super) async fn send<Req: Unary>(
        &self,
        target: Target,
        request: Req,
    ) -> Result<Req::Response, CoordinatorError> {
        self.call(target, move |channel, timeout| {
            Req::send(channel, outgoing(request.clone(), timeout))
        })
        .await
    }

    /// Sends the request `request` makes for the id it is given, the id
    /// coming from `ids`: the coordinator executes it at most once however
    /// often it is retried.
    pub(super) async fn send_exactly_once<Req: Unary>(
        &self,
        target: Target,
        ids: RequestIds,
        request: impl Fn(RequestId) -> Req,
    ) -> Result<Req::Response, CoordinatorError> {
        match ids {
            RequestIds::Pooled => {
                session::send_in_session(
                    &self.shared.sessions,
                    target.session_shard(),
                    CoordinatorError::is_session_expired,
                    |request_id| self.send(target, request(request_id)),
                )
                .await
            }
            RequestIds::Callers(request_id) => {
                let answer = self.send(target, request(request_id.clone())).await;
                self.renew_own_session_on_expiry(&request_id, &answer);
                answer
            }
        }
    }

    /// Renames this client's own session when `answer` says a group has
    /// forgotten the session `request_id` (a caller-managed id) is of:
    /// the caller's request is refused (its outcome is the caller's to
    /// judge), the next ids of [`next_request_id`](Self::next_request_id)
    /// open a session again.
    fn renew_own_session_on_expiry<R>(
        &self,
        request_id: &RequestId,
        answer: &Result<R, CoordinatorError>,
    ) {
        if matches!(answer, Err(error) if error.is_session_expired())
            && self.shared.sessions.renew_manual(&request_id.client_id)
        {
            tracing::debug!(session = %request_id.client_id, "own session forgotten by a group; renamed");
        }
    }

    /// The connection to `addr`: the one kept, or a new one.
    async fn channel(&self, addr: &str) -> Result<Channel, DialError> {
        let kept = self.routing().channel(addr);
        if let Some(channel) = kept {
            return Ok(channel);
        }
        let channel = self.shared.dialer.dial(addr).await?;
        self.routing().keep_channel(addr, channel.clone());
        Ok(channel)
    }

    /// Runs `rpc` against the target node with per-attempt deadlines, leader
    /// hints and jittered retries until success, a terminal error or the budget ends.
    pub(super) async fn call<R, F, Fut>(
        &self,
        target: Target,
        mut rpc: F,
    ) -> Result<R, CoordinatorError>
    where
        F: FnMut(Channel, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let options = self.shared.options;
        let started = tokio::time::Instant::now();
        let deadline = started + options.total_timeout;
        let mut attempt = 0u32;
        let mut redirects_in_a_row = 0u32;
        // Leader hints whose host name does not resolve from here (a
        // container-internal name, say): never followed again by this call.
        let mut unresolvable_hints: Vec<String> = Vec::new();
        let mut useless_hints_in_a_row = 0usize;
        loop {
            attempt += 1;
            let addr = self.routing().pick(target, attempt);
            let now = tokio::time::Instant::now();
            let per_call = options
                .call_timeout
                .min(deadline.saturating_duration_since(now));
            let error = match self.channel(&addr).await {
                Err(e @ (DialError::InvalidAddress { .. } | DialError::Credentials { .. })) => {
                    return Err(e.into())
                }
                Err(e) => CoordinatorError::Transport {
                    addr: addr.clone(),
                    message: e.to_string(),
                },
                Ok(channel) => match tokio::time::timeout(per_call, rpc(channel, per_call)).await {
                    Ok(Ok(response)) => {
                        if target.is_leader() {
                            self.routing().remember_leader(target, &addr);
                        }
                        return Ok(response.into_inner());
                    }
                    Ok(Err(status)) => {
                        self.routing().note_placement(&status);
                        classify(&addr, status)
                    }
                    Err(_) => CoordinatorError::DeadlineExceeded {
                        addr: addr.clone(),
                        after: per_call,
                    },
                },
            };
            let mut pause = true;
            match &error {
                CoordinatorError::NotLeader {
                    hint:
                        LeaderHint {
                            leader_addr: Some(leader),
                            ..
                        },
                    ..
                } if target.is_leader()
                    && unresolvable_hints
                        .iter()
                        .any(|hint| normalize_addr(leader).is_ok_and(|l| &l == hint)) =>
                {
                    // Every configured endpoint points at a leader this
                    // machine cannot resolve: no retry can help.
                    useless_hints_in_a_row += 1;
                    let endpoints = {
                        let mut routing = self.routing();
                        routing.give_up_on(&addr);
                        routing.endpoints().len()
                    };
                    if useless_hints_in_a_row >= endpoints {
                        return Err(CoordinatorError::LeaderUnresolvable {
                            leader_addr: leader.clone(),
                            via: addr,
                        });
                    }
                    pause = false;
                }
                CoordinatorError::NotLeader {
                    hint:
                        LeaderHint {
                            leader_addr: Some(leader),
                            ..
                        },
                    ..
                } if target.is_leader() => {
                    self.routing().follow_hint(target, leader);
                    redirects_in_a_row += 1;
                    // Follow a fresh hint at once; back off if hints go round in circles.
                    pause = redirects_in_a_row > 2;
                }
                e if e.is_retryable() => {
                    let mut routing = self.routing();
                    if e.is_name_resolution_failure() && !routing.is_configured_endpoint(&addr) {
                        unresolvable_hints.push(addr.clone());
                    }
                    redirects_in_a_row = 0;
                    routing.give_up_on(&addr);
                }
                _ => return Err(error),
            }
            let wait = if pause {
                self.backoff(attempt)
            } else {
                Duration::ZERO
            };
            let resume = tokio::time::Instant::now() + wait;
            if attempt >= options.max_attempts || resume >= deadline {
                tracing::debug!(attempt, %error, "coordinator call gave up");
                return Err(error);
            }
            tracing::debug!(attempt, %error, ?wait, "coordinator call retrying");
            tokio::time::sleep(wait).await;
        }
    }
}
