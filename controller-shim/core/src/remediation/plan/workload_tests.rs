//! The planner on workload pods: opt-in, enabled kinds, budgets,
//! availability, pinned caches, replacements that failed, dry-run.

use std::collections::BTreeSet;

use jiff::{SignedDuration, Timestamp};

use super::*;
use crate::remediation::machine::{FailReason, Phase};
use crate::remediation::test_support::t0;
use crate::remediation::workload::{WorkloadInfo, WorkloadKind, WorkloadRef};

fn now() -> Timestamp {
    t0() + SignedDuration::from_mins(30)
}

fn stale() -> CandidateFinding {
    CandidateFinding {
        subject: "volume config".into(),
        state: State::Stale(StaleCause::ImmutableCache),
        since: now() - SignedDuration::from_mins(10),
        mounted: "591b08c85fb0".into(),
        current: "6cc34aeed46b".into(),
        pinned_by: vec![],
    }
}

fn wref(kind: WorkloadKind) -> WorkloadRef {
    WorkloadRef {
        kind,
        name: "web".into(),
    }
}

fn pod(kind: WorkloadKind, name: &str, node: &str, findings: Vec<CandidateFinding>) -> Candidate {
    Candidate {
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: Some(node.into()),
        nodeset: None,
        workload: Some(wref(kind)),
        slurm_node: None,
        terminated: false,
        findings,
    }
}

fn info(kind: WorkloadKind) -> WorkloadInfo {
    WorkloadInfo {
        namespace: "shop".into(),
        workload: wref(kind),
        opt_in: Ok(true),
        remediate_on: None,
        max_in_flight: Ok(1),
        not_available: None,
        when_unavailable: false,
    }
}

fn on() -> PlanConfig {
    PlanConfig {
        mode: Mode::On,
        workload_kinds: WorkloadKind::ALL.into_iter().collect(),
        ..Default::default()
    }
}

fn started(p: &Plan) -> Vec<&str> {
    p.start.iter().map(|a| a.pod.as_str()).collect()
}

