//! Who holds which credits of one key's escrow, and exactly-once `Acquire`
//! and `Return` per holder (DESIGN §7a), sans IO.
//!
//! A **holder** is the pair (authenticated principal, client id of the
//! request id). The [`HolderBook`] of one key keeps, per holder:
//! - **credits**: per (tenant, window) what the escrow handed out to it
//!   minus what it gave back. A return is accepted up to that amount and no
//!   further ([`HolderBook::settle_return`]); the rest is refused and
//!   counted. So, whatever a caller claims, Σ served − Σ accepted returns
//!   per window never exceeds what the coordinator granted, and no holder
//!   gets back more than it holds. An entry dies with its window (its
//!   deadline); a holder keeps at most
//!   [`HolderLimits::max_credit_entries_per_holder`] entries, the oldest
//!   window being dropped first (dropping only forfeits what could have come
//!   back, which is safe).
//! - **answers**: per request seq the fingerprint of the request and its
//!   answer. A retry with the same fingerprint gets the first answer and
//!   changes nothing; a retry with another fingerprint is refused
//!   ([`HolderRefusal::Reused`]). At most
//!   [`HolderLimits::max_answers_per_holder`] are kept; when one is dropped
//!   (oldest seq first, or when its retention passes) the holder's floor
//!   rises past it and any id below the floor is refused
//!   ([`HolderRefusal::Expired`]), never executed again. An answer is kept
//!   until `max(answered + answer_retain_ms, end of the credits it handed
//!   out)`.
//! - A holder whose answers and credits have all expired is forgotten; a
//!   later request under its client id starts afresh. Clients retry for
//!   seconds and `answer_retain_ms` is a minute, so only a retry sent after
//!   that could run twice; what it would be served still counts against the
//!   coordinator's grants, so Δ is unaffected.
//! - At most [`HolderLimits::max_holders`] holders per key: a request from a
//!   new holder beyond it is refused ([`HolderRefusal::HoldersExhausted`]);
//!   no holder's state is evicted to make room, so one caller cannot make
//!   the escrow forget another's answers or credits.
//! - At most [`HolderLimits::max_holders_per_principal`] of them per
//!   authenticated principal (a service identity): a principal's new
//!   holder beyond it is refused
//!   ([`HolderRefusal::PrincipalHoldersExhausted`]), so one service that
//!   mints client ids cannot fill the key's table and lock the other
//!   services of its region out of the key; it refuses only itself. Callers
//!   of a plaintext listener are all `Anonymous` — one principal with no
//!   identity to tell apart — and are bounded by the table alone.
//!
//! All arithmetic on amounts is checked: a return of `u64::MAX` is capped,
//! never wrapped.

use std::collections::BTreeMap;

use crate::ids::{ClientId, TenantId};
use crate::principal::Principal;

/// The owner of credits: the authenticated caller and the client id (one
/// client incarnation) its request ids name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    /// Who called (`Anonymous` on a plaintext listener).
    pub principal: Principal,
    /// The client incarnation of the request id.
    pub client: ClientId,
}

/// Bounds of a [`HolderBook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HolderLimits {
    /// Most holders tracked per key; a new holder beyond it is refused.
    pub max_holders: usize,
    /// Most holders of one authenticated principal per key; its new holder
    /// beyond it is refused (not applied to `Anonymous`).
    pub max_holders_per_principal: usize,
    /// Most answers remembered per holder (its highest seqs).
    pub max_answers_per_holder: usize,
    /// Most (tenant, window) credit entries per holder.
    pub max_credit_entries_per_holder: usize,
    /// An answer is remembered at least this long after it was given (ms
    /// of the caller's clock).
    pub answer_retain_ms: u64,
}

impl Default for HolderLimits {
    fn default() -> Self {
        HolderLimits {
            max_holders: 4_096,
            max_holders_per_principal: 1_024,
            max_answers_per_holder: 64,
            max_credit_entries_per_holder: 64,
            answer_retain_ms: 60_000,
        }
    }
}

