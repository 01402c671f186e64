//! The remediation executor's metric families, registered beside what
//! they measure (on the shared registry, by `run.rs`, whether or not
//! remediation is on: /metrics lists them, zeroed, either way): attempts
//! by phase and result, the open and failed ones, the drained Slurm nodes
//! and the blocked remediations.

use prometheus::{Gauge, IntCounterVec, IntGauge, IntGaugeVec, Opts};

use crate::runtime::metrics::Metrics;

/// The executor's families.
#[derive(Debug, Clone)]
pub struct RemediationMetrics {
    /// `mountguard_remediation_attempts_total{phase,result}`.
    pub remediation_attempts: IntCounterVec,
    /// `mountguard_remediation_open_attempts`.
    pub remediation_open_attempts: IntGauge,
    /// `mountguard_remediation_oldest_open_attempt_age_seconds`.
    pub remediation_oldest_open_attempt_age: Gauge,
    /// `mountguard_slurm_nodes_drained`.
    pub slurm_nodes_drained: IntGauge,
    /// `mountguard_remediation_failed`.
    pub remediation_failed: IntGauge,
    /// `mountguard_remediation_failed_unresolved{owner_kind}`.
    pub remediation_failed_unresolved: IntGaugeVec,
    /// `mountguard_remediation_blocked{reason}`.
    pub remediation_blocked: IntGaugeVec,
}

impl RemediationMetrics {
    /// Registers the executor's families on `m`.
    pub fn register(m: &Metrics) -> Self {
        let remediation_attempts = m.register(
            IntCounterVec::new(
                Opts::new(
                    "mountguard_remediation_attempts_total",
                    "Remediation attempt transitions by phase and result",
                ),
                &["phase", "result"],
            )
            .unwrap(),
        );
        let remediation_open_attempts = m.register(
            IntGauge::with_opts(Opts::new(
                "mountguard_remediation_open_attempts",
                "Open remediation attempts",
            ))
            .unwrap(),
        );
        let remediation_oldest_open_attempt_age = m.register(
            Gauge::with_opts(Opts::new(
                "mountguard_remediation_oldest_open_attempt_age_seconds",
                "Age of the oldest open remediation attempt",
            ))
            .unwrap(),
        );
        let slurm_nodes_drained = m.register(
            IntGauge::with_opts(Opts::new(
                "mountguard_slurm_nodes_drained",
                "Slurm nodes currently drained by mountguard",
            ))
            .unwrap(),
        );
        let remediation_failed = m.register(
            IntGauge::with_opts(Opts::new(
                "mountguard_remediation_failed",
                "Open failed remediation attempts with the node kept drained",
            ))
            .unwrap(),
        );
        let remediation_failed_unresolved = m.register(
            IntGaugeVec::new(
                Opts::new(
                    "mountguard_remediation_failed_unresolved",
                    "Failed remediation attempts whose pod is still not fresh and is not tried again, by owner kind",
                ),
                &["owner_kind"],
            )
            .unwrap(),
        );
        for kind in mountguard_core::remediation::plan::OWNER_KINDS {
            remediation_failed_unresolved
                .with_label_values(&[kind])
                .set(0);
        }
        let remediation_blocked = m.register(
            IntGaugeVec::new(
                Opts::new(
                    "mountguard_remediation_blocked",
                    "Remediations blocked, by reason",
                ),
                &["reason"],
            )
            .unwrap(),
        );
        remediation_blocked.with_label_values(&["pinned"]).set(0);
        Self {
            remediation_attempts,
            remediation_open_attempts,
            remediation_oldest_open_attempt_age,
            slurm_nodes_drained,
            remediation_failed,
            remediation_failed_unresolved,
            remediation_blocked,
        }
    }
}
