//! The evaluation task: owns the index, the engine state and the published
//! verdicts. Inputs (watch deltas, accepted reports) arrive on one channel
//! and are coalesced for a short window ([`COALESCE`]); each batch
//! re-evaluates only the pods it touches (`pods_referencing`,
//! `pods_on_node`, `affected_by_pod`). Time is read here and passed to the
//! engine.
//!
//! Nothing is evaluated before every watch finished its initial list
//! (missing sources would read as SourceMissing) or while this replica
//! does not act. The health of the Secret and ConfigMap watches is an input
//! of the engine: while one is failing, the engine's API rule publishes
//! verdicts other than Fresh and Skipped as `Unverifiable/ApiUnavailable`
//! (API trouble never turns a mount Stale).

use foldhash::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use kube::api::DynamicObject;
use mountguard_inventory::NodeInventory;
use tokio::sync::{mpsc, watch as tokio_watch};
use tracing::{debug, info};

use super::events::{EventRequest, RateLimiter, Tracker};
use super::metrics::{MountLabels, MountSeries, StateCounts};
use super::shared::{Shared, Shutdown};
use super::status::PublishedPod;
use super::workloads::WorkloadObject;
use mountguard_core::PodUid;
use mountguard_core::index::ClusterIndex;
use mountguard_core::model::{ObservedNode, PodModel, SourceContent, SourceRef};
use mountguard_core::verdict::{
    ApiHealth, Engine, EngineState, PodVerdicts, State, UnverifiableReason, Verdict,
};

/// How long a batch collects further inputs after its first one.
pub const COALESCE: Duration = Duration::from_millis(100);
/// Period of the housekeeping tick (inventory ages, node metrics, watch
/// health).
pub const TICK: Duration = Duration::from_secs(2);

/// An input of the evaluation task.
#[derive(Debug)]
pub enum Input {
    /// A pod added or changed.
    Pod(Box<PodModel>),
    /// A pod deleted (UID).
    PodDeleted(PodUid),
    /// A Secret or ConfigMap added or changed (content already hashed).
    Source(SourceRef, SourceContent),
    /// A Secret or ConfigMap deleted.
    SourceDeleted(SourceRef),
    /// A Node deleted.
    NodeDeleted(String),
    /// A NodeSet added or changed (`namespace/name`).
    NodeSet(String, Arc<DynamicObject>),
    /// A NodeSet deleted.
    NodeSetDeleted(String),
    /// NodeSet watch `name` finished a list: every NodeSet it lists was
    /// sent before this (or the CRD is absent).
    NodeSetsSynced(String),
    /// A Deployment, ReplicaSet, StatefulSet or DaemonSet added or changed
    /// (`<kind>/<namespace>/<name>`).
    Workload(String, Arc<WorkloadObject>),
    /// A workload deleted.
    WorkloadDeleted(String),
    /// Workload watch `name` finished a list: every object it lists was
    /// sent before this.
    WorkloadsListed(String),
    /// An accepted inventory, with the report handler's in-flight permit
    /// (released once the inventory is in the index: parsed inventories
    /// waiting for the evaluation are bounded).
    Inventory(
        Box<NodeInventory>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ),
    /// A heartbeat (or a resent inventory) for the held generation.
    Heartbeat {
        /// Node.
        node: String,
        /// Generation.
        generation: u64,
        /// Scan time.
        scanned_at: Timestamp,
    },
    /// Forget every report and history (leadership changed).
    Reset,
    /// The admission webhook asks what the view knows of a name; answered
    /// as it arrives, after the inputs before it were applied.
    Admission(super::admission::Query),
}

/// What remediation sees after each evaluation batch of the acting
/// replica.
#[derive(Debug, Clone, Default)]
pub struct EvaluationSnapshot {
    /// When the batch was evaluated.
    pub at: Option<Timestamp>,
    /// Pods with at least one verdict other than Fresh and Skipped.
    pub verdicts: Vec<PodVerdicts>,
    /// Every pod controlled by a NodeSet.
    pub nodeset_pods: Vec<Arc<PodModel>>,
    /// Every pod controlled by a ReplicaSet, StatefulSet or DaemonSet
    /// (only while workload kinds are watched: empty without workloads).
    pub workload_pods: Vec<Arc<PodModel>>,
    /// The watched workloads (Deployments, ReplicaSets, StatefulSets,
    /// DaemonSets of the kinds enabled).
    pub workloads: Vec<Arc<WorkloadObject>>,
    /// Every workload watch finished its first list before this snapshot
    /// (true when none is watched): `workloads` is complete, as
    /// `nodesets_synced` says of `nodesets`.
    pub workloads_synced: bool,
    /// When the inventory (or the latest heartbeat) of each node running
    /// one of `nodeset_pods` or `workload_pods` was scanned.
    pub scanned_at: HashMap<Arc<str>, Timestamp>,
    /// Every NodeSet (`slinky.slurm.net/v1beta1`), empty when the CRD is
    /// absent.
    pub nodesets: Vec<Arc<DynamicObject>>,
    /// Every NodeSet watch finished its first list before this snapshot:
    /// `nodesets` is complete. Until then remediation reads, plans and
    /// writes nothing (an attempt record not listed yet would be taken for
    /// lost).
    pub nodesets_synced: bool,
}

/// State of the evaluation task.
#[derive(Debug)]
pub struct EvalTask {
    engine: Engine,
    shared: Arc<Shared>,
    index: ClusterIndex,
    state: EngineState,
    series: MountSeries,
    tracker: Tracker,
    limiter: RateLimiter,
    events: mpsc::Sender<EventRequest>,
    snapshots: tokio_watch::Sender<Arc<EvaluationSnapshot>>,
    applied_gen: HashMap<Arc<str>, u64>,
    nodesets: HashMap<String, Arc<DynamicObject>>,
    workloads: HashMap<String, Arc<WorkloadObject>>,
    workloads_listed: std::collections::HashSet<String>,
    nodesets_listed: std::collections::HashSet<String>,
    baselined: HashSet<Arc<str>>,
    too_old: HashSet<Arc<str>>,
    reporting: HashMap<Arc<str>, bool>,
    evaluated: bool,
    pending: Pending,
    /// Immutable Secrets and ConfigMaps that went away (deleted, or
    /// replaced by an object with a new UID) while registered pods
    /// referenced them, and when: nodes of those pods keep serving them
    /// (`admission`). Dropped once no pod registered before then holds
    /// the name.
    gone_immutable: HashMap<SourceRef, Timestamp>,
}

/// What the inputs received since the last evaluation touched.
#[derive(Debug, Default)]
struct Pending {
    /// Pods to re-evaluate.
    dirty: HashSet<PodUid>,
    /// Everything is to be re-evaluated.
    full: bool,
    /// Nodes that sent a new inventory.
    reported: Vec<Arc<str>>,
    /// Sources added, changed or deleted.
    touched_sources: Vec<SourceRef>,
}

impl EvalTask {
    /// A task with an empty index.
    pub fn new(
        engine: Engine,
        shared: Arc<Shared>,
        events: mpsc::Sender<EventRequest>,
        snapshots: tokio_watch::Sender<Arc<EvaluationSnapshot>>,
    ) -> Self {
        Self {
            engine,
            shared,
            index: ClusterIndex::new(),
            state: EngineState::default(),
            series: MountSeries::default(),
            tracker: Tracker::default(),
            limiter: RateLimiter::new(Instant::now()),
            events,
            snapshots,
            applied_gen: HashMap::default(),
            nodesets: HashMap::default(),
            workloads: HashMap::default(),
            workloads_listed: std::collections::HashSet::new(),
            nodesets_listed: std::collections::HashSet::new(),
            baselined: HashSet::default(),
            too_old: HashSet::default(),
            reporting: HashMap::default(),
            evaluated: false,
            pending: Pending::default(),
            gone_immutable: HashMap::default(),
        }
    }

