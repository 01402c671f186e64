//! A simulated kubelet, one per simulated node.
//!
//! It watches the pods bound to its node through the API server double,
//! registers them with its Secret/ConfigMap managers ([`manager`]), writes
//! their secret, configMap, projected and downwardAPI volumes under its own
//! kubelet root with the kubelet-faithful AtomicWriter double, copies subPath
//! targets and freezes env values at container start, reports the pod
//! Running/Ready, resyncs volumes periodically (period + jitter), and on
//! deletion terminates, removes the pod's directories, unregisters and
//! confirms the deletion to the API (grace 0, UID precondition), like the
//! real kubelet's final delete.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

pub mod manager;
pub mod projection;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mountguard_inventory::layout;
use mountguard_inventory::writer::AtomicWriterDouble;
use serde_json::{Value, json};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::apiserver::resources;
use crate::apiserver::{ApiHandle, DeleteOptions, EventType, StoredEvent, TokenUser};
use manager::Manager;
pub use manager::{CacheItem, Strategy};
use projection::Sources;

/// Configuration of one simulated kubelet.
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// Node name.
    pub node: String,
    /// Kubelet root directory (`/var/lib/kubelet` on a real node).
    pub root: PathBuf,
    /// Secret/ConfigMap change-detection strategy.
    pub strategy: Strategy,
    /// Pod resync period (`syncFrequency`, real default 1 min).
    pub resync_period: Duration,
    /// Jitter factor (real: 0.5, i.e. 60-90 s).
    pub jitter: f64,
}

impl KubeletConfig {
    /// Defaults for tests: Watch strategy, 1 s resync, jitter 0.5.
    pub fn new(node: impl Into<String>, root: impl Into<PathBuf>) -> Self {
        Self {
            node: node.into(),
            root: root.into(),
            strategy: Strategy::Watch,
            resync_period: Duration::from_secs(1),
            jitter: 0.5,
        }
    }
}

/// A container's view frozen at its start.
#[derive(Debug, Clone, PartialEq)]
pub struct StartedContainer {
    /// `startedAt`.
    pub started_at: String,
    /// Environment values resolved at start.
    pub env: BTreeMap<String, String>,
}

#[derive(Debug)]
struct PodRuntime {
    pod: Value,
    /// `status.startTime`: stamped by the status manager in the first
    /// SyncPod, right before the pod's references are registered
    /// (`pkg/kubelet/kubelet.go` `SyncPod`).
    synced_at: String,
    started: BTreeMap<String, StartedContainer>,
    /// Init containers started (and, unless sidecars, finished at once).
    init_started: BTreeMap<String, StartedContainer>,
    next_sync: Instant,
    error: Option<String>,
    /// The volumes' directories exist but are still empty (see
    /// [`KubeletHandle::set_volume_setup`]).
    mounted_empty: bool,
}

#[derive(Debug)]
struct State {
    pods: BTreeMap<String, PodRuntime>,
    secrets: Manager,
    configmaps: Manager,
    resync_period: Duration,
    jitter: f64,
    syncs: u64,
    /// How long a new pod's volumes stay mounted and empty before they are
    /// written (zero: written in the first sync).
    volume_setup: Duration,
}

