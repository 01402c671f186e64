//! The machine on workload pods (Deployment, ReplicaSet, StatefulSet,
//! DaemonSet): each kind's replacement, PodDisruptionBudget refusals, the
//! availability hold, stale replacements, and a crash at every step (the
//! node hold and PodDisruptionBudgets: `hold.rs`).

use jiff::{SignedDuration, Timestamp};

use crate::remediation::inputs::cordon_of;
use crate::remediation::machine::{
    Action, Attempt, AttemptsRecord, EventReason, EvictionResult, FailReason, MachineConfig,
    NewPodCheck, NodeCordon, Observations, Phase, WorkloadObservation, step,
};
use crate::remediation::test_support::{events, finding, t0};
use crate::remediation::workload::{OwnerPod, WorkloadKind, WorkloadRef};

pub(super) fn s(n: i64) -> SignedDuration {
    SignedDuration::from_secs(n)
}

/// A Pending attempt on `shop/<pod>` (uid `uid-old`, node `node-a`) of a
/// workload of `kind`.
pub(super) fn attempt(kind: WorkloadKind, pod: &str) -> Attempt {
    Attempt::for_workload(
        "w1".into(),
        "shop",
        WorkloadRef {
            kind,
            name: "web".into(),
        },
        pod,
        "uid-old",
        "node-a",
        vec![finding()],
        t0(),
    )
}

pub(super) fn owner_pod(uid: &str, name: &str, node: &str) -> OwnerPod {
    OwnerPod {
        uid: uid.into(),
        name: name.into(),
        node: Some(node.into()),
        terminating: false,
    }
}

/// The workload's pods as read, the pod `pod_uid` under the attempt's
/// name, and the node held for the attempt.
pub(super) fn seen(pod_uid: Option<&str>, pods: Vec<OwnerPod>) -> Observations {
    Observations {
        pod_uid: pod_uid.map(String::from),
        workload: Some(WorkloadObservation { pods, hold: None }),
        cordon: NodeCordon::Ours,
        ..Default::default()
    }
}

/// The holds asked for (true) and lifted (false), each naming the attempt.
pub(super) fn holds(actions: &[Action]) -> Vec<bool> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::CordonNode { owner, .. } => Some((true, owner)),
            Action::UncordonNode { owner, .. } => Some((false, owner)),
            _ => None,
        })
        .map(|(on, owner)| {
            assert_eq!(owner, "w1", "the hold names the attempt");
            on
        })
        .collect()
}

pub(super) fn evictions(actions: &[Action]) -> usize {
    actions
        .iter()
        .filter(|a| matches!(a, Action::Evict { .. }))
        .count()
}

/// A Persist precedes the (first) eviction request.
fn persisted_first(actions: &[Action]) -> bool {
    let persist = actions.iter().position(|a| matches!(a, Action::Persist));
    let evict = actions
        .iter()
        .position(|a| matches!(a, Action::Evict { .. }));
    matches!((persist, evict), (Some(p), Some(e)) if p < e)
}

fn no_slurm_or_node_writes(actions: &[Action]) -> bool {
    actions.iter().all(|a| {
        matches!(
            a,
            Action::Persist
                | Action::Evict { .. }
                | Action::Event { .. }
                | Action::Transition { .. }
        )
    })
}

/// One kind's happy path: the pod as selected, the pods of the workload
/// while the eviction is asked for, and after it (the replacement among
/// them); what the attempt records of the replacement.
struct KindCase {
    kind: WorkloadKind,
    pod: &'static str,
    before: Vec<OwnerPod>,
    after: Vec<OwnerPod>,
    new_name: Option<&'static str>,
    new_node: &'static str,
}