fn waiting(p: &Plan) -> String {
    p.waiting
        .iter()
        .map(|(pod, why)| format!("{pod}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn only_the_stale_pod_of_an_opted_in_enabled_kind_starts() {
    use WorkloadKind as K;
    for kind in K::ALL {
        let pods = vec![pod(kind, "web-a", "node-a", vec![stale()])];
        // (case, info, enabled kinds, starts)
        let only = |k: K| -> BTreeSet<K> { [k].into() };
        let others: BTreeSet<K> = K::ALL.into_iter().filter(|k| *k != kind).collect();
        let t: Vec<(&str, WorkloadInfo, BTreeSet<K>, bool)> = vec![
            ("opted in, kind enabled", info(kind), only(kind), true),
            ("kind not enabled", info(kind), others, false),
            ("no kind enabled", info(kind), BTreeSet::new(), false),
            (
                "not opted in",
                WorkloadInfo {
                    opt_in: Ok(false),
                    ..info(kind)
                },
                only(kind),
                false,
            ),
        ];
        for (case, i, kinds, starts) in t {
            let cfg = PlanConfig {
                workload_kinds: kinds,
                ..on()
            };
            let p = plan(&pods, &[], &[i], &[], now(), &cfg);
            assert_eq!(p.start.len(), usize::from(starts), "{kind:?} {case}: {p:?}");
            if starts {
                let a = &p.start[0];
                assert_eq!(a.workload, Some(wref(kind)), "{case}");
                assert_eq!((a.nodeset.as_str(), a.slurm_node.as_str()), ("", ""));
                assert!(a.drain_reason.is_empty());
                assert_eq!(a.findings[0].subject, "volume config".into());
            }
        }
    }
}

#[test]
fn a_deployment_of_three_with_one_stale_pod_evicts_that_pod_only() {
    let k = WorkloadKind::Deployment;
    let pods = vec![
        pod(k, "web-a", "node-a", vec![stale()]),
        // The other two have no non-Fresh verdict: not candidates at all,
        // but a pod of theirs with a verdict inside the delay waits.
        pod(
            k,
            "web-b",
            "node-b",
            vec![CandidateFinding {
                since: now() - SignedDuration::from_mins(1),
                ..stale()
            }],
        ),
    ];
    let p = plan(&pods, &[], &[info(k)], &[], now(), &on());
    assert_eq!(started(&p), vec!["web-a"]);
}

#[test]
fn one_in_flight_per_workload_unless_its_annotation_raises_it() {
    let k = WorkloadKind::StatefulSet;
    let pods: Vec<Candidate> = (0..3)
        .map(|i| pod(k, &format!("web-{i}"), &format!("node-{i}"), vec![stale()]))
        .collect();
    let p = plan(&pods, &[], &[info(k)], &[], now(), &on());
    assert_eq!(started(&p), vec!["web-0"]);
    assert!(
        waiting(&p).contains("StatefulSet web budget: 1 attempts open, limit 1"),
        "{}",
        waiting(&p)
    );
    let two = WorkloadInfo {
        max_in_flight: Ok(2),
        ..info(k)
    };
    let p = plan(&pods, &[], std::slice::from_ref(&two), &[], now(), &on());
    assert_eq!(started(&p), vec!["web-0", "web-1"]);
    // An open attempt counts.
    let open = p.start[0].clone();
    let p = plan(&pods, &[], &[two], &[open], now(), &on());
    assert_eq!(started(&p), vec!["web-1"]);
    // A bad annotation: a clear error, nothing starts.
    let bad = WorkloadInfo {
        max_in_flight: Err("mountguard.io/remediate-max-in-flight: \"0\" on StatefulSet web is not a positive integer".into()),
        ..info(k)
    };
    let p = plan(&pods, &[], &[bad], &[], now(), &on());
    assert!(p.start.is_empty());
    assert!(waiting(&p).contains("not a positive integer"));
    let bad = WorkloadInfo {
        opt_in: Err("mountguard.io/remediate: \"true\" on StatefulSet web; the only remediation of a workload's pods is \"evict\"".into()),
        ..info(k)
    };
    let p = plan(&pods, &[], &[bad], &[], now(), &on());
    assert!(p.start.is_empty());
    assert!(waiting(&p).contains("\"evict\""), "{}", waiting(&p));
}

#[test]
fn the_global_workload_budget_is_apart_from_the_nodesets() {
    let mk = |name: &str| WorkloadInfo {
        workload: WorkloadRef {
            kind: WorkloadKind::Deployment,
            name: name.into(),
        },
        ..info(WorkloadKind::Deployment)
    };
    let infos: Vec<WorkloadInfo> = ["a", "b", "c"].iter().map(|n| mk(n)).collect();
    let pods: Vec<Candidate> = ["a", "b", "c"]
        .iter()
        .map(|n| Candidate {
            workload: Some(mk(n).workload),
            ..pod(
                WorkloadKind::Deployment,
                &format!("{n}-pod"),
                "node-a",
                vec![stale()],
            )
        })
        .collect();
    let cfg = PlanConfig {
        budget_workloads: 2,
        budget_cluster: 0,
        ..on()
    };
    let p = plan(&pods, &[], &infos, &[], now(), &cfg);
    assert_eq!(started(&p), vec!["a-pod", "b-pod"]);
    assert!(
        waiting(&p).contains("workload budget: 2 of 2"),
        "{}",
        waiting(&p)
    );
}

#[test]
fn no_eviction_while_not_fully_available_unless_allowed() {
    let k = WorkloadKind::Deployment;
    let pods = vec![pod(k, "web-a", "node-a", vec![stale()])];
    let down = WorkloadInfo {
        not_available: Some("2 of 3 pods are available".into()),
        ..info(k)
    };
    let p = plan(&pods, &[], std::slice::from_ref(&down), &[], now(), &on());
    assert!(p.start.is_empty());
    let w = waiting(&p);
    assert!(
        w.contains("not fully available (2 of 3 pods are available)")
            && w.contains("mountguard.io/remediate-when-unavailable"),
        "{w}"
    );
    let allowed = WorkloadInfo {
        when_unavailable: true,
        ..down
    };
    assert_eq!(
        started(&plan(&pods, &[], &[allowed], &[], now(), &on())),
        vec!["web-a"]
    );
}

#[test]
fn a_pinned_daemonset_pod_is_reported_and_never_evicted() {
    let k = WorkloadKind::DaemonSet;
    let pinned = CandidateFinding {
        state: State::Stale(StaleCause::ImmutableCachePinned),
        pinned_by: vec!["other-0".into(), "other-1".into()],
        ..stale()
    };
    let pods = vec![pod(k, "agent-a", "node-a", vec![pinned])];
    let cfg = PlanConfig {
        replace_pinning_pods: true,
        ..on()
    };
    let p = plan(&pods, &[], &[info(k)], &[], now(), &cfg);
    assert!(p.start.is_empty());
    assert_eq!(p.blocked.len(), 1);
    let n = &p.blocked[0];
    assert_eq!(n.reason, EventReason::KubeletCachePinned);
    assert_eq!(n.workload, Some(wref(k)));
    assert_eq!(n.pinned_by, vec!["other-0", "other-1"]);
    assert!(
        n.message.contains("other-0, other-1") && n.message.contains("node-a"),
        "{}",
        n.message
    );
    assert!(
        !n.message.contains("--replace-pinning-pods"),
        "{}",
        n.message
    );
}

#[test]
fn the_replacement_of_a_failed_attempt_is_not_evicted_again() {
    let k = WorkloadKind::DaemonSet;
    let first = plan(
        &[pod(k, "agent-a", "node-a", vec![stale()])],
        &[],
        &[info(k)],
        &[],
        now(),
        &on(),
    )
    .start
    .remove(0);
    let mut failed = first.clone();
    failed.phase = Phase::Failed(FailReason::ReplacementStale);
    failed.new_pod_uid = Some("uid-agent-b".into());
    failed.new_pod_name = Some("agent-b".into());
    let replacement = pod(k, "agent-b", "node-a", vec![stale()]);
    let p = plan(
        std::slice::from_ref(&replacement),
        &[],
        &[info(k)],
        &[failed.clone()],
        now(),
        &on(),
    );
    assert!(p.start.is_empty(), "never looped: {p:?}");
    assert!(
        waiting(&p).contains(&format!("failed attempt {}", failed.id)),
        "{}",
        waiting(&p)
    );
    // While the attempt is open its replacement is its own: not a candidate.
    let mut open = first;
    open.phase = Phase::Verifying;
    open.new_pod_uid = Some("uid-agent-b".into());
    open.new_pod_name = Some("agent-b".into());
    let p = plan(
        std::slice::from_ref(&replacement),
        &[],
        &[info(k)],
        &[open],
        now(),
        &on(),
    );
    assert!(p.start.is_empty() && p.waiting.is_empty(), "{p:?}");
    // After a success, a later stale verdict of the replacement is a new
    // case: it qualifies again.
    let mut done = failed;
    done.phase = Phase::Succeeded;
    let p = plan(&[replacement], &[], &[info(k)], &[done], now(), &on());
    assert_eq!(started(&p), vec!["agent-b"]);
}

#[test]
fn dry_run_says_what_it_would_do_and_starts_nothing() {
    let k = WorkloadKind::Deployment;
    let cfg = PlanConfig {
        mode: Mode::DryRun,
        ..on()
    };
    let p = plan(
        &[pod(k, "web-a", "node-a", vec![stale()])],
        &[],
        &[info(k)],
        &[],
        now(),
        &cfg,
    );
    assert!(p.start.is_empty());
    assert_eq!(p.dry_run.len(), 1);
    let n = &p.dry_run[0];
    assert_eq!(n.reason, EventReason::RemediationDryRun);
    assert_eq!(n.workload, Some(wref(k)));
    assert!(
        n.message
            .contains("would evict shop/web-a (Deployment web) through the Eviction API"),
        "{}",
        n.message
    );
    // Off: nothing at all.
    let off = PlanConfig {
        mode: Mode::Off,
        ..on()
    };
    let p = plan(
        &[pod(k, "web-a", "node-a", vec![stale()])],
        &[],
        &[info(k)],
        &[],
        now(),
        &off,
    );
    assert_eq!(p, Plan::default());
}

#[test]
fn unsafe_verdicts_and_a_kubelet_not_syncing_hold_workload_pods_too() {
    let k = WorkloadKind::ReplicaSet;
    let unverifiable = CandidateFinding {
        subject: "volume other".into(),
        state: State::Unverifiable(crate::verdict::UnverifiableReason::NoInventory),
        ..stale()
    };
    let p = plan(
        &[pod(k, "web-a", "node-a", vec![stale(), unverifiable])],
        &[],
        &[info(k)],
        &[],
        now(),
        &on(),
    );
    assert!(p.start.is_empty());
    assert!(waiting(&p).contains("not judged safely"), "{}", waiting(&p));
    let not_syncing = CandidateFinding {
        state: State::Stale(StaleCause::KubeletNotSyncing),
        ..stale()
    };
    let p = plan(
        &[
            pod(k, "web-a", "node-a", vec![stale()]),
            pod(k, "web-b", "node-a", vec![not_syncing]),
        ],
        &[],
        &[info(k)],
        &[],
        now(),
        &on(),
    );
    assert!(p.start.is_empty());
    assert!(waiting(&p).contains("not syncing"), "{}", waiting(&p));
}

#[test]
fn workload_attempts_leave_the_nodeset_budgets_alone() {
    let k = WorkloadKind::Deployment;
    let mut open = plan(
        &[pod(k, "web-a", "node-a", vec![stale()])],
        &[],
        &[info(k)],
        &[],
        now(),
        &on(),
    )
    .start
    .remove(0);
    open.phase = Phase::Evicting;
    let worker = Candidate {
        namespace: "slurm".into(),
        name: "worker-0".into(),
        uid: "uid-w0".into(),
        node: Some("node-b".into()),
        nodeset: Some("worker".into()),
        workload: None,
        slurm_node: Some("w0".into()),
        terminated: false,
        findings: vec![stale()],
    };
    let set = super::tests::nodeset();
    let cfg = PlanConfig {
        budget_cluster: 1,
        ..on()
    };
    let p = plan(&[worker], &[set], &[info(k)], &[open], now(), &cfg);
    assert_eq!(started(&p), vec!["worker-0"]);
    assert!(!p.start[0].drain_reason.is_empty());
}

/// A Deployment attempt that failed: `evicted` says whether the pod was
/// evicted, `replacement` the replacement's UID when one was seen.
fn failed_workload_attempt(
    reason: FailReason,
    evicted: bool,
    replacement: Option<&str>,
) -> Attempt {
    let k = WorkloadKind::Deployment;
    let mut a = plan(
        &[pod(k, "web-1", "node-a", vec![stale()])],
        &[],
        &[info(k)],
        &[],
        now(),
        &on(),
    )
    .start
    .remove(0);
    a.phase = Phase::Failed(reason);
    a.evicted_at = evicted.then(now);
    a.new_pod_uid = replacement.map(String::from);
    a.new_pod_name = replacement.map(|_| "web-2".to_string());
    a
}

fn unresolved(s: &Summary, kind: &str) -> usize {
    s.failed_unresolved[kind]
}

#[test]
fn a_failed_workload_repair_that_leaves_a_stale_pod_counts_as_unresolved_until_it_is_fresh() {
    let k = WorkloadKind::Deployment;
    let failed = failed_workload_attempt(FailReason::ReplacementStale, true, Some("uid-web-2"));
    // The replacement still stale: the failure needs an operator, though no
    // node is kept drained (a workload attempt never drains one).
    let stale_replacement = pod(k, "web-2", "node-a", vec![stale()]);
    let s = summarize(std::slice::from_ref(&failed), &[stale_replacement], now());
    assert_eq!(s.failed_kept_drained, 0);
    assert_eq!(unresolved(&s, "Deployment"), 1, "{s:?}");
    assert_eq!(unresolved(&s, "NodeSet"), 0);
    // Fresh (or gone): resolved.
    let fresh_replacement = pod(k, "web-2", "node-a", vec![]);
    let s = summarize(std::slice::from_ref(&failed), &[fresh_replacement], now());
    assert_eq!(unresolved(&s, "Deployment"), 0, "{s:?}");
    assert_eq!(
        summarize(std::slice::from_ref(&failed), &[], now()).failed_unresolved["Deployment"],
        0
    );
    // A PDB that kept refusing: the pod itself was never evicted and stays
    // stale.
    let refused = failed_workload_attempt(FailReason::EvictionTimeout, false, None);
    let s = summarize(
        &[refused],
        &[pod(k, "web-1", "node-a", vec![stale()])],
        now(),
    );
    assert_eq!(unresolved(&s, "Deployment"), 1, "{s:?}");
    // Evicted, no replacement seen: no pod is left stale by this attempt
    // (a stale replacement appearing later gets an attempt of its own).
    let gone = failed_workload_attempt(FailReason::ReplacementTimeout, true, None);
    let s = summarize(&[gone], &[pod(k, "web-1", "node-a", vec![stale()])], now());
    assert_eq!(unresolved(&s, "Deployment"), 0, "{s:?}");
}

#[test]
fn a_failed_nodeset_repair_that_released_its_drain_still_counts_while_its_pod_is_stale() {
    // The drain timed out: the drain was handed back (not kept), the pod
    // was never evicted and stays stale.
    let mut a =
        crate::remediation::test_support::attempt_in(Phase::Failed(FailReason::DrainTimeout));
    a.kept_drained = false;
    let worker = Candidate {
        namespace: "slurm".into(),
        name: "worker-0".into(),
        uid: "uid-old".into(),
        node: Some("node-a".into()),
        nodeset: Some("worker".into()),
        workload: None,
        slurm_node: Some("n1".into()),
        terminated: false,
        findings: vec![stale()],
    };
    let s = summarize(
        std::slice::from_ref(&a),
        std::slice::from_ref(&worker),
        now(),
    );
    assert_eq!(
        (s.failed_kept_drained, unresolved(&s, "NodeSet")),
        (0, 1),
        "{s:?}"
    );
    // A later attempt on the same pod takes it on: not counted twice.
    let mut later = crate::remediation::test_support::attempt_in(Phase::Drained);
    later.id = "d4e5f6".into();
    later.started_at = now();
    let s = summarize(&[a, later], &[worker], now());
    assert_eq!(unresolved(&s, "NodeSet"), 0, "{s:?}");
}
