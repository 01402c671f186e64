//! What the executor feeds the planner and the machine, computed from core
//! values: candidates from the verdicts, a NodeSet's budget and
//! unavailable pods, the replacement's check, a group's cordon, drain and
//! old pods, and the workloads of a snapshot ([`Workloads`]: which workload
//! a pod belongs to, the planner's and the machine's view of each). The
//! controller converts API objects (NodeSets, Nodes, workloads) into the
//! plain values these functions take.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use jiff::Timestamp;

use super::machine::{Attempt, NewPodCheck, NodeCordon, SlurmObservation, WorkloadObservation};
use super::plan::{Candidate, CandidateFinding, NodeSetInfo};
use super::workload::{
    OwnerIdentity, OwnerPod, WorkloadInfo, WorkloadKind, WorkloadModel, WorkloadRef, workload_of,
};
use super::{REMEDIATE_ANNOTATION, REMEDIATE_ON_ANNOTATION};
use crate::Fingerprint;
use crate::model::{ContainerKind, ControllerKind, PodModel};
use crate::uid::PodUid;
use crate::verdict::{PodVerdicts, State};

/// What remediation reads of a NodeSet (`slinky.slurm.net/v1beta1`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSetModel {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The annotations remediation reads ([`REMEDIATE_ANNOTATION`],
    /// [`REMEDIATE_ON_ANNOTATION`]).
    pub annotations: BTreeMap<String, String>,
    /// `spec.replicas`, when it is a non-negative integer.
    pub replicas: Option<u64>,
    /// `spec.updateStrategy.rollingUpdate.maxUnavailable`.
    pub max_unavailable: Option<IntOrString>,
}

/// A NodeSet's namespace and name, written `namespace/name` (the key of
/// its attempts record).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeSetKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for NodeSetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What remediation keeps of a NodeSet object (built by the watch, the
/// rest of the object dropped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetObject {
    /// Namespace, name, the annotations read, the budget's fields.
    pub model: NodeSetModel,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// The persisted attempts ([`super::ATTEMPTS_ANNOTATION`]), raw.
    pub attempts: Option<String>,
}

impl NodeSetObject {
    /// Its namespace and name.
    pub fn key(&self) -> NodeSetKey {
        NodeSetKey {
            namespace: self.model.namespace.clone(),
            name: self.model.name.clone(),
        }
    }
}

/// A Kubernetes `IntOrString` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntOrString {
    /// A non-negative number.
    Int(u64),
    /// A string, e.g. `50%`.
    String(String),
}

fn fp(f: Option<Fingerprint>) -> String {
    f.map_or_else(|| "-".to_string(), |f| f.to_string())
}

/// Candidates from the verdicts of an evaluation: NodeSet pods, and pods
/// of the workloads `workload_of` names (see
/// [`super::workload::workload_of`]), with their non-Fresh verdicts.
pub fn candidates(
    verdicts: &[PodVerdicts],
    workload_of: impl Fn(&PodModel) -> Option<WorkloadRef>,
) -> Vec<Candidate> {
    verdicts
        .iter()
        .filter_map(|pv| {
            let workload = match pv.pod.nodeset() {
                Some(_) => None,
                None => Some(workload_of(&pv.pod)?),
            };
            Some((pv, workload))
        })
        .map(|(pv, workload)| Candidate {
            namespace: pv.pod.namespace().to_string(),
            name: pv.pod.name.to_string(),
            uid: pv.pod.uid.to_string(),
            node: pv.pod.node_name().map(String::from),
            nodeset: pv.pod.nodeset().map(String::from),
            workload,
            slurm_node: pv.pod.slurm_node().map(String::from),
            terminated: pv.pod.terminated,
            findings: pv
                .verdicts
                .iter()
                .filter(|v| !matches!(v.state, State::Fresh | State::Skipped(_)))
                .map(|v| CandidateFinding {
                    subject: pv.subject(v).key(),
                    state: v.state,
                    since: v.since.get(),
                    mounted: fp(v.observed),
                    current: fp(v.expected),
                    pinned_by: v.pinned_by().iter().map(|p| p.to_string()).collect(),
                })
                .collect(),
        })
        .collect()
}

