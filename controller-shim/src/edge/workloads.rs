//! Workloads (Deployments, ReplicaSets, StatefulSets, DaemonSets) at the
//! edge: what remediation keeps of each object ([`WorkloadObject`], built
//! by the watches, the rest of the object dropped), the planner's and the
//! machine's inputs computed from them and the pods, and the one write
//! remediation makes to a workload (its attempts annotation).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch};
use serde_json::json;

use mountguard_core::PodModel;
use mountguard_core::model::ControllerKind;
use mountguard_core::remediation::machine::WorkloadObservation;
use mountguard_core::remediation::workload::{
    MAX_IN_FLIGHT_ANNOTATION, OwnerIdentity, OwnerPod, WHEN_UNAVAILABLE_ANNOTATION, WorkloadInfo,
    WorkloadKind, WorkloadModel, WorkloadRef, WorkloadStatus, workload_of,
};
use mountguard_core::remediation::{
    ATTEMPTS_ANNOTATION, REMEDIATE_ANNOTATION, REMEDIATE_ON_ANNOTATION,
};

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
    /// The persisted attempts ([`ATTEMPTS_ANNOTATION`]), raw.
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

fn base(meta: &ObjectMeta, kind: WorkloadKind, status: WorkloadStatus) -> Option<WorkloadObject> {
    let annotations = meta.annotations.as_ref();
    let read = [
        REMEDIATE_ANNOTATION,
        REMEDIATE_ON_ANNOTATION,
        MAX_IN_FLIGHT_ANNOTATION,
        WHEN_UNAVAILABLE_ANNOTATION,
    ];
    Some(WorkloadObject {
        model: WorkloadModel {
            namespace: meta.namespace.clone()?,
            workload: Some(WorkloadRef {
                kind,
                name: meta.name.clone()?,
            }),
            annotations: read
                .into_iter()
                .filter_map(|k| Some((k.to_string(), annotations?.get(k)?.clone())))
                .collect::<BTreeMap<_, _>>(),
            status,
        },
        uid: meta.uid.clone(),
        deployment: None,
        deployment_uid: None,
        attempts: annotations
            .and_then(|a| a.get(ATTEMPTS_ANNOTATION))
            .cloned(),
    })
}

fn count(n: Option<i32>) -> u32 {
    n.unwrap_or(0).max(0) as u32
}

/// A Deployment as remediation keeps it.
pub fn from_deployment(d: &Deployment) -> Option<WorkloadObject> {
    let s = d.status.clone().unwrap_or_default();
    let desired = count(Some(d.spec.replicas.unwrap_or(1)));
    base(
        &d.metadata,
        WorkloadKind::Deployment,
        WorkloadStatus {
            generation: d.metadata.generation.unwrap_or(0),
            observed_generation: s.observed_generation.unwrap_or(0),
            desired,
            updated: count(s.updated_replicas),
            total: count(s.replicas),
            available: count(s.available_replicas),
        },
    )
}

/// A ReplicaSet as remediation keeps it, with its controlling Deployment.
pub fn from_replicaset(r: &ReplicaSet) -> Option<WorkloadObject> {
    let s = r.status.clone().unwrap_or_default();
    let desired = count(Some(r.spec.replicas.unwrap_or(1)));
    let mut o = base(
        &r.metadata,
        WorkloadKind::ReplicaSet,
        WorkloadStatus {
            generation: r.metadata.generation.unwrap_or(0),
            observed_generation: s.observed_generation.unwrap_or(0),
            desired,
            // One revision: every pod is of it.
            updated: count(Some(s.replicas)),
            total: count(Some(s.replicas)),
            available: count(s.available_replicas),
        },
    )?;
    // Its controller reference (k8s.io/apimachinery/pkg/apis/meta/v1,
    // `GetControllerOf`), if a Deployment.
    if let Some(c) = r.metadata.owner_references.iter().flatten().find(|o| {
        o.api_version == "apps/v1" && o.kind == "Deployment" && o.controller == Some(true)
    }) {
        o.deployment = Some(c.name.clone());
        o.deployment_uid = Some(c.uid.clone());
    }
    Some(o)
}

/// A StatefulSet as remediation keeps it.
pub fn from_statefulset(t: &StatefulSet) -> Option<WorkloadObject> {
    let s = t.status.clone().unwrap_or_default();
    let desired = count(Some(t.spec.replicas.unwrap_or(1)));
    base(
        &t.metadata,
        WorkloadKind::StatefulSet,
        WorkloadStatus {
            generation: t.metadata.generation.unwrap_or(0),
            observed_generation: s.observed_generation.unwrap_or(0),
            desired,
            updated: count(s.updated_replicas),
            total: count(Some(s.replicas)),
            available: count(s.available_replicas),
        },
    )
}

