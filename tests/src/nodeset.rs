//! The NodeSet double: a stand-in for the Slinky operator's NodeSet
//! controller (StatefulSet-like scaling mode).
//!
//! For each `slinky.slurm.net/v1beta1` NodeSet it keeps `spec.replicas` pods
//! named `<nodeset>-<ordinal>` from `spec.template` (a PodTemplateSpec),
//! with the labels and controller ownerReference Slinky sets, one per node
//! in node-name order, except that a cordoned node (`spec.unschedulable`),
//! or one with a `NoSchedule`/`NoExecute` taint the pod template does not
//! tolerate, takes no new pod until that changes (the scheduler's part:
//! the `NodeUnschedulable` and `TaintToleration` filter plugins of
//! kube-scheduler, `pkg/scheduler/framework/plugins/{nodeunschedulable,
//! tainttoleration}`; toleration matching as `Toleration.ToleratesTaint`
//! in `k8s.io/api/core/v1/toleration.go`). A deleted
//! pod is recreated under the same name (with a new UID) only after the old
//! one is gone from the API. Pods above the replica count are deleted; pods
//! whose NodeSet is gone are garbage
//! collected. `status.replicas` / `readyReplicas` are kept up to date.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::BTreeSet;

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::apiserver::{ApiHandle, DeleteOptions, resources};
use crate::objects::Objects;

/// Label: Slurm node name of a NodeSet pod.
pub const LABEL_POD_HOSTNAME: &str = "nodeset.slinky.slurm.net/pod-hostname";
/// Label: Slurm cluster name.
pub const LABEL_CLUSTER: &str = "slinky.slurm.net/cluster";

