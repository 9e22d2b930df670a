//! The holder rules: nothing returned exceeds what was handed out, and
//! Acquire/Return run once per (holder, request id), for any sequence of
//! acquisitions and (possibly hostile) returns by any holders.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::escrow::{CoordinatorGrant, RegionEscrow, Served};
use crate::ids::RegionId;
use crate::policy::OutagePolicy;

const WINDOW_MS: u64 = 1_000;

fn holder(principal: Principal, client: &str) -> Holder {
    Holder {
        principal,
        client: ClientId::new(client).expect("valid client id"),
    }
}

fn service(name: &str) -> Principal {
    Principal::Service {
        name: name.into(),
        region: RegionId::new("eu").expect("valid region"),
    }
}

/// A region escrow and the book of its holders, driven the way the node's
/// key actor drives them.
struct Desk {
    escrow: RegionEscrow,
    book: HolderBook<Option<Served>>,
}

impl Desk {
    fn new(limits: HolderLimits) -> Self {
        Desk {
            escrow: RegionEscrow::new(1, 1, OutagePolicy::FailClosed),
            book: HolderBook::new(limits),
        }
    }

    /// The coordinator grants `tokens` for the window containing `now`.
    fn grant(&mut self, tokens: u64, now: u64) -> u64 {
        self.try_grant(tokens, now).expect("the escrow asks")
    }

    /// Like [`Desk::grant`], but `None` when the escrow does not ask (it
    /// was told this window is exhausted).
    fn try_grant(&mut self, tokens: u64, now: u64) -> Option<u64> {
        let start = now - now % WINDOW_MS;
        let ticket = self.escrow.send_lease(1, now)?;
        let grant = CoordinatorGrant {
            granted: tokens,
            window_start_ms: start,
            window_end_ms: start + WINDOW_MS,
            remaining_lifetime_ms: start + WINDOW_MS - now,
        };
        self.escrow.on_grant_for(ticket.id, grant, now);
        Some(start)
    }

    fn acquire(
        &mut self,
        who: &Holder,
        seq: u64,
        tokens: u64,
        now: u64,
    ) -> Result<Option<Served>, HolderRefusal> {
        match self.book.admit_acquire(who, seq, None, tokens, now)? {
            Admission::Replay(answer) => Ok(answer),
            Admission::New(ticket) => {
                let served = self.escrow.serve(tokens, now);
                let held = served.map(|s| HolderHeld {
                    tenant: None,
                    window_start_ms: s.window_start_ms,
                    tokens: s.granted,
                    deadline_ms: now + s.remaining_lifetime_ms,
                });
                self.book.record_acquire(ticket, served, held, now);
                Ok(served)
            }
        }
    }

    fn give_back(
        &mut self,
        who: &Holder,
        seq: u64,
        window_start_ms: u64,
        tokens: u64,
        now: u64,
    ) -> Result<ReturnSettled, HolderRefusal> {
        let claim = ReturnClaim {
            tenant: None,
            window_start_ms,
            tokens,
        };
        let escrow = &mut self.escrow;
        self.book.settle_return(who, seq, &claim, now, |offered| {
            escrow.take_back(offered, window_start_ms, now)
        })
    }
}

#[test]
fn a_return_of_a_million_after_acquiring_one_takes_back_one() {
    let mut desk = Desk::new(HolderLimits::default());
    let me = holder(Principal::Anonymous, "me-1");
    let start = desk.grant(100, 10);
    let served = desk.acquire(&me, 1, 1, 11).expect("admitted");
    assert_eq!(served.map(|s| s.granted), Some(1));
    let settled = desk
        .give_back(&me, 2, start, 1_000_000, 12)
        .expect("settled");
    assert_eq!(
        settled,
        ReturnSettled {
            accepted: 1,
            refused: 999_999
        }
    );
    assert_eq!(
        desk.escrow.balance(13),
        100,
        "the balance is back to the grant, no more"
    );
    assert_eq!(desk.book.counters().returns_capped, 1);
    assert_eq!(desk.book.counters().return_tokens_refused, 999_999);
}

