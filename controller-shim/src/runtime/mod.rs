//! What every task stands on.

pub mod events;
pub mod failpoint;
pub mod health;
pub mod kube;
pub(crate) mod leader;
pub mod limits;
pub mod metrics;
pub mod shutdown;
pub mod tls;
