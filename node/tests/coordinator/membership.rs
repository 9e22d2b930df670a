//! Membership changes as an operator sees them: which members hold a
//! change when the leader answers.

use std::time::Duration;

use anyhow::{ensure, Context, Result};

use crate::harness::Cluster;

/// A change that removes member X while member Y is down commits (a quorum
/// holds it) and names Y as not holding it yet — until Y does, Y would
/// still accept X's Raft messages (docs/security.md). Once Y is back it
/// receives the change, and a change with every member up names none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_membership_change_names_the_members_that_do_not_hold_it_yet() -> Result<()> {
    let mut cluster = Cluster::start_initialised(4, |_| {}).await?;
    let leader = cluster.leader().await?;
    let others: Vec<u64> = (1..=4).filter(|id| *id != leader).collect();
    let (removed, down, up) = (others[0], others[1], others[2]);
    cluster.stop(down).await?;
    let voters = [leader, down, up];
    let change = cluster
        .admin_of(leader)?
        .change_membership(&voters, false)
        .await?;
    ensure!(
        change.lagging_member_ids == vec![down],
        "member {down} is down, member {removed} was removed: {change:?}"
    );
    cluster.restart(down).await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held = cluster
            .status(down)
            .await
            .is_ok_and(|status| status.last_log_index >= change.log_index);
        if held {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "member {down} never received the change"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let again = cluster
        .admin_of(leader)?
        .change_membership(&[leader, up], false)
        .await
        .context("removing the member that was down")?;
    ensure!(again.lagging_member_ids.is_empty(), "{again:?}");
    Ok(())
}