/// A DaemonSet as remediation keeps it.
pub fn from_daemonset(d: &DaemonSet) -> Option<WorkloadObject> {
    let s = d.status.clone().unwrap_or_default();
    base(
        &d.metadata,
        WorkloadKind::DaemonSet,
        WorkloadStatus {
            generation: d.metadata.generation.unwrap_or(0),
            observed_generation: s.observed_generation.unwrap_or(0),
            desired: count(Some(s.desired_number_scheduled)),
            updated: count(s.updated_number_scheduled),
            total: count(Some(s.current_number_scheduled)),
            available: count(s.number_available),
        },
    )
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

/// Writes `record` into the attempts annotation of workload `w` in
/// `namespace` (a merge patch of that one annotation: nothing that makes
/// its controller roll its pods).
pub async fn persist(
    client: &kube::Client,
    namespace: &str,
    w: &WorkloadRef,
    record: &str,
) -> Result<(), kube::Error> {
    let patch = json!({"metadata": {"annotations": {ATTEMPTS_ANNOTATION: record}}});
    let pp = crate::runtime::kube::patch_params();
    let p = Patch::Merge(&patch);
    match w.kind {
        WorkloadKind::Deployment => Api::<Deployment>::namespaced(client.clone(), namespace)
            .patch(&w.name, &pp, &p)
            .await
            .map(|_| ()),
        WorkloadKind::ReplicaSet => Api::<ReplicaSet>::namespaced(client.clone(), namespace)
            .patch(&w.name, &pp, &p)
            .await
            .map(|_| ()),
        WorkloadKind::StatefulSet => Api::<StatefulSet>::namespaced(client.clone(), namespace)
            .patch(&w.name, &pp, &p)
            .await
            .map(|_| ()),
        WorkloadKind::DaemonSet => Api::<DaemonSet>::namespaced(client.clone(), namespace)
            .patch(&w.name, &pp, &p)
            .await
            .map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj<K: serde::de::DeserializeOwned>(v: serde_json::Value) -> K {
        serde_json::from_value(v).expect("object")
    }

    #[test]
    fn each_kind_keeps_its_annotations_status_and_owner() {
        let meta = json!({"namespace": "shop", "name": "web", "uid": "u1", "generation": 3,
            "annotations": {"mountguard.io/remediate": "evict", "other": "x",
                "mountguard.io/remediation-attempts": "{\"version\":1,\"attempts\":[]}"}});
        let d = from_deployment(&obj(json!({"metadata": meta, "spec": {"replicas": 3, "selector": {}, "template": {}},
            "status": {"observedGeneration": 3, "replicas": 4, "updatedReplicas": 3, "availableReplicas": 3}})))
        .expect("named");
        assert_eq!(d.key().as_deref(), Some("deployment/shop/web"));
        assert_eq!(d.model.annotations.len(), 1, "only what remediation reads");
        assert!(d.attempts.is_some());
        let why = d.model.status.not_available().expect("an old pod left");
        assert!(why.contains("1 old pods"), "{why}");
        let mut rs_meta = meta.clone();
        rs_meta["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "Deployment",
            "name": "web", "uid": "u0", "controller": true}]);
        rs_meta["name"] = json!("web-7d9f");
        let rs = from_replicaset(&obj(
            json!({"metadata": rs_meta, "spec": {"replicas": 3, "selector": {}},
            "status": {"observedGeneration": 3, "replicas": 3, "availableReplicas": 3}}),
        ))
        .expect("named");
        assert_eq!(rs.deployment.as_deref(), Some("web"));
        assert_eq!(rs.model.status.not_available(), None);
        let sts = from_statefulset(&obj(json!({"metadata": meta, "spec": {"replicas": 2, "selector": {}, "template": {}, "serviceName": "web"},
            "status": {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 1}})))
        .expect("named");
        assert!(sts.model.status.not_available().unwrap().contains("1 of 2"));
        let ds = from_daemonset(&obj(json!({"metadata": meta, "spec": {"selector": {}, "template": {}},
            "status": {"observedGeneration": 2, "desiredNumberScheduled": 2, "currentNumberScheduled": 2,
                "numberMisscheduled": 0, "numberReady": 2, "updatedNumberScheduled": 2, "numberAvailable": 2}})))
        .expect("named");
        assert!(
            ds.model
                .status
                .not_available()
                .unwrap()
                .contains("generation 2")
        );
    }

    #[test]
    fn pods_of_a_deployments_replicaset_are_the_deployments() {
        use mountguard_core::model::ControllerRef;
        use mountguard_core::testkit::PodB;
        let mut rs = from_replicaset(&obj(json!({"metadata": {"namespace": "shop", "name": "web-7d9f", "uid": "rs-uid",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u0", "controller": true}]},
            "spec": {"selector": {}}, "status": {"replicas": 1}})))
        .unwrap();
        rs.model.status.available = 1;
        let dep = from_deployment(&obj(
            json!({"metadata": {"namespace": "shop", "name": "web", "uid": "u0"},
            "spec": {"replicas": 1, "selector": {}, "template": {}},
            "status": {"replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}}),
        ))
        .unwrap();
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
        let alone = from_replicaset(&obj(
            json!({"metadata": {"namespace": "shop", "name": "batch"},
            "spec": {"selector": {}}, "status": {"replicas": 1}}),
        ))
        .unwrap();
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
