//! Tests of an attempt on a NodeSet pod whose Slurm node slurmctld does not
//! know (a dynamic node whose slurmd never registered on the current key):
//! failed by default, replaced without a drain under
//! [`AbsentNodePolicy::Replace`], verified by the replacement's own
//! registration.

use super::*;

fn replace() -> MachineConfig {
    MachineConfig {
        absent_node: AbsentNodePolicy::Replace,
        ..one_read()
    }
}

/// A node the replacement's slurmd registered: IDLE, no reason, its start
/// time the replacement's (`t0()`).
fn registered() -> SlurmObservation {
    plain(&["IDLE"])
}

/// Steps `a` once per observation, `interval` apart from `start`; returns
/// the attempt and every action.
fn run(
    mut a: Attempt,
    seen: &[Observations],
    start: Timestamp,
    interval: SignedDuration,
    cfg: &MachineConfig,
) -> (Attempt, Vec<Action>) {
    let mut all = vec![];
    let mut now = start;
    for o in seen {
        let (b, act) = step(&a, o, now, cfg);
        a = b;
        all.extend(act);
        now += interval;
    }
    (a, all)
}

fn absent(pod: &str) -> Observations {
    obs(SlurmObservation::NotFound, Some(pod))
}

/// The replacement fresh on its node, Slurm read as `slurm`.
fn fresh(slurm: SlurmObservation) -> Observations {
    Observations {
        new_pod: NewPodCheck::Fresh,
        ..obs(slurm, Some(NEW))
    }
}

/// The default attempt, its node unknown to slurmctld for a whole grace.
fn unknown_for_the_grace(cfg: &MachineConfig) -> Attempt {
    let mut a = attempt();
    a.not_found_since = Some(t0() - cfg.not_found_grace);
    a
}

#[test]
fn by_default_an_absent_node_fails_the_attempt_and_touches_nothing() {
    let cfg = one_read();
    let grace = cfg.not_found_grace;
    let seen = vec![absent(OLD), absent(OLD)];
    let (a, act) = run(attempt(), &seen, t0(), grace, &cfg);
    assert_eq!(a.phase, Phase::Failed(FailReason::SlurmNodeNotFound));
    assert!(writes(&act).is_empty(), "{act:?}");
    assert!(!a.slurm_absent);
}

#[test]
fn an_absent_node_is_replaced_without_a_drain_only_after_the_grace() {
    let cfg = replace();
    // Inside the grace, "not found" is retried like a transient error.
    let (a, act) = step(&attempt(), &absent(OLD), t0(), &cfg);
    assert_eq!(a.phase, Phase::Pending);
    assert!(writes(&act).is_empty(), "{act:?}");
    let later = t0() + cfg.not_found_grace - SignedDuration::from_secs(1);
    let (a, act) = step(&a, &absent(OLD), later, &cfg);
    assert_eq!(a.phase, Phase::Pending);
    assert!(writes(&act).is_empty(), "{act:?}");
    // Past it: evicted at once, recorded first, with no Slurm write.
    let (a, act) = step(&a, &absent(OLD), t0() + cfg.not_found_grace, &cfg);
    assert_eq!(a.phase, Phase::Evicting);
    assert!(a.slurm_absent && !a.drain_requested);
    assert_eq!(writes(&act), vec![W::Evict]);
    let persist = act.iter().position(|x| matches!(x, Action::Persist));
    let evict = act.iter().position(|x| matches!(x, Action::Evict { .. }));
    assert!(persist < evict, "{act:?}");
    assert_eq!(events(&act), vec![E::RemediationStarted]);
    let text = format!("{act:?}");
    assert!(text.contains("does not know Slurm node n1"), "{text}");
}

#[test]
fn a_replaced_absent_node_succeeds_on_the_replacements_registration_with_no_undrain() {
    let cfg = replace();
    let a = unknown_for_the_grace(&cfg);
    let evicted = Observations {
        eviction: Some(EvictionResult::Evicted),
        ..absent(OLD)
    };
    let seen = vec![
        absent(OLD),                       // Pending -> Evicting (evict)
        evicted,                           // -> AwaitingReplacement
        absent(NEW),                       // -> Verifying
        fresh(SlurmObservation::NotFound), // not registered yet
        fresh(registered()),               // -> Succeeded
    ];
    let (a, act) = run(a, &seen, t0(), SignedDuration::from_secs(15), &cfg);
    assert_eq!(a.phase, Phase::Succeeded, "{:?}", a.phase_names());
    assert_eq!(
        a.phase_names(),
        [
            "Pending",
            "Evicting",
            "AwaitingReplacement",
            "Verifying",
            "Succeeded"
        ]
    );
    assert_eq!(writes(&act), vec![W::Evict]);
    assert_eq!(
        events(&act),
        vec![
            E::RemediationStarted,
            E::PodEvicted,
            E::RemediationVerified,
            E::RemediationSucceeded
        ]
    );
}

