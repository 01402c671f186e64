//! Remediation (its metric families: `metrics.rs`).

pub mod eviction;
pub mod executor;
pub mod metrics;
pub mod settings;
pub mod slurm;