fn kind_cases() -> Vec<KindCase> {
    let siblings = |names: &[&str]| -> Vec<OwnerPod> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| owner_pod(&format!("uid-{n}"), n, &format!("node-{}", i + 2)))
            .collect()
    };
    vec![
        KindCase {
            kind: WorkloadKind::Deployment,
            pod: "web-7d9f-aaaaa",
            before: [
                vec![owner_pod("uid-old", "web-7d9f-aaaaa", "node-a")],
                siblings(&["web-7d9f-bbbbb", "web-7d9f-ccccc"]),
            ]
            .concat(),
            // The ReplicaSet's replacement lands on another node.
            after: [
                siblings(&["web-7d9f-bbbbb", "web-7d9f-ccccc"]),
                vec![owner_pod("uid-new", "web-7d9f-zzzzz", "node-9")],
            ]
            .concat(),
            new_name: Some("web-7d9f-zzzzz"),
            new_node: "node-9",
        },
        KindCase {
            kind: WorkloadKind::ReplicaSet,
            pod: "web-aaaaa",
            before: vec![owner_pod("uid-old", "web-aaaaa", "node-a")],
            after: vec![owner_pod("uid-new", "web-qqqqq", "node-a")],
            new_name: Some("web-qqqqq"),
            new_node: "node-a",
        },
        KindCase {
            kind: WorkloadKind::StatefulSet,
            pod: "web-0",
            before: [
                vec![owner_pod("uid-old", "web-0", "node-a")],
                siblings(&["web-1"]),
            ]
            .concat(),
            // Same name, new UID, wherever it is scheduled.
            after: [
                vec![owner_pod("uid-new", "web-0", "node-5")],
                siblings(&["web-1"]),
            ]
            .concat(),
            new_name: None,
            new_node: "node-5",
        },
        KindCase {
            kind: WorkloadKind::DaemonSet,
            pod: "web-abcde",
            before: [
                vec![owner_pod("uid-old", "web-abcde", "node-a")],
                siblings(&["web-fghij"]),
            ]
            .concat(),
            after: [
                siblings(&["web-fghij"]),
                vec![owner_pod("uid-new", "web-klmno", "node-a")],
            ]
            .concat(),
            new_name: Some("web-klmno"),
            new_node: "node-a",
        },
    ]
}

#[test]
fn each_kind_is_evicted_replaced_and_verified_without_slurm() {
    let cfg = MachineConfig::default();
    for c in kind_cases() {
        let k = c.kind.as_str();
        let a = attempt(c.kind, c.pod);
        // Pending: the eviction, recorded first, with the pods known then.
        let (a, act) = step(&a, &seen(Some("uid-old"), c.before.clone()), t0(), &cfg);
        assert_eq!(a.phase, Phase::Evicting, "{k}");
        assert!(persisted_first(&act), "{k}: {act:?}");
        assert_eq!(evictions(&act), 1, "{k}");
        assert!(act.contains(&Action::Evict {
            namespace: "shop".into(),
            pod: c.pod.into(),
            uid: "uid-old".into(),
        }));
        assert_eq!(events(&act), vec![EventReason::RemediationStarted], "{k}");
        assert_eq!(a.known_pods.len(), c.before.len(), "{k}");
        // Accepted: waiting for the owner.
        let mut o = seen(Some("uid-old"), c.before.clone());
        o.eviction = Some(EvictionResult::Evicted);
        let (a, act) = step(&a, &o, t0() + s(1), &cfg);
        assert_eq!(a.phase, Phase::AwaitingReplacement, "{k}");
        assert_eq!(events(&act), vec![EventReason::PodEvicted], "{k}");
        // Nothing new yet (the old pod terminating, the others known).
        let mut terminating = c.before.clone();
        terminating[0].terminating = true;
        let pod_now = (c.kind == WorkloadKind::StatefulSet).then_some("uid-old");
        let (a, act) = step(&a, &seen(pod_now, terminating), t0() + s(2), &cfg);
        assert_eq!(a.phase, Phase::AwaitingReplacement, "{k}");
        assert!(act.is_empty(), "{k}: {act:?}");
        // The replacement.
        let same_name = (c.kind == WorkloadKind::StatefulSet).then_some("uid-new");
        let (a, _) = step(&a, &seen(same_name, c.after.clone()), t0() + s(3), &cfg);
        assert_eq!(a.phase, Phase::Verifying, "{k}");
        assert_eq!(a.new_pod_uid.as_deref(), Some("uid-new"), "{k}");
        assert_eq!(a.new_pod_name.as_deref(), c.new_name, "{k}");
        assert_eq!(a.new_pod_node.as_deref(), Some(c.new_node), "{k}");
        // Not judged yet, then fresh on its node.
        let (a, act) = step(&a, &seen(same_name, c.after.clone()), t0() + s(4), &cfg);
        assert_eq!(a.phase, Phase::Verifying, "{k}");
        assert!(act.is_empty(), "{k}");
        let mut o = seen(same_name, c.after.clone());
        o.new_pod = NewPodCheck::Fresh;
        let (a, act) = step(&a, &o, t0() + s(5), &cfg);
        assert_eq!(a.phase, Phase::Succeeded, "{k}");
        assert_eq!(events(&act), vec![EventReason::RemediationSucceeded], "{k}");
        let msg = act
            .iter()
            .find_map(|x| match x {
                Action::Event { message, .. } => Some(message.clone()),
                _ => None,
            })
            .unwrap_or_default();
        assert!(
            msg.contains(&format!("verified fresh on node {}", c.new_node)) && msg.contains(k),
            "{k}: {msg}"
        );
        if a.is_open() {
            // A ReplicaSet's: open until its lifted hold is seen gone.
            assert!(a.cordon_pending(), "{k}");
            let mut o = seen(same_name, c.after.clone());
            o.cordon = NodeCordon::Free;
            let (b, _) = step(&a, &o, t0() + s(6), &cfg);
            assert!(!b.is_open(), "{k}");
        }
        assert_eq!(
            a.phase_names(),
            vec![
                "Pending",
                "Evicting",
                "AwaitingReplacement",
                "Verifying",
                "Succeeded"
            ],
            "{k}"
        );
    }
}

