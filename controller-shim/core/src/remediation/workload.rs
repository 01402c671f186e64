//! The owners of ordinary workload pods (Deployments, ReplicaSets,
//! StatefulSets, DaemonSets): how a pod's owner is named, what an owner's
//! annotations ask for, whether its own status says it is fully available,
//! and how each kind's controller replaces an evicted pod. Pure.
//!
//! The attempt of a workload pod has no Slurm step: evict (Eviction API),
//! wait for the owner's replacement, verify it fresh on its node. The
//! planner ([`super::plan`]) and the machine ([`super::machine`]) read
//! what this file computes; [`AnnotationNotices`] decides which bad
//! annotation is told (once per distinct value).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::{REMEDIATE_ANNOTATION, REMEDIATE_ON_ANNOTATION};
use crate::model::{ControllerKind, ControllerRef};

/// Workload annotation: open attempts of the workload at once (a positive
/// integer; 1 without it).
pub const MAX_IN_FLIGHT_ANNOTATION: &str = "mountguard.io/remediate-max-in-flight";
/// Workload annotation (`"true"`): evict even while the workload's own
/// status says it is not fully available.
pub const WHEN_UNAVAILABLE_ANNOTATION: &str = "mountguard.io/remediate-when-unavailable";
/// The value of [`REMEDIATE_ANNOTATION`] that opts a workload in.
pub const EVICT: &str = "evict";

/// A workload whose pods mountguard may evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum WorkloadKind {
    /// `apps/v1` Deployment (its pods belong to its ReplicaSets).
    Deployment,
    /// `apps/v1` ReplicaSet not controlled by a Deployment.
    ReplicaSet,
    /// `apps/v1` StatefulSet.
    StatefulSet,
    /// `apps/v1` DaemonSet.
    DaemonSet,
}

impl WorkloadKind {
    /// Every kind.
    pub const ALL: [WorkloadKind; 4] = [
        WorkloadKind::Deployment,
        WorkloadKind::ReplicaSet,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
    ];

    /// The kind's name, e.g. `Deployment`.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
        }
    }

    /// The lower-case name kubectl takes (`deployment/<ns>/<name>`).
    pub fn lower(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "deployment",
            WorkloadKind::ReplicaSet => "replicaset",
            WorkloadKind::StatefulSet => "statefulset",
            WorkloadKind::DaemonSet => "daemonset",
        }
    }
}

impl std::str::FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        Self::ALL
            .into_iter()
            .find(|k| t.eq_ignore_ascii_case(k.as_str()))
            .ok_or_else(|| {
                format!("{s:?} is not a workload kind; use Deployment, ReplicaSet, StatefulSet or DaemonSet")
            })
    }
}

/// A workload in the pod's namespace: the owner an attempt is persisted on
/// and budgeted against.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WorkloadRef {
    /// Kind.
    pub kind: WorkloadKind,
    /// Name.
    pub name: String,
}

impl fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.name)
    }
}

/// A workload object as a pod's controller reference is matched against
/// it (see [`workload_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnerIdentity<'a> {
    /// Its `metadata.uid`.
    pub uid: &'a str,
    /// A ReplicaSet's controlling Deployment (its owner reference with
    /// `controller: true`): name and UID.
    pub deployment: Option<(&'a str, &'a str)>,
}

