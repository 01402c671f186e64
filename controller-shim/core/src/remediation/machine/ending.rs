//! How an attempt ends: entering Failed (deciding whether our drain is
//! kept for an operator or handed back), the release while Failed, the
//! Undraining phase after a verified replacement, and the hand-back both
//! share ([`Stepper::hand_back`]); also the release of a grouped
//! attempt's cordon.

use super::actions::{Action, EventReason};
use super::attempt::{FailReason, Phase};
use super::observations::{
    FailurePolicy, NodeCordon, Observations, SlurmNodeState, SlurmObservation,
};
use super::stepper::Stepper;

/// How [`Stepper::hand_back`] releases our drain of a node Slurm shows in
/// FAIL (our hold) when there is no earlier drain to restore.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FailHandling {
    /// After a failure: FAIL first becomes our DRAIN, then is undrained; a
    /// DOWN (a slurmd still not answering) stays, as an undrain leaves it.
    DrainFirst,
    /// After a verified replacement (Undraining): a node in DOWN or FAIL is
    /// resumed, any other undrained.
    Resume,
}

impl Stepper<'_> {
    /// Enters Failed, deciding what happens to our drain.
    pub(super) fn fail(&mut self, reason: FailReason, detail: String, obs: &Observations) {
        let pod_touched = self.a.evicted_at.is_some();
        // Someone else's drain from before is always handed back: the node
        // stays closed to jobs either way, under their reason.
        let release = self.a.drain_requested
            && (self.a.prior_drain.is_some()
                || match self.cfg.on_failure {
                    FailurePolicy::Auto => !pod_touched,
                    FailurePolicy::KeepDrained => false,
                    FailurePolicy::Undrain => true,
                });
        self.a.failure = Some(format!("{}: {detail}", reason.as_str()));
        self.a.release_pending = release;
        self.a.kept_drained = self.a.drain_requested && !release;
        self.goto(Phase::Failed(reason));
        let node_word = if self.a.workload.is_some() {
            String::new()
        } else if let (true, Some(p)) = (release, &self.a.prior_drain) {
            format!(
                "handing Slurm node {} back with the drain {:?} had set ({:?})",
                self.a.slurm_node, p.set_by, p.reason
            )
        } else if release {
            format!(
                "releasing mountguard's drain of Slurm node {}",
                self.a.slurm_node
            )
        } else if self.a.kept_drained {
            format!(
                "Slurm node {} kept drained with reason {:?}; fix the cause, then undrain it (scontrol update nodename={} state=resume)",
                self.a.slurm_node, self.a.drain_reason, self.a.slurm_node
            )
        } else {
            format!(
                "Slurm node {} was not drained by mountguard",
                self.a.slurm_node
            )
        };
        let node_word = if node_word.is_empty() {
            node_word
        } else {
            format!("; {node_word}")
        };
        let rest = format!(" failed ({}): {detail}{node_word}", reason.as_str());
        self.attempt_event(EventReason::RemediationFailed, rest);
        self.failed(obs);
    }

    /// Failed: release our drain if pending, notice when a kept drain is
    /// released by an operator.
    pub(super) fn failed(&mut self, obs: &Observations) {
        self.release_cordon(obs);
        let SlurmObservation::Node(n) = &obs.slurm else {
            // A node unknown for longer than the bound is gone, and our
            // drain with it; before that the release stays pending (one
            // "not found" proves nothing).
            if matches!(obs.slurm, SlurmObservation::NotFound)
                && (self.a.release_pending || self.a.kept_drained)
                && self.not_found_for_good()
            {
                self.a.release_pending = false;
                self.a.kept_drained = false;
                self.actions.push(Action::Persist);
            }
            return;
        };
        if self.a.owns(n) {
            if self.a.release_pending {
                self.hand_back(n, FailHandling::DrainFirst);
            }
        } else if self.a.release_pending || self.a.kept_drained {
            // Released (by us or by an operator): nothing of ours remains.
            self.a.release_pending = false;
            self.a.kept_drained = false;
            self.actions.push(Action::Persist);
        }
    }

    /// Hands the node we hold back, when due: the drain someone had set
    /// before ours is restored; otherwise our drain is released, a node in
    /// FAIL as `on_fail` says.
    fn hand_back(&mut self, n: &SlurmNodeState, on_fail: FailHandling) {
        if !self.due() {
            return;
        }
        self.wrote();
        let node = self.a.slurm_node.clone();
        let owned_reason = self.a.drain_reason.clone();
        self.actions.push(match &self.a.prior_drain {
            Some(prior) => Action::RestoreDrain {
                node,
                owned_reason,
                prior: prior.clone(),
            },
            None => match on_fail {
                FailHandling::DrainFirst if n.has("FAIL") => Action::DrainNode {
                    node,
                    reason: owned_reason,
                },
                FailHandling::Resume if n.has("DOWN") || n.has("FAIL") => {
                    Action::ResumeNode { node, owned_reason }
                }
                _ => Action::UndrainNode { node, owned_reason },
            },
        });
    }

    /// Releases our cordon (grouped attempts), or notices it is gone.
    pub(super) fn release_cordon(&mut self, obs: &Observations) {
        if !self.a.cordon_pending() {
            return;
        }
        match obs.cordon {
            NodeCordon::Ours => {
                if self.due() {
                    self.wrote();
                    self.actions.push(Action::UncordonNode {
                        node: self.a.node.clone(),
                        owner: self.a.hold_owner().unwrap_or_default().to_string(),
                    });
                }
            }
            NodeCordon::Free | NodeCordon::Foreign => {
                self.a.cordon_released = true;
                self.a.hold_since = None;
                self.a.hold_lifting = false;
                self.actions.push(Action::Persist);
            }
            NodeCordon::NotRead => {}
        }
    }

    pub(super) fn start_undrain(&mut self, slurm: &SlurmObservation) {
        self.goto(Phase::Undraining);
        self.undraining(&Observations {
            slurm: slurm.clone(),
            ..Default::default()
        });
    }

    pub(super) fn undraining(&mut self, obs: &Observations) {
        if let Some(msg) = self.slurm_write_error(obs) {
            self.fail(FailReason::UndrainRejected, msg, obs);
            return;
        }
        match &obs.slurm {
            SlurmObservation::Node(n) if self.a.owns(n) => self.hand_back(n, FailHandling::Resume),
            SlurmObservation::Node(n)
                if self.a.prior_drain.as_ref().is_some_and(|p| p.restored(n)) =>
            {
                let p = self.a.prior_drain.clone().unwrap_or_default();
                self.succeed(format!(
                    ": replacement verified fresh and Slurm node {} responding; handed back with the drain {:?} had set ({:?}): {:?}",
                    self.a.slurm_node, p.set_by, p.reason, n.state
                ));
            }
            SlurmObservation::Node(n) => {
                let left = if n.held() {
                    self.a.foreign_drain = Some(n.reason.clone());
                    format!(
                        "; Slurm node {} left drained: its reason is now {:?} (set by {:?}), not mountguard's",
                        self.a.slurm_node, n.reason, n.reason_set_by_user
                    )
                } else {
                    String::new()
                };
                self.succeed(format!(
                    ": replacement verified fresh and Slurm node {} responding{left}",
                    self.a.slurm_node
                ));
            }
            SlurmObservation::NotFound => {
                if self.not_found_for_good() {
                    self.fail(
                        FailReason::SlurmNodeNotFound,
                        format!("Slurm node {} vanished", self.a.slurm_node),
                        obs,
                    );
                }
            }
            _ => self.read_error(obs),
        }
    }
}
