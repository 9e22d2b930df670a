//! The weighted-fair escrow's windows only move forward.

use leasehold_core::ids::TenantId;
use leasehold_core::wfe::{RecordedAsk, WeightedFairEscrow, WholeBudget};
use leasehold_core::window::WindowBounds;

const OLD: WindowBounds = WindowBounds {
    start_ms: 0,
    end_ms: 1_000,
};
const NEW: WindowBounds = WindowBounds {
    start_ms: 1_000,
    end_ms: 2_000,
};

#[test]
fn a_late_grant_for_an_older_window_changes_nothing() {
    let t = TenantId::new("a").unwrap();
    let mut escrow = WeightedFairEscrow::new(10, 8);
    escrow.observe_grant(NEW, 4);
    let mut ask = RecordedAsk {
        current: 4,
        asked: None,
    };
    for _ in 0..4 {
        assert!(escrow.check(&t, 1, 1, NEW, 1_100, &mut ask).allowed);
    }
    // The old window's grant lands late: it must not reset the use of the
    // current window (which would admit 10 more under the old label).
    escrow.observe_grant(OLD, 10);
    assert_eq!(escrow.window(), Some(NEW));
    assert_eq!((escrow.budget(), escrow.total_used()), (4, 4));
    // A request labelled with the old window is denied and changes nothing.
    let d = escrow.check(&t, 1, 1, OLD, 1_100, &mut WholeBudget(10));
    assert!(!d.allowed && d.retry_after_ms > 0);
    assert_eq!((escrow.budget(), escrow.total_used()), (4, 4));
    // A newer window starts afresh.
    let next = WindowBounds {
        start_ms: 2_000,
        end_ms: 3_000,
    };
    assert!(
        escrow
            .check(&t, 1, 1, next, 2_001, &mut WholeBudget(10))
            .allowed
    );
    assert_eq!(escrow.total_used(), 1);
}
