//! End-to-end tests: the real `mountguard-agent` and `mountguard-controller`
//! binaries (child processes) against the cluster in a box (API server,
//! kubelet, NodeSet and slurmrestd doubles). Build the binaries first:
//! `cargo build --workspace --bins` (`cargo nextest run --workspace` does).
//! The demo tests run the same components in-process, and the tutorial's
//! commands run the demo binary.

mod harness;
#[path = "../shared/mod.rs"]
mod shared;

mod blind;
mod clock;
mod demo;
mod docs_commands;
mod forged;
mod fresh;
mod gate;
mod kubelet;
mod leader;
mod load;
mod outage;
mod remediation;
mod remediation_faults;
mod remediation_operator;
mod remediation_transient;
mod restart;
mod seed;
mod slurm_view;
mod status_api;
mod tls;
