//! The per-attempt state machine.
//!
//! ```text
//! Pending -> Draining -> Drained -> Evicting -> AwaitingReplacement
//!         -> Verifying -> Undraining -> Succeeded
//!   (any) -> Failed{reason}
//! ```
//!
//! [`step`] is pure: it takes the attempt, what the executor observed since
//! the last step ([`Observations`]), the current time and the configuration,
//! and returns the next attempt and the [`Action`]s to perform, in order.
//! Every transition emits [`Action::Persist`] *before* any external write of
//! the same step, so a crash after a write always finds a record of it.
//!
//! Progress is decided by what Slurm and the API show, never by the outcome
//! of our own writes alone: a write whose result was lost (crash, timeout) is
//! simply observed (or re-issued) on the next step. slurmrestd errors are
//! retried with backoff and never count as progress.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::REASON_PREFIX;
use crate::verdict::SubjectKey;

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FailReason {
    /// The Slurm node was already drained by someone else before our drain.
    NodeDrainedByOthers,
    /// slurmrestd does not know the Slurm node.
    SlurmNodeNotFound,
    /// slurmrestd refused the drain (not a transient error).
    DrainRejected,
    /// Jobs did not leave the node within the drain timeout.
    DrainTimeout,
    /// Someone removed the drain before the pod was evicted.
    DrainRemoved,
    /// The pod was deleted or replaced before mountguard touched it.
    PodChanged,
    /// The Eviction API kept refusing within the eviction timeout.
    EvictionTimeout,
    /// The NodeSet did not recreate the pod within the replacement timeout.
    ReplacementTimeout,
    /// The replacement pod still sees stale or frozen content.
    ReplacementStale,
    /// The replacement was not verified fresh and responding in time.
    VerificationTimeout,
    /// slurmrestd refused the undrain (not a transient error).
    UndrainRejected,
}

impl FailReason {
    /// The reason name.
    pub fn as_str(self) -> &'static str {
        match self {
            FailReason::NodeDrainedByOthers => "NodeDrainedByOthers",
            FailReason::SlurmNodeNotFound => "SlurmNodeNotFound",
            FailReason::DrainRejected => "DrainRejected",
            FailReason::DrainTimeout => "DrainTimeout",
            FailReason::DrainRemoved => "DrainRemoved",
            FailReason::PodChanged => "PodChanged",
            FailReason::EvictionTimeout => "EvictionTimeout",
            FailReason::ReplacementTimeout => "ReplacementTimeout",
            FailReason::ReplacementStale => "ReplacementStale",
            FailReason::VerificationTimeout => "VerificationTimeout",
            FailReason::UndrainRejected => "UndrainRejected",
        }
    }
}

/// The phase of an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    /// Selected; nothing written yet.
    Pending,
    /// Drain requested (persisted before the request).
    Draining,
    /// Our drain is in place; waiting for jobs to leave.
    Drained,
    /// Evicting the pod through the Eviction API.
    Evicting,
    /// Waiting for the NodeSet to recreate the pod (same name, new UID).
    AwaitingReplacement,
    /// Waiting for the new pod's inventory to show fresh content and for the
    /// Slurm node to respond.
    Verifying,
    /// Removing our drain.
    Undraining,
    /// Done: verified and undrained (or left to a drain that is not ours).
    Succeeded,
    /// Failed; see the reason and [`Attempt::kept_drained`].
    Failed(FailReason),
}

impl Phase {
    /// The phase name (`Failed` without its reason), for metrics and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Draining => "Draining",
            Phase::Drained => "Drained",
            Phase::Evicting => "Evicting",
            Phase::AwaitingReplacement => "AwaitingReplacement",
            Phase::Verifying => "Verifying",
            Phase::Undraining => "Undraining",
            Phase::Succeeded => "Succeeded",
            Phase::Failed(_) => "Failed",
        }
    }

    /// Succeeded or Failed.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed(_))
    }
}

/// What to do with our drain when an attempt fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum FailurePolicy {
    /// Release the drain when the pod was not touched yet; keep it when the
    /// pod was evicted (its replacement may be stale: a node with a stale
    /// `slurm.key` cannot work).
    #[default]
    Auto,
    /// Always keep our drain (the reason says why).
    KeepDrained,
    /// Always release our drain.
    Undrain,
}

/// Timeouts and retry pacing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineConfig {
    /// From the drain request until jobs have left the node.
    pub drain_timeout: SignedDuration,
    /// Eviction refused (PDB, errors) for longer than this fails the attempt.
    pub eviction_timeout: SignedDuration,
    /// From the eviction until the NodeSet recreated the pod.
    pub replacement_timeout: SignedDuration,
    /// From the replacement until it is verified fresh and responding.
    pub verification_timeout: SignedDuration,
    /// What to do with our drain on failure.
    pub on_failure: FailurePolicy,
    /// First retry delay after an error; doubled per consecutive error.
    pub retry_base: SignedDuration,
    /// Longest retry delay.
    pub retry_max: SignedDuration,
    /// How long to wait for a write to show before re-issuing it.
    pub write_settle: SignedDuration,
    /// How long slurmrestd may answer "not found" for the node before it
    /// counts: until then it is retried like any transient error (a node
    /// re-registering, a slurmctld restarting, a lagging replica of its
    /// state all answer so once in a while).
    pub not_found_grace: SignedDuration,
}

impl Default for MachineConfig {
    fn default() -> Self {
        Self {
            drain_timeout: SignedDuration::from_hours(24),
            eviction_timeout: SignedDuration::from_mins(30),
            replacement_timeout: SignedDuration::from_mins(15),
            verification_timeout: SignedDuration::from_mins(10),
            on_failure: FailurePolicy::Auto,
            retry_base: SignedDuration::from_secs(5),
            retry_max: SignedDuration::from_mins(5),
            write_settle: SignedDuration::from_secs(10),
            not_found_grace: SignedDuration::from_mins(5),
        }
    }
}

