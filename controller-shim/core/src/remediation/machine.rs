//! The per-attempt state machine.
//!
//! ```text
//! NodeSet pod:  Pending -> Draining -> Drained -> Evicting
//!               -> AwaitingReplacement -> Verifying -> Undraining -> Succeeded
//! workload pod: Pending -> Evicting -> AwaitingReplacement -> Verifying
//!               -> Succeeded
//! NodeSet pod whose Slurm node slurmctld does not know (opt-in):
//!               Pending -> Evicting -> AwaitingReplacement -> Verifying
//!               -> Succeeded
//!        (any) -> Failed{reason}
//! ```
//!
//! [`step`] is pure: it takes the attempt, what the executor observed since
//! the last step ([`Observations`]), the current time and the configuration,
//! and returns the next attempt and the [`Action`]s to perform, in order.
//! Every transition emits [`Action::Persist`] *before* any external write of
//! the same step, so a crash after a write always finds a record of it.
//!
//! Progress is decided by what Slurm and the API show, never by the outcome
//! of our own writes alone: a write whose result was lost (crash, timeout) is
//! simply observed (or re-issued) on the next step. slurmrestd errors are
//! retried with backoff and never count as progress.
//!
//! This file answers what happens next for an attempt: [`step`], one arm
//! per phase, and the checks the arms share. The rest is split by what it
//! is:
//! * `attempt`: the phases, the failure reasons and the persisted attempt
//!   record, with the drain-reason ownership rules;
//! * `observations`: the configuration and what the executor observed;
//! * `actions`: what the executor must do, and the Event reasons;
//! * `stepper`: the attempt being stepped and the checks every phase
//!   shares (retries, backoff, slurmrestd errors);
//! * `ending`: how an attempt ends, failed (its drain kept or handed back)
//!   or undrained after a verified replacement;
//! * `workload_steps`: the attempt on a workload's pod (Deployment,
//!   ReplicaSet, StatefulSet, DaemonSet): the phases without Slurm;
//! * `absent`: the attempt on a NodeSet pod whose Slurm node slurmctld
//!   does not know: replaced without a drain, verified by registration.

mod absent;
mod actions;
mod attempt;
mod ending;
mod observations;
mod stepper;
mod workload_steps;

pub use actions::{Action, EventReason};
pub use attempt::{
    Attempt, AttemptsRecord, FailReason, Finding, Phase, PhaseEntry, PriorDrain, Retry,
    SLURM_NOT_RESPONDING, attempt_id, drain_reason, owns_reason, reason_as_written,
    reason_attempt_id, reason_is,
};
pub use observations::{
    AbsentNodePolicy, EvictionResult, FailurePolicy, MachineConfig, NewPodCheck, NodeCordon,
    Observations, SlurmNodeState, SlurmObservation, WorkloadObservation, WriteResult,
};

use jiff::Timestamp;

use stepper::Stepper;