/// The workload a pod belongs to: its StatefulSet or DaemonSet, its
/// ReplicaSet, or the Deployment controlling that ReplicaSet (a
/// Deployment's pods are budgeted and opted in through the Deployment, as
/// the Deployment controller owns its ReplicaSets:
/// pkg/controller/deployment/deployment_controller.go,
/// `getReplicaSetsForDeployment`). `object(kind, name)` is the object of
/// that kind and name in the pod's namespace, if known.
///
/// Owners are matched by UID, as Kubernetes' own controllers do: an owner
/// reference is the pod's claim, and only the reference with `controller:
/// true` whose UID is the object's makes the object its controller
/// (k8s.io/apimachinery/pkg/apis/meta/v1, `GetControllerOf` and
/// `IsControlledBy`; pkg/controller/controller_ref_manager.go,
/// `ClaimObject`). A pod naming an opted-in workload under another UID
/// (made by whoever may create pods in the namespace) belongs to no
/// workload here; so does a ReplicaSet's pod whose ReplicaSet names a
/// Deployment of another UID (one deleted and created again). `None` too
/// when the object is not known.
pub fn workload_of<'a>(
    c: &ControllerRef,
    object: impl Fn(WorkloadKind, &str) -> Option<OwnerIdentity<'a>>,
) -> Option<WorkloadRef> {
    let kind = match c.kind {
        ControllerKind::StatefulSet => WorkloadKind::StatefulSet,
        ControllerKind::DaemonSet => WorkloadKind::DaemonSet,
        ControllerKind::ReplicaSet => WorkloadKind::ReplicaSet,
    };
    let owner = object(kind, &c.name)?;
    if c.uid != *owner.uid {
        return None;
    }
    match owner.deployment {
        Some((name, uid)) if kind == WorkloadKind::ReplicaSet => {
            let d = object(WorkloadKind::Deployment, name)?;
            (d.uid == uid).then(|| WorkloadRef {
                kind: WorkloadKind::Deployment,
                name: name.to_string(),
            })
        }
        _ => Some(WorkloadRef {
            kind,
            name: c.name.to_string(),
        }),
    }
}

/// The workload a pod names, by names alone: [`workload_of`] without the
/// UIDs (`deployment_of(replicaset)`: the Deployment controlling a
/// ReplicaSet). For the read-only rollout view, which may run without the
/// workload watches; remediation decides with [`workload_of`].
pub fn workload_named(
    c: &ControllerRef,
    deployment_of: impl Fn(&str) -> Option<String>,
) -> WorkloadRef {
    match c.kind {
        ControllerKind::StatefulSet => WorkloadRef {
            kind: WorkloadKind::StatefulSet,
            name: c.name.to_string(),
        },
        ControllerKind::DaemonSet => WorkloadRef {
            kind: WorkloadKind::DaemonSet,
            name: c.name.to_string(),
        },
        ControllerKind::ReplicaSet => match deployment_of(&c.name) {
            Some(d) => WorkloadRef {
                kind: WorkloadKind::Deployment,
                name: d,
            },
            None => WorkloadRef {
                kind: WorkloadKind::ReplicaSet,
                name: c.name.to_string(),
            },
        },
    }
}

/// A workload's status as its controller wrote it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkloadStatus {
    /// `metadata.generation`.
    pub generation: i64,
    /// `status.observedGeneration`.
    pub observed_generation: i64,
    /// Pods wanted: `spec.replicas` (default 1), a DaemonSet's
    /// `status.desiredNumberScheduled`.
    pub desired: u32,
    /// Pods of the current revision: `status.updatedReplicas`, a
    /// DaemonSet's `status.updatedNumberScheduled` (a ReplicaSet has one
    /// revision: its `status.replicas`).
    pub updated: u32,
    /// Pods of every revision: `status.replicas`, a DaemonSet's
    /// `status.currentNumberScheduled`.
    pub total: u32,
    /// Available pods: `status.availableReplicas`, a DaemonSet's
    /// `status.numberAvailable`.
    pub available: u32,
}

impl WorkloadStatus {
    /// Why the workload is not fully available by its own status, or
    /// `None` when it is: the status describes the current spec, every
    /// wanted pod is of the current revision, no old pod is left, and every
    /// wanted pod is available. The rules of `kubectl rollout status`
    /// (kubectl pkg/polymorphichelpers/rollout_status.go,
    /// `DeploymentStatusViewer.Status`, `DaemonSetStatusViewer.Status`,
    /// `StatefulSetStatusViewer.Status`), with availability, not readiness,
    /// for StatefulSets too (`status.availableReplicas`, counted by
    /// pkg/controller/statefulset/stateful_set_control.go
    /// `computeReplicaStatus`).
    pub fn not_available(&self) -> Option<String> {
        if self.observed_generation < self.generation {
            return Some(format!(
                "its status is of generation {}, the spec is at {}",
                self.observed_generation, self.generation
            ));
        }
        if self.updated < self.desired {
            return Some(format!(
                "{} of {} pods are of the current revision",
                self.updated, self.desired
            ));
        }
        if self.total > self.updated {
            return Some(format!(
                "{} old pods are pending termination",
                self.total - self.updated
            ));
        }
        if self.available < self.desired {
            return Some(format!(
                "{} of {} pods are available",
                self.available, self.desired
            ));
        }
        None
    }
}

