//! What every task of the running controller shares: the metrics, whether
//! this replica acts and is ready, and the health of the watches (the
//! status API's store is a handle of its own, `api::store::ReadModel`,
//! passed to the tasks that read or write it). Tasks depend on this module,
//! never on the wiring in `run.rs` that starts them.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::runtime::health::Health;
use crate::runtime::metrics::Metrics;

/// State shared between the tasks.
#[derive(Debug)]
pub struct Shared {
    /// Metrics.
    pub metrics: Metrics,
    /// This replica acts (leader, or no election).
    pub acting: AtomicBool,
    /// Every watch finished its initial list.
    pub ready: AtomicBool,
    /// Sync state and errors of the watches.
    pub health: Health,
}

impl Shared {
    /// New shared state with `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            acting: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            health: Health::default(),
        }
    }

    /// Whether this replica acts.
    pub fn is_acting(&self) -> bool {
        self.acting.load(Ordering::Acquire)
    }

    /// Whether the initial lists are done.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}
