//! The machine and the node hold of a workload attempt (the
//! `mountguard.io/replacing` taint): taken only after the Eviction API,
//! asked as a dry run, would evict the pod; lifted when the eviction is
//! refused; never longer than the node hold timeout.

use super::workload::{attempt, evictions, holds, owner_pod, s, seen};
use crate::remediation::machine::{
    Action, EvictionResult, FailReason, MachineConfig, NodeCordon, Observations, Phase, step,
};
use crate::remediation::test_support::t0;
use crate::remediation::workload::{OwnerPod, WorkloadKind};

const HELD_KINDS: [WorkloadKind; 3] = [
    WorkloadKind::Deployment,
    WorkloadKind::ReplicaSet,
    WorkloadKind::DaemonSet,
];

fn pods() -> Vec<OwnerPod> {
    vec![owner_pod("uid-old", "web-a", "node-a")]
}

/// The pod as selected, the node's hold as `cordon`, and the answer of
/// the dry run asked after the previous step.
fn at(cordon: NodeCordon, check: Option<EvictionResult>) -> Observations {
    Observations {
        cordon,
        eviction_check: check,
        ..seen(Some("uid-old"), pods())
    }
}

fn pdb_refusal() -> EvictionResult {
    EvictionResult::Refused {
        retry_after: None,
        message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
    }
}

fn checks(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::CheckEviction { .. }))
        .count()
}

#[test]
fn a_pdb_that_refuses_the_eviction_never_gets_the_node_held() {
    let cfg = MachineConfig::default();
    for kind in HELD_KINDS {
        let mut a = attempt(kind, "web-a");
        let mut answer: Option<EvictionResult> = None;
        let mut now = t0();
        let mut asked = 0;
        // A PodDisruptionBudget that never allows it, for the whole
        // eviction timeout: dry runs only, nothing held, nothing evicted.
        while a.phase == Phase::Pending {
            let (b, act) = step(&a, &at(NodeCordon::Free, answer.take()), now, &cfg);
            assert_eq!(
                holds(&act),
                Vec::<bool>::new(),
                "{kind:?} at {now}: {act:?}"
            );
            assert_eq!(evictions(&act), 0, "{kind:?}");
            if checks(&act) > 0 {
                asked += 1;
                answer = Some(pdb_refusal());
            }
            assert!(!b.cordon_requested, "{kind:?}: no hold asked for");
            a = b;
            now += s(7);
            assert!(
                now < t0() + cfg.eviction_timeout + s(60),
                "{kind:?}: never ends"
            );
        }
        assert_eq!(
            a.phase,
            Phase::Failed(FailReason::EvictionTimeout),
            "{kind:?}"
        );
        assert!(asked > 3, "{kind:?}: asked again after backoff ({asked})");
        let msg = a.failure.clone().unwrap_or_default();
        assert!(
            msg.contains("disruption budget") && msg.contains("dry run"),
            "{kind:?}: {msg}"
        );
        assert!(!a.is_open(), "{kind:?}: nothing of ours on the node");
    }
}