/// A Slurm node as last read.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SlurmNodeState {
    /// `state` array (base state and flags), e.g. `["MIXED","DRAIN"]`.
    pub state: Vec<String>,
    /// `reason`.
    pub reason: String,
    /// `reason_set_by_user`.
    pub reason_set_by_user: String,
    /// `alloc_cpus`: CPUs Slurm still accounts to jobs on the node.
    #[serde(default)]
    pub alloc_cpus: u32,
}

impl SlurmNodeState {
    /// Whether the state array holds `flag`.
    pub fn has(&self, flag: &str) -> bool {
        self.state.iter().any(|s| s == flag)
    }

    /// DRAIN is set.
    pub fn drain(&self) -> bool {
        self.has("DRAIN")
    }

    /// Jobs are still on the node: ALLOCATED, MIXED or COMPLETING, or CPUs
    /// still allocated. The last covers a node that stopped responding: its
    /// base state reads DOWN while Slurm still holds its jobs (until they
    /// are requeued or killed), and evicting the pod then would end them.
    pub fn busy(&self) -> bool {
        self.has("ALLOCATED") || self.has("MIXED") || self.has("COMPLETING") || self.alloc_cpus > 0
    }

    /// Closed to new jobs by a drain or a FAIL (Slurm sets one or the
    /// other: `update_node` in `src/slurmctld/node_mgr.c` clears both before
    /// setting either).
    pub fn held(&self) -> bool {
        self.drain() || self.has("FAIL")
    }

    /// Drained in Slurm's sense (DRAIN, or FAIL, and no jobs).
    pub fn drained(&self) -> bool {
        self.held() && !self.busy()
    }

    /// slurmd responds: none of DOWN, NOT_RESPONDING, FAIL.
    pub fn responding(&self) -> bool {
        !(self.has("DOWN") || self.has("NOT_RESPONDING") || self.has("FAIL"))
    }

    /// The drain reason is mountguard's (any attempt).
    pub fn reason_is_mountguard(&self) -> bool {
        self.reason.starts_with(REASON_PREFIX)
    }
}

/// What the executor read from slurmrestd for the attempt's node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SlurmObservation {
    /// Not read this round.
    #[default]
    NotRead,
    /// The node as read.
    Node(SlurmNodeState),
    /// slurmrestd does not know the node.
    NotFound,
    /// The read failed.
    Error {
        /// Whether a retry may succeed (transport, 5xx); 401/403 are not.
        transient: bool,
        /// What failed (no token).
        message: String,
    },
}

/// Outcome of the last Slurm write the executor performed for this attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteResult {
    /// Accepted.
    Ok,
    /// Refused or failed.
    Err {
        /// Whether a retry may succeed.
        transient: bool,
        /// What failed.
        message: String,
    },
}

/// Outcome of the last eviction request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionResult {
    /// The API accepted the eviction.
    Evicted,
    /// The pod (with that UID) no longer exists.
    Gone,
    /// 429: a PodDisruptionBudget refuses it now.
    Refused {
        /// `Retry-After`, if given.
        retry_after: Option<SignedDuration>,
        /// The API's message.
        message: String,
    },
    /// Any other error.
    Error {
        /// What failed.
        message: String,
    },
}

/// The replacement pod's verdicts on the previously failing subjects.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NewPodCheck {
    /// No verdict yet (no inventory of the new pod, Unverifiable,
    /// Propagating): wait.
    #[default]
    NotYet,
    /// Every previously failing subject is Fresh.
    Fresh,
    /// Some previously failing subject is still Stale or Frozen.
    StillStale {
        /// Which subject and verdict (fingerprints only).
        message: String,
    },
}

/// Everything observed since the last step. Plain data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observations {
    /// The Slurm node.
    pub slurm: SlurmObservation,
    /// UID of the pod currently holding the attempt's pod name (None: absent).
    pub pod_uid: Option<String>,
    /// Verdicts of the replacement pod (only looked at in Verifying).
    pub new_pod: NewPodCheck,
    /// Result of the Slurm write performed after the previous step.
    pub slurm_write: Option<WriteResult>,
    /// Result of the eviction performed after the previous step.
    pub eviction: Option<EvictionResult>,
    /// For grouped attempts: every member of the group is drained.
    pub group_drained: bool,
    /// For grouped attempts: the Kubernetes node's cordon.
    pub cordon: NodeCordon,
    /// For grouped attempts: every member's old pod is gone from the API.
    pub group_old_gone: bool,
}

/// The cordon of the Kubernetes node of a grouped attempt, as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NodeCordon {
    /// Not read this round (or the read failed): wait.
    #[default]
    NotRead,
    /// Schedulable.
    Free,
    /// Unschedulable, cordoned by this group (the node annotation names it).
    Ours,
    /// Unschedulable for someone else's reason: never touched.
    Foreign,
}

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
}

impl EventReason {
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
        }
    }

    /// Warning (true) or Normal event.
    pub fn warning(self) -> bool {
        matches!(
            self,
            EventReason::RemediationFailed | EventReason::KubeletCachePinned
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

/// A drain (or FAIL, or DOWN) with a reason set by an administrator or
/// another tool before mountguard acted: handed back at the end, never
/// silently replaced.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PriorDrain {
    /// Their reason, exactly.
    pub reason: String,
    /// `reason_set_by_user`.
    #[serde(default)]
    pub set_by: String,
    /// The flag written back: `DRAIN`, or `FAIL` when they had set FAIL (a
    /// DOWN they set comes back as DRAIN: Slurm has no request that sets
    /// DOWN without ending jobs, and DRAIN keeps the node just as closed).
    pub state: String,
    /// The node was DOWN.
    #[serde(default)]
    pub down: bool,
}

impl PriorDrain {
    /// What `n` holds before mountguard acts, if it is someone else's: a
    /// reason that is neither mountguard's nor Slurm's own "Not responding",
    /// on a node that is drained, FAIL or DOWN.
    pub fn of(n: &SlurmNodeState) -> Option<Self> {
        let closed = n.held() || n.has("DOWN");
        if !closed
            || n.reason.is_empty()
            || n.reason_is_mountguard()
            || n.reason == SLURM_NOT_RESPONDING
        {
            return None;
        }
        Some(Self {
            reason: n.reason.clone(),
            set_by: n.reason_set_by_user.clone(),
            state: if n.has("FAIL") && !n.drain() {
                "FAIL".into()
            } else {
                "DRAIN".into()
            },
            down: n.has("DOWN"),
        })
    }

    /// Whether `n` shows this drain back in place.
    pub fn restored(&self, n: &SlurmNodeState) -> bool {
        n.has(&self.state) && n.reason == self.reason
    }
}

/// The reason slurmctld sets on a node it marks DOWN for not answering
/// (`set_node_down_ptr` in `src/slurmctld/ping_nodes.c`).
pub const SLURM_NOT_RESPONDING: &str = "Not responding";

/// One failing subject that started the attempt (fingerprints only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// Subject, e.g. `volume slurm-etc`.
    pub subject: SubjectKey,
    /// Verdict tag, e.g. `Stale/ImmutableCache`.
    pub state: String,
    /// Fingerprint of the mounted content.
    pub mounted: String,
    /// Fingerprint of the current content.
    pub current: String,
}