#[test]
fn a_replicasets_or_daemonsets_pod_is_evicted_only_while_new_pods_are_held_off_its_node() {
    let cfg = MachineConfig::default();
    for kind in [
        WorkloadKind::Deployment,
        WorkloadKind::ReplicaSet,
        WorkloadKind::DaemonSet,
    ] {
        let pods = vec![owner_pod("uid-old", "web-a", "node-a")];
        let at = |o: NodeCordon| Observations {
            cordon: o,
            ..seen(Some("uid-old"), pods.clone())
        };
        // Free: the Eviction API asked first, as a dry run; nothing held.
        let (a, act) = step(&attempt(kind, "web-a"), &at(NodeCordon::Free), t0(), &cfg);
        assert_eq!(
            (a.phase, evictions(&act), holds(&act)),
            (Phase::Pending, 0, vec![])
        );
        assert!(
            matches!(act.as_slice(), [Action::CheckEviction { uid, .. }] if uid == "uid-old"),
            "{act:?}"
        );
        // It would evict the pod: the hold (recorded before), no eviction yet.
        let mut yes = at(NodeCordon::Free);
        yes.eviction_check = Some(EvictionResult::Evicted);
        let (a, act) = step(&a, &yes, t0(), &cfg);
        assert_eq!(
            (a.phase, evictions(&act), holds(&act)),
            (Phase::Pending, 0, vec![true])
        );
        assert!(a.cordon_requested && a.is_open());
        let p = act.iter().position(|x| matches!(x, Action::Persist));
        let c = act
            .iter()
            .position(|x| matches!(x, Action::CordonNode { .. }));
        assert!(p.is_some() && p < c, "{act:?}");
        // Not shown yet: not asked again before the settle time.
        let (a, act) = step(&a, &at(NodeCordon::Free), t0() + s(1), &cfg);
        assert!(act.is_empty(), "{act:?}");
        // Someone else's hold: wait, never touch it.
        let (b, act) = step(&a, &at(NodeCordon::Foreign), t0() + s(30), &cfg);
        assert_eq!(
            (b.phase, evictions(&act), holds(&act)),
            (Phase::Pending, 0, vec![])
        );
        // Ours: evicted.
        let (a, act) = step(&a, &at(NodeCordon::Ours), t0() + s(31), &cfg);
        assert_eq!((a.phase, evictions(&act)), (Phase::Evicting, 1));
        let mut o = at(NodeCordon::Ours);
        o.eviction = Some(EvictionResult::Evicted);
        let (a, _) = step(&a, &o, t0() + s(32), &cfg);
        assert_eq!(a.phase, Phase::AwaitingReplacement);
        // The old pod terminating (a ReplicaSet's replacement waiting, a
        // DaemonSet's not made while the node is held): the hold stays.
        let ds = kind == WorkloadKind::DaemonSet;
        let unscheduled = OwnerPod {
            node: None,
            ..owner_pod("uid-new", "web-b", "")
        };
        let waiting: Vec<OwnerPod> = if ds { vec![] } else { vec![unscheduled] };
        let mut terminating = pods.clone();
        terminating[0].terminating = true;
        terminating.extend(waiting.clone());
        let (a, act) = step(&a, &seen(Some("uid-old"), terminating), t0() + s(33), &cfg);
        let want = if ds {
            Phase::AwaitingReplacement
        } else {
            Phase::Verifying
        };
        assert_eq!(a.phase, want, "{kind:?}");
        assert_eq!(holds(&act), Vec::<bool>::new(), "the old pod is not gone");
        // Gone from the API: the hold is lifted; the replacement schedules.
        let (a, act) = step(&a, &seen(None, waiting), t0() + s(34), &cfg);
        assert_eq!(holds(&act), vec![false]);
        let now = vec![owner_pod("uid-new", "web-b", "node-a")];
        let mut o = seen(None, now.clone());
        o.cordon = NodeCordon::Free;
        let (a, _) = step(&a, &o, t0() + s(35), &cfg);
        assert_eq!(a.phase, Phase::Verifying, "{kind:?}");
        o.new_pod = NewPodCheck::Fresh;
        let (a, _) = step(&a, &o, t0() + s(60), &cfg);
        assert_eq!(a.phase, Phase::Succeeded);
        assert_eq!(a.new_pod_node.as_deref(), Some("node-a"));
        assert!(!a.is_open(), "nothing of ours is left on the node");
    }
    // A StatefulSet's pod needs no hold.
    let kind = WorkloadKind::StatefulSet;
    let o = Observations {
        cordon: NodeCordon::NotRead,
        ..seen(
            Some("uid-old"),
            vec![owner_pod("uid-old", "web-0", "node-a")],
        )
    };
    let (a, act) = step(&attempt(kind, "web-0"), &o, t0(), &cfg);
    assert_eq!(
        (a.phase, evictions(&act), holds(&act)),
        (Phase::Evicting, 1, vec![])
    );
    assert!(!a.cordon_requested);
}

