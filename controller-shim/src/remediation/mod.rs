//! Remediation.

pub mod eviction;
pub mod executor;
pub mod settings;
pub mod slurm;
