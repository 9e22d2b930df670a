//! An exhaustive model check of the protocol between escrow node processes
//! and the coordinator for one key: pool grants and releases (`fair`
//! keys), leases and reconciles (`counter` keys), under message loss,
//! duplication (resends of a request, the coordinator answering each from
//! its exactly-once cache) and reordering, escrow processes that lose
//! their memory and restart, two processes serving one region at once, and
//! windows that end. Every reachable state of a small world is visited
//! (stateright's breadth-first checker) and must keep `Σ admitted ≤ L` in
//! every window, summed over every process that ever ran.
//!
//! The model drives the real rules: the coordinator's pool grant and
//! retirement ([`next_grant`], [`retire`]) and each process's ledger of
//! what it holds ([`PoolHolding`]). Pointed at the rule before holdings —
//! a process spends the region's total a grant answers — the checker finds
//! the double spend of a restarted process.

use std::collections::{BTreeMap, BTreeSet};

use leasehold_core::escrow::PoolHolding;
use leasehold_core::pool::fair_pool::{next_grant, retire, PoolMember};
use leasehold_core::window::WindowBounds;
use stateright::{Checker, Model, Property};

/// The key's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Fair,
    Counter,
}

/// What a process may spend of a `fair` key's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SpendRule {
    /// What its own calls were granted, less what it released.
    OwnHolding,
    /// The region's total the latest answer carried (the rule before
    /// holdings: wrong as soon as a region has had two processes).
    RegionTotal,
}

/// A small world, checked exhaustively.
struct PoolModel {
    kind: Kind,
    rule: SpendRule,
    limit: u64,
    regions: usize,
    /// Per process slot, the region it serves (two slots may share one).
    slots: Vec<u8>,
    /// Memory losses in all (a slot's process replaced by a new one).
    losses: u8,
    /// Calls each process makes at most.
    calls: u8,
    /// Windows the world lives through.
    windows: u8,
}