/// What remediation reads of a workload object.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct WorkloadModel {
    /// Namespace.
    pub namespace: String,
    /// Kind and name.
    pub workload: Option<WorkloadRef>,
    /// The annotations remediation reads ([`REMEDIATE_ANNOTATION`],
    /// [`REMEDIATE_ON_ANNOTATION`], [`MAX_IN_FLIGHT_ANNOTATION`],
    /// [`WHEN_UNAVAILABLE_ANNOTATION`]).
    pub annotations: BTreeMap<String, String>,
    /// Its status.
    pub status: WorkloadStatus,
}

/// A workload as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadInfo {
    /// Namespace.
    pub namespace: String,
    /// Kind and name.
    pub workload: WorkloadRef,
    /// `mountguard.io/remediate: evict`; an error for any other value.
    pub opt_in: Result<bool, String>,
    /// `mountguard.io/remediate-on`, raw.
    pub remediate_on: Option<String>,
    /// Open attempts at once ([`MAX_IN_FLIGHT_ANNOTATION`], default 1), or
    /// why the annotation is not a positive integer.
    pub max_in_flight: Result<u32, String>,
    /// Why the workload is not fully available now (its own status).
    pub not_available: Option<String>,
    /// [`WHEN_UNAVAILABLE_ANNOTATION`] is `"true"`.
    pub when_unavailable: bool,
}

impl WorkloadInfo {
    /// The planner's view of `m` (none without a kind and name).
    pub fn of(m: &WorkloadModel) -> Option<Self> {
        let workload = m.workload.clone()?;
        let get = |k: &str| m.annotations.get(k).map(|v| v.trim());
        let opt_in = match get(REMEDIATE_ANNOTATION) {
            None => Ok(false),
            Some(v) if v == EVICT => Ok(true),
            Some(v) => Err(format!(
                "{REMEDIATE_ANNOTATION}: {v:?} on {workload}; the only remediation of a workload's pods is {EVICT:?}"
            )),
        };
        let max_in_flight = match get(MAX_IN_FLIGHT_ANNOTATION) {
            None => Ok(1),
            Some(v) => match v.parse::<u32>() {
                Ok(n) if n >= 1 => Ok(n),
                _ => Err(format!(
                    "{MAX_IN_FLIGHT_ANNOTATION}: {v:?} on {workload} is not a positive integer"
                )),
            },
        };
        Some(Self {
            namespace: m.namespace.clone(),
            remediate_on: m.annotations.get(REMEDIATE_ON_ANNOTATION).cloned(),
            opt_in,
            max_in_flight,
            not_available: m.status.not_available(),
            when_unavailable: get(WHEN_UNAVAILABLE_ANNOTATION) == Some("true"),
            workload,
        })
    }
}

/// A workload annotation that cannot be read: its workload and why (the
/// message names the annotation, the value and what is accepted).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AnnotationProblem {
    /// Namespace.
    pub namespace: String,
    /// Kind and name.
    pub workload: WorkloadRef,
    /// What is wrong and what is accepted.
    pub message: String,
}

/// Which bad workload annotations were told already: each distinct
/// problem (workload and message, so the value) once while it lasts; a
/// problem that went away (fixed or the workload gone) is forgotten, so
/// the same bad value written again is told again.
#[derive(Debug, Default)]
pub struct AnnotationNotices {
    told: BTreeSet<AnnotationProblem>,
}

