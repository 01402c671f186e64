//! The real-node tier: the real kubelet v1.33 on containerd and runc
//! (Debian's packages), the real control plane of the `real` tier, the
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
mod harness;
mod install;
mod local_cluster;
mod netpol;
mod nodeset;
mod runtime;
mod toggle;
mod upgrade;

use mountguard_tests::real::helm;
