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
        let cells = lock(&self.keys).snapshot();
        let mut withdrawals: Vec<(String, Withdrawal)> = Vec::new();
        let mut forget = Vec::new();
        for (key, cell) in cells {
            let mut state = lock(&cell.state);
            if state.pending.is_some() || now.saturating_duration_since(state.last_use) < idle_for {
                continue;
            }
            if let Some(w) = state.wallet.withdraw_all(now) {
                withdrawals.push((key.clone(), w));
            }
            self.report_expired(&mut state);
            drop(state);
            forget.push((key, cell));
        }
        {
            let mut table = lock(&self.keys);
            for (key, cell) in &forget {
                table.remove_if_same(key, cell);
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
