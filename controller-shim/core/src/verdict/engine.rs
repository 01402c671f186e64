//! The engine loop: which pods to evaluate (all, or those a change
//! touches, plus every pod of a node whose node rule flips), in which order,
//! and how each pod's preliminary verdicts get the node rule and their
//! `since` from history. The rules themselves are in [`super::rules`],
//! the types both share in [`super::view`].

use std::collections::BTreeMap;

use foldhash::HashSet;
use std::rc::Rc;
use std::sync::Arc;

use jiff::Timestamp;

use super::cache::{CachedVolume, EvalCache};
use super::history::{
    EngineState, KeyHistory, NodeHistory, PodHistory, PresentContent, SourceHistory,
};
use super::rules::{Ctx, api_rule, counts_for_node_rule, node_rule, not_syncing, terminating_pod};
use super::subject::SubjectId;
use super::types::{ApiHealth, Config, Evaluation, PodVerdicts, StaleCause, State};
use super::view::{EngineView, NodeView, PodPrelim};
use crate::fingerprint::Fingerprinter;
use crate::index::{ClusterIndex, PodId};
use crate::model::{PodModel, SkipReason, SourceRef};
use crate::uid::PodUid;

/// The verdict engine: configuration and the fingerprint key.
#[derive(Debug, Clone)]
pub struct Engine {
    pub(super) config: Config,
    pub(super) fingerprinter: Fingerprinter,
    pub(super) api: ApiHealth,
}

impl Engine {
    /// An engine with `config` and the installation's fingerprinter.
    pub fn new(config: Config, fingerprinter: Fingerprinter) -> Self {
        Self {
            config,
            fingerprinter,
            api: ApiHealth::Available,
        }
    }

    /// Sets the health of the Secret and ConfigMap watches, an input of
    /// every following evaluation (the API rule).
    pub fn set_api_health(&mut self, api: ApiHealth) {
        self.api = api;
    }

