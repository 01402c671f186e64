//! Watches (kube-runtime `watcher`, retried with [`Retry`]'s backoff),
//! converted at the edge into evaluation inputs.
//!
//! * Pods (per watched namespace, `--pod-selector`), Secrets and ConfigMaps
//!   (per watched namespace; content hashed here, the object and its
//!   plaintext dropped at once), Nodes, NodeSets (`slinky.slurm.net/v1beta1`,
//!   optional), the workloads whose pods remediation may evict
//!   (Deployments, ReplicaSets, StatefulSets, DaemonSets; only the kinds
//!   enabled) and the agent's pods (agent namespace, owned by the agent
//!   DaemonSet; for authorization).
//! * Re-list semantics like a reflector store: after `InitDone`, objects
//!   not seen in the re-list are deleted.
//! * Every watch, the NodeSet watches included, is registered before any
//!   starts and gates readiness. The NodeSet watches also send
//!   [`Input::NodeSetsSynced`] after their list (or once the CRD is found
//!   absent), so that a snapshot says whether its NodeSets are complete.
//! * Every error is counted (`mountguard_api_errors_total`,
//!   `mountguard_watch_restarts_total`) and retried with backoff; a failure
//!   streak is logged once when it starts and once ("watch recovered") when
//!   a re-list or a watch event succeeds again.
//!   [`Health`](crate::runtime::health::Health) records when each resource last
//!   failed, so the evaluation can mark subjects `Unverifiable/ApiUnavailable`
//!   while the Secret/ConfigMap view is not current.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::edge::convert;
use crate::edge::workloads;
use crate::eval::Input;
use crate::intake::auth::{AgentPod, AgentPods};
use crate::runtime::shutdown::Shutdown;
use crate::state::Shared;
use mountguard_core::PodUid;
use mountguard_core::model::Interner;
use mountguard_core::remediation::inputs::{NodeSetKey, WorkloadObject};
use mountguard_core::remediation::workload::WorkloadKind;

/// Backoff of one failing watch: 800 ms doubling up to 30 s (the bounds of
/// kube-runtime's `DefaultBackoff`), reset only when the watch works again
/// (a re-list completes or a watch event arrives). Not kube-runtime's
/// `StreamBackoff`: it resets on every `Ok` item, and the watcher yields
/// `Event::Init` before each list request (kube-runtime 5.0.0
/// `src/watcher.rs`, `step_trampolined`, `State::Empty`), so while the API
/// server was unreachable the delay never grew and every retry looked like a
/// recovery.
#[derive(Debug, Default)]
pub struct Retry {
    failures: u32,
    since: Option<Instant>,
}

impl Retry {
    const FIRST: Duration = Duration::from_millis(800);
    const MAX: Duration = Duration::from_secs(30);

    /// Records a failure at `now`; returns the delay before the next try and
    /// whether this failure starts a streak (the one to log).
    pub fn failed(&mut self, now: Instant) -> (Duration, bool) {
        let first = self.failures == 0;
        if first {
            self.since = Some(now);
        }
        let delay = Self::FIRST
            .saturating_mul(2u32.saturating_pow(self.failures.min(16)))
            .min(Self::MAX);
        self.failures = self.failures.saturating_add(1);
        (delay, first)
    }

    /// Records a success at `now`; when it ends a streak, returns how many
    /// failures it had and how long it lasted.
    pub fn recovered(&mut self, now: Instant) -> Option<(u32, Duration)> {
        let since = self.since.take()?;
        let n = std::mem::take(&mut self.failures);
        Some((n, now.saturating_duration_since(since)))
    }
}