/// What one request asked, compared between a request and its retries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fingerprint {
    /// An acquisition.
    Acquire {
        /// The tenant (`None`: the key's default tenant).
        tenant: Option<TenantId>,
        /// Tokens asked.
        tokens: u64,
    },
    /// A return.
    Return {
        /// The tenant.
        tenant: Option<TenantId>,
        /// Tokens offered back.
        tokens: u64,
        /// Their window.
        window_start_ms: u64,
    },
}

/// How an acquisition's request id was classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission<A> {
    /// Not seen before: serve it, then hand the ticket back to
    /// [`HolderBook::record_acquire`].
    New(AcquireTicket),
    /// A retry: answer this, change nothing.
    Replay(A),
}

/// An acquisition admitted as new, to record once served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireTicket {
    /// Its holder.
    pub holder: Holder,
    /// Its request seq.
    pub seq: u64,
    /// The tenant asked for.
    pub tenant: Option<TenantId>,
    /// Tokens asked.
    pub tokens: u64,
}

/// What a return claims: tokens of one tenant's credits of one window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReturnClaim {
    /// The tenant the credits were acquired for.
    pub tenant: Option<TenantId>,
    /// Their window (coordinator epoch ms).
    pub window_start_ms: u64,
    /// Tokens offered back.
    pub tokens: u64,
}

/// Why a request was refused before anything was executed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HolderRefusal {
    /// The id already named a request with another fingerprint.
    #[error(
        "request id {seq} of client {client:?} already named a different request \
         (another kind, tenant, token count or window); nothing was executed, use a new request id"
    )]
    Reused {
        /// The client id.
        client: String,
        /// The seq.
        seq: u64,
    },
    /// The id is older than anything the escrow remembers for this holder.
    #[error(
        "request id {seq} of client {client:?} is older than the oldest this escrow node \
         remembers (ids below {floor}): it may have been executed already and is not executed \
         again; send new requests with new ids"
    )]
    Expired {
        /// The client id.
        client: String,
        /// The seq.
        seq: u64,
        /// Ids below this are refused.
        floor: u64,
    },
    /// The key tracks as many holders as it may.
    #[error(
        "this key already tracks its maximum of {max} credit holders on this escrow node; \
         holders are released when their windows end"
    )]
    HoldersExhausted {
        /// The bound.
        max: usize,
    },
    /// The caller's principal holds as many holders of this key as it may.
    #[error(
        "this caller identity already holds its maximum of {max} credit holders of this key \
         on this escrow node (client ids in use at once); holders are released when their \
         windows end"
    )]
    PrincipalHoldersExhausted {
        /// The bound.
        max: usize,
    },
}

/// Credits an acquisition handed to its holder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderHeld {
    /// The tenant they were acquired for.
    pub tenant: Option<TenantId>,
    /// Their window (coordinator epoch ms).
    pub window_start_ms: u64,
    /// How many.
    pub tokens: u64,
    /// When they die, on the caller's clock.
    pub deadline_ms: u64,
}

/// The outcome of a return.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReturnSettled {
    /// Tokens taken back.
    pub accepted: u64,
    /// Tokens offered beyond what was taken back (refused).
    pub refused: u64,
}

