//! The status API's metric family, registered beside what it measures (on
//! the shared registry, by `run.rs`): requests to the `/v1/` paths by
//! what the status gate answered.

use prometheus::{IntCounterVec, Opts};

use crate::runtime::metrics::Metrics;

/// Values of `mountguard_status_requests_total{result}`.
pub const STATUS_RESULTS: [&str; 5] = [
    "allowed",
    "unauthenticated",
    "forbidden",
    "unavailable",
    "rate_limited",
];

/// The status API's families.
#[derive(Debug, Clone)]
pub struct ApiMetrics {
    /// `mountguard_status_requests_total{result}`.
    pub status_requests: IntCounterVec,
}

impl ApiMetrics {
    /// Registers the status API's families on `m`.
    pub fn register(m: &Metrics) -> Self {
        let status_requests = m.register(
            IntCounterVec::new(
                Opts::new(
                    "mountguard_status_requests_total",
                    "Status API requests (/v1/verdicts, /v1/rollouts) by authorization result",
                ),
                &["result"],
            )
            .unwrap(),
        );
        for s in STATUS_RESULTS {
            status_requests.with_label_values(&[s]);
        }
        Self { status_requests }
    }
}
