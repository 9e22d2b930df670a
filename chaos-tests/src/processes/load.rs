//! Concurrent load against real processes: leased limiters (even clients
//! lease from the cluster directly, odd ones through an escrow node when
//! the scenario has any) recording every admission and acknowledged grant,
//! and an observer reading the live window linearizably.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use leasehold_client::coordinator::CoordinatorClient;
use leasehold_client::transport::{Dialer, TcpDialer};
use leasehold_client::{
    CoordinatorSource, CreditSource, EscrowSource, EscrowSourceOptions, LeaseOptions, LeaseSizing,
    Limiter, LimiterConfig, Mode,
};
use leasehold_core::ids::{ClientId, RegionId};
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use super::identities::{self, Identities};
use super::{fleet::runner_retry_options, wall_now_ms, ProcessOptions, KEY};
use crate::history::{Admission, Recorder};
use crate::sim::load::{observe_window, RecordingSource};
use leasehold_core::principal::Principal;

/// The load's tasks.
pub struct LoadTasks {
    handles: Vec<JoinHandle<Result<()>>>,
}

/// Waits for every load task; the first error wins.
pub async fn join(tasks: LoadTasks) -> Result<()> {
    for handle in tasks.handles {
        handle.await.context("a load task panicked")??;
    }
    Ok(())
}

/// The regions of `escrows` (address, region index), counted once.
fn region_count(escrows: &[(String, usize)]) -> usize {
    let mut regions: Vec<usize> = escrows.iter().map(|(_, r)| *r).collect();
    regions.sort_unstable();
    regions.dedup();
    regions.len().max(1)
}

/// The region whose escrow nodes client `index` goes through when every
/// client goes through one: the regions in turn.
pub fn client_region(index: usize, escrows: &[(String, usize)]) -> usize {
    let mut regions: Vec<usize> = escrows.iter().map(|(_, r)| *r).collect();
    regions.sort_unstable();
    regions.dedup();
    regions
        .get(index % regions.len().max(1))
        .copied()
        .unwrap_or(0)
}

/// Starts the observer and the clients; they run until `load_end_ms`.
#[allow(clippy::too_many_arguments)]
pub fn spawn(
    options: &ProcessOptions,
    members: &[String],
    escrows: &[(String, usize)],
    all_via_escrow: bool,
    observer_client: CoordinatorClient,
    recorder: &Recorder,
    seed: u64,
    load_start_ms: u64,
    load_end_ms: u64,
    identities: Option<&Identities>,
) -> Result<LoadTasks> {
    // Plaintext, or on mutual TLS each client with its own identity: a
    // region of its own when it leases directly, a service of the escrow
    // node's region otherwise.
    let dialer_as = |principal: Result<Principal>| -> Result<Arc<dyn Dialer>> {
        Ok(match identities {
            Some(identities) => identities.dialer(&principal?),
            None => Arc::new(TcpDialer::default()),
        })
    };
    let mut handles = Vec::new();
    {
        let recorder = recorder.clone();
        handles.push(tokio::spawn(async move {
            while wall_now_ms() < load_end_ms + 500 {
                observe_window(&observer_client, &recorder, wall_now_ms).await;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            Ok(())
        }));
    }
    for index in 0..options.clients {
        let client_seed = seed.wrapping_mul(31).wrapping_add(index as u64);
        // (A `fair` key is admitted at escrow nodes only: every client
        // goes through one — through every node of its region, starting at
        // a different one per client, moving on when one fails.)
        let via_escrow: Option<(Vec<String>, usize)> = match (escrows.is_empty(), all_via_escrow) {
            (true, _) => None,
            (false, true) => {
                let region = client_region(index, escrows);
                let mut nodes: Vec<String> = escrows
                    .iter()
                    .filter(|(_, r)| *r == region)
                    .map(|(addr, _)| addr.clone())
                    .collect();
                let turn = index / region_count(escrows) % nodes.len().max(1);
                nodes.rotate_left(turn);
                Some((nodes, region))
            }
            (false, false) => (index % 2 == 1).then(|| {
                let (addr, region) = &escrows[index / 2 % escrows.len()];
                (vec![addr.clone()], *region)
            }),
        };
        let source: Arc<dyn CreditSource> = match via_escrow {
            None => {
                let client = CoordinatorClient::with_seed(
                    members.to_vec(),
                    dialer_as(identities::region(&format!("direct-{index}")))?,
                    runner_retry_options(),
                    client_seed,
                )?;
                let region = RegionId::new(format!("direct-{index}"))?;
                Arc::new(
                    RecordingSource::new(
                        CoordinatorSource::new(client, region),
                        true,
                        recorder.clone(),
                        options.weakening,
                        options.window_ms,
                        wall_now_ms,
                    )
                    .resending_old_ids(options.resend_old_ids),
                )
            }
            Some((nodes, region)) => Arc::new(RecordingSource::new(
                EscrowSource::with_endpoints(
                    nodes,
                    dialer_as(identities::service(
                        identities::LOAD_SERVICE,
                        &format!("region-{region}"),
                    ))?,
                    EscrowSourceOptions::default(),
                )?,
                false,
                recorder.clone(),
                options.weakening,
                options.window_ms,
                wall_now_ms,
            )),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(client_seed);
        let mode = Mode::Leased(
            // Real processes, real time: the default clock reads the cycle
            // counter.
            LeaseOptions::default().with_sizing(LeaseSizing::Fixed(rng.gen_range(4..=24))),
        );
        let mut config =
            LimiterConfig::new(mode, ClientId::new(format!("c{index}-{client_seed}"))?);
        config.call_timeout = Duration::from_secs(3);
        // Seeded ids, unique per run: keep replays reproducible.
        config.fresh_incarnation = false;
        let limiter = Limiter::with_shared_source(source, config)?;
        let recorder = recorder.clone();
        let (pause_min, pause_max) = options.client_pause_ms;
        let pause_max = pause_max.max(pause_min + 1);
        handles.push(tokio::spawn(async move {
            let start = load_start_ms.saturating_sub(wall_now_ms());
            tokio::time::sleep(Duration::from_millis(start)).await;
            while wall_now_ms() < load_end_ms {
                match limiter.check_labelled(KEY, 1).await {
                    Ok(admission) => {
                        let at_ms = wall_now_ms();
                        if let (true, Some(window_start_ms)) =
                            (admission.decision.allowed, admission.window_start_ms)
                        {
                            recorder.admit(Admission {
                                client: index,
                                key: KEY,
                                cost: 1,
                                window_start_ms,
                                at_ms,
                            });
                            let pause = rng.gen_range(pause_min..pause_max);
                            tokio::time::sleep(Duration::from_millis(pause)).await;
                        } else {
                            let wait = admission.decision.retry_after_ms.clamp(5, 50);
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                        }
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
            Ok(())
        }));
    }
    Ok(LoadTasks { handles })
}