    /// The index (tests and benchmarks).
    pub fn index(&self) -> &ClusterIndex {
        &self.index
    }

    /// Applies a batch of inputs and evaluates what they touch at `now`.
    pub fn apply_batch(&mut self, batch: Vec<Input>, now: Timestamp) {
        for input in batch {
            self.receive(input, now);
        }
        self.finish_batch(now);
    }

    /// Applies one input to the index (an inventory is converted and its
    /// in-flight permit released at once) and records what it touches;
    /// [`Self::finish_batch`] evaluates it. `now` is when it arrived.
    pub fn receive(&mut self, input: Input, now: Timestamp) {
        let mut pending = std::mem::take(&mut self.pending);
        self.receive_into(&mut pending, input, now);
        self.pending = pending;
    }

    fn receive_into(&mut self, pend: &mut Pending, input: Input, now: Timestamp) {
        let dirty = &mut pend.dirty;
        match input {
            Input::Pod(p) => {
                let p = *p;
                if let Some(old) = self
                    .index
                    .pod_id(&p.uid)
                    .and_then(|id| self.index.pod(id))
                    .cloned()
                {
                    self.mark(dirty, self.index.affected_by_pod(&old));
                }
                dirty.insert(p.uid.clone());
                let id = self.index.apply_pod(p);
                if let Some(newp) = self.index.pod(id).cloned() {
                    self.mark(dirty, self.index.affected_by_pod(&newp));
                }
            }
            Input::PodDeleted(uid) => {
                if let Some(old) = self.index.delete_pod(&uid) {
                    self.mark(dirty, self.index.affected_by_pod(&old));
                }
                dirty.insert(uid);
            }
            Input::Source(r, c) => {
                // Re-created while this watch was away (a re-list shows
                // only the new object): the previous one went away now.
                if self
                    .index
                    .source(&r)
                    .is_some_and(|o| o.uid.is_some() && o.uid != c.uid)
                {
                    self.note_gone(&r, now);
                }
                let differs = self.index.source(&r).is_none_or(|o| {
                    o.content_digest != c.content_digest
                        || o.uid != c.uid
                        || o.immutable != c.immutable
                });
                self.index.apply_source(r.clone(), c);
                pend.touched_sources.push(r.clone());
                // Record when the content changed as it arrives, not when
                // a pod referencing it is next evaluated: a subPath or env
                // verdict compares this time with a container's start.
                self.engine
                    .observe_source(&self.index, &mut self.state, &r, now);
                if differs {
                    let ids = self.index.pods_referencing(&r).to_vec();
                    self.mark(dirty, ids);
                }
            }
            Input::SourceDeleted(r) => {
                pend.touched_sources.push(r.clone());
                self.note_gone(&r, now);
                if self.index.delete_source(&r) {
                    self.engine
                        .observe_source(&self.index, &mut self.state, &r, now);
                    let ids = self.index.pods_referencing(&r).to_vec();
                    self.mark(dirty, ids);
                }
            }
            Input::NodeDeleted(n) => {
                if self.index.delete_inventory(&n) {
                    let ids = self.index.pods_on_node(&n).to_vec();
                    self.mark(dirty, ids);
                }
                self.applied_gen.remove(n.as_str());
                let _ = self
                    .shared
                    .metrics
                    .node_inventory_timestamp
                    .remove_label_values(&[&n]);
            }
            Input::NodeSet(k, o) => {
                self.nodesets.insert(k, o);
            }
            Input::NodeSetDeleted(k) => {
                self.nodesets.remove(&k);
            }
            Input::NodeSetsSynced(name) => {
                self.nodesets_listed.insert(name);
            }
            Input::Workload(k, o) => {
                if let Some(old) = self.workloads.insert(k, o.clone()) {
                    self.publish_deployment_of(&old, false);
                }
                self.publish_deployment_of(&o, true);
            }
            Input::WorkloadDeleted(k) => {
                if let Some(old) = self.workloads.remove(&k) {
                    self.publish_deployment_of(&old, false);
                }
            }
            Input::WorkloadsListed(name) => {
                self.workloads_listed.insert(name);
            }
            Input::Inventory(inv, _permit) => {
                if self
                    .applied_gen
                    .get(inv.node.as_str())
                    .is_some_and(|g| *g > inv.generation)
                {
                    return;
                }
                let obs = ObservedNode::from_inventory(&inv, &mut self.index.interner);
                let node = obs.node.clone();
                self.applied_gen.insert(node.clone(), inv.generation);
                self.set_timestamp(&node, inv.scanned_at);
                self.index.apply_inventory(obs);
                let ids = self.index.pods_on_node(&node).to_vec();
                self.mark(dirty, ids);
                pend.reported.push(node);
            }
            Input::Heartbeat {
                node,
                generation,
                scanned_at,
            } => {
                if self.applied_gen.get(node.as_str()) != Some(&generation) {
                    return;
                }
                let Some(mut obs) = self.index.inventory(&node).cloned() else {
                    return;
                };
                if scanned_at <= obs.scanned_at {
                    return;
                }
                obs.scanned_at = scanned_at;
                self.index.apply_inventory(obs);
                self.set_timestamp(&node, scanned_at);
                // A newer scan time changes only verdicts that depend
                // on it (Propagating/Stale, and inventory age, which
                // the age check below handles): re-evaluate the pods
                // of the node that are not all Fresh or Skipped.
                let store = self.shared.verdicts.read().unwrap();
                for id in self.index.pods_on_node(&node) {
                    let Some(p) = self.index.pod(*id) else {
                        continue;
                    };
                    let settled = store.pods.get(&p.uid).is_some_and(|pp| {
                        pp.pv
                            .verdicts
                            .iter()
                            .all(|v| matches!(v.state, State::Fresh | State::Skipped(_)))
                    });
                    if !settled {
                        dirty.insert(p.uid.clone());
                    }
                }
            }
            Input::Reset => {
                self.reset();
                pend.full = true;
            }
            Input::Admission(q) => {
                let _ = q.reply.send(self.name_view(&q.source, q.operation));
            }
        }
    }

    /// What the view knows of `r` for an admission review of `operation`
    /// (see [`mountguard_core::admission`]): for a delete, every registered
    /// pod referencing the name; for a create, whether the previous object
    /// under the name was immutable (still in the view, or gone while held)
    /// and the pods holding it.
    fn name_view(
        &self,
        r: &SourceRef,
        operation: mountguard_core::admission::Operation,
    ) -> mountguard_core::admission::NameView {
        use mountguard_core::admission::{NameView, Operation, holders};
        let current_immutable = self.index.source(r).map(|c| c.immutable);
        match operation {
            Operation::Delete => NameView {
                holders: holders(&self.index, r, None),
                previous_immutable: current_immutable == Some(true),
            },
            Operation::Create => match (current_immutable, self.gone_immutable.get(r)) {
                // Still in the view: the create raced the watch's delete
                // event (or the object exists, and the create fails).
                (Some(true), _) => NameView {
                    holders: holders(&self.index, r, None),
                    previous_immutable: true,
                },
                (_, Some(gone)) => NameView {
                    holders: holders(&self.index, r, Some(*gone)),
                    previous_immutable: true,
                },
                _ => NameView::default(),
            },
        }
    }

    /// Records that the object under `r` goes away at `now`, when it is
    /// immutable and pods reference its name.
    fn note_gone(&mut self, r: &SourceRef, now: Timestamp) {
        if self.index.source(r).is_some_and(|o| o.immutable)
            && !self.index.pods_referencing(r).is_empty()
        {
            self.gone_immutable.insert(r.clone(), now);
        }
    }

    /// Forgets the immutable objects that went away and that no pod
    /// registered before then still holds.
    fn prune_gone_immutable(&mut self) {
        if self.gone_immutable.is_empty() {
            return;
        }
        let index = &self.index;
        self.gone_immutable
            .retain(|r, gone| mountguard_core::admission::is_held(index, r, Some(*gone)));
    }