#[test]
fn a_node_that_shows_again_without_a_registration_of_the_replacement_is_not_verified() {
    let cfg = replace();
    let mut a = attempt_in(Phase::Verifying);
    a.drain_requested = false;
    a.drain_requested_at = None;
    a.slurm_absent = true;
    // The node is back but its slurmd_start_time is not the replacement's
    // (0: slurmctld restored it from state, no registration since), and it
    // flaps NOT_RESPONDING: nothing is verified, nothing is held.
    let mut n = node(&["IDLE"], "");
    n.slurmd_start_time = Some(0);
    let unregistered = fresh(SlurmObservation::Node(n));
    let flapping = fresh(plain(&["IDLE", "NOT_RESPONDING"]));
    let (b, act) = run(
        a.clone(),
        &[unregistered.clone(), flapping.clone(), unregistered],
        t0(),
        SignedDuration::from_secs(10),
        &cfg,
    );
    assert_eq!(b.phase, Phase::Verifying);
    assert!(writes(&act).is_empty(), "{act:?}");
    // Absent until the verification timeout: failed, saying so, with no
    // drain to keep or release.
    let (b, act) = step(
        &a,
        &fresh(SlurmObservation::NotFound),
        t0() + cfg.verification_timeout,
        &cfg,
    );
    assert_eq!(b.phase, Phase::Failed(FailReason::VerificationTimeout));
    assert!(!b.kept_drained && !b.release_pending);
    assert!(writes(&act).is_empty(), "{act:?}");
    let failure = b.failure.unwrap_or_default();
    assert!(failure.contains("never registered"), "{failure}");
}

#[test]
fn an_absent_node_known_again_before_the_eviction_is_drained_first() {
    let cfg = replace();
    let a = unknown_for_the_grace(&cfg);
    let (a, _) = step(&a, &absent(OLD), t0(), &cfg);
    assert_eq!(a.phase, Phase::Evicting);
    // The eviction did not go through yet; the node is known again.
    let later = t0() + cfg.write_settle;
    let (a, act) = step(&a, &obs(plain(&["IDLE"]), Some(OLD)), later, &cfg);
    assert_eq!(a.phase, Phase::Pending);
    assert!(!a.slurm_absent);
    assert!(writes(&act).is_empty(), "{act:?}");
    let (a, act) = step(&a, &obs(plain(&["IDLE"]), Some(OLD)), later, &cfg);
    assert_eq!(a.phase, Phase::Draining);
    assert_eq!(writes(&act), vec![W::Drain]);
}

#[test]
fn an_absent_node_whose_read_fails_is_not_evicted_again() {
    let cfg = replace();
    let a = unknown_for_the_grace(&cfg);
    let (a, _) = step(&a, &absent(OLD), t0(), &cfg);
    let later = t0() + cfg.write_settle;
    let (b, act) = step(&a, &obs(transient(), Some(OLD)), later, &cfg);
    assert_eq!(b.phase, Phase::Evicting);
    assert!(writes(&act).is_empty(), "{act:?}");
    // Still unknown: the eviction is asked for again.
    let (b, act) = step(&b, &absent(OLD), b.retry.not_before.unwrap_or(later), &cfg);
    assert_eq!(b.phase, Phase::Evicting);
    assert_eq!(writes(&act), vec![W::Evict]);
}

#[test]
fn the_absent_mark_survives_the_attempts_record() {
    let mut a = attempt_in(Phase::Evicting);
    a.slurm_absent = true;
    let json = AttemptsRecord::from_attempts([&a]).to_json();
    let back = AttemptsRecord::parse(&json).unwrap();
    assert!(back.attempts[0].slurm_absent);
    // A record written before the field existed reads as not absent.
    let plain = AttemptsRecord::from_attempts([&attempt()]).to_json();
    assert!(!plain.contains("slurm_absent"));
    assert!(!AttemptsRecord::parse(&plain).unwrap().attempts[0].slurm_absent);
}
