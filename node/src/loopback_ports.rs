//! Loopback ports for the clusters that tests and local tools start as
//! separate processes on one host, where a port must be chosen before the
//! process that listens on it exists.
//!
//! Asking the kernel for port 0 and releasing it is not enough there. The
//! port lies in the kernel's ephemeral range, so any outgoing connection may
//! take it before the member binds it, or again while a killed member is
//! down and is to come back on the same port. And two test processes running
//! side by side may each be handed the same released port, so a member of
//! one cluster listens where another cluster expects one of its own.
//!
//! So ports are taken from below the ephemeral range (read from
//! `/proc/sys/net/ipv4/ip_local_port_range`, 32768 when it cannot be read),
//! where the kernel never hands any out. That range is cut into blocks of
//! [`BLOCK_LEN`] ports; each process takes ports only from its own block, so
//! processes running at the same time never pick the same port. The block is
//! the test's slot when nextest runs it (`NEXTEST_TEST_GLOBAL_SLOT`, unique
//! among the tests running at a time), or else one derived from the process
//! id. Within its block a process hands out each port once, in turn, from a
//! point of its own, and only ports it can bind right now.

use std::io;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The lowest port handed out (well above the well-known and most
/// registered service ports a developer's machine runs).
pub const FIRST_PORT: u16 = 10_000;

/// How many ports one process may take from.
pub const BLOCK_LEN: u16 = 512;

/// Where the kernel's ephemeral ports start when it does not say.
const DEFAULT_EPHEMERAL_START: u16 = 32_768;

/// The range `[first, end)` this process takes its ports from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortBlock {
    /// The first port of the block.
    pub first: u16,
    /// One past the last port of the block.
    pub end: u16,
}

/// The block for the process in `slot` when ports below `ephemeral_start`
/// are free for the taking (pure: the rule the tests pin).
pub fn block_for(slot: u64, ephemeral_start: u16) -> PortBlock {
    let end_of_range = ephemeral_start.max(FIRST_PORT + BLOCK_LEN);
    let blocks = u64::from((end_of_range - FIRST_PORT) / BLOCK_LEN).max(1);
    let index = u16::try_from(slot % blocks).unwrap_or(0);
    let first = FIRST_PORT + index * BLOCK_LEN;
    PortBlock {
        first,
        end: first + BLOCK_LEN,
    }
}

/// The first port of the kernel's ephemeral range, from the text of
/// `ip_local_port_range` ("32768\t60999"); `None` when it does not parse.
pub fn parse_ephemeral_start(text: &str) -> Option<u16> {
    text.split_whitespace().next()?.parse().ok()
}

fn ephemeral_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|text| parse_ephemeral_start(&text))
        .unwrap_or(DEFAULT_EPHEMERAL_START)
}

fn slot() -> u64 {
    std::env::var("NEXTEST_TEST_GLOBAL_SLOT")
        .ok()
        .and_then(|slot| slot.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()))
}

fn this_process_block() -> PortBlock {
    static BLOCK: OnceLock<PortBlock> = OnceLock::new();
    *BLOCK.get_or_init(|| block_for(slot(), ephemeral_start()))
}

/// Offsets into the block already handed out by this process (starting
/// from a point derived from the process id, so that the next test in the
/// same slot starts elsewhere than a previous one whose processes may
/// still be exiting).
fn next_offset() -> u32 {
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    NEXT.get_or_init(|| AtomicU32::new(std::process::id().wrapping_mul(97)))
        .fetch_add(1, Ordering::Relaxed)
}

/// A loopback port no other process of this host's test run will pick and
/// no outgoing connection will take, free right now. Each call returns
/// another port; after [`BLOCK_LEN`] calls a process may be handed one of
/// its own earlier ports again.
pub fn reserve() -> io::Result<u16> {
    reserve_run(1)
}

/// The first of `len` consecutive such ports, all free right now.
pub fn reserve_run(len: u16) -> io::Result<u16> {
    let block = this_process_block();
    if len == 0 || len > BLOCK_LEN {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("a run of {len} ports does not fit a block of {BLOCK_LEN}"),
        ));
    }
    let starts = u32::from(BLOCK_LEN - len + 1);
    for _ in 0..BLOCK_LEN {
        let offset = u16::try_from(next_offset() % starts).unwrap_or(0);
        let base = block.first + offset;
        if (base..base + len).all(|port| TcpListener::bind(("127.0.0.1", port)).is_ok()) {
            // Later calls move past the whole run.
            for _ in 1..len {
                next_offset();
            }
            return Ok(base);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "no free run of {len} loopback ports in {}..{}",
            block.first, block.end
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn blocks_lie_below_the_ephemeral_range_and_differ_between_slots(
            a in 0u64..10_000,
            b in 0u64..10_000,
            start in (FIRST_PORT + BLOCK_LEN)..=u16::MAX,
        ) {
            let (block_a, block_b) = (block_for(a, start), block_for(b, start));
            prop_assert!(block_a.first >= FIRST_PORT);
            prop_assert!(block_a.end <= start);
            prop_assert_eq!(block_a.end - block_a.first, BLOCK_LEN);
            let blocks = u64::from((start - FIRST_PORT) / BLOCK_LEN);
            if a % blocks != b % blocks {
                prop_assert!(block_a.end <= block_b.first || block_b.end <= block_a.first);
            }
        }
    }

    #[test]
    fn a_tiny_range_still_yields_a_block_above_the_first_port() {
        let block = block_for(5, 1_024);
        assert_eq!(block.first, FIRST_PORT);
        assert_eq!(block.end, FIRST_PORT + BLOCK_LEN);
    }

    #[test]
    fn the_kernels_range_is_read_from_its_first_number() {
        assert_eq!(parse_ephemeral_start("32768\t60999\n"), Some(32_768));
        assert_eq!(parse_ephemeral_start("1024 65535"), Some(1_024));
        assert_eq!(parse_ephemeral_start(""), None);
        assert_eq!(parse_ephemeral_start("lots"), None);
    }

    #[test]
    fn reserved_ports_are_distinct_free_and_in_this_process_block() {
        let block = this_process_block();
        let ports: Vec<u16> = (0..20).map(|_| reserve().unwrap()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        for port in &ports {
            assert!((block.first..block.end).contains(port), "{port} {block:?}");
        }
        let base = reserve_run(6).unwrap();
        assert!(base + 6 <= block.end);
        for port in base..base + 6 {
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
        assert!(reserve_run(0).is_err());
        assert!(reserve_run(BLOCK_LEN + 1).is_err());
    }
}
