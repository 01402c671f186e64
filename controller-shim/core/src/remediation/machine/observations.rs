//! What a step reads: the machine's configuration (timeouts, retry
//! pacing, what to do with our drain on failure) and what the executor
//! observed since the last step (the Slurm node, the last writes and
//! eviction, the replacement's verdicts, the node's cordon, a workload's
//! pods and availability). Plain data.

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::remediation::REASON_PREFIX;
use crate::remediation::workload::OwnerPod;

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

/// What to do with a NodeSet pod whose Slurm node slurmctld does not know
/// (slurmrestd answers "not found" for the whole
/// [`MachineConfig::not_found_grace`]).
///
/// The Slinky operator runs slurmd as a dynamic node (slurm-operator v1.2.1
/// `internal/builder/workerbuilder/worker_app.go`, `slurmdArgs`: `-Z`): the
/// node exists in Slurm only once its slurmd has registered. A slurmd on a
/// stale `slurm.key` never authenticates, so after slurmctld starts without
/// its saved state the node is absent: no drain is possible, and no job of
/// Slurm's runs there (Slurm 26.05: a dynamic node is created by its
/// registration: `_slurm_rpc_node_registration` in
/// `src/slurmctld/proc_req.c` calls `create_dynamic_reg_node`,
/// `src/slurmctld/node_mgr.c`, for a node name it does not know).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum AbsentNodePolicy {
    /// Fail the attempt (`SlurmNodeNotFound`); nothing is touched.
    #[default]
    Fail,
    /// Evict the pod without a drain, and verify the replacement by its
    /// slurmd's registration (the node then exists again); no undrain.
    Replace,
}

/// Timeouts and retry pacing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineConfig {
    /// From the drain request until jobs have left the node.
    pub drain_timeout: SignedDuration,
    /// Eviction refused (PDB, errors) for longer than this fails the attempt.
    pub eviction_timeout: SignedDuration,
    /// The longest a workload attempt's hold
    /// ([`crate::remediation::HOLD_TAINT_KEY`]) stays on a node: past it
    /// the hold is lifted, whatever the attempt waits for (a refused
    /// eviction, an old pod slow to go). The hold exists only to keep a
    /// replacement off the node while the old pod pins its cache, so a
    /// replacement may then land there and be judged by its verdicts; no
    /// tenant's PodDisruptionBudget or grace period keeps a node closed to
    /// others for longer.
    pub node_hold_timeout: SignedDuration,
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
    /// Close the node with our FAIL hold from the first write on, instead
    /// of a DRAIN that the hold replaces just before the eviction. The
    /// Slinky operator's undrain (`MakeNodeUndrain`, slurm-operator v1.2.1
    /// internal/controller/nodeset/slurmcontrol/slurmcontrol.go) acts only
    /// on a node with DRAIN; it decides on a reason read from its
    /// slurm-client cache before it reads the state, and can undo a fresh
    /// DRAIN (docs/remediation.md, "Against the Slinky operator"). FAIL
    /// takes no new job either and leaves running ones alone (Slurm's
    /// `update_node`, src/slurmctld/node_mgr.c).
    pub fail_first: bool,
    /// Consecutive reads that must show the replacement's slurmd registered
    /// and responding before the node is released. One read proves little:
    /// a slurmd on a stale key flaps between `IDLE` and
    /// `IDLE+NOT_RESPONDING` (slurmctld counts its authentication-error
    /// replies as responses: `node_not_resp` in `src/slurmctld/node_mgr.c`,
    /// Slurm 26.05).
    pub verify_reads: u32,
    /// A Slurm node slurmctld does not know: fail, or replace its pod
    /// without a drain.
    pub absent_node: AbsentNodePolicy,
}