/// A phase and when it was entered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseEntry {
    /// Phase.
    pub phase: Phase,
    /// Entered at.
    pub at: Timestamp,
}

/// Retry pacing (not needed across restarts, but harmless to persist).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Retry {
    /// Consecutive errors.
    #[serde(default)]
    pub failures: u32,
    /// No new write before this time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<Timestamp>,
    /// Last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// One remediation attempt: the persisted record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Attempt {
    /// Short unique id, part of the drain reason.
    pub id: String,
    /// Namespace of the pod and NodeSet.
    pub namespace: String,
    /// NodeSet name.
    pub nodeset: String,
    /// Pod name (stable across the replacement).
    pub pod: String,
    /// UID of the pod being replaced.
    pub pod_uid: String,
    /// Kubernetes node.
    pub node: String,
    /// Slurm node (the pod-hostname label).
    pub slurm_node: String,
    /// What was failing.
    pub findings: Vec<Finding>,
    /// Attempts replaced together (pinning pods) share a group id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Current phase.
    pub phase: Phase,
    /// Phases gone through.
    pub history: Vec<PhaseEntry>,
    /// Created at.
    pub started_at: Timestamp,
    /// Current phase entered at.
    pub phase_since: Timestamp,
    /// The exact reason of our drain.
    pub drain_reason: String,
    /// A drain was requested (we may own one).
    #[serde(default)]
    pub drain_requested: bool,
    /// When the drain was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_requested_at: Option<Timestamp>,
    /// The pod was evicted (or found gone) at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted_at: Option<Timestamp>,
    /// UID of the replacement pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_pod_uid: Option<String>,
    /// Someone else's drain replaced ours after the node was drained; we
    /// never undrain it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub foreign_drain: Option<String>,
    /// Failed: our drain still has to be released.
    #[serde(default)]
    pub release_pending: bool,
    /// Failed: our drain is kept on purpose (an alert fires while true).
    #[serde(default)]
    pub kept_drained: bool,
    /// Grouped attempts: a cordon of the Kubernetes node was requested
    /// (persisted before the request).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordon_requested: bool,
    /// Grouped attempts: our cordon is gone (released, or never took).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordon_released: bool,
    /// Someone else's drain found before mountguard acted: written back at
    /// the end instead of an undrain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prior_drain: Option<PriorDrain>,
    /// The FAIL hold was requested (just before the eviction).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold_requested: bool,
    /// After the eviction the Slinky operator's preStop hook set the node
    /// DOWN with its reason (informational: verification accepts any DOWN
    /// while slurmd answers and our hold is in place, and the release of a
    /// DOWN node is a RESUME).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prestop_down: bool,
    /// slurmrestd has answered "not found" for the node since (cleared by
    /// the next read that finds it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_found_since: Option<Timestamp>,
    /// Failure detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Retry pacing.
    #[serde(default)]
    pub retry: Retry,
}

impl Attempt {
    /// A new Pending attempt. `id` must be unique (see [`attempt_id`]).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: String,
        namespace: &str,
        nodeset: &str,
        pod: &str,
        pod_uid: &str,
        node: &str,
        slurm_node: &str,
        findings: Vec<Finding>,
        now: Timestamp,
    ) -> Self {
        let drain_reason = drain_reason(namespace, pod, &findings, &id);
        Self {
            id,
            namespace: namespace.to_string(),
            nodeset: nodeset.to_string(),
            pod: pod.to_string(),
            pod_uid: pod_uid.to_string(),
            node: node.to_string(),
            slurm_node: slurm_node.to_string(),
            findings,
            group: None,
            phase: Phase::Pending,
            history: vec![PhaseEntry {
                phase: Phase::Pending,
                at: now,
            }],
            started_at: now,
            phase_since: now,
            drain_reason,
            drain_requested: false,
            drain_requested_at: None,
            evicted_at: None,
            new_pod_uid: None,
            foreign_drain: None,
            release_pending: false,
            kept_drained: false,
            cordon_requested: false,
            cordon_released: false,
            prior_drain: None,
            hold_requested: false,
            prestop_down: false,
            not_found_since: None,
            failure: None,
            retry: Retry::default(),
        }
    }

    /// Still needs work or attention: not terminal, or Failed with our drain
    /// kept or still to be released.
    pub fn is_open(&self) -> bool {
        !self.phase.is_terminal()
            || self.release_pending
            || self.kept_drained
            || self.cordon_pending()
    }

    /// Our cordon may still be in place and has to be released.
    pub fn cordon_pending(&self) -> bool {
        self.cordon_requested && !self.cordon_released
    }

    /// Whether `node`'s current drain (or FAIL hold) is ours (this
    /// attempt's exact reason).
    pub fn owns(&self, node: &SlurmNodeState) -> bool {
        node.held() && owns_reason(&node.reason, &self.id)
    }

    /// Whether the replacement's slurmd answers: no NOT_RESPONDING, and no
    /// FAIL but our own hold. A DOWN is allowed: with `ReturnToService` 0
    /// or 1 (slurm.conf(5)) a node set DOWN (by the operator's preStop
    /// hook, or for not answering while its key was stale: our drain
    /// replaced the "Not responding" reason that `ReturnToService=1` looks
    /// for) stays DOWN after its slurmd registers again; our RESUME clears
    /// it, and only after this verification.
    pub fn replacement_responding(&self, n: &SlurmNodeState) -> bool {
        !n.has("NOT_RESPONDING") && (!n.has("FAIL") || self.owns(n))
    }

    /// Phase names gone through, in order.
    pub fn phase_names(&self) -> Vec<&'static str> {
        self.history.iter().map(|e| e.phase.name()).collect()
    }
}

