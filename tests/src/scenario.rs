//! Steps of the end-to-end scenarios, shared by the end-to-end tests and
//! the demo: the seed scenario's pinning pod and key rotation, what each
//! node serves, pod replacement, and reading the controller's verdicts.

use std::io;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use crate::apiserver::{DeleteOptions, resources};
use crate::cluster::{AUTH_SECRET, Cluster, NODESET, SLURM_NAMESPACE};
use crate::mountguard::{http_get, poll};
use crate::objects::Objects;

/// The second pod on node A that also mounts `slurm-auth-slurm` and so
/// keeps the kubelet's cache entry of the old Secret alive (the pin).
pub const PINNING_POD: &str = "slurm-auth-check";

/// The projected volume of the slurmd pods that holds `slurm.key`.
pub const KEY_VOLUME: &str = "slurm-etc";

/// A pod on `node` that mounts Secret `slurm-auth-slurm` as a plain volume.
pub fn pinning_pod(node: &str) -> Value {
    json!({
        "metadata": {"name": PINNING_POD, "labels": {"app.kubernetes.io/name": "slurm-auth-check"}},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "check",
                "image": "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04",
                "volumeMounts": [{"name": "auth", "mountPath": "/etc/slurm-auth", "readOnly": true}],
            }],
            "volumes": [{"name": "auth", "secret": {"secretName": AUTH_SECRET, "defaultMode": 0o600}}],
        },
    })
}

fn api_err(e: crate::apiserver::ApiError) -> io::Error {
    io::Error::other(e.to_string())
}

/// A pod whose only reference to `slurm-auth-slurm` is the env of an init
/// container that ran to completion (it copied the key somewhere): the
/// kubelet registers it all the same, so it pins as well as a mount.
pub const INIT_ENV_PINNING_POD: &str = "slurm-key-copier";

