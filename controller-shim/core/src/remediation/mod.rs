//! Remediation of stale Slinky NodeSet pods: drain the Slurm node, evict the
//! pod, wait for the NodeSet to recreate it, verify the replacement on the
//! node (by the bytes) and in Slurm, undrain. And of the pods of
//! Deployments, ReplicaSets, StatefulSets and DaemonSets: the same attempt
//! without its Slurm steps (evict, wait for the owner's replacement, verify
//! it on the node it landed on).
//!
//! * [`machine`]: the pure per-attempt state machine (`step`), the persisted
//!   attempt record and the drain-reason ownership rules.
//! * [`plan`]: which pods qualify, budgets, pinned caches, dry-run.
//! * [`recovery`]: what a (re)started controller does with persisted
//!   attempts and Slurm nodes drained with a `mountguard:` reason.
//! * [`workload`]: the owners of workload pods: kinds, annotations, their
//!   availability, how each kind replaces a pod.
//! * [`inputs`]: what the executor computes from verdicts, NodeSets,
//!   workloads and Nodes for the planner and the machine (which workload a
//!   pod belongs to, whether a group is drained).
//! * [`slurm_view`]: what Slurm shows of a worker whose `slurm.key` is
//!   stale (read-only, beside the verdict): which nodes to read, when, and
//!   what to say.
//!
//! All of it is pure: no I/O, no clock reads. The slurmrestd client and the
//! executor (the thin I/O loop) are part of the live controller
//! (`mountguard-controller`, `remediation::slurm` and `remediation::executor`).

pub mod inputs;
pub mod machine;
pub mod plan;
pub mod recovery;
pub mod slurm_view;
pub mod workload;

#[cfg(test)]
mod test_support;

pub use machine::{
    Action, Attempt, AttemptsRecord, EventReason, EvictionResult, FailReason, FailurePolicy,
    Finding, MachineConfig, NewPodCheck, NodeCordon, Observations, Phase, SlurmNodeState,
    SlurmObservation, WorkloadObservation, WriteResult, reason_is, step,
};

/// Opt-in annotation: `"true"` on a NodeSet, `"evict"` on a Deployment,
/// ReplicaSet, StatefulSet or DaemonSet.
pub const REMEDIATE_ANNOTATION: &str = "mountguard.io/remediate";
/// NodeSet or workload annotation: which verdicts qualify, e.g.
/// `Stale,Frozen/ReadAtStart`.
pub const REMEDIATE_ON_ANNOTATION: &str = "mountguard.io/remediate-on";
/// Annotation holding the persisted attempts (JSON, [`AttemptsRecord`]) on
/// the NodeSet or the workload the pods belong to.
pub const ATTEMPTS_ANNOTATION: &str = "mountguard.io/remediation-attempts";
/// Pod label naming the Slurm node of a NodeSet pod.
pub const POD_HOSTNAME_LABEL: &str = "nodeset.slinky.slurm.net/pod-hostname";
/// Node annotation naming the group whose attempts hold new pods off the
/// node (`--replace-pinning-pods` only), set and removed together with
/// [`HOLD_TAINT_KEY`]. A change of a Node's annotations is what makes the
/// Slinky operator reconcile the NodeSets with pods there (slurm-operator
/// v1.2.1, internal/controller/nodeset/eventhandler/eventhandler_node.go,
/// `NodeEventHandler.Update`: `Spec.Unschedulable`, annotations and labels;
/// a taint alone is not), so a DaemonSet-mode NodeSet recreates its pod as
/// soon as the hold is lifted.
pub const CORDON_ANNOTATION: &str = "mountguard.io/cordoned-by";
/// Key of the `NoSchedule` taint (value: the group id) that holds new pods
/// off a node while a group's old pods go away (`--replace-pinning-pods`).
/// A taint, not a cordon: the Slinky operator's syncCordon reads the
/// node's `spec.unschedulable` only (slurm-operator v1.2.1,
/// internal/controller/nodeset/nodeset_sync.go, `syncCordon` and
/// `isNodeCordoned`) and would drain every other NodeSet worker on a
/// cordoned node; it never reads taints, while kube-scheduler's
/// TaintToleration filter and the operator's DaemonSet-mode placement
/// (`PodShouldRunOnNode`, internal/controller/nodeset/utils/utils.go) both
/// keep new pods off the node and leave running ones alone.
pub const HOLD_TAINT_KEY: &str = "mountguard.io/replacing";
/// Prefix of every reason the Slinky operator sets (slurm-operator v1.2.1,
/// internal/controller/nodeset/slurmcontrol/slurmcontrol.go,
/// `nodeReasonPrefix` / `FormatNodeReason`); its syncCordon undrains a node
/// whose reason has it, or is empty (`IsNodeReasonOurs`).
pub const OPERATOR_REASON_PREFIX: &str = "slurm-operator: ";
/// The reason the slurmd container's preStop hook sets with
/// `state=down` (slurm-operator v1.2.1,
/// internal/builder/workerbuilder/worker_app.go, `Lifecycle.PreStop`).
pub const OPERATOR_PRESTOP_REASON: &str = "slurm-operator: Pod is terminating";
/// Prefix of every Slurm drain reason mountguard sets.
pub const REASON_PREFIX: &str = "mountguard:";
