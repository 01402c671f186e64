//! mountguard cluster-in-a-box: test doubles that speak the real protocols.
//!
//! No Kubernetes API server, kubelet or Slurm can be installed where
//! mountguard is tested, so this crate provides doubles of each, in-process
//! (tokio tasks), each with a handle and a `shutdown()`:
//!
//! - [`apiserver::ApiServerDouble`]: an HTTP API server (JSON) with
//!   list/watch/resourceVersion semantics, against which the real `kube`
//!   client and kube-runtime's watcher work;
//! - [`kubelet::KubeletDouble`]: a simulated kubelet per node that writes
//!   volumes with the kubelet-faithful AtomicWriter double and reproduces the
//!   watch-based Secret/ConfigMap manager cache, including the immutable pin;
//! - [`nodeset::NodeSetDouble`]: keeps Slinky NodeSet pods;
//! - [`slurmrestd::SlurmrestdDouble`]: slurmrestd `v0.0.44` node endpoints;
//! - [`cluster::Cluster`]: wires them together.
//!
//! They are doubles: they reproduce what mountguard depends on and simplify
//! the rest (see `docs/testing.md`).

#![recursion_limit = "256"]

pub mod apiserver;
pub mod cluster;
pub mod demo;
pub mod docs;
pub mod envfile;
pub mod http;
pub mod kubelet;
pub mod mountguard;
pub mod nodeset;
pub mod objects;
pub mod operator;
#[cfg(feature = "real-upstream")]
pub mod real;
pub mod rig;
pub mod scenario;
pub mod slurmrestd;
pub mod util;