impl Default for MachineConfig {
    fn default() -> Self {
        Self {
            drain_timeout: SignedDuration::from_hours(24),
            eviction_timeout: SignedDuration::from_mins(30),
            node_hold_timeout: SignedDuration::from_mins(10),
            replacement_timeout: SignedDuration::from_mins(15),
            verification_timeout: SignedDuration::from_mins(10),
            on_failure: FailurePolicy::Auto,
            retry_base: SignedDuration::from_secs(5),
            retry_max: SignedDuration::from_mins(5),
            write_settle: SignedDuration::from_secs(10),
            not_found_grace: SignedDuration::from_mins(5),
            fail_first: false,
            verify_reads: 3,
            absent_node: AbsentNodePolicy::Fail,
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
    /// `slurmd_start_time` (UNIX seconds): the start time the node's slurmd
    /// sent in its last registration that slurmctld accepted. It moves only
    /// when a registration authenticates (`validate_jobs_on_node` in
    /// `src/slurmctld/job_mgr.c`, Slurm 26.05, called from
    /// `_slurm_rpc_node_registration` in `src/slurmctld/proc_req.c` for a
    /// message that passed auth/slurm), so a slurmd on a stale key never
    /// moves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurmd_start_time: Option<i64>,
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

    /// Whether a repair waits for the node's jobs: [`Self::busy`], unless
    /// the jobs are only finishing (COMPLETING, neither ALLOCATED nor MIXED)
    /// and slurmctld reports no registration of the node's slurmd
    /// (`slurmd_start_time` 0). Then their end can only be reported by a
    /// slurmd that authenticates: a job Slurm tried to launch on a slurmd on
    /// a key slurmctld does not hold stays COMPLETING on that node until a
    /// TERMINATE_JOB reaches a slurmd that answers (Slurm 26.05
    /// src/slurmctld/job_mgr.c `_list_find_job_old` -> `re_kill_job` in
    /// src/slurmctld/node_scheduler.c, which skips a NOT_RESPONDING node),
    /// that is, the replacement's. Waiting for it would hold the drain until
    /// the drain timeout (24 h by default). A running job (ALLOCATED or
    /// MIXED) is always waited for.
    pub fn waits_for_jobs(&self) -> bool {
        let finishing_only = !self.has("ALLOCATED") && !self.has("MIXED");
        self.busy() && !(finishing_only && self.slurmd_start_time == Some(0))
    }

    /// Closed to new jobs by a drain or a FAIL (Slurm sets one or the
    /// other: `update_node` in `src/slurmctld/node_mgr.c` clears both before
    /// setting either).
    pub fn held(&self) -> bool {
        self.drain() || self.has("FAIL")
    }

    /// Drained for a repair: held (DRAIN, or FAIL) and no job to wait for
    /// ([`Self::waits_for_jobs`]).
    pub fn drained(&self) -> bool {
        self.held() && !self.waits_for_jobs()
    }

    /// slurmd responds: none of DOWN, NOT_RESPONDING, FAIL.
    pub fn responding(&self) -> bool {
        !(self.has("DOWN") || self.has("NOT_RESPONDING") || self.has("FAIL"))
    }

    /// The drain reason is mountguard's (any attempt).
    pub fn reason_is_mountguard(&self) -> bool {
        self.reason.starts_with(REASON_PREFIX)
    }

    /// Whether slurmctld accepted a registration of a slurmd that started
    /// at `t` or later: only an authenticated registration moves
    /// [`Self::slurmd_start_time`], so a slurmd on a key slurmctld does not
    /// hold never shows one, whatever its state says. Compared in whole
    /// seconds (slurmd's start time has no finer part); 0 or unset is no
    /// registration at all.
    pub fn registered_since(&self, t: Timestamp) -> bool {
        self.slurmd_start_time
            .is_some_and(|s| s > 0 && s >= t.as_second())
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

/// Outcome of the last eviction request (or of the last dry run, see
/// [`Observations::eviction_check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EvictionResult {
    /// The API accepted the eviction (a dry run: it would evict the pod
    /// now).
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
    /// Result of the dry-run eviction ([`super::Action::CheckEviction`])
    /// performed after the previous step.
    pub eviction_check: Option<EvictionResult>,
    /// For grouped attempts: every member of the group is drained.
    pub group_drained: bool,
    /// For grouped attempts: the Kubernetes node's cordon.
    pub cordon: NodeCordon,
    /// For grouped attempts: every member's old pod is gone from the API.
    pub group_old_gone: bool,
    /// For a workload's pod: the workload as read (`None`: not read this
    /// round: wait).
    pub workload: Option<WorkloadObservation>,
    /// When the slurmd container of the pod now under the attempt's name
    /// started (see [`crate::remediation::slurmd_started_at`]); `None`: not
    /// running.
    pub replacement_started: Option<Timestamp>,
}

/// A workload as the machine reads it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkloadObservation {
    /// The workload's pods now.
    pub pods: Vec<OwnerPod>,
    /// Why no eviction may be asked for now: the workload is not fully
    /// available by its own status and its annotation does not allow it
    /// (`None`: it may).
    pub hold: Option<String>,
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
