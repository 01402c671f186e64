//! Performing a step's actions in order: persist the record first (a
//! failed Persist stops the step, so no external write happens without a
//! record of it), then Slurm writes, evictions, holds and Events.

use super::observe::hold_owner;
use super::*;

impl Executor {
    /// Performs `actions`; returns whether a Slurm write happened.
    pub(super) async fn perform(
        &mut self,
        snap: &EvaluationSnapshot,
        old: &Attempt,
        next: Attempt,
        actions: Vec<Action>,
    ) -> bool {
        let mut wrote = false;
        for act in actions {
            let writes = matches!(act, Action::Persist) || act.is_external_write();
            if writes && !self.may_write().await {
                // Not confirmed as the Lease holder: nothing more of this
                // step happens; it is taken again from the old state.
                debug!(attempt = %next.id, "not writing: the Lease is not confirmed");
                return wrote;
            }
            match act {
                Action::Persist => {
                    if let Err(e) = self.persist(&next).await {
                        self.shared.metrics.api_error("patch_nodeset");
                        warn!(attempt = %next.id, error = %e, "persisting the remediation attempt failed; not acting before it is recorded");
                        // Keep the old state (and its retry pacing).
                        return wrote;
                    }
                    crate::runtime::failpoint::after_persist(next.phase.name(), &next.id);
                }
                Action::DrainNode { node, reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.drain(&node, &reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_drain");
                    }
                    info!(attempt = %next.id, node, ok = r.is_ok(), "drain requested");
                    self.last_write.insert(next.id.clone(), write_result(r));
                }
                Action::HoldNode { node, reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.hold(&node, &reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_drain");
                    }
                    info!(attempt = %next.id, node, ok = r.is_ok(), "FAIL hold requested");
                    self.last_write.insert(next.id.clone(), write_result(r));
                }
                Action::RestoreDrain {
                    node,
                    owned_reason,
                    prior,
                } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm
                        .restore_if_reason(&node, &owned_reason, &prior.state, &prior.reason)
                        .await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_undrain");
                    }
                    info!(attempt = %next.id, node, state = %prior.state, reason = %prior.reason, set_by = ?prior.set_by, result = ?r, "previous drain handed back");
                    self.last_write
                        .insert(next.id.clone(), write_result(r.map(|_| ())));
                }
                Action::UndrainNode { node, owned_reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.undrain_if_reason(&node, &owned_reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_undrain");
                    }
                    info!(attempt = %next.id, node, result = ?r, "undrain requested");
                    self.last_write
                        .insert(next.id.clone(), write_result(r.map(|_| ())));
                }
                Action::ResumeNode { node, owned_reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.resume_if_reason(&node, &owned_reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_undrain");
                    }
                    info!(attempt = %next.id, node, result = ?r, "resume requested");
                    self.last_write
                        .insert(next.id.clone(), write_result(r.map(|_| ())));
                }
                Action::Evict {
                    namespace,
                    pod,
                    uid,
                } => {
                    if self.mode != Mode::On {
                        continue;
                    }
                    let r = self.evict(&namespace, &pod, &uid, false).await;
                    info!(attempt = %next.id, pod = %format!("{namespace}/{pod}"), result = ?r, "eviction requested");
                    self.last_eviction.insert(next.id.clone(), r);
                }
                Action::CheckEviction {
                    namespace,
                    pod,
                    uid,
                } => {
                    if self.mode != Mode::On {
                        continue;
                    }
                    let r = self.evict(&namespace, &pod, &uid, true).await;
                    debug!(attempt = %next.id, pod = %format!("{namespace}/{pod}"), result = ?r, "eviction asked as a dry run");
                    self.last_eviction_check.insert(next.id.clone(), r);
                }
                Action::CordonNode { node, owner } => {
                    self.cordon_action(&next.id, &node, &owner, true).await;
                }
                Action::UncordonNode { node, owner } => {
                    self.cordon_action(&next.id, &node, &owner, false).await;
                }
                Action::Event { reason, message } => {
                    // Logged too: Events expire (an hour by default).
                    info!(attempt = %next.id, reason = ?reason, message = %message, "remediation event");
                    // On the replacement once there is one (its own name
                    // for a ReplicaSet's or DaemonSet's).
                    let (pod, uid) = match &next.new_pod_uid {
                        Some(u) => (next.new_pod(), u.as_str()),
                        None => (next.pod.as_str(), old.pod_uid.as_str()),
                    };
                    let owner = match &next.workload {
                        Some(w) => Owner::Workload(w),
                        None => Owner::NodeSet(&next.nodeset),
                    };
                    self.event(snap, &next.namespace, pod, uid, owner, reason, &message)
                        .await;
                }
                Action::Transition { from, to } => {
                    let result = match to {
                        Phase::Failed(r) => r.as_str(),
                        Phase::Succeeded => "succeeded",
                        _ => "entered",
                    };
                    self.metrics
                        .remediation_attempts
                        .with_label_values(&[to.name(), result])
                        .inc();
                    info!(attempt = %next.id, pod = %format!("{}/{}", next.namespace, next.pod), from = from.name(), to = to.name(), result, "remediation phase");
                }
            }
        }
        self.attempts.insert(next.id.clone(), next);
        wrote
    }
    /// Holds new pods off `node` for group `owner`: adds the `NoSchedule`
    /// taint [`HOLD_TAINT_KEY`] (value `owner`) and the annotation naming
    /// `owner`, unless a taint with that key is there already; with
    /// `cordon == false`, removes both only if the taint still names
    /// `owner`. Never touches `spec.unschedulable` (see [`HOLD_TAINT_KEY`]).
    /// The patch carries the resourceVersion read, so a concurrent change
    /// of the taints wins (a merge patch replaces the whole list).
    pub(super) async fn set_cordon(
        &self,
        node: &str,
        owner: &str,
        cordon: bool,
    ) -> Result<(), kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let n = api.get(node).await?;
        let taints: Vec<serde_json::Value> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|t| {
                t.iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect()
            })
            .unwrap_or_default();
        let held_by = hold_owner(&n);
        let patch = match (cordon, held_by.as_deref()) {
            (true, None) => {
                let mut taints = taints;
                taints.push(serde_json::json!({
                    "key": HOLD_TAINT_KEY, "value": owner, "effect": "NoSchedule",
                }));
                serde_json::json!({
                    "metadata": {
                        "resourceVersion": n.metadata.resource_version,
                        "annotations": {CORDON_ANNOTATION: owner},
                    },
                    "spec": {"taints": taints},
                })
            }
            (false, Some(o)) if o == owner => {
                let taints: Vec<serde_json::Value> = taints
                    .into_iter()
                    .filter(|t| t["key"] != HOLD_TAINT_KEY)
                    .collect();
                serde_json::json!({
                    "metadata": {
                        "resourceVersion": n.metadata.resource_version,
                        "annotations": {CORDON_ANNOTATION: null},
                    },
                    "spec": {"taints": if taints.is_empty() { serde_json::Value::Null } else { serde_json::Value::from(taints) }},
                })
            }
            _ => return Ok(()),
        };
        api.patch(
            node,
            &crate::runtime::kube::patch_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }
    pub(super) async fn cordon_action(&self, attempt: &str, node: &str, owner: &str, cordon: bool) {
        if self.mode != Mode::On {
            return;
        }
        match self.set_cordon(node, owner, cordon).await {
            Ok(()) => info!(attempt, node, cordon, "node cordon set"),
            Err(e) => {
                self.shared.metrics.api_error("patch_node");
                warn!(attempt, node, cordon, error = %e, "changing the node's cordon failed; retrying");
            }
        }
    }
    /// The Eviction API (a dry run with `dry_run`), see [`crate::remediation::eviction`].
    pub(super) async fn evict(
        &self,
        namespace: &str,
        pod: &str,
        uid: &str,
        dry_run: bool,
    ) -> EvictionResult {
        crate::remediation::eviction::evict(
            &self.evict_client,
            &self.client,
            &self.shared.metrics,
            namespace,
            pod,
            uid,
            dry_run,
        )
        .await
    }
    pub(super) async fn persist(&self, next: &Attempt) -> Result<(), String> {
        let key = owner_key(next);
        if !self.read.contains(&key) {
            // Never overwrite a record that was not read.
            return Err(format!(
                "the attempts record of {key} was not read (unreadable, or not listed yet)"
            ));
        }
        let mine = self
            .attempts
            .values()
            .filter(|a| a.id != next.id && owner_key(a) == key)
            .chain(std::iter::once(next));
        let record = AttemptsRecord::from_attempts(mine);
        if let Some(w) = &next.workload {
            return crate::edge::workloads::persist(
                &self.client,
                &next.namespace,
                w,
                &record.to_json(),
            )
            .await
            .map_err(|e| e.to_string());
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &next.namespace, &nodeset_resource());
        let patch = serde_json::json!({
            "metadata": {"annotations": {ATTEMPTS_ANNOTATION: record.to_json()}}
        });
        api.patch(
            &next.nodeset,
            &crate::runtime::kube::patch_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    }
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn event(
        &self,
        snap: &EvaluationSnapshot,
        namespace: &str,
        pod: &str,
        uid: &str,
        owner: Owner<'_>,
        reason: EventReason,
        message: &str,
    ) -> bool {
        let note = crate::runtime::events::event_note(message);
        let ev = Event {
            type_: if reason.warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note),
            action: "Remediate".into(),
            secondary: None,
        };
        let mut refs = vec![ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(pod.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }];
        match owner {
            Owner::NodeSet(nodeset) => {
                if let Some(ns) = snap
                    .nodesets
                    .iter()
                    .find(|n| n.model.namespace == namespace && n.model.name == nodeset)
                {
                    refs.push(ObjectReference {
                        api_version: Some("slinky.slurm.net/v1beta1".into()),
                        kind: Some("NodeSet".into()),
                        namespace: Some(namespace.into()),
                        name: Some(nodeset.into()),
                        uid: ns.uid.clone(),
                        ..Default::default()
                    });
                }
            }
            Owner::Workload(w) => {
                if let Some(o) = Workloads::new(&snap.workloads).get(namespace, w) {
                    refs.push(ObjectReference {
                        api_version: Some("apps/v1".into()),
                        kind: Some(w.kind.as_str().into()),
                        namespace: Some(namespace.into()),
                        name: Some(w.name.clone()),
                        uid: o.uid.clone(),
                        ..Default::default()
                    });
                }
            }
        }
        self.publish(&ev, refs, reason).await
    }
    /// One Warning Event on the workload of `bad` (not on its pods: the
    /// annotation is the workload's), saying what is wrong and what is
    /// accepted. False when it was not published.
    pub(super) async fn workload_event(
        &self,
        snap: &EvaluationSnapshot,
        bad: &AnnotationProblem,
    ) -> bool {
        let reason = EventReason::InvalidRemediationAnnotation;
        let Some(o) = Workloads::new(&snap.workloads).get(&bad.namespace, &bad.workload) else {
            return true;
        };
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.as_str().into(),
            note: Some(crate::runtime::events::event_note(&format!(
                "{}; nothing is remediated for this workload until the annotation is fixed",
                bad.message
            ))),
            action: "Remediate".into(),
            secondary: None,
        };
        let r = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some(bad.workload.kind.as_str().into()),
            namespace: Some(bad.namespace.clone()),
            name: Some(bad.workload.name.clone()),
            uid: o.uid.clone(),
            ..Default::default()
        };
        self.publish(&ev, vec![r], reason).await
    }
    /// Publishes `ev` on each of `refs`; false when any failed.
    pub(super) async fn publish(
        &self,
        ev: &Event,
        refs: Vec<ObjectReference>,
        reason: EventReason,
    ) -> bool {
        let mut ok = true;
        for r in refs {
            match tokio::time::timeout(Duration::from_secs(10), self.recorder.publish(ev, &r)).await
            {
                Ok(Ok(())) => {
                    self.shared
                        .metrics
                        .events
                        .with_label_values(&[reason.as_str()])
                        .inc();
                }
                _ => {
                    ok = false;
                    self.shared.metrics.api_error("create_event");
                    warn!(reason = reason.as_str(), object = ?r.name, "publishing a remediation event failed");
                }
            }
        }
        ok
    }
}

pub(super) fn write_result(r: Result<(), SlurmError>) -> WriteResult {
    match r {
        Ok(()) => WriteResult::Ok,
        Err(e) => WriteResult::Err {
            // A node slurmctld does not know right now: the reads decide,
            // within the machine's not-found bound.
            transient: e.is_transient() || matches!(e, SlurmError::NotFound { .. }),
            message: e.to_string(),
        },
    }
}