/// Runs one watch until shutdown.
#[allow(clippy::too_many_arguments)]
async fn run_watch<K, E>(
    api: Api<K>,
    config: watcher::Config,
    name: String,
    resource: &'static str,
    mut edge: E,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Input>,
    mut shutdown: Shutdown,
) where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    K::DynamicType: Default,
    E: Edge<K>,
{
    let mut stream = watcher(api, config).boxed();
    let mut known: HashSet<E::Key> = HashSet::new();
    let mut relist: Option<HashSet<E::Key>> = None;
    let mut lists = 0u64;
    let mut retry = Retry::default();
    loop {
        let ev = tokio::select! {
            _ = shutdown.wait() => return,
            ev = stream.try_next() => ev,
        };
        let mut out: Vec<Input> = Vec::new();
        match ev {
            Ok(None) => return,
            Err(e) => {
                shared.metrics.api_error(&format!("watch_{resource}"));
                shared
                    .metrics
                    .watch_restarts
                    .with_label_values(&[resource])
                    .inc();
                shared.health.error(&name);
                let (delay, first) = retry.failed(Instant::now());
                if first {
                    warn!(watch = %name, error = %e, "watch failed; retrying with backoff");
                } else {
                    debug!(watch = %name, error = %e, retry_in = ?delay, "watch still failing");
                }
                tokio::select! {
                    _ = shutdown.wait() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
                continue;
            }
            Ok(Some(ev)) => {
                // A re-list done or a watch event: the watch works again
                // (an `Init` only means a list request is about to be made).
                if matches!(
                    ev,
                    watcher::Event::InitDone | watcher::Event::Apply(_) | watcher::Event::Delete(_)
                ) && let Some((failures, down)) = retry.recovered(Instant::now())
                {
                    info!(watch = %name, failures, down_for = ?down, "watch recovered");
                }
                match ev {
                    watcher::Event::Init => {
                        if lists > 0 {
                            shared
                                .metrics
                                .watch_restarts
                                .with_label_values(&[resource])
                                .inc();
                        }
                        lists += 1;
                        relist = Some(HashSet::new());
                    }
                    watcher::Event::InitApply(o) => {
                        if let Some(k) = edge.key(&o) {
                            if let Some(s) = relist.as_mut() {
                                s.insert(k.clone());
                            }
                            known.insert(k);
                        }
                        out.extend(edge.apply(o));
                    }
                    watcher::Event::InitDone => {
                        let seen = relist.take().unwrap_or_default();
                        let gone: Vec<E::Key> = known
                            .iter()
                            .filter(|k| !seen.contains(*k))
                            .cloned()
                            .collect();
                        for k in gone {
                            out.extend(edge.delete(k));
                        }
                        out.extend(edge.listed(&name));
                        known = seen;
                        shared.health.synced(&name);
                        debug!(watch = %name, objects = known.len(), "initial list done");
                    }
                    watcher::Event::Apply(o) => {
                        shared.health.ok(&name);
                        if let Some(k) = edge.key(&o) {
                            known.insert(k);
                        }
                        out.extend(edge.apply(o));
                    }
                    watcher::Event::Delete(o) => {
                        shared.health.ok(&name);
                        if let Some(k) = edge.key(&o) {
                            known.remove(&k);
                            out.extend(edge.delete(k));
                        }
                    }
                }
            }
        }
        for i in out {
            if tx.send(i).await.is_err() {
                return;
            }
        }
        if !shared.ready.load(Ordering::Acquire) && shared.health.all_synced() {
            shared.ready.store(true, Ordering::Release);
            info!("initial lists done; ready");
        }
    }
}

fn namespaced<K>(client: &kube::Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
    K::DynamicType: Default,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The ApiResource of Slinky NodeSets.
pub fn nodeset_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("slinky.slurm.net", "v1beta1", "NodeSet"),
        "nodesets",
    )
}

/// What the watches watch, checked from the flags by the one conversion
/// ([`Settings::try_from`](crate::settings::Settings)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchSettings {
    /// The namespaces whose pods, Secrets, ConfigMaps and NodeSets are
    /// watched, one watch each; `[None]`: every namespace.
    pub namespaces: Vec<Option<String>>,
    /// Label selector restricting the pods watched.
    pub pod_selector: Option<String>,
    /// Namespace of the agent's ServiceAccount and DaemonSet.
    pub agent_namespace: String,
    /// Name of the agent DaemonSet.
    pub agent_daemonset: String,
    /// Workload kinds whose pods remediation may evict: their objects are
    /// watched (a Deployment's ReplicaSets too); none by default.
    pub workload_kinds: std::collections::BTreeSet<WorkloadKind>,
}

