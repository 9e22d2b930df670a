//! The async runtime the coordinator's Raft group runs on: tokio, with one
//! difference from openraft's stock `TokioRuntime` — the randomness openraft
//! draws (election timeouts) comes from [`ElectionRng`], which a
//! deterministic simulation can seed per thread with [`seed_election_rng`].
//!
//! In production nothing seeds it and every draw comes from the OS-seeded
//! thread RNG, exactly as with the stock runtime. A simulation that runs all
//! its hosts on one thread (turmoil does) seeds it once before the run, so
//! which member times out first — and so who wins each election — replays
//! with the seed.

use std::cell::RefCell;
use std::future::Future;
use std::time::Duration;

use openraft::async_runtime::AsyncOneshotSendExt;
use openraft::{AsyncRuntime, OptionalSend, TokioInstant};
use rand::rngs::StdRng;
use rand::{RngCore, SeedableRng};

thread_local! {
    static SEEDED: RefCell<Option<StdRng>> = const { RefCell::new(None) };
}

/// Makes every later draw of openraft's randomness on this thread come from
/// a generator seeded with `seed` (until [`unseed_election_rng`]).
pub fn seed_election_rng(seed: u64) {
    SEEDED.with(|rng| *rng.borrow_mut() = Some(StdRng::seed_from_u64(seed)));
}

/// Returns this thread to OS-seeded randomness.
pub fn unseed_election_rng() {
    SEEDED.with(|rng| *rng.borrow_mut() = None);
}

/// openraft's source of randomness: the thread's seeded generator when one
/// is set ([`seed_election_rng`]), else the OS-seeded thread RNG.
#[derive(Debug, Clone, Copy, Default)]
pub struct ElectionRng;

impl ElectionRng {
    fn draw<R>(&mut self, f: impl FnOnce(&mut dyn RngCore) -> R) -> R {
        SEEDED.with(|seeded| match seeded.borrow_mut().as_mut() {
            Some(rng) => f(rng),
            None => f(&mut rand::thread_rng()),
        })
    }
}

impl RngCore for ElectionRng {
    fn next_u32(&mut self) -> u32 {
        self.draw(|rng| rng.next_u32())
    }

    fn next_u64(&mut self) -> u64 {
        self.draw(|rng| rng.next_u64())
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        self.draw(|rng| rng.fill_bytes(dest));
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.draw(|rng| rng.try_fill_bytes(dest))
    }
}

/// tokio, with seedable election randomness.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CoordinatorRuntime;

/// The sending half of a oneshot channel of [`CoordinatorRuntime`].
pub struct OneshotSender<T>(tokio::sync::oneshot::Sender<T>);

impl<T> std::fmt::Debug for OneshotSender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OneshotSender")
    }
}

impl<T: OptionalSend> AsyncOneshotSendExt<T> for OneshotSender<T> {
    fn send(self, value: T) -> Result<(), T> {
        self.0.send(value)
    }
}

impl AsyncRuntime for CoordinatorRuntime {
    type JoinError = tokio::task::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = tokio::task::JoinHandle<T>;
    type Sleep = tokio::time::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = tokio::time::error::Elapsed;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = tokio::time::Timeout<T>;
    type ThreadLocalRng = ElectionRng;
    type OneshotSender<T: OptionalSend> = OneshotSender<T>;
    type OneshotReceiverError = tokio::sync::oneshot::error::RecvError;
    type OneshotReceiver<T: OptionalSend> = tokio::sync::oneshot::Receiver<T>;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        tokio::task::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        tokio::time::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        tokio::time::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        tokio::time::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        join_error.is_panic()
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ElectionRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        (OneshotSender(tx), rx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    fn draws() -> Vec<u64> {
        (0..8)
            .map(|_| CoordinatorRuntime::thread_rng().gen_range(150..300))
            .collect()
    }

    #[test]
    fn a_seeded_thread_replays_its_draws() {
        seed_election_rng(42);
        let first = draws();
        seed_election_rng(42);
        assert_eq!(first, draws());
        seed_election_rng(43);
        assert_ne!(first, draws());
        unseed_election_rng();
        assert!(draws().iter().all(|d| (150..300).contains(d)));
    }

    #[test]
    fn seeding_is_per_thread() {
        seed_election_rng(7);
        let here = draws();
        let there = std::thread::spawn(|| {
            seed_election_rng(7);
            draws()
        })
        .join()
        .expect("thread");
        assert_eq!(here, there);
        unseed_election_rng();
    }
}
