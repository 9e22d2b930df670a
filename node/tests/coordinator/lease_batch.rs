//! `LeaseBatch`: each item is answered exactly as the same `Lease` alone
//! would be (grants, denials and refusals with their reasons), exactly-once
//! per item by its own request id, and Σ granted per window stays ≤ L.

use anyhow::{ensure, Context, Result};
use leasehold_proto::refusal::{status_of_item, Reason};
use leasehold_proto::v1 as pb;
use leasehold_proto::v1::coordinator_client::CoordinatorClient as CoordinatorRpc;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use tonic::transport::Channel;
use tonic::Code;

use crate::exactly_once::granted as granted_in;
use crate::harness::{counter_policy, Cluster, LONG_WINDOW_MS};

async fn rpc(cluster: &Cluster) -> Result<CoordinatorRpc<Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.addr(1)))?
        .connect()
        .await?;
    Ok(CoordinatorRpc::new(channel))
}

fn item(key: &str, tokens: u64, client: &str, seq: u64) -> pb::LeaseRequest {
    pb::LeaseRequest {
        key: key.into(),
        region: "eu".into(),
        tokens,
        request_id: Some(pb::RequestId {
            client_id: client.into(),
            seq,
        }),
    }
}

/// An answer reduced to what a caller compares: the grant (with its limit
/// and window) or the refusal's code and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer {
    Granted {
        granted: u64,
        limit: u64,
        window_start_ms: u64,
    },
    Refused(Code, Option<Reason>),
}

fn granted(response: &pb::LeaseResponse) -> Answer {
    Answer::Granted {
        granted: response.granted,
        limit: response.limit,
        window_start_ms: response.window_start_ms,
    }
}

fn refused(status: &tonic::Status) -> Answer {
    Answer::Refused(status.code(), leasehold_proto::refusal::reason_of(status))
}

fn answers(response: pb::LeaseBatchResponse) -> Result<Vec<Answer>> {
    response
        .results
        .into_iter()
        .map(
            |result| match result.result.context("an item without a result")? {
                pb::lease_item_result::Result::Granted(grant) => Ok(granted(&grant)),
                pb::lease_item_result::Result::Refused(item) => Ok(refused(&status_of_item(&item))),
            },
        )
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn items_are_answered_alone_and_exactly_once() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let mut api = rpc(&cluster).await?;
    cluster
        .client()?
        .admin()
        .set_policy(counter_policy("b/", 100, LONG_WINDOW_MS))
        .await?;

    // Five items of 30 on one key of limit 100: whatever their order,
    // 100 granted in all, no item more than it asked.
    let mut batch: Vec<pb::LeaseRequest> =
        (1..=5).map(|seq| item("b/hot", 30, "c1", seq)).collect();
    batch.push(item("nopolicy/k", 1, "c1", 6));
    batch.push(item(&"k".repeat(300), 1, "c1", 7));
    batch.push(item("b/other", 0, "c1", 8));
    let request = pb::LeaseBatchRequest { items: batch };
    let first = answers(api.lease_batch(request.clone()).await?.into_inner())?;
    ensure!(first.len() == 8, "{first:?}");
    let hot: u64 = first[..5]
        .iter()
        .map(|answer| match answer {
            Answer::Granted {
                granted,
                limit: 100,
                ..
            } if *granted <= 30 => Ok(*granted),
            other => Err(anyhow::anyhow!("unexpected {other:?}")),
        })
        .sum::<Result<u64>>()?;
    ensure!(hot == 100, "Σ granted on b/hot = {hot}");
    ensure!(first[5] == Answer::Refused(Code::NotFound, Some(Reason::NoPolicy)));
    ensure!(first[6] == Answer::Refused(Code::InvalidArgument, Some(Reason::InvalidField)));
    ensure!(first[7] == Answer::Refused(Code::InvalidArgument, Some(Reason::InvalidField)));

    // The same batch again: every item gets its first answer, nothing more is granted.
    let again = answers(api.lease_batch(request).await?.into_inner())?;
    ensure!(
        again == first,
        "a retried batch is answered from its first answers"
    );
    ensure!(granted_in(&mut api, "b/hot").await? == 100);

    // One item's id reused for another request: that item alone is refused.
    let mixed = pb::LeaseBatchRequest {
        items: vec![item("b/hot", 7, "c1", 1), item("b/fresh", 4, "c1", 9)],
    };
    let mixed = answers(api.lease_batch(mixed).await?.into_inner())?;
    ensure!(
        mixed[0] == Answer::Refused(Code::AlreadyExists, Some(Reason::RequestIdReused)),
        "{mixed:?}"
    );
    ensure!(
        matches!(mixed[1], Answer::Granted { granted: 4, .. }),
        "{mixed:?}"
    );

    // Batch size limits are whole-call refusals.
    for size in [0, 257] {
        let items = (0..size).map(|n| item("b/size", 1, "c2", n + 1)).collect();
        let status = api
            .lease_batch(pb::LeaseBatchRequest { items })
            .await
            .expect_err("refused");
        ensure!(
            leasehold_proto::refusal::reason_of(&status) == Some(Reason::InvalidField)
                && leasehold_proto::refusal::detail(&status, "field").as_deref() == Some("items"),
            "{size} items: {status:?}"
        );
    }
    ensure!(granted_in(&mut api, "b/fresh").await? == 4);
    cluster.stop_all().await
}