/// [`INIT_ENV_PINNING_POD`] on `node`.
pub fn init_env_pinning_pod(node: &str) -> Value {
    json!({
        "metadata": {"name": INIT_ENV_PINNING_POD},
        "spec": {
            "nodeName": node,
            "initContainers": [{
                "name": "copy-key",
                "image": "busybox",
                "env": [{"name": "SLURM_KEY", "valueFrom": {"secretKeyRef": {"name": AUTH_SECRET, "key": "slurm.key"}}}],
            }],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    })
}

/// Creates [`PINNING_POD`] on `node` and waits until it runs.
pub async fn add_pinning_pod<A: Objects + ?Sized>(api: &A, node: &str) -> io::Result<()> {
    add_running_pod(api, pinning_pod(node)).await
}

/// Creates `pod` in the Slurm namespace and waits until it runs.
pub async fn add_running_pod<A: Objects + ?Sized>(api: &A, pod: Value) -> io::Result<()> {
    let name = pod["metadata"]["name"].as_str().unwrap_or("").to_string();
    api.create(&resources::PODS, SLURM_NAMESPACE, pod)
        .map_err(api_err)?;
    poll(
        &format!("pod {name} to run"),
        Duration::from_secs(15),
        || async {
            let p = api.get(&resources::PODS, SLURM_NAMESPACE, &name).ok()?;
            (p["status"]["phase"] == "Running").then_some(())
        },
    )
    .await
}

/// A new random `slurm.key` (1024 bytes).
pub fn random_auth_key() -> Vec<u8> {
    let mut key = Vec::with_capacity(1024);
    while key.len() < 1024 {
        key.extend_from_slice(&crate::util::random_u64().to_le_bytes());
    }
    key
}

/// Deletes the immutable `slurm-auth-slurm` and creates it again (still
/// immutable) with a new random `slurm.key`; returns the new key.
pub fn rotate_auth_key<A: Objects + ?Sized>(api: &A) -> io::Result<Vec<u8>> {
    let key = random_auth_key();
    api.delete(
        &resources::SECRETS,
        SLURM_NAMESPACE,
        AUTH_SECRET,
        &DeleteOptions::default(),
    )
    .map_err(api_err)?;
    api.create(
        &resources::SECRETS,
        SLURM_NAMESPACE,
        json!({
            "metadata": {"name": AUTH_SECRET},
            "immutable": true,
            "data": {"slurm.key": base64::engine::general_purpose::STANDARD.encode(&key)},
        }),
    )
    .map_err(api_err)?;
    Ok(key)
}

/// The current `slurm.key` in the API.
pub fn api_auth_key<A: Objects + ?Sized>(api: &A) -> io::Result<Vec<u8>> {
    let s = api
        .get(&resources::SECRETS, SLURM_NAMESPACE, AUTH_SECRET)
        .map_err(api_err)?;
    base64::engine::general_purpose::STANDARD
        .decode(s["data"]["slurm.key"].as_str().unwrap_or(""))
        .map_err(io::Error::other)
}

/// The running slurmd pod of the NodeSet on node `i` (name, UID).
pub fn slurmd_pod<A: Objects + ?Sized>(api: &A, i: usize) -> Option<(String, String)> {
    let name = format!("{NODESET}-{i}");
    let p = api.get(&resources::PODS, SLURM_NAMESPACE, &name).ok()?;
    if p["status"]["phase"] != "Running" || !p["metadata"]["deletionTimestamp"].is_null() {
        return None;
    }
    Some((name, p["metadata"]["uid"].as_str()?.to_string()))
}

/// Waits until every node runs its slurmd pod; their (name, UID) by node.
pub async fn wait_for_slurmd_pods(cluster: &Cluster) -> io::Result<Vec<(String, String)>> {
    let api = cluster.api();
    let n = cluster.node_names().len();
    poll(
        "every slurmd pod to run",
        Duration::from_secs(20),
        || async {
            (0..n)
                .map(|i| slurmd_pod(&api, i))
                .collect::<Option<Vec<_>>>()
        },
    )
    .await
}

/// The `slurm.key` node `i`'s kubelet serves to pod `uid` (what slurmd
/// reads), from the kubelet root.
pub fn served_key(cluster: &Cluster, i: usize, uid: &str) -> io::Result<Vec<u8>> {
    std::fs::read(
        mountguard_inventory::layout::pod_dir(&cluster.kubelet_root(i), uid)
            .join("volumes/kubernetes.io~projected")
            .join(KEY_VOLUME)
            .join("slurm.key"),
    )
}

/// Deletes node `i`'s slurmd pod and waits for the NodeSet's replacement
/// to run; returns its (name, UID).
pub async fn replace_slurmd_pod(cluster: &Cluster, i: usize) -> io::Result<(String, String)> {
    let api = cluster.api();
    let (name, old_uid) = slurmd_pod(&api, i)
        .ok_or_else(|| io::Error::other(format!("no running slurmd pod on node {i}")))?;
    api.delete(
        &resources::PODS,
        SLURM_NAMESPACE,
        &name,
        &DeleteOptions::default(),
    )
    .map_err(api_err)?;
    poll(
        "the replacement slurmd pod to run",
        Duration::from_secs(20),
        || async { slurmd_pod(&api, i).filter(|(_, uid)| *uid != old_uid) },
    )
    .await
}

/// `GET /v1/verdicts?<query>` of the controller's metrics server.
pub async fn verdicts(metrics_base: &str, query: &str) -> io::Result<Value> {
    let text = http_get(&format!("{metrics_base}/v1/verdicts?{query}")).await?;
    serde_json::from_str(&text).map_err(io::Error::other)
}

/// Whether a `/v1/verdicts?all=1` document has every one of `pods`' (name,
/// UID) key volume (`volume slurm-etc`) Fresh and every verdict Fresh or
/// Skipped.
pub fn all_fresh(doc: &Value, pods: &[(String, String)]) -> bool {
    let Some(items) = doc["verdicts"].as_array() else {
        return false;
    };
    let slurmd_fresh = every_pod_has(doc, pods, |v| {
        v["subject"] == "volume slurm-etc" && v["state"] == "Fresh"
    });
    let all_ok = items
        .iter()
        .all(|v| v["state"] == "Fresh" || v["state"] == "Skipped");
    slurmd_fresh && all_ok
}

/// Whether each of `pods` (name, UID) has a verdict in a `/v1/verdicts`
/// document that `want` accepts.
pub fn every_pod_has(
    doc: &Value,
    pods: &[(String, String)],
    want: impl Fn(&Value) -> bool,
) -> bool {
    let Some(items) = doc["verdicts"].as_array() else {
        return false;
    };
    pods.iter()
        .all(|(p, _)| items.iter().any(|v| v["pod"] == p.as_str() && want(v)))
}

/// The verdict of `pod`'s subject `subject` (e.g. `volume slurm-etc`) in a
/// `/v1/verdicts` document.
pub fn find_verdict<'a>(doc: &'a Value, pod: &str, subject: &str) -> Option<&'a Value> {
    doc["verdicts"]
        .as_array()?
        .iter()
        .find(|v| v["pod"] == pod && v["subject"] == subject)
}

/// `State` or `State/Cause` of a verdict item.
pub fn state_tag(v: &Value) -> String {
    match v["cause"].as_str() {
        Some(c) if !c.is_empty() => format!("{}/{c}", v["state"].as_str().unwrap_or("")),
        _ => v["state"].as_str().unwrap_or("").to_string(),
    }
}
