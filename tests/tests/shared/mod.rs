//! Test bodies run against both control planes: the cluster in a box
//! (tests/tests/e2e) and the real one (tests/tests/real), through
//! [`mountguard_tests::rig::Rig`]. Each binary includes this directory with
//! `#[path]` and calls the bodies with its own system.

pub mod crash;
pub mod operator;
pub mod remediation;
