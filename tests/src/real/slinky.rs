//! The Slinky side of the rig on the real control plane, where the Slinky
//! operator itself cannot be built (see docs/testing.md): the slurmrestd
//! double, the NodeSet double (pod recreation) and the operator double's
//! Slurm-side rules (`syncCordon`, the slurmd preStop hook), all clients of
//! the real API server through [`RealObjects`], with the same rules as in
//! the cluster in a box ([`crate::nodeset`], [`crate::operator`],
//! `crate::cluster`'s bridge).
//!
//! - The NodeSet double reconciles every 200 ms ([`NodeSetDouble::start_polling`]).
//! - The bridge plays slurmctld and slurmd every 100 ms: slurmctld uses the
//!   current `slurm.key` (and `jwt.key`) from the real API; a slurmd starts
//!   with the key its node double wrote into its pod's `slurm-etc` volume
//!   once the pod is Running, and stops once its pod is gone from the API
//!   (the node double confirmed the deletion after the preStop hook). It
//!   also labels busy workers `pod-protect` (so the real disruption
//!   controller counts them under the PDB) and, with the operator's rules,
//!   runs `syncCordon`.
//! - [`slurmd_exec_hook`] is the node doubles' container exec: the slurmd
//!   container's preStop command (`scontrol update ... state=down
//!   reason='slurm-operator: Pod is terminating'`, slurm-operator
//!   `internal/builder/workerbuilder/worker_app.go`) authenticates with the
//!   pod's own `slurm.key` file, so it takes effect only when that key is
//!   slurmctld's ([`crate::operator::prestop`]).

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::node::{ExecHook, PreStop};
use super::objects::RealObjects;
use crate::apiserver::resources;
use crate::cluster::{
    AUTH_SECRET, HOOKS_CONFIGMAP, JWT_SECRET, NODESET, PDB, SLURM_CLUSTER, SLURM_NAMESPACE,
    SSHD_CONFIGMAP,
};
use crate::nodeset::{LABEL_POD_HOSTNAME, NodeSetDouble};
use crate::objects::Objects;
use crate::slurmrestd::SlurmHandle;

/// The slurmd container's preStop command, as the Slinky worker builder
/// writes it (`worker_app.go`, `Lifecycle.PreStop`).
pub fn slurmd_prestop_command() -> Value {
    json!([
        "/usr/bin/sh",
        "-c",
        "scontrol update nodename=$(hostname) state=down reason='slurm-operator: Pod is terminating';"
    ])
}

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// The `jwt.key` of [`create_auth_and_hooks`].
pub const JWT_KEY: [u8; 32] = [7u8; 32];

/// The first `slurm.key` of [`create_auth_and_hooks`] (1024 bytes).
pub fn first_slurm_key() -> Vec<u8> {
    (0..1024u32).map(|i| (i * 7 + 3) as u8).collect()
}

/// The slurm namespace with what every Slinky setup of the rig mounts:
/// the immutable `slurm.key` ([`first_slurm_key`]) and `jwt.key` Secrets
/// and the hooks ConfigMap.
pub async fn create_auth_and_hooks(client: &kube::Client) -> io::Result<()> {
    super::ensure_namespace(client, SLURM_NAMESPACE).await?;
    for o in [
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": AUTH_SECRET, "namespace": SLURM_NAMESPACE}, "immutable": true, "data": {"slurm.key": b64(&first_slurm_key())}}),
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": JWT_SECRET, "namespace": SLURM_NAMESPACE}, "immutable": true, "data": {"jwt.key": b64(&JWT_KEY)}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": HOOKS_CONFIGMAP, "namespace": SLURM_NAMESPACE}, "data": {"99-mountguard.sh": "#!/bin/sh\nexit 0\n"}}),
    ] {
        super::create(client, &o).await?;
    }
    Ok(())
}

/// The Slinky objects the NodeSet double works from:
/// [`create_auth_and_hooks`], the sshd ConfigMap, the workers' PDB
/// (`maxUnavailable: 0` over `pod-protect`, as the operator's
/// `BuildClusterWorkerPodDisruptionBudget`) and NodeSet [`NODESET`] of
/// `replicas` pods from `template`; waits for the namespace's default
/// ServiceAccount (ServiceAccount admission needs it). Returns the
/// NodeSet's UID.
pub async fn create_nodeset(
    client: &kube::Client,
    replicas: usize,
    template: Value,
) -> io::Result<String> {
    create_auth_and_hooks(client).await?;
    for o in [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": SSHD_CONFIGMAP, "namespace": SLURM_NAMESPACE}, "data": {"sshd_config": "Port 22\nUsePAM yes\n"}}),
        json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": PDB, "namespace": SLURM_NAMESPACE},
               "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"nodeset.slinky.slurm.net/pod-protect": "true"}}}}),
    ] {
        super::create(client, &o).await?;
    }
    let nodeset = super::create(
        client,
        &json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": NODESET, "namespace": SLURM_NAMESPACE},
            "spec": {
                "controllerRef": {"name": SLURM_CLUSTER, "namespace": SLURM_NAMESPACE},
                "replicas": replicas,
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
                "template": template,
            },
        }),
    )
    .await?;
    super::wait_for_default_service_account(client, SLURM_NAMESPACE).await?;
    nodeset["metadata"]["uid"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| io::Error::other(format!("the NodeSet has no UID: {nodeset}")))
}

