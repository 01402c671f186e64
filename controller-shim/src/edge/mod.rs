//! The Kubernetes edge.

pub mod convert;
pub mod watch;
pub mod workloads;
