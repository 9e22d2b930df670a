//! How a [`Limiter`](crate::Limiter) behaves: its [`Mode`], lease options,
//! identity and deadlines. Validated once, at construction.

use std::time::Duration;

use leasehold_core::ids::{ClientId, TenantId};

use crate::error::ConfigError;
use crate::sizing::LeaseSizing;

/// How a limiter decides.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Mode {
    /// Every check asks the backend (`Check`). Exact; one round trip per check.
    Strict,
    /// Like [`Mode::Strict`], but a denial is remembered until its
    /// `retry_after` passes: later checks of that key with at least the
    /// denied cost are denied locally, without a round trip.
    CachedDeny,
    /// Checks spend local credits leased in batches (`Acquire`), coupled to
    /// the coordinator window that granted them.
    Leased(LeaseOptions),
}

/// Options of [`Mode::Leased`]: start from [`LeaseOptions::default`] and
/// change what you need with the `with_` methods.
///
/// ```
/// use std::time::Duration;
/// use leasehold_client::{LeaseOptions, LeaseSizing};
///
/// let options = LeaseOptions::default()
///     .with_sizing(LeaseSizing::Fixed(32))
///     .with_low_water(8)
///     .with_return_idle_after(Duration::from_secs(5));
/// assert_eq!(options.low_water, 8);
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// How many tokens one refill asks for.
    pub sizing: LeaseSizing,
    /// When a spend leaves at most this many credits, a refill is started in
    /// the background (prefetch). 0 disables prefetching. A prefetched grant
    /// that arrives after its deadline, or for an older window than the one
    /// held, is dropped.
    pub low_water: u64,
    /// Credits untouched for this long are given back (`Return`) while
    /// their window is current. `None` keeps them until they expire.
    pub return_idle_after: Option<Duration>,
    /// Upper bound on refills one check waits through before it gives up
    /// with a denial (partial grants, dropped late grants).
    pub max_refill_rounds: u32,
    /// What a check with credits held reads to know they are still live.
    pub clock: CheckClock,
}

/// The time source of a leased check with credits held, which must know
/// that its credits' deadline is still ahead.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckClock {
    /// [`CheckClock::CycleCounter`] while tokio's clock reads real time,
    /// and [`CheckClock::Runtime`] for good from the first refill that
    /// finds it paused, advanced or resumed by a test (and from the start
    /// if the limiter is built under a paused clock). The default: the fast
    /// clock in a service, the right one in a paused-time test.
    #[default]
    Auto,
    /// tokio's clock, read on every such check (~20 ns on Linux): right
    /// everywhere, including under tokio's paused test clock.
    Runtime,
    /// An upper bound on the monotonic clock from the CPU's cycle counter
    /// (a few ns), measured against the clock once per process in the
    /// background and re-pinned to it every millisecond per thread; the
    /// clock until measured, and for good if a bound ever comes out earlier
    /// than the clock ([`cycle_counter_status`](crate::cycle_counter_status)).
    /// Real time only: not for a limiter run under tokio's paused clock.
    CycleCounter,
}

impl LeaseOptions {
    /// How many tokens one refill asks for.
    pub fn with_sizing(mut self, sizing: LeaseSizing) -> Self {
        self.sizing = sizing;
        self
    }

    /// Refill in the background when a spend leaves at most this many
    /// credits (0: never prefetch).
    pub fn with_low_water(mut self, low_water: u64) -> Self {
        self.low_water = low_water;
        self
    }

    /// Give back credits untouched for this long while their window is
    /// current.
    pub fn with_return_idle_after(mut self, idle: Duration) -> Self {
        self.return_idle_after = Some(idle);
        self
    }

    /// Most refills one check waits through before it answers with a
    /// denial.
    pub fn with_max_refill_rounds(mut self, rounds: u32) -> Self {
        self.max_refill_rounds = rounds;
        self
    }

    /// What a check with credits held reads as the time.
    pub fn with_clock(mut self, clock: CheckClock) -> Self {
        self.clock = clock;
        self
    }
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            sizing: LeaseSizing::Fixed(16),
            low_water: 0,
            return_idle_after: None,
            max_refill_rounds: 16,
            clock: CheckClock::Auto,
        }
    }
}

/// Everything a limiter needs besides its credit source: start from
/// [`LimiterConfig::leased`] (or [`new`](LimiterConfig::new) with any
/// [`Mode`]) and change what you need with the `with_` methods.
///
/// ```
/// use std::time::Duration;
/// use leasehold_client::{ClientId, LeaseOptions, LeaseSizing, LimiterConfig, TenantId};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let config = LimiterConfig::leased(ClientId::new("checkout")?)
///     .with_lease(LeaseOptions::default().with_sizing(LeaseSizing::Fixed(32)))
///     .with_tenant(TenantId::new("acme")?)
///     .with_call_timeout(Duration::from_millis(500));
/// config.validate()?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct LimiterConfig {
    /// The decision mode.
    pub mode: Mode,
    /// This limiter's client name for exactly-once retries. With
    /// `fresh_incarnation` (the default) the limiter appends a random
    /// suffix when it starts ([`incarnation_id`]), so a restarted process
    /// never collides with the answers nodes stored for its previous
    /// incarnation, and another process cannot guess the id its credits are
    /// held under.
    pub client_id: ClientId,
    /// Append a fresh random suffix to `client_id` per limiter (default
    /// true). Turn off only where `client_id` is already unique per process
    /// start (a seeded simulation).
    pub fresh_incarnation: bool,
    /// The tenant this limiter acts for (`None`: the key's default tenant).
    pub tenant: Option<TenantId>,
    /// The tenant's weight, ≥ 1 (only `fair` keys use it).
    pub weight: u64,
    /// Deadline of one whole check, including any refill it waits for.
    pub call_timeout: Duration,
    /// Most keys tracked at once; beyond it the least recently used key's
    /// state is dropped (its credits are forfeited, which is always safe).
    pub max_keys: usize,
}