/// The relative path of `slurm.key` in a slurmd pod's directory.
const KEY_FILE: &str = "volumes/kubernetes.io~projected/slurm-etc/slurm.key";

/// Who plays Slurm for the bridge: the slurmrestd double, or real Slurm
/// (slurmctld, slurmrestd, and one slurmd process per worker pod, started
/// on the `slurm.key` file the node wrote into the pod's volume).
#[derive(Debug, Clone)]
pub enum SlurmSide {
    /// The slurmrestd double.
    Double(SlurmHandle),
    /// Real Slurm ([`super::slurm::RealSlurm`]).
    Real(Arc<super::slurm::RealSlurm>),
}

impl SlurmSide {
    /// slurmctld on `key`: the double takes it; real slurmctld is
    /// restarted on it when it is another key (it reads its key at start).
    fn controller_key(&self, key: &[u8]) {
        match self {
            SlurmSide::Double(h) => h.set_controller_key(key),
            SlurmSide::Real(r) => {
                if r.cluster_key() != key {
                    let r = r.clone();
                    let key = key.to_vec();
                    let restarted = tokio::runtime::Handle::current()
                        .block_on(async move { r.restart_ctld_with_key(&key).await });
                    if let Err(e) = restarted {
                        eprintln!("bridge: restarting slurmctld on the new key: {e}");
                    }
                }
            }
        }
    }

    /// A worker's slurmd started with the key in `key_file`; false when the
    /// file cannot be read yet.
    fn slurmd_started(&self, host: &str, key_file: &std::path::Path) -> bool {
        match self {
            SlurmSide::Double(h) => match std::fs::read(key_file) {
                Ok(key) => {
                    if h.node(host).is_none() {
                        h.add_node(host, 4);
                    }
                    h.slurmd_started(host, &key);
                    true
                }
                Err(_) => false,
            },
            SlurmSide::Real(r) => {
                key_file.is_file()
                    && r.start_slurmd(host, key_file)
                        .map_err(|e| eprintln!("bridge: starting slurmd {host}: {e}"))
                        .is_ok()
            }
        }
    }

    fn slurmd_stopped(&self, host: &str) {
        match self {
            SlurmSide::Double(h) => h.slurmd_stopped(host),
            SlurmSide::Real(r) => r.stop_slurmd(host),
        }
    }
}

/// The node doubles' container exec: runs the slurmd preStop command
/// against the slurmrestd double's slurmctld (not a REST write: scontrol),
/// as user `slurm`, when the pod's key file is slurmctld's key.
pub fn slurmd_exec_hook(slurm: SlurmHandle) -> ExecHook {
    ExecHook(Arc::new(move |p: &PreStop<'_>| {
        if !p.command.iter().any(|a| a.contains("scontrol update")) {
            return;
        }
        let Some(host) = p.pod["metadata"]["labels"][LABEL_POD_HOSTNAME].as_str() else {
            return;
        };
        let key = std::fs::read(p.pod_dir.join(KEY_FILE)).unwrap_or_default();
        if let Some(u) = crate::operator::prestop(!key.is_empty() && slurm.key_is_current(&key)) {
            slurm.scontrol_update(host, &u.body(), "slurm");
        }
    }))
}

/// The NodeSet double and the slurmd bridge, running against the real
/// API server.
#[derive(Debug)]
pub struct SlinkyDoubles {
    nodeset: Option<NodeSetDouble>,
    bridge: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

impl SlinkyDoubles {
    /// Starts both (the bridge alone without `nodeset_double`: the real
    /// operator's NodeSet controller makes the pods); `roots` maps node
    /// names to their kubelet roots.
    pub fn start(
        api: Arc<RealObjects>,
        slurm: SlurmSide,
        roots: BTreeMap<String, PathBuf>,
        operator_rules: bool,
        nodeset_double: bool,
    ) -> Self {
        let nodeset = nodeset_double
            .then(|| NodeSetDouble::start_polling(api.clone(), Duration::from_millis(200)));
        let (stop, mut stop_rx) = watch::channel(false);
        let task = tokio::spawn(async move {
            let started: Arc<std::sync::Mutex<BTreeMap<String, String>>> = Arc::default();
            let mut tick = tokio::time::interval(Duration::from_millis(100));
            loop {
                tokio::select! {
                    _ = stop_rx.changed() => return,
                    _ = tick.tick() => {}
                }
                let (api, slurm, roots, started) =
                    (api.clone(), slurm.clone(), roots.clone(), started.clone());
                let _ = tokio::task::spawn_blocking(move || {
                    if let Ok(mut started) = started.lock() {
                        bridge_pass(
                            &api,
                            &slurm,
                            &roots,
                            &mut started,
                            operator_rules,
                            nodeset_double,
                        );
                    }
                })
                .await;
            }
        });
        Self {
            nodeset,
            bridge: Some((stop, task)),
        }
    }