/// For batches of items on distinct keys (so no item's answer depends on
/// another's), the batch answers exactly what the same requests sent one
/// by one answer: the same twin keys are leased alone under `one/` and
/// together under `many/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answers_what_the_same_leases_alone_answer() -> Result<()> {
    let mut cluster = Cluster::start_initialised(1, |_| {}).await?;
    let mut api = rpc(&cluster).await?;
    let admin = cluster.client()?.admin();
    admin
        .set_policy(counter_policy("one/", 50, LONG_WINDOW_MS))
        .await?;
    admin
        .set_policy(counter_policy("many/", 50, LONG_WINDOW_MS))
        .await?;

    // Items: (key suffix, tokens, already used on the key, whether the key
    // has a policy).
    let strategy = proptest::collection::vec((0u64..120, 0u64..60, any::<bool>()), 1..24);
    let mut runner = TestRunner::new(Config::with_cases(12));
    for case in 0..12u64 {
        let items = strategy
            .new_tree(&mut runner)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .current();
        let key = |space: &str, n: usize, governed: bool| {
            let space = if governed {
                space.to_string()
            } else {
                format!("x{space}")
            };
            format!("{space}c{case}-k{n}")
        };
        // Use part of each key's window first, alone, in both spaces.
        for (n, (_, used, governed)) in items.iter().enumerate() {
            if *used > 0 && *governed {
                for space in ["one/", "many/"] {
                    api.lease(pb::LeaseRequest {
                        key: key(space, n, true),
                        region: "eu".into(),
                        tokens: *used,
                        request_id: None,
                    })
                    .await?;
                }
            }
        }
        let mut alone = Vec::new();
        for (n, (tokens, _, governed)) in items.iter().enumerate() {
            let request = item(
                &key("one/", n, *governed),
                *tokens,
                &format!("one-{case}"),
                n as u64 + 1,
            );
            alone.push(match api.lease(request).await {
                Ok(response) => granted(response.get_ref()),
                Err(status) => refused(&status),
            });
        }
        let batch = pb::LeaseBatchRequest {
            items: items
                .iter()
                .enumerate()
                .map(|(n, (tokens, _, governed))| {
                    item(
                        &key("many/", n, *governed),
                        *tokens,
                        &format!("many-{case}"),
                        n as u64 + 1,
                    )
                })
                .collect(),
        };
        let together = answers(api.lease_batch(batch).await?.into_inner())?;
        // Windows of the two spaces may differ only if a window ended in
        // between; LONG_WINDOW_MS makes that impossible in a test run.
        ensure!(
            together == alone,
            "case {case}: {items:?}\nalone {alone:?}\nbatch {together:?}"
        );
    }
    cluster.stop_all().await
}
