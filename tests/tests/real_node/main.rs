//! The real-node tier: the real kubelet on containerd v2.4.2 and runc
//! v1.5.3 (built by scripts/node-tools.sh, with kube-proxy, CoreDNS and
//! Helm 4 and 3), the real control plane of the `real` tier, the
//! mountguard images built here by scripts/images.sh and imported into the
//! runtime. Needs root and the `real-upstream` feature:
//!
//! ```text
//! bash scripts/upstream.sh && bash scripts/images.sh target/images
//! MOUNTGUARD_IMAGES_DIR=target/images \
//!   cargo nextest run -p mountguard-tests --features real-upstream --test real_node
//! ```
//!
//! When the runtime cannot run on the machine every test prints
//! `SKIPPED: <reason>` and passes (see
//! `mountguard_tests::real::real_node`).

mod admission;
mod alert;
mod arm64;
mod docs;
mod harness;
mod install;
mod local_cluster;
mod netpol;
mod nodeset;
mod restart;
mod runtime;
mod toggle;
mod upgrade;

use mountguard_tests::real::helm;
