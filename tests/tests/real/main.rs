//! Tests against the real upstream control plane: kube-apiserver, etcd,
//! kube-controller-manager and kube-scheduler built from the Go module
//! proxy by `scripts/upstream.sh` (pinned versions; nothing of upstream's is
//! committed), started by [`mountguard_tests::real::RealCluster`]. Nodes are
//! node doubles (`mountguard_tests::real::node`) that are clients of the
//! real API server. Needs the `real-upstream` feature:
//!
//! ```text
//! bash scripts/upstream.sh
//! cargo nextest run -p mountguard-tests --features real-upstream --test real
//! ```
//!
//! plus the workspace binaries (`cargo build --workspace --bins`) and
//! python3 with helm-python-sdk and pyyaml (the chart is rendered).

mod harness;
#[path = "../shared/mod.rs"]
mod shared;

mod admission;
mod chaos;
mod control_plane;
mod controller;
mod kubelet;
mod kubelet_files;
mod kubelet_mountguard;
mod kubelet_propagation;
mod kubelet_remediation;
mod kubelet_skew;
mod kubelet_support;
mod kubelet_updates;
mod node_double;
mod operator;
mod remediation;
mod slurm;
mod slurm_contract;
mod workload_remediation;
