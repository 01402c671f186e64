//! The admission webhook's metric families, registered beside what they
//! measure (on the shared registry, by `run.rs`, whether or not the
//! webhook is served: /metrics lists them, zeroed, either way).

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};

use crate::runtime::metrics::Metrics;

/// Values of `mountguard_admission_requests_total{result}`: `allowed`
/// (nothing to say), `warned`, `denied`, `not_ready` (allowed: the view is
/// not synced), `busy` (allowed: the view did not answer in time),
/// `invalid` (the request could not be read; answered 400, which the
/// API server's `Ignore` policy lets through).
pub const ADMISSION_RESULTS: [&str; 6] = [
    "allowed",
    "warned",
    "denied",
    "not_ready",
    "busy",
    "invalid",
];

/// Values of `mountguard_admission_requests_total{operation}`.
pub const ADMISSION_OPERATIONS: [&str; 3] = ["create", "delete", "other"];

/// The webhook's families.
#[derive(Debug, Clone)]
pub struct AdmissionMetrics {
    /// `mountguard_admission_requests_total{operation,result}`.
    pub requests: IntCounterVec,
    /// `mountguard_admission_answer_seconds{operation}`.
    pub answer: HistogramVec,
}

impl AdmissionMetrics {
    /// Registers the webhook's families on `m`.
    pub fn register(m: &Metrics) -> Self {
        let requests = m.register(
            IntCounterVec::new(
                Opts::new(
                    "mountguard_admission_requests_total",
                    "Admission reviews of Secret and ConfigMap creates and deletes by operation and answer",
                ),
                &["operation", "result"],
            )
            .unwrap(),
        );
        for op in ADMISSION_OPERATIONS {
            for res in ADMISSION_RESULTS {
                requests.with_label_values(&[op, res]);
            }
        }
        let answer = m.register(
            HistogramVec::new(
                HistogramOpts::new(
                    "mountguard_admission_answer_seconds",
                    "Time from an admission review's arrival to its answer, by operation",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0,
                ]),
                &["operation"],
            )
            .unwrap(),
        );
        Self { requests, answer }
    }
}
