//! The attempt on a pod of a Deployment, ReplicaSet, StatefulSet or
//! DaemonSet: the NodeSet attempt without its Slurm steps.
//!
//! ```text
//! Pending -> Evicting -> AwaitingReplacement -> Verifying -> Succeeded
//!   (any) -> Failed{reason}
//! ```
//!
//! * Pending: the pod must still be the one selected; the eviction waits
//!   while the workload is not fully available (the observation's `hold`),
//!   up to the eviction timeout. A Deployment's, ReplicaSet's or
//!   DaemonSet's pod is evicted only once new pods are held off its node
//!   (the `NoSchedule` taint [`crate::remediation::HOLD_TAINT_KEY`] naming
//!   the attempt): their controllers create the replacement before the old
//!   pod is gone, and a replacement started on the node before the old pod
//!   is unregistered there keeps the kubelet's cached entry for good. The
//!   hold is taken only after the Eviction API, asked with `dryRun`
//!   ([`Action::CheckEviction`]), said it would evict the pod now: a
//!   PodDisruptionBudget's refusal holds nothing, and is asked again after
//!   backoff, up to the eviction timeout. The hold is lifted once the old
//!   pod is gone from the API (the kubelet unregisters a pod before its
//!   object goes: `SyncTerminatedPod`, pkg/kubelet/kubelet.go), so the
//!   replacement lands on another node or, after that, on this one; and
//!   at the latest after [`MachineConfig::node_hold_timeout`].
//! * Evicting: the Eviction API, with the pod's UID as precondition; a
//!   refusal (a PodDisruptionBudget's 429) or an error lifts the hold at
//!   once, and the next try starts again with a dry run; never turned into
//!   a delete; refused until the eviction timeout, the attempt fails.
//!   Before every request the workload's pods are recorded (persisted
//!   first): none of them is the replacement.
//! * AwaitingReplacement: the owner's replacement, found its kind's way
//!   ([`crate::remediation::workload::replacement`]).
//! * Verifying: the replacement's verdicts on the node it landed on; a
//!   replacement still stale (a DaemonSet's on a node whose cache is
//!   pinned, say) fails the attempt, and the planner never selects that
//!   replacement again.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use super::actions::Action;
use super::attempt::{FailReason, Phase};
use super::observations::{
    EvictionResult, MachineConfig, NewPodCheck, NodeCordon, Observations, WorkloadObservation,
};
use super::stepper::Stepper;
use crate::remediation::workload::{WorkloadKind, replacement};