    /// Stops both.
    pub async fn shutdown(&mut self) {
        if let Some(n) = self.nodeset.as_mut() {
            n.shutdown().await;
        }
        if let Some((stop, task)) = self.bridge.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
    }
}

impl Drop for SlinkyDoubles {
    fn drop(&mut self) {
        if let Some((stop, task)) = self.bridge.take() {
            let _ = stop.send(true);
            task.abort();
        }
    }
}

/// Whether the pod's slurmd container started at least `delay` ago
/// (`status.containerStatuses[name=slurmd].state.running.startedAt`).
fn started_for(pod: &Value, delay: Duration) -> bool {
    if delay.is_zero() {
        return true;
    }
    let started = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "slurmd")
        .and_then(|c| c["state"]["running"]["startedAt"].as_str())
        .and_then(|t| t.parse::<jiff::Timestamp>().ok());
    started.is_some_and(|t| {
        jiff::Timestamp::now().as_millisecond() - t.as_millisecond()
            >= i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)
    })
}

/// One pass of the bridge (see the module doc). A failed list changes
/// nothing (a slurmd is stopped only for a pod the API says is gone).
fn bridge_pass(
    api: &RealObjects,
    slurm: &SlurmSide,
    roots: &BTreeMap<String, PathBuf>,
    started: &mut BTreeMap<String, String>,
    operator_rules: bool,
    nodeset_double: bool,
) {
    for (name, key, set) in [
        (AUTH_SECRET, "slurm.key", true),
        (JWT_SECRET, "jwt.key", false),
    ] {
        if let Some(k) = api
            .get(&resources::SECRETS, SLURM_NAMESPACE, name)
            .ok()
            .and_then(|s| crate::cluster::decode_key(&s, key))
        {
            match (set, slurm) {
                (true, _) => slurm.controller_key(&k),
                (false, SlurmSide::Double(h)) => h.set_jwt_key(&k),
                // Real slurmctld was started on the jwt.key Secret's key.
                (false, SlurmSide::Real(_)) => {}
            }
        }
    }
    // slurmd as the worker pods' own containers: the real kubelet runs
    // them, and their preStop hook; the bridge only restarts slurmctld.
    if let SlurmSide::Real(r) = slurm
        && r.slurmd_in_pods()
    {
        return;
    }
    let Ok(list) = api.try_list(&resources::PODS, Some(SLURM_NAMESPACE)) else {
        return;
    };
    let slurmd: Vec<&Value> = list
        .iter()
        .filter(|p| p["metadata"]["labels"]["app.kubernetes.io/name"] == "slurmd")
        .collect();
    let live: Vec<&str> = slurmd
        .iter()
        .filter_map(|p| p["metadata"]["uid"].as_str())
        .collect();
    let gone: Vec<String> = started
        .iter()
        .filter(|(_, uid)| !live.contains(&uid.as_str()))
        .map(|(h, _)| h.clone())
        .collect();
    for host in gone {
        started.remove(&host);
        slurm.slurmd_stopped(&host);
    }
    for pod in slurmd {
        let Some(host) = pod["metadata"]["labels"][LABEL_POD_HOSTNAME].as_str() else {
            continue;
        };
        let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
        if let SlurmSide::Double(h) = slurm
            && h.node(host).is_none()
        {
            h.add_node(host, 4);
        }
        if pod["status"]["phase"] != "Running"
            || !pod["metadata"]["deletionTimestamp"].is_null()
            || started.get(host) == Some(&uid)
        {
            continue;
        }
        let Some(root) = pod["spec"]["nodeName"].as_str().and_then(|n| roots.get(n)) else {
            continue;
        };
        if let SlurmSide::Real(r) = slurm
            && !started_for(pod, r.slurmd_delay())
        {
            continue;
        }
        let key_file = mountguard_inventory::layout::pod_dir(root, &uid).join(KEY_FILE);
        if slurm.slurmd_started(host, &key_file) {
            started.insert(host.to_string(), uid);
        }
    }
    // With the real operator, its own rules label busy pods (the
    // workload disruption protection) and cordon: the bridge only plays
    // Slurm. Against real Slurm no job runs during a repair, and the
    // operator's rules are the real operator's to play.
    let SlurmSide::Double(slurm) = slurm else {
        return;
    };
    if nodeset_double {
        crate::operator::protect_busy_pods(api, slurm, SLURM_NAMESPACE, started);
    }
    if operator_rules {
        crate::operator::sync_cordon_pods(api, slurm, SLURM_NAMESPACE, None);
    }
}
