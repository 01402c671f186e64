//! What a step asks of the executor, in order ([`Action`]), and the
//! reasons of the Events it emits ([`EventReason`]).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use serde::{Deserialize, Serialize};

use super::attempt::{Phase, PriorDrain};

/// Event reasons (on the Pod and the NodeSet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventReason {
    /// An attempt started (drain requested).
    RemediationStarted,
    /// The Slurm node is drained and free of jobs.
    SlurmNodeDrained,
    /// The pod was evicted.
    PodEvicted,
    /// The replacement is fresh on the node and Slurm responds.
    RemediationVerified,
    /// Undrained; done.
    RemediationSucceeded,
    /// Failed.
    RemediationFailed,
    /// Dry-run: what would be done.
    RemediationDryRun,
    /// Replacing the pod alone cannot help: other pods pin the cache entry.
    KubeletCachePinned,
    /// A workload's remediation annotation cannot be read: nothing is
    /// remediated for it until it is fixed.
    InvalidRemediationAnnotation,
}

impl EventReason {
    /// Every reason (docs/reference/events.md lists them). A variant added
    /// to the enum stops [`Self::as_str`] from compiling until it is named
    /// there; add it here too.
    pub const ALL: [EventReason; 9] = [
        EventReason::RemediationStarted,
        EventReason::SlurmNodeDrained,
        EventReason::PodEvicted,
        EventReason::RemediationVerified,
        EventReason::RemediationSucceeded,
        EventReason::RemediationFailed,
        EventReason::RemediationDryRun,
        EventReason::KubeletCachePinned,
        EventReason::InvalidRemediationAnnotation,
    ];

    /// The reason string.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::RemediationStarted => "RemediationStarted",
            EventReason::SlurmNodeDrained => "SlurmNodeDrained",
            EventReason::PodEvicted => "PodEvicted",
            EventReason::RemediationVerified => "RemediationVerified",
            EventReason::RemediationSucceeded => "RemediationSucceeded",
            EventReason::RemediationFailed => "RemediationFailed",
            EventReason::RemediationDryRun => "RemediationDryRun",
            EventReason::KubeletCachePinned => "KubeletCachePinned",
            EventReason::InvalidRemediationAnnotation => "InvalidRemediationAnnotation",
        }
    }

    /// Warning (true) or Normal event.
    pub fn warning(self) -> bool {
        matches!(
            self,
            EventReason::RemediationFailed
                | EventReason::KubeletCachePinned
                | EventReason::InvalidRemediationAnnotation
        )
    }
}

/// What the executor must do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Write the attempt into the NodeSet annotation. If this fails, the
    /// executor must not perform the remaining actions of the step.
    Persist,
    /// `POST /node/{node}` `{"state":["DRAIN"],"reason":...}`.
    DrainNode {
        /// Slurm node name.
        node: String,
        /// The full reason.
        reason: String,
    },
    /// `POST /node/{node}` `{"state":["FAIL"],"reason":...}`: the hold
    /// from just before the eviction until the release. Like DRAIN it
    /// keeps jobs off the node, but nothing the Slinky operator or Slurm
    /// does on its own clears it: the preStop hook's DOWN keeps the flag,
    /// syncCordon's undrain does nothing without DRAIN (`MakeNodeUndrain`,
    /// slurm-operator v1.2.1 slurmcontrol.go), and a node returned to
    /// service by `ReturnToService` keeps its flags (`_node_did_resp`,
    /// `validate_node_specs` in Slurm's `src/slurmctld/node_mgr.c`).
    HoldNode {
        /// Slurm node name.
        node: String,
        /// Our reason.
        reason: String,
    },
    /// Hands the node back to whoever had drained it before mountguard
    /// acted: `{"state":[prior.state],"reason":prior.reason}`, only if the
    /// node's reason, re-read right before, still equals `owned_reason`.
    RestoreDrain {
        /// Slurm node name.
        node: String,
        /// The reason we set.
        owned_reason: String,
        /// What was there before.
        prior: PriorDrain,
    },
    /// `POST /node/{node}` `{"state":["UNDRAIN"]}`, only if the node's
    /// reason, re-read right before, still equals `owned_reason`.
    UndrainNode {
        /// Slurm node name.
        node: String,
        /// The reason we set.
        owned_reason: String,
    },
    /// `POST /node/{node}` `{"state":["RESUME"]}`, only if the node's
    /// reason, re-read right before, still equals `owned_reason`: instead
    /// of an undrain when the Slinky operator's preStop hook set the node
    /// DOWN after our eviction (RESUME clears DOWN and our DRAIN at once,
    /// so the node opens only now, after the verification).
    ResumeNode {
        /// Slurm node name.
        node: String,
        /// The reason we set.
        owned_reason: String,
    },
    /// Cordon the Kubernetes node (`spec.unschedulable`) and record
    /// `owner` in its annotation, only if it is schedulable now. Grouped
    /// attempts only: no replacement may start before every old member is
    /// gone, or it would be served the still-pinned cache entry.
    CordonNode {
        /// Kubernetes node.
        node: String,
        /// The group id.
        owner: String,
    },
    /// Uncordon the Kubernetes node, only if its annotation still names
    /// `owner`.
    UncordonNode {
        /// Kubernetes node.
        node: String,
        /// The group id.
        owner: String,
    },
    /// Eviction API with a UID precondition; never a bare delete.
    Evict {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Pod UID.
        uid: String,
    },
    /// The Eviction API with `dryRun=All` and the pod's UID as
    /// precondition: whether it would evict the pod now. The API server
    /// runs every check of a real eviction, the PodDisruptionBudget's
    /// included, and writes nothing (kubernetes
    /// pkg/registry/core/pod/storage/eviction.go, `EvictionREST.Create`:
    /// `checkAndDecrement` returns before the budget's status is updated
    /// on a dry run, and the store's `Delete` honours the dry run). Not a
    /// write: asked before a workload attempt holds its node, so that a
    /// refusal holds nothing.
    CheckEviction {
        /// Namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Pod UID.
        uid: String,
    },
    /// An Event on the Pod and the NodeSet.
    Event {
        /// Reason.
        reason: EventReason,
        /// Message (names volume, fingerprints, pods; never content).
        message: String,
    },
    /// The attempt left `from` for `to` (metrics, logs).
    Transition {
        /// Previous phase.
        from: Phase,
        /// New phase.
        to: Phase,
    },
}

impl Action {
    /// A write outside the process (Slurm, a node, the Eviction API): what
    /// a Persist must precede.
    pub fn is_external_write(&self) -> bool {
        matches!(
            self,
            Action::DrainNode { .. }
                | Action::HoldNode { .. }
                | Action::RestoreDrain { .. }
                | Action::UndrainNode { .. }
                | Action::ResumeNode { .. }
                | Action::Evict { .. }
                | Action::CordonNode { .. }
                | Action::UncordonNode { .. }
        )
    }
}