/// A running NodeSet double.
#[derive(Debug)]
pub struct NodeSetDouble {
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl NodeSetDouble {
    /// Starts reconciling every NodeSet in the API double.
    pub fn start(api: ApiHandle) -> Self {
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut sub = api.subscribe(api.resource_version());
            reconcile_all(&api);
            loop {
                tokio::select! {
                    _ = stop_rx.changed() => return,
                    evs = sub.next() => match evs {
                        Ok(evs) => {
                            let relevant = evs.iter().any(|e| {
                                e.rt == resources::NODESETS || e.rt == resources::PODS || e.rt == resources::NODES
                            });
                            if relevant {
                                reconcile_all(&api);
                            }
                        }
                        Err(e) if e.code == 410 => {
                            sub = api.subscribe(api.resource_version());
                            reconcile_all(&api);
                        }
                        Err(_) => return,
                    },
                }
            }
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Reconciles every NodeSet that `api` (a client of the real API
    /// server) serves every `period`, on a blocking thread, until stopped:
    /// a poll instead of the in-box event feed, with the same rules.
    pub fn start_polling(api: std::sync::Arc<dyn Objects>, period: std::time::Duration) -> Self {
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = stop_rx.changed() => return,
                    _ = tick.tick() => {}
                }
                let api = api.clone();
                let _ = tokio::task::spawn_blocking(move || reconcile_all(&*api)).await;
            }
        });
        Self {
            stop,
            task: Some(task),
        }
    }

    /// Stops reconciling.
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for NodeSetDouble {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

fn controller_uid(pod: &Value) -> Option<&str> {
    pod["metadata"]["ownerReferences"]
        .as_array()?
        .iter()
        .find(|o| o["kind"] == "NodeSet" && o["controller"] == true)
        .and_then(|o| o["uid"].as_str())
}

fn ready(pod: &Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|cs| {
        cs.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Reconciles every NodeSet once, through the API double's handle or a
/// client of the real API server.
pub fn reconcile_all<A: Objects + ?Sized>(api: &A) {
    let nodesets = api.list_all(&resources::NODESETS, None);
    // (name, the Node), in name order.
    let mut nodes: Vec<(String, Value)> = api
        .list_all(&resources::NODES, None)
        .into_iter()
        .filter_map(|n| Some((n["metadata"]["name"].as_str()?.to_string(), n)))
        .collect();
    nodes.sort_by(|a, b| a.0.cmp(&b.0));
    let live: BTreeSet<&str> = nodesets
        .iter()
        .filter_map(|n| n["metadata"]["uid"].as_str())
        .collect();
    // Garbage collection of pods whose NodeSet is gone.
    for pod in api.list_all(&resources::PODS, None) {
        if let Some(uid) = controller_uid(&pod)
            && !live.contains(uid)
            && pod["metadata"]["deletionTimestamp"].is_null()
        {
            let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
            let name = pod["metadata"]["name"].as_str().unwrap_or("");
            let _ = api.delete(&resources::PODS, ns, name, &DeleteOptions::default());
        }
    }
    for ns_obj in &nodesets {
        reconcile(api, ns_obj, &nodes);
    }
}

/// `Toleration.ToleratesTaint` (k8s.io/api/core/v1/toleration.go): an
/// empty effect or key matches any; `Exists` ignores the value, `Equal`
/// (or no operator) compares it; `Lt` and `Gt` match nothing while their
/// gate `TaintTolerationComparisonOperators` is off (alpha, the default).
fn tolerates(t: &Value, taint: &Value) -> bool {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    if !s(&t["effect"]).is_empty() && t["effect"] != taint["effect"] {
        return false;
    }
    if !s(&t["key"]).is_empty() && t["key"] != taint["key"] {
        return false;
    }
    match s(&t["operator"]).as_str() {
        "" | "Equal" => s(&t["value"]) == s(&taint["value"]),
        "Exists" => true,
        _ => false,
    }
}

/// Whether kube-scheduler may place a pod with `spec` on `node`: the node
/// is not cordoned (`NodeUnschedulable`) and every `NoSchedule` or
/// `NoExecute` taint is tolerated (`TaintToleration`'s Filter, which
/// ignores `PreferNoSchedule`).
pub fn schedulable(node: &Value, spec: &Value) -> bool {
    if node["spec"]["unschedulable"] == true {
        return false;
    }
    let none = Vec::new();
    let tolerations = spec["tolerations"].as_array().unwrap_or(&none);
    node["spec"]["taints"]
        .as_array()
        .unwrap_or(&none)
        .iter()
        .filter(|t| t["effect"] == "NoSchedule" || t["effect"] == "NoExecute")
        .all(|taint| tolerations.iter().any(|t| tolerates(t, taint)))
}

fn reconcile<A: Objects + ?Sized>(api: &A, nodeset: &Value, nodes: &[(String, Value)]) {
    let ns = nodeset["metadata"]["namespace"].as_str().unwrap_or("");
    let name = nodeset["metadata"]["name"].as_str().unwrap_or("");
    let uid = nodeset["metadata"]["uid"].as_str().unwrap_or("");
    if !nodeset["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let replicas = nodeset["spec"]["replicas"].as_u64().unwrap_or(1) as usize;
    let cluster = nodeset["spec"]["controllerRef"]["name"]
        .as_str()
        .unwrap_or("slurm")
        .to_string();
    let template = &nodeset["spec"]["template"];
    let owned: Vec<Value> = api
        .list_all(&resources::PODS, Some(ns))
        .into_iter()
        .filter(|p| controller_uid(p) == Some(uid))
        .collect();
    for ordinal in 0..replicas {
        let pod_name = format!("{name}-{ordinal}");
        if api.get(&resources::PODS, ns, &pod_name).is_ok() {
            // Present (maybe terminating): wait until it is gone.
            continue;
        }
        let mut labels = template["metadata"]["labels"].clone();
        if !labels.is_object() {
            labels = json!({});
        }
        for (k, v) in [
            ("app.kubernetes.io/name", "slurmd"),
            ("app.kubernetes.io/component", "worker"),
            ("app.kubernetes.io/instance", name),
            (LABEL_CLUSTER, cluster.as_str()),
            (LABEL_POD_HOSTNAME, pod_name.as_str()),
        ] {
            labels[k] = json!(v);
        }
        let mut spec = template["spec"].clone();
        if !spec.is_object() {
            spec = json!({"containers": []});
        }
        spec["hostname"] = json!(pod_name);
        if spec["nodeName"].as_str().is_none_or(str::is_empty) && !nodes.is_empty() {
            // Playing the scheduler: a cordoned or tainted node takes no new
            // pod; the pod stays Pending until that changes.
            let (node, obj) = &nodes[ordinal % nodes.len()];
            if schedulable(obj, &spec) {
                spec["nodeName"] = json!(node);
            } else if let Some(m) = spec.as_object_mut() {
                m.remove("nodeName");
            }
        }
        let pod = json!({
            "metadata": {
                "name": pod_name,
                "labels": labels,
                "annotations": template["metadata"]["annotations"].clone(),
                "ownerReferences": [{
                    "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                    "name": name, "uid": uid, "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "spec": spec,
        });
        let mut pod = pod;
        if pod["metadata"]["annotations"].is_null()
            && let Some(m) = pod["metadata"].as_object_mut()
        {
            m.remove("annotations");
        }
        let _ = api.create(&resources::PODS, ns, pod);
    }
    // Bind Pending pods whose node became schedulable again.
    for p in &owned {
        if p["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
            || !p["metadata"]["deletionTimestamp"].is_null()
        {
            continue;
        }
        let pname = p["metadata"]["name"].as_str().unwrap_or("");
        let ordinal = pname
            .strip_prefix(&format!("{name}-"))
            .and_then(|o| o.parse::<usize>().ok());
        if let Some(o) = ordinal
            && !nodes.is_empty()
            && schedulable(&nodes[o % nodes.len()].1, &p["spec"])
        {
            let node = &nodes[o % nodes.len()].0;
            let _ = api.bind(ns, pname, node);
        }
    }
    // Scale down: pods with an ordinal at or above replicas.
    for p in &owned {
        let pname = p["metadata"]["name"].as_str().unwrap_or("");
        let ordinal = pname
            .strip_prefix(&format!("{name}-"))
            .and_then(|o| o.parse::<usize>().ok());
        if ordinal.is_some_and(|o| o >= replicas) && p["metadata"]["deletionTimestamp"].is_null() {
            let _ = api.delete(&resources::PODS, ns, pname, &DeleteOptions::default());
        }
    }
    let status = json!({"status": {
        "replicas": owned.len(),
        "readyReplicas": owned.iter().filter(|p| ready(p)).count(),
        "observedGeneration": nodeset["metadata"]["generation"].clone(),
    }});
    let _ = api.merge_patch(&resources::NODESETS, ns, name, &status, Some("status"));
}
