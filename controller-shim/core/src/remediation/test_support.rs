//! Builders shared by the remediation unit tests.

use jiff::Timestamp;

use super::machine::{Action, Attempt, EventReason, Finding, Phase, PhaseEntry, SlurmNodeState};

/// A fixed start time.
pub fn t0() -> Timestamp {
    "2026-11-30T10:00:00Z".parse().expect("valid timestamp")
}

/// A Slurm node with `state` flags and `reason`, whose slurmd last
/// registered at `t0()` (when the tests' replacement slurmd starts: a
/// registered replacement).
pub fn node(state: &[&str], reason: &str) -> SlurmNodeState {
    SlurmNodeState {
        state: state.iter().map(|s| s.to_string()).collect(),
        reason: reason.to_string(),
        reason_set_by_user: if reason.is_empty() {
            String::new()
        } else {
            "slurm".into()
        },
        alloc_cpus: 0,
        slurmd_start_time: Some(t0().as_second()),
    }
}

/// The stale finding of the default attempt.
pub fn finding() -> Finding {
    Finding {
        subject: "volume slurm-etc".into(),
        state: "Stale/ImmutableCache".into(),
        mounted: "591b08c85fb0".into(),
        current: "6cc34aeed46b".into(),
    }
}

/// A new Pending attempt of `slurm/worker-0` (uid `uid-old`) on node
/// `node-a`, Slurm node `n1`, id `a1b2c3`.
pub fn attempt() -> Attempt {
    Attempt::new(
        "a1b2c3".into(),
        "slurm",
        "worker",
        "worker-0",
        "uid-old",
        "node-a",
        "n1",
        vec![finding()],
        t0(),
    )
}

/// The default attempt as if it had reached `phase` at `t0()`, with the
/// fields the earlier phases set.
pub fn attempt_in(phase: Phase) -> Attempt {
    let mut a = attempt();
    let order = [
        Phase::Pending,
        Phase::Draining,
        Phase::Drained,
        Phase::Evicting,
        Phase::AwaitingReplacement,
        Phase::Verifying,
        Phase::Undraining,
        Phase::Succeeded,
    ];
    let rank = |p: Phase| order.iter().position(|q| *q == p).unwrap_or(order.len());
    let r = rank(phase);
    if r >= 1 {
        a.drain_requested = true;
        a.drain_requested_at = Some(t0());
    }
    if r >= 4 && r < order.len() {
        a.evicted_at = Some(t0());
    }
    if r >= 5 && r < order.len() {
        a.new_pod_uid = Some("uid-new".into());
    }
    a.phase = phase;
    a.history = order[..r.min(order.len())]
        .iter()
        .map(|p| PhaseEntry {
            phase: *p,
            at: t0(),
        })
        .collect();
    a.history.push(PhaseEntry { phase, at: t0() });
    if matches!(phase, Phase::Failed(_)) {
        a.drain_requested = true;
        a.drain_requested_at = Some(t0());
    }
    a
}

/// The Events among `actions`, in order.
pub fn events(actions: &[Action]) -> Vec<EventReason> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Event { reason, .. } => Some(*reason),
            _ => None,
        })
        .collect()
}
