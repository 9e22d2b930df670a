//! A whole region fleet for a `counter` key, in-process and deterministic:
//! K regions, each the key machine an escrow node runs (`KeyMachine`, fed
//! and performed as the node's key actor does), leasing from the real
//! coordinator state machine over a seeded network that delays, reorders and
//! loses messages; many clients spending credits; random lease sizes (a
//! fixed batch or the EOQ learner, drawn per region); idle keys evicted,
//! handing their credits back early, and started afresh; each region's
//! monotonic clock unrelated to the coordinator's epoch clock. An oracle
//! sums every admission per window.

mod fleet_support;

use fleet_support::region::{config, credits, Call, Region};
use fleet_support::{Admissions, Coordinator, Network, Rng};
use leasehold_core::coordinator::CommandError;
use leasehold_core::escrow::machine::{Action, Event, Now};
use leasehold_core::escrow::LeaseTicket;
use leasehold_core::policy::PolicyKind;
use leasehold_core::sizer::{EoqParams, EoqSizer, LeaseSizer};
use leasehold_core::static_partition::{admitted_under, static_partition};
use proptest::prelude::*;

const WINDOW_MS: u64 = 1_000;
const T0: u64 = 1_700_000_000_000;
/// How long a region waits for a grant before giving the lease up (an RPC deadline).
const LEASE_DEADLINE_MS: u64 = 60;

/// What travels between a region's key (one incarnation of it: an evicted
/// key's late answers are not fed to its successor) and the coordinator.
enum Message {
    Call {
        region: usize,
        incarnation: u64,
        call: Call,
    },
    Answer {
        region: usize,
        incarnation: u64,
        event: Event<CommandError>,
    },
}

struct Scenario {
    k: usize,
    limit: u64,
    windows: u64,
    max_delay_ms: u64,
    loss_percent: u64,
    idle_return_percent: u64,
    /// Chance per tick (about 1 ms) that clients send a burst of 1..=4 requests.
    request_percent: u64,
}

/// One region's key and the lease it waits on.
struct Node {
    key: Region,
    incarnation: u64,
    /// Region clock = offset + the simulation's clock.
    offset: u64,
    outstanding: Option<LeaseTicket>,
}

/// A lease sizer as a node may be configured with: a fixed batch or the
/// EOQ learner, with random sizes.
fn random_sizer(rng: &mut Rng) -> LeaseSizer {
    let size = 1 + rng.below(40);
    if rng.chance(50) {
        return LeaseSizer::Fixed(size);
    }
    let sizer = EoqSizer::new(EoqParams {
        initial_size: size,
        max_size: size + rng.below(200),
        ..EoqParams::default()
    })
    .expect("valid parameters");
    LeaseSizer::Eoq(sizer)
}

struct Sim<'a> {
    s: &'a Scenario,
    rng: Rng,
    coordinator: Coordinator,
    /// Coordinator clock = T0 + skew + the simulation's clock.
    skew: u64,
    nodes: Vec<Node>,
    network: Network<Message>,
    /// Per region.
    out: Admissions<usize>,
}

impl<'a> Sim<'a> {
    fn new(seed: u64, s: &'a Scenario) -> Self {
        let mut rng = Rng::new(seed);
        let coordinator = Coordinator::new(s.limit, WINDOW_MS, PolicyKind::Counter, T0);
        let skew = rng.below(50);
        let nodes = (0..s.k)
            .map(|_| {
                let offset = rng.below(1 << 40);
                let config = config(random_sizer(&mut rng), 0);
                let key = Region::new(config, coordinator.policy.clone(), offset);
                Node {
                    key,
                    incarnation: 0,
                    offset,
                    outstanding: None,
                }
            })
            .collect();
        Sim {
            s,
            rng,
            coordinator,
            skew,
            nodes,
            network: Network::default(),
            out: Admissions::default(),
        }
    }

    fn at(&self, region: usize, now: u64) -> Now {
        Now {
            mono_ms: self.nodes[region].offset + now,
            wall_ms: T0 + now,
        }
    }

    fn send(&mut self, now: u64, message: Message) {
        if !self.rng.chance(self.s.loss_percent) {
            let at = now + self.rng.below(self.s.max_delay_ms + 1);
            self.network.send(at, message);
        }
    }

    /// Sends region `region`'s calls and counts the answers it gave.
    fn performed(&mut self, region: usize, calls: Vec<Call>, now: u64) {
        let incarnation = self.nodes[region].incarnation;
        for call in calls {
            if let Action::SendLease(ticket) = call {
                self.nodes[region].outstanding = Some(ticket);
            }
            let message = Message::Call {
                region,
                incarnation,
                call,
            };
            self.send(now, message);
        }
        let coordinator_now = T0 + self.skew + now;
        for (_, answer) in self.nodes[region].key.take_answers() {
            if let Some(served) = credits(&answer) {
                self.out.record(region, &served, coordinator_now);
            }
        }
    }

