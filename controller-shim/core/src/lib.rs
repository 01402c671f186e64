//! mountguard's pure core: everything the controller decides, and nothing it
//! does.
//!
//! The heart is the **verdict engine**: a pure function of the cluster's
//! pods and source objects (Secrets, ConfigMaps), the node inventories
//! reported by the agents, an explicit history ([`EngineState`]) and the
//! current time. It computes what the kubelet should have projected into
//! every Secret, ConfigMap and projected volume, every subPath mount and
//! every environment reference, compares that with what the agent saw on
//! the node, and returns one [`Verdict`] per subject.
//!
//! No Kubernetes client, no async runtime, no HTTP, no clock reads: this
//! crate's `Cargo.toml` has no kube, k8s-openapi, tokio or hyper dependency
//! (see the test below), so a reader knows every function here is a
//! decision on values. The controller crate (`mountguard-controller`) turns
//! API objects into this crate's model and performs what it decides.
//!
//! Layout:
//! * [`model`]: the compact model (pods, sources, observed node content);
//!   Secret and ConfigMap content is hashed when the model is built and the
//!   plaintext dropped.
//! * [`projection`]: the kubelet's projection rules: expected files per
//!   volume, subPath and env reference.
//! * [`uid`]: a pod's UID in 16 bytes ([`PodUid`]), the key of every
//!   per-pod structure.
//! * [`index`]: the in-memory index (pods by source and by node) a caller
//!   updates incrementally.
//! * [`verdict`]: evaluation, verdict types and the engine state.
//! * [`fingerprint`]: keyed fingerprints, the only form in which digests
//!   leave the engine.
//! * [`rollout`]: the rollout gate's decision (`wait`): is an object's
//!   current content verified on every node, and what is missing.
//! * [`remediation`]: the remediation state machine, planner and recovery.
//! * [`admission`]: the admission webhook's decision: what to tell a caller
//!   deleting or re-creating a Secret or ConfigMap whose name nodes keep
//!   serving from their kubelet's cache.
//! * `testkit` (feature `testkit`): builders for tests and benchmarks.

pub mod admission;
pub mod fingerprint;
pub mod index;
pub mod model;
pub mod projection;
pub mod remediation;
pub mod rollout;
pub mod table;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod uid;
pub mod verdict;

pub use fingerprint::{Fingerprint, Fingerprinter};
pub use index::{ClusterIndex, PodId};
pub use model::{Digest, Interner, ObservedNode, PodModel, SourceContent, SourceKind, SourceRef};
pub use uid::PodUid;
pub use verdict::{
    Config, Engine, EngineState, Evaluation, FrozenCause, StaleCause, State, Subject,
    UnverifiableReason, Verdict,
};

/// Annotation (on the pod, or on a NodeSet pod template, from which pods
/// inherit it) listing, comma separated, the volumes whose content the pod's
/// process reads only at start.
pub const READ_AT_START_ANNOTATION: &str = "mountguard.io/read-at-start";

/// Errors of the core crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A configuration value or a persisted record is out of range or
    /// malformed.
    #[error("invalid configuration: {0}")]
    Config(String),
}

#[cfg(test)]
mod tests {
    /// The crate stays pure: none of these may appear among its
    /// dependencies (they would bring I/O, a runtime or API types into the
    /// decisions).
    #[test]
    fn dependencies_stay_pure() {
        let manifest = include_str!("../Cargo.toml");
        let mut in_deps = false;
        for line in manifest.lines() {
            let line = line.trim();
            if line.starts_with('[') {
                in_deps = line.contains("dependencies");
                continue;
            }
            if !in_deps || line.starts_with('#') || line.is_empty() {
                continue;
            }
            let name = line
                .split(|c: char| c == '=' || c == '.' || c.is_whitespace())
                .next()
                .unwrap_or("");
            for banned in ["kube", "k8s-openapi", "tokio", "hyper", "mountguard-serve"] {
                assert!(
                    !name.starts_with(banned),
                    "mountguard-core must not depend on {name}: keep I/O in mountguard-controller"
                );
            }
        }
    }
}
