//! What the executor decides before stepping: recovery of the attempts and
//! drains found on a (re)start, the round's new attempts and notices, and
//! the sweep of `mountguard:` drains no open attempt owns.

use super::observe::{hold_owner, nodeset_models};
use super::*;

impl Executor {
    /// Plans the round (only for NodeSets whose record was read: a new
    /// attempt is persisted into that record): new attempts, dry-run and
    /// pinned notices as Events, bad workload annotations told once.
    /// Returns the round's candidates (the summary counts the failed
    /// attempts whose pods are still among them).
    pub(super) async fn plan_round(
        &mut self,
        snap: &EvaluationSnapshot,
        workloads: &Workloads<'_>,
        now: Timestamp,
    ) -> Vec<Candidate> {
        // Plan (only for NodeSets whose record was read: a new attempt is
        // persisted into that record).
        let attempts: Vec<Attempt> = self.attempts.values().cloned().collect();
        let cands: Vec<Candidate> = candidates(&snap.verdicts, |p| workloads.of_pod(p))
            .into_iter()
            .filter(|c| self.read.contains(&candidate_owner_key(c)))
            .collect();
        let nodesets = match self.slurm {
            Some(_) => nodeset_infos(&nodeset_models(snap), &snap.nodeset_pods, &self.attempts),
            None => Vec::new(),
        };
        let infos = workloads.infos();
        for bad in self
            .annotation_notices
            .news(&infos, &self.plan_cfg.workload_kinds)
        {
            warn!(namespace = %bad.namespace, workload = %bad.workload, message = %bad.message, "workload annotation not understood; its pods are not remediated");
            if !self.workload_event(snap, &bad).await {
                self.annotation_notices.untold(&bad);
            }
        }
        let p = plan(&cands, &nodesets, &infos, &attempts, now, &self.plan_cfg);
        for (pod, why) in &p.waiting {
            debug!(pod, why, "remediation waits");
        }
        self.metrics
            .remediation_blocked
            .with_label_values(&["pinned"])
            .set(p.blocked.len() as i64);
        for n in p.dry_run.iter().chain(p.blocked.iter()) {
            if !self.notified.insert((n.uid.clone(), n.reason.as_str())) {
                continue;
            }
            info!(pod = %format!("{}/{}", n.namespace, n.pod), reason = n.reason.as_str(), message = %n.message, "remediation notice");
            if n.reason == EventReason::RemediationDryRun {
                self.metrics
                    .remediation_attempts
                    .with_label_values(&["Pending", "dry_run"])
                    .inc();
            }
            let owner = match &n.workload {
                Some(w) => Owner::Workload(w),
                None => Owner::NodeSet(&n.nodeset),
            };
            let published = self
                .event(
                    snap,
                    &n.namespace,
                    &n.pod,
                    &n.uid,
                    owner,
                    n.reason,
                    &n.message,
                )
                .await;
            if !published {
                // Told nobody: try again next round.
                self.notified.remove(&(n.uid.clone(), n.reason.as_str()));
            }
        }
        for a in p.start {
            info!(attempt = %a.id, pod = %format!("{}/{}", a.namespace, a.pod), owner = %owner_key(&a), slurm_node = %a.slurm_node, "remediation attempt selected");
            self.attempts.insert(a.id.clone(), a);
        }
        cands
    }