#[derive(Debug)]
struct Inner {
    config: KubeletConfig,
    api: ApiHandle,
    state: Mutex<State>,
    partitioned: watch::Sender<bool>,
    kick: Notify,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A handle on a running simulated kubelet (cloneable).
#[derive(Debug, Clone)]
pub struct KubeletHandle {
    inner: Arc<Inner>,
}

/// A running simulated kubelet.
#[derive(Debug)]
pub struct KubeletDouble {
    handle: KubeletHandle,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl KubeletDouble {
    /// Registers the Node object and starts syncing.
    pub async fn start(api: ApiHandle, config: KubeletConfig) -> std::io::Result<Self> {
        std::fs::create_dir_all(layout::pods_dir(&config.root))?;
        let node = json!({
            "metadata": {"name": config.node, "labels": {
                "kubernetes.io/hostname": config.node,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": arch(),
            }},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet double is posting ready status"}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": config.node}],
                "nodeInfo": {"architecture": arch(), "operatingSystem": "linux", "kubeletVersion": "v1.37.0-mountguard-double",
                              "containerRuntimeVersion": "double://1", "kernelVersion": "", "osImage": "", "kubeProxyVersion": "",
                              "machineID": "", "systemUUID": "", "bootID": ""},
            },
        });
        match api.create(&resources::NODES, "", node) {
            Ok(_) => {}
            Err(e) if e.reason == "AlreadyExists" => {}
            Err(e) => return Err(std::io::Error::other(e.to_string())),
        }
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                pods: BTreeMap::new(),
                secrets: Manager::new(config.strategy, resources::SECRETS),
                configmaps: Manager::new(config.strategy, resources::CONFIGMAPS),
                resync_period: config.resync_period,
                jitter: config.jitter,
                syncs: 0,
                volume_setup: Duration::ZERO,
            }),
            config,
            api,
            partitioned: watch::channel(false).0,
            kick: Notify::new(),
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(run(inner.clone(), stop_rx));
        Ok(Self {
            handle: KubeletHandle { inner },
            stop,
            task: Some(task),
        })
    }

    /// The handle.
    pub fn handle(&self) -> KubeletHandle {
        self.handle.clone()
    }

    /// Stops the kubelet task (volumes stay on disk, as after a kubelet stop).
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for KubeletDouble {
    fn drop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

pub(crate) fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

impl KubeletHandle {
    /// Node name.
    pub fn node(&self) -> &str {
        &self.inner.config.node
    }

    /// Kubelet root.
    pub fn root(&self) -> &Path {
        &self.inner.config.root
    }

    /// UIDs of the pods this kubelet runs (registered).
    pub fn pod_uids(&self) -> Vec<String> {
        lock(&self.inner.state).pods.keys().cloned().collect()
    }

    /// Init containers run for a pod, with their frozen env.
    pub fn started_init(&self, uid: &str) -> BTreeMap<String, StartedContainer> {
        lock(&self.inner.state)
            .pods
            .get(uid)
            .map(|p| p.init_started.clone())
            .unwrap_or_default()
    }

    /// Containers started for a pod, with their frozen env.
    pub fn started(&self, uid: &str) -> BTreeMap<String, StartedContainer> {
        lock(&self.inner.state)
            .pods
            .get(uid)
            .map(|p| p.started.clone())
            .unwrap_or_default()
    }

    /// The last sync error of a pod (a missing Secret, ...).
    pub fn pod_error(&self, uid: &str) -> Option<String> {
        lock(&self.inner.state)
            .pods
            .get(uid)
            .and_then(|p| p.error.clone())
    }

    /// The Secret manager's cache item (Watch strategy).
    pub fn secret_cache(&self, ns: &str, name: &str) -> Option<CacheItem> {
        lock(&self.inner.state).secrets.item(ns, name)
    }

    /// The ConfigMap manager's cache item (Watch strategy).
    pub fn configmap_cache(&self, ns: &str, name: &str) -> Option<CacheItem> {
        lock(&self.inner.state).configmaps.item(ns, name)
    }

    /// Fault: stop (true) or resume (false) syncing, as if partitioned from
    /// the API server. Resuming catches up with the watch (or re-lists).
    ///
    /// The Node's `Ready` condition turns `Unknown` at once (the real node
    /// lifecycle controller does it after its grace period, 40 s by
    /// default) and `True` again when the partition heals.
    pub fn partition(&self, on: bool) {
        self.inner.partitioned.send_replace(on);
        let cond = if on {
            json!({"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status."})
        } else {
            json!({"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet double is posting ready status"})
        };
        let _ = self.inner.api.merge_patch(
            &resources::NODES,
            "",
            &self.inner.config.node,
            &json!({"status": {"conditions": [cond]}}),
            Some("status"),
        );
        self.inner.kick.notify_one();
    }

    /// Restarts the kubelet process: the Secret/ConfigMap caches start
    /// empty (every running pod is registered again with fresh reads, which
    /// releases an immutable pin), running containers keep running, and
    /// every pod is resynced now. Upstream's workaround for the pin.
    pub fn restart(&self) {
        let mut guard = lock(&self.inner.state);
        let s = &mut *guard;
        let api = self.inner.api.clone();
        s.secrets = Manager::new(self.inner.config.strategy, resources::SECRETS);
        s.configmaps = Manager::new(self.inner.config.strategy, resources::CONFIGMAPS);
        let now = Instant::now();
        for (uid, p) in s.pods.iter_mut() {
            let (secrets, cms) = projection::referenced_names(&p.pod);
            s.secrets.register_pod(&api, uid, secrets);
            s.configmaps.register_pod(&api, uid, cms);
            p.next_sync = now;
        }
        drop(guard);
        self.inner.kick.notify_one();
    }

    /// Changes the resync period and jitter (a slow resync is a fault too).
    pub fn set_resync(&self, period: Duration, jitter: f64) {
        let mut s = lock(&self.inner.state);
        s.resync_period = period;
        s.jitter = jitter;
        let now = Instant::now();
        for p in s.pods.values_mut() {
            p.next_sync = now + jittered(period, jitter);
        }
        drop(s);
        self.inner.kick.notify_one();
    }

    /// Makes the first sync of each new pod mount its volumes empty and
    /// write them `d` later, the containers starting only then: the real
    /// kubelet mounts a Secret, ConfigMap or projected volume (a tmpfs or
    /// an empty directory) before its AtomicWriter writes the files
    /// (pkg/volume/secret/secret.go `SetUpAt`), and starts the containers
    /// once every volume is set up (pkg/kubelet/kubelet.go `SyncPod`,
    /// `WaitForAttachAndMount`). An agent scan in between sees empty
    /// volumes of a pod that exists and is not running yet.
    pub fn set_volume_setup(&self, d: Duration) {
        lock(&self.inner.state).volume_setup = d;
    }

    /// Resyncs every pod now.
    pub fn resync_now(&self) {
        let mut s = lock(&self.inner.state);
        let now = Instant::now();
        for p in s.pods.values_mut() {
            p.next_sync = now;
        }
        drop(s);
        self.inner.kick.notify_one();
    }

    /// How many pod syncs ran (for tests waiting on a resync).
    pub fn sync_count(&self) -> u64 {
        lock(&self.inner.state).syncs
    }

    /// A pod's volume directory.
    pub fn volume_dir(&self, uid: &str, plugin_dir: &str, volume: &str) -> PathBuf {
        layout::pod_dir(self.root(), uid)
            .join(layout::VOLUMES_DIR)
            .join(plugin_dir)
            .join(volume)
    }
}

fn jittered(period: Duration, jitter: f64) -> Duration {
    if jitter > 0.0 {
        period.mul_f64(1.0 + jitter * crate::util::random_unit())
    } else {
        period
    }
}

async fn run(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let mut partitioned = inner.partitioned.subscribe();
    let mut sub = inner.api.subscribe(inner.api.resource_version());
    initial_list(&inner);
    loop {
        if *partitioned.borrow() {
            tokio::select! {
                _ = stop.changed() => return,
                _ = partitioned.changed() => continue,
            }
        }
        let next_due = lock(&inner.state)
            .pods
            .values()
            .map(|p| p.next_sync)
            .min()
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            _ = stop.changed() => return,
            _ = partitioned.changed() => {}
            _ = inner.kick.notified() => resync_due(&inner),
            _ = tokio::time::sleep_until(next_due) => resync_due(&inner),
            evs = sub.next() => match evs {
                Ok(evs) => {
                    for ev in &evs {
                        handle_event(&inner, ev);
                    }
                }
                Err(e) if e.code == 410 => {
                    // The watch fell behind: re-list, like a reflector.
                    sub = inner.api.subscribe(inner.api.resource_version());
                    {
                        let mut s = lock(&inner.state);
                        let api = inner.api.clone();
                        s.secrets.relist(&api);
                        s.configmaps.relist(&api);
                    }
                    initial_list(&inner);
                }
                Err(_) => return,
            },
        }
    }
}