impl WatchSettings {
    /// The workload resources to watch: a Deployment's pods belong to its
    /// ReplicaSets, so Deployments need the ReplicaSets watched too.
    fn workload_resources(&self) -> Vec<&'static str> {
        let k = &self.workload_kinds;
        let mut out = Vec::new();
        if k.contains(&WorkloadKind::Deployment) {
            out.push("deployments");
        }
        if k.contains(&WorkloadKind::Deployment) || k.contains(&WorkloadKind::ReplicaSet) {
            out.push("replicasets");
        }
        if k.contains(&WorkloadKind::StatefulSet) {
            out.push("statefulsets");
        }
        if k.contains(&WorkloadKind::DaemonSet) {
            out.push("daemonsets");
        }
        out
    }
}

/// Starts every watch.
pub fn spawn_all(
    client: &kube::Client,
    settings: &WatchSettings,
    shared: Arc<Shared>,
    agents: Arc<AgentPods>,
    tx: mpsc::Sender<Input>,
    shutdown: Shutdown,
) -> Vec<(&'static str, JoinHandle<()>)> {
    let mut out = Vec::new();
    let workload_resources = settings.workload_resources();
    let WatchSettings {
        namespaces,
        pod_selector,
        agent_namespace,
        agent_daemonset,
        workload_kinds: _,
    } = settings;
    let wc = || watcher::Config::default();
    let suffix = |ns: &Option<String>| ns.as_deref().map(|n| format!("/{n}")).unwrap_or_default();
    // Every watch is registered before any starts: readiness (and with it
    // remediation) must never see a subset of the watches synced. The
    // NodeSet watches take part: remediation's recovery reads its persisted
    // attempts from the NodeSets, and an incomplete list would make it take
    // live drains for orphans.
    for ns in namespaces {
        for kind in ["pods", "secrets", "configmaps", "nodesets"]
            .into_iter()
            .chain(workload_resources.iter().copied())
        {
            shared
                .health
                .register(&format!("{kind}{}", suffix(ns)), true);
        }
    }
    shared.health.register("nodes", true);
    shared.health.register("agents", true);
    shared.health.register("agent-daemonset", true);
    for ns in namespaces {
        let mut pc = wc();
        if let Some(sel) = pod_selector {
            pc = pc.labels(sel);
        }
        let name = format!("pods{}", suffix(ns));
        out.push((
            "watch-pods",
            tokio::spawn(run_watch(
                namespaced::<Pod>(client, ns.as_deref()),
                pc,
                name,
                "pods",
                PodEdge {
                    interner: Interner::default(),
                },
                shared.clone(),
                tx.clone(),
                shutdown.clone(),
            )),
        ));
        let name = format!("secrets{}", suffix(ns));
        out.push((
            "watch-secrets",
            tokio::spawn(run_watch(
                namespaced::<Secret>(client, ns.as_deref()),
                wc(),
                name,
                "secrets",
                SourceEdge::new(mountguard_core::SourceKind::Secret, convert::secret),
                shared.clone(),
                tx.clone(),
                shutdown.clone(),
            )),
        ));
        let name = format!("configmaps{}", suffix(ns));
        out.push((
            "watch-configmaps",
            tokio::spawn(run_watch(
                namespaced::<ConfigMap>(client, ns.as_deref()),
                wc(),
                name,
                "configmaps",
                SourceEdge::new(mountguard_core::SourceKind::ConfigMap, convert::config_map),
                shared.clone(),
                tx.clone(),
                shutdown.clone(),
            )),
        ));
        for resource in &workload_resources {
            let name = format!("{resource}{}", suffix(ns));
            let (sh, tx, sd) = (shared.clone(), tx.clone(), shutdown.clone());
            let handle = match *resource {
                "deployments" => tokio::spawn(run_watch(
                    namespaced::<Deployment>(client, ns.as_deref()),
                    wc(),
                    name,
                    "deployments",
                    WorkloadEdge {
                        kind: WorkloadKind::Deployment,
                        convert: workloads::from_deployment,
                    },
                    sh,
                    tx,
                    sd,
                )),
                "replicasets" => tokio::spawn(run_watch(
                    namespaced::<ReplicaSet>(client, ns.as_deref()),
                    wc(),
                    name,
                    "replicasets",
                    WorkloadEdge {
                        kind: WorkloadKind::ReplicaSet,
                        convert: workloads::from_replicaset,
                    },
                    sh,
                    tx,
                    sd,
                )),
                "statefulsets" => tokio::spawn(run_watch(
                    namespaced::<StatefulSet>(client, ns.as_deref()),
                    wc(),
                    name,
                    "statefulsets",
                    WorkloadEdge {
                        kind: WorkloadKind::StatefulSet,
                        convert: workloads::from_statefulset,
                    },
                    sh,
                    tx,
                    sd,
                )),
                _ => tokio::spawn(run_watch(
                    namespaced::<DaemonSet>(client, ns.as_deref()),
                    wc(),
                    name,
                    "daemonsets",
                    WorkloadEdge {
                        kind: WorkloadKind::DaemonSet,
                        convert: workloads::from_daemonset,
                    },
                    sh,
                    tx,
                    sd,
                )),
            };
            out.push(("watch-workloads", handle));
        }
        out.push((
            "watch-nodesets",
            tokio::spawn(run_nodesets(
                client.clone(),
                ns.clone(),
                shared.clone(),
                tx.clone(),
                shutdown.clone(),
            )),
        ));
    }
    out.push((
        "watch-nodes",
        tokio::spawn(run_watch(
            Api::<Node>::all(client.clone()),
            wc(),
            "nodes".into(),
            "nodes",
            NodeEdge,
            shared.clone(),
            tx.clone(),
            shutdown.clone(),
        )),
    ));
    out.push((
        "watch-agent-daemonset",
        tokio::spawn(run_watch(
            Api::<DaemonSet>::namespaced(client.clone(), agent_namespace),
            wc().fields(&format!("metadata.name={agent_daemonset}")),
            "agent-daemonset".into(),
            "agent_daemonset",
            AgentEdge {
                agents: agents.clone(),
                daemonset: agent_daemonset.clone(),
            },
            shared.clone(),
            tx.clone(),
            shutdown.clone(),
        )),
    ));
    out.push((
        "watch-agents",
        tokio::spawn(run_watch(
            Api::<Pod>::namespaced(client.clone(), agent_namespace),
            wc(),
            "agents".into(),
            "agent_pods",
            AgentEdge {
                agents,
                daemonset: agent_daemonset.clone(),
            },
            shared,
            tx,
            shutdown,
        )),
    ));
    out
}