/// A short attempt id from the pod UID and the start time.
pub fn attempt_id(pod_uid: &str, now: Timestamp) -> String {
    use sha2::{Digest as _, Sha256};
    let mut h = Sha256::new();
    h.update(pod_uid.as_bytes());
    h.update(now.as_nanosecond().to_be_bytes());
    hex::encode(&h.finalize()[..5])
}

/// The drain reason: `mountguard: <ns>/<pod> volume <v> stale (mounted <fp>
/// vs current <fp>) attempt <id>`.
pub fn drain_reason(namespace: &str, pod: &str, findings: &[Finding], id: &str) -> String {
    let what = match findings.first() {
        Some(f) => {
            let word = if f.state.starts_with("Frozen") {
                "frozen"
            } else {
                "stale"
            };
            let more = if findings.len() > 1 {
                format!(" (+{} more)", findings.len() - 1)
            } else {
                String::new()
            };
            format!(
                " {} {word} (mounted {} vs current {}){more}",
                f.subject, f.mounted, f.current
            )
        }
        None => String::new(),
    };
    format!("{REASON_PREFIX} {namespace}/{pod}{what} attempt {id}")
}

/// Whether `reason` is a mountguard reason of attempt `id`.
pub fn owns_reason(reason: &str, id: &str) -> bool {
    reason.starts_with(REASON_PREFIX) && reason_attempt_id(reason) == Some(id)
}

/// The attempt id at the end of a mountguard reason.
pub fn reason_attempt_id(reason: &str) -> Option<&str> {
    if !reason.starts_with(REASON_PREFIX) {
        return None;
    }
    let (_, id) = reason.trim_end().rsplit_once(" attempt ")?;
    (!id.is_empty() && !id.contains(' ')).then_some(id)
}

/// The attempts persisted in one NodeSet's annotation.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct AttemptsRecord {
    /// Format version (1).
    pub version: u32,
    /// Open attempts, then the most recent closed ones.
    pub attempts: Vec<Attempt>,
}

impl AttemptsRecord {
    /// Closed attempts kept per NodeSet for `status` and history.
    pub const KEEP_CLOSED: usize = 5;

    /// Parses the annotation value.
    pub fn parse(s: &str) -> Result<Self, crate::Error> {
        let r: AttemptsRecord = serde_json::from_str(s).map_err(|e| {
            crate::Error::Config(format!(
                "annotation {}: {e}; fix or remove the annotation",
                super::ATTEMPTS_ANNOTATION
            ))
        })?;
        if r.version != 1 {
            return Err(crate::Error::Config(format!(
                "annotation {}: unsupported version {}",
                super::ATTEMPTS_ANNOTATION,
                r.version
            )));
        }
        Ok(r)
    }

    /// Builds the record for `attempts` (all of one NodeSet): every open one
    /// and the newest [`Self::KEEP_CLOSED`] closed ones.
    pub fn from_attempts<'a>(attempts: impl IntoIterator<Item = &'a Attempt>) -> Self {
        let mut open = Vec::new();
        let mut closed = Vec::new();
        for a in attempts {
            if a.is_open() {
                open.push(a.clone());
            } else {
                closed.push(a.clone());
            }
        }
        closed.sort_by_key(|a| std::cmp::Reverse(a.phase_since));
        closed.truncate(Self::KEEP_CLOSED);
        open.extend(closed);
        Self {
            version: 1,
            attempts: open,
        }
    }

    /// The annotation value.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| "{\"version\":1,\"attempts\":[]}".into())
    }
}

/// How [`Stepper::hand_back`] releases our drain of a node Slurm shows in
/// FAIL (our hold) when there is no earlier drain to restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailHandling {
    /// After a failure: FAIL first becomes our DRAIN, then is undrained; a
    /// DOWN (a slurmd still not answering) stays, as an undrain leaves it.
    DrainFirst,
    /// After a verified replacement (Undraining): a node in DOWN or FAIL is
    /// resumed, any other undrained.
    Resume,
}

struct Stepper<'c> {
    a: Attempt,
    actions: Vec<Action>,
    now: Timestamp,
    cfg: &'c MachineConfig,
}

