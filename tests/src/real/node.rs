//! A simulated node that is a client of the real API server: a node double.
//!
//! It authenticates as `system:node:<name>` (group `system:nodes`), so the
//! real Node authorizer and RBAC decide what it may read: only Secrets,
//! ConfigMaps and service-account tokens of pods bound to its node
//! (plugin/pkg/auth/authorizer/node/node_authorizer.go, `Authorize`). It
//! registers its Node (Ready), polls the pods bound to it, writes their
//! secret, configMap, projected and downwardAPI volumes under its kubelet
//! root with the AtomicWriter double (the same payload rules as the
//! kubelet double, `crate::kubelet::projection`), copies subPath targets at
//! container start, reports each pod Running with container start times,
//! and confirms graceful deletions (grace 0 with a UID precondition, as the
//! kubelet's status manager does in pkg/kubelet/status/status_manager.go,
//! `syncPod`). Projected serviceAccountToken sources are real TokenRequest
//! tokens bound to the pod (pkg/kubelet/token/token_manager.go,
//! `GetServiceAccountToken`), requested once per pod.
//!
//! What it simplifies: Secrets and ConfigMaps are read at each sync (the
//! kubelet's Get strategy, no watch cache, so no immutable pin), no node
//! Lease (node lifecycle is disabled in the rig), no preStop hooks.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mountguard_inventory::layout;
use mountguard_inventory::writer::{AtomicWriterDouble, Payload, PayloadFile};
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{client_from_kubeconfig, raw};
use crate::kubelet::projection;

/// Configuration of one node double.
#[derive(Debug, Clone)]
pub struct NodeDoubleConfig {
    /// Node name.
    pub name: String,
    /// Kubelet root directory.
    pub root: PathBuf,
    /// Kubeconfig with the node's client certificate.
    pub kubeconfig: PathBuf,
    /// How often it lists its pods and rewrites their volumes.
    pub sync_period: Duration,
}

impl NodeDoubleConfig {
    /// Defaults: sync every 500 ms.
    pub fn new(name: &str, root: PathBuf, kubeconfig: PathBuf) -> Self {
        Self {
            name: name.to_string(),
            root,
            kubeconfig,
            sync_period: Duration::from_millis(500),
        }
    }
}

#[derive(Debug, Default)]
struct PodState {
    started: bool,
    tokens: BTreeMap<String, String>,
    error: Option<String>,
}

type States = Arc<Mutex<BTreeMap<String, PodState>>>;

/// A running node double.
#[derive(Debug)]
pub struct NodeDouble {
    config: NodeDoubleConfig,
    pods: States,
    paused: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl NodeDouble {
    /// Registers the Node (Ready) and starts syncing its pods.
    pub async fn start(config: NodeDoubleConfig) -> io::Result<Self> {
        std::fs::create_dir_all(layout::pods_dir(&config.root))?;
        let client = client_from_kubeconfig(&config.kubeconfig).await?;
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": config.name, "labels": {
                "kubernetes.io/hostname": config.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": crate::kubelet::arch(),
            }},
        });
        let (code, body) = raw(&client, "POST", "/api/v1/nodes", Some(&node)).await?;
        if code != 201 && code != 409 {
            return Err(io::Error::other(format!(
                "node {} registering: {code} {body}",
                config.name
            )));
        }
        let now = crate::util::now_rfc3339();
        let status = json!({"status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "node double is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": config.name}],
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        }});
        let (code, body) = raw(
            &client,
            "PATCH",
            &format!("/api/v1/nodes/{}/status", config.name),
            Some(&status),
        )
        .await?;
        if code != 200 {
            return Err(io::Error::other(format!(
                "node {} status: {code} {body}",
                config.name
            )));
        }
        let pods: States = Arc::default();
        let (stop, stop_rx) = watch::channel(false);
        let paused = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run(
            client,
            config.clone(),
            pods.clone(),
            paused.clone(),
            stop_rx,
        ));
        Ok(Self {
            config,
            pods,
            paused,
            stop,
            task: Some(task),
        })
    }

    /// Node name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// Kubelet root.
    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// Whether the pod with `uid` was started here.
    pub fn started(&self, uid: &str) -> bool {
        self.pods
            .lock()
            .map(|p| p.get(uid).is_some_and(|s| s.started))
            .unwrap_or(false)
    }

    /// The last error syncing the pod with `uid`.
    pub fn pod_error(&self, uid: &str) -> Option<String> {
        self.pods
            .lock()
            .ok()
            .and_then(|p| p.get(uid).and_then(|s| s.error.clone()))
    }

    /// While paused the node writes no volume and confirms no deletion
    /// (a kubelet whose syncs stall); it still reads its pods.
    pub fn pause(&self, on: bool) {
        self.paused.store(on, Ordering::SeqCst);
    }

    /// Stops syncing.
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for NodeDouble {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

async fn run(
    client: kube::Client,
    config: NodeDoubleConfig,
    pods: States,
    paused: Arc<AtomicBool>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(config.sync_period);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        if paused.load(Ordering::SeqCst) {
            continue;
        }
        let path = format!("/api/v1/pods?fieldSelector=spec.nodeName%3D{}", config.name);
        let Ok((200, list)) = raw(&client, "GET", &path, None).await else {
            continue;
        };
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let live: Vec<String> = items
            .iter()
            .filter_map(|p| p["metadata"]["uid"].as_str().map(String::from))
            .collect();
        let gone: Vec<String> = pods
            .lock()
            .map(|p| p.keys().filter(|u| !live.contains(u)).cloned().collect())
            .unwrap_or_default();
        for uid in gone {
            let _ = std::fs::remove_dir_all(layout::pod_dir(&config.root, &uid));
            if let Ok(mut p) = pods.lock() {
                p.remove(&uid);
            }
        }
        for pod in items {
            sync_pod(&client, &config, &pods, &pod).await;
        }
    }
}

