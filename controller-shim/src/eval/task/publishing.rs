//! The evaluation task's writes into the status API's store and the
//! metrics: sources, deployments, unscheduled pods, each pod's check and
//! verdicts, and the node metrics.

use super::*;
use mountguard_core::remediation::slurm_view::retell;

impl EvalTask {
    /// What the rollout endpoint says about a source: its current
    /// fingerprint (from the engine's history), UID and change time.
    pub(super) fn source_item(
        &self,
        r: &SourceRef,
    ) -> Option<mountguard_core::rollout::SourceItem> {
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
    pub(super) fn publish_sources(&self, refs: Vec<SourceRef>) {
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
        let mut store = self.store.write().unwrap();
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
    pub(super) fn publish_deployment_of(&self, o: &WorkloadObject, present: bool) {
        let (Some(w), Some(d)) = (o.workload(), o.deployment.as_ref()) else {
            return;
        };
        if w.kind != mountguard_core::remediation::workload::WorkloadKind::ReplicaSet {
            return;
        }
        let key = (o.model.namespace.clone(), w.name.clone());
        let mut store = self.store.write().unwrap();
        if present {
            store.deployments.insert(key, d.clone());
        } else {
            store.deployments.remove(&key);
        }
    }
    /// Publishes the pods that are not scheduled yet (every pod on a full
    /// evaluation, else the batch's dirty ones) for the rollout endpoint.
    pub(super) fn publish_unscheduled(&self, full: bool, dirty: &HashSet<PodUid>) {
        let pending = |p: &Arc<PodModel>| p.node().is_none() && !p.terminated;
        let mut store = self.store.write().unwrap();
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
    pub(super) fn pod_check(&mut self, pv: &PodVerdicts) -> PodCheck {
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
        PodCheck {
            scanned_at: pv
                .pod
                .node()
                .as_ref()
                .and_then(|n| self.index.inventory(n))
                .map(|i| i.scanned_at.into()),
            fingerprints: self.index.interner.intern_fingerprints(fingerprints),
        }
    }
    /// When `r`'s current content appeared: the engine's change time, else
    /// the object's last write.
    fn changed_at(&self, r: &SourceRef) -> Option<Timestamp> {
        match self.state.sources.get(r) {
            Some(h) => h.content_changed_at,
            None => self.index.source(r).and_then(|c| c.last_write),
        }
    }
    /// Publishes `pv`'s series and queues its Events; `slurm`: the Slurm
    /// reads remediation keeps (what a stale worker's Event says of its
    /// node).
    pub(super) fn publish_pod(
        &mut self,
        pv: &PodVerdicts,
        check: &PodCheck,
        slurm: &mountguard_core::remediation::slurm_view::SlurmReads,
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
            let event = self.tracker.observe(&pod.uid, v.id, &v.state, baselined);
            // A verdict in alarm is told again when what Slurm shows of its
            // node changed since its last Event (`retell`).
            let told = self.tracker.slurm_told(&pod.uid, v.id);
            if event.is_none() && told.is_none() {
                continue;
            }
            let side = slurm.side(pv, v, |r| self.changed_at(r));
            let finding = side.as_ref().map(|s| s.finding);
            let reason = match event {
                Some(r) => Some(r),
                None if retell(told, finding) => self.tracker.alarm(&pod.uid, v.id),
                None => None,
            };
            if let Some(reason) = reason {
                requests.push(EventRequest {
                    namespace: pod.namespace().to_string(),
                    pod: pod.name.to_string(),
                    uid: pod.uid.to_string(),
                    reason,
                    message: event_message(pv, v, check, side.as_ref()),
                });
                self.tracker.tell_slurm(&pod.uid, v.id, finding);
            }
        }
        let counts = counts_of(pv);
        self.series
            .update(&self.metrics, &pod.uid, labels, old_counts, &counts);
    }
    pub(super) fn update_node_metrics(&mut self, now: Timestamp) {
        let max_age = self.engine.config().inventory_max_age;
        let m = &self.metrics;
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
            let mut store = self.store.write().unwrap();
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