/// How often an absent NodeSet CRD is looked for again.
pub const NODESET_RETRY: Duration = Duration::from_secs(300);

/// Watches NodeSets once the CRD exists (probed with a one-item list; a
/// 404 means the CRD is absent: NodeSet features off, probed again every
/// [`NODESET_RETRY`]).
async fn run_nodesets(
    client: kube::Client,
    ns: Option<String>,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Input>,
    mut shutdown: Shutdown,
) {
    let ar = nodeset_resource();
    let api: Api<DynamicObject> = match &ns {
        Some(n) => Api::namespaced_with(client.clone(), n, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let name = format!(
        "nodesets{}",
        ns.as_deref().map(|n| format!("/{n}")).unwrap_or_default()
    );
    let mut logged = false;
    loop {
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 404 => {
                if !logged {
                    info!(
                        "NodeSet CRD (slinky.slurm.net/v1beta1) not found: NodeSet features off; looking again every 5 minutes"
                    );
                    logged = true;
                    // No CRD: the (empty) list is complete.
                    if tx.send(Input::NodeSetsSynced(name.clone())).await.is_err() {
                        return;
                    }
                    mark_synced(&shared, &name);
                }
                tokio::select! {
                    _ = shutdown.wait() => return,
                    _ = tokio::time::sleep(NODESET_RETRY) => {}
                }
            }
            Err(e) => {
                shared.metrics.api_error("list_nodesets");
                shared.health.error(&name);
                warn!(error = %e, "listing NodeSets failed; remediation waits until they are listed; retrying");
                tokio::select! {
                    _ = shutdown.wait() => return,
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        }
    }
    info!("watching NodeSets");
    let stream_api = api;
    run_dynamic(stream_api, ar, name, shared, tx, shutdown).await;
}

async fn run_dynamic(
    api: Api<DynamicObject>,
    ar: ApiResource,
    name: String,
    shared: Arc<Shared>,
    tx: mpsc::Sender<Input>,
    mut shutdown: Shutdown,
) {
    // DynamicObject needs the ApiResource as its dynamic type.
    let mut stream = kube::runtime::watcher::watcher(api, watcher::Config::default()).boxed();
    let mut retry = Retry::default();
    let _ = ar;
    let mut edge = NodeSetEdge;
    let mut known: HashSet<NodeSetKey> = HashSet::new();
    let mut relist: Option<HashSet<NodeSetKey>> = None;
    let mut listed = false;
    loop {
        let ev = tokio::select! {
            _ = shutdown.wait() => return,
            ev = stream.try_next() => ev,
        };
        let mut out = Vec::new();
        match ev {
            Ok(None) => return,
            Err(e) => {
                shared.metrics.api_error("watch_nodesets");
                shared
                    .metrics
                    .watch_restarts
                    .with_label_values(&["nodesets"])
                    .inc();
                shared.health.error(&name);
                let (delay, _) = retry.failed(Instant::now());
                debug!(watch = %name, error = %e, retry_in = ?delay, "NodeSet watch failed; retrying");
                tokio::select! {
                    _ = shutdown.wait() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
            Ok(Some(watcher::Event::Init)) => relist = Some(HashSet::new()),
            Ok(Some(watcher::Event::InitApply(o))) | Ok(Some(watcher::Event::Apply(o))) => {
                if let Some(k) = edge.key(&o) {
                    if let Some(s) = relist.as_mut() {
                        s.insert(k.clone());
                    }
                    known.insert(k);
                }
                out.extend(edge.apply(o));
            }
            Ok(Some(watcher::Event::InitDone)) => {
                retry.recovered(Instant::now());
                let seen = relist.take().unwrap_or_default();
                for k in known.iter().filter(|k| !seen.contains(*k)) {
                    out.extend(edge.delete(k.clone()));
                }
                known = seen;
                // In band, after every object of the list: the evaluation
                // marks its snapshots complete only from here on.
                out.push(Input::NodeSetsSynced(name.clone()));
                listed = true;
            }
            Ok(Some(watcher::Event::Delete(o))) => {
                if let Some(k) = edge.key(&o) {
                    known.remove(&k);
                    out.extend(edge.delete(k));
                }
            }
        }
        for i in out {
            if tx.send(i).await.is_err() {
                return;
            }
        }
        if std::mem::take(&mut listed) {
            mark_synced(&shared, &name);
        }
    }
}

/// Marks watch `name` synced, and the replica ready once every watch is.
fn mark_synced(shared: &Shared, name: &str) {
    shared.health.synced(name);
    if !shared.ready.load(Ordering::Acquire) && shared.health.all_synced() {
        shared.ready.store(true, Ordering::Release);
        info!("initial lists done; ready");
    }
}

mod edges;

use edges::{AgentEdge, Edge, NodeEdge, NodeSetEdge, PodEdge, SourceEdge, WorkloadEdge};

#[cfg(test)]
mod retry_tests {
    use super::*;

    #[test]
    fn backoff_grows_until_the_watch_works_again_and_logs_once_per_streak() {
        let t0 = Instant::now();
        let mut r = Retry::default();
        let mut delays = Vec::new();
        let mut starts = 0;
        for i in 0..8 {
            let (d, first) = r.failed(t0 + Duration::from_secs(i));
            delays.push(d.as_millis());
            starts += usize::from(first);
        }
        assert_eq!(delays, [800, 1600, 3200, 6400, 12800, 25600, 30000, 30000]);
        assert_eq!(starts, 1, "one streak, one line");
        assert_eq!(
            r.recovered(t0 + Duration::from_secs(40)),
            Some((8, Duration::from_secs(40)))
        );
        // Nothing to report without a streak; a new streak starts over.
        assert_eq!(r.recovered(t0 + Duration::from_secs(41)), None);
        assert_eq!(
            r.failed(t0 + Duration::from_secs(50)),
            (Duration::from_millis(800), true)
        );
    }
}