/// `maxUnavailable` of a NodeSet: a number as is; a percentage of
/// `replicas` (default 25%) rounded down, at least 1.
pub fn max_unavailable(ns: &NodeSetModel) -> u32 {
    let replicas = ns.replicas.unwrap_or(1) as u32;
    if let Some(IntOrString::Int(n)) = ns.max_unavailable {
        // An explicit number is the NodeSet's own limit, even 0.
        return n as u32;
    }
    let n = {
        let pct = match &ns.max_unavailable {
            Some(IntOrString::String(s)) => s
                .strip_suffix('%')
                .and_then(|s| s.trim().parse::<u32>().ok())
                .unwrap_or(25),
            _ => 25,
        };
        replicas.saturating_mul(pct) / 100
    };
    n.max(1)
}

/// Pods of a NodeSet unavailable for reasons other than an open attempt:
/// not Ready, not scheduled, terminated, or missing (fewer pods than
/// `replicas`, not counting pods of open attempts being recreated).
pub fn unavailable(
    ns: &NodeSetModel,
    pods: &[Arc<PodModel>],
    attempts: &BTreeMap<String, Attempt>,
) -> u32 {
    let (namespace, name) = (ns.namespace.as_str(), ns.name.as_str());
    let in_attempt: HashSet<&str> = attempts
        .values()
        .filter(|a| a.namespace == namespace && a.nodeset == name && !a.phase.is_terminal())
        .map(|a| a.pod.as_str())
        .collect();
    let members: Vec<&PodModel> = pods
        .iter()
        .filter(|p| **p.namespace() == *namespace && p.nodeset() == Some(name))
        .map(|p| &**p)
        .collect();
    let not_ready = members
        .iter()
        .filter(|p| !in_attempt.contains(&*p.name))
        .filter(|p| !p.ready || p.terminated || p.node().is_none())
        .count() as u32;
    let replicas = ns.replicas.unwrap_or(1) as u32;
    let attempt_pods_absent = in_attempt
        .iter()
        .filter(|n| !members.iter().any(|p| &*p.name == **n))
        .count() as u32;
    let missing = replicas
        .saturating_sub(members.len() as u32)
        .saturating_sub(attempt_pods_absent);
    not_ready + missing
}

/// The planner's view of every NodeSet.
pub fn nodeset_infos(
    nodesets: &[NodeSetModel],
    pods: &[Arc<PodModel>],
    attempts: &BTreeMap<String, Attempt>,
) -> Vec<NodeSetInfo> {
    nodesets
        .iter()
        .map(|n| NodeSetInfo {
            namespace: n.namespace.clone(),
            name: n.name.clone(),
            opt_in: n
                .annotations
                .get(REMEDIATE_ANNOTATION)
                .is_some_and(|v| v.trim() == "true"),
            remediate_on: n.annotations.get(REMEDIATE_ON_ANNOTATION).cloned(),
            max_unavailable: max_unavailable(n),
            unavailable: unavailable(n, pods, attempts),
        })
        .collect()
}

/// The replacement pod's verdicts on the subjects that failed before.
/// `verdicts` lists only pods with some non-Fresh verdict (evaluated at
/// `at`), and a pod is evaluated in the batch that adds it to the index (a
/// pod without an inventory yet is Unverifiable, hence listed): a known,
/// scheduled pod (in `nodeset_pods`) absent from the list is Fresh on every
/// subject. `scanned_at` gives the time of a node's latest inventory (or
/// heartbeat): a Stale or Frozen verdict counts only once the replacement
/// has settled on its node ([`settled`]); before that it is not judged.
pub fn new_pod_check(
    verdicts: &[PodVerdicts],
    nodeset_pods: &[Arc<PodModel>],
    at: Option<Timestamp>,
    scanned_at: impl Fn(&str) -> Option<Timestamp>,
    a: &Attempt,
    fresh_since: &mut HashMap<String, Timestamp>,
) -> NewPodCheck {
    let Some(uid) = a.new_pod_uid.as_deref() else {
        return NewPodCheck::NotYet;
    };
    let pod_known = nodeset_pods
        .iter()
        .any(|p| p.uid == uid && p.node().is_some());
    let pv: Option<&PodVerdicts> = verdicts.iter().find(|pv| pv.pod.uid == uid);
    let Some(pv) = pv else {
        if !pod_known || at.is_none() {
            return NewPodCheck::NotYet;
        }
        fresh_since
            .entry(a.id.clone())
            .or_insert(at.unwrap_or_default());
        return NewPodCheck::Fresh;
    };
    fresh_since.remove(&a.id);
    let settled = settled(&pv.pod, pv.pod.node_name().and_then(&scanned_at));
    let mut all_fresh = true;
    for f in &a.findings {
        let v = pv
            .verdicts
            .iter()
            .find(|v| pv.subject(v).key() == f.subject);
        match v.map(|v| v.state) {
            Some(State::Fresh) => {}
            Some(State::Stale(_) | State::Frozen(_)) if !settled => all_fresh = false,
            Some(s @ (State::Stale(_) | State::Frozen(_))) => {
                let v = v.expect("matched");
                let pinned = if v.pinned_by().is_empty() {
                    String::new()
                } else {
                    let p: Vec<&str> = v.pinned_by().iter().map(|p| &**p).collect();
                    format!(", pinned by {}", p.join(", "))
                };
                return NewPodCheck::StillStale {
                    message: format!(
                        "{} {} (mounted {} vs current {}){pinned}",
                        f.subject,
                        s.tag(),
                        fp(v.observed),
                        fp(v.expected)
                    ),
                };
            }
            _ => all_fresh = false,
        }
    }
    if all_fresh {
        NewPodCheck::Fresh
    } else {
        NewPodCheck::NotYet
    }
}