impl Stepper<'_> {
    /// One step of a workload pod's attempt.
    pub(super) fn step_workload(&mut self, obs: &Observations) {
        let Some(kind) = self.a.workload.as_ref().map(|w| w.kind) else {
            return;
        };
        match self.a.phase {
            Phase::Pending => {
                if obs.pod_uid.as_deref() != Some(self.a.pod_uid.as_str()) {
                    self.fail(
                        FailReason::PodChanged,
                        "the pod was deleted or replaced before anything was done".into(),
                        obs,
                    );
                } else if let Some(w) = &obs.workload {
                    if let Some(why) = &w.hold {
                        if self.elapsed_since(self.a.started_at) >= self.cfg.eviction_timeout {
                            let msg = format!(
                                "{} did not become fully available until the eviction timeout: {why}",
                                self.owner_label()
                            );
                            self.fail(FailReason::EvictionTimeout, msg, obs);
                        } else {
                            self.a.retry.last_error = Some(format!("not evicted: {why}"));
                        }
                    } else if kind != WorkloadKind::StatefulSet
                        && obs.cordon != NodeCordon::Ours
                        && self.elapsed_since(self.a.started_at) >= self.cfg.eviction_timeout
                    {
                        // Refused by dry runs (or another attempt's hold)
                        // all along: nothing was held or evicted.
                        let msg = format!(
                            "{} was not evicted until the eviction timeout: {}",
                            self.pod_label(),
                            self.a.retry.last_error.clone().unwrap_or_default()
                        );
                        self.fail(FailReason::EvictionTimeout, msg, obs);
                    } else if !self.ready_to_evict(kind, obs) {
                        // Waiting for a dry run's yes, or for our hold.
                    } else {
                        let owner = format!(" ({})", self.owner_label());
                        let what = "evicting it through the Eviction API";
                        self.start(Phase::Evicting, &owner, what);
                        self.evict(w);
                    }
                }
            }
            Phase::Evicting => {
                if self.evicted(obs) || self.eviction_timed_out(obs) {
                    return;
                }
                let refused = matches!(
                    obs.eviction,
                    Some(EvictionResult::Refused { .. } | EvictionResult::Error { .. })
                );
                match &obs.workload {
                    // Not taken: our hold goes at once (the retry starts
                    // with a dry run again).
                    _ if refused && self.a.cordon_pending() && !self.a.hold_lifting => {
                        self.lift_hold("the eviction was not accepted");
                    }
                    Some(WorkloadObservation {
                        hold: Some(why), ..
                    }) => {
                        self.a.retry.last_error = Some(format!("not evicted: {why}"));
                        if self.a.hold_lifting {
                            // Only carries the lift on; never evicts.
                            let _ = self.ready_to_evict(kind, obs);
                        } else if self.a.cordon_pending() {
                            self.lift_hold("the workload is not fully available");
                        }
                    }
                    Some(w) if self.ready_to_evict(kind, obs) && self.due() => self.evict(w),
                    _ => {}
                }
            }
            Phase::AwaitingReplacement => {
                self.release_hold_once_gone(obs);
                let found = obs.workload.as_ref().and_then(|w| {
                    replacement(
                        kind,
                        &self.a.pod,
                        &self.a.pod_uid,
                        &self.a.node,
                        &self.a.known_pods,
                        &w.pods,
                    )
                });
                match found {
                    Some(r) => {
                        self.a.new_pod_uid = Some(r.uid.clone());
                        self.a.new_pod_name = (r.name != self.a.pod).then(|| r.name.clone());
                        self.a.new_pod_node = r.node.clone();
                        self.goto(Phase::Verifying);
                    }
                    None => {
                        let since = self.a.evicted_at.unwrap_or(self.a.phase_since);
                        if self.elapsed_since(since) >= self.cfg.replacement_timeout {
                            let msg = format!(
                                "{} did not replace {} in time",
                                self.owner_label(),
                                self.pod_label()
                            );
                            self.fail(FailReason::ReplacementTimeout, msg, obs);
                        }
                    }
                }
            }
            Phase::Verifying => {
                self.release_hold_once_gone(obs);
                self.verify_workload_pod(kind, obs);
            }
            Phase::Succeeded | Phase::Failed(_) => self.release_cordon(obs),
            // Slurm phases: never entered by a workload's attempt.
            Phase::Draining | Phase::Drained | Phase::Undraining => {}
        }
    }

    /// Whether the pod may be evicted as far as its node's hold goes:
    /// always for a StatefulSet's, whose replacement has the old pod's name
    /// and so cannot exist before the old object is gone; a ReplicaSet's or
    /// DaemonSet's only while our taint holds new pods off the node. A
    /// ReplicaSet replaces a pod as soon as it is being deleted
    /// (pkg/controller/replicaset/replica_set.go, `manageReplicas`; a pod
    /// with a deletionTimestamp is not active,
    /// pkg/controller/controller_utils.go `IsPodActive`), a DaemonSet as
    /// soon as it is deleted and terminal, which the kubelet reports before
    /// it unregisters the pod (pkg/controller/daemon/daemon_controller.go,
    /// `getNodesToDaemonPods`); the scheduler's TaintToleration filter
    /// keeps the first off the node, and the DaemonSet controller creates
    /// no pod for a node with a NoSchedule taint its pods do not tolerate
    /// (`NodeShouldRunDaemonPod`, `predicates`).
    ///
    /// The hold is asked for only right after a dry run of the eviction
    /// said yes (else the dry run is asked, when due); a hold of someone
    /// else's: wait; a hold being lifted: lift it, then start over; a hold
    /// of ours older than [`MachineConfig::node_hold_timeout`]: lift it.
    fn ready_to_evict(&mut self, kind: WorkloadKind, obs: &Observations) -> bool {
        if kind == WorkloadKind::StatefulSet {
            return true;
        }
        if self.a.hold_lifting {
            match obs.cordon {
                NodeCordon::Ours if self.due() => {
                    self.wrote();
                    self.uncordon();
                }
                NodeCordon::Free | NodeCordon::Foreign => {
                    self.a.hold_lifting = false;
                    self.a.cordon_released = true;
                    self.a.hold_since = None;
                    self.actions.push(Action::Persist);
                }
                NodeCordon::Ours | NodeCordon::NotRead => {}
            }
            return false;
        }
        match obs.cordon {
            NodeCordon::Ours => {
                if hold_expired(&self.a, self.now, self.cfg) {
                    self.lift_hold("it lasted the node hold timeout");
                    return false;
                }
                true
            }
            NodeCordon::Free => {
                match &obs.eviction_check {
                    Some(EvictionResult::Evicted) => {
                        // The API would evict the pod now: hold the node,
                        // then evict (recorded before the hold).
                        self.a.cordon_requested = true;
                        self.a.cordon_released = false;
                        self.a.hold_since = Some(self.now);
                        self.actions.push(Action::Persist);
                        self.wrote();
                        self.actions.push(Action::CordonNode {
                            node: self.a.node.clone(),
                            owner: self.a.id.clone(),
                        });
                    }
                    Some(EvictionResult::Refused {
                        retry_after,
                        message,
                    }) => self.error(
                        format!("eviction refused (dry run; the node is not held): {message}"),
                        *retry_after,
                    ),
                    Some(EvictionResult::Error { message }) => {
                        self.error(format!("eviction (dry run): {message}"), None)
                    }
                    Some(EvictionResult::Gone) => self.error(
                        "eviction (dry run): the API does not find the pod".into(),
                        None,
                    ),
                    None if self.due() => self.actions.push(Action::CheckEviction {
                        namespace: self.a.namespace.clone(),
                        pod: self.a.pod.clone(),
                        uid: self.a.pod_uid.clone(),
                    }),
                    None => {}
                }
                false
            }
            NodeCordon::Foreign => {
                self.a.retry.last_error = Some(format!(
                    "node {} is held by another mountguard attempt; waiting",
                    self.a.node
                ));
                false
            }
            NodeCordon::NotRead => false,
        }
    }

    /// Starts lifting our hold before the eviction (recorded first): the
    /// request now, again after backoff until it shows gone.
    fn lift_hold(&mut self, why: &str) {
        self.a.hold_lifting = true;
        let last = self.a.retry.last_error.take().unwrap_or_default();
        self.a.retry.last_error = Some(if last.is_empty() {
            format!("hold on node {} lifted: {why}", self.a.node)
        } else {
            format!("{last}; hold on node {} lifted: {why}", self.a.node)
        });
        self.actions.push(Action::Persist);
        self.uncordon();
    }

    fn uncordon(&mut self) {
        self.actions.push(Action::UncordonNode {
            node: self.a.node.clone(),
            owner: self.a.hold_owner().unwrap_or_default().to_string(),
        });
    }

    /// Lifts our hold once the old pod is gone from the API, or once it
    /// lasted [`MachineConfig::node_hold_timeout`] (the old pod may still
    /// pin the cache: a replacement that lands on the node then is judged
    /// by its verdicts, and a stale one fails the attempt).
    fn release_hold_once_gone(&mut self, obs: &Observations) {
        let gone = obs
            .workload
            .as_ref()
            .is_some_and(|w| !w.pods.iter().any(|p| p.uid == self.a.pod_uid));
        if gone && obs.pod_uid.as_deref() != Some(self.a.pod_uid.as_str()) {
            self.release_cordon(obs);
        } else if self.a.cordon_pending() && hold_expired(&self.a, self.now, self.cfg) {
            if self.a.retry.last_error.is_none() {
                self.a.retry.last_error = Some(format!(
                    "hold on node {} lifted: it lasted the node hold timeout and the old pod is still there",
                    self.a.node
                ));
            }
            self.release_cordon(obs);
        }
    }

    /// Asks for the eviction, recording the workload's pods first.
    fn evict(&mut self, w: &WorkloadObservation) {
        let mut known: Vec<String> = w.pods.iter().map(|p| p.uid.clone()).collect();
        known.sort();
        if known != self.a.known_pods {
            self.a.known_pods = known;
            self.actions.push(Action::Persist);
        }
        self.evict_pod();
    }

    fn verify_workload_pod(&mut self, kind: WorkloadKind, obs: &Observations) {
        let pods = obs.workload.as_ref().map_or(&[][..], |w| &w.pods[..]);
        // A StatefulSet's name is its pod's: a newer pod under it (the
        // replacement replaced again) is the one to verify.
        if kind == WorkloadKind::StatefulSet
            && let Some(r) = replacement(
                kind,
                &self.a.pod,
                &self.a.pod_uid,
                &self.a.node,
                &self.a.known_pods,
                pods,
            )
            && self.a.new_pod_uid.as_deref() != Some(r.uid.as_str())
        {
            self.a.new_pod_uid = Some(r.uid.clone());
            self.a.new_pod_node = r.node.clone();
            self.actions.push(Action::Persist);
        }
        let current = pods
            .iter()
            .find(|p| !p.terminating && self.a.new_pod_uid.as_deref() == Some(p.uid.as_str()));
        if let Some(p) = current
            && p.node.is_some()
            && p.node != self.a.new_pod_node
        {
            // Scheduled since it was found.
            self.a.new_pod_node = p.node.clone();
            self.actions.push(Action::Persist);
        }
        let on = self.a.new_pod_node.clone().unwrap_or_else(|| "?".into());
        let new = format!(
            "{}/{} (uid {})",
            self.a.namespace,
            self.a.new_pod(),
            self.a.new_pod_uid.as_deref().unwrap_or("?")
        );
        match &obs.new_pod {
            NewPodCheck::StillStale { message } if current.is_some() => {
                let msg = format!(
                    "the replacement {new} on node {on} is still not fresh: {message}; it is not evicted again"
                );
                self.fail(FailReason::ReplacementStale, msg, obs);
            }
            NewPodCheck::Fresh if current.is_some() => {
                self.succeed(format!(
                    " ({}): replacement {new} verified fresh on node {on}",
                    self.owner_label()
                ));
            }
            _ => {
                if self.elapsed_since(self.a.phase_since) >= self.cfg.verification_timeout {
                    let why = if current.is_some() {
                        format!("no fresh inventory of the replacement {new} on node {on}")
                    } else {
                        format!("the replacement {new} is gone")
                    };
                    self.fail(FailReason::VerificationTimeout, why, obs);
                }
            }
        }
    }
}

/// Whether the attempt's hold has lasted the node hold timeout (a record
/// from before holds were timed counts from its eviction, or its phase).
fn hold_expired(a: &super::attempt::Attempt, now: jiff::Timestamp, cfg: &MachineConfig) -> bool {
    let since = a.hold_since.or(a.evicted_at).unwrap_or(a.phase_since);
    a.cordon_pending() && now.duration_since(since) >= cfg.node_hold_timeout
}
