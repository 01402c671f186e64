//! The Slinky operator's own Slurm-side rules, as a double: what
//! slurm-operator v1.2.1 writes to Slurm besides recreating pods. Pure
//! decisions here; the cluster in a box applies them
//! ([`crate::cluster::ClusterBuilder::slinky_operator_rules`]) through the
//! slurmrestd double.
//!
//! Followed, at tag v1.2.1 of SlinkyProject/slurm-operator:
//! - `internal/builder/workerbuilder/worker_app.go` (the slurmd container's
//!   `Lifecycle.PreStop`): on pod termination, `scontrol update
//!   nodename=$(hostname) state=down reason='slurm-operator: Pod is
//!   terminating'`. scontrol talks to slurmctld with the pod's auth key, so
//!   the hook changes nothing when that key is not slurmctld's
//!   ([`prestop`]).
//! - `internal/controller/nodeset/nodeset_sync.go`, `syncCordon` (run on
//!   every reconcile for every NodeSet pod): a Slurm node whose reason is
//!   not the operator's, or that is DOWN for not responding, is left alone;
//!   otherwise a cordoned Kubernetes node cordons the pod (annotation
//!   `nodeset.slinky.slurm.net/pod-cordon`) and drains the Slurm node; a
//!   cordoned pod drains it; an uncordoned pod undrains it
//!   ([`sync_cordon`]).
//! - `internal/controller/nodeset/slurmcontrol/slurmcontrol.go`:
//!   `IsNodeReasonOurs` (an empty reason counts as the operator's),
//!   `IsNodeDownForUnresponsive` (DOWN and a reason containing "Not
//!   responding"), `MakeNodeDrain` (keeps a non-empty existing reason unless
//!   told to override; no request when already drained with that reason),
//!   `MakeNodeUndrain` (no request unless DRAIN is set and UNDRAIN is not;
//!   the reason sent is prefixed) and `FormatNodeReason` (the
//!   `slurm-operator: ` prefix).

use serde_json::{Value, json};

/// Prefix of every reason the operator sets (`nodeReasonPrefix`).
pub const REASON_PREFIX: &str = "slurm-operator: ";

/// The preStop hook's reason.
pub const PRESTOP_REASON: &str = "slurm-operator: Pod is terminating";

/// Pod annotation: the pod is cordoned (`AnnotationPodCordon`).
pub const ANNOTATION_POD_CORDON: &str = "nodeset.slinky.slurm.net/pod-cordon";

/// A Slurm node as the operator reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SlurmFacts {
    /// `state` array.
    pub state: Vec<String>,
    /// `reason` (empty when none).
    pub reason: String,
}

impl SlurmFacts {
    fn has(&self, s: &str) -> bool {
        self.state.iter().any(|x| x == s)
    }
}

/// One NodeSet pod as `syncCordon` sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodFacts {
    /// `namespace/name` (klog.KObj).
    pub pod: String,
    /// `spec.nodeName`.
    pub node: String,
    /// The Kubernetes node is cordoned (`spec.unschedulable`).
    pub node_cordoned: bool,
    /// The pod carries `pod-cordon: "true"`.
    pub pod_cordoned: bool,
}

/// A Slurm write the operator makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmUpdate {
    /// `state: [DRAIN]` with this reason.
    Drain(String),
    /// `state: [UNDRAIN]` with this reason.
    Undrain(String),
    /// `state: [DOWN]` with this reason (the preStop hook, over scontrol).
    Down(String),
}

impl SlurmUpdate {
    /// The `update_node_msg` body.
    pub fn body(&self) -> Value {
        match self {
            SlurmUpdate::Drain(r) => json!({"state": ["DRAIN"], "reason": r}),
            SlurmUpdate::Undrain(r) => json!({"state": ["UNDRAIN"], "reason": r}),
            SlurmUpdate::Down(r) => json!({"state": ["DOWN"], "reason": r}),
        }
    }
}

/// What one `syncCordon` pass does for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CordonOutcome {
    /// Set the pod-cordon annotation on the pod.
    pub cordon_pod: bool,
    /// The Slurm write, if any.
    pub update: Option<SlurmUpdate>,
}

/// `FormatNodeReason`.
pub fn format_reason(reason: &str) -> String {
    format!("{REASON_PREFIX}{reason}")
}

/// `IsNodeReasonOurs`: empty, or with the operator's prefix.
pub fn reason_is_operators(reason: &str) -> bool {
    reason.is_empty() || reason.starts_with(REASON_PREFIX)
}

/// `IsNodeDownForUnresponsive`.
pub fn down_for_unresponsive(n: &SlurmFacts) -> bool {
    n.has("DOWN") && n.reason.contains("Not responding")
}

/// `MakeNodeDrain(reason, overrideReason)`.
pub fn make_drain(n: &SlurmFacts, reason: &str, override_reason: bool) -> Option<SlurmUpdate> {
    let reason = if reason.is_empty() { "unknown" } else { reason };
    let mut new = format_reason(reason);
    if !override_reason && !n.reason.is_empty() {
        new = n.reason.clone();
    }
    if n.has("DRAIN") && n.reason == new {
        return None;
    }
    Some(SlurmUpdate::Drain(new))
}

/// `MakeNodeUndrain(reason)`.
pub fn make_undrain(n: &SlurmFacts, reason: &str) -> Option<SlurmUpdate> {
    if !n.has("DRAIN") || n.has("UNDRAIN") {
        return None;
    }
    let r = if reason.is_empty() {
        String::new()
    } else {
        format_reason(reason)
    };
    Some(SlurmUpdate::Undrain(r))
}

/// `syncCordon` for one pod.
pub fn sync_cordon(pod: &PodFacts, n: &SlurmFacts) -> CordonOutcome {
    if !reason_is_operators(&n.reason) || down_for_unresponsive(n) {
        return CordonOutcome::default();
    }
    if pod.node_cordoned {
        let reason = format!(
            "Node ({}) was cordoned, Pod ({}) must be cordoned",
            pod.node, pod.pod
        );
        return CordonOutcome {
            cordon_pod: !pod.pod_cordoned,
            update: make_drain(n, &reason, false),
        };
    }
    if pod.pod_cordoned {
        let reason = format!("Pod ({}) was cordoned", pod.pod);
        return CordonOutcome {
            cordon_pod: false,
            update: make_drain(n, &reason, false),
        };
    }
    let reason = format!("Pod ({}) was uncordoned", pod.pod);
    CordonOutcome {
        cordon_pod: false,
        update: make_undrain(n, &reason),
    }
}

/// The slurmd container's preStop hook: DOWN with the operator's reason,
/// if scontrol can authenticate (`key_matches`: the pod's `slurm.key` is
/// slurmctld's).
pub fn prestop(key_matches: bool) -> Option<SlurmUpdate> {
    key_matches.then(|| SlurmUpdate::Down(PRESTOP_REASON.to_string()))
}
