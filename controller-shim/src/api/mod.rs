//! The status API (its metric family: `metrics.rs`).

pub mod authorize;
pub mod metrics;
pub(crate) mod routes;
pub mod store;
