//! The attempt: its phases, why it can fail, and the record persisted in
//! the NodeSet's annotation (with the drain reason that says which attempt
//! owns a Slurm node's drain, and the drain found before ours).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::observations::SlurmNodeState;
use crate::remediation::REASON_PREFIX;
use crate::remediation::workload::WorkloadRef;
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
        n.has(&self.state) && reason_is(&n.reason, &self.reason)
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

impl Finding {
    /// ` (<subject> <state>: mounted <fp> vs current <fp>)`, as Events
    /// name it.
    pub fn note(&self) -> String {
        format!(
            " ({} {}: mounted {} vs current {})",
            self.subject, self.state, self.mounted, self.current
        )
    }
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
    /// NodeSet name (empty for a workload's pod).
    pub nodeset: String,
    /// The workload owning the pod (Deployment, ReplicaSet, StatefulSet,
    /// DaemonSet), for an attempt without Slurm steps: the record is on
    /// it. `None`: a NodeSet pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadRef>,
    /// Pod name (stable across the replacement).
    pub pod: String,
    /// UID of the pod being replaced.
    pub pod_uid: String,
    /// Kubernetes node.
    pub node: String,
    /// Slurm node (the pod-hostname label; empty for a workload's pod).
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
    /// Name of the replacement pod, when it is not the old pod's (a
    /// ReplicaSet's or DaemonSet's replacement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_pod_name: Option<String>,
    /// The node the replacement landed on (a workload's pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_pod_node: Option<String>,
    /// UIDs of the workload's pods when the eviction was last asked for:
    /// none of them is the replacement (a workload's pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub known_pods: Vec<String>,
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
    /// A workload attempt: when its hold on the node was last asked for
    /// (bounded by [`super::MachineConfig::node_hold_timeout`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_since: Option<Timestamp>,
    /// A workload attempt: its hold is being lifted before the eviction
    /// (refused, failed, or held too long); no eviction is asked for until
    /// the hold is gone and a dry run says the pod may go.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold_lifting: bool,
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
    /// The Slurm node was absent from slurmctld when the attempt began, and
    /// [`super::AbsentNodePolicy::Replace`] replaces its pod without a
    /// drain (nothing of Slurm's runs on a node slurmctld does not know);
    /// the attempt ends when the replacement's slurmd registers, with no
    /// undrain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub slurm_absent: bool,
    /// Failure detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Retry pacing.
    #[serde(default)]
    pub retry: Retry,
    /// Verifying: consecutive reads so far that showed the replacement's
    /// slurmd registered and responding (see
    /// [`Attempt::replacement_registered`]). Not persisted: a restarted
    /// controller counts again from zero.
    #[serde(skip)]
    pub verified_reads: u32,
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
            workload: None,
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
            new_pod_name: None,
            new_pod_node: None,
            known_pods: Vec::new(),
            foreign_drain: None,
            release_pending: false,
            kept_drained: false,
            cordon_requested: false,
            cordon_released: false,
            hold_since: None,
            hold_lifting: false,
            prior_drain: None,
            hold_requested: false,
            prestop_down: false,
            verified_reads: 0,
            not_found_since: None,
            slurm_absent: false,
            failure: None,
            retry: Retry::default(),
        }
    }

    /// A new Pending attempt on a pod of `workload`: no Slurm node, no
    /// drain.
    #[allow(clippy::too_many_arguments)]
    pub fn for_workload(
        id: String,
        namespace: &str,
        workload: WorkloadRef,
        pod: &str,
        pod_uid: &str,
        node: &str,
        findings: Vec<Finding>,
        now: Timestamp,
    ) -> Self {
        let mut a = Self::new(id, namespace, "", pod, pod_uid, node, "", findings, now);
        a.drain_reason = String::new();
        a.workload = Some(workload);
        a
    }

    /// The replacement pod's name: its own, or the old pod's.
    pub fn new_pod(&self) -> &str {
        self.new_pod_name.as_deref().unwrap_or(&self.pod)
    }

    /// Still needs work or attention: not terminal, or Failed with our drain
    /// kept or still to be released.
    pub fn is_open(&self) -> bool {
        !self.phase.is_terminal()
            || self.release_pending
            || self.kept_drained
            || self.cordon_pending()
    }

    /// Who a hold taint of this attempt names: its group (NodeSet pods
    /// replaced together), or the attempt itself (a Deployment's or
    /// ReplicaSet's pod, whose replacement is held off the node until the
    /// old pod is gone).
    pub fn hold_owner(&self) -> Option<&str> {
        match (&self.group, &self.workload) {
            (Some(g), _) => Some(g),
            (None, Some(_)) => Some(&self.id),
            (None, None) => None,
        }
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

    /// Whether the node shows a registration of the replacement's slurmd:
    /// slurmctld accepted a registration whose slurmd started when the
    /// replacement's slurmd container did or later. Only an authenticated
    /// registration moves `slurmd_start_time` (see
    /// [`SlurmNodeState::slurmd_start_time`]), so a replacement still on a
    /// stale key never shows one, even when Slurm has put the node back in
    /// service by itself (`ReturnToService=1` returns a DOWN "Not
    /// responding" node whose slurmd answers at all: `_node_did_resp` in
    /// `src/slurmctld/node_mgr.c`). Both times come from the same node's
    /// clock (the kubelet's `startedAt`, slurmd's own start time) in whole
    /// seconds.
    pub fn replacement_registered(n: &SlurmNodeState, started: Option<Timestamp>) -> bool {
        started.is_some_and(|started| n.registered_since(started))
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

/// The attempt id at the end of a mountguard reason, also after Slurm
/// appended its own messages to it (see [`reason_as_written`]).
pub fn reason_attempt_id(reason: &str) -> Option<&str> {
    let reason = reason_as_written(reason);
    if !reason.starts_with(REASON_PREFIX) {
        return None;
    }
    let (_, id) = reason.trim_end().rsplit_once(" attempt ")?;
    (!id.is_empty() && !id.contains(' ')).then_some(id)
}

/// The separator slurmctld puts before each message it appends to a node's
/// reason.
const SLURM_APPENDED: &str = " : ";

/// `reason` without the messages slurmctld appended to it. When a node
/// that already has a reason (our drain) is set DOWN for not responding,
/// `set_node_reason` (`src/slurmctld/node_mgr.c`, Slurm 26.05) appends
/// `" : <message>"` (`" : Not responding"`) unless it is already there, and
/// sets the reason's user to SlurmUser and its time to now. A mountguard
/// reason never holds `" : "` itself, so everything from the first one on
/// is Slurm's.
pub fn reason_as_written(reason: &str) -> &str {
    match reason.find(SLURM_APPENDED) {
        Some(at) if reason.starts_with(REASON_PREFIX) => &reason[..at],
        _ => reason,
    }
}

/// Whether the node's current `reason` is still the drain reason
/// `written` (exactly, or with messages slurmctld appended: see
/// [`reason_as_written`]).
pub fn reason_is(reason: &str, written: &str) -> bool {
    reason == written
        || reason
            .strip_prefix(written)
            .is_some_and(|rest| rest.starts_with(SLURM_APPENDED))
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
                crate::remediation::ATTEMPTS_ANNOTATION
            ))
        })?;
        if r.version != 1 {
            return Err(crate::Error::Config(format!(
                "annotation {}: unsupported version {}",
                crate::remediation::ATTEMPTS_ANNOTATION,
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