impl LimiterConfig {
    /// A configuration with the given mode and client id and defaults for
    /// the rest: default tenant, weight 1, 2 s call timeout, 100 000 keys.
    pub fn new(mode: Mode, client_id: ClientId) -> Self {
        LimiterConfig {
            mode,
            client_id,
            fresh_incarnation: true,
            tenant: None,
            weight: 1,
            call_timeout: Duration::from_secs(2),
            max_keys: 100_000,
        }
    }

    /// Leased mode with [`LeaseOptions::default`]: what a service usually
    /// wants.
    pub fn leased(client_id: ClientId) -> Self {
        Self::new(Mode::Leased(LeaseOptions::default()), client_id)
    }

    /// Strict mode: every check asks the backend.
    pub fn strict(client_id: ClientId) -> Self {
        Self::new(Mode::Strict, client_id)
    }

    /// The decision mode.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// Leased mode with these options.
    pub fn with_lease(self, options: LeaseOptions) -> Self {
        self.with_mode(Mode::Leased(options))
    }

    /// Whether the limiter appends a fresh random suffix to its client id
    /// (default true).
    pub fn with_fresh_incarnation(mut self, fresh: bool) -> Self {
        self.fresh_incarnation = fresh;
        self
    }

    /// The tenant this limiter acts for.
    pub fn with_tenant(mut self, tenant: TenantId) -> Self {
        self.tenant = Some(tenant);
        self
    }

    /// The tenant's weight, ≥ 1 (only `fair` keys use it).
    pub fn with_weight(mut self, weight: u64) -> Self {
        self.weight = weight;
        self
    }

    /// Deadline of one whole check, including any refill it waits for.
    pub fn with_call_timeout(mut self, timeout: Duration) -> Self {
        self.call_timeout = timeout;
        self
    }

    /// Most keys tracked at once.
    pub fn with_max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = max_keys;
        self
    }

    /// Checks every option; the error names the offending one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.weight == 0 {
            return Err(ConfigError("weight must be at least 1".into()));
        }
        if self.call_timeout.is_zero() {
            return Err(ConfigError("call_timeout must be positive".into()));
        }
        if self.max_keys == 0 {
            return Err(ConfigError("max_keys must be at least 1".into()));
        }
        if let Mode::Leased(lease) = &self.mode {
            lease.sizing.validate()?;
            if lease.max_refill_rounds == 0 {
                return Err(ConfigError("max_refill_rounds must be at least 1".into()));
            }
            if lease.return_idle_after.is_some_and(|d| d.is_zero()) {
                return Err(ConfigError("return_idle_after must be positive".into()));
            }
        }
        Ok(())
    }
}

/// Random hex digits appended by [`incarnation_id`].
pub const INCARNATION_SUFFIX_HEX: usize = 16;

/// `name` plus `-` and 16 random hex digits: a client id no earlier or
/// concurrent process start draws. `name` is shortened (on a character
/// boundary) so the result fits a client id's 128 bytes.
pub fn incarnation_id(name: &ClientId) -> ClientId {
    let room = leasehold_core::ids::MAX_CLIENT_ID_BYTES - 1 - INCARNATION_SUFFIX_HEX;
    let mut end = name.as_str().len().min(room);
    while !name.as_str().is_char_boundary(end) {
        end -= 1;
    }
    let suffix: u64 = rand::random();
    let id = format!("{}-{suffix:016x}", &name.as_str()[..end]);
    // Non-empty and at most 128 bytes by construction.
    ClientId::new(id).unwrap_or_else(|_| name.clone())
}

#[cfg(test)]
mod incarnation_tests {
    use super::*;

    #[test]
    fn incarnations_are_distinct_and_fit_a_client_id_whatever_the_name() {
        let short = ClientId::new("svc").expect("valid");
        let (a, b) = (incarnation_id(&short), incarnation_id(&short));
        assert_ne!(a, b);
        assert!(a.as_str().starts_with("svc-"));
        assert_eq!(a.as_str().len(), "svc-".len() + INCARNATION_SUFFIX_HEX);
        let long = ClientId::new("é".repeat(64)).expect("valid: 128 bytes");
        let id = incarnation_id(&long);
        assert!(id.as_str().len() <= leasehold_core::ids::MAX_CLIENT_ID_BYTES);
        assert!(id.as_str().starts_with('é'));
    }
}
