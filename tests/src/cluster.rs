//! The cluster in a box: an API server double, one simulated kubelet per
//! node (each with its own kubelet root under one temporary directory), a
//! slurmrestd double, and optionally a Slinky-like setup with the NodeSet
//! double. Hands out URLs and kubelet roots so tests and the demo can start
//! the real mountguard binaries against it.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use mountguard_tests::cluster::Cluster;
//! let mut cluster = Cluster::builder().nodes(3).slinky().start().await?;
//! let api_url = cluster.api_url();
//! let root = cluster.kubelet_root(0);
//! cluster.shutdown().await;
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::apiserver::{ApiHandle, ApiServerConfig, ApiServerDouble, EventType, resources};
use crate::kubelet::{KubeletConfig, KubeletDouble, KubeletHandle, Strategy};
use crate::nodeset::{LABEL_POD_HOSTNAME, NodeSetDouble};
use crate::slurmrestd::{SlurmHandle, SlurmrestdDouble};

/// Namespace of the Slinky-like setup.
pub const SLURM_NAMESPACE: &str = "slurm";
/// The NodeSet of the Slinky-like setup.
pub const NODESET: &str = "slurm-worker-slinky";
/// The Slurm auth key Secret (key `slurm.key`).
pub const AUTH_SECRET: &str = "slurm-auth-slurm";
/// The slurmrestd JWT key Secret (key `jwt.key`).
pub const JWT_SECRET: &str = "slurm-auth-jwt";
/// The sshd ConfigMap, mounted through subPath.
pub const SSHD_CONFIGMAP: &str = "slurm-sshd";
/// The hooks ConfigMap, mounted as a normal volume.
pub const HOOKS_CONFIGMAP: &str = "slurm-hooks";
/// The PodDisruptionBudget protecting busy workers.
pub const PDB: &str = "slurm-workers-pdb-slurm";
/// Slurm cluster name.
pub const SLURM_CLUSTER: &str = "slurm";
/// A static slurmrestd token that the double accepts (user `slurm`).
pub const SLURM_TOKEN: &str = "mountguard-double-slurm-token";

/// The bearer token of the rig's status API reader: every rig's API server
/// (the double, the real one through its static token file) authenticates
/// it as [`STATUS_READER_USER`] in group [`STATUS_READER_GROUP`], which may
/// `get` `verdicts.mountguard.io` everywhere.
pub const STATUS_READER_TOKEN: &str = "rig-status-reader-0123456789abcdef";

/// The user [`STATUS_READER_TOKEN`] authenticates as.
pub const STATUS_READER_USER: &str = "rig:status-reader";

/// The group of [`STATUS_READER_USER`].
pub const STATUS_READER_GROUP: &str = "rig:status-readers";

/// Builder of a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterBuilder {
    nodes: usize,
    namespaces: Vec<String>,
    slinky: bool,
    operator_rules: bool,
    operator_cache_lag: bool,
    strategy: Strategy,
    resync: Duration,
    jitter: f64,
    event_log_capacity: usize,
}

