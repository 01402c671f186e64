//! Stepping every open attempt: its observations (the pod, the
//! replacement's verdicts, the Slurm node and its group, the node's hold,
//! the results of its last writes) into the core's `step`, whose actions
//! `perform.rs` carries out.

use super::*;

impl Executor {
    /// Steps every open attempt once; false when the Lease was lost (the
    /// round stops).
    pub(super) async fn step_open(
        &mut self,
        snap: &EvaluationSnapshot,
        workloads: &Workloads<'_>,
        now: Timestamp,
    ) -> bool {
        let mut nodes: HashMap<String, Result<crate::remediation::slurm::SlurmNode, SlurmError>> =
            HashMap::new();
        let mut cordons: HashMap<String, Option<Node>> = HashMap::new();
        let open: Vec<String> = self
            .attempts
            .values()
            .filter(|a| a.is_open())
            .map(|a| a.id.clone())
            .collect();
        for id in open {
            let Some(a) = self.attempts.get(&id).cloned() else {
                continue;
            };
            // The pods of the attempt's owner: the pod under the attempt's
            // name, and the replacement's verdicts.
            let pods = match a.workload {
                Some(_) => &snap.workload_pods,
                None => &snap.nodeset_pods,
            };
            let pod_now = pods
                .iter()
                .find(|p| **p.namespace() == *a.namespace && *p.name == *a.pod);
            let pod_uid = pod_now.map(|p| p.uid.to_string());
            let replacement_started = pod_now.and_then(|p| slurmd_started_at(p));
            let new_pod = new_pod_check(
                &snap.verdicts,
                pods,
                snap.at,
                |node| snap.scanned_at.get(node).copied(),
                &a,
                &mut self.fresh_since,
            );
            if let Some(w) = &a.workload {
                // A ReplicaSet's or DaemonSet's pod is evicted only while
                // new pods are held off its node (the attempt is the
                // hold's owner).
                let cordon = match (w.kind, a.hold_owner()) {
                    (WorkloadKind::StatefulSet, _) | (_, None) => NodeCordon::NotRead,
                    (_, Some(owner)) => self.cordon(&mut cordons, &a.node, owner).await,
                };
                let obs = Observations {
                    pod_uid,
                    cordon,
                    new_pod,
                    eviction: self.last_eviction.remove(&id),
                    eviction_check: self.last_eviction_check.remove(&id),
                    workload: workloads.observe(&a.namespace, w, &snap.workload_pods),
                    ..Default::default()
                };
                let (next, actions) = step(&a, &obs, now, &self.machine_cfg);
                self.perform(snap, &a, next, actions).await;
                // Read the node's hold again next time it is needed.
                cordons.remove(&a.node);
                if self.lost {
                    self.pause("the Lease was lost");
                    return false;
                }
                continue;
            }
            let slurm = self.node(&mut nodes, &a.slurm_node).await;
            if matches!(
                slurm,
                SlurmObservation::Error {
                    transient: false,
                    ..
                }
            ) {
                self.refresh_secret(now, true).await;
            }
            let group_drained = match &a.group {
                Some(g) => {
                    let mut read = Vec::new();
                    for m in group_members(self.attempts.values(), g) {
                        read.push(self.node(&mut nodes, &m).await);
                    }
                    group_drained(&read)
                }
                None => false,
            };
            let (cordon, group_old_gone) = match &a.group {
                Some(g) => {
                    let cordon = self.cordon(&mut cordons, &a.node, g).await;
                    let live: HashSet<&PodUid> = snap.nodeset_pods.iter().map(|p| &p.uid).collect();
                    (cordon, group_old_gone(self.attempts.values(), g, &live))
                }
                None => (NodeCordon::NotRead, false),
            };
            let obs = Observations {
                slurm,
                pod_uid,
                new_pod,
                slurm_write: self.last_write.remove(&id),
                eviction: self.last_eviction.remove(&id),
                eviction_check: self.last_eviction_check.remove(&id),
                group_drained,
                cordon,
                group_old_gone,
                workload: None,
                replacement_started,
            };
            let (next, actions) = step(&a, &obs, now, &self.machine_cfg);
            if self.perform(snap, &a, next, actions).await {
                // Read the nodes again next time they are needed this round.
                nodes.remove(&a.slurm_node);
                cordons.remove(&a.node);
            }
            if self.lost {
                self.pause("the Lease was lost");
                return false;
            }
        }
        true
    }
}
