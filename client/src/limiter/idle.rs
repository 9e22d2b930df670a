//! Giving idle credits back and forgetting idle keys.
//!
//! Credits a key has not touched for `return_idle_after` are withdrawn from
//! its wallet and handed back with `Return` while their window is current,
//! so other clients of the region can use them. Keys that are idle and hold
//! nothing are dropped from the table (bounded memory). A background task,
//! started on the first leased check, sweeps every half idle period; it
//! holds only a weak reference and ends once the limiter is dropped.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::ids::Key;
use tokio::time::Instant;

use super::{lock, Inner};
use crate::config::LeaseOptions;
use crate::error::ClientError;
use crate::source::ReturnRequest;
use crate::stats::bump;
use crate::wallet::Withdrawal;

/// Shortest sweep period, whatever the idle time.
const MIN_SWEEP_PERIOD: Duration = Duration::from_millis(1);

impl Inner {
    /// Starts the idle sweeper once, if the options ask for one.
    pub(super) fn ensure_sweeper(self: &Arc<Self>, options: &LeaseOptions) {
        let Some(idle) = options.return_idle_after else {
            return;
        };
        if self.sweeper_started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        let period = (idle / 2).max(MIN_SWEEP_PERIOD);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                let Some(inner) = weak.upgrade() else { break };
                if let Err(e) = inner.return_idle(idle).await {
                    tracing::debug!(error = %e, "returning idle credits failed; they expire with their window");
                }
            }
        });
    }

    /// Withdraws the credits of keys idle for at least `idle_for` and gives
    /// them back; drops idle empty keys. Returns the tokens accepted back, or
    /// the first error (credits whose return failed are forfeited: safe).
    pub(super) async fn return_idle(&self, idle_for: Duration) -> Result<u64, ClientError> {
        let now = Instant::now();
        let now_ns = self.nanos_since_origin(now).unwrap_or(0);
        let idle_ns = u64::try_from(idle_for.as_nanos()).unwrap_or(u64::MAX);
        let mut withdrawals: Vec<(String, Withdrawal)> = Vec::new();
        let mut forget = Vec::new();
        for cell in self.keys.snapshot() {
            let mut state = lock(&cell.state);
            let idle = now_ns.saturating_sub(cell.lane.last_use_ns()) >= idle_ns;
            if state.pending.is_some() || !idle {
                continue;
            }
            self.settle_lane(&cell, &mut state, now);
            if let Some(w) = state.wallet.withdraw_all(now) {
                withdrawals.push((cell.key.to_string(), w));
            }
            self.report_expired(&mut state);
            drop(state);
            forget.push(cell);
        }
        for cell in &forget {
            if self.keys.remove_if_same(cell) {
                self.retire_cell(cell);
            }
        }
        let mut accepted_total = 0;
        let mut first_error = None;
        for (key, w) in withdrawals {
            let Ok(key) = Key::new(key) else { continue };
            let request = ReturnRequest {
                key,
                tenant: self.config.tenant.clone(),
                tokens: w.tokens,
                window_start_ms: w.window.start_ms,
                request_id: self.next_request_id(),
            };
            let timeout = self.config.call_timeout;
            match tokio::time::timeout(timeout, self.source.give_back(request)).await {
                Ok(Ok(accepted)) => accepted_total += accepted.min(w.tokens),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(_) => {
                    first_error.get_or_insert(ClientError::DeadlineExceeded(timeout));
                }
            }
        }
        bump(&self.stats.tokens_returned, accepted_total);
        match first_error {
            Some(e) => Err(e),
            None => Ok(accepted_total),
        }
    }
}