impl ClusterBuilder {
    /// Number of nodes (default 1).
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n.max(1);
        self
    }

    /// An extra namespace.
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespaces.push(name.to_string());
        self
    }

    /// The Slinky-like setup: namespace `slurm`, Secrets `slurm-auth-slurm`
    /// and `slurm-auth-jwt` (immutable), ConfigMaps `slurm-sshd` and
    /// `slurm-hooks`, the workers' PDB, and NodeSet `slurm-worker-slinky`
    /// with one replica per node, kept by the NodeSet double; slurmd state
    /// is bridged to the slurmrestd double.
    pub fn slinky(mut self) -> Self {
        self.slinky = true;
        self
    }

    /// With [`Self::slinky`]: also the Slinky operator's Slurm-side rules
    /// ([`crate::operator`], slurm-operator v1.2.1): the slurmd preStop
    /// hook on pod termination (DOWN, `slurm-operator: Pod is
    /// terminating`, only when the pod's `slurm.key` is slurmctld's) and
    /// `syncCordon` for every running slurmd pod (pod-cordon annotation,
    /// drain and undrain through slurmrestd, as user `slurm`).
    pub fn slinky_operator_rules(mut self) -> Self {
        self.operator_rules = true;
        self
    }

    /// With [`Self::slinky_operator_rules`]: the operator's syncCordon (and
    /// syncPodUncordon) checks each Slurm node's reason as its previous pass read it and
    /// writes on the node as it is now (its slurm-client cache refreshed
    /// between the two reads: the worst case, every pass; see
    /// `operator::sync_cordon_with_reads`).
    pub fn operator_cache_lag(mut self) -> Self {
        self.operator_cache_lag = true;
        self
    }

    /// The kubelets' Secret/ConfigMap strategy (default Watch).
    pub fn strategy(mut self, s: Strategy) -> Self {
        self.strategy = s;
        self
    }

    /// The kubelets' resync period and jitter (default 1 s, 0.5).
    pub fn resync(mut self, period: Duration, jitter: f64) -> Self {
        self.resync = period;
        self.jitter = jitter;
        self
    }

    /// Events the API double keeps for watches (default 10 000).
    pub fn event_log_capacity(mut self, n: usize) -> Self {
        self.event_log_capacity = n;
        self
    }

    /// Starts everything.
    pub async fn start(self) -> std::io::Result<Cluster> {
        let dir = tempfile::Builder::new()
            .prefix("mountguard-cluster-")
            .tempdir()?;
        let api = ApiServerDouble::start_with(ApiServerConfig {
            event_log_capacity: self.event_log_capacity,
            ..ApiServerConfig::default()
        })
        .await?;
        let handle = api.handle();
        let io = |e: crate::apiserver::ApiError| std::io::Error::other(e.to_string());
        for ns in &self.namespaces {
            handle.ensure_namespace(ns).map_err(io)?;
        }
        // The status API's reader, as the chart's reader ClusterRole bound
        // cluster-wide would make it.
        handle.add_token(
            STATUS_READER_TOKEN,
            crate::apiserver::TokenUser {
                username: STATUS_READER_USER.into(),
                uid: "rig-status-reader-uid".into(),
                groups: vec![STATUS_READER_GROUP.into()],
                ..Default::default()
            },
        );
        handle.grant(crate::apiserver::AccessGrant {
            subject: format!("group:{}", STATUS_READER_GROUP),
            verb: "get".into(),
            group: "mountguard.io".into(),
            resource: "verdicts".into(),
            namespace: None,
        });
        let mut kubelets = Vec::new();
        for i in 0..self.nodes {
            let root = dir.path().join(format!("node-{i}")).join("kubelet");
            let mut config = KubeletConfig::new(format!("node-{i}"), root);
            config.strategy = self.strategy;
            config.resync_period = self.resync;
            config.jitter = self.jitter;
            kubelets.push(KubeletDouble::start(handle.clone(), config).await?);
        }
        let slurm = SlurmrestdDouble::start(SLURM_CLUSTER).await?;
        slurm.handle().add_token(SLURM_TOKEN, "slurm");
        let mut cluster = Cluster {
            api,
            kubelets,
            slurm,
            nodeset: None,
            bridge: None,
            kubeconfig: dir.path().join("kubeconfig"),
            dir: Some(dir),
        };
        std::fs::write(&cluster.kubeconfig, kubeconfig(&cluster.api_url()))?;
        if self.slinky {
            slinky_objects(&handle, self.nodes).map_err(io)?;
            let (stop, stop_rx) = watch::channel(false);
            let roots: Vec<PathBuf> = cluster
                .kubelets
                .iter()
                .map(|k| k.handle().root().to_path_buf())
                .collect();
            // Subscribe before the NodeSet double creates the pods, so
            // the bridge sees every pod event.
            let sub = handle.subscribe(handle.resource_version());
            let task = tokio::spawn(bridge(
                handle.clone(),
                cluster.slurm.handle(),
                roots,
                sub,
                stop_rx,
                self.operator_rules,
                self.operator_cache_lag,
            ));
            cluster.bridge = Some((stop, task));
            cluster.nodeset = Some(NodeSetDouble::start(handle));
        }
        Ok(cluster)
    }
}

/// A running cluster in a box.
#[derive(Debug)]
pub struct Cluster {
    api: ApiServerDouble,
    kubelets: Vec<KubeletDouble>,
    slurm: SlurmrestdDouble,
    nodeset: Option<NodeSetDouble>,
    bridge: Option<(watch::Sender<bool>, JoinHandle<()>)>,
    kubeconfig: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl Cluster {
    /// A builder (1 node, no Slinky setup).
    pub fn builder() -> ClusterBuilder {
        ClusterBuilder {
            nodes: 1,
            namespaces: Vec::new(),
            slinky: false,
            operator_rules: false,
            operator_cache_lag: false,
            strategy: Strategy::Watch,
            resync: Duration::from_secs(1),
            jitter: 0.5,
            event_log_capacity: 10_000,
        }
    }

    /// The API server double's URL.
    pub fn api_url(&self) -> String {
        self.api.url()
    }

    /// A kubeconfig file pointing at the API double, with the rig's status
    /// reader token as its user's (the double checks no request's token;
    /// the kubectl plugin hands it on to the status API).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// The slurmrestd double's URL.
    pub fn slurmrestd_url(&self) -> String {
        self.slurm.url()
    }

    /// Node names, in order.
    pub fn node_names(&self) -> Vec<String> {
        self.kubelets
            .iter()
            .map(|k| k.handle().node().to_string())
            .collect()
    }

    /// The kubelet root of node `i`.
    pub fn kubelet_root(&self, i: usize) -> PathBuf {
        self.kubelets[i].handle().root().to_path_buf()
    }

    /// The simulated kubelet of node `i`.
    pub fn kubelet(&self, i: usize) -> KubeletHandle {
        self.kubelets[i].handle()
    }

    /// Direct object access to the API double.
    pub fn api(&self) -> ApiHandle {
        self.api.handle()
    }

    /// The slurmrestd double's state.
    pub fn slurm(&self) -> SlurmHandle {
        self.slurm.handle()
    }

    /// The temporary directory holding every kubelet root.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map(|d| d.path()).unwrap_or(Path::new(""))
    }