#[test]
fn a_failed_attempt_releases_its_hold() {
    let cfg = MachineConfig::default();
    let pods = vec![owner_pod("uid-old", "web-a", "node-a")];
    let at = |o: NodeCordon| Observations {
        cordon: o,
        ..seen(Some("uid-old"), pods.clone())
    };
    let mut yes = at(NodeCordon::Free);
    yes.eviction_check = Some(EvictionResult::Evicted);
    let (a, _) = step(
        &attempt(WorkloadKind::Deployment, "web-a"),
        &yes,
        t0(),
        &cfg,
    );
    assert!(a.cordon_pending());
    let (a, _) = step(&a, &at(NodeCordon::Ours), t0() + s(11), &cfg);
    assert_eq!(a.phase, Phase::Evicting);
    // The eviction failing with the hold on, and the hold not lifted
    // (its removal failing) until the eviction timeout.
    let mut o = at(NodeCordon::Ours);
    o.eviction = Some(EvictionResult::Error {
        message: "etcdserver: request timed out".into(),
    });
    let (a, act) = step(&a, &o, t0() + s(12), &cfg);
    assert_eq!(holds(&act), vec![false]);
    let late = t0() + cfg.eviction_timeout + s(12);
    let (a, act) = step(&a, &at(NodeCordon::Ours), late, &cfg);
    assert_eq!(a.phase, Phase::Failed(FailReason::EvictionTimeout));
    assert_eq!(holds(&act), vec![false]);
    assert!(a.is_open(), "open until the hold is seen gone");
    let (a, act) = step(&a, &at(NodeCordon::Free), late + s(30), &cfg);
    assert!(!a.is_open() && act == vec![Action::Persist], "{act:?}");
}

