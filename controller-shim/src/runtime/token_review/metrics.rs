//! The TokenReview cache's metric families, registered beside what they
//! measure (on the shared registry, by `run.rs`): the time of the reviews
//! asked of the API server, and the reviews a limit held back.

use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts};

use crate::runtime::metrics::Metrics;

/// The TokenReview cache's families.
#[derive(Debug, Clone)]
pub struct TokenReviewMetrics {
    /// `mountguard_tokenreview_duration_seconds`.
    pub tokenreview_duration: Histogram,
    /// `mountguard_tokenreview_throttled_total{reason}`.
    pub tokenreview_throttled: IntCounterVec,
}

impl TokenReviewMetrics {
    /// Registers the TokenReview cache's families on `m`.
    pub fn register(m: &Metrics) -> Self {
        let tokenreview_duration = m.register(
            Histogram::with_opts(
                HistogramOpts::new(
                    "mountguard_tokenreview_duration_seconds",
                    "TokenReview call latency (cache misses only)",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
            )
            .unwrap(),
        );
        let tokenreview_throttled = m.register(
            IntCounterVec::new(
                Opts::new(
                    "mountguard_tokenreview_throttled_total",
                    "TokenReviews not made for unknown tokens: reason source (per-address limit) or in_flight (global limit)",
                ),
                &["reason"],
            )
            .unwrap(),
        );
        for reason in ["source", "in_flight"] {
            tokenreview_throttled.with_label_values(&[reason]);
        }
        Self {
            tokenreview_duration,
            tokenreview_throttled,
        }
    }

    /// Counts a TokenReview not made because of a limit.
    pub fn tokenreview_throttled(&self, reason: &str) {
        self.tokenreview_throttled
            .with_label_values(&[reason])
            .inc();
    }
}
