//! The Slinky operator's own Slurm-side rules, as a double: what
//! slurm-operator v1.2.1 writes to Slurm besides recreating pods: the
//! pure decisions, and their application to a cluster's pods through its
//! API ([`crate::objects::Objects`]) and a slurmrestd double
//! ([`protect_busy_pods`], [`sync_cordon_pods`]), which the cluster in a
//! box and the real-upstream rig run.
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

use crate::apiserver::resources;
use crate::nodeset::LABEL_POD_HOSTNAME;
use crate::objects::Objects;
use crate::slurmrestd::SlurmHandle;

/// Prefix of every reason the operator sets (`nodeReasonPrefix`).
pub const REASON_PREFIX: &str = "slurm-operator: ";

/// The preStop hook's reason.
pub const PRESTOP_REASON: &str = "slurm-operator: Pod is terminating";

/// Pod annotation: the pod is cordoned (`AnnotationPodCordon`).
pub const ANNOTATION_POD_CORDON: &str = "nodeset.slinky.slurm.net/pod-cordon";

/// The pod label the Slinky operator sets on busy workers (the PDB selects it).
pub const LABEL_POD_PROTECT: &str = "nodeset.slinky.slurm.net/pod-protect";

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
    sync_cordon_with_reads(pod, n, n)
}

/// `syncCordon` for one pod whose Slurm node was read twice: `checked` by
/// `IsNodeDownForUnresponsive` / `IsNodeReasonOurs`, `acted` on by
/// `MakeNodeDrain` / `MakeNodeUndrain`. Each is a `Get` from the
/// slurm-client cache (`informerCache.Get`, slurm-client v1.2.1
/// pkg/client/informer.go), which a list may refresh between the two
/// reads (`RefreshNodeCache` of a reconcile, the informer's period).
pub fn sync_cordon_with_reads(
    pod: &PodFacts,
    checked: &SlurmFacts,
    acted: &SlurmFacts,
) -> CordonOutcome {
    if !reason_is_operators(&checked.reason) || down_for_unresponsive(checked) {
        return CordonOutcome::default();
    }
    let n = acted;
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

/// What one `syncPodUncordon` does for one pod.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UncordonOutcome {
    /// Remove the pod-cordon annotation from the pod.
    pub uncordon_pod: bool,
    /// The Slurm write, if any.
    pub update: Option<SlurmUpdate>,
}

/// `syncPodUncordon` for one pod the NodeSet keeps (slurm-operator v1.2.1,
/// internal/controller/nodeset/nodeset_sync.go: run after syncCordon on
/// every reconcile for the pods `doPodProcessing` / `doPodScale` keep): on
/// a Kubernetes node not cordoned (`isNodeCordoned`) whose Slurm reason
/// the operator counts as its own (`checked`, `IsNodeReasonOurs`), the
/// pod-cordon annotation goes (`makePodUncordon`) and the node is
/// undrained with no reason (`MakeNodeUndrain(pod, "")`, reading `acted`).
/// A pod cordoned by anyone else is uncordoned this way.
pub fn sync_pod_uncordon(
    pod: &PodFacts,
    checked: &SlurmFacts,
    acted: &SlurmFacts,
) -> UncordonOutcome {
    if pod.node_cordoned || !reason_is_operators(&checked.reason) {
        return UncordonOutcome::default();
    }
    UncordonOutcome {
        uncordon_pod: pod.pod_cordoned,
        update: make_undrain(acted, ""),
    }
}

/// The slurmd container's preStop hook: DOWN with the operator's reason,
/// if scontrol can authenticate (`key_matches`: the pod's `slurm.key` is
/// slurmctld's).
pub fn prestop(key_matches: bool) -> Option<SlurmUpdate> {
    key_matches.then(|| SlurmUpdate::Down(PRESTOP_REASON.to_string()))
}

// ------------------------------------- the rules, applied to a cluster

/// Labels running slurmd pods whose Slurm node is busy (ALLOCATED, MIXED or
/// COMPLETING) with `pod-protect=true` and removes the label otherwise, so
/// the PDB blocks evicting a busy worker.
pub(crate) fn protect_busy_pods<A: Objects + ?Sized>(
    api: &A,
    slurm: &SlurmHandle,
    namespace: &str,
    started: &std::collections::BTreeMap<String, String>,
) {
    for (host, uid) in started {
        let busy = slurm.node(host).is_some_and(|n| {
            n.state
                .iter()
                .any(|s| matches!(s.as_str(), "ALLOCATED" | "MIXED" | "COMPLETING"))
        });
        let Ok(pod) = api.get(&resources::PODS, namespace, host) else {
            continue;
        };
        if pod["metadata"]["uid"].as_str() != Some(uid.as_str()) {
            continue;
        }
        let labelled = pod["metadata"]["labels"][LABEL_POD_PROTECT] == "true";
        if busy != labelled {
            let value = if busy { json!("true") } else { Value::Null };
            let _ = api.merge_patch(
                &resources::PODS,
                namespace,
                host,
                &json!({"metadata": {"labels": {LABEL_POD_PROTECT: value}}}),
                None,
            );
        }
    }
}