impl AnnotationNotices {
    /// The problems of `infos` (workloads of `kinds` only) not told yet;
    /// they count as told from now on (`untold` undoes one whose Event
    /// could not be published).
    pub fn news(
        &mut self,
        infos: &[WorkloadInfo],
        kinds: &BTreeSet<WorkloadKind>,
    ) -> Vec<AnnotationProblem> {
        let now: BTreeSet<AnnotationProblem> = infos
            .iter()
            .filter(|i| kinds.contains(&i.workload.kind))
            .flat_map(|i| {
                let errs = [i.opt_in.as_ref().err(), i.max_in_flight.as_ref().err()];
                errs.into_iter().flatten().map(|m| AnnotationProblem {
                    namespace: i.namespace.clone(),
                    workload: i.workload.clone(),
                    message: m.clone(),
                })
            })
            .collect();
        let news = now.difference(&self.told).cloned().collect();
        self.told = now;
        news
    }

    /// Forgets that `p` was told (its Event failed: try again next round).
    pub fn untold(&mut self, p: &AnnotationProblem) {
        self.told.remove(p);
    }
}

/// One pod of a workload, as the machine looks for the replacement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct OwnerPod {
    /// UID.
    pub uid: String,
    /// Name.
    pub name: String,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// `metadata.deletionTimestamp` is set (or the pod has terminated).
    pub terminating: bool,
}