    /// Stops every double and removes the temporary directory.
    pub async fn shutdown(&mut self) {
        if let Some(n) = self.nodeset.as_mut() {
            n.shutdown().await;
        }
        if let Some((stop, task)) = self.bridge.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
        for k in &mut self.kubelets {
            k.shutdown().await;
        }
        self.slurm.shutdown().await;
        self.api.shutdown().await;
        if let Some(d) = self.dir.take() {
            let _ = d.close();
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Some((stop, task)) = self.bridge.take() {
            let _ = stop.send(true);
            task.abort();
        }
    }
}

fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: double\n  cluster:\n    server: {url}\ncontexts:\n- name: double\n  context:\n    cluster: double\n    user: double\n    namespace: default\ncurrent-context: double\nusers:\n- name: double\n  user:\n    token: {token}\n",
        token = STATUS_READER_TOKEN
    )
}

fn random_key(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        out.extend_from_slice(&crate::util::random_u64().to_le_bytes());
    }
    out.truncate(len);
    out
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The NodeSet template of the Slinky-like setup.
pub fn slurmd_template() -> Value {
    json!({
        "metadata": {"labels": {"app.kubernetes.io/part-of": "slurm"}},
        "spec": {
            "serviceAccountName": "default",
            "containers": [{
                "name": "slurmd",
                "image": "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04",
                "volumeMounts": [
                    {"name": "slurm-etc", "mountPath": "/etc/slurm"},
                    {"name": "sshd-config", "mountPath": "/etc/ssh/sshd_config", "subPath": "sshd_config"},
                    {"name": "hooks", "mountPath": "/etc/enroot/hooks.d"},
                ],
            }],
            "volumes": [
                {"name": "slurm-etc", "projected": {"defaultMode": 0o600, "sources": [
                    {"secret": {"name": AUTH_SECRET, "items": [{"key": "slurm.key", "path": "slurm.key"}]}},
                ]}},
                {"name": "sshd-config", "configMap": {"name": SSHD_CONFIGMAP}},
                {"name": "hooks", "configMap": {"name": HOOKS_CONFIGMAP, "defaultMode": 0o755}},
            ],
        },
    })
}

fn slinky_objects(api: &ApiHandle, replicas: usize) -> Result<(), crate::apiserver::ApiError> {
    let ns = SLURM_NAMESPACE;
    api.ensure_namespace(ns)?;
    api.create(
        &resources::SECRETS,
        ns,
        json!({"metadata": {"name": AUTH_SECRET}, "immutable": true, "data": {"slurm.key": b64(&random_key(1024))}}),
    )?;
    api.create(
        &resources::SECRETS,
        ns,
        json!({"metadata": {"name": JWT_SECRET}, "immutable": true, "data": {"jwt.key": b64(&random_key(32))}}),
    )?;
    api.create(
        &resources::CONFIGMAPS,
        ns,
        json!({"metadata": {"name": SSHD_CONFIGMAP}, "data": {"sshd_config": "Port 22\nUsePAM yes\n"}}),
    )?;
    api.create(
        &resources::CONFIGMAPS,
        ns,
        json!({"metadata": {"name": HOOKS_CONFIGMAP}, "data": {"99-mountguard.sh": "#!/bin/sh\nexit 0\n"}}),
    )?;
    api.create(
        &resources::PDBS,
        ns,
        json!({"metadata": {"name": PDB}, "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {LABEL_POD_PROTECT: "true"}}}}),
    )?;
    api.create(
        &resources::NODESETS,
        ns,
        json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": NODESET},
            "spec": {
                "controllerRef": {"name": SLURM_CLUSTER, "namespace": ns},
                "replicas": replicas,
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
                "template": slurmd_template(),
            },
        }),
    )?;
    Ok(())
}

pub fn decode_key(secret: &Value, key: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(secret["data"][key].as_str()?)
        .ok()
}

