//! Workloads (Deployments, ReplicaSets, StatefulSets, DaemonSets) at the
//! edge: what remediation keeps of each object (the core's
//! [`WorkloadObject`], built by the watches, the rest of the object
//! dropped), and the one write remediation makes to a workload (its
//! attempts annotation). What the planner and the machine read of them and
//! the pods is the core's `remediation::inputs::Workloads`.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch};
use serde_json::json;

use mountguard_core::remediation::inputs::WorkloadObject;
use mountguard_core::remediation::workload::{
    MAX_IN_FLIGHT_ANNOTATION, WHEN_UNAVAILABLE_ANNOTATION, WorkloadKind, WorkloadModel,
    WorkloadRef, WorkloadStatus,
};
use mountguard_core::remediation::{
    ATTEMPTS_ANNOTATION, REMEDIATE_ANNOTATION, REMEDIATE_ON_ANNOTATION,
};

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
        assert_eq!(rs.deployment_uid.as_deref(), Some("u0"));
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
}
