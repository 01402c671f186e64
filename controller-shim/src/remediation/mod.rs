//! Remediation.

pub mod eviction;
pub mod executor;
pub mod slurm;