#[test]
fn a_return_of_u64_max_never_wraps() {
    let mut desk = Desk::new(HolderLimits::default());
    let me = holder(Principal::Anonymous, "me-1");
    let start = desk.grant(100, 10);
    desk.acquire(&me, 1, 5, 11).expect("admitted");
    let settled = desk
        .give_back(&me, 2, start, u64::MAX, 12)
        .expect("settled");
    assert_eq!(settled.accepted, 5);
    assert_eq!(settled.refused, u64::MAX - 5);
    // The region-wide cap holds on its own too.
    assert_eq!(desk.escrow.take_back(u64::MAX, start, 13), 0);
    assert_eq!(desk.escrow.balance(13), 100);
}

#[test]
fn a_second_holder_cannot_return_the_first_holders_credits() {
    let mut desk = Desk::new(HolderLimits::default());
    let first = holder(service("checkout"), "checkout-a");
    let same_client_other_caller = holder(service("billing"), "checkout-a");
    let other_client = holder(service("checkout"), "checkout-b");
    let start = desk.grant(100, 10);
    desk.acquire(&first, 1, 10, 11).expect("admitted");
    for thief in [&same_client_other_caller, &other_client] {
        let settled = desk.give_back(thief, 1, start, 10, 12).expect("answered");
        assert_eq!(settled.accepted, 0, "{thief:?} holds nothing");
    }
    assert_eq!(desk.book.held_by(&first, None, start, 12), 10);
    assert_eq!(
        desk.give_back(&first, 2, start, 10, 12).map(|s| s.accepted),
        Ok(10)
    );
}

#[test]
fn a_retried_acquire_gets_the_first_answer_and_is_served_once() {
    let mut desk = Desk::new(HolderLimits::default());
    let me = holder(Principal::Anonymous, "me-1");
    desk.grant(100, 10);
    let first = desk.acquire(&me, 7, 3, 11).expect("admitted");
    let retry = desk.acquire(&me, 7, 3, 50).expect("replayed");
    assert_eq!(first, retry);
    assert_eq!(desk.escrow.counters().tokens_served, 3);
    assert_eq!(desk.book.counters().acquire_replays, 1);
}

#[test]
fn a_retry_with_another_payload_is_refused() {
    let mut desk = Desk::new(HolderLimits::default());
    let me = holder(Principal::Anonymous, "me-1");
    let start = desk.grant(100, 10);
    desk.acquire(&me, 7, 3, 11).expect("admitted");
    assert!(matches!(
        desk.acquire(&me, 7, 4, 12),
        Err(HolderRefusal::Reused { seq: 7, .. })
    ));
    // The same id as a return is another request too.
    assert!(matches!(
        desk.give_back(&me, 7, start, 3, 12),
        Err(HolderRefusal::Reused { seq: 7, .. })
    ));
    assert_eq!(desk.escrow.counters().tokens_served, 3);
}

#[test]
fn a_retried_return_takes_back_once() {
    let mut desk = Desk::new(HolderLimits::default());
    let me = holder(Principal::Anonymous, "me-1");
    let start = desk.grant(100, 10);
    desk.acquire(&me, 1, 10, 11).expect("admitted");
    let first = desk.give_back(&me, 2, start, 4, 12).expect("settled");
    let retry = desk.give_back(&me, 2, start, 4, 13).expect("replayed");
    assert_eq!(first, retry);
    assert_eq!(desk.book.held_by(&me, None, start, 13), 6);
    assert_eq!(desk.escrow.balance(13), 94);
}

#[test]
fn ids_below_what_is_remembered_are_refused_not_executed() {
    let limits = HolderLimits {
        max_answers_per_holder: 2,
        ..HolderLimits::default()
    };
    let mut desk = Desk::new(limits);
    let me = holder(Principal::Anonymous, "me-1");
    desk.grant(100, 10);
    for seq in 1..=3 {
        desk.acquire(&me, seq, 1, 11).expect("admitted");
    }
    assert!(matches!(
        desk.acquire(&me, 1, 1, 12),
        Err(HolderRefusal::Expired {
            seq: 1,
            floor: 2,
            ..
        })
    ));
    assert_eq!(desk.escrow.counters().tokens_served, 3);
    assert_eq!(desk.book.counters().refused_expired_ids, 1);
}