#[test]
fn a_refused_eviction_lifts_the_hold_before_it_is_asked_again() {
    let cfg = MachineConfig::default();
    for kind in HELD_KINDS {
        // Yes by dry run, then held, then evicted: but the budget changed
        // meanwhile and the eviction is refused.
        let a = attempt(kind, "web-a");
        let (a, act) = step(
            &a,
            &at(NodeCordon::Free, Some(EvictionResult::Evicted)),
            t0(),
            &cfg,
        );
        assert_eq!(holds(&act), vec![true], "{kind:?}");
        assert_eq!(a.hold_since, Some(t0()));
        let (a, act) = step(&a, &at(NodeCordon::Ours, None), t0() + s(10), &cfg);
        assert_eq!((a.phase, evictions(&act)), (Phase::Evicting, 1), "{kind:?}");
        let mut o = at(NodeCordon::Ours, None);
        o.eviction = Some(pdb_refusal());
        let (a, act) = step(&a, &o, t0() + s(11), &cfg);
        // Lifted at once, recorded first; no eviction.
        assert_eq!((holds(&act), evictions(&act)), (vec![false], 0), "{kind:?}");
        assert_eq!(act.first(), Some(&Action::Persist), "{kind:?}: {act:?}");
        assert!(a.hold_lifting, "{kind:?}");
        // Still shown: no eviction, no dry run, the lift asked again after
        // backoff.
        let (a, act) = step(&a, &at(NodeCordon::Ours, None), t0() + s(12), &cfg);
        assert_eq!((evictions(&act), checks(&act), holds(&act)), (0, 0, vec![]));
        let (a, act) = step(&a, &at(NodeCordon::Ours, None), t0() + s(40), &cfg);
        assert_eq!((evictions(&act), holds(&act)), (0, vec![false]), "{kind:?}");
        // Gone: recorded; then, when due, a dry run before anything else.
        let (a, act) = step(&a, &at(NodeCordon::Free, None), t0() + s(41), &cfg);
        assert_eq!(act, vec![Action::Persist], "{kind:?}");
        assert!(!a.hold_lifting && !a.cordon_pending() && a.hold_since.is_none());
        let (a, act) = step(&a, &at(NodeCordon::Free, None), t0() + s(60), &cfg);
        assert_eq!((checks(&act), holds(&act), evictions(&act)), (1, vec![], 0));
        // Allowed again: held again, then evicted.
        let (a, act) = step(
            &a,
            &at(NodeCordon::Free, Some(EvictionResult::Evicted)),
            t0() + s(61),
            &cfg,
        );
        assert_eq!(holds(&act), vec![true], "{kind:?}");
        let (a, act) = step(&a, &at(NodeCordon::Ours, None), t0() + s(72), &cfg);
        assert_eq!((a.phase, evictions(&act)), (Phase::Evicting, 1), "{kind:?}");
    }
}

#[test]
fn a_hold_lasts_at_most_the_node_hold_timeout() {
    let cfg = MachineConfig::default();
    for kind in HELD_KINDS {
        let a = attempt(kind, "web-a");
        let (a, _) = step(
            &a,
            &at(NodeCordon::Free, Some(EvictionResult::Evicted)),
            t0(),
            &cfg,
        );
        let (a, _) = step(&a, &at(NodeCordon::Ours, None), t0() + s(10), &cfg);
        let mut o = at(NodeCordon::Ours, None);
        o.eviction = Some(EvictionResult::Evicted);
        let (a, _) = step(&a, &o, t0() + s(11), &cfg);
        assert_eq!(a.phase, Phase::AwaitingReplacement, "{kind:?}");
        // The old pod does not go (a long grace period, a finalizer): the
        // hold stays until the bound, then is lifted whatever the pod does.
        let mut stuck = pods();
        stuck[0].terminating = true;
        let held = Observations {
            cordon: NodeCordon::Ours,
            ..seen(Some("uid-old"), stuck)
        };
        let just_before = t0() + cfg.node_hold_timeout - s(1);
        let (b, act) = step(&a, &held, just_before, &cfg);
        assert_eq!(holds(&act), Vec::<bool>::new(), "{kind:?}");
        let (b, act) = step(&b, &held, t0() + cfg.node_hold_timeout, &cfg);
        assert_eq!(holds(&act), vec![false], "{kind:?}: {act:?}");
        assert!(
            b.retry
                .last_error
                .as_deref()
                .is_some_and(|e| e.contains("node hold timeout")),
            "{kind:?}: {:?}",
            b.retry
        );
        assert!(!b.phase.is_terminal(), "{kind:?}: the attempt goes on");
        // Before the eviction too: a hold of ours older than the bound is
        // lifted, not used.
        let mut c = attempt(kind, "web-a");
        c.cordon_requested = true;
        c.hold_since = Some(t0());
        let (c, act) = step(
            &c,
            &at(NodeCordon::Ours, None),
            t0() + cfg.node_hold_timeout,
            &cfg,
        );
        assert_eq!(
            (c.phase, evictions(&act), holds(&act)),
            (Phase::Pending, 0, vec![false])
        );
        assert!(c.hold_lifting, "{kind:?}");
    }
}
