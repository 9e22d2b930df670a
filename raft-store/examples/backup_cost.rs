//! What a backup of a state with many live windows costs: its size, the
//! time to write it (`backup_bytes`: encode and checksum) and to read it
//! back (`read_backup`: checksum and decode), and the time to write a new
//! cluster's store from it (`write_new_cluster`).
//!
//! `cargo run --release -p leasehold-raft-store --example backup_cost -- 1000000`

use std::time::Instant;

use leasehold_core::coordinator::{Command, CoordinatorState, Proposal};
use leasehold_core::ids::{ClientId, Key, RegionId, RequestId};
use leasehold_core::policy::Policy;
use leasehold_core::principal::Principal;
use leasehold_raft_store::backup::{backup_bytes, read_backup, write_new_cluster, StateOrigin};
use leasehold_raft_store::{SnapshotEnvelope, StoredMembership};
use openraft::{BasicNode, CommittedLeaderId, LogId, Membership};

fn main() {
    let windows: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let mut state = CoordinatorState::default();
    state.apply(&Proposal {
        stamp_ms: 1_000,
        commands: vec![Command::SetPolicy(Policy::counter("user/", 100, 60_000))],
    });
    let region = RegionId::new("eu").expect("region");
    let client = ClientId::new("escrow-eu-1").expect("client");
    for batch in 0..windows.div_ceil(1_000) {
        let commands = (batch * 1_000..((batch + 1) * 1_000).min(windows))
            .map(|i| Command::Lease {
                key: Key::new(format!("user/{i}")).expect("key"),
                region: region.clone(),
                tokens: 7,
                request_id: Some(RequestId {
                    client: client.clone(),
                    seq: i + 1,
                }),
                caller: Principal::Region(region.clone()),
            })
            .collect();
        state.apply(&Proposal {
            stamp_ms: 2_000,
            commands,
        });
    }
    let membership = Membership::new(
        vec![[1u64, 2, 3].into()],
        [1u64, 2, 3]
            .into_iter()
            .map(|id| (id, BasicNode::new(format!("m{id}:7100"))))
            .collect::<std::collections::BTreeMap<_, _>>(),
    );
    let last = LogId::new(CommittedLeaderId::new(3, 1), windows / 1_000 + 2);
    let envelope = SnapshotEnvelope {
        last_applied: Some(last),
        membership: StoredMembership::new(Some(last), membership),
        state,
        retired_members: Default::default(),
    };
    let started = Instant::now();
    let bytes = backup_bytes(&envelope).expect("encode");
    let written = started.elapsed();
    let started = Instant::now();
    let read = read_backup(&bytes).expect("read back");
    let read_time = started.elapsed();
    assert_eq!(read.state.live_windows(), windows);
    let dir = tempfile::tempdir().expect("temp dir");
    let started = Instant::now();
    write_new_cluster(dir.path(), read, 4, "m4:7100", 10_000, StateOrigin::Backup)
        .expect("new cluster");
    let restored = started.elapsed();
    println!(
        "{windows} live windows (with a session entry each): backup {} bytes ({:.0} B/window); \
         backup_bytes {:.0} ms, read_backup {:.0} ms, write_new_cluster {:.0} ms",
        bytes.len(),
        bytes.len() as f64 / windows as f64,
        written.as_secs_f64() * 1e3,
        read_time.as_secs_f64() * 1e3,
        restored.as_secs_f64() * 1e3
    );
}