    /// The health of the source watches the engine was last told.
    pub fn api_health(&self) -> ApiHealth {
        self.api
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The fingerprinter.
    pub fn fingerprinter(&self) -> &Fingerprinter {
        &self.fingerprinter
    }

    /// Records the current content of `r` in the history: a changed (or
    /// vanished, or reappeared with other content) content sets
    /// `content_changed_at = now`, a change seen (`change_seen`: what it
    /// held before is known to differ); a source seen for the first time
    /// takes its last write time, a change not seen. An object deleted and recreated with the same
    /// content (a `replace --force`, a re-applied manifest) has the same
    /// fingerprint (same scope, same content): it keeps the change time it
    /// had before it vanished, and each key whose value is the same keeps
    /// its own, since nothing any consumer got can differ.
    pub fn observe_source(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        r: &SourceRef,
        now: Timestamp,
    ) {
        let content = index.source(r);
        // Keyed to this object: its versions compare, other objects' not.
        let scope = self.fingerprinter.source(r);
        let fp = content.map(|c| scope.fingerprint(&c.content_digest).to_string());
        let key_fps = |c: &crate::model::SourceContent| -> Vec<(Arc<str>, String)> {
            c.keys
                .iter()
                .map(|(k, v)| (k.clone(), scope.key(k).fingerprint(&v.digest).to_string()))
                .collect()
        };
        match state.sources.get_mut(r) {
            Some(h) => {
                if h.fingerprint != fp {
                    let Some(c) = content else {
                        // Vanished: remember the content last present, and
                        // its keys, to compare a recreation with.
                        if let Some(last) = h.fingerprint.take() {
                            h.before_absence = Some(PresentContent {
                                fingerprint: last,
                                changed_at: h.content_changed_at,
                                change_seen: h.change_seen,
                            });
                        }
                        h.content_changed_at = Some(now);
                        h.change_seen = true;
                        return;
                    };
                    (h.content_changed_at, h.change_seen) = match h.before_absence.take() {
                        Some(b) if fp.as_ref() == Some(&b.fingerprint) => {
                            (b.changed_at, b.change_seen)
                        }
                        _ => (Some(now), true),
                    };
                    h.fingerprint = fp;
                    // Only the keys whose value changed (or that appeared)
                    // take `now`; vanished keys are forgotten.
                    let mut keys = BTreeMap::new();
                    for (k, kfp) in key_fps(c) {
                        let (changed_at, change_seen) = match h.keys.get(&k) {
                            Some(old) if old.fingerprint == kfp => {
                                (old.changed_at, old.change_seen)
                            }
                            _ => (Some(now), true),
                        };
                        keys.insert(
                            k,
                            KeyHistory {
                                fingerprint: kfp,
                                changed_at,
                                change_seen,
                            },
                        );
                    }
                    h.keys = keys;
                }
            }
            None => {
                if let Some(c) = content {
                    let first = c.last_write.map(|t| t.min(now));
                    state.sources.insert(
                        r.clone(),
                        SourceHistory {
                            fingerprint: fp,
                            content_changed_at: first,
                            change_seen: false,
                            before_absence: None,
                            keys: key_fps(c)
                                .into_iter()
                                .map(|(k, fingerprint)| {
                                    (
                                        k,
                                        KeyHistory {
                                            fingerprint,
                                            changed_at: first,
                                            change_seen: false,
                                        },
                                    )
                                })
                                .collect(),
                        },
                    );
                }
            }
        }
    }

    /// Evaluates every pod in the index, rebuilding the per-node counters
    /// and dropping history of pods and sources that are gone.
    pub fn evaluate_all(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        now: Timestamp,
    ) -> Evaluation {
        self.observe_all_sources(index, state, now);
        let mut out = Evaluation::default();
        self.evaluate_nodes(index, state, now, |p| out.pods.push(p));
        out
    }

    /// Like [`Engine::evaluate_all`], but hands each pod's verdicts to
    /// `sink` as soon as its node is done instead of collecting them, so a
    /// caller that keeps only what it needs (counts, non-Fresh verdicts)
    /// never holds every verdict at once.
    pub fn evaluate_all_each<F>(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        now: Timestamp,
        sink: F,
    ) where
        F: FnMut(PodVerdicts),
    {
        self.observe_all_sources(index, state, now);
        self.evaluate_nodes(index, state, now, sink);
    }

    fn observe_all_sources(&self, index: &ClusterIndex, state: &mut EngineState, now: Timestamp) {
        // Source history: every present source, and absent ones still
        // referenced; forget absent, unreferenced ones.
        let present: Vec<SourceRef> = index.sources().map(|(r, _)| r.clone()).collect();
        for r in &present {
            self.observe_source(index, state, r, now);
        }
        let known: Vec<SourceRef> = state.sources.keys().cloned().collect();
        for r in known {
            if index.source(&r).is_none() {
                if index.pods_referencing(&r).is_empty() {
                    state.sources.remove(&r);
                } else {
                    self.observe_source(index, state, &r, now);
                }
            }
        }
    }

    /// Evaluates node by node (the node rule needs only the node's pods),
    /// rebuilding pod history and node counters from scratch.
    fn evaluate_nodes<F>(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        now: Timestamp,
        mut sink: F,
    ) where
        F: FnMut(PodVerdicts),
    {
        let cache = EvalCache::default();
        let mut old_pods = std::mem::take(&mut state.pods);
        state.pods.reserve(index.pod_count());
        state.nodes.clear();
        let mut nodes: Vec<&Arc<str>> = index.nodes_with_pods().collect();
        nodes.sort();
        for node in nodes {
            let prelims: Vec<PodPrelim> = index
                .pods_on_node(node)
                .iter()
                .filter_map(|id| {
                    let prev = index.pod(*id).and_then(|p| old_pods.get(&p.uid));
                    self.prelim_pod(index, state, *id, now, prev, &cache)
                })
                .collect();
            let mut n = NodeHistory::default();
            for p in &prelims {
                n.mutable_mounts += p.mutable;
                n.stale_mutable_mounts += p.stale;
            }
            n.not_syncing = not_syncing(&self.config, &n);
            state.nodes.insert(node.clone(), n);
            for p in prelims {
                let pod = index.pod(p.id).expect("prelim pods exist in the index");
                let prev = old_pods.remove(&pod.uid);
                sink(self.finalize(pod, p, prev, state, now));
            }
        }
    }

    /// Re-evaluates only the pods with these UIDs (plus, when a node's
    /// KubeletNotSyncing verdict flips, every pod on that node). UIDs no
    /// longer in the index have their history dropped and are listed in
    /// [`Evaluation::removed`]. Sources referenced by the evaluated pods are
    /// observed first.
    pub fn evaluate_pods(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        uids: &[&PodUid],
        now: Timestamp,
    ) -> Evaluation {
        let mut out = Evaluation::default();
        let mut queue: Vec<PodId> = Vec::new();
        let mut seen: HashSet<PodId> = HashSet::default();
        let mut touched_nodes: HashSet<Arc<str>> = HashSet::default();
        for uid in uids {
            match index.pod_id(uid) {
                Some(id) => {
                    if seen.insert(id) {
                        queue.push(id);
                    }
                }
                None => {
                    if let Some(h) = state.pods.remove(uid) {
                        if let Some(node) = h.node() {
                            self.sub_counts(state, node, &h);
                            touched_nodes.insert(node.clone());
                        }
                        out.removed.push(h.uid().clone());
                    }
                }
            }
        }
        let mut observed: HashSet<SourceRef> = HashSet::default();
        for id in &queue {
            if let Some(pod) = index.pod(*id) {
                for r in pod.references() {
                    if !observed.contains(&r) {
                        self.observe_source(index, state, &r, now);
                        observed.insert(r);
                    }
                }
            }
        }

        let cache = EvalCache::default();
        let mut prelims: Vec<PodPrelim> = Vec::with_capacity(queue.len());
        let mut i = 0;
        loop {
            while i < queue.len() {
                let id = queue[i];
                i += 1;
                let prev = index.pod(id).and_then(|p| state.pods.get(&p.uid));
                let Some(p) = self.prelim_pod(index, state, id, now, prev, &cache) else {
                    continue;
                };
                let pod = index.pod(id).expect("queued pods exist");
                if let Some(h) = state.pods.get(&pod.uid).cloned()
                    && let Some(node) = h.node()
                {
                    self.sub_counts(state, node, &h);
                    touched_nodes.insert(node.clone());
                }
                if let Some(node) = pod.node() {
                    let n = state.nodes.entry(node.clone()).or_default();
                    n.mutable_mounts += p.mutable;
                    n.stale_mutable_mounts += p.stale;
                    touched_nodes.insert(node.clone());
                }
                // Record the counts now so a second pass over the same pod
                // (node flip) subtracts exactly what was added.
                let h = state.pods.get_or_insert_with(&pod.uid, || PodHistory {
                    last: PodVerdicts {
                        pod: pod.clone(),
                        verdicts: super::VerdictList::default(),
                    },
                    mutable_mounts: 0,
                    stale_mutable_mounts: 0,
                });
                // The pod as evaluated now, with its verdicts until then.
                h.last.pod = pod.clone();
                h.mutable_mounts = p.mutable;
                h.stale_mutable_mounts = p.stale;
                prelims.push(p);
            }
            // Node rule flips pull in the node's other pods.
            let mut flipped = false;
            for node in touched_nodes.drain() {
                let Some(n) = state.nodes.get_mut(&node) else {
                    continue;
                };
                let now_flag = not_syncing(&self.config, n);
                if now_flag != n.not_syncing {
                    n.not_syncing = now_flag;
                    for id in index.pods_on_node(&node) {
                        if seen.insert(*id) {
                            queue.push(*id);
                            flipped = true;
                        }
                    }
                }
            }
            if !flipped {
                break;
            }
        }

        for p in prelims {
            let pod = index.pod(p.id).expect("prelim pods exist");
            let prev = state.pods.remove(&pod.uid);
            out.pods.push(self.finalize(pod, p, prev, state, now));
        }
        out
    }

    fn sub_counts(&self, state: &mut EngineState, node: &Arc<str>, h: &PodHistory) {
        if let Some(n) = state.nodes.get_mut(node) {
            n.mutable_mounts = n.mutable_mounts.saturating_sub(h.mutable_mounts);
            n.stale_mutable_mounts = n
                .stale_mutable_mounts
                .saturating_sub(h.stale_mutable_mounts);
        }
    }

    fn node_view<'a>(&self, index: &'a ClusterIndex, node: &str, now: Timestamp) -> NodeView<'a> {
        match index.inventory(node) {
            None => NodeView::NoInventory,
            Some(n) if now.duration_since(n.scanned_at) > self.config.inventory_max_age => {
                NodeView::TooOld
            }
            Some(n) => NodeView::Usable(n),
        }
    }

    fn finalize(
        &self,
        pod: &Arc<PodModel>,
        p: PodPrelim,
        prev: Option<PodHistory>,
        state: &mut EngineState,
        now: Timestamp,
    ) -> PodVerdicts {
        let not_syncing = pod
            .node()
            .as_ref()
            .and_then(|n| state.nodes.get(&**n))
            .is_some_and(|n| n.not_syncing);
        let mut verdicts = Vec::with_capacity(p.verdicts.len());
        for pre in p.verdicts {
            let mut v = pre.verdict;
            v.state = node_rule(not_syncing, pre.mutable_mount, v.state);
            let tag = v.state;
            v.since = prev
                .as_ref()
                .and_then(|h| h.subject(v.id))
                .filter(|(s, _)| *s == tag)
                .map(|(_, since)| since)
                .unwrap_or(pre.estimate.min(now))
                .into();
            // The history keeps the state before the API rule: the state
            // underneath keeps its `since` while the API is unavailable.
            v.underlying = tag;
            v.state = api_rule(self.api, v.state);
            verdicts.push(v);
        }
        // The published verdicts and the history share one record.
        let pv = PodVerdicts {
            pod: pod.clone(),
            verdicts: verdicts.into(),
        };
        state.pods.insert(PodHistory {
            last: pv.clone(),
            mutable_mounts: p.mutable,
            stale_mutable_mounts: p.stale,
        });
        pv
    }

    /// Verdicts of one pod before the node rule; `None` for pods that are
    /// not scheduled or have terminated.
    fn prelim_pod(
        &self,
        index: &ClusterIndex,
        state: &EngineState,
        id: PodId,
        now: Timestamp,
        prev: Option<&PodHistory>,
        cache: &EvalCache,
    ) -> Option<PodPrelim> {
        let pod = index.pod(id)?;
        let node = pod.node()?;
        if pod.terminated {
            return None;
        }
        if pod.terminating {
            return Some(terminating_pod(id, pod, now));
        }
        let view = self.node_view(index, node, now);
        let observed_pod = match &view {
            NodeView::Usable(n) => n.pods.get(&pod.uid),
            _ => None,
        };
        let prev_since = |sid: SubjectId| -> Option<(bool, Timestamp)> {
            prev.and_then(|h| h.subject(sid)).map(|(state, since)| {
                (matches!(state, State::Propagating | State::Stale(_)), since)
            })
        };
        let ctx = Ctx {
            engine: EngineView {
                config: &self.config,
                fingerprinter: &self.fingerprinter,
            },
            index,
            state,
            pod,
            node,
            now,
            cache,
        };

        let mut out = PodPrelim {
            id,
            verdicts: Vec::new(),
            mutable: 0,
            stale: 0,
        };
        let expected: Vec<Rc<CachedVolume>> = pod
            .volumes
            .iter()
            .map(|v| cache.volume(&self.fingerprinter, index, pod.namespace(), &v.source))
            .collect();

        for (vi, (vol, cv)) in pod.volumes.iter().zip(&expected).enumerate() {
            let ev = &cv.ev;
            let sid = SubjectId::Volume(vi as u16);
            let mut pre = ctx.volume_verdict(sid, vol, cv, &view, observed_pod, prev_since(sid));
            let all_mutable = !ev.sources.is_empty()
                && ev
                    .sources
                    .iter()
                    .all(|r| index.source(r).is_some_and(|c| !c.immutable));
            pre.mutable_mount = counts_for_node_rule(all_mutable, pre.verdict.state);
            if pre.mutable_mount {
                out.mutable += 1;
                if pre.verdict.state == State::Stale(StaleCause::Unknown) {
                    out.stale += 1;
                }
            }
            out.verdicts.push(pre);
        }

        for (ci, c) in pod.containers.iter().enumerate() {
            for (mi, m) in c.mounts.iter().enumerate() {
                let Some(sp) = &m.sub_path else {
                    if !m.sub_path_expr {
                        continue;
                    }
                    out.verdicts.push(ctx.simple(
                        SubjectId::SubPath(ci as u16, mi as u16),
                        State::Skipped(SkipReason::SubPathExpr),
                        None,
                    ));
                    continue;
                };
                let sid = SubjectId::SubPath(ci as u16, mi as u16);
                // Volume verdicts come first, in volume order.
                let volume_state = out.verdicts[m.volume as usize].verdict.state;
                out.verdicts.push(ctx.sub_path_verdict(
                    sid,
                    c,
                    m,
                    sp,
                    &expected[m.volume as usize],
                    volume_state,
                    &view,
                    observed_pod,
                    prev_since(sid),
                ));
            }
            for (ei, e) in c.env.iter().enumerate() {
                let sid = SubjectId::Env(ci as u16, ei as u16);
                out.verdicts.push(ctx.env_verdict(sid, c, e));
            }
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests;
