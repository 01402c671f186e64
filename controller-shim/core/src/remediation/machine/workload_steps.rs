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
//!   hold is lifted once the old pod is gone from the API (the kubelet
//!   unregisters a pod before its object goes: `SyncTerminatedPod`,
//!   pkg/kubelet/kubelet.go), so the replacement lands on another node or,
//!   after that, on this one.
//! * Evicting: the Eviction API, with the pod's UID as precondition; a
//!   refusal (a PodDisruptionBudget's 429) is retried with backoff until
//!   the eviction timeout, never turned into a delete. Before every request
//!   the workload's pods are recorded (persisted first): none of them is
//!   the replacement.
//! * AwaitingReplacement: the owner's replacement, found its kind's way
//!   ([`crate::remediation::workload::replacement`]).
//! * Verifying: the replacement's verdicts on the node it landed on; a
//!   replacement still stale (a DaemonSet's on a node whose cache is
//!   pinned, say) fails the attempt, and the planner never selects that
//!   replacement again.

use super::actions::{Action, EventReason};
use super::attempt::{FailReason, Finding, Phase};
use super::observations::{NewPodCheck, NodeCordon, Observations, WorkloadObservation};
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
                    } else if !self.held_off(kind, obs) {
                        // Waiting for our hold on the node.
                    } else {
                        self.goto(Phase::Evicting);
                        let f = self.a.findings.first().map_or(String::new(), Finding::note);
                        let msg = format!(
                            "remediation {} of {} ({}){f}: evicting it through the Eviction API",
                            self.a.id,
                            self.pod_label(),
                            self.owner_label()
                        );
                        self.event(EventReason::RemediationStarted, msg);
                        self.evict(w);
                    }
                }
            }
            Phase::Evicting => {
                if !self.evicted(obs) && !self.eviction_timed_out(obs) && self.due() {
                    match &obs.workload {
                        Some(WorkloadObservation {
                            hold: Some(why), ..
                        }) => {
                            self.a.retry.last_error = Some(format!("not evicted: {why}"));
                        }
                        Some(w) if self.held_off(kind, obs) => self.evict(w),
                        _ => {}
                    }
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
    /// DaemonSet's only while our taint holds new pods off the node, asking
    /// for it when it is not there (a hold of someone else's on the node:
    /// wait). A ReplicaSet replaces a pod as soon as it is being deleted
    /// (pkg/controller/replicaset/replica_set.go, `manageReplicas`; a pod
    /// with a deletionTimestamp is not active,
    /// pkg/controller/controller_utils.go `IsPodActive`), a DaemonSet as
    /// soon as it is deleted and terminal, which the kubelet reports before
    /// it unregisters the pod (pkg/controller/daemon/daemon_controller.go,
    /// `getNodesToDaemonPods`); the scheduler's TaintToleration filter
    /// keeps the first off the node, and the DaemonSet controller creates
    /// no pod for a node with a NoSchedule taint its pods do not tolerate
    /// (`NodeShouldRunDaemonPod`, `predicates`).
    fn held_off(&mut self, kind: WorkloadKind, obs: &Observations) -> bool {
        if kind == WorkloadKind::StatefulSet {
            return true;
        }
        match obs.cordon {
            NodeCordon::Ours => true,
            NodeCordon::Free => {
                if self.due() {
                    if !self.a.cordon_requested || self.a.cordon_released {
                        self.a.cordon_requested = true;
                        self.a.cordon_released = false;
                        self.actions.push(Action::Persist);
                    }
                    self.wrote();
                    self.actions.push(Action::CordonNode {
                        node: self.a.node.clone(),
                        owner: self.a.id.clone(),
                    });
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

    /// Lifts our hold once the old pod is gone from the API.
    fn release_hold_once_gone(&mut self, obs: &Observations) {
        let gone = obs
            .workload
            .as_ref()
            .is_some_and(|w| !w.pods.iter().any(|p| p.uid == self.a.pod_uid));
        if gone && obs.pod_uid.as_deref() != Some(self.a.pod_uid.as_str()) {
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
        self.wrote();
        self.actions.push(Action::Evict {
            namespace: self.a.namespace.clone(),
            pod: self.a.pod.clone(),
            uid: self.a.pod_uid.clone(),
        });
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
                self.goto(Phase::Succeeded);
                let msg = format!(
                    "remediation {} of {} ({}): replacement {new} verified fresh on node {on}",
                    self.a.id,
                    self.pod_label(),
                    self.owner_label()
                );
                self.event(EventReason::RemediationSucceeded, msg);
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