/// Whether an inventory scanned at `scanned_at` shows `pod`'s volumes as
/// the kubelet set them up for it: every regular container has started,
/// and the scan is at least one second after the last start (`startedAt`
/// has second precision: only a scan that late is certainly after it).
/// The kubelet starts a pod's containers only once every volume of the pod
/// is mounted and written (pkg/kubelet/kubelet.go `SyncPod`:
/// `volumeManager.WaitForAttachAndMount` before `containerRuntime.SyncPod`);
/// before that an agent scan can catch a volume the kubelet is still
/// writing: an empty tmpfs, or AtomicWriter's `..data` link before the
/// user-visible links to it (pkg/volume/util/atomic_writer.go, `Write`).
/// A pod without regular containers never settles.
pub fn settled(pod: &PodModel, scanned_at: Option<Timestamp>) -> bool {
    let mut latest: Option<Timestamp> = None;
    for c in pod
        .containers
        .iter()
        .filter(|c| c.kind == ContainerKind::Regular)
    {
        match c.started_at() {
            Some(s) => latest = latest.max(Some(s)),
            None => return false,
        }
    }
    match (latest, scanned_at) {
        (Some(started), Some(scanned)) => scanned >= started + jiff::SignedDuration::from_secs(1),
        _ => false,
    }
}

/// The name of a NodeSet worker's slurmd container (slurm-operator v1.2.1,
/// `internal/builder/labels/labels.go` `WorkerApp`, used as the container
/// name by `internal/builder/workerbuilder/worker_app.go`).
pub const SLURMD_CONTAINER: &str = "slurmd";

/// When the slurmd of `pod` started: its [`SLURMD_CONTAINER`] container's
/// `startedAt`, or, for a pod without a container of that name, the latest
/// start among its regular containers. `None` while one of them is not
/// running. Compared with the node's `slurmd_start_time`
/// ([`super::machine::Attempt::replacement_registered`]).
pub fn slurmd_started_at(pod: &PodModel) -> Option<Timestamp> {
    let regular = || {
        pod.containers
            .iter()
            .filter(|c| c.kind == ContainerKind::Regular)
    };
    match regular().find(|c| &*c.name == SLURMD_CONTAINER) {
        Some(c) => c.started_at(),
        None => regular().try_fold(None, |latest: Option<Timestamp>, c| {
            c.started_at().map(|s| latest.max(Some(s)))
        })?,
    }
}

/// Whether every old pod of group `group` that is being replaced is gone
/// (`live`: UIDs of the NodeSet pods that exist). A member that failed
/// before its eviction keeps its pod and is not waited for: the cordon
/// would otherwise hold the others until their replacement timeout.
pub fn group_old_gone<'a>(
    attempts: impl IntoIterator<Item = &'a Attempt>,
    group: &str,
    live: &HashSet<&PodUid>,
) -> bool {
    attempts
        .into_iter()
        .filter(|m| m.group.as_deref() == Some(group))
        .filter(|m| !(m.phase.is_terminal() && m.evicted_at.is_none()))
        .all(|m| !live.contains(&PodUid::new(&m.pod_uid)))
}