#[test]
fn a_pdb_refusal_is_retried_after_backoff_and_fails_cleanly_at_the_timeout() {
    let cfg = MachineConfig::default();
    let pods = vec![owner_pod("uid-old", "web-0", "node-a")];
    let (mut a, _) = step(
        &attempt(WorkloadKind::StatefulSet, "web-0"),
        &seen(Some("uid-old"), pods.clone()),
        t0(),
        &cfg,
    );
    let refused = || {
        let mut o = seen(Some("uid-old"), pods.clone());
        o.eviction = Some(EvictionResult::Refused {
            retry_after: Some(s(20)),
            message: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
        });
        o
    };
    let mut at = t0() + s(1);
    let mut asked = 1;
    while at < t0() + cfg.eviction_timeout {
        let o = if asked > 0 {
            asked = 0;
            refused()
        } else {
            seen(Some("uid-old"), pods.clone())
        };
        let (b, act) = step(&a, &o, at, &cfg);
        assert!(no_slurm_or_node_writes(&act), "{act:?}");
        if b.phase != Phase::Evicting {
            a = b;
            break;
        }
        let n = evictions(&act);
        if n > 0 {
            assert!(
                b.retry
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("disruption budget")),
                "{:?}",
                b.retry
            );
            asked = n;
        }
        a = b;
        at += s(5);
    }
    // Still refused at the timeout: Failed, the pod was never touched.
    let (a, act) = step(&a, &refused(), t0() + cfg.eviction_timeout + s(1), &cfg);
    assert_eq!(a.phase, Phase::Failed(FailReason::EvictionTimeout));
    assert_eq!(a.evicted_at, None);
    assert_eq!(evictions(&act), 0);
    let msg = a.failure.clone().unwrap_or_default();
    assert!(msg.contains("disruption budget"), "{msg}");
    assert!(!msg.contains("Slurm"), "{msg}");
    assert!(
        !a.is_open(),
        "nothing of ours remains: the attempt is closed"
    );
}

#[test]
fn retries_respect_retry_after_and_never_become_a_delete() {
    let cfg = MachineConfig::default();
    let pods = vec![owner_pod("uid-old", "web-0", "node-a")];
    let (a, _) = step(
        &attempt(WorkloadKind::StatefulSet, "web-0"),
        &seen(Some("uid-old"), pods.clone()),
        t0(),
        &cfg,
    );
    let mut o = seen(Some("uid-old"), pods.clone());
    o.eviction = Some(EvictionResult::Refused {
        retry_after: Some(s(60)),
        message: "pdb".into(),
    });
    let (a, act) = step(&a, &o, t0() + s(1), &cfg);
    assert_eq!(evictions(&act), 0);
    // Before Retry-After: nothing; after it: the eviction again.
    let (b, act) = step(&a, &seen(Some("uid-old"), pods.clone()), t0() + s(59), &cfg);
    assert_eq!(evictions(&act), 0, "{act:?}");
    let (_, act) = step(&b, &seen(Some("uid-old"), pods), t0() + s(62), &cfg);
    assert_eq!(evictions(&act), 1, "{act:?}");
}