    fn deliver(&mut self, now: u64) {
        for message in self.network.due(now) {
            match message {
                Message::Call {
                    region,
                    incarnation,
                    call,
                } => {
                    let stamp = T0 + self.skew + now;
                    if let Some(event) = self.coordinator.answer(region, &call, stamp) {
                        let message = Message::Answer {
                            region,
                            incarnation,
                            event,
                        };
                        self.send(now, message);
                    }
                }
                Message::Answer {
                    region,
                    incarnation,
                    event,
                } if incarnation == self.nodes[region].incarnation => {
                    if let Event::LeaseGranted { ticket, .. } | Event::LeaseRefused { ticket, .. } =
                        &event
                    {
                        let node = &mut self.nodes[region];
                        if node.outstanding.map(|t| t.id) == Some(*ticket) {
                            node.outstanding = None;
                        }
                    }
                    let at = self.at(region, now);
                    let calls = self.nodes[region].key.feed(event, at);
                    self.performed(region, calls, now);
                }
                Message::Answer { .. } => {}
            }
        }
    }

    /// Gives up leases past their deadline; evicts idle keys at random,
    /// which hand their credits back and are started afresh.
    fn housekeep(&mut self, now: u64) {
        for region in 0..self.s.k {
            let at = self.at(region, now);
            let node = &mut self.nodes[region];
            // A lease unanswered past its deadline is given up.
            if let Some(ticket) = node.outstanding {
                if at.mono_ms >= ticket.sent_at_ms + LEASE_DEADLINE_MS {
                    node.outstanding = None;
                    let calls = node.key.feed(Event::LeaseFailed { ticket: ticket.id }, at);
                    self.performed(region, calls, now);
                }
            }
            if self.rng.chance(self.s.idle_return_percent)
                && self.nodes[region].key.machine().is_idle()
            {
                let calls = self.nodes[region].key.shutdown(at);
                self.performed(region, calls, now);
                let sizer = random_sizer(&mut self.rng);
                let policy = self.coordinator.policy.clone();
                let node = &mut self.nodes[region];
                node.key = Region::new(config(sizer, 0), policy, at.mono_ms);
                node.incarnation += 1;
                node.outstanding = None;
            }
        }
    }

    /// Runs the scenario; `pick_region(rng, k)` picks the region of each request.
    fn run(mut self, pick_region: impl Fn(&mut Rng, usize) -> usize) -> Admissions<usize> {
        let end = self.s.windows * WINDOW_MS;
        let mut now = 0;
        while now < end {
            now += self.rng.below(3);
            self.deliver(now);
            self.housekeep(now);
            // A burst of client requests.
            let burst = if self.rng.chance(self.s.request_percent) {
                1 + self.rng.below(4)
            } else {
                0
            };
            for _ in 0..burst {
                let region = pick_region(&mut self.rng, self.s.k);
                let cost = 1 + self.rng.below(3);
                let at = self.at(region, now);
                let (_, calls) = self.nodes[region].key.acquire(None, 1, cost, at);
                self.performed(region, calls, now);
            }
        }
        self.out
    }
}

fn run(
    seed: u64,
    s: &Scenario,
    pick_region: impl Fn(&mut Rng, usize) -> usize,
) -> Admissions<usize> {
    Sim::new(seed, s).run(pick_region)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Δ = 0 for K ∈ {1, 2, 4, 8}: random interleavings, delays, losses,
    /// lease sizes, evictions and clock offsets.
    #[test]
    fn no_window_admits_more_than_the_limit(
        seed in any::<u64>(),
        k_index in 0usize..4,
        limit in 20u64..400,
        max_delay_ms in 0u64..80,
        loss_percent in 0u64..15,
        idle_return_percent in 0u64..5,
        request_percent in 1u64..=100,
    ) {
        let k = [1, 2, 4, 8][k_index];
        let scenario = Scenario { k, limit, windows: 4, max_delay_ms, loss_percent, idle_return_percent, request_percent };
        let out = run(seed, &scenario, |rng, k| rng.below(k as u64) as usize);
        for (window, admitted) in &out.totals() {
            prop_assert!(*admitted <= limit, "window {}: {} > {} with K = {}", window, admitted, limit, k);
        }
        prop_assert_eq!(out.late, 0);
    }
}

#[test]
fn under_full_skew_the_hot_region_uses_the_whole_budget() {
    for k in [1usize, 2, 4, 8] {
        let limit = 200;
        // One-way delays up to 10 ms, no loss: the boundary dip (a round
        // trip per window) stays under 5 % of a 1 s window.
        let scenario = Scenario {
            k,
            limit,
            windows: 5,
            max_delay_ms: 10,
            loss_percent: 0,
            idle_return_percent: 0,
            request_percent: 100,
        };
        let out = run(7 + k as u64, &scenario, |_, _| 0);
        let regions: Vec<_> = (0..k).map(fleet_support::region).collect();
        let slices = static_partition(limit, &regions).unwrap();
        let mut demand = vec![0; k];
        demand[0] = u64::MAX;
        let static_admits = admitted_under(&slices, &demand);
        // Skip the first window (the run starts mid-window) and the last.
        let windows: Vec<u64> = out.totals().values().copied().collect();
        for admitted in &windows[1..windows.len() - 1] {
            assert!(
                *admitted * 100 >= limit * 95,
                "K = {k}: {admitted} of {limit}"
            );
            // A static partition caps the hot region at its slice, ⌈L/K⌉.
            assert!(k == 1 || *admitted > static_admits, "K = {k}");
        }
    }
}