/// A process: slot · 4 + incarnation.
type Pid = u8;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Released {
    /// `released` tokens went back; the region's total is `total`.
    Applied { released: u64, total: u64 },
    /// Not applied: the region's total is `total`.
    Stale { total: u64 },
    /// Not applied: the window is over (or, for a reconcile, the region's
    /// window was reconciled already).
    Nothing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Msg {
    /// A pool grant asking for the region's total `want` (`fair`), or a
    /// lease of `want` tokens (`counter`).
    Ask {
        from: Pid,
        seq: u8,
        region: u8,
        want: u64,
    },
    /// A pool release `from_total → keep_total` (`fair`), or a reconcile of
    /// `from_total − keep_total` leftover tokens (`counter`), in `window`.
    Release {
        from: Pid,
        seq: u8,
        region: u8,
        window: u8,
        from_total: u64,
        keep_total: u64,
    },
    /// The answer of an ask.
    Granted {
        to: Pid,
        seq: u8,
        window: u8,
        total: u64,
        increment: u64,
    },
    /// The answer of a release.
    ReleaseAnswer { to: Pid, seq: u8, answer: Released },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Process {
    pid: Pid,
    holding: PoolHolding,
    /// Admitted in the holding's window.
    spent: u64,
    /// The call in flight, resent as it is until answered.
    pending: Option<Msg>,
    /// While a release is pending (and, for a reconcile, for the rest of
    /// the window): what may be spent at most.
    cap: Option<u64>,
    next_seq: u8,
}

impl Process {
    fn new(pid: Pid) -> Self {
        Process {
            pid,
            holding: PoolHolding::new(),
            spent: 0,
            pending: None,
            cap: None,
            next_seq: 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct World {
    window: u8,
    /// Per region, (weight, total) in the live window (`counter`: weight
    /// unused, total = leased − credited).
    pool: Vec<(u64, u64)>,
    /// `counter`: the regions that reconciled the live window.
    reconciled: BTreeSet<u8>,
    /// The coordinator's exactly-once answers per (process, seq).
    answered: BTreeMap<(Pid, u8), Msg>,
    net: BTreeSet<Msg>,
    processes: Vec<Process>,
    losses_left: u8,
    /// The oracle: admitted per window, over every process that ran.
    admitted: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Step {
    /// Ask for `more` than the process holds.
    Ask {
        slot: usize,
        more: u64,
    },
    Release {
        slot: usize,
    },
    Resend {
        slot: usize,
    },
    /// A failed ask given up (its answer, if it comes, is not read).
    GiveUp {
        slot: usize,
    },
    Spend {
        slot: usize,
    },
    Deliver(Msg),
    /// The slot's process loses its memory; a new one takes its place.
    Restart {
        slot: usize,
    },
    EndWindow,
}

impl World {
    /// Drops what no step can read any more, so that worlds that differ
    /// only there are one: answers no process waits for, and cached
    /// answers of requests that can no longer arrive (not in flight, and
    /// no process will resend them).
    fn forget_the_unreadable(&mut self) {
        let waiting: BTreeSet<(Pid, u8)> = self
            .processes
            .iter()
            .filter_map(|p| match p.pending {
                Some(Msg::Ask { seq, .. }) | Some(Msg::Release { seq, .. }) => Some((p.pid, seq)),
                _ => None,
            })
            .collect();
        self.net.retain(|msg| match msg {
            Msg::Granted { to, seq, .. } | Msg::ReleaseAnswer { to, seq, .. } => {
                waiting.contains(&(*to, *seq))
            }
            _ => true,
        });
        let in_flight: BTreeSet<(Pid, u8)> = self
            .net
            .iter()
            .filter_map(|msg| match msg {
                Msg::Ask { from, seq, .. } | Msg::Release { from, seq, .. } => Some((*from, *seq)),
                _ => None,
            })
            .collect();
        self.answered
            .retain(|id, _| waiting.contains(id) || in_flight.contains(id));
    }
}

fn bounds(window: u8) -> WindowBounds {
    let start_ms = u64::from(window) * 100;
    WindowBounds {
        start_ms,
        end_ms: start_ms + 100,
    }
}

impl PoolModel {
    /// What process `p` may still admit in the live `window`.
    fn spendable(&self, p: &Process, window: u8) -> u64 {
        if p.holding.window() != Some(bounds(window)) {
            return 0;
        }
        let held = match self.rule {
            SpendRule::OwnHolding => p.holding.own(),
            SpendRule::RegionTotal => p.holding.region_total(),
        };
        p.cap.map_or(held, |cap| cap.min(held))
    }

    /// The coordinator applies `request` (once per (process, seq)).
    fn apply(&self, world: &mut World, request: Msg) -> Msg {
        let (from, seq) = match request {
            Msg::Ask { from, seq, .. } | Msg::Release { from, seq, .. } => (from, seq),
            answer => return answer,
        };
        if let Some(answer) = world.answered.get(&(from, seq)) {
            return *answer;
        }
        let answer = match request {
            Msg::Ask { region, want, .. } => {
                let r = usize::from(region);
                let current = world.pool[r].1;
                let total = match self.kind {
                    Kind::Fair => {
                        let others = world.pool.iter().enumerate().filter(|(i, _)| *i != r).map(
                            |(_, (weight, granted))| PoolMember {
                                weight: *weight,
                                granted: *granted,
                            },
                        );
                        let asker = PoolMember {
                            weight: 1,
                            granted: current,
                        };
                        let total = next_grant(self.limit, asker, want, others);
                        world.pool[r].0 = 1;
                        total
                    }
                    Kind::Counter => {
                        let held: u64 = world.pool.iter().map(|(_, g)| g).sum();
                        current + want.min(self.limit - held)
                    }
                };
                world.pool[r].1 = total;
                Msg::Granted {
                    to: from,
                    seq,
                    window: world.window,
                    total,
                    increment: total - current,
                }
            }
            Msg::Release {
                region,
                window,
                from_total,
                keep_total,
                ..
            } => {
                let r = usize::from(region);
                let answer = if window != world.window {
                    Released::Nothing
                } else {
                    match self.kind {
                        Kind::Fair => {
                            let (weight, granted) = world.pool[r];
                            match retire(PoolMember { weight, granted }, from_total, keep_total) {
                                Some(member) => {
                                    world.pool[r] = (member.weight, member.granted);
                                    Released::Applied {
                                        released: from_total - keep_total,
                                        total: member.granted,
                                    }
                                }
                                None => Released::Stale { total: granted },
                            }
                        }
                        Kind::Counter => {
                            if world.reconciled.insert(region) {
                                let credited = (from_total - keep_total).min(world.pool[r].1);
                                world.pool[r].1 -= credited;
                                Released::Applied {
                                    released: credited,
                                    total: world.pool[r].1,
                                }
                            } else {
                                Released::Nothing
                            }
                        }
                    }
                };
                Msg::ReleaseAnswer {
                    to: from,
                    seq,
                    answer,
                }
            }
            _ => unreachable!(),
        };
        world.answered.insert((from, seq), answer);
        answer
    }

    /// Process `slot` reads `answer`, if it is the answer of its call in
    /// flight.
    fn read(&self, world: &mut World, answer: Msg) {
        let (to, seq) = match answer {
            Msg::Granted { to, seq, .. } | Msg::ReleaseAnswer { to, seq, .. } => (to, seq),
            _ => return,
        };
        let Some(p) = world.processes.iter_mut().find(|p| p.pid == to) else {
            return; // its process is gone
        };
        let waiting = match p.pending {
            Some(Msg::Ask { seq: s, .. }) | Some(Msg::Release { seq: s, .. }) => s == seq,
            _ => false,
        };
        if !waiting {
            return;
        }
        p.pending = None;
        match answer {
            Msg::Granted {
                window,
                total,
                increment,
                ..
            } => {
                let before = p.holding.window();
                if p.holding.on_grant(bounds(window), total, increment)
                    && before != Some(bounds(window))
                {
                    p.spent = 0;
                    p.cap = None;
                }
            }
            Msg::ReleaseAnswer { answer, .. } => {
                if self.kind == Kind::Fair {
                    match answer {
                        Released::Applied { released, total } => {
                            p.holding.on_released(released, total)
                        }
                        Released::Stale { total } => p.holding.on_stale(total),
                        Released::Nothing => {}
                    }
                    p.cap = None;
                } else if let Released::Applied { released, total } = answer {
                    p.holding.on_released(released, total);
                }
            }
            _ => {}
        }
    }
}

impl Model for PoolModel {
    type State = World;
    type Action = Step;

    fn init_states(&self) -> Vec<World> {
        vec![World {
            window: 0,
            pool: vec![(0, 0); self.regions],
            reconciled: BTreeSet::new(),
            answered: BTreeMap::new(),
            net: BTreeSet::new(),
            processes: (0..self.slots.len())
                .map(|slot| Process::new(slot as u8 * 4))
                .collect(),
            losses_left: self.losses,
            admitted: vec![0; usize::from(self.windows)],
        }]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Step>) {
        for (slot, p) in world.processes.iter().enumerate() {
            match p.pending {
                None if p.next_seq < self.calls => {
                    actions.push(Step::Ask { slot, more: 1 });
                    actions.push(Step::Ask {
                        slot,
                        more: self.limit,
                    });
                    let holds_unspent = p.holding.window() == Some(bounds(world.window))
                        && p.holding.own() > p.spent
                        && p.cap.is_none();
                    if holds_unspent {
                        actions.push(Step::Release { slot });
                    }
                }
                None => {}
                Some(msg) => {
                    if !world.net.contains(&msg) {
                        actions.push(Step::Resend { slot });
                    }
                    if matches!(msg, Msg::Ask { .. }) {
                        actions.push(Step::GiveUp { slot });
                    }
                }
            }
            if p.spent < self.spendable(p, world.window) {
                actions.push(Step::Spend { slot });
            }
            // (A process that has made no call yet loses nothing.)
            if world.losses_left > 0 && p.next_seq > 0 {
                actions.push(Step::Restart { slot });
            }
        }
        // A lost message is one never delivered: it stays in flight, and
        // may as well arrive late.
        for msg in &world.net {
            actions.push(Step::Deliver(*msg));
        }
        if world.window + 1 < self.windows {
            actions.push(Step::EndWindow);
        }
    }

    fn next_state(&self, last: &World, step: Step) -> Option<World> {
        let mut world = last.clone();
        match step {
            Step::Ask { slot, more } => {
                let region = self.slots[slot];
                let p = &mut world.processes[slot];
                let own_want = p.holding.own().saturating_add(more).min(self.limit);
                let want = match self.kind {
                    Kind::Fair => p.holding.wire_want(own_want).min(self.limit),
                    Kind::Counter => more,
                };
                let msg = Msg::Ask {
                    from: p.pid,
                    seq: p.next_seq,
                    region,
                    want,
                };
                p.next_seq += 1;
                p.pending = Some(msg);
                world.net.insert(msg);
            }
            Step::Release { slot } => {
                let region = self.slots[slot];
                let p = &mut world.processes[slot];
                let others = p.holding.others();
                let msg = Msg::Release {
                    from: p.pid,
                    seq: p.next_seq,
                    region,
                    window: world.window,
                    from_total: p.holding.own() + others,
                    keep_total: p.spent + others,
                };
                p.next_seq += 1;
                p.pending = Some(msg);
                // Spend no more than kept until answered (a reconcile: for
                // the rest of the window).
                p.cap = Some(p.spent);
                world.net.insert(msg);
            }
            Step::Resend { slot } => {
                let msg = world.processes[slot].pending?;
                world.net.insert(msg);
            }
            Step::GiveUp { slot } => world.processes[slot].pending = None,
            Step::Spend { slot } => {
                let p = &mut world.processes[slot];
                let window = p.holding.window()?;
                p.spent += 1;
                let w = usize::try_from(window.start_ms / 100).ok()?;
                world.admitted[w] += 1;
            }
            Step::Deliver(msg) => {
                world.net.remove(&msg);
                match msg {
                    Msg::Ask { .. } | Msg::Release { .. } => {
                        let answer = self.apply(&mut world, msg);
                        world.net.insert(answer);
                    }
                    answer => self.read(&mut world, answer),
                }
            }
            Step::Restart { slot } => {
                world.losses_left -= 1;
                let old = world.processes[slot].pid;
                world.processes[slot] = Process::new(old + 1);
            }
            Step::EndWindow => {
                world.window += 1;
                world.pool = vec![(0, 0); self.regions];
                world.reconciled.clear();
            }
        }
        world.forget_the_unreadable();
        Some(world)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no window admits more than L",
                |model: &PoolModel, world: &World| world.admitted.iter().all(|a| *a <= model.limit),
            ),
            Property::sometimes(
                "a window admits all of L",
                |model: &PoolModel, world: &World| world.admitted.contains(&model.limit),
            ),
            Property::sometimes(
                "a restarted process admits",
                |model: &PoolModel, world: &World| {
                    model.losses == 0
                        || world.processes.iter().any(|p| p.pid % 4 > 0 && p.spent > 0)
                },
            ),
        ]
    }
}

/// Checks `model` exhaustively (every property must hold, the `sometimes`
/// ones reached); returns the unique states visited.
fn run(model: PoolModel, what: &str) -> usize {
    let checker = model.checker().threads(2).spawn_bfs().join();
    checker.assert_properties();
    let states = checker.unique_state_count();
    println!("{what}: {states} unique states");
    states
}

/// A world of `kind` with L = 2 under the holdings rule.
fn world(
    kind: Kind,
    regions: usize,
    slots: Vec<u8>,
    losses: u8,
    calls: u8,
    windows: u8,
) -> PoolModel {
    PoolModel {
        kind,
        rule: SpendRule::OwnHolding,
        limit: 2,
        regions,
        slots,
        losses,
        calls,
        windows,
    }
}

#[test]
fn fair_a_process_that_loses_its_memory_and_its_successor_admit_at_most_l() {
    let states = run(
        world(Kind::Fair, 1, vec![0], 1, 3, 1),
        "fair: 1 region, 1 process, 1 restart, 3 calls",
    );
    assert!(states > 100_000, "the model explores: {states}");
    run(
        world(Kind::Fair, 1, vec![0], 1, 2, 2),
        "fair: 1 region, 1 process, 1 restart, 2 calls, 2 windows",
    );
}

#[test]
fn fair_two_processes_serving_one_region_admit_at_most_l() {
    run(
        world(Kind::Fair, 1, vec![0, 0], 0, 2, 1),
        "fair: 1 region, 2 processes, 2 calls",
    );
}

#[test]
fn fair_regions_sharing_the_pool_admit_at_most_l() {
    run(
        world(Kind::Fair, 2, vec![0, 1], 0, 2, 1),
        "fair: 2 regions, 2 calls",
    );
    run(
        world(Kind::Fair, 3, vec![0, 1, 2], 0, 1, 1),
        "fair: 3 regions, 1 call",
    );
}

#[test]
fn counter_processes_that_restart_or_share_a_region_admit_at_most_l() {
    run(
        world(Kind::Counter, 1, vec![0], 1, 2, 2),
        "counter: 1 region, 1 process, 1 restart, 2 calls, 2 windows",
    );
    run(
        world(Kind::Counter, 1, vec![0, 0], 0, 2, 2),
        "counter: 1 region, 2 processes, 2 calls, 2 windows",
    );
}

/// The rule before holdings, pointed at by the checker: a process spends
/// the region's total its grant answers. A restart, or a second process of
/// the region, admits past L.
#[test]
fn the_rule_before_holdings_admits_past_l() {
    for (slots, losses, what) in [
        (vec![0], 1, "a restart"),
        (vec![0, 0], 0, "a second process"),
    ] {
        let model = PoolModel {
            rule: SpendRule::RegionTotal,
            ..world(Kind::Fair, 1, slots, losses, 2, 1)
        };
        let checker = model.checker().threads(2).spawn_bfs().join();
        let path = checker
            .discovery("no window admits more than L")
            .unwrap_or_else(|| panic!("{what}: the old rule over-admits"));
        let last = path.last_state().clone();
        assert!(last.admitted[0] > 2, "{what}: {last:?}");
        println!(
            "the rule before holdings, {what}: over-admits in {} steps",
            path.into_actions().len()
        );
    }
}