async fn sync_pod(client: &kube::Client, config: &NodeDoubleConfig, pods: &States, pod: &Value) {
    let Some(uid) = pod["metadata"]["uid"].as_str().map(String::from) else {
        return;
    };
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        // Containers stopped: remove the volumes, then confirm the deletion.
        let _ = std::fs::remove_dir_all(layout::pod_dir(&config.root, &uid));
        let body = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}});
        let _ = raw(
            client,
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            Some(&body),
        )
        .await;
        if let Ok(mut p) = pods.lock() {
            p.remove(&uid);
        }
        return;
    }
    let (started, mut tokens) = pods
        .lock()
        .map(|mut p| {
            let s = p.entry(uid.clone()).or_default();
            (s.started, s.tokens.clone())
        })
        .unwrap_or_default();
    let mut error = None;
    for vol in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let vname = vol["name"].as_str().unwrap_or("");
        let Some(plugin) = projection::plugin_dir(vol) else {
            continue;
        };
        match volume_payload(client, pod, vol, &mut tokens).await {
            Ok(Some(payload)) => {
                let dir = layout::pod_dir(&config.root, &uid)
                    .join(layout::VOLUMES_DIR)
                    .join(plugin)
                    .join(vname);
                if let Err(e) = AtomicWriterDouble::new(dir).write(&payload) {
                    error = Some(format!("volume {vname}: {e}"));
                }
            }
            Ok(None) => {}
            Err(e) => {
                error = Some(format!(
                    "MountVolume.SetUp failed for volume {vname:?}: {e}"
                ))
            }
        }
    }
    let mut now_started = started;
    if error.is_none() && !started {
        for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
            if let Err(e) = crate::kubelet::write_subpaths(&config.root, &uid, pod, c) {
                error = Some(format!("subPath: {e}"));
            }
        }
        if error.is_none() {
            now_started = report_running(client, pod).await.is_ok();
        }
    }
    if let Ok(mut p) = pods.lock() {
        let s = p.entry(uid).or_default();
        s.started = now_started;
        s.tokens = tokens;
        s.error = error;
    }
}

async fn report_running(client: &kube::Client, pod: &Value) -> io::Result<()> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let now = crate::util::now_rfc3339();
    let statuses: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            json!({
                "name": c["name"], "image": c["image"], "imageID": "",
                "containerID": format!("double://{}", crate::util::new_uid()),
                "ready": true, "started": true, "restartCount": 0,
                "state": {"running": {"startedAt": now}},
            })
        })
        .collect();
    let body = json!({"status": {
        "phase": "Running",
        "hostIP": "127.0.0.1",
        "startTime": now,
        "conditions": [
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
        ],
        "containerStatuses": statuses,
    }});
    let (code, resp) = raw(
        client,
        "PATCH",
        &format!("/api/v1/namespaces/{ns}/pods/{name}/status"),
        Some(&body),
    )
    .await?;
    if code == 200 {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "pod status {ns}/{name}: {code} {resp}"
        )))
    }
}