/// The pod label the Slinky operator sets on busy workers (the PDB selects it).
pub use crate::operator::LABEL_POD_PROTECT;

/// Plays slurmctld and slurmd for the slurmrestd double: slurmctld uses the
/// current `slurm.key` from the API (its pods are rolled on change); each
/// slurmd loads the key its kubelet wrote into its pod's `slurm-etc`
/// volume when it starts, and stops with its pod.
async fn bridge(
    api: ApiHandle,
    slurm: SlurmHandle,
    roots: Vec<PathBuf>,
    mut sub: crate::apiserver::Subscription,
    mut stop: watch::Receiver<bool>,
    operator_rules: bool,
    operator_cache_lag: bool,
) {
    let mut operator_cache = operator_cache_lag.then(std::collections::BTreeMap::new);
    let node_root = |node: &str| -> Option<PathBuf> {
        let i: usize = node.strip_prefix("node-")?.parse().ok()?;
        roots.get(i).cloned()
    };
    let sync_controller_key = |slurm: &SlurmHandle| {
        if let Some(k) = api
            .get(&resources::SECRETS, SLURM_NAMESPACE, AUTH_SECRET)
            .ok()
            .and_then(|s| decode_key(&s, "slurm.key"))
        {
            slurm.set_controller_key(&k);
        }
        if let Some(k) = api
            .get(&resources::SECRETS, SLURM_NAMESPACE, JWT_SECRET)
            .ok()
            .and_then(|s| decode_key(&s, "jwt.key"))
        {
            slurm.set_jwt_key(&k);
        }
    };
    sync_controller_key(&slurm);
    let mut started: std::collections::BTreeMap<String, String> = Default::default();
    // One slurmd pod seen (added, changed, or gone).
    let on_pod =
        |started: &mut std::collections::BTreeMap<String, String>, pod: &Value, deleted: bool| {
            if pod["metadata"]["labels"]["app.kubernetes.io/name"] != "slurmd" {
                return;
            }
            let Some(host) = pod["metadata"]["labels"][LABEL_POD_HOSTNAME].as_str() else {
                return;
            };
            let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
            slurm.add_node(host, 4);
            if deleted || !pod["metadata"]["deletionTimestamp"].is_null() {
                if started.get(host) == Some(&uid) {
                    started.remove(host);
                    if operator_rules
                        && let Some(u) = crate::operator::prestop(slurm.slurmd_key_matches(host))
                    {
                        slurm.scontrol_update(host, &u.body(), "slurm");
                    }
                    slurm.slurmd_stopped(host);
                }
                return;
            }
            if pod["status"]["phase"] != "Running" || started.get(host) == Some(&uid) {
                return;
            }
            let Some(root) = pod["spec"]["nodeName"].as_str().and_then(node_root) else {
                return;
            };
            let key_file = mountguard_inventory::layout::pod_dir(&root, &uid)
                .join("volumes/kubernetes.io~projected/slurm-etc/slurm.key");
            if let Ok(key) = std::fs::read(&key_file) {
                slurm.slurmd_started(host, &key);
                started.insert(host.to_string(), uid);
            }
        };
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        let evs = tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                crate::operator::protect_busy_pods(&api, &slurm, SLURM_NAMESPACE, &started);
                if operator_rules {
                    crate::operator::sync_cordon_pods(&api, &slurm, SLURM_NAMESPACE, operator_cache.as_mut());
                }
                continue;
            }
            evs = sub.next() => match evs {
                Ok(evs) => evs,
                Err(e) if e.code == 410 => {
                    // Fell behind: start over from a list, like a watcher.
                    sub = api.subscribe(api.resource_version());
                    sync_controller_key(&slurm);
                    let pods = api.list_all(&resources::PODS, Some(SLURM_NAMESPACE));
                    let live: std::collections::BTreeSet<String> = pods
                        .iter()
                        .filter_map(|p| p["metadata"]["uid"].as_str().map(String::from))
                        .collect();
                    let gone: Vec<String> = started
                        .iter()
                        .filter(|(_, uid)| !live.contains(*uid))
                        .map(|(h, _)| h.clone())
                        .collect();
                    for host in gone {
                        started.remove(&host);
                        slurm.slurmd_stopped(&host);
                    }
                    for p in &pods {
                        on_pod(&mut started, p, false);
                    }
                    continue;
                }
                Err(_) => return,
            },
        };
        for ev in evs {
            if ev.rt == resources::SECRETS
                && ev.object["metadata"]["namespace"] == SLURM_NAMESPACE
                && ev.kind != EventType::Deleted
            {
                sync_controller_key(&slurm);
            }
            if ev.rt == resources::PODS {
                on_pod(&mut started, &ev.object, ev.kind == EventType::Deleted);
            }
        }
    }
}
