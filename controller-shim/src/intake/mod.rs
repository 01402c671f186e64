//! The agents' report API (its metric families: `metrics.rs`).

pub mod auth;
pub mod body;
pub mod limits;
pub mod metrics;
pub mod report;