/// What remediation keeps of a workload object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadObject {
    /// Namespace, kind, name, the annotations read, the status.
    pub model: WorkloadModel,
    /// `metadata.uid`.
    pub uid: Option<String>,
    /// A ReplicaSet's controlling Deployment.
    pub deployment: Option<String>,
    /// The UID in that controller reference.
    pub deployment_uid: Option<String>,
    /// The persisted attempts ([`super::ATTEMPTS_ANNOTATION`]), raw.
    pub attempts: Option<String>,
}

impl WorkloadObject {
    /// Its kind and name.
    pub fn workload(&self) -> Option<&WorkloadRef> {
        self.model.workload.as_ref()
    }

    /// Its key: `<kind>/<namespace>/<name>`, kind in lower case (the form
    /// `wait` and `status` take).
    pub fn key(&self) -> Option<String> {
        self.workload()
            .map(|w| workload_key(&self.model.namespace, w))
    }
}

/// `<kind>/<namespace>/<name>` of workload `w` in `namespace`.
pub fn workload_key(namespace: &str, w: &WorkloadRef) -> String {
    format!("{}/{namespace}/{}", w.kind.lower(), w.name)
}

/// The workloads of a snapshot, looked up by namespace, kind and name.
#[derive(Debug, Default)]
pub struct Workloads<'a> {
    by_ref: HashMap<(&'a str, WorkloadKind, &'a str), &'a WorkloadObject>,
}

impl<'a> Workloads<'a> {
    /// Indexes `objects`.
    pub fn new(objects: &'a [Arc<WorkloadObject>]) -> Self {
        let mut w = Workloads::default();
        for o in objects {
            let Some(r) = o.workload() else {
                continue;
            };
            w.by_ref
                .insert((o.model.namespace.as_str(), r.kind, r.name.as_str()), o);
        }
        w
    }

    /// The workload pod `p` belongs to (a ReplicaSet's pods to its
    /// Deployment), if any: its controller reference's UID must be the
    /// object's, and a ReplicaSet's reference to its Deployment the
    /// Deployment's ([`workload_of`]).
    pub fn of_pod(&self, p: &PodModel) -> Option<WorkloadRef> {
        let c = p.controller()?;
        let ns: &str = p.namespace();
        workload_of(c, |kind, name| {
            let o = self.by_ref.get(&(ns, kind, name))?;
            Some(OwnerIdentity {
                uid: o.uid.as_deref()?,
                deployment: o.deployment.as_deref().zip(o.deployment_uid.as_deref()),
            })
        })
    }

    /// The object of `w` in `namespace`.
    pub fn get(&self, namespace: &str, w: &WorkloadRef) -> Option<&'a WorkloadObject> {
        self.by_ref
            .get(&(namespace, w.kind, w.name.as_str()))
            .copied()
    }

    /// The planner's view of every workload. Not a ReplicaSet controlled
    /// by a Deployment: its pods are the Deployment's ([`Self::of_pod`]),
    /// and its annotations are copies of the Deployment's (the deployment
    /// controller copies them onto its ReplicaSets,
    /// pkg/controller/deployment/util/deployment_util.go
    /// `copyDeploymentAnnotationsToReplicaSet`), so a bad one is told once,
    /// on the Deployment.
    pub fn infos(&self) -> Vec<WorkloadInfo> {
        self.by_ref
            .values()
            .filter(|o| o.deployment.is_none())
            .filter_map(|o| WorkloadInfo::of(&o.model))
            .collect()
    }

    /// What the machine reads of workload `w` in `namespace`: its pods
    /// (among `pods`) and whether an eviction may be asked for now
    /// (`None`: the object is not known).
    pub fn observe(
        &self,
        namespace: &str,
        w: &WorkloadRef,
        pods: &[Arc<PodModel>],
    ) -> Option<WorkloadObservation> {
        let info = WorkloadInfo::of(&self.get(namespace, w)?.model)?;
        let pods = pods
            .iter()
            .filter(|p| **p.namespace() == *namespace && self.of_pod(p).as_ref() == Some(w))
            .map(|p| OwnerPod {
                uid: p.uid.to_string(),
                name: p.name.to_string(),
                node: p.node_name().map(String::from),
                terminating: p.terminating || p.terminated,
            })
            .collect();
        Some(WorkloadObservation {
            pods,
            hold: info.not_available.filter(|_| !info.when_unavailable),
        })
    }
}