    /// Reconciles persisted attempts and `mountguard:` drains. False: try
    /// again next round (Slurm unreadable, or the Lease not confirmed).
    pub(super) async fn recover(&mut self, snap: &EvaluationSnapshot, now: Timestamp) -> bool {
        let nodes = match &self.slurm {
            None => Vec::new(),
            Some(slurm) => match slurm.nodes().await {
                Ok(n) => n,
                Err(e) => {
                    self.shared.metrics.api_error("slurm_list_nodes");
                    warn!(error = %e, "remediation recovery: cannot list Slurm nodes; retrying");
                    return false;
                }
            },
        };
        let view = View::read(
            self.records(snap),
            snap.nodesets_synced && snap.workloads_synced,
        );
        for (nodeset, e) in &view.unreadable {
            warn!(owner = %nodeset, error = %e, "unreadable remediation attempts: nothing is written to this object and no orphan drain is released until the annotation is fixed or removed");
        }
        let complete = view.complete();
        let persisted = view.attempts.clone();
        let states: Vec<(String, mountguard_core::remediation::SlurmNodeState)> = nodes
            .iter()
            .map(|n| (n.name.clone(), n.to_state()))
            .collect();
        let r = recover(&persisted, &states, complete);
        // Orphan drains (none without slurmrestd: no Slurm node was read).
        for rel in &r.release {
            let Some(slurm) = self.slurm.clone() else {
                break;
            };
            if self.mode != Mode::On {
                info!(node = %rel.node, reason = %rel.reason, "dry-run: would release a mountguard drain without a live attempt");
                continue;
            }
            if !self.may_write().await {
                return false;
            }
            match slurm.release_if_reason(&rel.node, &rel.reason).await {
                Ok(true) => {
                    info!(node = %rel.node, reason = %rel.reason, "released a mountguard drain without a live attempt")
                }
                Ok(false) => {}
                Err(e) => {
                    warn!(node = %rel.node, error = %e, "releasing an orphan mountguard drain failed; retrying");
                    return false;
                }
            }
        }
        let cordoned: Vec<(String, String)> = match Api::<Node>::all(self.client.clone())
            .list(&Default::default())
            .await
        {
            // A hold whose attempt is not in the records read is unknown,
            // not orphaned, while the view is incomplete; without
            // slurmrestd no NodeSet record is read, so only while there
            // is no NodeSet at all.
            Ok(_) if !complete || (self.slurm.is_none() && !snap.nodesets.is_empty()) => Vec::new(),
            Ok(l) => l
                .items
                .iter()
                .filter_map(|n| Some((n.metadata.name.clone()?, hold_owner(n)?)))
                .collect(),
            Err(e) => {
                self.shared.metrics.api_error("list_nodes");
                warn!(error = %e, "remediation recovery: cannot list nodes; retrying");
                return false;
            }
        };
        for (node, owner) in orphan_cordons(&persisted, &cordoned) {
            if self.mode != Mode::On {
                info!(
                    node,
                    owner,
                    "dry-run: would uncordon a node mountguard cordoned without a live attempt"
                );
                continue;
            }
            if !self.may_write().await {
                return false;
            }
            if let Err(e) = self.set_cordon(&node, &owner, false).await {
                self.shared.metrics.api_error("patch_node");
                warn!(node, error = %e, "releasing an orphan mountguard cordon failed; retrying");
                return false;
            }
            info!(
                node,
                owner, "released a mountguard cordon without a live attempt"
            );
        }
        self.attempts.clear();
        for a in persisted {
            self.attempts.insert(a.id.clone(), a);
        }
        self.read = view.read.into_iter().collect();
        self.unreadable = view.unreadable.into_iter().collect();
        self.last_sweep = Some(now);
        info!(
            resumed = r.resume.len(),
            released = r.release.len(),
            complete,
            "remediation recovery done"
        );
        self.recovered = true;
        true
    }
    /// Releases `mountguard:` drains that no known open attempt owns.
    pub(super) async fn sweep(&mut self, now: Timestamp) {
        self.last_sweep = Some(now);
        if !self.unreadable.is_empty() {
            debug!("orphan sweep skipped: some attempt records are unreadable");
            return;
        }
        let Some(slurm) = self.slurm.clone() else {
            return;
        };
        let nodes = match slurm.nodes().await {
            Ok(n) => n,
            Err(e) => {
                self.shared.metrics.api_error("slurm_list_nodes");
                debug!(error = %e, "orphan sweep: cannot list Slurm nodes");
                return;
            }
        };
        let states: Vec<(String, mountguard_core::remediation::SlurmNodeState)> = nodes
            .iter()
            .map(|n| (n.name.clone(), n.to_state()))
            .collect();
        let known: Vec<Attempt> = self.attempts.values().cloned().collect();
        for rel in recover(&known, &states, true).release {
            if self.mode != Mode::On {
                info!(node = %rel.node, reason = %rel.reason, "dry-run: would release a mountguard drain without a live attempt");
                continue;
            }
            if !self.may_write().await {
                return;
            }
            match slurm.release_if_reason(&rel.node, &rel.reason).await {
                Ok(true) => {
                    info!(node = %rel.node, reason = %rel.reason, "released a mountguard drain without a live attempt")
                }
                Ok(false) => {}
                Err(e) => {
                    self.shared.metrics.api_error("slurm_undrain");
                    warn!(node = %rel.node, error = %e, "releasing an orphan mountguard drain failed; retrying at the next sweep");
                }
            }
        }
    }
}
