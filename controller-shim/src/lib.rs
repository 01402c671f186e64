//! mountguard controller library.
//!
//! The heart of the controller is the **verdict engine**: a pure function of
//! the cluster's pods and source objects (Secrets, ConfigMaps), the node
//! inventories reported by the agents, an explicit history
//! ([`EngineState`]) and the current time. It computes what the kubelet
//! should have projected into every Secret, ConfigMap and projected volume,
//! every subPath mount and every environment reference, compares that with
//! what the agent saw on the node, and returns one [`Verdict`] per subject.
//!
//! Layout:
//! * [`model`]: the compact, kube-free model (pods, sources, observed node
//!   content); Secret and ConfigMap content is hashed when the model is built
//!   and the plaintext dropped.
//! * [`convert`]: the edge from k8s-openapi types (and raw `kubectl` JSON)
//!   into the model.
//! * [`projection`]: the kubelet's projection rules: expected files per
//!   volume, subPath and env reference.
//! * [`index`]: the in-memory index (pods by source and by node) a caller
//!   updates incrementally.
//! * [`verdict`]: evaluation, verdict types and the engine state.
//! * [`fingerprint`]: keyed fingerprints, the only form in which digests
//!   leave the engine.
//! * [`offline`]: the `verify` command.
//! * [`rollout`]: the rollout gate's decision (`wait`): is an object's
//!   current content verified on every node, and what is missing.
//! * [`live`]: the running controller (`run`, `status`).

pub mod convert;
pub mod fingerprint;
pub mod index;
pub mod live;
pub mod model;
pub mod offline;
pub mod projection;
pub mod remediation;
pub mod rollout;
#[doc(hidden)]
pub mod testkit;
pub mod verdict;

#[cfg(test)]
mod engine_tests;
#[cfg(test)]
mod kubelet_rules_tests;

pub use fingerprint::{Fingerprint, Fingerprinter};
pub use index::{ClusterIndex, PodId};
pub use model::{Digest, Interner, ObservedNode, PodModel, SourceContent, SourceKind, SourceRef};
pub use verdict::{
    Config, Engine, EngineState, Evaluation, FrozenCause, StaleCause, State, Subject,
    UnverifiableReason, Verdict,
};

/// Annotation (on the pod, or on a NodeSet pod template, from which pods
/// inherit it) listing, comma separated, the volumes whose content the pod's
/// process reads only at start.
pub const READ_AT_START_ANNOTATION: &str = "mountguard.io/read-at-start";

/// Errors of the controller library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or stream could not be read.
    #[error("{file}: {source}")]
    Io {
        /// The file (or `-` for standard input).
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A document is not valid JSON.
    #[error("{file}: invalid JSON at line {line}, column {column}: {message}")]
    Json {
        /// The file (or `-` for standard input).
        file: String,
        /// 1-based line of the problem.
        line: usize,
        /// 1-based column of the problem.
        column: usize,
        /// What serde_json reported.
        message: String,
    },
    /// A JSON document or list item is not a valid object of its kind.
    #[error("{file}: {place}: {message}")]
    Object {
        /// The file (or `-` for standard input).
        file: String,
        /// Where in the file, e.g. `items[3] (Pod default/web-0)`.
        place: String,
        /// What is wrong.
        message: String,
    },
    /// A node inventory is not valid.
    #[error("{file}: {source}")]
    Inventory {
        /// The file.
        file: String,
        /// The inventory crate's error.
        source: mountguard_inventory::Error,
    },
    /// A configuration value is out of range or malformed.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The Kubernetes API or its configuration failed.
    #[error("Kubernetes API: {0}")]
    Kube(String),
    /// A TLS certificate or key is unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The input holds nothing to judge (no pod, or no pod on the nodes
    /// scanned): a verdict of "all fresh" would be vacuous.
    #[error("nothing to judge: {0}")]
    NothingToJudge(String),
    /// The controller's metrics port could not be reached (`status`).
    #[error(
        "cannot reach the controller at {url}: {message}. Is --url the controller's metrics \
         port? From outside the cluster, forward it first: `kubectl -n <namespace> port-forward \
         svc/<release>-mountguard-controller-metrics 8080` (the chart's NOTES print the exact \
         command), then `mountguard-controller status --url http://127.0.0.1:8080`"
    )]
    Unreachable {
        /// The URL that was tried.
        url: String,
        /// Why the connection failed.
        message: String,
    },
}

impl Error {
    /// A stable, low-cardinality label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Io { .. } => "io",
            Error::Json { .. } => "json",
            Error::Object { .. } => "object",
            Error::Inventory { .. } => "inventory",
            Error::Config(_) => "config",
            Error::Kube(_) => "kube",
            Error::Tls(_) => "tls",
            Error::NothingToJudge(_) => "nothing_to_judge",
            Error::Unreachable { .. } => "unreachable",
        }
    }
}
