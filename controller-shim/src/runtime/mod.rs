//! What every task stands on.

pub mod events;
pub mod failpoint;
pub mod health;
pub mod http;
pub mod kube;
pub mod limits;
pub mod metrics;
pub mod shutdown;
pub mod tls;
pub mod token_review;