/// Key -> bytes of a Secret or ConfigMap the node may read; `Ok(None)` when
/// the API server says it does not exist.
async fn source_data(
    client: &kube::Client,
    ns: &str,
    kind: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let (code, obj) = raw(
        client,
        "GET",
        &format!("/api/v1/namespaces/{ns}/{kind}/{name}"),
        None,
    )
    .await
    .map_err(|e| e.to_string())?;
    match code {
        200 if kind == "secrets" => Ok(Some(projection::secret_data(&obj))),
        200 => Ok(Some(projection::configmap_data(&obj))),
        404 => Ok(None),
        _ => Err(format!("get {kind} {ns}/{name}: {code} {obj}")),
    }
}

async fn volume_payload(
    client: &kube::Client,
    pod: &Value,
    vol: &Value,
    tokens: &mut BTreeMap<String, String>,
) -> Result<Option<Payload>, String> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let fs_group = pod["spec"]["securityContext"]["fsGroup"].is_number();
    let payload = if let Some(s) = vol.get("secret") {
        let name = s["secretName"].as_str().unwrap_or("");
        let mode = projection::mode_of(&s["defaultMode"]).unwrap_or(0o644);
        let data = source_data(client, ns, "secrets", name).await?;
        projection::keyed_source(data, &format!("secret \"{name}\""), s, mode)?
    } else if let Some(c) = vol.get("configMap") {
        let name = c["name"].as_str().unwrap_or("");
        let mode = projection::mode_of(&c["defaultMode"]).unwrap_or(0o644);
        let data = source_data(client, ns, "configmaps", name).await?;
        projection::keyed_source(data, &format!("configmap \"{name}\""), c, mode)?
    } else if let Some(d) = vol.get("downwardAPI") {
        let mode = projection::mode_of(&d["defaultMode"]).unwrap_or(0o644);
        projection::downward_items(pod, &d["items"], mode)
    } else if let Some(p) = vol.get("projected") {
        let mode = projection::mode_of(&p["defaultMode"]).unwrap_or(0o644);
        let mut out = Payload::new();
        for src in p["sources"].as_array().into_iter().flatten() {
            let part = if let Some(s) = src.get("secret") {
                let name = s["name"].as_str().unwrap_or("");
                let data = source_data(client, ns, "secrets", name).await?;
                projection::keyed_source(data, &format!("secret \"{name}\""), s, mode)?
            } else if let Some(c) = src.get("configMap") {
                let name = c["name"].as_str().unwrap_or("");
                let data = source_data(client, ns, "configmaps", name).await?;
                projection::keyed_source(data, &format!("configmap \"{name}\""), c, mode)?
            } else if let Some(d) = src.get("downwardAPI") {
                projection::downward_items(pod, &d["items"], mode)
            } else if let Some(t) = src.get("serviceAccountToken") {
                let path = t["path"].as_str().unwrap_or("token").to_string();
                let token = match tokens.get(&path) {
                    Some(t) => t.clone(),
                    None => {
                        let t = pod_token(client, pod, t).await?;
                        tokens.insert(path.clone(), t.clone());
                        t
                    }
                };
                Payload::from([(path, PayloadFile::with_mode(token, mode))])
            } else {
                Payload::new()
            };
            out.extend(part);
        }
        out
    } else {
        return Ok(None);
    };
    Ok(Some(if fs_group {
        payload
            .into_iter()
            .map(|(k, mut f)| {
                f.mode |= 0o440;
                (k, f)
            })
            .collect()
    } else {
        payload
    }))
}

/// A real TokenRequest token bound to `pod`, as the kubelet's token manager
/// asks for a projected serviceAccountToken source.
async fn pod_token(client: &kube::Client, pod: &Value, source: &Value) -> Result<String, String> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let audiences: Vec<&str> = source["audience"].as_str().into_iter().collect();
    let exp = source["expirationSeconds"].as_i64().unwrap_or(3600);
    super::token_request(
        client,
        ns,
        sa,
        &audiences,
        exp,
        Some((
            pod["metadata"]["name"].as_str().unwrap_or(""),
            pod["metadata"]["uid"].as_str().unwrap_or(""),
        )),
    )
    .await
    .map_err(|e| e.to_string())
}