#[test]
fn no_eviction_while_the_workload_is_not_fully_available() {
    let cfg = MachineConfig::default();
    let pods = vec![owner_pod("uid-old", "web-0", "node-a")];
    let held = |why: &str| Observations {
        pod_uid: Some("uid-old".into()),
        workload: Some(WorkloadObservation {
            pods: pods.clone(),
            hold: Some(why.into()),
        }),
        ..Default::default()
    };
    let a = attempt(WorkloadKind::Deployment, "web-0");
    let (a, act) = step(&a, &held("2 of 3 pods are available"), t0() + s(10), &cfg);
    assert_eq!(a.phase, Phase::Pending);
    assert_eq!(evictions(&act), 0);
    // Not read this round: wait too.
    let (a, act) = step(
        &a,
        &Observations {
            pod_uid: Some("uid-old".into()),
            ..Default::default()
        },
        t0() + s(20),
        &cfg,
    );
    assert_eq!((a.phase, evictions(&act)), (Phase::Pending, 0));
    // Available again: evicted.
    let (b, act) = step(&a, &seen(Some("uid-old"), pods.clone()), t0() + s(30), &cfg);
    assert_eq!((b.phase, evictions(&act)), (Phase::Evicting, 1));
    // Unavailable for the whole eviction timeout: Failed, untouched.
    let (c, act) = step(
        &a,
        &held("2 of 3 pods are available"),
        t0() + cfg.eviction_timeout,
        &cfg,
    );
    assert_eq!(c.phase, Phase::Failed(FailReason::EvictionTimeout));
    assert_eq!(evictions(&act), 0);
    assert!(
        c.failure
            .unwrap_or_default()
            .contains("2 of 3 pods are available")
    );
    // A refused eviction is not asked again while the workload became
    // unavailable meanwhile.
    let mut o = seen(Some("uid-old"), pods.clone());
    o.eviction = Some(EvictionResult::Refused {
        retry_after: None,
        message: "pdb".into(),
    });
    let (b, _) = step(&b, &o, t0() + s(31), &cfg);
    let (b, act) = step(&b, &held("1 of 3 pods are available"), t0() + s(300), &cfg);
    assert_eq!((b.phase, evictions(&act)), (Phase::Evicting, 0));
}

#[test]
fn a_stale_replacement_fails_the_attempt_and_names_the_pins() {
    let cfg = MachineConfig::default();
    let mut a = attempt(WorkloadKind::DaemonSet, "agent-abcde");
    a.phase = Phase::Verifying;
    a.evicted_at = Some(t0());
    a.new_pod_uid = Some("uid-new".into());
    a.new_pod_name = Some("agent-vwxyz".into());
    a.new_pod_node = Some("node-a".into());
    let mut o = seen(None, vec![owner_pod("uid-new", "agent-vwxyz", "node-a")]);
    o.new_pod = NewPodCheck::StillStale {
        message: "volume config Stale/ImmutableCachePinned (mounted 591b vs current 6cc3), pinned by shop/other-0".into(),
    };
    let (b, act) = step(&a, &o, t0() + s(5), &cfg);
    assert_eq!(b.phase, Phase::Failed(FailReason::ReplacementStale));
    assert_eq!(evictions(&act), 0, "reported, never looped");
    let msg = b.failure.unwrap_or_default();
    assert!(
        msg.contains("shop/agent-vwxyz")
            && msg.contains("node-a")
            && msg.contains("pinned by shop/other-0"),
        "{msg}"
    );
    // The replacement gone before it was verified: wait, then time out.
    let gone = seen(None, vec![]);
    let (b, _) = step(&a, &gone, t0() + s(5), &cfg);
    assert_eq!(b.phase, Phase::Verifying);
    let (b, _) = step(&a, &gone, t0() + cfg.verification_timeout, &cfg);
    assert_eq!(b.phase, Phase::Failed(FailReason::VerificationTimeout));
    assert!(b.failure.unwrap_or_default().contains("is gone"));
}

