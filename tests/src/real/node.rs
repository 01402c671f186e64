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
//! Secrets and ConfigMaps come from the kubelet's watch-based manager,
//! reproduced in [`ObjectCache`] (pkg/kubelet/util/manager/
//! watch_based_manager.go): one item per namespace/name, referenced by the
//! registered pods that name it, created with a fresh read, kept current
//! while its "reflector" runs (here: a GET per sync instead of a watch), and
//! stopped for good once `Get` saw the object immutable. So an immutable
//! Secret deleted and recreated keeps being served with its old bytes on a
//! node where a registered pod still references it (the pin).
//!
//! On graceful deletion (the API server's, an eviction's or a plain
//! DELETE's `deletionTimestamp`) it runs each started container's `preStop`
//! exec hook when the grace period is above zero, through the
//! [`ExecHook`] the rig gives it (pkg/kubelet/kuberuntime/
//! kuberuntime_container.go, `killContainer` calling `executePreStopHook`),
//! then removes the pod's volumes, confirms the deletion and unregisters
//! the pod from its managers.
//!
//! What it simplifies: the reflector polls (each sync) instead of
//! watching; idle items are not recycled (`startRecycleIdleWatch` only
//! stops reflectors of objects no volume reads, i.e. env-only references);
//! containers never restart; no node Lease (node lifecycle is disabled in
//! the rig); hooks run one after the other, not in parallel.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, BTreeSet};
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
    /// Runs containers' `preStop` exec hooks (the container runtime's
    /// exec); `None`: hooks do nothing.
    pub exec: Option<ExecHook>,
}

/// A container's `preStop` exec hook being run.
#[derive(Debug)]
pub struct PreStop<'a> {
    /// The terminating pod.
    pub pod: &'a Value,
    /// The container's name.
    pub container: &'a str,
    /// `lifecycle.preStop.exec.command`.
    pub command: Vec<String>,
    /// The pod's directory under the kubelet root (its volumes are still
    /// there while the hook runs).
    pub pod_dir: PathBuf,
}

/// What "runs" a `preStop` exec command in the container.
#[derive(Clone)]
pub struct ExecHook(pub Arc<dyn Fn(&PreStop<'_>) + Send + Sync>);

impl std::fmt::Debug for ExecHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExecHook")
    }
}

impl NodeDoubleConfig {
    /// Defaults: sync every 500 ms.
    pub fn new(name: &str, root: PathBuf, kubeconfig: PathBuf) -> Self {
        Self {
            name: name.to_string(),
            root,
            kubeconfig,
            sync_period: Duration::from_millis(500),
            exec: None,
        }
    }
}

#[derive(Debug, Default)]
struct PodState {
    /// The status this node reported once the pod's containers started
    /// (`Some`: started here; re-sent when the API's differs, see
    /// [`sync_pod`]).
    reported: Option<Value>,
    /// The preStop hooks ran (once per pod, even when the confirmation
    /// is retried).
    stopped: bool,
    tokens: BTreeMap<String, String>,
    error: Option<String>,
}

type States = Arc<Mutex<BTreeMap<String, PodState>>>;

/// Secret or ConfigMap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// core/v1 secrets.
    Secret,
    /// core/v1 configmaps.
    ConfigMap,
}

impl Kind {
    fn resource(self) -> &'static str {
        match self {
            Kind::Secret => "secrets",
            Kind::ConfigMap => "configmaps",
        }
    }
}

/// (kind, namespace, name)
pub type CacheKey = (Kind, String, String);

/// One item of the watch-based manager (`objectCacheItem`).
#[derive(Debug, Clone, Default)]
pub struct CacheItem {
    /// Registered pod UIDs referencing it (`refCount`).
    pub refs: BTreeSet<String>,
    /// The reflector's store: the object, `None` when not found.
    pub object: Option<Value>,
    /// The reflector listed at least once (`hasSynced`).
    pub synced: bool,
    /// `Get` saw the object immutable: the reflector is stopped for good
    /// (`setImmutable` + `stop`; `restartReflectorIfNeeded` never restarts it).
    pub immutable: bool,
}

/// The kubelet's watch-based Secret and ConfigMap managers
/// (pkg/kubelet/util/manager/watch_based_manager.go `objectCache`, with
/// cache_based_manager.go `RegisterPod` / `UnregisterPod` on top).
#[derive(Debug, Default)]
pub struct ObjectCache {
    items: BTreeMap<CacheKey, CacheItem>,
    registered: BTreeMap<String, BTreeSet<CacheKey>>,
}