/// Whether `p` is a pod of a kind whose workloads may be remediated.
pub fn remediable_kind(p: &PodModel) -> bool {
    matches!(
        p.controller().map(|c| c.kind),
        Some(ControllerKind::ReplicaSet | ControllerKind::StatefulSet | ControllerKind::DaemonSet)
    )
}

/// The Slurm nodes of group `group`'s open attempts: the nodes whose
/// drain [`group_drained`] waits for.
pub fn group_members<'a>(
    attempts: impl IntoIterator<Item = &'a Attempt>,
    group: &str,
) -> Vec<String> {
    attempts
        .into_iter()
        .filter(|m| m.group.as_deref() == Some(group) && m.is_open())
        .map(|m| m.slurm_node.clone())
        .collect()
}

/// Whether a group is drained: every Slurm node of [`group_members`], as
/// read (`members`, one observation each), is drained
/// ([`crate::remediation::SlurmNodeState::drained`]).
pub fn group_drained<'a>(members: impl IntoIterator<Item = &'a SlurmObservation>) -> bool {
    members
        .into_iter()
        .all(|o| matches!(o, SlurmObservation::Node(n) if n.drained()))
}

/// How group `group` sees a node's hold: `owner` is the value of the node's
/// [`super::HOLD_TAINT_KEY`] taint, if it has one. Our taint, another
/// group's, or none; a cordon (`spec.unschedulable`) by someone else does not
/// count: the taint is added anyway, and their cordon is never lifted.
pub fn cordon_of(owner: Option<&str>, group: &str) -> NodeCordon {
    match owner {
        None => NodeCordon::Free,
        Some(o) if o == group => NodeCordon::Ours,
        Some(_) => NodeCordon::Foreign,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_and_missing_pods_count_against_the_budget_but_not_twice() {
        use crate::testkit::PodB;
        let set = NodeSetModel {
            namespace: "slurm".into(),
            name: "worker".into(),
            replicas: Some(4),
            ..NodeSetModel::default()
        };
        let pod = |name: &str, ready: bool| {
            let mut p = PodB::new("slurm", name, &format!("uid-{name}"), "node-a").build();
            p.slinky = crate::model::NodeSetMember::boxed("worker".into(), None);
            p.ready = ready;
            Arc::new(p)
        };
        let none = BTreeMap::new();
        // All four present and ready.
        let all: Vec<_> = (0..4).map(|i| pod(&format!("worker-{i}"), true)).collect();
        assert_eq!(unavailable(&set, &all, &none), 0);
        // One not ready, one missing.
        let some = vec![
            pod("worker-0", true),
            pod("worker-1", false),
            pod("worker-2", true),
        ];
        assert_eq!(unavailable(&set, &some, &none), 2);
        // Pods of another NodeSet do not count.
        let mut other = PodB::new("slurm", "x-0", "uid-x", "node-a").build();
        other.slinky = crate::model::NodeSetMember::boxed("other".into(), None);
        other.ready = false;
        let mut with_other = some.clone();
        with_other.push(Arc::new(other));
        assert_eq!(unavailable(&set, &with_other, &none), 2);
        // The missing pod and the not-ready one belong to open attempts:
        // the attempts count them already.
        let mut attempts = BTreeMap::new();
        for (id, p) in [("a1", "worker-3"), ("a2", "worker-1")] {
            let a = Attempt::new(
                id.into(),
                "slurm",
                "worker",
                p,
                "uid",
                "node-a",
                p,
                vec![],
                Timestamp::now(),
            );
            attempts.insert(id.to_string(), a);
        }
        assert_eq!(unavailable(&set, &some, &attempts), 0);
    }

    #[test]
    fn a_group_waits_for_the_old_pods_it_evicts_only() {
        use crate::remediation::{FailReason, Phase};
        let mk = |id: &str, uid: &str, phase: Phase, evicted: bool| {
            let mut a = Attempt::new(
                id.into(),
                "slurm",
                "worker",
                id,
                uid,
                "node-a",
                id,
                vec![],
                Timestamp::now(),
            );
            a.group = Some("g".into());
            a.phase = phase;
            a.evicted_at = evicted.then(Timestamp::now);
            a
        };
        let a = mk("a", "uid-a", Phase::AwaitingReplacement, true);
        let b = mk("b", "uid-b", Phase::AwaitingReplacement, true);
        let mut other = mk("x", "uid-x", Phase::Evicting, false);
        other.group = Some("other".into());
        let uids = ["uid-b", "uid-x"].map(PodUid::new);
        let live: HashSet<&PodUid> = uids.iter().collect();
        assert!(
            !group_old_gone([&a, &b, &other], "g", &live),
            "b still there"
        );
        let uids = ["uid-x"].map(PodUid::new);
        let live: HashSet<&PodUid> = uids.iter().collect();
        assert!(group_old_gone([&a, &b, &other], "g", &live));
        // A member that failed before its eviction keeps its pod: not waited for.
        let c = mk(
            "c",
            "uid-c",
            Phase::Failed(FailReason::NodeDrainedByOthers),
            false,
        );
        let uids = ["uid-c"].map(PodUid::new);
        let live: HashSet<&PodUid> = uids.iter().collect();
        assert!(group_old_gone([&a, &b, &c], "g", &live));
        // One that failed after it was evicted is waited for like the others.
        let d = mk(
            "d",
            "uid-d",
            Phase::Failed(FailReason::ReplacementTimeout),
            true,
        );
        let uids = ["uid-d"].map(PodUid::new);
        let live: HashSet<&PodUid> = uids.iter().collect();
        assert!(!group_old_gone([&a, &d], "g", &live));
    }

    #[test]
    fn a_group_is_drained_when_the_node_of_each_open_member_is() {
        use crate::remediation::machine::Phase;
        use crate::remediation::test_support::{attempt, node};
        let member = |id: &str, slurm: &str, group: &str, phase: Phase| {
            let mut a = attempt();
            a.id = id.into();
            a.slurm_node = slurm.into();
            a.group = Some(group.into());
            a.phase = phase;
            a
        };
        let a = member("a", "n1", "g", Phase::Draining);
        let b = member("b", "n2", "g", Phase::Drained);
        let done = member("c", "n3", "g", Phase::Succeeded);
        let other = member("x", "n4", "h", Phase::Draining);
        assert_eq!(
            group_members([&a, &b, &done, &other], "g"),
            vec!["n1".to_string(), "n2".to_string()],
            "open members of the group only"
        );
        let drained = SlurmObservation::Node(node(&["IDLE", "DRAIN"], "mountguard: x"));
        let busy = SlurmObservation::Node(node(&["MIXED", "DRAIN"], "mountguard: x"));
        assert!(group_drained([&drained, &drained]));
        assert!(!group_drained([&drained, &busy]), "jobs still run on one");
        assert!(!group_drained([&drained, &SlurmObservation::NotFound]));
        assert!(group_drained([]), "no member left to wait for");
    }

    /// An attempt on `worker-0` (old UID `uid-old`, node `node-a`) whose
    /// replacement is `uid-new`, recorded with `findings` on `subjects`
    /// (as read back from the persisted record).
    fn replaced_attempt(subjects: &[&str], state: &str, at: Timestamp) -> Attempt {
        use crate::remediation::Finding;
        let findings = subjects
            .iter()
            .map(|s| Finding {
                subject: serde_json::from_value(serde_json::json!(s)).unwrap(),
                state: state.into(),
                mounted: "-".into(),
                current: "-".into(),
            })
            .collect();
        let mut a = Attempt::new(
            "a".into(),
            "slurm",
            "worker",
            "worker-0",
            "uid-old",
            "node-a",
            "worker-0",
            findings,
            at,
        );
        a.new_pod_uid = Some("uid-new".into());
        a
    }

    #[test]
    fn the_replacement_is_checked_on_the_subjects_recorded_by_key() {
        use crate::model::VolumeSource;
        use crate::testkit::{PodB, obj};
        use crate::verdict::{StaleCause, SubjectId, Verdict};
        let t = Timestamp::now();
        // The replacement: volume `etc` and subPath mounts of `cfg` at
        // positions 0 and 1 of container `c` (the old pod's finding was
        // the one at position 1).
        let src = VolumeSource::Object(obj(crate::SourceKind::Secret, "s", &[], false));
        let pod = PodB::new("slurm", "worker-0", "uid-new", "node-a")
            .volume("etc", src.clone())
            .volume("cfg", src)
            .container("c", Some(t), &[("cfg", "a"), ("cfg", "b")], vec![])
            .build();
        let pod = Arc::new(pod);
        let verdict = |id, state| Verdict {
            id,
            state,
            underlying: state,
            expected: None,
            observed: None,
            since: t.into(),
            detail: None,
        };
        let stale = State::Stale(StaleCause::Unknown);
        let verdicts = vec![PodVerdicts {
            pod: pod.clone(),
            verdicts: vec![
                verdict(SubjectId::Volume(0), State::Fresh),
                verdict(SubjectId::Volume(1), State::Fresh),
                verdict(SubjectId::SubPath(0, 0), stale),
                verdict(SubjectId::SubPath(0, 1), State::Fresh),
            ]
            .into(),
        }];
        let check = |subjects: &[&str]| {
            let a = replaced_attempt(subjects, "Stale/Unknown", t);
            new_pod_check(
                &verdicts,
                std::slice::from_ref(&pod),
                Some(t),
                |_| Some(t + jiff::SignedDuration::from_secs(1)),
                &a,
                &mut HashMap::new(),
            )
        };
        assert_eq!(check(&["subPath c/1", "volume etc"]), NewPodCheck::Fresh);
        match check(&["subPath c/0"]) {
            NewPodCheck::StillStale { message } => {
                assert!(
                    message.starts_with("subPath c/0 Stale/Unknown"),
                    "{message}"
                )
            }
            other => panic!("{other:?}"),
        }
        // A subject the replacement does not have is not judged Fresh.
        assert_eq!(check(&["volume gone"]), NewPodCheck::NotYet);
    }

    #[test]
    fn a_replacement_is_judged_still_stale_only_on_a_scan_after_its_containers_started() {
        use crate::model::VolumeSource;
        use crate::testkit::{PodB, obj};
        use crate::verdict::{StaleCause, SubjectId, Verdict};
        use jiff::SignedDuration;
        let started: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let src = VolumeSource::Object(obj(crate::SourceKind::ConfigMap, "hooks", &[], false));
        let pod = |start: Option<Timestamp>| {
            Arc::new(
                PodB::new("slurm", "worker-0", "uid-new", "node-a")
                    .volume("hooks", src.clone())
                    .container("slurmd", start, &[("hooks", "")], vec![])
                    .build(),
            )
        };
        let check = |pod: Arc<PodModel>, scanned: Option<Timestamp>| {
            // The kubelet's volume, caught half written: Stale.
            let verdicts = vec![PodVerdicts {
                pod: pod.clone(),
                verdicts: vec![Verdict {
                    id: SubjectId::Volume(0),
                    state: State::Stale(StaleCause::Unknown),
                    underlying: State::Stale(StaleCause::Unknown),
                    expected: None,
                    observed: None,
                    since: started.into(),
                    detail: None,
                }]
                .into(),
            }];
            let a = replaced_attempt(&["volume hooks"], "Frozen/ReadAtStart", started);
            new_pod_check(
                &verdicts,
                std::slice::from_ref(&pod),
                Some(started),
                |node| (node == "node-a").then_some(scanned).flatten(),
                &a,
                &mut HashMap::new(),
            )
        };
        let ms = SignedDuration::from_millis;
        // Not started yet, or no scan after the start: not judged.
        assert_eq!(
            check(pod(None), Some(started + ms(10_000))),
            NewPodCheck::NotYet
        );
        assert_eq!(check(pod(Some(started)), None), NewPodCheck::NotYet);
        assert_eq!(
            check(pod(Some(started)), Some(started)),
            NewPodCheck::NotYet
        );
        assert_eq!(
            check(pod(Some(started)), Some(started + ms(999))),
            NewPodCheck::NotYet
        );
        // A scan a full second after the start: still stale.
        assert!(matches!(
            check(pod(Some(started)), Some(started + ms(1_000))),
            NewPodCheck::StillStale { .. }
        ));
        assert!(!settled(&pod(Some(started)), Some(started + ms(999))));
        assert!(settled(&pod(Some(started)), Some(started + ms(1_000))));
    }

    #[test]
    fn the_slurmd_start_is_the_slurmd_containers_or_else_the_latest_regular_one() {
        use crate::testkit::PodB;
        let t0: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let t1: Timestamp = "2026-12-01T10:05:00Z".parse().unwrap();
        let pod = |containers: &[(&str, Option<Timestamp>)]| {
            let mut b = PodB::new("slurm", "worker-0", "uid", "node-a");
            for (name, start) in containers {
                b = b.container(name, *start, &[], vec![]);
            }
            b.build()
        };
        // The slurmd container decides, whatever a sidecar did later.
        assert_eq!(
            slurmd_started_at(&pod(&[("slurmd", Some(t0)), ("logs", Some(t1))])),
            Some(t0)
        );
        assert_eq!(
            slurmd_started_at(&pod(&[("slurmd", None), ("logs", Some(t1))])),
            None
        );
        // Without one, the latest regular container, and only once all run.
        assert_eq!(
            slurmd_started_at(&pod(&[("a", Some(t1)), ("b", Some(t0))])),
            Some(t1)
        );
        assert_eq!(
            slurmd_started_at(&pod(&[("a", Some(t1)), ("b", None)])),
            None
        );
        assert_eq!(slurmd_started_at(&pod(&[])), None);
    }

    #[test]
    fn pods_of_a_deployments_replicaset_are_the_deployments() {
        use crate::model::ControllerRef;
        use crate::remediation::workload::WorkloadStatus;
        use crate::testkit::PodB;
        let object = |kind, name: &str, uid: Option<&str>, available| WorkloadObject {
            model: WorkloadModel {
                namespace: "shop".into(),
                workload: Some(WorkloadRef {
                    kind,
                    name: name.into(),
                }),
                annotations: BTreeMap::new(),
                status: WorkloadStatus {
                    desired: 1,
                    updated: 1,
                    total: 1,
                    available,
                    ..WorkloadStatus::default()
                },
            },
            uid: uid.map(String::from),
            deployment: None,
            deployment_uid: None,
            attempts: None,
        };
        // A ReplicaSet controlled by Deployment `web` (UID u0), as the
        // controller converts it.
        let mut rs = object(WorkloadKind::ReplicaSet, "web-7d9f", Some("rs-uid"), 1);
        rs.deployment = Some("web".into());
        rs.deployment_uid = Some("u0".into());
        let dep = object(WorkloadKind::Deployment, "web", Some("u0"), 1);
        let objects = vec![Arc::new(rs), Arc::new(dep)];
        let w = Workloads::new(&objects);
        let claims = |name: &str, ns: &str, terminating: bool, rs_uid: &str| {
            let mut p = PodB::new(ns, name, &format!("uid-{name}"), "node-a").build();
            p.workload =
                ControllerRef::boxed(ControllerKind::ReplicaSet, "web-7d9f".into(), rs_uid);
            p.terminating = terminating;
            Arc::new(p)
        };
        let pod = |name: &str, ns: &str, terminating: bool| claims(name, ns, terminating, "rs-uid");
        let pods = vec![
            pod("web-7d9f-a", "shop", true),
            pod("web-7d9f-b", "shop", false),
            pod("web-7d9f-c", "other", false),
            // Names the ReplicaSet, under a UID of its own making.
            claims("web-7d9f-x", "shop", false, "forged"),
        ];
        let dref = WorkloadRef {
            kind: WorkloadKind::Deployment,
            name: "web".into(),
        };
        assert_eq!(w.of_pod(&pods[0]), Some(dref.clone()));
        assert_eq!(
            w.of_pod(&pods[2]),
            None,
            "no such ReplicaSet in that namespace"
        );
        assert_eq!(w.of_pod(&pods[3]), None, "not the ReplicaSet's UID");
        let o = w.observe("shop", &dref, &pods).expect("known");
        let names: Vec<(&str, bool)> = o
            .pods
            .iter()
            .map(|p| (p.name.as_str(), p.terminating))
            .collect();
        assert_eq!(names, vec![("web-7d9f-a", true), ("web-7d9f-b", false)]);
        assert_eq!(o.hold, None);
        assert!(
            w.observe(
                "shop",
                &WorkloadRef {
                    kind: WorkloadKind::StatefulSet,
                    name: "web".into()
                },
                &pods
            )
            .is_none()
        );
        let infos: Vec<WorkloadRef> = w.infos().into_iter().map(|i| i.workload).collect();
        assert_eq!(infos, vec![dref], "not the Deployment's ReplicaSet");
        let alone = object(WorkloadKind::ReplicaSet, "batch", None, 0);
        let objects = vec![Arc::new(alone)];
        let infos: Vec<WorkloadKind> = Workloads::new(&objects)
            .infos()
            .into_iter()
            .map(|i| i.workload.kind)
            .collect();
        assert_eq!(
            infos,
            vec![WorkloadKind::ReplicaSet],
            "a ReplicaSet of its own"
        );
    }
}
