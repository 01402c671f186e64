//! The attempt being stepped and the checks every phase shares: entering
//! a phase (with its Persist), Events, retry pacing and backoff, the
//! settle time after a write, slurmrestd errors, a Slurm node unknown for
//! good, the hold kept on the node after the eviction, the eviction's
//! outcome, and the order of a step's actions (Persist first).

use jiff::{SignedDuration, Timestamp};

use super::actions::{Action, EventReason};
use super::attempt::{Attempt, FailReason, Finding, Phase, PhaseEntry, Retry};
use super::observations::{
    EvictionResult, MachineConfig, Observations, SlurmObservation, WriteResult,
};

/// One attempt being stepped: the next attempt and the actions so far.
pub(super) struct Stepper<'c> {
    pub(super) a: Attempt,
    pub(super) actions: Vec<Action>,
    pub(super) now: Timestamp,
    pub(super) cfg: &'c MachineConfig,
}

impl Stepper<'_> {
    pub(super) fn goto(&mut self, to: Phase) {
        let from = self.a.phase;
        self.a.phase = to;
        self.a.phase_since = self.now;
        self.a.history.push(PhaseEntry {
            phase: to,
            at: self.now,
        });
        self.a.retry = Retry::default();
        self.actions.push(Action::Transition { from, to });
        self.actions.push(Action::Persist);
    }

    pub(super) fn event(&mut self, reason: EventReason, message: String) {
        self.actions.push(Action::Event { reason, message });
    }

    /// An Event about the attempt and its pod: "remediation {id} of
    /// {namespace}/{pod}" followed by `rest`.
    pub(super) fn attempt_event(&mut self, reason: EventReason, rest: impl std::fmt::Display) {
        let message = format!("remediation {} of {}{rest}", self.a.id, self.pod_label());
        self.event(reason, message);
    }

    /// Enters `to` and sends RemediationStarted: the attempt and its pod,
    /// `owner` (empty, or the owner in parentheses), what was found, then
    /// `what` is done.
    pub(super) fn start(&mut self, to: Phase, owner: &str, what: impl std::fmt::Display) {
        self.goto(to);
        let f = self.a.findings.first().map_or(String::new(), Finding::note);
        self.attempt_event(
            EventReason::RemediationStarted,
            format!("{owner}{f}: {what}"),
        );
    }

    /// Enters Succeeded and sends RemediationSucceeded: the attempt and
    /// its pod followed by `rest`.
    pub(super) fn succeed(&mut self, rest: impl std::fmt::Display) {
        self.goto(Phase::Succeeded);
        self.attempt_event(EventReason::RemediationSucceeded, rest);
    }

    pub(super) fn due(&self) -> bool {
        self.a.retry.not_before.is_none_or(|t| self.now >= t)
    }

    pub(super) fn error(&mut self, message: String, at_least: Option<SignedDuration>) {
        let r = &mut self.a.retry;
        r.failures = r.failures.saturating_add(1);
        let shift = r.failures.saturating_sub(1).min(16);
        let mut delay = self
            .cfg
            .retry_base
            .checked_mul(1i32 << shift)
            .unwrap_or(self.cfg.retry_max)
            .min(self.cfg.retry_max);
        if let Some(min) = at_least {
            delay = delay.max(min);
        }
        r.not_before = Some(self.now + delay);
        r.last_error = Some(message);
    }

    pub(super) fn wrote(&mut self) {
        self.a.retry.not_before = Some(self.now + self.cfg.write_settle);
    }

    /// The first write of the attempt on its Slurm node, and its re-issue:
    /// our DRAIN, or with `fail_first` our FAIL hold at once (recorded as
    /// requested, so the Drained step does not ask for it again).
    pub(super) fn close_node(&mut self) {
        self.wrote();
        let node = self.a.slurm_node.clone();
        let reason = self.a.drain_reason.clone();
        if self.cfg.fail_first {
            self.a.hold_requested = true;
            self.actions.push(Action::HoldNode { node, reason });
        } else {
            self.actions.push(Action::DrainNode { node, reason });
        }
    }

    /// Asks for the eviction of the attempt's pod (by its UID).
    pub(super) fn evict_pod(&mut self) {
        self.wrote();
        self.actions.push(Action::Evict {
            namespace: self.a.namespace.clone(),
            pod: self.a.pod.clone(),
            uid: self.a.pod_uid.clone(),
        });
    }

    pub(super) fn elapsed_since(&self, t: Timestamp) -> SignedDuration {
        self.now.duration_since(t)
    }

    pub(super) fn pod_label(&self) -> String {
        format!("{}/{}", self.a.namespace, self.a.pod)
    }

    pub(super) fn slurm_write_error(&mut self, obs: &Observations) -> Option<String> {
        match &obs.slurm_write {
            Some(WriteResult::Err {
                transient: false,
                message,
            }) => Some(message.clone()),
            Some(WriteResult::Err {
                transient: true,
                message,
            }) => {
                self.error(format!("slurmrestd: {message}"), None);
                None
            }
            _ => None,
        }
    }

    /// "Not found" once more: true when it has lasted the whole
    /// [`MachineConfig::not_found_grace`] (then it counts), else a
    /// transient error retried with backoff.
    pub(super) fn not_found_for_good(&mut self) -> bool {
        let since = *self.a.not_found_since.get_or_insert(self.now);
        if self.elapsed_since(since) >= self.cfg.not_found_grace {
            return true;
        }
        let msg = format!(
            "slurmrestd does not know Slurm node {} (since {since}); retrying",
            self.a.slurm_node
        );
        self.error(msg, None);
        false
    }

    /// After the eviction: the Slinky operator's preStop hook replaces our
    /// reason with its own (and sets DOWN), and its syncCordon then
    /// undrains any node whose reason is its own or empty (our FAIL hold
    /// survives both, but the reason is no longer ours). Keep the node
    /// ours until the verification: note the hook's DOWN, and set the hold
    /// again with our reason (an administrator's reason is left alone).
    /// Returns whether the node is not held by our drain right now (then
    /// nothing is verified this step). An attempt on a node that was
    /// absent from slurmctld holds nothing: the node comes back by the
    /// replacement's registration and is left as Slurm makes it.
    pub(super) fn hold_drain_after_eviction(&mut self, obs: &Observations) -> bool {
        let SlurmObservation::Node(n) = &obs.slurm else {
            return false;
        };
        if self.a.evicted_at.is_none() || self.a.owns(n) || self.a.slurm_absent {
            return false;
        }
        let operators = n.reason.is_empty()
            || n.reason
                .starts_with(crate::remediation::OPERATOR_REASON_PREFIX);
        if !operators || n.reason_is_mountguard() {
            return false;
        }
        if n.has("DOWN")
            && n.reason == crate::remediation::OPERATOR_PRESTOP_REASON
            && !self.a.prestop_down
        {
            self.a.prestop_down = true;
            self.actions.push(Action::Persist);
        }
        if self.due() {
            self.wrote();
            self.actions.push(Action::HoldNode {
                node: self.a.slurm_node.clone(),
                reason: self.a.drain_reason.clone(),
            });
        }
        true
    }

    /// Who replaces the pod: `the NodeSet`, or the workload.
    pub(super) fn owner_label(&self) -> String {
        match &self.a.workload {
            Some(w) => w.to_string(),
            None => "the NodeSet".to_string(),
        }
    }

    /// Evicting: whether the pod is evicted or gone (then the attempt
    /// moves on to AwaitingReplacement, with its Event); a refusal (429:
    /// a PodDisruptionBudget) or an error is retried with backoff, never
    /// turned into a delete.
    pub(super) fn evicted(&mut self, obs: &Observations) -> bool {
        let gone = obs.pod_uid.as_deref() != Some(self.a.pod_uid.as_str());
        if gone
            || matches!(
                obs.eviction,
                Some(EvictionResult::Evicted | EvictionResult::Gone)
            )
        {
            self.a.evicted_at = Some(self.now);
            self.goto(Phase::AwaitingReplacement);
            let verb = match self.a.workload {
                Some(_) => "replace",
                None => "recreate",
            };
            let msg = format!(
                "remediation {}: evicted {} (uid {}); waiting for {} to {verb} it",
                self.a.id,
                self.pod_label(),
                self.a.pod_uid,
                self.owner_label()
            );
            self.event(EventReason::PodEvicted, msg);
            return true;
        }
        match &obs.eviction {
            Some(EvictionResult::Refused {
                retry_after,
                message,
            }) => self.error(format!("eviction refused: {message}"), *retry_after),
            Some(EvictionResult::Error { message }) => {
                self.error(format!("eviction: {message}"), None)
            }
            _ => {}
        }
        false
    }

    /// Evicting: fails the attempt when the eviction was refused until the
    /// eviction timeout; returns whether it did.
    pub(super) fn eviction_timed_out(&mut self, obs: &Observations) -> bool {
        if self.elapsed_since(self.a.phase_since) < self.cfg.eviction_timeout {
            return false;
        }
        let msg = format!(
            "the eviction of {} was refused until the timeout: {}",
            self.pod_label(),
            self.a.retry.last_error.clone().unwrap_or_default()
        );
        self.fail(FailReason::EvictionTimeout, msg, obs);
        true
    }

    pub(super) fn read_error(&mut self, obs: &Observations) {
        if let SlurmObservation::Error { message, .. } = &obs.slurm {
            self.error(format!("slurmrestd: {message}"), None);
        }
    }
}

/// The actions of a step as performed: one Persist at most, and before
/// the first external write.
pub(super) fn ordered(actions: Vec<Action>) -> Vec<Action> {
    let mut seen = false;
    let mut out = Vec::with_capacity(actions.len());
    let first_write = actions.iter().position(Action::is_external_write);
    let needs_persist = actions.iter().any(|a| matches!(a, Action::Persist));
    for (i, a) in actions.into_iter().enumerate() {
        if matches!(a, Action::Persist) {
            if seen {
                continue;
            }
            seen = true;
        }
        if needs_persist && !seen && Some(i) == first_write {
            out.push(Action::Persist);
            seen = true;
        }
        out.push(a);
    }
    out
}