#[test]
fn a_full_holder_table_refuses_new_holders_until_their_windows_end() {
    let limits = HolderLimits {
        max_holders: 2,
        answer_retain_ms: 100,
        ..HolderLimits::default()
    };
    let mut desk = Desk::new(limits);
    desk.grant(100, 10);
    for i in 0..2 {
        desk.acquire(&holder(Principal::Anonymous, &format!("c{i}")), 1, 1, 11)
            .expect("admitted");
    }
    let late = holder(Principal::Anonymous, "late");
    assert_eq!(
        desk.acquire(&late, 1, 1, 12),
        Err(HolderRefusal::HoldersExhausted { max: 2 })
    );
    assert_eq!(desk.book.counters().refused_holders_exhausted, 1);
    // Their credits die at the window's end (1 000) and the answers after
    // 100 ms: the table empties and the next window's holder gets in.
    desk.grant(100, 1_500);
    assert!(desk.acquire(&late, 1, 1, 1_500).is_ok());
    assert_eq!(desk.book.holder_count(), 1);
}

#[test]
fn credits_die_with_their_window() {
    let mut desk = Desk::new(HolderLimits::default());
    let me = holder(Principal::Anonymous, "me-1");
    let start = desk.grant(100, 10);
    desk.acquire(&me, 1, 10, 11).expect("admitted");
    desk.grant(100, 1_010);
    assert_eq!(desk.book.held_by(&me, None, start, 1_010), 0);
    assert_eq!(
        desk.give_back(&me, 2, start, 10, 1_010).map(|s| s.accepted),
        Ok(0)
    );
}

#[derive(Debug, Clone)]
enum Op {
    Grant {
        tokens: u64,
    },
    Acquire {
        who: usize,
        seq: u64,
        tokens: u64,
    },
    Return {
        who: usize,
        seq: u64,
        windows_back: u64,
        tokens: u64,
    },
    Wait {
        ms: u64,
    },
}