/// The replacement of the attempt's old pod among the workload's pods now
/// (`pods`), by how each kind's controller replaces an evicted pod;
/// `known`: the UIDs of the workload's pods when the eviction was asked
/// for, none of which is a replacement.
/// * StatefulSet: the pod under the same name with another UID. The
///   controller recreates a missing ordinal under its own name
///   (pkg/controller/statefulset/stateful_set_utils.go, `getPodName`,
///   `newVersionedStatefulSetPod`) once the old pod is gone.
/// * DaemonSet: a new pod on the same node. The controller creates one for
///   a node that should run the daemon and has no pod of it
///   (pkg/controller/daemon/daemon_controller.go, `podsShouldBeOnNode`),
///   pinned to that node (`util.ReplaceDaemonSetPodNodeNameNodeAffinity`).
/// * ReplicaSet (a Deployment's too): any new pod, on any node. The
///   controller creates pods while fewer than `replicas` are active, and a
///   pod being deleted is no longer active
///   (pkg/controller/replicaset/replica_set.go, `manageReplicas`;
///   pkg/controller/controller_utils.go, `IsPodActive`); the scheduler
///   places it.
///
/// A pod being deleted is never a replacement; of several new pods the
/// first by name is taken (one attempt per workload at a time by default).
pub fn replacement<'a>(
    kind: WorkloadKind,
    old_name: &str,
    old_uid: &str,
    node: &str,
    known: &[String],
    pods: &'a [OwnerPod],
) -> Option<&'a OwnerPod> {
    let mut new = pods
        .iter()
        .filter(|p| p.uid != old_uid && !p.terminating && !known.contains(&p.uid));
    match kind {
        WorkloadKind::StatefulSet => new.find(|p| p.name == old_name),
        WorkloadKind::DaemonSet => new.find(|p| p.node.as_deref() == Some(node)),
        WorkloadKind::Deployment | WorkloadKind::ReplicaSet => {
            new.min_by(|a, b| a.name.cmp(&b.name))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(uid: &str, name: &str, node: &str) -> OwnerPod {
        OwnerPod {
            uid: uid.into(),
            name: name.into(),
            node: (!node.is_empty()).then(|| node.to_string()),
            terminating: false,
        }
    }

    #[test]
    fn each_kind_finds_its_replacement_its_own_way() {
        use WorkloadKind as K;
        let known = vec!["u-old".to_string(), "u-b".to_string(), "u-c".to_string()];
        let old = p("u-old", "web-0", "node-a");
        let mut gone = old.clone();
        gone.terminating = true;
        let b = p("u-b", "web-1", "node-b");
        let c = p("u-c", "web-2", "node-c");
        // (case, kind, pods now, replacement uid)
        let t: Vec<(&str, K, Vec<OwnerPod>, Option<&str>)> = vec![
            (
                "rs: nothing new yet",
                K::ReplicaSet,
                vec![gone.clone(), b.clone(), c.clone()],
                None,
            ),
            (
                "rs: a new pod on another node",
                K::ReplicaSet,
                vec![
                    gone.clone(),
                    b.clone(),
                    c.clone(),
                    p("u-new", "web-x", "node-c"),
                ],
                Some("u-new"),
            ),
            (
                "deployment: a new pod not scheduled yet",
                K::Deployment,
                vec![b.clone(), c.clone(), p("u-new", "web-x", "")],
                Some("u-new"),
            ),
            (
                "rs: of two new pods the first by name",
                K::ReplicaSet,
                vec![p("u-z", "web-z", "node-a"), p("u-y", "web-y", "node-b")],
                Some("u-y"),
            ),
            (
                "rs: a new pod being deleted is not it",
                K::ReplicaSet,
                vec![OwnerPod {
                    terminating: true,
                    ..p("u-new", "web-x", "node-a")
                }],
                None,
            ),
            (
                "sts: the old pod still terminating",
                K::StatefulSet,
                vec![gone.clone(), b.clone()],
                None,
            ),
            (
                "sts: same name, new uid",
                K::StatefulSet,
                vec![p("u-new", "web-0", "node-b"), b.clone()],
                Some("u-new"),
            ),
            (
                "sts: a new pod of another ordinal is not it",
                K::StatefulSet,
                vec![p("u-new", "web-3", "node-a"), b.clone()],
                None,
            ),
            (
                "ds: a new pod on another node is not it",
                K::DaemonSet,
                vec![b.clone(), c.clone(), p("u-new", "agent-x", "node-d")],
                None,
            ),
            (
                "ds: a new pod on the same node",
                K::DaemonSet,
                vec![b.clone(), c.clone(), p("u-new", "agent-y", "node-a")],
                Some("u-new"),
            ),
        ];
        for (case, kind, pods, want) in t {
            let got = replacement(kind, &old.name, &old.uid, "node-a", &known, &pods);
            assert_eq!(got.map(|p| p.uid.as_str()), want, "{case}");
        }
    }

    #[test]
    fn a_replicaset_of_a_deployment_is_budgeted_as_the_deployment() {
        let c = |kind, name: &str, uid: &str| ControllerRef {
            kind,
            name: name.into(),
            uid: uid.into(),
        };
        let objects = |kind: WorkloadKind, name: &str| match (kind, name) {
            (WorkloadKind::ReplicaSet, "web-7d9f") => Some(OwnerIdentity {
                uid: "rs-uid",
                deployment: Some(("web", "dep-uid")),
            }),
            (WorkloadKind::ReplicaSet, "batch") => Some(OwnerIdentity {
                uid: "batch-uid",
                deployment: None,
            }),
            (WorkloadKind::Deployment, "web") => Some(OwnerIdentity {
                uid: "dep-uid",
                deployment: None,
            }),
            (WorkloadKind::StatefulSet, "db") => Some(OwnerIdentity {
                uid: "db-uid",
                deployment: None,
            }),
            _ => None,
        };
        let of = |r: ControllerRef| workload_of(&r, objects).map(|w| w.to_string());
        assert_eq!(
            of(c(ControllerKind::ReplicaSet, "web-7d9f", "rs-uid")).as_deref(),
            Some("Deployment web")
        );
        assert_eq!(
            of(c(ControllerKind::ReplicaSet, "batch", "batch-uid")).as_deref(),
            Some("ReplicaSet batch")
        );
        assert_eq!(
            of(c(ControllerKind::StatefulSet, "db", "db-uid")).as_deref(),
            Some("StatefulSet db")
        );
        assert_eq!(
            of(c(ControllerKind::DaemonSet, "agent", "x")),
            None,
            "unknown"
        );
        // By names alone (the rollout view).
        let rs = c(ControllerKind::ReplicaSet, "web-7d9f", "rs-uid");
        let named = |rs: &str| (rs == "web-7d9f").then(|| "web".to_string());
        assert_eq!(workload_named(&rs, named).to_string(), "Deployment web");
        assert_eq!(
            workload_named(&rs, |_| None).to_string(),
            "ReplicaSet web-7d9f"
        );
    }

    #[test]
    fn a_pod_naming_an_opted_in_workload_under_another_uid_is_not_its_pod() {
        let dep = |uid: &'static str| OwnerIdentity {
            uid,
            deployment: None,
        };
        let rs = |uid: &'static str, d: &'static str| OwnerIdentity {
            uid,
            deployment: Some(("web", d)),
        };
        type Objects = Vec<(WorkloadKind, &'static str, OwnerIdentity<'static>)>;
        /// (case, the pod's controller reference: kind, name, UID; the
        /// objects; the owner found)
        type Case = (
            &'static str,
            ControllerKind,
            &'static str,
            &'static str,
            Objects,
            Option<&'static str>,
        );
        let t: Vec<Case> = vec![
            (
                "a DaemonSet's pod, its UID",
                ControllerKind::DaemonSet,
                "agent",
                "ds-uid",
                vec![(WorkloadKind::DaemonSet, "agent", dep("ds-uid"))],
                Some("DaemonSet agent"),
            ),
            (
                "a pod naming the DaemonSet under another UID",
                ControllerKind::DaemonSet,
                "agent",
                "forged-uid",
                vec![(WorkloadKind::DaemonSet, "agent", dep("ds-uid"))],
                None,
            ),
            (
                "a pod naming the StatefulSet under another UID",
                ControllerKind::StatefulSet,
                "db",
                "forged-uid",
                vec![(WorkloadKind::StatefulSet, "db", dep("sts-uid"))],
                None,
            ),
            (
                "a pod naming a Deployment's ReplicaSet under another UID",
                ControllerKind::ReplicaSet,
                "web-7d9f",
                "forged-uid",
                vec![
                    (
                        WorkloadKind::ReplicaSet,
                        "web-7d9f",
                        rs("rs-uid", "dep-uid"),
                    ),
                    (WorkloadKind::Deployment, "web", dep("dep-uid")),
                ],
                None,
            ),
            (
                "a ReplicaSet naming the Deployment under another UID",
                ControllerKind::ReplicaSet,
                "web-7d9f",
                "rs-uid",
                vec![
                    (
                        WorkloadKind::ReplicaSet,
                        "web-7d9f",
                        rs("rs-uid", "old-dep-uid"),
                    ),
                    (WorkloadKind::Deployment, "web", dep("dep-uid")),
                ],
                None,
            ),
            (
                "a Deployment's pod through its ReplicaSet",
                ControllerKind::ReplicaSet,
                "web-7d9f",
                "rs-uid",
                vec![
                    (
                        WorkloadKind::ReplicaSet,
                        "web-7d9f",
                        rs("rs-uid", "dep-uid"),
                    ),
                    (WorkloadKind::Deployment, "web", dep("dep-uid")),
                ],
                Some("Deployment web"),
            ),
        ];
        for (case, kind, name, uid, objects, want) in t {
            let c = ControllerRef {
                kind,
                name: name.into(),
                uid: uid.into(),
            };
            let got = workload_of(&c, |k, n| {
                objects
                    .iter()
                    .find(|(ok, on, _)| *ok == k && *on == n)
                    .map(|(_, _, o)| *o)
            });
            assert_eq!(got.map(|w| w.to_string()).as_deref(), want, "{case}");
        }
    }

    #[test]
    fn fully_available_by_the_workloads_own_status() {
        let ok = WorkloadStatus {
            generation: 4,
            observed_generation: 4,
            desired: 3,
            updated: 3,
            total: 3,
            available: 3,
        };
        assert_eq!(ok.not_available(), None);
        let t = [
            (
                WorkloadStatus {
                    observed_generation: 3,
                    ..ok
                },
                "generation 3",
            ),
            (
                WorkloadStatus { updated: 2, ..ok },
                "2 of 3 pods are of the current revision",
            ),
            (
                WorkloadStatus { total: 4, ..ok },
                "1 old pods are pending termination",
            ),
            (
                WorkloadStatus { available: 2, ..ok },
                "2 of 3 pods are available",
            ),
        ];
        for (s, want) in t {
            let why = s.not_available().expect("not available");
            assert!(why.contains(want), "{s:?}: {why}");
        }
        // Scaled to zero: nothing to wait for.
        let zero = WorkloadStatus {
            desired: 0,
            updated: 0,
            total: 0,
            available: 0,
            ..ok
        };
        assert_eq!(zero.not_available(), None);
    }

    #[test]
    fn annotations_are_read_with_clear_errors() {
        let model = |pairs: &[(&str, &str)]| WorkloadModel {
            namespace: "shop".into(),
            workload: Some(WorkloadRef {
                kind: WorkloadKind::Deployment,
                name: "web".into(),
            }),
            annotations: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            status: WorkloadStatus::default(),
        };
        let i = WorkloadInfo::of(&model(&[])).expect("named");
        assert_eq!(
            (i.opt_in.clone(), i.max_in_flight.clone()),
            (Ok(false), Ok(1))
        );
        assert!(!i.when_unavailable);
        let i = WorkloadInfo::of(&model(&[
            (REMEDIATE_ANNOTATION, " evict "),
            (MAX_IN_FLIGHT_ANNOTATION, "2"),
            (WHEN_UNAVAILABLE_ANNOTATION, "true"),
        ]))
        .expect("named");
        assert_eq!((i.opt_in, i.max_in_flight), (Ok(true), Ok(2)));
        assert!(i.when_unavailable);
        let i = WorkloadInfo::of(&model(&[
            (REMEDIATE_ANNOTATION, "true"),
            (MAX_IN_FLIGHT_ANNOTATION, "0"),
        ]))
        .expect("named");
        let e = i.opt_in.expect_err("true is a NodeSet's value");
        assert!(
            e.contains("\"evict\"") && e.contains("Deployment web"),
            "{e}"
        );
        let e = i.max_in_flight.expect_err("0 in flight");
        assert!(e.contains("positive integer"), "{e}");
        assert!("statefulset".parse::<WorkloadKind>() == Ok(WorkloadKind::StatefulSet));
        assert!(
            "Job"
                .parse::<WorkloadKind>()
                .unwrap_err()
                .contains("DaemonSet")
        );
    }

    #[test]
    fn a_bad_annotation_is_told_once_per_value() {
        let info = |opt_in: Result<bool, String>, max: Result<u32, String>| WorkloadInfo {
            namespace: "shop".into(),
            workload: WorkloadRef {
                kind: WorkloadKind::Deployment,
                name: "web".into(),
            },
            opt_in,
            remediate_on: None,
            max_in_flight: max,
            not_available: None,
            when_unavailable: false,
        };
        let kinds: BTreeSet<WorkloadKind> = [WorkloadKind::Deployment].into();
        let mut n = AnnotationNotices::default();
        let bad = |v: &str| Err::<bool, String>(format!("remediate: {v:?}"));
        let first = n.news(&[info(bad("yes"), Ok(1))], &kinds);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].message, "remediate: \"yes\"");
        assert_eq!(first[0].workload.name, "web");
        assert!(
            n.news(&[info(bad("yes"), Ok(1))], &kinds).is_empty(),
            "told once"
        );
        // Another bad value is a new problem; both annotations bad: two.
        let two = n.news(&[info(bad("no"), Err("max: \"0\"".into()))], &kinds);
        assert_eq!(two.len(), 2, "{two:?}");
        // Fixed, then the same bad value again: told again.
        assert!(n.news(&[info(Ok(true), Ok(1))], &kinds).is_empty());
        let last = n.news(&[info(bad("no"), Ok(1))], &kinds);
        assert_eq!(last.len(), 1);
        // A failed Event is told next round.
        n.untold(&last[0]);
        let again = n.news(&[info(bad("no"), Ok(1))], &kinds);
        assert_eq!(again.len(), 1, "{again:?}");
        // Kinds not remediated are not told.
        let mut n = AnnotationNotices::default();
        assert!(
            n.news(&[info(bad("yes"), Ok(1))], &BTreeSet::new())
                .is_empty()
        );
    }
}