/// Counters an operator reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HolderCounters {
    /// Acquires answered from the remembered answer (retries).
    pub acquire_replays: u64,
    /// Returns answered from the remembered answer (retries).
    pub return_replays: u64,
    /// Returns that offered more than was taken back.
    pub returns_capped: u64,
    /// Tokens offered back beyond what was taken back.
    pub return_tokens_refused: u64,
    /// Requests refused: id reused with another fingerprint.
    pub refused_reused_ids: u64,
    /// Requests refused: id below what is remembered.
    pub refused_expired_ids: u64,
    /// Requests refused: the key's holder table was full.
    pub refused_holders_exhausted: u64,
    /// Requests refused: the caller's principal had its most holders of
    /// the key.
    pub refused_principal_holders: u64,
    /// Credit entries dropped to respect the per-holder bound.
    pub credit_entries_dropped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Answer<A> {
    Acquired(A),
    Returned(ReturnSettled),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Remembered<A> {
    fingerprint: Fingerprint,
    answer: Answer<A>,
    retain_until_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Credit {
    outstanding: u64,
    deadline_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct HolderState<A> {
    answers: BTreeMap<u64, Remembered<A>>,
    /// Ids below this are refused.
    floor_seq: u64,
    /// (tenant, window start) → credits held.
    credits: BTreeMap<(Option<TenantId>, u64), Credit>,
}

impl<A> HolderState<A> {
    fn new() -> Self {
        HolderState {
            answers: BTreeMap::new(),
            floor_seq: 0,
            credits: BTreeMap::new(),
        }
    }

    /// Drops what expired at `now_ms`; returns whether nothing is left.
    fn expire(&mut self, now_ms: u64) -> bool {
        let expired: Vec<u64> = self
            .answers
            .iter()
            .filter(|(_, r)| r.retain_until_ms <= now_ms)
            .map(|(seq, _)| *seq)
            .collect();
        for seq in expired {
            self.answers.remove(&seq);
            self.floor_seq = self.floor_seq.max(seq.saturating_add(1));
        }
        self.credits.retain(|_, c| c.deadline_ms > now_ms);
        self.answers.is_empty() && self.credits.is_empty()
    }
}

/// The holders of one key's credits and their remembered answers. `A` is
/// what an acquisition answered (replayed to retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderBook<A> {
    limits: HolderLimits,
    holders: BTreeMap<Holder, HolderState<A>>,
    counters: HolderCounters,
}

impl<A: Clone> HolderBook<A> {
    /// An empty book with these bounds (each at least 1).
    pub fn new(limits: HolderLimits) -> Self {
        HolderBook {
            limits: HolderLimits {
                max_holders: limits.max_holders.max(1),
                max_holders_per_principal: limits.max_holders_per_principal.max(1),
                max_answers_per_holder: limits.max_answers_per_holder.max(1),
                max_credit_entries_per_holder: limits.max_credit_entries_per_holder.max(1),
                answer_retain_ms: limits.answer_retain_ms,
            },
            holders: BTreeMap::new(),
            counters: HolderCounters::default(),
        }
    }

    /// The counters so far.
    pub fn counters(&self) -> HolderCounters {
        self.counters
    }

    /// Holders tracked now.
    pub fn holder_count(&self) -> usize {
        self.holders.len()
    }

    /// What `holder` holds of `tenant`'s credits of `window_start_ms` at
    /// `now_ms` (handed out minus given back; 0 once the window died).
    pub fn held_by(
        &self,
        holder: &Holder,
        tenant: Option<&TenantId>,
        window_start_ms: u64,
        now_ms: u64,
    ) -> u64 {
        self.holders
            .get(holder)
            .and_then(|h| h.credits.get(&(tenant.cloned(), window_start_ms)))
            .filter(|c| c.deadline_ms > now_ms)
            .map_or(0, |c| c.outstanding)
    }

    /// How many live holders `principal` has, after dropping what expired
    /// when it is at its bound.
    fn holders_of(&mut self, principal: &Principal, now_ms: u64) -> usize {
        let count = |holders: &BTreeMap<Holder, HolderState<A>>| {
            holders.keys().filter(|h| h.principal == *principal).count()
        };
        if count(&self.holders) >= self.limits.max_holders_per_principal {
            self.expire(now_ms);
        }
        count(&self.holders)
    }

    /// Drops every expired answer, credit and empty holder.
    pub fn expire(&mut self, now_ms: u64) {
        self.holders.retain(|_, h| !h.expire(now_ms));
    }

    /// Classifies request `seq` of `holder` with `fingerprint`, after
    /// dropping what expired. `Ok(New)` guarantees room to record it.
    fn classify(
        &mut self,
        holder: &Holder,
        seq: u64,
        fingerprint: &Fingerprint,
        now_ms: u64,
    ) -> Result<Option<Answer<A>>, HolderRefusal> {
        let known = match self.holders.get_mut(holder) {
            Some(state) => {
                if state.expire(now_ms) {
                    self.holders.remove(holder);
                    false
                } else {
                    true
                }
            }
            None => false,
        };
        if !known {
            if self.holders.len() >= self.limits.max_holders {
                self.expire(now_ms);
            }
            if self.holders.len() >= self.limits.max_holders {
                self.counters.refused_holders_exhausted += 1;
                return Err(HolderRefusal::HoldersExhausted {
                    max: self.limits.max_holders,
                });
            }
            if holder.principal != Principal::Anonymous
                && self.holders_of(&holder.principal, now_ms)
                    >= self.limits.max_holders_per_principal
            {
                self.counters.refused_principal_holders += 1;
                return Err(HolderRefusal::PrincipalHoldersExhausted {
                    max: self.limits.max_holders_per_principal,
                });
            }
            return Ok(None);
        }
        let Some(state) = self.holders.get(holder) else {
            return Ok(None);
        };
        if let Some(remembered) = state.answers.get(&seq) {
            if remembered.fingerprint != *fingerprint {
                self.counters.refused_reused_ids += 1;
                return Err(HolderRefusal::Reused {
                    client: holder.client.to_string(),
                    seq,
                });
            }
            return Ok(Some(remembered.answer.clone()));
        }
        if seq < state.floor_seq {
            self.counters.refused_expired_ids += 1;
            return Err(HolderRefusal::Expired {
                client: holder.client.to_string(),
                seq,
                floor: state.floor_seq,
            });
        }
        Ok(None)
    }

    /// Stores an answer, dropping the holder's oldest beyond the bound.
    fn remember(
        &mut self,
        holder: &Holder,
        seq: u64,
        remembered: Remembered<A>,
    ) -> &mut HolderState<A> {
        let max_answers = self.limits.max_answers_per_holder;
        let state = self
            .holders
            .entry(holder.clone())
            .or_insert_with(HolderState::new);
        state.answers.insert(seq, remembered);
        while state.answers.len() > max_answers {
            if let Some((dropped, _)) = state.answers.pop_first() {
                state.floor_seq = state.floor_seq.max(dropped.saturating_add(1));
            }
        }
        state
    }

    /// Classifies acquisition `seq` of `holder` (for `tenant`, `tokens`).
    /// On `New` the caller serves it and then calls
    /// [`record_acquire`](Self::record_acquire) with the same arguments.
    pub fn admit_acquire(
        &mut self,
        holder: &Holder,
        seq: u64,
        tenant: Option<&TenantId>,
        tokens: u64,
        now_ms: u64,
    ) -> Result<Admission<A>, HolderRefusal> {
        let fingerprint = Fingerprint::Acquire {
            tenant: tenant.cloned(),
            tokens,
        };
        match self.classify(holder, seq, &fingerprint, now_ms)? {
            None => Ok(Admission::New(AcquireTicket {
                holder: holder.clone(),
                seq,
                tenant: tenant.cloned(),
                tokens,
            })),
            Some(Answer::Acquired(answer)) => {
                self.counters.acquire_replays += 1;
                Ok(Admission::Replay(answer))
            }
            // Another kind under this id: a different fingerprint, which
            // `classify` already refused; kept total for the type.
            Some(Answer::Returned(_)) => Err(HolderRefusal::Reused {
                client: holder.client.to_string(),
                seq,
            }),
        }
    }

    /// Records what the admitted acquisition `ticket` answered and the
    /// credits it handed out, if any.
    pub fn record_acquire(
        &mut self,
        ticket: AcquireTicket,
        answer: A,
        handed_out: Option<HolderHeld>,
        now_ms: u64,
    ) {
        let AcquireTicket {
            holder,
            seq,
            tenant,
            tokens,
        } = ticket;
        let retain_until_ms = now_ms
            .saturating_add(self.limits.answer_retain_ms)
            .max(handed_out.as_ref().map_or(0, |h| h.deadline_ms));
        let max_entries = self.limits.max_credit_entries_per_holder;
        let remembered = Remembered {
            fingerprint: Fingerprint::Acquire { tenant, tokens },
            answer: Answer::Acquired(answer),
            retain_until_ms,
        };
        let state = self.remember(&holder, seq, remembered);
        let Some(held) = handed_out.filter(|h| h.tokens > 0 && h.deadline_ms > now_ms) else {
            return;
        };
        let credit = state
            .credits
            .entry((held.tenant, held.window_start_ms))
            .or_insert(Credit {
                outstanding: 0,
                deadline_ms: held.deadline_ms,
            });
        // Served tokens never exceed what the coordinator granted, so this
        // cannot overflow; were it to, the entry would under-count, which
        // only lowers what may come back.
        credit.outstanding = credit.outstanding.saturating_add(held.tokens);
        credit.deadline_ms = credit.deadline_ms.min(held.deadline_ms);
        let mut dropped = 0;
        while state.credits.len() > max_entries {
            let oldest = state
                .credits
                .iter()
                .min_by_key(|((_, window), c)| (*window, c.deadline_ms))
                .map(|(k, _)| k.clone());
            match oldest {
                Some(k) => {
                    state.credits.remove(&k);
                    dropped += 1;
                }
                None => break,
            }
        }
        self.counters.credit_entries_dropped += dropped;
    }

    /// Settles return `seq` of `holder` claiming `claim`. Offers
    /// `take_back` at most what the holder holds of that tenant's credits of
    /// that window (it answers how many the escrow took, capped again),
    /// deducts what was taken and remembers the answer; a retry gets the
    /// same answer and takes nothing. A holder the book does not know holds
    /// nothing: its return is answered `accepted = 0` and not remembered.
    pub fn settle_return(
        &mut self,
        holder: &Holder,
        seq: u64,
        claim: &ReturnClaim,
        now_ms: u64,
        take_back: impl FnOnce(u64) -> u64,
    ) -> Result<ReturnSettled, HolderRefusal> {
        if let Some(state) = self.holders.get_mut(holder) {
            if state.expire(now_ms) {
                self.holders.remove(holder);
            }
        }
        if !self.holders.contains_key(holder) {
            return Ok(self.note_refused(claim.tokens, 0));
        }
        let fingerprint = Fingerprint::Return {
            tenant: claim.tenant.clone(),
            tokens: claim.tokens,
            window_start_ms: claim.window_start_ms,
        };
        match self.classify(holder, seq, &fingerprint, now_ms)? {
            Some(Answer::Returned(settled)) => {
                self.counters.return_replays += 1;
                return Ok(settled);
            }
            // Another kind under this id: a different fingerprint, which
            // `classify` already refused; kept total for the type.
            Some(Answer::Acquired(_)) => {
                return Err(HolderRefusal::Reused {
                    client: holder.client.to_string(),
                    seq,
                })
            }
            None => {}
        }
        let holds = self.held_by(holder, claim.tenant.as_ref(), claim.window_start_ms, now_ms);
        let offered = claim.tokens.min(holds);
        let accepted = if offered > 0 {
            take_back(offered).min(offered)
        } else {
            0
        };
        let settled = self.note_refused(claim.tokens, accepted);
        let retain_until_ms = now_ms.saturating_add(self.limits.answer_retain_ms);
        let state = self.remember(
            holder,
            seq,
            Remembered {
                fingerprint,
                answer: Answer::Returned(settled),
                retain_until_ms,
            },
        );
        if let Some(credit) = state
            .credits
            .get_mut(&(claim.tenant.clone(), claim.window_start_ms))
        {
            credit.outstanding = credit.outstanding.saturating_sub(accepted);
        }
        Ok(settled)
    }

    fn note_refused(&mut self, tokens: u64, accepted: u64) -> ReturnSettled {
        let refused = tokens.saturating_sub(accepted);
        if refused > 0 {
            self.counters.returns_capped += 1;
            self.counters.return_tokens_refused =
                self.counters.return_tokens_refused.saturating_add(refused);
        }
        ReturnSettled { accepted, refused }
    }
}

#[cfg(test)]
mod tests;