impl Stepper<'_> {
    fn goto(&mut self, to: Phase) {
        let from = self.a.phase;
        self.a.phase = to;
        self.a.phase_since = self.now;
        self.a.history.push(PhaseEntry {
            phase: to,
            at: self.now,
        });
        self.a.retry = Retry::default();
        self.actions.push(Action::Transition { from, to });
        self.actions.push(Action::Persist);
    }

    fn event(&mut self, reason: EventReason, message: String) {
        self.actions.push(Action::Event { reason, message });
    }

    fn due(&self) -> bool {
        self.a.retry.not_before.is_none_or(|t| self.now >= t)
    }

    fn error(&mut self, message: String, at_least: Option<SignedDuration>) {
        let r = &mut self.a.retry;
        r.failures = r.failures.saturating_add(1);
        let shift = r.failures.saturating_sub(1).min(16);
        let mut delay = self
            .cfg
            .retry_base
            .checked_mul(1i32 << shift)
            .unwrap_or(self.cfg.retry_max)
            .min(self.cfg.retry_max);
        if let Some(min) = at_least {
            delay = delay.max(min);
        }
        r.not_before = Some(self.now + delay);
        r.last_error = Some(message);
    }

    fn wrote(&mut self) {
        self.a.retry.not_before = Some(self.now + self.cfg.write_settle);
    }

    fn elapsed_since(&self, t: Timestamp) -> SignedDuration {
        self.now.duration_since(t)
    }

    fn pod_label(&self) -> String {
        format!("{}/{}", self.a.namespace, self.a.pod)
    }

    /// Enters Failed, deciding what happens to our drain.
    fn fail(&mut self, reason: FailReason, detail: String, obs: &Observations) {
        let pod_touched = self.a.evicted_at.is_some();
        // Someone else's drain from before is always handed back: the node
        // stays closed to jobs either way, under their reason.
        let release = self.a.drain_requested
            && (self.a.prior_drain.is_some()
                || match self.cfg.on_failure {
                    FailurePolicy::Auto => !pod_touched,
                    FailurePolicy::KeepDrained => false,
                    FailurePolicy::Undrain => true,
                });
        self.a.failure = Some(format!("{}: {detail}", reason.as_str()));
        self.a.release_pending = release;
        self.a.kept_drained = self.a.drain_requested && !release;
        self.goto(Phase::Failed(reason));
        let node_word = if let (true, Some(p)) = (release, &self.a.prior_drain) {
            format!(
                "handing Slurm node {} back with the drain {:?} had set ({:?})",
                self.a.slurm_node, p.set_by, p.reason
            )
        } else if release {
            format!(
                "releasing mountguard's drain of Slurm node {}",
                self.a.slurm_node
            )
        } else if self.a.kept_drained {
            format!(
                "Slurm node {} kept drained with reason {:?}; fix the cause, then undrain it (scontrol update nodename={} state=resume)",
                self.a.slurm_node, self.a.drain_reason, self.a.slurm_node
            )
        } else {
            format!(
                "Slurm node {} was not drained by mountguard",
                self.a.slurm_node
            )
        };
        let msg = format!(
            "remediation {} of {} failed ({}): {detail}; {node_word}",
            self.a.id,
            self.pod_label(),
            reason.as_str()
        );
        self.event(EventReason::RemediationFailed, msg);
        self.failed(obs);
    }

    /// Failed: release our drain if pending, notice when a kept drain is
    /// released by an operator.
    fn failed(&mut self, obs: &Observations) {
        self.release_cordon(obs);
        let SlurmObservation::Node(n) = &obs.slurm else {
            // A node unknown for longer than the bound is gone, and our
            // drain with it; before that the release stays pending (one
            // "not found" proves nothing).
            if matches!(obs.slurm, SlurmObservation::NotFound)
                && (self.a.release_pending || self.a.kept_drained)
                && self.not_found_for_good()
            {
                self.a.release_pending = false;
                self.a.kept_drained = false;
                self.actions.push(Action::Persist);
            }
            return;
        };
        if self.a.owns(n) {
            if self.a.release_pending {
                self.hand_back(n, FailHandling::DrainFirst);
            }
        } else if self.a.release_pending || self.a.kept_drained {
            // Released (by us or by an operator): nothing of ours remains.
            self.a.release_pending = false;
            self.a.kept_drained = false;
            self.actions.push(Action::Persist);
        }
    }

    /// Hands the node we hold back, when due: the drain someone had set
    /// before ours is restored; otherwise our drain is released, a node in
    /// FAIL as `on_fail` says.
    fn hand_back(&mut self, n: &SlurmNodeState, on_fail: FailHandling) {
        if !self.due() {
            return;
        }
        self.wrote();
        let node = self.a.slurm_node.clone();
        let owned_reason = self.a.drain_reason.clone();
        self.actions.push(match &self.a.prior_drain {
            Some(prior) => Action::RestoreDrain {
                node,
                owned_reason,
                prior: prior.clone(),
            },
            None => match on_fail {
                FailHandling::DrainFirst if n.has("FAIL") => Action::DrainNode {
                    node,
                    reason: owned_reason,
                },
                FailHandling::Resume if n.has("DOWN") || n.has("FAIL") => {
                    Action::ResumeNode { node, owned_reason }
                }
                _ => Action::UndrainNode { node, owned_reason },
            },
        });
    }

    /// Releases our cordon (grouped attempts), or notices it is gone.
    fn release_cordon(&mut self, obs: &Observations) {
        if !self.a.cordon_pending() {
            return;
        }
        match obs.cordon {
            NodeCordon::Ours => {
                if self.due() {
                    self.wrote();
                    self.actions.push(Action::UncordonNode {
                        node: self.a.node.clone(),
                        owner: self.a.group.clone().unwrap_or_default(),
                    });
                }
            }
            NodeCordon::Free | NodeCordon::Foreign => {
                self.a.cordon_released = true;
                self.actions.push(Action::Persist);
            }
            NodeCordon::NotRead => {}
        }
    }

    fn slurm_write_error(&mut self, obs: &Observations) -> Option<String> {
        match &obs.slurm_write {
            Some(WriteResult::Err {
                transient: false,
                message,
            }) => Some(message.clone()),
            Some(WriteResult::Err {
                transient: true,
                message,
            }) => {
                self.error(format!("slurmrestd: {message}"), None);
                None
            }
            _ => None,
        }
    }

    /// "Not found" once more: true when it has lasted the whole
    /// [`MachineConfig::not_found_grace`] (then it counts), else a
    /// transient error retried with backoff.
    fn not_found_for_good(&mut self) -> bool {
        let since = *self.a.not_found_since.get_or_insert(self.now);
        if self.elapsed_since(since) >= self.cfg.not_found_grace {
            return true;
        }
        let msg = format!(
            "slurmrestd does not know Slurm node {} (since {since}); retrying",
            self.a.slurm_node
        );
        self.error(msg, None);
        false
    }

    /// After the eviction: the Slinky operator's preStop hook replaces our
    /// reason with its own (and sets DOWN), and its syncCordon then
    /// undrains any node whose reason is its own or empty (our FAIL hold
    /// survives both, but the reason is no longer ours). Keep the node
    /// ours until the verification: note the hook's DOWN, and set the hold
    /// again with our reason (an administrator's reason is left alone).
    /// Returns whether the node is not held by our drain right now (then
    /// nothing is verified this step).
    fn hold_drain_after_eviction(&mut self, obs: &Observations) -> bool {
        let SlurmObservation::Node(n) = &obs.slurm else {
            return false;
        };
        if self.a.evicted_at.is_none() || self.a.owns(n) {
            return false;
        }
        let operators = n.reason.is_empty() || n.reason.starts_with(super::OPERATOR_REASON_PREFIX);
        if !operators || n.reason_is_mountguard() {
            return false;
        }
        if n.has("DOWN") && n.reason == super::OPERATOR_PRESTOP_REASON && !self.a.prestop_down {
            self.a.prestop_down = true;
            self.actions.push(Action::Persist);
        }
        if self.due() {
            self.wrote();
            self.actions.push(Action::HoldNode {
                node: self.a.slurm_node.clone(),
                reason: self.a.drain_reason.clone(),
            });
        }
        true
    }

    fn read_error(&mut self, obs: &Observations) {
        if let SlurmObservation::Error { message, .. } = &obs.slurm {
            self.error(format!("slurmrestd: {message}"), None);
        }
    }

    fn start_undrain(&mut self, slurm: &SlurmObservation) {
        self.goto(Phase::Undraining);
        self.undraining(&Observations {
            slurm: slurm.clone(),
            ..Default::default()
        });
    }

    fn undraining(&mut self, obs: &Observations) {
        if let Some(msg) = self.slurm_write_error(obs) {
            self.fail(FailReason::UndrainRejected, msg, obs);
            return;
        }
        match &obs.slurm {
            SlurmObservation::Node(n) if self.a.owns(n) => self.hand_back(n, FailHandling::Resume),
            SlurmObservation::Node(n)
                if self.a.prior_drain.as_ref().is_some_and(|p| p.restored(n)) =>
            {
                let p = self.a.prior_drain.clone().unwrap_or_default();
                self.goto(Phase::Succeeded);
                let msg = format!(
                    "remediation {} of {}: replacement verified fresh and Slurm node {} responding; handed back with the drain {:?} had set ({:?}): {:?}",
                    self.a.id,
                    self.pod_label(),
                    self.a.slurm_node,
                    p.set_by,
                    p.reason,
                    n.state
                );
                self.event(EventReason::RemediationSucceeded, msg);
            }
            SlurmObservation::Node(n) => {
                let left = if n.held() {
                    self.a.foreign_drain = Some(n.reason.clone());
                    format!(
                        "; Slurm node {} left drained: its reason is now {:?} (set by {:?}), not mountguard's",
                        self.a.slurm_node, n.reason, n.reason_set_by_user
                    )
                } else {
                    String::new()
                };
                self.goto(Phase::Succeeded);
                let msg = format!(
                    "remediation {} of {}: replacement verified fresh and Slurm node {} responding{left}",
                    self.a.id,
                    self.pod_label(),
                    self.a.slurm_node
                );
                self.event(EventReason::RemediationSucceeded, msg);
            }
            SlurmObservation::NotFound => {
                if self.not_found_for_good() {
                    self.fail(
                        FailReason::SlurmNodeNotFound,
                        format!("Slurm node {} vanished", self.a.slurm_node),
                        obs,
                    );
                }
            }
            _ => self.read_error(obs),
        }
    }
}