#[test]
fn a_pod_known_before_the_eviction_is_never_taken_for_the_replacement() {
    let cfg = MachineConfig::default();
    // A scale-up pod created while the eviction was refused is known at
    // the next request: not the replacement.
    let before = vec![owner_pod("uid-old", "web-a", "node-a")];
    let (a, _) = step(
        &attempt(WorkloadKind::ReplicaSet, "web-a"),
        &seen(Some("uid-old"), before),
        t0(),
        &cfg,
    );
    let scaled = vec![
        owner_pod("uid-old", "web-a", "node-a"),
        owner_pod("uid-up", "web-b", "node-b"),
    ];
    let mut o = seen(Some("uid-old"), scaled.clone());
    o.eviction = Some(EvictionResult::Refused {
        retry_after: None,
        message: "pdb".into(),
    });
    let (a, _) = step(&a, &o, t0() + s(1), &cfg);
    let (a, act) = step(&a, &seen(Some("uid-old"), scaled), t0() + s(60), &cfg);
    assert_eq!(evictions(&act), 1);
    assert_eq!(
        act.first(),
        Some(&Action::Persist),
        "known pods recorded first"
    );
    assert!(a.known_pods.contains(&"uid-up".to_string()));
    let mut o = seen(None, vec![owner_pod("uid-up", "web-b", "node-b")]);
    o.eviction = Some(EvictionResult::Evicted);
    let (a, _) = step(&a, &o, t0() + s(61), &cfg);
    let (a, _) = step(
        &a,
        &seen(None, vec![owner_pod("uid-up", "web-b", "node-b")]),
        t0() + s(62),
        &cfg,
    );
    assert_eq!(a.phase, Phase::AwaitingReplacement);
    let (a, _) = step(
        &a,
        &seen(None, vec![]),
        t0() + cfg.replacement_timeout + s(61),
        &cfg,
    );
    assert_eq!(a.phase, Phase::Failed(FailReason::ReplacementTimeout));
    assert!(
        a.failure
            .unwrap_or_default()
            .contains("ReplicaSet web did not replace")
    );
}

#[test]
fn a_statefulset_pod_replaced_again_is_verified_under_its_newest_uid() {
    let cfg = MachineConfig::default();
    let mut a = attempt(WorkloadKind::StatefulSet, "db-0");
    a.phase = Phase::Verifying;
    a.evicted_at = Some(t0());
    a.new_pod_uid = Some("uid-new".into());
    a.new_pod_node = Some("node-b".into());
    let (b, act) = step(
        &a,
        &seen(
            Some("uid-newer"),
            vec![owner_pod("uid-newer", "db-0", "node-c")],
        ),
        t0() + s(5),
        &cfg,
    );
    assert_eq!(b.new_pod_uid.as_deref(), Some("uid-newer"));
    assert_eq!(b.new_pod_node.as_deref(), Some("node-c"));
    assert_eq!(act, vec![Action::Persist]);
}

#[test]
fn the_pod_replaced_before_anything_was_done_fails_untouched() {
    let cfg = MachineConfig::default();
    let (a, act) = step(
        &attempt(WorkloadKind::Deployment, "web-a"),
        &seen(None, vec![]),
        t0(),
        &cfg,
    );
    assert_eq!(a.phase, Phase::Failed(FailReason::PodChanged));
    assert_eq!(evictions(&act), 0);
    assert!(!a.is_open());
}

/// A pure world for the crash test: the workload's pods and the API's
/// answers to evictions, with the owner replacing an evicted pod (after
/// `lag` steps).
struct World {
    kind: WorkloadKind,
    pods: Vec<OwnerPod>,
    evictions_accepted: usize,
    replace_in: Option<u32>,
    /// The owner named by node-a's hold taint.
    taint: Option<String>,
}

impl World {
    fn new(kind: WorkloadKind) -> Self {
        Self {
            kind,
            pods: vec![
                owner_pod("uid-old", "web-0", "node-a"),
                owner_pod("uid-sib", "web-1", "node-b"),
            ],
            evictions_accepted: 0,
            replace_in: None,
            taint: None,
        }
    }

    fn evict(&mut self, uid: &str) -> EvictionResult {
        match self.pods.iter().position(|p| p.uid == uid) {
            Some(i) => {
                self.pods.remove(i);
                self.evictions_accepted += 1;
                self.replace_in = Some(1);
                EvictionResult::Evicted
            }
            None => EvictionResult::Gone,
        }
    }

    fn tick(&mut self) {
        if let Some(n) = self.replace_in.as_mut() {
            if *n == 0 {
                let (name, node) = match self.kind {
                    WorkloadKind::StatefulSet => ("web-0", "node-c"),
                    WorkloadKind::DaemonSet => ("web-x", "node-a"),
                    _ => ("web-x", "node-c"),
                };
                self.pods.push(owner_pod("uid-new", name, node));
                self.replace_in = None;
            } else {
                *n -= 1;
            }
        }
    }