fn my_pods(inner: &Inner) -> Vec<Value> {
    let filter = crate::apiserver::Filter {
        fields: crate::apiserver::selectors::FieldSelector::parse(
            "pods",
            &format!("spec.nodeName={}", inner.config.node),
        )
        .unwrap_or_default(),
        ..crate::apiserver::Filter::all(resources::PODS)
    };
    inner.api.list(&filter).0
}

fn initial_list(inner: &Inner) {
    let pods = my_pods(inner);
    let present: Vec<String> = pods
        .iter()
        .filter_map(|p| p["metadata"]["uid"].as_str().map(String::from))
        .collect();
    let gone: Vec<String> = lock(&inner.state)
        .pods
        .keys()
        .filter(|u| !present.contains(u))
        .cloned()
        .collect();
    for uid in gone {
        cleanup(inner, &uid, false);
    }
    for p in pods {
        pod_changed(inner, p);
    }
}

fn handle_event(inner: &Inner, ev: &StoredEvent) {
    if ev.rt == resources::PODS {
        if ev.object["spec"]["nodeName"].as_str() != Some(inner.config.node.as_str()) {
            return;
        }
        match ev.kind {
            EventType::Deleted => {
                if let Some(uid) = ev.object["metadata"]["uid"].as_str() {
                    cleanup(inner, uid, false);
                }
            }
            _ => pod_changed(inner, ev.object.clone()),
        }
    } else if ev.rt == resources::SECRETS || ev.rt == resources::CONFIGMAPS {
        let mut s = lock(&inner.state);
        s.secrets.observe(ev);
        s.configmaps.observe(ev);
    }
}

