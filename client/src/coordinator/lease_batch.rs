//! [`CoordinatorClient::lease_batch`]: leases for many keys in few calls.
//! A batch is cut by shard (each part goes to its own shard's leader, every
//! part at once) and into calls of at most [`ITEMS_PER_BATCH_CALL`] items;
//! each item has its own request id, items refused `NOT_LEADER` follow the
//! leader their refusals name, and items of a session a group has
//! forgotten go once more in a new one.

use std::collections::BTreeMap;

use leasehold_proto::refusal::status_of_item;
use leasehold_proto::v1::{lease_item_result, LeaseBatchRequest, LeaseRequest, LeaseResponse};

use super::client::CoordinatorClient;
use super::error::{classify, CoordinatorError};
use super::routing::Target;
use super::session::SessionGuard;

/// Items per `LeaseBatch` call: a session keeps the answers of its 64
/// highest seqs, so every item of a call stays retryable.
pub const ITEMS_PER_BATCH_CALL: usize = 64;

/// Times a `LeaseBatch` part refused item by item `NOT_LEADER` (sent to a
/// replica of its shard that does not lead it) is sent again to the leader
/// the refusals name.
const ITEM_REDIRECTS: u32 = 3;

/// One lease of a [`CoordinatorClient::lease_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseItem {
    /// The key.
    pub key: String,
    /// The region it is leased for.
    pub region: String,
    /// Tokens asked for (≥ 1).
    pub tokens: u64,
}