/// One step of the state machine. Pure.
pub fn step(
    attempt: &Attempt,
    obs: &Observations,
    now: Timestamp,
    cfg: &MachineConfig,
) -> (Attempt, Vec<Action>) {
    let mut s = Stepper {
        a: attempt.clone(),
        actions: Vec::new(),
        now,
        cfg,
    };
    let pod_label = s.pod_label();
    let slurm_node = s.a.slurm_node.clone();
    if matches!(obs.slurm, SlurmObservation::Node(_)) {
        s.a.not_found_since = None;
    }
    match s.a.phase {
        Phase::Pending => {
            if obs.pod_uid.as_deref() != Some(s.a.pod_uid.as_str()) {
                s.fail(
                    FailReason::PodChanged,
                    "the pod was deleted or replaced before anything was done".into(),
                    obs,
                );
            } else {
                match &obs.slurm {
                    SlurmObservation::Node(n)
                        if n.held() && !s.a.owns(n) && n.reason_is_mountguard() =>
                    {
                        let msg = format!(
                            "Slurm node {slurm_node} is already drained by another mountguard attempt ({:?}); mountguard leaves it alone",
                            n.reason
                        );
                        s.fail(FailReason::NodeDrainedByOthers, msg, obs);
                    }
                    SlurmObservation::Node(n) => {
                        // Someone else's drain: the node is closed to jobs
                        // already; record it (persisted before our drain
                        // replaces its reason) to hand it back at the end.
                        if !s.a.owns(n) {
                            s.a.prior_drain = PriorDrain::of(n);
                        }
                        s.a.drain_requested = true;
                        s.a.drain_requested_at = Some(now);
                        s.goto(Phase::Draining);
                        let f = s.a.findings.first().map_or(String::new(), |f| {
                            format!(
                                " ({} {}: mounted {} vs current {})",
                                f.subject, f.state, f.mounted, f.current
                            )
                        });
                        let before = s.a.prior_drain.as_ref().map_or(String::new(), |p| {
                            format!(
                                " (drained before by {:?}: {:?}; handed back at the end)",
                                p.set_by, p.reason
                            )
                        });
                        let msg = format!(
                            "remediation {} of {pod_label}{f}: draining Slurm node {slurm_node}{before}",
                            s.a.id
                        );
                        s.event(EventReason::RemediationStarted, msg);
                        s.wrote();
                        s.actions.push(Action::DrainNode {
                            node: slurm_node,
                            reason: s.a.drain_reason.clone(),
                        });
                    }
                    SlurmObservation::NotFound => {
                        if s.not_found_for_good() {
                            let msg = format!(
                                "slurmrestd does not know Slurm node {slurm_node} (label {})",
                                super::POD_HOSTNAME_LABEL
                            );
                            s.fail(FailReason::SlurmNodeNotFound, msg, obs);
                        }
                    }
                    _ => s.read_error(obs),
                }
            }
        }
        Phase::Draining => {
            if let Some(msg) = s.slurm_write_error(obs) {
                s.fail(FailReason::DrainRejected, msg, obs);
            } else {
                match &obs.slurm {
                    SlurmObservation::Node(n) if s.a.owns(n) => s.goto(Phase::Drained),
                    SlurmObservation::Node(n) if n.held() && n.reason_is_mountguard() => {
                        let msg = format!(
                            "Slurm node {slurm_node} was drained by another mountguard attempt ({:?}) before this drain took effect",
                            n.reason
                        );
                        s.fail(FailReason::NodeDrainedByOthers, msg, obs);
                    }
                    SlurmObservation::Node(n)
                        if s.a.prior_drain.is_none() && PriorDrain::of(n).is_some() =>
                    {
                        // Drained by someone else before ours took effect:
                        // record it to hand it back, then drain again.
                        s.a.prior_drain = PriorDrain::of(n);
                        s.actions.push(Action::Persist);
                    }
                    SlurmObservation::Node(_) => {
                        let since = s.a.drain_requested_at.unwrap_or(s.a.phase_since);
                        if s.elapsed_since(since) >= cfg.drain_timeout {
                            let msg = "the drain never showed on the node".to_string();
                            s.fail(FailReason::DrainTimeout, msg, obs);
                        } else if s.due() {
                            s.wrote();
                            s.actions.push(Action::DrainNode {
                                node: slurm_node,
                                reason: s.a.drain_reason.clone(),
                            });
                        }
                    }
                    SlurmObservation::NotFound => {
                        if s.not_found_for_good() {
                            let msg = format!("slurmrestd does not know Slurm node {slurm_node}");
                            s.fail(FailReason::SlurmNodeNotFound, msg, obs);
                        }
                    }
                    _ => s.read_error(obs),
                }
            }
        }
        Phase::Drained => match &obs.slurm {
            SlurmObservation::Node(n) if !n.held() => {
                let msg = format!(
                    "the drain of Slurm node {slurm_node} was removed by someone else before the pod was evicted; the pod was not touched"
                );
                s.fail(FailReason::DrainRemoved, msg, obs);
            }
            SlurmObservation::Node(n) => {
                if !s.a.owns(n) && s.a.foreign_drain.is_none() {
                    s.a.foreign_drain = Some(n.reason.clone());
                    s.actions.push(Action::Persist);
                }
                let since = s.a.drain_requested_at.unwrap_or(s.a.phase_since);
                if n.busy() {
                    if s.elapsed_since(since) >= cfg.drain_timeout {
                        let msg = format!(
                            "jobs still run on Slurm node {slurm_node} after the drain timeout ({:?})",
                            n.state
                        );
                        s.fail(FailReason::DrainTimeout, msg, obs);
                    }
                } else if s.a.group.is_some()
                    && obs.group_drained
                    && !(s.a.cordon_released || obs.cordon == NodeCordon::Ours)
                {
                    // Cordon the node first, so that no replacement of the
                    // group can start while an old member pins the cache
                    // (again after write_settle if the cordon did not show).
                    match obs.cordon {
                        NodeCordon::Free if s.due() => {
                            if !s.a.cordon_requested {
                                s.a.cordon_requested = true;
                                s.actions.push(Action::Persist);
                            }
                            s.wrote();
                            s.actions.push(Action::CordonNode {
                                node: s.a.node.clone(),
                                owner: s.a.group.clone().unwrap_or_default(),
                            });
                        }
                        NodeCordon::Foreign => {
                            // Someone else's cordon holds replacements back
                            // just as well; it is never ours to lift.
                            s.a.cordon_requested = true;
                            s.a.cordon_released = true;
                            s.actions.push(Action::Persist);
                        }
                        _ => {}
                    }
                } else if (s.a.group.is_none()
                    || (obs.group_drained
                        && (s.a.cordon_released || obs.cordon == NodeCordon::Ours)))
                    && s.a.owns(n)
                    && !n.has("FAIL")
                {
                    // Just before the eviction, our DRAIN becomes our FAIL
                    // hold (see [`Action::HoldNode`]): what the preStop hook,
                    // syncCordon and ReturnToService do next cannot open
                    // the node.
                    if !s.a.hold_requested {
                        s.a.hold_requested = true;
                        s.actions.push(Action::Persist);
                    }
                    if s.due() {
                        s.wrote();
                        s.actions.push(Action::HoldNode {
                            node: slurm_node,
                            reason: s.a.drain_reason.clone(),
                        });
                    }
                } else if s.a.group.is_none()
                    || (obs.group_drained
                        && (s.a.cordon_released || obs.cordon == NodeCordon::Ours))
                {
                    s.goto(Phase::Evicting);
                    let msg = format!(
                        "remediation {}: Slurm node {slurm_node} drained, no jobs left; evicting {pod_label}",
                        s.a.id
                    );
                    s.event(EventReason::SlurmNodeDrained, msg);
                    s.actions.push(Action::Evict {
                        namespace: s.a.namespace.clone(),
                        pod: s.a.pod.clone(),
                        uid: s.a.pod_uid.clone(),
                    });
                    s.wrote();
                }
            }
            SlurmObservation::NotFound => {
                if s.not_found_for_good() {
                    let msg = format!("Slurm node {slurm_node} vanished");
                    s.fail(FailReason::SlurmNodeNotFound, msg, obs);
                }
            }
            _ => s.read_error(obs),
        },
        Phase::Evicting => {
            let gone = obs.pod_uid.as_deref() != Some(s.a.pod_uid.as_str());
            let done = gone
                || matches!(
                    obs.eviction,
                    Some(EvictionResult::Evicted | EvictionResult::Gone)
                );
            match &obs.eviction {
                _ if done => {
                    s.a.evicted_at = Some(now);
                    s.goto(Phase::AwaitingReplacement);
                    let msg = format!(
                        "remediation {}: evicted {pod_label} (uid {}); waiting for the NodeSet to recreate it",
                        s.a.id, s.a.pod_uid
                    );
                    s.event(EventReason::PodEvicted, msg);
                }
                Some(EvictionResult::Refused {
                    retry_after,
                    message,
                }) => {
                    let msg = format!("eviction refused: {message}");
                    s.error(msg, *retry_after);
                }
                Some(EvictionResult::Error { message }) => {
                    s.error(format!("eviction: {message}"), None);
                }
                _ => {}
            }
            if s.a.phase == Phase::Evicting {
                if s.elapsed_since(s.a.phase_since) >= cfg.eviction_timeout {
                    let msg = format!(
                        "the eviction of {pod_label} was refused until the timeout: {}",
                        s.a.retry.last_error.clone().unwrap_or_default()
                    );
                    s.fail(FailReason::EvictionTimeout, msg, obs);
                } else if s.due() {
                    // Never evict a pod whose node is not drained right now.
                    match &obs.slurm {
                        SlurmObservation::Node(n) if !n.held() => {
                            let msg = format!(
                                "the drain of Slurm node {slurm_node} was removed by someone else before the pod was evicted; the pod was not touched"
                            );
                            s.fail(FailReason::DrainRemoved, msg, obs);
                        }
                        SlurmObservation::Node(n) if !n.busy() => {
                            s.wrote();
                            s.actions.push(Action::Evict {
                                namespace: s.a.namespace.clone(),
                                pod: s.a.pod.clone(),
                                uid: s.a.pod_uid.clone(),
                            });
                        }
                        SlurmObservation::Node(_) => {}
                        _ => s.read_error(obs),
                    }
                }
            }
        }
        Phase::AwaitingReplacement => {
            let _ = s.hold_drain_after_eviction(obs);
            if s.a.cordon_pending() && obs.group_old_gone {
                // Every old member is gone: the kubelet dropped the pinned
                // entry; let the replacements start.
                s.release_cordon(obs);
            }
            match obs.pod_uid.as_deref() {
                Some(uid) if uid != s.a.pod_uid => {
                    s.a.new_pod_uid = Some(uid.to_string());
                    s.goto(Phase::Verifying);
                }
                _ => {
                    let since = s.a.evicted_at.unwrap_or(s.a.phase_since);
                    if s.elapsed_since(since) >= cfg.replacement_timeout {
                        let msg = format!("the NodeSet did not recreate {pod_label} in time");
                        s.fail(FailReason::ReplacementTimeout, msg, obs);
                    }
                }
            };
        }
        Phase::Verifying => {
            let not_held = s.hold_drain_after_eviction(obs);
            if s.a.cordon_pending() && obs.group_old_gone {
                s.release_cordon(obs);
            }
            if let Some(uid) = obs.pod_uid.as_deref()
                && uid != s.a.pod_uid
                && s.a.new_pod_uid.as_deref() != Some(uid)
            {
                s.a.new_pod_uid = Some(uid.to_string());
                s.actions.push(Action::Persist);
            }
            let current = obs.pod_uid.is_some() && obs.pod_uid == s.a.new_pod_uid;
            match (&obs.new_pod, &obs.slurm) {
                (NewPodCheck::StillStale { message }, _) if current => {
                    let msg = format!("the replacement pod is still not fresh: {message}");
                    s.fail(FailReason::ReplacementStale, msg, obs);
                }
                (NewPodCheck::Fresh, SlurmObservation::Node(n))
                    if current && s.a.replacement_responding(n) && !not_held =>
                {
                    let msg = format!(
                        "remediation {}: replacement {pod_label} (uid {}) verified fresh on node {} and Slurm node {slurm_node} responding ({:?})",
                        s.a.id,
                        s.a.new_pod_uid.clone().unwrap_or_default(),
                        s.a.node,
                        n.state
                    );
                    s.event(EventReason::RemediationVerified, msg);
                    s.start_undrain(&obs.slurm);
                }
                _ => {
                    s.read_error(obs);
                    if s.elapsed_since(s.a.phase_since) >= cfg.verification_timeout {
                        let why = match (&obs.new_pod, &obs.slurm) {
                            (NewPodCheck::Fresh, SlurmObservation::Node(n)) => {
                                format!(
                                    "fresh on the node, but Slurm node {slurm_node} is {:?}",
                                    n.state
                                )
                            }
                            (NewPodCheck::Fresh, _) => {
                                "fresh on the node, but Slurm could not be read".to_string()
                            }
                            _ => "no fresh inventory of the replacement pod".to_string(),
                        };
                        s.fail(FailReason::VerificationTimeout, why, obs);
                    }
                }
            }
        }
        Phase::Undraining => s.undraining(obs),
        Phase::Succeeded => s.release_cordon(obs),
        Phase::Failed(_) => {
            if let Some(WriteResult::Err { message, .. }) = &obs.slurm_write {
                s.error(format!("slurmrestd: {message}"), None);
            }
            s.read_error(obs);
            s.failed(obs);
        }
    }
    // A Persist is enough once per step, and must precede every write.
    let mut seen = false;
    let mut actions = Vec::with_capacity(s.actions.len());
    let first_write = s.actions.iter().position(|a| {
        matches!(
            a,
            Action::DrainNode { .. }
                | Action::HoldNode { .. }
                | Action::RestoreDrain { .. }
                | Action::UndrainNode { .. }
                | Action::ResumeNode { .. }
                | Action::Evict { .. }
                | Action::CordonNode { .. }
                | Action::UncordonNode { .. }
        )
    });
    let needs_persist = s.actions.iter().any(|a| matches!(a, Action::Persist));
    for (i, a) in s.actions.into_iter().enumerate() {
        if matches!(a, Action::Persist) {
            if seen {
                continue;
            }
            seen = true;
        }
        if needs_persist && !seen && Some(i) == first_write {
            actions.push(Action::Persist);
            seen = true;
        }
        actions.push(a);
    }
    (s.a, actions)
}

#[cfg(test)]
#[path = "machine_tests.rs"]
mod tests;