    /// Evaluates what the inputs received since the last batch touched, at
    /// `now`.
    pub fn finish_batch(&mut self, now: Timestamp) {
        let Pending {
            mut dirty,
            mut full,
            reported,
            touched_sources,
        } = std::mem::take(&mut self.pending);
        self.prune_gone_immutable();
        if !self.shared.is_ready() || !self.shared.is_acting() {
            return;
        }
        let api = if self.shared.health.sources_degraded() {
            ApiHealth::Unavailable
        } else {
            ApiHealth::Available
        };
        if api != self.engine.api_health() {
            info!(
                degraded = api == ApiHealth::Unavailable,
                "Secret/ConfigMap watch health changed; re-evaluating everything"
            );
            self.engine.set_api_health(api);
            full = true;
        }
        // Inventories that aged past the limit (or recovered).
        let max_age = self.engine.config().inventory_max_age;
        let nodes: Vec<Arc<str>> = self.index.nodes_with_pods().cloned().collect();
        for n in &nodes {
            let old = self
                .index
                .inventory(n)
                .is_some_and(|i| now.duration_since(i.scanned_at) > max_age);
            let was = self.too_old.contains(n);
            if old != was {
                if old {
                    self.too_old.insert(n.clone());
                } else {
                    self.too_old.remove(n);
                }
                let ids = self.index.pods_on_node(n).to_vec();
                self.mark(&mut dirty, ids);
            }
        }
        if !self.evaluated {
            full = true;
        }
        if full || !dirty.is_empty() {
            self.evaluate(full, dirty, now);
        }
        if !full {
            self.publish_sources(touched_sources);
        }
        for n in reported {
            if self.index.inventory(&n).is_some() {
                self.baselined.insert(n);
            }
        }
        if full {
            // Every node with an inventory has now been evaluated once.
            let with_inv: Vec<Arc<str>> = nodes
                .into_iter()
                .filter(|n| self.index.inventory(n).is_some())
                .collect();
            self.baselined.extend(with_inv);
        }
        self.update_node_metrics(now);
    }

    fn mark(&self, dirty: &mut HashSet<PodUid>, ids: Vec<mountguard_core::PodId>) {
        for id in ids {
            if let Some(p) = self.index.pod(id) {
                dirty.insert(p.uid.clone());
            }
        }
    }

    fn set_timestamp(&self, node: &str, t: Timestamp) {
        self.shared
            .metrics
            .node_inventory_timestamp
            .with_label_values(&[node])
            .set(t.as_millisecond() as f64 / 1000.0);
    }

    fn reset(&mut self) {
        let nodes: Vec<Arc<str>> = self.applied_gen.keys().cloned().collect();
        for n in nodes {
            self.index.delete_inventory(&n);
            let _ = self
                .shared
                .metrics
                .node_inventory_timestamp
                .remove_label_values(&[&n]);
        }
        self.applied_gen.clear();
        self.state = EngineState::default();
        self.series.clear(&self.shared.metrics);
        self.tracker.clear();
        self.baselined.clear();
        self.too_old.clear();
        self.evaluated = false;
        let mut store = self.shared.verdicts.write().unwrap();
        store.pods.clear();
        store.sources.clear();
        store.reporting.clear();
        store.unscheduled.clear();
        store.evaluated = false;
    }

    /// What the rollout endpoint says about a source: its current
    /// fingerprint (from the engine's history), UID and change time.
    fn source_item(&self, r: &SourceRef) -> Option<mountguard_core::rollout::SourceItem> {
        let content = self.index.source(r)?;
        let h = self.state.sources.get(r);
        Some(mountguard_core::rollout::SourceItem {
            kind: r.kind.as_str().to_string(),
            namespace: r.namespace.to_string(),
            name: r.name.to_string(),
            present: true,
            fingerprint: h.and_then(|h| h.fingerprint.clone()),
            uid: content.uid.as_deref().map(str::to_string),
            changed_at: h.and_then(|h| h.content_changed_at).map(|t| t.to_string()),
        })
    }

    /// Publishes the current fingerprints of `refs` (all sources when
    /// `None`) for the rollout endpoint.
    fn publish_sources(&self, refs: Vec<SourceRef>) {
        if refs.is_empty() {
            return;
        }
        let items: Vec<(SourceRef, Option<mountguard_core::rollout::SourceItem>)> = refs
            .into_iter()
            .map(|r| {
                let item = self.source_item(&r);
                (r, item)
            })
            .collect();
        let mut store = self.shared.verdicts.write().unwrap();
        for (r, item) in items {
            match item {
                Some(i) => {
                    store.sources.insert(r, i);
                }
                None => {
                    store.sources.remove(&r);
                }
            }
        }
    }

    /// Publishes (or withdraws) which Deployment a ReplicaSet belongs to,
    /// for the rollout endpoint's Deployment targets.
    fn publish_deployment_of(&self, o: &WorkloadObject, present: bool) {
        let (Some(w), Some(d)) = (o.workload(), o.deployment.as_ref()) else {
            return;
        };
        if w.kind != mountguard_core::remediation::workload::WorkloadKind::ReplicaSet {
            return;
        }
        let key = (o.model.namespace.clone(), w.name.clone());
        let mut store = self.shared.verdicts.write().unwrap();
        if present {
            store.deployments.insert(key, d.clone());
        } else {
            store.deployments.remove(&key);
        }
    }

    /// Publishes the pods that are not scheduled yet (every pod on a full
    /// evaluation, else the batch's dirty ones) for the rollout endpoint.
    fn publish_unscheduled(&self, full: bool, dirty: &HashSet<PodUid>) {
        let pending = |p: &Arc<PodModel>| p.node().is_none() && !p.terminated;
        let mut store = self.shared.verdicts.write().unwrap();
        if full {
            store.unscheduled = self
                .index
                .pod_ids()
                .filter_map(|id| self.index.pod(id))
                .filter(|p| pending(p))
                .map(|p| (p.uid.clone(), p.clone()))
                .collect();
            return;
        }
        for uid in dirty {
            match self.index.pod_id(uid).and_then(|id| self.index.pod(id)) {
                Some(p) if pending(p) => {
                    store.unscheduled.insert(uid.clone(), p.clone());
                }
                _ => {
                    store.unscheduled.remove(uid);
                }
            }
        }
    }

    /// What `pv`'s verdicts were computed against.
    fn pod_check(&mut self, pv: &PodVerdicts) -> super::status::PodCheck {
        let fingerprints: Vec<Option<mountguard_core::Fingerprint>> = pv
            .pod
            .references()
            .iter()
            .map(|r| {
                self.index
                    .source(r)
                    .and(self.state.sources.get(r))
                    .and_then(|h| h.fingerprint.as_deref())
                    .and_then(parse_fingerprint)
            })
            .collect();
        super::status::PodCheck {
            scanned_at: pv
                .pod
                .node()
                .as_ref()
                .and_then(|n| self.index.inventory(n))
                .map(|i| i.scanned_at.into()),
            fingerprints: self.index.interner.intern_fingerprints(fingerprints),
        }
    }