/// One step of the state machine. Pure.
pub fn step(
    attempt: &Attempt,
    obs: &Observations,
    now: Timestamp,
    cfg: &MachineConfig,
) -> (Attempt, Vec<Action>) {
    let mut s = Stepper {
        a: attempt.clone(),
        actions: Vec::new(),
        now,
        cfg,
    };
    if s.a.workload.is_some() {
        s.step_workload(obs);
        return (s.a, stepper::ordered(s.actions));
    }
    let pod_label = s.pod_label();
    let slurm_node = s.a.slurm_node.clone();
    if matches!(obs.slurm, SlurmObservation::Node(_)) {
        s.a.not_found_since = None;
    }
    match s.a.phase {
        Phase::Pending => {
            if obs.pod_uid.as_deref() != Some(s.a.pod_uid.as_str()) {
                s.fail(
                    FailReason::PodChanged,
                    "the pod was deleted or replaced before anything was done".into(),
                    obs,
                );
            } else {
                match &obs.slurm {
                    SlurmObservation::Node(n)
                        if n.held() && !s.a.owns(n) && n.reason_is_mountguard() =>
                    {
                        let msg = format!(
                            "Slurm node {slurm_node} is already drained by another mountguard attempt ({:?}); mountguard leaves it alone",
                            n.reason
                        );
                        s.fail(FailReason::NodeDrainedByOthers, msg, obs);
                    }
                    SlurmObservation::Node(n) => {
                        // Someone else's drain: the node is closed to jobs
                        // already; record it (persisted before our drain
                        // replaces its reason) to hand it back at the end.
                        if !s.a.owns(n) {
                            s.a.prior_drain = PriorDrain::of(n);
                        }
                        s.a.drain_requested = true;
                        s.a.drain_requested_at = Some(now);
                        let before = s.a.prior_drain.as_ref().map_or(String::new(), |p| {
                            format!(
                                " (drained before by {:?}: {:?}; handed back at the end)",
                                p.set_by, p.reason
                            )
                        });
                        let what = format!("draining Slurm node {slurm_node}{before}");
                        s.start(Phase::Draining, "", what);
                        s.close_node();
                    }
                    SlurmObservation::NotFound => {
                        if s.not_found_for_good() && !s.replace_absent() {
                            let msg = format!(
                                "slurmrestd does not know Slurm node {slurm_node} (label {})",
                                crate::remediation::POD_HOSTNAME_LABEL
                            );
                            s.fail(FailReason::SlurmNodeNotFound, msg, obs);
                        }
                    }
                    _ => s.read_error(obs),
                }
            }
        }
        Phase::Draining => {
            if let Some(msg) = s.slurm_write_error(obs) {
                s.fail(FailReason::DrainRejected, msg, obs);
            } else {
                match &obs.slurm {
                    SlurmObservation::Node(n) if s.a.owns(n) => s.goto(Phase::Drained),
                    SlurmObservation::Node(n) if n.held() && n.reason_is_mountguard() => {
                        let msg = format!(
                            "Slurm node {slurm_node} was drained by another mountguard attempt ({:?}) before this drain took effect",
                            n.reason
                        );
                        s.fail(FailReason::NodeDrainedByOthers, msg, obs);
                    }
                    SlurmObservation::Node(n)
                        if s.a.prior_drain.is_none() && PriorDrain::of(n).is_some() =>
                    {
                        // Drained by someone else before ours took effect:
                        // record it to hand it back, then drain again.
                        s.a.prior_drain = PriorDrain::of(n);
                        s.actions.push(Action::Persist);
                    }
                    SlurmObservation::Node(_) => {
                        let since = s.a.drain_requested_at.unwrap_or(s.a.phase_since);
                        if s.elapsed_since(since) >= cfg.drain_timeout {
                            let msg = "the drain never showed on the node".to_string();
                            s.fail(FailReason::DrainTimeout, msg, obs);
                        } else if s.due() {
                            s.close_node();
                        }
                    }
                    SlurmObservation::NotFound => {
                        if s.not_found_for_good() {
                            let msg = format!("slurmrestd does not know Slurm node {slurm_node}");
                            s.fail(FailReason::SlurmNodeNotFound, msg, obs);
                        }
                    }
                    _ => s.read_error(obs),
                }
            }
        }
        Phase::Drained => match &obs.slurm {
            SlurmObservation::Node(n) if !n.held() => {
                let msg = format!(
                    "the drain of Slurm node {slurm_node} was removed by someone else before the pod was evicted; the pod was not touched"
                );
                s.fail(FailReason::DrainRemoved, msg, obs);
            }
            SlurmObservation::Node(n) => {
                if !s.a.owns(n) && s.a.foreign_drain.is_none() {
                    s.a.foreign_drain = Some(n.reason.clone());
                    s.actions.push(Action::Persist);
                }
                let since = s.a.drain_requested_at.unwrap_or(s.a.phase_since);
                if n.waits_for_jobs() {
                    if s.elapsed_since(since) >= cfg.drain_timeout {
                        let msg = format!(
                            "jobs still run on Slurm node {slurm_node} after the drain timeout ({:?})",
                            n.state
                        );
                        s.fail(FailReason::DrainTimeout, msg, obs);
                    }
                } else if s.a.group.is_some()
                    && obs.group_drained
                    && !(s.a.cordon_released || obs.cordon == NodeCordon::Ours)
                {
                    // Cordon the node first, so that no replacement of the
                    // group can start while an old member pins the cache
                    // (again after write_settle if the cordon did not show).
                    match obs.cordon {
                        NodeCordon::Free if s.due() => {
                            if !s.a.cordon_requested {
                                s.a.cordon_requested = true;
                                s.actions.push(Action::Persist);
                            }
                            s.wrote();
                            s.actions.push(Action::CordonNode {
                                node: s.a.node.clone(),
                                owner: s.a.group.clone().unwrap_or_default(),
                            });
                        }
                        NodeCordon::Foreign => {
                            // Someone else's cordon holds replacements back
                            // just as well; it is never ours to lift.
                            s.a.cordon_requested = true;
                            s.a.cordon_released = true;
                            s.actions.push(Action::Persist);
                        }
                        _ => {}
                    }
                } else if (s.a.group.is_none()
                    || (obs.group_drained
                        && (s.a.cordon_released || obs.cordon == NodeCordon::Ours)))
                    && s.a.owns(n)
                    && !n.has("FAIL")
                {
                    // Just before the eviction, our DRAIN becomes our FAIL
                    // hold (see [`Action::HoldNode`]): what the preStop hook,
                    // syncCordon and ReturnToService do next cannot open
                    // the node.
                    if !s.a.hold_requested {
                        s.a.hold_requested = true;
                        s.actions.push(Action::Persist);
                    }
                    if s.due() {
                        s.wrote();
                        s.actions.push(Action::HoldNode {
                            node: slurm_node,
                            reason: s.a.drain_reason.clone(),
                        });
                    }
                } else if s.a.group.is_none()
                    || (obs.group_drained
                        && (s.a.cordon_released || obs.cordon == NodeCordon::Ours))
                {
                    s.goto(Phase::Evicting);
                    let msg = format!(
                        "remediation {}: Slurm node {slurm_node} drained, no jobs left; evicting {pod_label}",
                        s.a.id
                    );
                    s.event(EventReason::SlurmNodeDrained, msg);
                    s.evict_pod();
                }
            }
            SlurmObservation::NotFound => {
                if s.not_found_for_good() {
                    let msg = format!("Slurm node {slurm_node} vanished");
                    s.fail(FailReason::SlurmNodeNotFound, msg, obs);
                }
            }
            _ => s.read_error(obs),
        },
        Phase::Evicting if s.a.slurm_absent => s.evicting_absent(obs),
        Phase::Evicting => {
            if !s.evicted(obs) && !s.eviction_timed_out(obs) && s.due() {
                // Never evict a pod whose node is not drained right now.
                match &obs.slurm {
                    SlurmObservation::Node(n) if !n.held() => {
                        let msg = format!(
                            "the drain of Slurm node {slurm_node} was removed by someone else before the pod was evicted; the pod was not touched"
                        );
                        s.fail(FailReason::DrainRemoved, msg, obs);
                    }
                    SlurmObservation::Node(n) if !n.waits_for_jobs() => {
                        s.evict_pod();
                    }
                    SlurmObservation::Node(_) => {}
                    _ => s.read_error(obs),
                }
            }
        }
        Phase::AwaitingReplacement => {
            let _ = s.hold_drain_after_eviction(obs);
            if s.a.cordon_pending() && obs.group_old_gone {
                // Every old member is gone: the kubelet dropped the pinned
                // entry; let the replacements start.
                s.release_cordon(obs);
            }
            match obs.pod_uid.as_deref() {
                Some(uid) if uid != s.a.pod_uid => {
                    s.a.new_pod_uid = Some(uid.to_string());
                    s.goto(Phase::Verifying);
                }
                _ => {
                    let since = s.a.evicted_at.unwrap_or(s.a.phase_since);
                    if s.elapsed_since(since) >= cfg.replacement_timeout {
                        let msg = format!("the NodeSet did not recreate {pod_label} in time");
                        s.fail(FailReason::ReplacementTimeout, msg, obs);
                    }
                }
            };
        }
        Phase::Verifying => {
            let not_held = s.hold_drain_after_eviction(obs);
            if s.a.cordon_pending() && obs.group_old_gone {
                s.release_cordon(obs);
            }
            if let Some(uid) = obs.pod_uid.as_deref()
                && uid != s.a.pod_uid
                && s.a.new_pod_uid.as_deref() != Some(uid)
            {
                s.a.new_pod_uid = Some(uid.to_string());
                s.actions.push(Action::Persist);
            }
            let current = obs.pod_uid.is_some() && obs.pod_uid == s.a.new_pod_uid;
            match (&obs.new_pod, &obs.slurm) {
                (NewPodCheck::StillStale { message }, _) if current => {
                    let msg = format!("the replacement pod is still not fresh: {message}");
                    s.fail(FailReason::ReplacementStale, msg, obs);
                }
                // Verified only by the node's own registration: slurmctld
                // accepted the replacement's slurmd (authenticated, so on
                // the current key) and the node answers, over several
                // reads in a row.
                (NewPodCheck::Fresh, SlurmObservation::Node(n))
                    if current
                        && s.a.replacement_responding(n)
                        && Attempt::replacement_registered(n, obs.replacement_started)
                        && !not_held =>
                {
                    s.a.verified_reads += 1;
                    if s.a.verified_reads >= cfg.verify_reads.max(1) {
                        let msg = format!(
                            "remediation {}: replacement {pod_label} (uid {}) verified fresh on node {}; Slurm node {slurm_node} registered its slurmd and answered {} reads in a row ({:?})",
                            s.a.id,
                            s.a.new_pod_uid.clone().unwrap_or_default(),
                            s.a.node,
                            s.a.verified_reads,
                            n.state
                        );
                        s.event(EventReason::RemediationVerified, msg);
                        if s.a.slurm_absent {
                            s.absent_verified(n);
                        } else {
                            s.start_undrain(&obs.slurm);
                        }
                    }
                }
                _ => {
                    s.a.verified_reads = 0;
                    s.read_error(obs);
                    if s.elapsed_since(s.a.phase_since) >= cfg.verification_timeout {
                        let why = match (&obs.new_pod, &obs.slurm) {
                            (NewPodCheck::Fresh, SlurmObservation::Node(n))
                                if s.a.replacement_responding(n)
                                    && !Attempt::replacement_registered(
                                        n,
                                        obs.replacement_started,
                                    ) =>
                            {
                                format!(
                                    "fresh on the node, but Slurm node {slurm_node} has no registration of the replacement's slurmd (slurmd_start_time {}, container started {}): slurmctld did not accept it, so it is not on slurmctld's key (check the slurm.key it mounts); Slurm shows {:?}, which a slurmd on a stale key also shows",
                                    n.slurmd_start_time
                                        .map_or_else(|| "unset".to_string(), |t| t.to_string()),
                                    obs.replacement_started
                                        .map_or_else(|| "unknown".to_string(), |t| t.to_string()),
                                    n.state
                                )
                            }
                            (NewPodCheck::Fresh, SlurmObservation::Node(n)) => {
                                format!(
                                    "fresh on the node, but Slurm node {slurm_node} is {:?}",
                                    n.state
                                )
                            }
                            (NewPodCheck::Fresh, SlurmObservation::NotFound) => {
                                format!(
                                    "fresh on the node, but slurmctld does not know Slurm node {slurm_node}: the replacement's slurmd never registered (check the slurm.key it mounts against slurmctld's)"
                                )
                            }
                            (NewPodCheck::Fresh, _) => {
                                "fresh on the node, but Slurm could not be read".to_string()
                            }
                            _ => "no fresh inventory of the replacement pod".to_string(),
                        };
                        s.fail(FailReason::VerificationTimeout, why, obs);
                    }
                }
            }
        }
        Phase::Undraining => s.undraining(obs),
        Phase::Succeeded => s.release_cordon(obs),
        Phase::Failed(_) => {
            if let Some(WriteResult::Err { message, .. }) = &obs.slurm_write {
                s.error(format!("slurmrestd: {message}"), None);
            }
            s.read_error(obs);
            s.failed(obs);
        }
    }
    (s.a, stepper::ordered(s.actions))
}

#[cfg(test)]
mod tests;