/// The operator's `syncCordon` ([`sync_cordon`]) for every NodeSet pod in
/// `namespace` (through the API double's handle or a client of the real
/// API server), as `getNodeSetPods` lists them in `nodeset_sync.go`: every
/// pod the NodeSet controls, terminating ones included; a pod not bound to
/// a node yet is skipped (its Node cannot be read: `syncCordonFn` returns).
/// After syncCordon, `syncPodUncordon` ([`sync_pod_uncordon`]) for the
/// pods it keeps.
/// It reads the Kubernetes node's `spec.unschedulable` only, never its
/// taints.
///
/// With `cache` (the operator's slurm-client cache a pass behind), the
/// reason check reads each Slurm node as the previous pass saw it and the
/// write reads it now: the worst case of the two cache reads of
/// [`sync_cordon_with_reads`], every pass.
/// Slurm node `host` as the operator reads it, if slurmrestd knows it.
fn slurm_facts(slurm: &SlurmHandle, host: &str) -> Option<SlurmFacts> {
    let view = slurm.node(host)?;
    Some(SlurmFacts {
        state: view.state,
        reason: view.reason,
    })
}

pub(crate) fn sync_cordon_pods<A: Objects + ?Sized>(
    api: &A,
    slurm: &SlurmHandle,
    namespace: &str,
    mut cache: Option<&mut std::collections::BTreeMap<String, SlurmFacts>>,
) {
    for pod in api.list_all(&resources::PODS, Some(namespace)) {
        let controlled = pod["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|o| {
                o.iter()
                    .any(|o| o["kind"] == "NodeSet" && o["controller"] == true)
            });
        let Some(host) = pod["metadata"]["labels"][LABEL_POD_HOSTNAME].as_str() else {
            continue;
        };
        if !controlled {
            continue;
        }
        let name = pod["metadata"]["name"].as_str().unwrap_or(host);
        let Some(node_name) = pod["spec"]["nodeName"].as_str() else {
            continue;
        };
        let Ok(node) = api.get(&resources::NODES, "", node_name) else {
            continue;
        };
        let Some(now) = slurm_facts(slurm, host) else {
            continue;
        };
        let facts = PodFacts {
            pod: format!("{namespace}/{name}"),
            node: node_name.to_string(),
            node_cordoned: node["spec"]["unschedulable"] == true,
            pod_cordoned: pod["metadata"]["annotations"][ANNOTATION_POD_CORDON] == "true",
        };
        let out = match cache.as_deref_mut() {
            Some(c) => {
                let checked = c
                    .insert(host.to_string(), now.clone())
                    .unwrap_or_else(|| now.clone());
                sync_cordon_with_reads(&facts, &checked, &now)
            }
            None => sync_cordon(&facts, &now),
        };
        if out.cordon_pod {
            let _ = api.merge_patch(
                &resources::PODS,
                namespace,
                name,
                &json!({"metadata": {"annotations": {ANNOTATION_POD_CORDON: "true"}}}),
                None,
            );
        }
        if let Some(u) = out.update {
            slurm.rest_update(host, &u.body(), "slurm");
        }
        // syncPodUncordon, later in the same reconcile, for the pods it
        // keeps (not terminating), on the node as it is after syncCordon's
        // write (its own writes refresh slurm-client's entry).
        if pod["metadata"]["deletionTimestamp"].is_string() {
            continue;
        }
        let Some(after) = slurm_facts(slurm, host) else {
            continue;
        };
        let facts = PodFacts {
            pod_cordoned: facts.pod_cordoned || out.cordon_pod,
            ..facts
        };
        let checked = match cache.as_deref() {
            Some(c) => c.get(host).cloned().unwrap_or_else(|| after.clone()),
            None => after.clone(),
        };
        let un = sync_pod_uncordon(&facts, &checked, &after);
        if un.uncordon_pod {
            let _ = api.merge_patch(
                &resources::PODS,
                namespace,
                name,
                &json!({"metadata": {"annotations": {ANNOTATION_POD_CORDON: null}}}),
                None,
            );
        }
        if let Some(u) = un.update {
            slurm.rest_update(host, &u.body(), "slurm");
        }
    }
}