impl CoordinatorClient {
    /// Leases for many keys in one `LeaseBatch` call per 64 items: one
    /// answer per item, in order — the grant, or the error that item alone
    /// would have got. Each item has its own request id (one session per
    /// call), so a retried call is exactly-once per item. Whole-call
    /// failures (no leader, no quorum, after the retries) are the outer
    /// error.
    #[tracing::instrument(name = "leasehold.coordinator.lease_batch", level = "debug", skip_all, fields(otel.kind = "client", items = items.len()))]
    pub async fn lease_batch(
        &self,
        items: &[LeaseItem],
    ) -> Result<Vec<Result<LeaseResponse, CoordinatorError>>, CoordinatorError> {
        let mut answers: Vec<Option<Result<LeaseResponse, CoordinatorError>>> =
            items.iter().map(|_| None).collect();
        let all: Vec<usize> = (0..items.len()).collect();
        self.lease_batch_round(items, &all, &mut answers).await?;
        // Items refused NOT_LEADER by a shard they were not sent to (a
        // member routed them by a placement this client did not know yet,
        // or another caller of this client has just read) go once more,
        // split by the placement known now (read again first if a member
        // named a newer one). Nothing refused NOT_LEADER was executed.
        let refused: Vec<usize> = answers
            .iter()
            .enumerate()
            .filter(|(_, a)| matches!(a, Some(Err(CoordinatorError::NotLeader { .. }))))
            .map(|(index, _)| index)
            .collect();
        if !refused.is_empty() {
            self.lease_batch_round(items, &refused, &mut answers)
                .await?;
        }
        Ok(answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| {
                    Err(CoordinatorError::Rpc {
                        code: tonic::Code::Internal,
                        message: "an item without a result".into(),
                    })
                })
            })
            .collect())
    }

    /// Leases `items[i]` for each `i` of `indices`, cut by shard (the
    /// placement read first if a member named a newer one), into
    /// `answers[i]`.
    async fn lease_batch_round(
        &self,
        items: &[LeaseItem],
        indices: &[usize],
        answers: &mut [Option<Result<LeaseResponse, CoordinatorError>>],
    ) -> Result<(), CoordinatorError> {
        if let Some(&first) = indices.first() {
            // Reads the placement if a member named a newer one.
            self.target_for(&items[first].key).await;
        }
        let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &index in indices {
            by_shard
                .entry(self.shard_of(&items[index].key))
                .or_default()
                .push(index);
        }
        // Every part at once: a batch over S shards takes one round trip,
        // not S (each part is its own group's, on its own leader).
        let parts: Vec<(u32, Vec<usize>)> = by_shard
            .into_iter()
            .flat_map(|(shard, indices)| {
                indices
                    .chunks(ITEMS_PER_BATCH_CALL)
                    .map(|chunk| (shard, chunk.to_vec()))
                    .collect::<Vec<_>>()
            })
            .collect();
        let calls = parts.iter().map(|(shard, chunk)| {
            let part: Vec<LeaseItem> = chunk.iter().map(|&i| items[i].clone()).collect();
            async move { self.lease_batch_call(Target::Shard(*shard), &part).await }
        });
        let answered = futures::future::join_all(calls).await;
        for ((_, chunk), results) in parts.iter().zip(answered) {
            for (&index, result) in chunk.iter().zip(results?) {
                answers[index] = Some(result);
            }
        }
        Ok(())
    }

    /// One `LeaseBatch` call of at most [`ITEMS_PER_BATCH_CALL`] items of
    /// one shard, in a pooled session; items refused `SESSION_EXPIRED` go
    /// once more in a new session (as [`RequestIds::Pooled`](super::call::RequestIds::Pooled)).
    async fn lease_batch_call(
        &self,
        target: Target,
        chunk: &[LeaseItem],
    ) -> Result<Vec<Result<LeaseResponse, CoordinatorError>>, CoordinatorError> {
        let mut session = self.shared.sessions.checkout_in(target.session_shard());
        let mut results = self.lease_batch_in(target, chunk, &mut session).await?;
        let forgotten: Vec<usize> = results
            .iter()
            .enumerate()
            .filter(|(_, r)| matches!(r, Err(error) if error.is_session_expired()))
            .map(|(index, _)| index)
            .collect();
        if forgotten.is_empty() {
            return Ok(results);
        }
        tracing::debug!(
            items = forgotten.len(),
            "session forgotten by its group; sending its items in a new one"
        );
        session.retire();
        let mut fresh = self.shared.sessions.open_in(target.session_shard());
        let again: Vec<LeaseItem> = forgotten.iter().map(|&i| chunk[i].clone()).collect();
        let answers = self.lease_batch_in(target, &again, &mut fresh).await?;
        for (index, answer) in forgotten.into_iter().zip(answers) {
            results[index] = answer;
        }
        Ok(results)
    }

    /// One `LeaseBatch` call of `chunk` (one shard's) under ids of
    /// `session`.
    async fn lease_batch_in(
        &self,
        target: Target,
        chunk: &[LeaseItem],
        session: &mut SessionGuard<'_>,
    ) -> Result<Vec<Result<LeaseResponse, CoordinatorError>>, CoordinatorError> {
        let request = LeaseBatchRequest {
            items: chunk
                .iter()
                .map(|item| LeaseRequest {
                    key: item.key.clone(),
                    region: item.region.clone(),
                    tokens: item.tokens,
                    request_id: Some(session.request_id()),
                })
                .collect(),
        };
        // A member that hosts the shard but does not lead it answers the
        // call and refuses every item NOT_LEADER (a batch is cut by shard:
        // a part is one group's): follow the hint and send the part again,
        // with the same request ids (exactly-once per item).
        let mut redirect = 0;
        loop {
            let response = self.send(target, request.clone()).await?;
            if response.results.len() != chunk.len() {
                return Err(CoordinatorError::Rpc {
                    code: tonic::Code::Internal,
                    message: format!(
                        "{} results for {} items",
                        response.results.len(),
                        chunk.len()
                    ),
                });
            }
            let leader = self.routing().leader_of(target).unwrap_or_default();
            // The shard a NOT_LEADER names, when it is not this part's.
            let mut elsewhere = false;
            let results: Vec<Result<LeaseResponse, CoordinatorError>> = response
                .results
                .into_iter()
                .map(|result| match result.result {
                    Some(lease_item_result::Result::Granted(grant)) => Ok(grant),
                    Some(lease_item_result::Result::Refused(refused)) => {
                        let status = status_of_item(&refused);
                        self.routing().note_placement(&status);
                        let named = leasehold_proto::refusal::detail(
                            &status,
                            leasehold_proto::refusal::SHARD,
                        )
                        .and_then(|shard| shard.parse::<u32>().ok())
                        .unwrap_or(0);
                        let error = classify(&leader, status);
                        if Some(named) != target.shard() {
                            elsewhere = true;
                            // Remembered for the shard it leads.
                            if let CoordinatorError::NotLeader { hint, .. } = &error {
                                if let Some(addr) = &hint.leader_addr {
                                    self.routing().follow_hint(Target::Shard(named), addr);
                                }
                            }
                        }
                        Err(error)
                    }
                    None => Err(CoordinatorError::Rpc {
                        code: tonic::Code::Internal,
                        message: "an item without a result".into(),
                    }),
                })
                .collect();
            let not_led = results
                .iter()
                .all(|r| matches!(r, Err(CoordinatorError::NotLeader { .. })));
            if !not_led || elsewhere || redirect == ITEM_REDIRECTS {
                return Ok(results);
            }
            let hint = results.iter().find_map(|r| match r {
                Err(CoordinatorError::NotLeader { hint, .. }) => hint.leader_addr.clone(),
                _ => None,
            });
            match hint {
                Some(addr) if addr != leader => self.routing().follow_hint(target, &addr),
                _ => {
                    self.routing().forget_leader(target);
                    tokio::time::sleep(self.backoff(redirect)).await;
                }
            }
            redirect += 1;
        }
    }
}