fn pod_changed(inner: &Inner, pod: Value) {
    let Some(uid) = pod["metadata"]["uid"].as_str().map(String::from) else {
        return;
    };
    let terminating = !pod["metadata"]["deletionTimestamp"].is_null();
    let known = lock(&inner.state).pods.contains_key(&uid);
    if terminating {
        if known {
            cleanup(inner, &uid, true);
        } else {
            // Never started here: nothing to unmount; confirm at once.
            let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
            let name = pod["metadata"]["name"].as_str().unwrap_or("");
            let _ = inner
                .api
                .delete(&resources::PODS, ns, name, &DeleteOptions::confirm(&uid));
        }
        return;
    }
    if !known {
        let (secrets, cms) = projection::referenced_names(&pod);
        let mut s = lock(&inner.state);
        let api = inner.api.clone();
        s.secrets.register_pod(&api, &uid, secrets);
        s.configmaps.register_pod(&api, &uid, cms);
        s.pods.insert(
            uid.clone(),
            PodRuntime {
                pod,
                synced_at: crate::util::now_rfc3339(),
                started: BTreeMap::new(),
                init_started: BTreeMap::new(),
                next_sync: Instant::now(),
                error: None,
                mounted_empty: false,
            },
        );
        drop(s);
        sync_pod(inner, &uid);
    } else if let Some(p) = lock(&inner.state).pods.get_mut(&uid) {
        p.pod = pod;
    }
}

fn resync_due(inner: &Inner) {
    let now = Instant::now();
    let due: Vec<String> = lock(&inner.state)
        .pods
        .iter()
        .filter(|(_, p)| p.next_sync <= now)
        .map(|(u, _)| u.clone())
        .collect();
    for uid in due {
        sync_pod(inner, &uid);
    }
}