    fn evaluate(&mut self, full: bool, dirty: HashSet<PodUid>, now: Timestamp) {
        let timer = Instant::now();
        let mut pods = Vec::new();
        let mut removed = Vec::new();
        if full {
            self.engine
                .evaluate_all_each(&self.index, &mut self.state, now, |pv| pods.push(pv));
            let live: HashSet<&PodUid> = pods.iter().map(|p| &p.pod.uid).collect();
            let store = self.shared.verdicts.read().unwrap();
            removed.extend(store.pods.keys().filter(|u| !live.contains(*u)).cloned());
        } else {
            let uids: Vec<&PodUid> = dirty.iter().collect();
            let ev = self
                .engine
                .evaluate_pods(&self.index, &mut self.state, &uids, now);
            pods = ev.pods;
            removed = ev.removed;
            // Unscheduled or terminated pods give no verdicts: drop theirs.
            let evaluated: HashSet<&PodUid> = pods.iter().map(|p| &p.pod.uid).collect();
            for u in &dirty {
                if !evaluated.contains(u) && !removed.contains(u) {
                    removed.push(u.clone());
                }
            }
        }
        let n = pods.len();
        let mut requests = Vec::new();
        // One write lock for the whole batch: a reader sees the batch
        // before or after, and the lock is not taken per pod.
        let shared = self.shared.clone();
        let mut store = shared.verdicts.write().unwrap();
        for pv in pods {
            let old = store
                .pods
                .get(&pv.pod.uid)
                .map(|p| counts_of(&p.pv))
                .unwrap_or_default();
            let check = self.pod_check(&pv);
            self.publish_pod(&pv, &check, &old, &mut requests);
            store.pods.insert(PublishedPod {
                pv,
                check: Some(check),
            });
        }
        for uid in &removed {
            let old = store.pods.remove(uid);
            let old = old.as_ref().map(|p| counts_of(&p.pv)).unwrap_or_default();
            self.series
                .update(&self.shared.metrics, uid, Vec::new(), &old, &[]);
            self.tracker.forget(uid);
            self.limiter.forget(uid);
        }
        store.evaluated = true;
        drop(store);
        self.publish_unscheduled(full, &dirty);
        if full {
            let all: Vec<SourceRef> = self.index.sources().map(|(r, _)| r.clone()).collect();
            let items: HashMap<SourceRef, mountguard_core::rollout::SourceItem> = all
                .iter()
                .filter_map(|r| self.source_item(r).map(|i| (r.clone(), i)))
                .collect();
            self.shared.verdicts.write().unwrap().sources = items;
        }
        self.series.flush(&self.shared.metrics);
        self.evaluated = true;
        let mono = Instant::now();
        for r in requests {
            let uid = PodUid::new(&r.uid);
            if !self.limiter.allow(&uid, mono) || self.events.try_send(r).is_err() {
                self.shared.metrics.events_suppressed.inc();
            }
        }
        let secs = timer.elapsed().as_secs_f64();
        self.shared.metrics.evaluation_duration.observe(secs);
        debug!(
            pods = n,
            removed = removed.len(),
            full,
            seconds = secs,
            "evaluated"
        );
        if self.snapshots.receiver_count() > 1 {
            let store = self.shared.verdicts.read().unwrap();
            let nodeset_pods: Vec<Arc<PodModel>> = self
                .index
                .pod_ids()
                .filter_map(|id| self.index.pod(id))
                .filter(|p| p.nodeset().is_some())
                .cloned()
                .collect();
            // Pods of workloads only while some are watched.
            let workload_pods: Vec<Arc<PodModel>> = if self.workloads.is_empty() {
                Vec::new()
            } else {
                self.index
                    .pod_ids()
                    .filter_map(|id| self.index.pod(id))
                    .filter(|p| super::workloads::remediable_kind(p))
                    .cloned()
                    .collect()
            };
            let scanned_at = nodeset_pods
                .iter()
                .chain(workload_pods.iter())
                .filter_map(|p| p.node().cloned())
                .filter_map(|n| {
                    let at = self.index.inventory(&n)?.scanned_at;
                    Some((n, at))
                })
                .collect();
            let snap = EvaluationSnapshot {
                at: Some(now),
                verdicts: store
                    .pods
                    .values()
                    .map(|p| &p.pv)
                    .filter(|pv| {
                        pv.verdicts
                            .iter()
                            .any(|v| !matches!(v.state, State::Fresh | State::Skipped(_)))
                    })
                    .cloned()
                    .collect(),
                nodeset_pods,
                workload_pods,
                workloads: self.workloads.values().cloned().collect(),
                workloads_synced: ["deployments", "replicasets", "statefulsets", "daemonsets"]
                    .iter()
                    .all(|r| self.shared.health.each_listed(r, &self.workloads_listed)),
                scanned_at,
                nodesets: self.nodesets.values().cloned().collect(),
                nodesets_synced: self
                    .shared
                    .health
                    .all_listed("nodesets", &self.nodesets_listed),
            };
            drop(store);
            let _ = self.snapshots.send(Arc::new(snap));
        }
    }