impl ObjectCache {
    /// `RegisterPod`: references for the pod's current names are added
    /// first (`AddReference` creates an item, unsynced, whose reflector
    /// lists at the next refresh), then the previous registration's are
    /// released, so an item both name is never dropped in between.
    fn register_pod(&mut self, uid: &str, names: BTreeSet<CacheKey>) {
        for k in &names {
            self.items
                .entry(k.clone())
                .or_default()
                .refs
                .insert(uid.to_string());
        }
        if let Some(prev) = self.registered.insert(uid.to_string(), names.clone()) {
            for k in prev.difference(&names) {
                self.delete_reference(k, uid);
            }
        }
    }

    /// `UnregisterPod`.
    fn unregister_pod(&mut self, uid: &str) {
        if let Some(prev) = self.registered.remove(uid) {
            for k in &prev {
                self.delete_reference(k, uid);
            }
        }
    }

    /// `DeleteReference`: the item (and its reflector) goes with its last
    /// reference.
    fn delete_reference(&mut self, k: &CacheKey, uid: &str) {
        if let Some(item) = self.items.get_mut(k) {
            item.refs.remove(uid);
            if item.refs.is_empty() {
                self.items.remove(k);
            }
        }
    }

    /// Keys whose reflector runs (not stopped as immutable).
    fn running(&self) -> Vec<CacheKey> {
        self.items
            .iter()
            .filter(|(_, i)| !i.immutable)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// What the reflector of `k` read: `Some(obj)`, `None` for not found.
    /// A read that failed (`Err`) leaves the store as it was.
    fn observe(&mut self, k: &CacheKey, read: Result<Option<Value>, String>) {
        if let (Some(item), Ok(obj)) = (self.items.get_mut(k), read)
            && !item.immutable
        {
            item.object = obj;
            item.synced = true;
        }
    }

    /// `objectCache.Get`: not registered and not synced are errors; an
    /// immutable object stops its reflector.
    fn get(&mut self, k: &CacheKey) -> Result<Option<Value>, String> {
        let item = self
            .items
            .get_mut(k)
            .ok_or_else(|| format!("object {:?}/{:?} not registered", k.1, k.2))?;
        if !item.synced {
            return Err(format!("failed to sync {} cache", k.0.resource()));
        }
        if let Some(obj) = &item.object
            && obj["immutable"].as_bool() == Some(true)
        {
            item.immutable = true;
        }
        Ok(item.object.clone())
    }

    /// The item of `k`, for tests.
    pub fn item(&self, k: &CacheKey) -> Option<CacheItem> {
        self.items.get(k).cloned()
    }
}

type Cache = Arc<Mutex<ObjectCache>>;

/// A running node double.
#[derive(Debug)]
pub struct NodeDouble {
    config: NodeDoubleConfig,
    pods: States,
    cache: Cache,
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
        let cache: Cache = Arc::default();
        let (stop, stop_rx) = watch::channel(false);
        let paused = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(run(
            client,
            config.clone(),
            pods.clone(),
            cache.clone(),
            paused.clone(),
            stop_rx,
        ));
        Ok(Self {
            config,
            pods,
            cache,
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
            .map(|p| p.get(uid).is_some_and(|s| s.reported.is_some()))
            .unwrap_or(false)
    }

    /// The last error syncing the pod with `uid`.
    pub fn pod_error(&self, uid: &str) -> Option<String> {
        self.pods
            .lock()
            .ok()
            .and_then(|p| p.get(uid).and_then(|s| s.error.clone()))
    }

    /// The watch-based manager's item for a Secret or ConfigMap (`None`
    /// when no registered pod references it).
    pub fn cache_item(&self, kind: Kind, ns: &str, name: &str) -> Option<CacheItem> {
        self.cache
            .lock()
            .ok()?
            .item(&(kind, ns.to_string(), name.to_string()))
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
    cache: Cache,
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
            // Gone without a graceful deletion seen here (a force delete):
            // no hook, the containers are killed.
            let _ = std::fs::remove_dir_all(layout::pod_dir(&config.root, &uid));
            if let Ok(mut p) = pods.lock() {
                p.remove(&uid);
            }
            if let Ok(mut c) = cache.lock() {
                c.unregister_pod(&uid);
            }
        }
        // Terminations first, so a pod's replacement (created once it is
        // gone) never shares an item the old pod alone held.
        let (terminating, running): (Vec<Value>, Vec<Value>) = items
            .into_iter()
            .partition(|p| !p["metadata"]["deletionTimestamp"].is_null());
        for pod in &terminating {
            terminate_pod(&client, &config, &pods, &cache, pod).await;
        }
        for pod in &running {
            register(&cache, pod);
        }
        refresh(&client, &cache).await;
        for pod in &running {
            sync_pod(&client, &config, &pods, &cache, pod).await;
        }
    }
}

/// `RegisterPod` with every Secret and ConfigMap name the pod references
/// (the kubelet's pod manager calls it on each pod add or update).
fn register(cache: &Cache, pod: &Value) {
    let Some(uid) = pod["metadata"]["uid"].as_str() else {
        return;
    };
    let (secrets, cms) = projection::referenced_names(pod);
    let names: BTreeSet<CacheKey> = secrets
        .into_iter()
        .map(|(ns, n)| (Kind::Secret, ns, n))
        .chain(cms.into_iter().map(|(ns, n)| (Kind::ConfigMap, ns, n)))
        .collect();
    if let Ok(mut c) = cache.lock() {
        c.register_pod(uid, names);
    }
}

/// One pass of every running reflector: a GET of its object (the node
/// may read it: the Node authorizer allows a node the Secrets and
/// ConfigMaps its pods reference).
async fn refresh(client: &kube::Client, cache: &Cache) {
    let keys = cache.lock().map(|c| c.running()).unwrap_or_default();
    for k in keys {
        let read = match raw(
            client,
            "GET",
            &format!("/api/v1/namespaces/{}/{}/{}", k.1, k.0.resource(), k.2),
            None,
        )
        .await
        {
            Ok((200, obj)) => Ok(Some(obj)),
            Ok((404, _)) => Ok(None),
            Ok((code, body)) => Err(format!("{code} {body}")),
            Err(e) => Err(e.to_string()),
        };
        if let Ok(mut c) = cache.lock() {
            c.observe(&k, read);
        }
    }
}

/// A pod with a `deletionTimestamp`: each started container's `preStop`
/// exec hook when the grace period is above zero (kuberuntime_container.go
/// `killContainer`: `gracePeriod` from `DeletionGracePeriodSeconds`, the
/// hook only `if ... Lifecycle.PreStop != nil && gracePeriod > 0`), then
/// the volumes go, the deletion is confirmed (grace 0, UID precondition:
/// status_manager.go `syncPod` once the pod `canBeDeleted`) and the pod
/// is unregistered from the managers.
async fn terminate_pod(
    client: &kube::Client,
    config: &NodeDoubleConfig,
    pods: &States,
    cache: &Cache,
    pod: &Value,
) {
    let Some(uid) = pod["metadata"]["uid"].as_str().map(String::from) else {
        return;
    };
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let (started, stopped) = pods
        .lock()
        .map(|p| {
            p.get(&uid)
                .map_or((false, false), |s| (s.reported.is_some(), s.stopped))
        })
        .unwrap_or((false, false));
    let grace = pod["metadata"]["deletionGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(0);
    if started && !stopped && grace > 0 {
        for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
            let command: Vec<String> = c["lifecycle"]["preStop"]["exec"]["command"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(String::from))
                .collect();
            if command.is_empty() {
                continue;
            }
            if let Some(hook) = &config.exec {
                (hook.0)(&PreStop {
                    pod,
                    container: c["name"].as_str().unwrap_or(""),
                    command,
                    pod_dir: layout::pod_dir(&config.root, &uid),
                });
            }
        }
    }
    if let Ok(mut p) = pods.lock()
        && let Some(s) = p.get_mut(&uid)
    {
        s.stopped = true;
    }
    // Containers stopped: remove the volumes, then confirm the deletion.
    let _ = std::fs::remove_dir_all(layout::pod_dir(&config.root, &uid));
    let body = json!({"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "preconditions": {"uid": uid}});
    let confirmed = raw(
        client,
        "DELETE",
        &format!("/api/v1/namespaces/{ns}/pods/{name}"),
        Some(&body),
    )
    .await
    .is_ok_and(|(code, _)| code == 200 || code == 404 || code == 409);
    if confirmed {
        if let Ok(mut p) = pods.lock() {
            p.remove(&uid);
        }
        if let Ok(mut c) = cache.lock() {
            c.unregister_pod(&uid);
        }
    }
}

async fn sync_pod(
    client: &kube::Client,
    config: &NodeDoubleConfig,
    pods: &States,
    cache: &Cache,
    pod: &Value,
) {
    let Some(uid) = pod["metadata"]["uid"].as_str().map(String::from) else {
        return;
    };
    let (mut reported, mut tokens) = pods
        .lock()
        .map(|mut p| {
            let s = p.entry(uid.clone()).or_default();
            (s.reported.clone(), s.tokens.clone())
        })
        .unwrap_or_default();
    let mut error = None;
    for vol in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let vname = vol["name"].as_str().unwrap_or("");
        let Some(plugin) = projection::plugin_dir(vol) else {
            continue;
        };
        match volume_payload(client, cache, pod, vol, &mut tokens).await {
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
    if error.is_none() && reported.is_none() {
        for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
            if let Err(e) = crate::kubelet::write_subpaths(&config.root, &uid, pod, c) {
                error = Some(format!("subPath: {e}"));
            }
        }
        if error.is_none() {
            let body = running_status(pod);
            if patch_status(client, pod, &body).await.is_ok() {
                reported = Some(body);
            }
        }
    } else if let Some(body) = reported.as_ref().filter(|b| !conditions_hold(pod, b)) {
        // The kubelet's status manager compares the API's pod status with
        // the one it holds on every sync and sends its own again when they
        // differ (another writer replaced its conditions):
        // pkg/kubelet/status/status_manager.go, `syncBatch` ->
        // `needsReconcile` -> `syncPod`.
        let _ = patch_status(client, pod, body).await;
    }
    if let Ok(mut p) = pods.lock() {
        let s = p.entry(uid).or_default();
        s.reported = reported;
        s.tokens = tokens;
        s.error = error;
    }
}

/// The status of a pod whose containers run (what the kubelet reports
/// once they started).
fn running_status(pod: &Value) -> Value {
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
    json!({"status": {
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
    }})
}

/// Whether every condition of `reported` is on `pod` with its status.
fn conditions_hold(pod: &Value, reported: &Value) -> bool {
    let have = pod["status"]["conditions"].as_array();
    reported["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|want| {
            have.into_iter()
                .flatten()
                .any(|c| c["type"] == want["type"] && c["status"] == want["status"])
        })
}

/// Sends `body` as the pod's status, as a strategic merge patch (the
/// conditions merge by `type` with the ones other writers set), as the
/// kubelet does: pkg/util/pod/pod.go, `PatchPodStatus`
/// (`types.StrategicMergePatchType`).
async fn patch_status(client: &kube::Client, pod: &Value, body: &Value) -> io::Result<()> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let (code, resp) = super::raw_with(
        client,
        "PATCH",
        &format!("/api/v1/namespaces/{ns}/pods/{name}/status"),
        serde_json::to_vec(body).unwrap_or_default(),
        "application/strategic-merge-patch+json",
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

/// Key -> bytes of a Secret or ConfigMap from the watch-based manager;
/// `Ok(None)` when its reflector found no such object.
fn source_data(
    cache: &Cache,
    ns: &str,
    kind: Kind,
    name: &str,
) -> Result<Option<BTreeMap<String, Vec<u8>>>, String> {
    let obj = cache
        .lock()
        .map_err(|_| "cache lock poisoned".to_string())?
        .get(&(kind, ns.to_string(), name.to_string()))?;
    Ok(obj.map(|obj| match kind {
        Kind::Secret => projection::secret_data(&obj),
        Kind::ConfigMap => projection::configmap_data(&obj),
    }))
}

async fn volume_payload(
    client: &kube::Client,
    cache: &Cache,
    pod: &Value,
    vol: &Value,
    tokens: &mut BTreeMap<String, String>,
) -> Result<Option<Payload>, String> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let fs_group = pod["spec"]["securityContext"]["fsGroup"].is_number();
    let payload = if let Some(s) = vol.get("secret") {
        let name = s["secretName"].as_str().unwrap_or("");
        let mode = projection::mode_of(&s["defaultMode"]).unwrap_or(0o644);
        let data = source_data(cache, ns, Kind::Secret, name)?;
        projection::keyed_source(data, &format!("secret \"{name}\""), s, mode)?
    } else if let Some(c) = vol.get("configMap") {
        let name = c["name"].as_str().unwrap_or("");
        let mode = projection::mode_of(&c["defaultMode"]).unwrap_or(0o644);
        let data = source_data(cache, ns, Kind::ConfigMap, name)?;
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
                let data = source_data(cache, ns, Kind::Secret, name)?;
                projection::keyed_source(data, &format!("secret \"{name}\""), s, mode)?
            } else if let Some(c) = src.get("configMap") {
                let name = c["name"].as_str().unwrap_or("");
                let data = source_data(cache, ns, Kind::ConfigMap, name)?;
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
