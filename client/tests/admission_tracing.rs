//! The binding axis of a denial is recorded on the `admission` span (alone
//! in its test binary: tracing caches callsite interest process-wide).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use leasehold_client::admission::{AdmissionGate, AdmitRequest, CostAxis, InProcessLimit};
use leasehold_client::transport::WallClock;
use leasehold_core::admission::concurrency::ConcurrencyParams;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

struct FrozenClock(AtomicU64);

impl WallClock for FrozenClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Every field recorded on a span after it was created, as `name=value`.
#[derive(Default, Clone)]
struct Recorded(Arc<Mutex<Vec<String>>>);

struct Visitor<'a>(&'a mut Vec<String>);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.push(format!("{}={:?}", field.name(), value));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.push(format!("{}={}", field.name(), value));
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Recorded {
    fn on_record(
        &self,
        _: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: Context<'_, S>,
    ) {
        values.record(&mut Visitor(&mut self.0.lock().unwrap()));
    }
}

#[test]
fn the_binding_axis_is_a_span_field_on_denials_only() {
    let recorded = Recorded::default();
    let subscriber = tracing_subscriber::registry().with(recorded.clone());
    tracing::subscriber::with_default(subscriber, || {
        let gate = AdmissionGate::builder()
            .clock(Arc::new(FrozenClock(AtomicU64::new(0))))
            .concurrency(ConcurrencyParams::aimd(1, 1))
            .rate(InProcessLimit::gcra(1, 60_000))
            .cost(CostAxis::InProcess(InProcessLimit::token_bucket(10, 1)))
            .build()
            .unwrap();
        let first = gate.admit_sync(AdmitRequest::new("k", 1)).unwrap();
        assert!(first.decision.allowed);
        let busy = gate.admit_sync(AdmitRequest::new("k", 1)).unwrap();
        assert!(!busy.decision.allowed);
        first.release.release(false);
        let too_fast = gate.admit_sync(AdmitRequest::new("k", 1)).unwrap();
        assert!(!too_fast.decision.allowed);
        let too_costly = gate.admit_sync(AdmitRequest::new("other", 10)).unwrap();
        assert!(too_costly.decision.allowed);
        too_costly.release.release(false);
        let broke = gate.admit_sync(AdmitRequest::new("other2", 1)).unwrap();
        assert!(broke.decision.allowed);
        broke.release.release(false);
    });
    assert_eq!(
        *recorded.0.lock().unwrap(),
        vec!["binding_axis=concurrency", "binding_axis=rate"]
    );
}