fn hostile_amount() -> impl Strategy<Value = u64> {
    prop_oneof![
        0u64..40,
        Just(u64::MAX),
        (0u64..8).prop_map(|d| u64::MAX - d),
        any::<u64>(),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..60).prop_map(|tokens| Op::Grant { tokens }),
        (0usize..4, 0u64..12, 1u64..30).prop_map(|(who, seq, tokens)| Op::Acquire {
            who,
            seq,
            tokens
        }),
        (0usize..4, 0u64..12, 0u64..2, hostile_amount()).prop_map(
            |(who, seq, windows_back, tokens)| Op::Return {
                who,
                seq,
                windows_back,
                tokens
            }
        ),
        (1u64..700).prop_map(|ms| Op::Wait { ms }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Per window: Σ served − Σ accepted returns ≤ Σ granted; per holder
    /// and window: Σ accepted returns ≤ Σ served to it; a replayed
    /// acquisition serves nothing new; nothing panics or wraps.
    #[test]
    fn nothing_returned_exceeds_what_was_handed_out(
        ops in proptest::collection::vec(op(), 1..120),
        max_answers in 1usize..6,
    ) {
        let limits = HolderLimits {
            max_holders: 3,
            max_holders_per_principal: 1,
            max_answers_per_holder: max_answers,
            max_credit_entries_per_holder: 2,
            answer_retain_ms: 300,
        };
        let mut desk = Desk::new(limits);
        let holders = [
            holder(service("a"), "x"),
            holder(service("b"), "x"),
            holder(Principal::Anonymous, "x"),
            holder(Principal::Anonymous, "y"),
        ];
        let mut now = 1u64;
        let mut granted: BTreeMap<u64, u128> = BTreeMap::new();
        let mut served: BTreeMap<u64, u128> = BTreeMap::new();
        let mut returned: BTreeMap<u64, u128> = BTreeMap::new();
        let mut served_to: BTreeMap<(usize, u64), u128> = BTreeMap::new();
        let mut returned_by: BTreeMap<(usize, u64), u128> = BTreeMap::new();
        for op in ops {
            match op {
                Op::Grant { tokens } => {
                    if let Some(start) = desk.try_grant(tokens, now) {
                        *granted.entry(start).or_default() += u128::from(tokens);
                    }
                }
                Op::Acquire { who, seq, tokens } => {
                    let before = desk.escrow.counters().tokens_served;
                    let replays = desk.book.counters().acquire_replays;
                    if let Ok(Some(s)) = desk.acquire(&holders[who], seq, tokens, now) {
                        if desk.book.counters().acquire_replays == replays {
                            *served.entry(s.window_start_ms).or_default() += u128::from(s.granted);
                            *served_to.entry((who, s.window_start_ms)).or_default() +=
                                u128::from(s.granted);
                        } else {
                            prop_assert_eq!(desk.escrow.counters().tokens_served, before);
                        }
                        prop_assert!(s.granted <= tokens);
                    }
                }
                Op::Return { who, seq, windows_back, tokens } => {
                    let current = now - now % WINDOW_MS;
                    let start = current.saturating_sub(windows_back * WINDOW_MS);
                    let replays = desk.book.counters().return_replays;
                    if let Ok(settled) = desk.give_back(&holders[who], seq, start, tokens, now) {
                        prop_assert!(settled.accepted <= tokens);
                        prop_assert_eq!(
                            u128::from(settled.accepted) + u128::from(settled.refused),
                            u128::from(tokens)
                        );
                        if desk.book.counters().return_replays == replays {
                            *returned.entry(start).or_default() += u128::from(settled.accepted);
                            *returned_by.entry((who, start)).or_default() +=
                                u128::from(settled.accepted);
                        }
                    }
                }
                Op::Wait { ms } => now += ms,
            }
            for (window, out) in &served {
                let back = returned.get(window).copied().unwrap_or(0);
                let got = granted.get(window).copied().unwrap_or(0);
                prop_assert!(back <= *out, "window {window}: returned {back} > served {out}");
                prop_assert!(out - back <= got, "window {window}: net {} > granted {got}", out - back);
            }
            for (slot, back) in &returned_by {
                let out = served_to.get(slot).copied().unwrap_or(0);
                prop_assert!(*back <= out, "holder/window {slot:?}: got back {back} > held {out}");
            }
            prop_assert!(desk.book.holder_count() <= 3);
        }
    }
}

/// One principal minting client ids is refused beyond its bound of the
/// key's holders — and only it: another principal still gets in, and the
/// table alone bounds `Anonymous` callers (a plaintext listener's).
#[test]
fn one_principal_beyond_its_holders_refuses_only_itself() {
    let limits = HolderLimits {
        max_holders: 8,
        max_holders_per_principal: 3,
        answer_retain_ms: 100,
        ..HolderLimits::default()
    };
    let mut desk = Desk::new(limits);
    desk.grant(100, 10);
    let checkout = service("checkout");
    let other = service("other");
    for i in 0..3 {
        desk.acquire(&holder(checkout.clone(), &format!("c{i}")), 1, 1, 11)
            .expect("within the principal's bound");
    }
    assert_eq!(
        desk.acquire(&holder(checkout.clone(), "c3"), 1, 1, 12),
        Err(HolderRefusal::PrincipalHoldersExhausted { max: 3 })
    );
    assert_eq!(desk.book.counters().refused_principal_holders, 1);
    assert_eq!(desk.book.counters().refused_holders_exhausted, 0);
    // A known holder of the principal is still served.
    assert!(desk
        .acquire(&holder(checkout.clone(), "c0"), 2, 1, 12)
        .is_ok());
    assert!(desk.acquire(&holder(other, "o0"), 1, 1, 12).is_ok());
    for i in 0..4 {
        desk.acquire(&holder(Principal::Anonymous, &format!("a{i}")), 1, 1, 12)
            .expect("anonymous callers: the table's bound only");
    }
    assert_eq!(desk.book.holder_count(), 8);
    // Once the window's credits and answers expired, the principal's
    // holders are gone and a new one gets in.
    desk.grant(100, 1_500);
    assert!(desk.acquire(&holder(checkout, "c9"), 1, 1, 1_500).is_ok());
}
