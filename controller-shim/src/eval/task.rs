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
use tokio::sync::{mpsc, watch as tokio_watch};
use tracing::{debug, info};

use crate::api::store::{PublishedPod, ReadModel};
use crate::eval::input::{EvaluationSnapshot, Input};
use crate::eval::metrics::{EvalMetrics, MountLabels, MountSeries};
use crate::runtime::events::{EventRequest, RateLimiter, Tracker};
use crate::runtime::shutdown::{Shutdown, ticker};
use crate::state::Shared;
use mountguard_core::PodUid;
use mountguard_core::index::ClusterIndex;
use mountguard_core::model::{ObservedNode, PodModel, SourceRef};
use mountguard_core::remediation::inputs::{
    NodeSetKey, NodeSetObject, WorkloadObject, remediable_kind,
};
use mountguard_core::verdict::present::{
    PodCheck, counts_of, event_message, has_series, mount_labels,
};
use mountguard_core::verdict::{ApiHealth, Engine, EngineState, PodVerdicts, State};

/// How long a batch collects further inputs after its first one.
pub const COALESCE: Duration = Duration::from_millis(100);
/// Period of the housekeeping tick (inventory ages, node metrics, watch
/// health).
pub const TICK: Duration = Duration::from_secs(2);

/// State of the evaluation task.
#[derive(Debug)]
pub struct EvalTask {
    engine: Engine,
    shared: Arc<Shared>,
    /// The evaluation's metric families.
    metrics: EvalMetrics,
    /// The status API's store, which this task publishes into.
    store: ReadModel,
    index: ClusterIndex,
    state: EngineState,
    series: MountSeries,
    tracker: Tracker,
    limiter: RateLimiter,
    events: mpsc::Sender<EventRequest>,
    snapshots: tokio_watch::Sender<Arc<EvaluationSnapshot>>,
    applied_gen: HashMap<Arc<str>, u64>,
    nodesets: HashMap<NodeSetKey, Arc<NodeSetObject>>,
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
    /// A task with an empty index, measured by `metrics`.
    pub fn new(
        engine: Engine,
        shared: Arc<Shared>,
        metrics: EvalMetrics,
        store: ReadModel,
        events: mpsc::Sender<EventRequest>,
        snapshots: tokio_watch::Sender<Arc<EvaluationSnapshot>>,
    ) -> Self {
        Self {
            engine,
            shared,
            metrics,
            store,
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
                let store = self.store.read().unwrap();
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
        self.metrics
            .node_inventory_timestamp
            .with_label_values(&[node])
            .set(t.as_millisecond() as f64 / 1000.0);
    }

    fn reset(&mut self) {
        let nodes: Vec<Arc<str>> = self.applied_gen.keys().cloned().collect();
        for n in nodes {
            self.index.delete_inventory(&n);
            let _ = self
                .metrics
                .node_inventory_timestamp
                .remove_label_values(&[&n]);
        }
        self.applied_gen.clear();
        self.state = EngineState::default();
        self.series.clear(&self.metrics);
        self.tracker.clear();
        self.baselined.clear();
        self.too_old.clear();
        self.evaluated = false;
        let mut store = self.store.write().unwrap();
        store.pods.clear();
        store.sources.clear();
        store.reporting.clear();
        store.unscheduled.clear();
        store.slurm.nodes.clear();
        store.evaluated = false;
    }

    fn evaluate(&mut self, full: bool, dirty: HashSet<PodUid>, now: Timestamp) {
        let timer = Instant::now();
        let mut pods = Vec::new();
        let mut removed = Vec::new();
        if full {
            self.engine
                .evaluate_all_each(&self.index, &mut self.state, now, |pv| pods.push(pv));
            let live: HashSet<&PodUid> = pods.iter().map(|p| &p.pod.uid).collect();
            let store = self.store.read().unwrap();
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
        let handle = self.store.clone();
        let mut store = handle.write().unwrap();
        for pv in pods {
            let old = store
                .pods
                .get(&pv.pod.uid)
                .map(|p| counts_of(&p.pv))
                .unwrap_or_default();
            let check = self.pod_check(&pv);
            self.publish_pod(&pv, &check, &store.slurm, &old, &mut requests);
            store.pods.insert(PublishedPod {
                pv,
                check: Some(check),
            });
        }
        for uid in &removed {
            let old = store.pods.remove(uid);
            let old = old.as_ref().map(|p| counts_of(&p.pv)).unwrap_or_default();
            self.series
                .update(&self.metrics, uid, Vec::new(), &old, &[]);
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
            self.store.write().unwrap().sources = items;
        }
        self.series.flush(&self.metrics);
        self.evaluated = true;
        let mono = Instant::now();
        for r in requests {
            let uid = PodUid::new(&r.uid);
            if !self.limiter.allow(&uid, mono) || self.events.try_send(r).is_err() {
                self.metrics.events_suppressed.inc();
            }
        }
        let secs = timer.elapsed().as_secs_f64();
        self.metrics.evaluation_duration.observe(secs);
        debug!(
            pods = n,
            removed = removed.len(),
            full,
            seconds = secs,
            "evaluated"
        );
        // Built only while someone subscribes (the remediation executor).
        if self.snapshots.receiver_count() > 0 {
            let store = self.store.read().unwrap();
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
                    .filter(|p| remediable_kind(p))
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
}

/// Runs the task until shutdown.
pub async fn run(mut task: EvalTask, mut rx: mpsc::Receiver<Input>, mut shutdown: Shutdown) {
    let mut tick = ticker(TICK);
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

mod publishing;

#[cfg(test)]
mod tests;
