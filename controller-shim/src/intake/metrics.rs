//! The report API's metric families, registered beside what they measure
//! (on the shared registry, by `run.rs`): requests by result, their
//! handling time, and the reports whose clock ran ahead.

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts};

use crate::runtime::metrics::Metrics;

/// Values of `mountguard_report_requests_total{result}`.
pub const REPORT_RESULTS: [&str; 12] = [
    "accepted",
    "unchanged",
    "resend",
    "bad_request",
    "unauthenticated",
    "forbidden",
    "conflict",
    "too_large",
    "body_timeout",
    "rate_limited",
    "error",
    "not_leader",
];

/// The report API's families.
#[derive(Debug, Clone)]
pub struct IntakeMetrics {
    /// `mountguard_report_requests_total{result}`.
    pub report_requests: IntCounterVec,
    /// Report request latency by kind (`mountguard_report_duration_seconds{kind}`).
    pub report_duration: HistogramVec,
    /// `mountguard_report_clock_clamped_total`.
    pub report_clock_clamped: IntCounter,
}

impl IntakeMetrics {
    /// Registers the report API's families on `m`.
    pub fn register(m: &Metrics) -> Self {
        let report_requests = m.register(
            IntCounterVec::new(
                Opts::new(
                    "mountguard_report_requests_total",
                    "Agent report requests by result",
                ),
                &["result"],
            )
            .unwrap(),
        );
        for r in REPORT_RESULTS {
            report_requests.with_label_values(&[r]);
        }
        let report_duration = m.register(
            HistogramVec::new(
                HistogramOpts::new(
                    "mountguard_report_duration_seconds",
                    "Report request handling time by kind",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ]),
                &["kind"],
            )
            .unwrap(),
        );
        let report_clock_clamped = m.register(
            IntCounter::with_opts(Opts::new(
                "mountguard_report_clock_clamped_total",
                "Reports whose scan time was more than 5 s ahead of the controller's clock and was clamped to the receipt time (an agent node's clock is ahead)",
            ))
            .unwrap(),
        );
        Self {
            report_requests,
            report_duration,
            report_clock_clamped,
        }
    }

    /// Counts a report request result.
    pub fn report(&self, result: &str) {
        self.report_requests.with_label_values(&[result]).inc();
    }

    /// Records how far a report's scan time was ahead of the controller's
    /// clock (counted above 5 s).
    pub fn report_clock_skew(&self, _node: &str, ahead: std::time::Duration) {
        if ahead > std::time::Duration::from_secs(5) {
            self.report_clock_clamped.inc();
        }
    }
}