/// SyncPod: (re)writes the volumes; starts the containers the first time.
fn sync_pod(inner: &Inner, uid: &str) {
    let api = inner.api.clone();
    let root = inner.config.root.clone();
    let mut guard = lock(&inner.state);
    let s = &mut *guard;
    let period = (s.resync_period, s.jitter);
    s.syncs += 1;
    let Some(rt) = s.pods.get_mut(uid) else {
        return;
    };
    rt.next_sync = Instant::now() + jittered(period.0, period.1);
    let pod = rt.pod.clone();
    let first_start = rt.started.is_empty();
    if first_start && !rt.mounted_empty && !s.volume_setup.is_zero() {
        // Mounted, not written yet (see `set_volume_setup`).
        rt.mounted_empty = true;
        rt.next_sync = Instant::now() + s.volume_setup;
        for vol in pod["spec"]["volumes"].as_array().into_iter().flatten() {
            if let (Some(plugin), Some(name)) = (projection::plugin_dir(vol), vol["name"].as_str())
            {
                let dir = layout::pod_dir(&root, uid)
                    .join(layout::VOLUMES_DIR)
                    .join(plugin)
                    .join(name);
                if let Err(e) = std::fs::create_dir_all(&dir) {
                    rt.error = Some(format!("mounting volume {name}: {e}"));
                }
            }
        }
        return;
    }
    let mut sources = Sources {
        api: &api,
        secrets: &mut s.secrets,
        configmaps: &mut s.configmaps,
        node: &inner.config.node,
    };
    let mut error = None;
    for vol in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        let name = vol["name"].as_str().unwrap_or("");
        let Some(plugin) = projection::plugin_dir(vol) else {
            continue;
        };
        match sources.volume_payload(&pod, vol) {
            Some(Ok(payload)) => {
                let dir = layout::pod_dir(&root, uid)
                    .join(layout::VOLUMES_DIR)
                    .join(plugin)
                    .join(name);
                if let Err(e) = AtomicWriterDouble::new(dir).write(&payload) {
                    error = Some(format!("volume {name}: {e}"));
                }
            }
            Some(Err(e)) => {
                error = Some(format!("MountVolume.SetUp failed for volume {name:?}: {e}"))
            }
            None => {}
        }
    }
    let mut started = BTreeMap::new();
    let mut init_started = BTreeMap::new();
    if error.is_none() && first_start {
        // Init containers first, in order, each with its env from the same
        // managers (`makeEnvironmentVariables`); a sidecar
        // (`restartPolicy: Always`) keeps running, the others complete at
        // once. Their subPath binds are not modelled.
        match start_containers(&mut sources, &pod, "initContainers") {
            Ok(m) => init_started = m,
            Err((c, e)) => {
                error = Some(format!(
                    "CreateContainerConfigError: init container {c}: {e}"
                ))
            }
        }
    }
    if error.is_none() && first_start {
        match start_containers(&mut sources, &pod, "containers") {
            Ok(m) => started = m,
            Err((_, e)) => error = Some(format!("CreateContainerConfigError: {e}")),
        }
        if error.is_none() {
            for c in pod["spec"]["containers"].as_array().into_iter().flatten() {
                if let Err(e) = write_subpaths(&root, uid, &pod, c) {
                    error = Some(format!("subPath: {e}"));
                }
            }
        }
    }
    let Some(rt) = s.pods.get_mut(uid) else {
        return;
    };
    rt.error = error.clone();
    let report_start = error.is_none() && first_start;
    if report_start {
        rt.started = started.clone();
        rt.init_started = init_started.clone();
    }
    let synced_at = rt.synced_at.clone();
    drop(guard);
    if report_start {
        report_running(inner, &pod, &synced_at, &init_started, &started);
        register_tokens(inner, &pod);
    } else if let Some(e) = error
        && first_start
    {
        report_waiting(inner, &pod, &synced_at, &e);
    }
}