    fn observe(&self, a: &Attempt) -> Observations {
        let (pod, new_pod_uid) = (a.pod.as_str(), a.new_pod_uid.as_deref());
        let mut o = seen(
            self.pods
                .iter()
                .find(|p| p.name == pod)
                .map(|p| p.uid.as_str()),
            self.pods.clone(),
        );
        if new_pod_uid.is_some_and(|u| self.pods.iter().any(|p| p.uid == u)) {
            o.new_pod = NewPodCheck::Fresh;
        }
        o.cordon = cordon_of(self.taint.as_deref(), a.hold_owner().unwrap_or_default());
        o
    }
}

/// Runs an attempt to its end; the process "dies" right after step
/// `crash_at`'s Persist (`after_write: false`) or after its writes
/// (`true`), losing everything in memory; the next process starts from
/// the record persisted last.
fn run_with_crash(kind: WorkloadKind, crash_at: usize, after_write: bool) -> (Attempt, World) {
    let cfg = MachineConfig::default();
    let mut w = World::new(kind);
    let mut persisted = AttemptsRecord::from_attempts([&attempt(kind, "web-0")]).to_json();
    let mut mem: Option<Attempt> = None;
    let mut last_eviction: Option<EvictionResult> = None;
    let mut last_check: Option<EvictionResult> = None;
    let mut crashed = false;
    let mut at: Timestamp = t0();
    for i in 0..200 {
        let a = match mem.take() {
            Some(a) => a,
            None => AttemptsRecord::parse(&persisted).expect("record").attempts[0].clone(),
        };
        if !a.is_open() {
            return (a, w);
        }
        let mut o = w.observe(&a);
        o.eviction = last_eviction.take();
        o.eviction_check = last_check.take();
        let (next, actions) = step(&a, &o, at, &cfg);
        let mut died = false;
        for act in actions {
            match act {
                Action::Persist => {
                    persisted = AttemptsRecord::from_attempts([&next]).to_json();
                    if i == crash_at && !after_write && !crashed {
                        died = true;
                        break;
                    }
                }
                Action::Evict { uid, .. } => {
                    assert!(
                        kind == WorkloadKind::StatefulSet
                            || w.taint.as_deref() == Some(next.id.as_str()),
                        "{kind:?}: evicted without the hold"
                    );
                    last_eviction = Some(w.evict(&uid));
                }
                Action::CheckEviction { uid, .. } => {
                    last_check = Some(if w.pods.iter().any(|p| p.uid == uid) {
                        EvictionResult::Evicted
                    } else {
                        EvictionResult::Gone
                    });
                }
                Action::CordonNode { owner, .. } => {
                    w.taint.get_or_insert(owner);
                }
                Action::UncordonNode { owner, .. }
                    if w.taint.as_deref() == Some(owner.as_str()) =>
                {
                    w.taint = None;
                }
                _ => {}
            }
        }
        if i == crash_at && after_write && !crashed {
            died = true;
        }
        if died {
            crashed = true;
            last_eviction = None;
            last_check = None;
            mem = None;
        } else {
            mem = Some(next);
        }
        w.tick();
        at += s(11);
    }
    panic!("{kind:?}: the attempt never ended (crash at {crash_at})");
}

#[test]
fn killed_at_every_step_the_attempt_finishes_once_after_restart() {
    for kind in WorkloadKind::ALL {
        for crash_at in 0..14 {
            for after_write in [false, true] {
                let (a, w) = run_with_crash(kind, crash_at, after_write);
                let case =
                    format!("{kind:?} crash at step {crash_at}, after its writes {after_write}");
                assert_eq!(a.phase, Phase::Succeeded, "{case}: {:?}", a.failure);
                assert_eq!(w.evictions_accepted, 1, "{case}");
                assert_eq!(a.new_pod_uid.as_deref(), Some("uid-new"), "{case}");
                assert!(
                    w.pods.iter().any(|p| p.uid == "uid-sib"),
                    "{case}: the sibling was never touched"
                );
                assert!(a.known_pods.contains(&"uid-sib".to_string()), "{case}");
                assert_eq!(w.taint, None, "{case}: the hold is lifted");
            }
        }
    }
}