    fn publish_pod(
        &mut self,
        pv: &PodVerdicts,
        check: &super::status::PodCheck,
        old_counts: &[(&'static str, i64)],
        requests: &mut Vec<EventRequest>,
    ) {
        let pod = &pv.pod;
        let baselined = pod
            .node()
            .as_ref()
            .is_some_and(|n| self.baselined.contains(&**n));
        let mut labels: Vec<MountLabels> = Vec::new();
        for v in pv.verdicts.iter() {
            if has_series(&v.state) {
                labels.push(mount_labels(pv, v));
            }
            if let Some(reason) = self.tracker.observe(&pod.uid, v.id, &v.state, baselined) {
                requests.push(EventRequest {
                    namespace: pod.namespace().to_string(),
                    pod: pod.name.to_string(),
                    uid: pod.uid.to_string(),
                    reason,
                    message: event_message(pv, v, check),
                });
            }
        }
        let counts = counts_of(pv);
        self.series
            .update(&self.shared.metrics, &pod.uid, labels, old_counts, &counts);
    }

    fn update_node_metrics(&mut self, now: Timestamp) {
        let max_age = self.engine.config().inventory_max_age;
        let m = &self.shared.metrics;
        let mut seen: HashSet<Arc<str>> = HashSet::default();
        let (mut yes, mut no) = (0i64, 0i64);
        for n in self.index.nodes_with_pods() {
            let ok = self
                .index
                .inventory(n)
                .is_some_and(|i| now.duration_since(i.scanned_at) <= max_age);
            if ok {
                yes += 1;
            } else {
                no += 1;
            }
            seen.insert(n.clone());
            if self.reporting.get(n) != Some(&ok) {
                m.node_agent_reporting
                    .with_label_values(&[n])
                    .set(i64::from(ok));
                self.reporting.insert(n.clone(), ok);
            }
        }
        self.reporting.retain(|n, _| {
            let keep = seen.contains(n);
            if !keep {
                let _ = m.node_agent_reporting.remove_label_values(&[n]);
            }
            keep
        });
        {
            let mut store = self.shared.verdicts.write().unwrap();
            if store.reporting != self.reporting {
                store.reporting = self.reporting.clone();
            }
        }
        m.nodes.with_label_values(&["true"]).set(yes);
        m.nodes.with_label_values(&["false"]).set(no);
    }
}

/// A fingerprint as the engine's history spells it (12 hex characters).
fn parse_fingerprint(hex_text: &str) -> Option<mountguard_core::Fingerprint> {
    let mut fp = [0u8; mountguard_core::Fingerprint::LEN];
    hex::decode_to_slice(hex_text, &mut fp).ok()?;
    Some(mountguard_core::Fingerprint(fp))
}

/// Subjects per state name of one pod.
pub fn counts_of(pv: &PodVerdicts) -> StateCounts {
    let mut counts: StateCounts = Vec::new();
    for v in pv.verdicts.iter() {
        let name = v.state.name();
        match counts.iter_mut().find(|(s, _)| *s == name) {
            Some(c) => c.1 += 1,
            None => counts.push((name, 1)),
        }
    }
    counts
}

/// Whether a verdict gets a `mountguard_mount_state` series: every state
/// but Fresh and Skipped, except the node-level reasons `NoInventory` and
/// `InventoryTooOld` (every mount of the node would get one, e.g. 1.6
/// million series while a new leader waits for the first reports);
/// `mountguard_node_agent_reporting{node} == 0` says it once per node, and
/// `mountguard_mounts{state="Unverifiable"}` still counts them.
pub fn has_series(s: &State) -> bool {
    !matches!(
        s,
        State::Fresh
            | State::Skipped(_)
            | State::Unverifiable(UnverifiableReason::NoInventory)
            | State::Unverifiable(UnverifiableReason::InventoryTooOld)
    )
}

/// The `mountguard_mount_state` labels of a verdict.
pub fn mount_labels(pv: &PodVerdicts, v: &Verdict) -> MountLabels {
    let pod = &pv.pod;
    let volume = pv.subject(v).metric_label();
    let sources = pv.sources(v);
    let (kind, name) = match sources.first() {
        Some(r) => (r.kind.as_str().to_string(), r.name.to_string()),
        None => (String::new(), String::new()),
    };
    [
        pod.namespace().to_string(),
        pod.name.to_string(),
        pod.node_name().unwrap_or("").to_string(),
        volume,
        kind,
        name,
        v.state.name().to_string(),
        v.state.cause().unwrap_or("").to_string(),
    ]
}

/// The Event note of a verdict: subject, sources, fingerprints (of the
/// projected content, and of each source's content the verdict was
/// computed against), the node scan it was verified from, pinning pods,
/// the engine's explanation, and the advice.
pub fn event_message(pv: &PodVerdicts, v: &Verdict, check: &super::status::PodCheck) -> String {
    let view = v.view(pv);
    let mut m = format!("{} is {}", pv.subject(v).text(), v.state.tag());
    let sources: Vec<String> = view
        .sources
        .iter()
        .map(|s| format!("{} {}", s.kind, s.name))
        .collect();
    if !sources.is_empty() {
        m.push_str(&format!(" (source {})", sources.join(", ")));
    }
    if view.expected.is_some() || view.observed.is_some() {
        m.push_str(&format!(
            "; mounted {} vs current {}",
            view.observed.map_or("-".into(), |f| f.to_string()),
            view.expected.map_or("-".into(), |f| f.to_string())
        ));
    }
    let source_fps: Vec<String> = pv
        .sources(v)
        .iter()
        .filter_map(|r| check.source(&pv.pod, r).map(|fp| (r, fp)))
        .map(|(r, fp)| {
            format!(
                "{} {} {}",
                r.kind.as_str(),
                r.name,
                fp.map_or_else(|| "(absent)".to_string(), |f| f.to_string())
            )
        })
        .collect();
    if !source_fps.is_empty() {
        m.push_str(&format!("; source content {}", source_fps.join(", ")));
    }
    if let Some(t) = check.scanned_at {
        m.push_str(&format!("; node scanned at {}", t.get()));
    }
    if !view.pinned_by.is_empty() {
        m.push_str(&format!(
            "; kubelet cache pinned by pod(s) {}",
            view.pinned_by
                .iter()
                .map(|s| &**s)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some(msg) = view.message {
        m.push_str("; ");
        m.push_str(msg);
    }
    if let Some(a) = &view.advice {
        m.push_str(". ");
        m.push_str(a);
    }
    m
}

/// Runs the task until shutdown.
pub async fn run(mut task: EvalTask, mut rx: mpsc::Receiver<Input>, mut shutdown: Shutdown) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tick.tick() => {}
            m = rx.recv() => match m {
                Some(m) => {
                    // Each input is applied as it arrives (an inventory's
                    // in-flight permit goes back at once, so the report
                    // handler never waits for the window to close); the
                    // evaluation waits for the window.
                    task.receive(m, Timestamp::now());
                    let mut n = 1;
                    let deadline = tokio::time::Instant::now() + COALESCE;
                    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, rx.recv()).await {
                        task.receive(m, Timestamp::now());
                        n += 1;
                        if n >= 50_000 {
                            break;
                        }
                    }
                }
                None => return,
            },
        }
        task.finish_batch(Timestamp::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::live::metrics::Metrics;
    use mountguard_core::model::{SourceKind, VolumeSource};
    use mountguard_core::testkit::*;
    use mountguard_core::{Config, Fingerprinter};
    use mountguard_inventory::Plugin;
    use std::sync::atomic::Ordering;

    struct Rig {
        task: EvalTask,
        events: mpsc::Receiver<EventRequest>,
        shared: Arc<Shared>,
    }

    fn rig() -> Rig {
        let shared = Arc::new(Shared::new(Metrics::new()));
        shared.acting.store(true, Ordering::SeqCst);
        shared.ready.store(true, Ordering::SeqCst);
        let (etx, events) = mpsc::channel(100);
        let (stx, _srx) = tokio_watch::channel(Arc::new(EvaluationSnapshot::default()));
        let engine = Engine::new(Config::default(), Fingerprinter::new(&[1u8; 32]).unwrap());
        Rig {
            task: EvalTask::new(engine, shared.clone(), etx, stx),
            events,
            shared,
        }
    }

    fn secret(ix: &mut Interner, value: &[u8], uid: &str) -> Input {
        let r = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
        let c = SourceContent::from_plain(
            ix,
            true,
            [("slurm.key", value, false)],
            Some(uid),
            Some(ts("2026-11-30T09:00:00Z")),
        );
        Input::Source(r, c)
    }

    fn pod(uid: &str, name: &str, node: &str) -> Input {
        let p = PodB::new("slurm", name, uid, node)
            .volume(
                "etc",
                VolumeSource::Object(obj(SourceKind::Secret, "auth", &[], false)),
            )
            .build();
        Input::Pod(Box::new(p))
    }

    fn inv(node: &str, generation: u64, at: &str, pods: &[(&str, &[u8])]) -> Input {
        let mut b = NodeB::new(node, ts(at));
        for (uid, content) in pods {
            b = b.volume(
                uid,
                Plugin::Secret,
                "etc",
                &[("slurm.key", content)],
                ts("2026-11-30T09:00:00Z"),
            );
        }
        let mut i = b.inv;
        i.generation = generation;
        Input::Inventory(Box::new(i), None)
    }

    /// The rollout document of `target` as the endpoint would answer it.
    fn rollout_doc(
        r: &Rig,
        target: &mountguard_core::rollout::Target,
    ) -> mountguard_core::rollout::RolloutDoc {
        r.shared
            .verdicts
            .read()
            .unwrap()
            .rollout(target, true, true)
    }

    fn drain(rx: &mut mpsc::Receiver<EventRequest>) -> Vec<EventRequest> {
        let mut v = Vec::new();
        while let Ok(e) = rx.try_recv() {
            v.push(e);
        }
        v
    }

    fn metrics(r: &Rig) -> String {
        String::from_utf8(r.shared.metrics.encode()).unwrap()
    }

    use mountguard_core::model::Interner;

    fn ask(
        task: &mut EvalTask,
        r: &SourceRef,
        operation: mountguard_core::admission::Operation,
    ) -> (Vec<String>, bool) {
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        task.receive(
            Input::Admission(super::super::admission::Query {
                source: r.clone(),
                operation,
                reply,
            }),
            ts("2026-11-30T12:00:00Z"),
        );
        let v = rx.try_recv().expect("answered as it arrives");
        (
            v.holders
                .iter()
                .map(|h| format!("{}/{}", h.node, h.pod))
                .collect(),
            v.previous_immutable,
        )
    }

    /// The admission view: a delete sees every registered pod referencing
    /// the name; after an immutable Secret goes away, a create sees it as
    /// the previous immutable object held by the pods registered before
    /// that (not by one registered later); once those are gone the name is
    /// forgotten. A mutable object's deletion leaves nothing behind.
    #[test]
    fn the_admission_view_remembers_an_immutable_object_held_after_it_went_away() {
        use mountguard_core::admission::Operation::{Create, Delete};
        let mut r = rig();
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        r.task.apply_batch(
            vec![secret(&mut ix, b"k", "s1"), pod("u1", "w-0", "n1")],
            t0,
        );
        let auth = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
        assert_eq!(
            ask(&mut r.task, &auth, Delete),
            (vec!["n1/w-0".into()], true)
        );
        let t1 = ts("2026-11-30T10:10:00Z");
        r.task
            .apply_batch(vec![Input::SourceDeleted(auth.clone())], t1);
        // Registered after the Secret went away, on another node.
        let Input::Pod(mut late) = pod("u2", "w-1", "n2") else {
            unreachable!()
        };
        late.synced_at = Some(ts("2026-11-30T10:20:00Z").into());
        r.task.apply_batch(vec![Input::Pod(late)], t1);
        assert_eq!(
            ask(&mut r.task, &auth, Create),
            (vec!["n1/w-0".into()], true)
        );
        // The holder goes: the name is forgotten.
        r.task
            .apply_batch(vec![Input::PodDeleted(PodUid::new("u1"))], t1);
        assert_eq!(ask(&mut r.task, &auth, Create), (vec![], false));
        // A mutable ConfigMap deleted while referenced: nothing held.
        let cm = SourceRef::new(
            SourceKind::ConfigMap,
            ix.intern("slurm"),
            ix.intern("hooks"),
        );
        let content = SourceContent::from_plain(
            &mut ix,
            false,
            [("hook.sh", &b"x"[..], false)],
            Some("c1"),
            None,
        );
        let user = PodB::new("slurm", "w-2", "u3", "n1")
            .volume(
                "hooks",
                VolumeSource::Object(obj(SourceKind::ConfigMap, "hooks", &[], false)),
            )
            .build();
        r.task.apply_batch(
            vec![
                Input::Source(cm.clone(), content),
                Input::Pod(Box::new(user)),
                Input::SourceDeleted(cm.clone()),
            ],
            t1,
        );
        assert_eq!(ask(&mut r.task, &cm, Create), (vec![], false));
        assert_eq!(
            ask(&mut r.task, &cm, Delete),
            (vec!["n1/w-2".into()], false)
        );
    }

    /// An immutable Secret replaced while the watch was away (a re-list
    /// shows the object with a new UID) counts as gone at that moment.
    #[test]
    fn the_admission_view_sees_a_replacement_found_by_a_relist() {
        use mountguard_core::admission::Operation::Create;
        let mut r = rig();
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        r.task.apply_batch(
            vec![secret(&mut ix, b"k", "s1"), pod("u1", "w-0", "n1")],
            t0,
        );
        r.task.apply_batch(vec![secret(&mut ix, b"k2", "s2")], t0);
        let auth = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
        assert_eq!(r.task.gone_immutable.get(&auth), Some(&t0));
        // The same object again (same UID): nothing went away.
        let mut r = rig();
        r.task.apply_batch(
            vec![secret(&mut ix, b"k", "s1"), pod("u1", "w-0", "n1")],
            t0,
        );
        r.task.apply_batch(vec![secret(&mut ix, b"k", "s1")], t0);
        assert!(r.task.gone_immutable.is_empty());
        assert_eq!(
            ask(&mut r.task, &auth, Create),
            (vec!["n1/w-0".into()], true)
        );
    }

    /// An inventory's in-flight permit goes back as soon as the task has
    /// the inventory, not when the coalescing window closes: report
    /// handlers waiting for a permit are not held up by the window (with
    /// at most 32 in flight, catch-up after a restart ran in batches of 32
    /// nodes, each waiting out the window). The inventory is still
    /// evaluated when the window closes.
    #[tokio::test(start_paused = true)]
    async fn an_inventory_frees_its_permit_before_the_window_closes() {
        let r = rig();
        let shared = r.shared.clone();
        let (tx, rx) = mpsc::channel(8);
        let (_trigger, shutdown) = Shutdown::new();
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        let mut task = r.task;
        task.apply_batch(
            vec![secret(&mut ix, b"k", "s1"), pod("u1", "w-0", "n1")],
            t0,
        );
        tokio::spawn(run(task, rx, shutdown));
        let sem = Arc::new(tokio::sync::Semaphore::new(1));
        let permit = sem.clone().acquire_owned().await.unwrap();
        let now = Timestamp::now().to_string();
        let Input::Inventory(i, _) = inv("n1", 1, &now, &[("u1", b"k")]) else {
            unreachable!()
        };
        tx.send(Input::Inventory(i, Some(permit))).await.unwrap();
        tokio::time::sleep(COALESCE / 10).await;
        assert_eq!(
            sem.available_permits(),
            1,
            "the permit is back while the window is still open"
        );
        let state = |s: &Shared| {
            s.verdicts
                .read()
                .unwrap()
                .pods
                .get(&PodUid::new("u1"))
                .map(|p| p.pv.verdicts[0].state.tag())
        };
        assert_eq!(
            state(&shared).as_deref(),
            Some("Unverifiable/NoInventory"),
            "evaluated only when the window closes"
        );
        tokio::time::sleep(COALESCE * 2).await;
        assert_eq!(state(&shared).as_deref(), Some("Fresh"));
    }

    /// A workload target selects the pods its controller owns: a
    /// StatefulSet's by their owner, a Deployment's through the watched
    /// ReplicaSet that names it as controller (and no longer once that
    /// ReplicaSet is gone); never another workload's or a bare pod.
    #[test]
    fn workload_rollouts_select_the_pods_of_their_owner() {
        use mountguard_core::model::{ControllerKind, ControllerRef};
        use mountguard_core::rollout::{Target, decide};
        let mut r = rig();
        r.shared.verdicts.write().unwrap().replicasets_watched = true;
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        let owned = |uid: &str, name: &str, node: &str, kind, owner: &str| {
            let Input::Pod(mut p) = pod(uid, name, node) else {
                unreachable!()
            };
            p.workload = ControllerRef::boxed(kind, owner.into(), &format!("uid-{owner}"));
            Input::Pod(p)
        };
        r.task.apply_batch(
            vec![
                secret(&mut ix, b"new", "s1"),
                owned(
                    "u1",
                    "web-5d4f8-a",
                    "n1",
                    ControllerKind::ReplicaSet,
                    "web-5d4f8",
                ),
                owned(
                    "u2",
                    "web-5d4f8-b",
                    "n2",
                    ControllerKind::ReplicaSet,
                    "web-5d4f8",
                ),
                owned("u3", "pg-0", "n1", ControllerKind::StatefulSet, "pg"),
                owned("u5", "web-0", "n1", ControllerKind::StatefulSet, "web"),
                pod("u4", "bare", "n2"),
            ],
            t0,
        );
        r.task.apply_batch(
            vec![
                inv(
                    "n1",
                    1,
                    "2026-11-30T10:00:00Z",
                    &[("u1", b"new"), ("u3", b"new"), ("u5", b"new")],
                ),
                inv(
                    "n2",
                    1,
                    "2026-11-30T10:00:00Z",
                    &[("u2", b"old"), ("u4", b"new")],
                ),
            ],
            t0,
        );
        let pods = |r: &Rig, t: &str| -> (Vec<String>, bool) {
            let target: Target = t.parse().unwrap();
            let d = rollout_doc(r, &target);
            let mut pods: Vec<String> = d.consumers.iter().map(|c| c.pod.clone()).collect();
            pods.dedup();
            (pods, decide(&d, &target, None).complete())
        };
        let none: Vec<String> = vec![];
        // The ReplicaSet not seen yet: nothing is the Deployment's.
        assert_eq!(pods(&r, "deployment/slurm/web"), (none.clone(), false));
        assert_eq!(
            pods(&r, "rs/slurm/web-5d4f8"),
            (vec!["web-5d4f8-a".into(), "web-5d4f8-b".into()], false)
        );
        assert_eq!(pods(&r, "sts/slurm/pg"), (vec!["pg-0".into()], true));
        assert_eq!(
            pods(&r, "statefulset/slurm/web"),
            (vec!["web-0".into()], true)
        );
        assert_eq!(pods(&r, "daemonset/slurm/pg"), (none.clone(), false));
        let rs: k8s_openapi::api::apps::v1::ReplicaSet =
            serde_json::from_value(serde_json::json!({
                "metadata": {"namespace": "slurm", "name": "web-5d4f8", "uid": "rs1",
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                        "name": "web", "uid": "d1", "controller": true}]},
                "spec": {"selector": {}},
            }))
            .unwrap();
        let o = Arc::new(super::super::workloads::from_replicaset(&rs).unwrap());
        let key = o.key().unwrap();
        r.task
            .apply_batch(vec![Input::Workload(key.clone(), o)], t0);
        // u2 is served the old bytes: the Deployment is not rolled out.
        assert_eq!(
            pods(&r, "deployment/slurm/web"),
            (vec!["web-5d4f8-a".into(), "web-5d4f8-b".into()], false)
        );
        assert_eq!(pods(&r, "deployment/slurm/pg"), (none.clone(), false));
        r.task.apply_batch(
            vec![inv(
                "n2",
                2,
                "2026-11-30T10:00:05Z",
                &[("u2", b"new"), ("u4", b"new")],
            )],
            t0,
        );
        assert!(pods(&r, "deployment/slurm/web").1);
        r.task.apply_batch(vec![Input::WorkloadDeleted(key)], t0);
        assert_eq!(pods(&r, "deployment/slurm/web"), (none, false));
    }

    /// The rollout document follows the source's current fingerprint and
    /// what each consumer was verified against, and the gate's decision on
    /// it follows a rotation (recreate under the same name) to the end.
    #[test]
    fn rollout_document_tracks_rotation_per_consumer() {
        use mountguard_core::rollout::{Target, decide};
        let mut r = rig();
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        let target: Target = "secret/slurm/auth".parse().unwrap();
        let doc = |r: &Rig| rollout_doc(r, &target);
        r.task.apply_batch(
            vec![
                secret(&mut ix, b"old", "s1"),
                pod("u1", "w-0", "n1"),
                pod("u2", "w-1", "n2"),
            ],
            t0,
        );
        r.task.apply_batch(
            vec![
                inv("n1", 1, "2026-11-30T10:00:00Z", &[("u1", b"old")]),
                inv("n2", 1, "2026-11-30T10:00:00Z", &[("u2", b"old")]),
            ],
            t0,
        );
        let d = doc(&r);
        let old_fp = d.sources[0].fingerprint.clone().unwrap();
        assert_eq!(old_fp.len(), 12, "a keyed fingerprint");
        assert_eq!(d.sources[0].uid.as_deref(), Some("s1"));
        assert_eq!(d.consumers.len(), 2);
        for c in &d.consumers {
            assert_eq!(c.state, "Fresh");
            assert_eq!(c.sources[0].fingerprint.as_deref(), Some(old_fp.as_str()));
            assert_eq!(c.verified_at.as_deref(), Some("2026-11-30T10:00:00Z"));
            assert!(c.node_reporting);
        }
        assert!(decide(&d, &target, Some("s1")).complete());
        // Recreated with new content: the consumers are judged against it
        // and are not fresh until the nodes show the new bytes.
        let t1 = ts("2026-11-30T10:05:00Z");
        r.task.apply_batch(vec![secret(&mut ix, b"new", "s2")], t1);
        let d = doc(&r);
        let new_fp = d.sources[0].fingerprint.clone().unwrap();
        assert_ne!(new_fp, old_fp);
        assert!(
            d.consumers
                .iter()
                .all(
                    |c| c.sources[0].fingerprint.as_deref() == Some(new_fp.as_str())
                        && c.state != "Fresh"
                ),
            "{d:?}"
        );
        let p = decide(&d, &target, Some("s2"));
        assert_eq!((p.verified, p.total), (0, 2), "{p:?}");
        r.task.apply_batch(
            vec![inv("n1", 2, "2026-11-30T10:05:10Z", &[("u1", b"new")])],
            t1,
        );
        let p = decide(&doc(&r), &target, Some("s2"));
        assert_eq!((p.verified, p.total), (1, 2), "{p:?}");
        assert_eq!(p.missing[0].pod, "w-1");
        assert_eq!(p.missing[0].node, "n2");
        r.task.apply_batch(
            vec![inv("n2", 2, "2026-11-30T10:05:20Z", &[("u2", b"new")])],
            t1,
        );
        let d = doc(&r);
        assert!(decide(&d, &target, Some("s2")).complete(), "{d:?}");
        let w1 = d.consumers.iter().find(|c| c.pod == "w-1").unwrap();
        assert_eq!(w1.verified_at.as_deref(), Some("2026-11-30T10:05:20Z"));
        // /v1/verdicts items carry the same.
        {
            let store = r.shared.verdicts.read().unwrap();
            let doc = store.document(
                &super::super::status::Query::parse(Some("all=1")),
                true,
                true,
            );
            let w1 = doc.verdicts.iter().find(|v| v.pod == "w-1").unwrap();
            assert_eq!(w1.source_content.len(), 1, "{w1:?}");
            assert_eq!(
                w1.source_content[0].fingerprint.as_deref(),
                Some(new_fp.as_str())
            );
            assert_eq!(w1.verified_at.as_deref(), Some("2026-11-30T10:05:20Z"));
        }
        // Event notes carry the source's fingerprint and the scan time.
        {
            let store = r.shared.verdicts.read().unwrap();
            let p = &store.pods["u2"];
            let pv = &p.pv;
            let m = event_message(pv, &pv.verdicts[0], p.check.as_ref().unwrap());
            assert!(
                m.contains(&format!("source content Secret auth {new_fp}"))
                    && m.contains("node scanned at 2026-11-30T10:05:20Z"),
                "{m}"
            );
        }
        // A new pod of the Secret not scheduled yet keeps the gate closed
        // until it runs on a node.
        let Input::Pod(mut pending) = pod("u3", "w-2", "n1") else {
            unreachable!()
        };
        pending.set_node(None);
        r.task.apply_batch(vec![Input::Pod(pending)], t1);
        let d = doc(&r);
        assert_eq!(d.unscheduled, ["slurm/w-2"], "{d:?}");
        let p = decide(&d, &target, Some("s2"));
        assert!(
            !p.complete() && p.blockers[0].contains("slurm/w-2"),
            "{p:?}"
        );
        r.task
            .apply_batch(vec![Input::PodDeleted(PodUid::new("u3"))], t1);
        assert!(decide(&doc(&r), &target, Some("s2")).complete());
        // A node whose agent stops reporting: its consumer no longer counts.
        let late = ts("2026-11-30T10:20:00Z");
        r.task.apply_batch(
            vec![inv("n1", 3, "2026-11-30T10:19:50Z", &[("u1", b"new")])],
            late,
        );
        let p = decide(&doc(&r), &target, None);
        assert_eq!((p.verified, p.total), (1, 2), "{p:?}");
        assert_eq!(p.missing[0].node, "n2");
        // Deleted: absent until recreated.
        r.task.apply_batch(
            vec![Input::SourceDeleted(SourceRef::new(
                SourceKind::Secret,
                ix.intern("slurm"),
                ix.intern("auth"),
            ))],
            late,
        );
        let d = doc(&r);
        assert!(!d.sources[0].present && d.sources[0].fingerprint.is_none());
        assert!(!decide(&d, &target, None).complete());
    }

    /// A `replace --force` of the immutable Secret (deleted, recreated
    /// with the same content under a new UID) while a pod reads it as a
    /// volume and as an env var: nothing turns Stale, no Event is sent, and
    /// the rollout gate completes for the new UID.
    #[test]
    fn a_recreation_with_the_same_content_alarms_nothing_and_completes_the_rollout() {
        use mountguard_core::rollout::{Target, decide};
        let mut r = rig();
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        let target: Target = "secret/slurm/auth".parse().unwrap();
        let Input::Pod(p) = pod("u1", "w-0", "n1") else {
            unreachable!()
        };
        let p = PodB { pod: *p }
            .container(
                "slurmd",
                Some(ts("2026-11-30T09:30:00Z")),
                &[("etc", "")],
                vec![env_key(
                    "KEY",
                    SourceKind::Secret,
                    "auth",
                    "slurm.key",
                    false,
                )],
            )
            .build();
        r.task.apply_batch(
            vec![secret(&mut ix, b"same", "s1"), Input::Pod(Box::new(p))],
            t0,
        );
        r.task.apply_batch(
            vec![inv("n1", 1, "2026-11-30T10:00:00Z", &[("u1", b"same")])],
            t0,
        );
        let states = |r: &Rig| -> Vec<String> {
            let store = r.shared.verdicts.read().unwrap();
            store.pods["u1"]
                .pv
                .verdicts
                .iter()
                .map(|v| v.state.tag())
                .collect()
        };
        assert_eq!(states(&r), ["Fresh", "Fresh"]);
        let t1 = ts("2026-11-30T10:05:00Z");
        let auth = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
        r.task.apply_batch(vec![Input::SourceDeleted(auth)], t1);
        r.task.apply_batch(vec![secret(&mut ix, b"same", "s2")], t1);
        // Past the grace period, the node still showing the same bytes.
        let t2 = ts("2026-11-30T10:15:00Z");
        r.task.apply_batch(
            vec![inv("n1", 2, "2026-11-30T10:14:50Z", &[("u1", b"same")])],
            t2,
        );
        assert_eq!(states(&r), ["Fresh", "Fresh"]);
        assert!(
            drain(&mut r.events)
                .iter()
                .all(|e| e.reason.as_str() != "StaleMount"),
            "an alarm for content that cannot differ"
        );
        let d = rollout_doc(&r, &target);
        let p = decide(&d, &target, Some("s2"));
        assert!(p.complete(), "{p:?}");
        assert_eq!((p.verified, p.total), (2, 2));
    }

    #[test]
    fn baseline_without_events_then_rotation_alarms_and_recovery() {
        let mut r = rig();
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        // Start: the mount is already stale (old key) when the controller
        // first hears of the node: that is the baseline, no Event.
        r.task.apply_batch(
            vec![secret(&mut ix, b"new", "s1"), pod("u1", "w-0", "n1")],
            t0,
        );
        r.task.apply_batch(
            vec![inv("n1", 1, "2026-11-30T10:00:00Z", &[("u1", b"old")])],
            t0,
        );
        let m = metrics(&r);
        assert!(m.contains(r#"state="Stale""#), "{m}");
        assert!(
            m.contains(r#"mountguard_node_agent_reporting{node="n1"} 1"#),
            "{m}"
        );
        assert!(drain(&mut r.events).is_empty(), "no Event for the baseline");
        // The node catches up: recovery Event.
        r.task.apply_batch(
            vec![inv("n1", 2, "2026-11-30T10:01:00Z", &[("u1", b"new")])],
            t0,
        );
        let ev = drain(&mut r.events);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].reason, super::super::events::Reason::MountRecovered);
        assert!(!metrics(&r).contains("mountguard_mount_state{"));
        // Rotation (recreated with new content) while the node keeps the old
        // bytes: a StaleMount Event naming fingerprints, not digests.
        r.task
            .apply_batch(vec![secret(&mut ix, b"newer", "s2")], t0);
        r.task.apply_batch(
            vec![inv("n1", 3, "2026-11-30T10:10:00Z", &[("u1", b"new")])],
            t0,
        );
        let ev = drain(&mut r.events);
        assert_eq!(ev.len(), 1, "{ev:?}");
        assert_eq!(ev[0].reason.as_str(), "StaleMount");
        assert!(ev[0].message.contains("volume etc"), "{}", ev[0].message);
        assert!(ev[0].message.contains("Secret auth"), "{}", ev[0].message);
        assert!(
            !ev[0]
                .message
                .contains(&mountguard_inventory::digest::to_hex(
                    &mountguard_inventory::file_digest(b"newer")
                ))
        );
        // Repeated heartbeats: deduplicated.
        for s in ["2026-11-30T10:10:30Z", "2026-11-30T10:11:00Z"] {
            r.task.apply_batch(
                vec![Input::Heartbeat {
                    node: "n1".into(),
                    generation: 3,
                    scanned_at: ts(s),
                }],
                t0,
            );
        }
        assert!(drain(&mut r.events).is_empty());
        // The Secret watch fails: verdicts become Unverifiable/ApiUnavailable,
        // no Event, no Stale series.
        r.shared.health.register("secrets", true);
        r.task.apply_batch(vec![], t0);
        let m = metrics(&r);
        assert!(m.contains(r#"cause="ApiUnavailable""#), "{m}");
        assert!(
            !m.lines()
                .any(|l| l.starts_with("mountguard_mount_state{") && l.contains(r#"state="Stale""#)),
            "{m}"
        );
        assert!(drain(&mut r.events).is_empty());
        // Pod deleted: its series go away, and so do its alarm entry and
        // its Event bucket.
        assert_eq!(r.task.limiter.len(), 1, "u1 had Events");
        r.task
            .apply_batch(vec![Input::PodDeleted(PodUid::new("u1"))], t0);
        assert!(!metrics(&r).contains("mountguard_mount_state{"));
        assert!(r.shared.verdicts.read().unwrap().pods.is_empty());
        assert!(r.task.tracker.is_empty());
        assert!(
            r.task.limiter.is_empty(),
            "the deleted pod's Event bucket is kept"
        );
    }

    #[test]
    fn reset_forgets_reports_and_stale_inventory_ages_out() {
        let mut r = rig();
        let mut ix = Interner::default();
        let t0 = ts("2026-11-30T10:00:00Z");
        r.task.apply_batch(
            vec![
                secret(&mut ix, b"k", "s1"),
                pod("u1", "w-0", "n1"),
                inv("n1", 1, "2026-11-30T10:00:00Z", &[("u1", b"k")]),
            ],
            t0,
        );
        assert!(
            r.shared
                .verdicts
                .read()
                .unwrap()
                .pods
                .contains_key(&PodUid::new("u1"))
        );
        // Ten minutes without a report: InventoryTooOld, node not reporting.
        r.task.apply_batch(vec![], ts("2026-11-30T10:10:00Z"));
        let m = metrics(&r);
        assert!(
            !m.contains("mountguard_mount_state{"),
            "node-level reasons have no series: {m}"
        );
        assert!(
            m.contains(r#"mountguard_mounts{state="Unverifiable"} 1"#),
            "{m}"
        );
        assert!(
            m.contains(r#"mountguard_node_agent_reporting{node="n1"} 0"#),
            "{m}"
        );
        assert!(
            m.contains(r#"mountguard_nodes{reporting="false"} 1"#),
            "{m}"
        );
        // A heartbeat with an unknown generation changes nothing.
        r.task.apply_batch(
            vec![Input::Heartbeat {
                node: "n1".into(),
                generation: 9,
                scanned_at: ts("2026-11-30T10:10:00Z"),
            }],
            ts("2026-11-30T10:10:00Z"),
        );
        let tag = |r: &Rig| {
            r.shared.verdicts.read().unwrap().pods["u1"].pv.verdicts[0]
                .state
                .tag()
        };
        assert_eq!(tag(&r), "Unverifiable/InventoryTooOld");
        r.task
            .apply_batch(vec![Input::Reset], ts("2026-11-30T10:10:00Z"));
        assert_eq!(tag(&r), "Unverifiable/NoInventory");
        assert!(r.task.index().inventory("n1").is_none());
        assert!(drain(&mut r.events).is_empty());
    }
}