/// Starts the containers of `pod["spec"][list]` in order, each with its
/// env resolved now; the first that cannot be configured stops the start
/// (its name and the error).
fn start_containers(
    sources: &mut Sources<'_>,
    pod: &Value,
    list: &str,
) -> Result<BTreeMap<String, StartedContainer>, (String, String)> {
    let now = crate::util::now_rfc3339();
    let mut started = BTreeMap::new();
    for c in pod["spec"][list].as_array().into_iter().flatten() {
        let cname = c["name"].as_str().unwrap_or("").to_string();
        match sources.container_env(pod, c) {
            Ok(env) => {
                started.insert(
                    cname,
                    StartedContainer {
                        started_at: now.clone(),
                        env,
                    },
                );
            }
            Err(e) => return Err((cname, e)),
        }
    }
    Ok(started)
}

pub(crate) fn write_subpaths(
    root: &Path,
    uid: &str,
    pod: &Value,
    c: &Value,
) -> std::io::Result<()> {
    let cname = c["name"].as_str().unwrap_or("");
    for (i, m) in c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let Some(sub) = m["subPath"].as_str().filter(|s| !s.is_empty()) else {
            continue;
        };
        let vname = m["name"].as_str().unwrap_or("");
        let Some(vol) = pod["spec"]["volumes"]
            .as_array()
            .and_then(|vs| vs.iter().find(|v| v["name"] == vname))
        else {
            continue;
        };
        let Some(plugin) = projection::plugin_dir(vol) else {
            continue;
        };
        let src = layout::pod_dir(root, uid)
            .join(layout::VOLUMES_DIR)
            .join(plugin)
            .join(vname)
            .join(sub);
        let target = layout::subpath_target(root, uid, vname, cname, i as u32);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        // A copy stands in for the bind mount: what matters is that it
        // never changes while the container runs.
        std::fs::copy(&src, &target)?;
    }
    Ok(())
}

fn report_running(
    inner: &Inner,
    pod: &Value,
    synced_at: &str,
    init_started: &BTreeMap<String, StartedContainer>,
    started: &BTreeMap<String, StartedContainer>,
) {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let now = crate::util::now_rfc3339();
    let statuses: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let cname = c["name"].as_str().unwrap_or("");
            let at = started.get(cname).map(|s| s.started_at.clone()).unwrap_or_else(|| now.clone());
            json!({
                "name": cname, "ready": true, "started": true, "restartCount": 0,
                "image": c["image"], "imageID": format!("double://{}", c["image"].as_str().unwrap_or("")),
                "containerID": format!("double://{uid}/{cname}"),
                "state": {"running": {"startedAt": at}},
            })
        })
        .collect();
    let init_statuses: Vec<Value> = pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let cname = c["name"].as_str().unwrap_or("");
            let at = init_started
                .get(cname)
                .map(|s| s.started_at.clone())
                .unwrap_or_else(|| now.clone());
            let sidecar = c["restartPolicy"].as_str() == Some("Always");
            let state = if sidecar {
                json!({"running": {"startedAt": at}})
            } else {
                json!({"terminated": {"exitCode": 0, "reason": "Completed", "startedAt": at, "finishedAt": at,
                    "containerID": format!("double://{uid}/{cname}")}})
            };
            json!({
                "name": cname, "ready": sidecar, "started": sidecar, "restartCount": 0,
                "image": c["image"], "imageID": format!("double://{}", c["image"].as_str().unwrap_or("")),
                "containerID": format!("double://{uid}/{cname}"),
                "state": state,
            })
        })
        .collect();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let status = json!({"status": {
        "phase": "Running",
        "conditions": [cond("PodReadyToStartContainers"), cond("Initialized"), cond("Ready"), cond("ContainersReady"), cond("PodScheduled")],
        "containerStatuses": statuses,
        "initContainerStatuses": init_statuses,
        "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}],
        "startTime": synced_at,
    }});
    let _ = inner
        .api
        .merge_patch(&resources::PODS, ns, name, &status, Some("status"));
}

