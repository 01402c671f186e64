//! Tests of the verification of a replacement against what real Slurm
//! shows of a slurmd that runs on a stale key.

use super::*;

/// The node as real Slurm 26.05 shows a replacement whose slurmd runs on a
/// stale key: never DOWN, `IDLE` flapping with `IDLE+NOT_RESPONDING`, and
/// `slurmd_start_time` still the old slurmd's (no registration of the new
/// one authenticated).
fn stale_slurmd(not_responding: bool) -> SlurmObservation {
    let mut state = vec!["IDLE", "DRAIN"];
    if not_responding {
        state.push("NOT_RESPONDING");
    }
    let mut n = node(&state, &attempt().drain_reason);
    n.slurmd_start_time = Some(t0().as_second() - 600);
    SlurmObservation::Node(n)
}

fn fresh_obs(slurm: SlurmObservation) -> Observations {
    Observations {
        new_pod: NewPodCheck::Fresh,
        ..obs(slurm, Some(NEW))
    }
}

/// Runs `reads` through the machine from Verifying, one step per
/// `interval`, and returns the attempt and every action.
fn verify_with(reads: &[SlurmObservation], interval: SignedDuration) -> (Attempt, Vec<Action>) {
    let cfg = MachineConfig::default();
    let mut a = attempt_in(Phase::Verifying);
    let mut all = vec![];
    let mut now = t0();
    for r in reads {
        let (b, actions) = step(&a, &fresh_obs(r.clone()), now, &cfg);
        a = b;
        all.extend(actions);
        now += interval;
    }
    (a, all)
}

#[test]
fn a_stale_slurmd_that_looks_idle_is_never_verified_and_the_failure_says_why() {
    // Forty reads over ten minutes, every other one without NOT_RESPONDING.
    let reads: Vec<_> = (0..40).map(|i| stale_slurmd(i % 2 == 1)).collect();
    let (a, actions) = verify_with(&reads, SignedDuration::from_secs(14));
    assert_eq!(a.phase, Phase::Verifying, "{actions:?}");
    assert!(
        !events(&actions).contains(&EventReason::RemediationVerified),
        "{actions:?}"
    );
    assert!(writes(&actions).is_empty(), "{actions:?}");
    // Past the verification timeout it fails, keeps the node drained and
    // says that Slurm never accepted the replacement's slurmd.
    let (b, actions) = step(
        &a,
        &fresh_obs(stale_slurmd(false)),
        t0() + SignedDuration::from_mins(11),
        &MachineConfig::default(),
    );
    assert_eq!(b.phase, Phase::Failed(FailReason::VerificationTimeout));
    assert!(b.kept_drained);
    assert!(writes(&actions).is_empty(), "{actions:?}");
    let failure = b.failure.clone().unwrap_or_default();
    assert!(
        failure.contains("has no registration of the replacement's slurmd"),
        "{failure}"
    );
}

#[test]
fn a_stale_slurmd_returned_to_service_by_slurm_is_not_a_repaired_node() {
    // ReturnToService=1: the DOWN "Not responding" node whose stale slurmd
    // answers at all is back in service, reading IDLE with no flag, our
    // drain gone from the base state but still set.
    let mut n = node(&["IDLE", "DRAIN"], &attempt().drain_reason);
    n.slurmd_start_time = Some(t0().as_second() - 1);
    let reads = vec![SlurmObservation::Node(n); 6];
    let (a, actions) = verify_with(&reads, SignedDuration::from_secs(5));
    assert_eq!(a.phase, Phase::Verifying);
    assert!(writes(&actions).is_empty(), "{actions:?}");
}

#[test]
fn a_registered_replacement_is_verified_after_several_responding_reads_in_a_row() {
    let ok = ours(&["IDLE", "DRAIN"]);
    let flap = ours(&["IDLE", "DRAIN", "NOT_RESPONDING"]);
    // Two good reads, one not responding: the count starts again.
    let (a, actions) = verify_with(
        &[ok.clone(), ok.clone(), flap, ok.clone(), ok.clone()],
        SignedDuration::from_secs(5),
    );
    assert_eq!(a.phase, Phase::Verifying, "{actions:?}");
    assert_eq!(a.verified_reads, 2);
    let (b, actions) = step(
        &a,
        &fresh_obs(ok),
        t0() + SignedDuration::from_secs(30),
        &MachineConfig::default(),
    );
    assert_eq!(b.phase, Phase::Undraining);
    assert_eq!(writes(&actions), [W::Undrain]);
    assert_eq!(events(&actions), [EventReason::RemediationVerified]);
}

#[test]
fn our_drain_stays_ours_after_slurm_appends_not_responding_and_is_resumed() {
    let ours_reason = attempt().drain_reason;
    let rewritten = format!("{ours_reason} : Not responding");
    assert!(owns_reason(&rewritten, "a1b2c3"));
    assert_eq!(reason_attempt_id(&rewritten), Some("a1b2c3"));
    assert_eq!(reason_as_written(&rewritten), ours_reason);
    assert!(reason_is(&rewritten, &ours_reason));
    assert!(reason_is(&ours_reason, &ours_reason));
    assert!(!reason_is(&format!("{ours_reason}x"), &ours_reason));
    assert!(!reason_is("admin: maint : Not responding", &ours_reason));
    // Another attempt's reason with Slurm's suffix is still not ours.
    assert!(!owns_reason(
        &rewritten.replace("attempt a1b2c3", "attempt ffffff"),
        "a1b2c3"
    ));
    // Slurm left the node DOWN+DRAIN with the rewritten reason, set by
    // SlurmUser; the replacement registered: verified, and a RESUME (the
    // node is DOWN) for the reason we wrote.
    let mut n = node(&["DOWN", "DRAIN"], &rewritten);
    n.reason_set_by_user = "slurm".into();
    let reads = vec![SlurmObservation::Node(n); 3];
    let (a, actions) = verify_with(&reads, SignedDuration::from_secs(5));
    assert_eq!(a.phase, Phase::Undraining, "{actions:?}");
    let resumed = actions.iter().find_map(|x| match x {
        Action::ResumeNode { owned_reason, .. } => Some(owned_reason.clone()),
        _ => None,
    });
    assert_eq!(resumed.as_deref(), Some(ours_reason.as_str()));
}

#[test]
fn a_restarted_controller_does_not_release_a_live_attempts_drain_that_slurm_rewrote() {
    let mut a = attempt_in(Phase::AwaitingReplacement);
    a.drain_requested = true;
    let rewritten = format!("{} : Not responding", a.drain_reason);
    let r = crate::remediation::recovery::recover(
        std::slice::from_ref(&a),
        &[("n1".to_string(), node(&["DOWN", "DRAIN"], &rewritten))],
        true,
    );
    assert!(r.release.is_empty(), "{:?}", r.release);
    assert_eq!(r.resume.len(), 1);
}