fn report_waiting(inner: &Inner, pod: &Value, synced_at: &str, message: &str) {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let name = pod["metadata"]["name"].as_str().unwrap_or("");
    let reason = if message.starts_with("CreateContainerConfigError") {
        "CreateContainerConfigError"
    } else {
        "ContainerCreating"
    };
    let statuses: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| json!({"name": c["name"], "ready": false, "started": false, "restartCount": 0, "image": c["image"], "imageID": "",
                        "state": {"waiting": {"reason": reason, "message": message}}}))
        .collect();
    let status = json!({"status": {"phase": "Pending", "startTime": synced_at, "containerStatuses": statuses}});
    let _ = inner
        .api
        .merge_patch(&resources::PODS, ns, name, &status, Some("status"));
}

/// Makes the API double's TokenReview accept the pod's projected
/// serviceAccountTokens, with the `extra` a real API server sets.
fn register_tokens(inner: &Inner, pod: &Value) {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    for vol in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        for src in vol["projected"]["sources"].as_array().into_iter().flatten() {
            let Some(t) = src.get("serviceAccountToken") else {
                continue;
            };
            let path = t["path"].as_str().unwrap_or("token");
            let file = layout::pod_dir(&inner.config.root, uid)
                .join(layout::VOLUMES_DIR)
                .join("kubernetes.io~projected")
                .join(vol["name"].as_str().unwrap_or(""))
                .join(path);
            let Ok(token) = std::fs::read_to_string(&file) else {
                continue;
            };
            let node_uid = inner
                .api
                .get(&resources::NODES, "", &inner.config.node)
                .ok()
                .and_then(|n| n["metadata"]["uid"].as_str().map(String::from))
                .unwrap_or_default();
            let extra = BTreeMap::from([
                (
                    "authentication.kubernetes.io/credential-id".to_string(),
                    vec![format!("JTI={}", crate::util::new_uid())],
                ),
                (
                    "authentication.kubernetes.io/node-name".to_string(),
                    vec![inner.config.node.clone()],
                ),
                (
                    "authentication.kubernetes.io/node-uid".to_string(),
                    vec![node_uid],
                ),
                (
                    "authentication.kubernetes.io/pod-name".to_string(),
                    vec![pod["metadata"]["name"].as_str().unwrap_or("").to_string()],
                ),
                (
                    "authentication.kubernetes.io/pod-uid".to_string(),
                    vec![uid.to_string()],
                ),
            ]);
            inner.api.add_token(
                token.trim(),
                TokenUser {
                    username: format!("system:serviceaccount:{ns}:{sa}"),
                    uid: format!("sa-{ns}-{sa}"),
                    groups: vec![
                        "system:serviceaccounts".into(),
                        format!("system:serviceaccounts:{ns}"),
                        "system:authenticated".into(),
                    ],
                    extra,
                    audiences: vec![
                        t["audience"]
                            .as_str()
                            .unwrap_or("https://kubernetes.default.svc")
                            .to_string(),
                    ],
                },
            );
        }
    }
}

/// SyncTerminatingPod + SyncTerminatedPod: kill, unmount (remove the pod
/// directory), unregister, then confirm the deletion to the API.
fn cleanup(inner: &Inner, uid: &str, confirm: bool) {
    let pod = {
        let mut s = lock(&inner.state);
        let Some(rt) = s.pods.remove(uid) else { return };
        let _ = std::fs::remove_dir_all(layout::pod_dir(&inner.config.root, uid));
        s.secrets.unregister_pod(uid);
        s.configmaps.unregister_pod(uid);
        rt.pod
    };
    if confirm {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
        let name = pod["metadata"]["name"].as_str().unwrap_or("");
        let _ = inner
            .api
            .delete(&resources::PODS, ns, name, &DeleteOptions::confirm(uid));
    }
}
