use jiff::{SignedDuration, Timestamp};

use super::*;
use crate::remediation::machine::{FailReason, Phase};
use crate::remediation::test_support::{attempt_in, t0};
use crate::verdict::UnverifiableReason;

fn now() -> Timestamp {
    t0() + SignedDuration::from_mins(30)
}

fn f(state: State, held: SignedDuration) -> CandidateFinding {
    CandidateFinding {
        subject: "volume slurm-etc".into(),
        state,
        since: now() - held,
        mounted: "591b08c85fb0".into(),
        current: "6cc34aeed46b".into(),
        pinned_by: vec![],
    }
}

fn stale() -> CandidateFinding {
    f(
        State::Stale(StaleCause::ImmutableCache),
        SignedDuration::from_mins(10),
    )
}

fn pod(name: &str, node: &str, findings: Vec<CandidateFinding>) -> Candidate {
    Candidate {
        namespace: "slurm".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: Some(node.into()),
        nodeset: Some("worker".into()),
        workload: None,
        slurm_node: Some(name.into()),
        terminated: false,
        findings,
    }
}

/// The NodeSet `slurm/worker`, opted in, one pod at a time.
pub(super) fn nodeset() -> NodeSetInfo {
    NodeSetInfo {
        namespace: "slurm".into(),
        name: "worker".into(),
        opt_in: true,
        remediate_on: None,
        max_unavailable: 1,
        unavailable: 0,
    }
}

fn on() -> PlanConfig {
    PlanConfig {
        mode: Mode::On,
        ..Default::default()
    }
}

fn started(p: &Plan) -> Vec<&str> {
    p.start.iter().map(|a| a.pod.as_str()).collect()
}

#[test]
fn qualifying_verdicts_and_exclusions() {
    let m = SignedDuration::from_mins;
    use FrozenCause as Fz;
    use StaleCause as S;
    let table: Vec<(&str, Vec<CandidateFinding>, Option<&str>, bool)> = vec![
        ("stale immutable cache", vec![stale()], None, true),
        (
            "stale unknown",
            vec![f(State::Stale(S::Unknown), m(6))],
            None,
            true,
        ),
        (
            "frozen read-at-start",
            vec![f(State::Frozen(Fz::ReadAtStart), m(6))],
            None,
            true,
        ),
        (
            "within the delay",
            vec![f(State::Stale(S::Unknown), m(4))],
            None,
            false,
        ),
        (
            "frozen subPath not by default",
            vec![f(State::Frozen(Fz::SubPath), m(6))],
            None,
            false,
        ),
        (
            "frozen subPath when asked",
            vec![f(State::Frozen(Fz::SubPath), m(6))],
            Some("Stale,Frozen/SubPath"),
            true,
        ),
        (
            "frozen env when asked",
            vec![f(State::Frozen(Fz::Env), m(6))],
            Some("Frozen"),
            true,
        ),
        (
            "stale not asked for",
            vec![stale()],
            Some("Frozen/ReadAtStart"),
            false,
        ),
        (
            "never kubelet not syncing",
            vec![f(State::Stale(S::KubeletNotSyncing), m(60))],
            Some("Stale"),
            false,
        ),
        (
            "never with an unverifiable subject",
            vec![
                stale(),
                f(State::Unverifiable(UnverifiableReason::ReadError), m(60)),
            ],
            None,
            false,
        ),
        (
            "never with a propagating subject",
            vec![stale(), f(State::Propagating, m(1))],
            None,
            false,
        ),
        (
            "never with a missing source",
            vec![stale(), f(State::SourceMissing, m(60))],
            None,
            false,
        ),
        (
            "never when unverifiable only",
            vec![f(
                State::Unverifiable(UnverifiableReason::NoInventory),
                m(60),
            )],
            None,
            false,
        ),
        (
            "bad remediate-on waits",
            vec![stale()],
            Some("Stale/KubeletNotSyncing"),
            false,
        ),
    ];
    let mut bad = vec![];
    for (name, findings, on_ann, want) in table {
        let ns = NodeSetInfo {
            remediate_on: on_ann.map(String::from),
            ..nodeset()
        };
        let p = plan(
            &[pod("w0", "node-a", findings)],
            &[ns],
            &[],
            &[],
            now(),
            &on(),
        );
        if (p.start.len() == 1) != want {
            bad.push(format!(
                "{name}: started {:?}, waiting {:?}",
                started(&p),
                p.waiting
            ));
        }
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn parse_remediate_on_names_the_accepted_values() {
    assert_eq!(
        parse_remediate_on("Stale, Frozen/ReadAtStart").expect("ok"),
        default_qualifying()
    );
    let e = parse_remediate_on("Unverifiable").expect_err("refused");
    assert!(e.contains("Frozen/ReadAtStart"), "{e}");
    assert!(parse_remediate_on(" , ").is_err());
}

#[test]
fn off_opt_out_missing_label_and_terminated_do_nothing() {
    let c = pod("w0", "node-a", vec![stale()]);
    let off = PlanConfig::default();
    assert_eq!(
        plan(
            std::slice::from_ref(&c),
            &[nodeset()],
            &[],
            &[],
            now(),
            &off
        ),
        Plan::default()
    );
    let out = NodeSetInfo {
        opt_in: false,
        ..nodeset()
    };
    assert!(
        plan(std::slice::from_ref(&c), &[out], &[], &[], now(), &on())
            .start
            .is_empty()
    );
    let no_label = Candidate {
        slurm_node: None,
        ..c.clone()
    };
    let p = plan(&[no_label], &[nodeset()], &[], &[], now(), &on());
    assert!(p.start.is_empty());
    assert!(
        p.waiting[0]
            .1
            .contains(crate::remediation::POD_HOSTNAME_LABEL)
    );
    let done = Candidate {
        terminated: true,
        ..c.clone()
    };
    assert!(
        plan(&[done], &[nodeset()], &[], &[], now(), &on())
            .start
            .is_empty()
    );
    let plain = Candidate { nodeset: None, ..c };
    assert!(
        plan(&[plain], &[nodeset()], &[], &[], now(), &on())
            .start
            .is_empty()
    );
}

#[test]
fn whole_node_stale_is_an_alert_not_a_remediation() {
    let a = pod("w0", "node-a", vec![stale()]);
    let b = pod(
        "w1",
        "node-a",
        vec![f(
            State::Stale(StaleCause::KubeletNotSyncing),
            SignedDuration::from_mins(10),
        )],
    );
    let ns = NodeSetInfo {
        max_unavailable: 5,
        ..nodeset()
    };
    let cfg = PlanConfig {
        budget_per_nodeset: 5,
        ..on()
    };
    let p = plan(&[a, b], &[ns], &[], &[], now(), &cfg);
    assert!(p.start.is_empty());
    assert!(p.waiting.iter().any(|(_, w)| w.contains("not syncing")));
}

#[test]
fn budget_one_per_nodeset_starts_one_at_a_time_oldest_first() {
    let mut pods = vec![];
    for (i, age) in [(0, 7), (1, 20), (2, 9)] {
        let mut c = pod(&format!("w{i}"), &format!("node-{i}"), vec![stale()]);
        c.findings[0].since = now() - SignedDuration::from_mins(age);
        pods.push(c);
    }
    let ns = NodeSetInfo {
        max_unavailable: 3,
        ..nodeset()
    };
    let p = plan(&pods, std::slice::from_ref(&ns), &[], &[], now(), &on());
    assert_eq!(started(&p), vec!["w1"], "oldest first");
    assert_eq!(p.waiting.len(), 2);
    assert!(p.waiting[0].1.contains("budget"));
    // While it is open, nothing else starts.
    let open = p.start.clone();
    let p2 = plan(&pods, std::slice::from_ref(&ns), &[], &open, now(), &on());
    assert!(p2.start.is_empty());
    // Once closed, the next one (and never the same UID again).
    let mut closed = open[0].clone();
    closed.phase = Phase::Succeeded;
    let p3 = plan(&pods, &[ns], &[], &[closed], now(), &on());
    assert_eq!(started(&p3), vec!["w2"]);
}

#[test]
fn never_beyond_the_nodesets_max_unavailable_nor_the_cluster_budget() {
    let pods: Vec<Candidate> = (0..4)
        .map(|i| pod(&format!("w{i}"), &format!("node-{i}"), vec![stale()]))
        .collect();
    let cfg = PlanConfig {
        budget_per_nodeset: 3,
        budget_cluster: 10,
        ..on()
    };
    let ns = NodeSetInfo {
        max_unavailable: 2,
        ..nodeset()
    };
    assert_eq!(
        plan(&pods, std::slice::from_ref(&ns), &[], &[], now(), &cfg)
            .start
            .len(),
        2
    );
    let one_down = NodeSetInfo {
        unavailable: 1,
        ..ns.clone()
    };
    assert_eq!(
        plan(&pods, &[one_down], &[], &[], now(), &cfg).start.len(),
        1
    );
    let none = NodeSetInfo {
        max_unavailable: 0,
        ..ns.clone()
    };
    assert!(plan(&pods, &[none], &[], &[], now(), &cfg).start.is_empty());
    let cluster = PlanConfig {
        budget_cluster: 1,
        ..cfg
    };
    assert_eq!(
        plan(&pods, std::slice::from_ref(&ns), &[], &[], now(), &cluster)
            .start
            .len(),
        1
    );
    // A failed attempt that keeps its node drained still uses the budget.
    let mut kept = attempt_in(Phase::Failed(FailReason::ReplacementStale));
    kept.nodeset = "worker".into();
    kept.kept_drained = true;
    let ns1 = NodeSetInfo {
        max_unavailable: 1,
        ..ns
    };
    assert!(
        plan(&pods, &[ns1], &[], &[kept], now(), &on())
            .start
            .is_empty()
    );
}

#[test]
fn pinned_cache_is_blocked_with_the_pinning_pods_and_no_attempt() {
    let mut c = pod(
        "w0",
        "node-a",
        vec![f(
            State::Stale(StaleCause::ImmutableCachePinned),
            SignedDuration::from_mins(10),
        )],
    );
    c.findings[0].pinned_by = vec!["login-0".into()];
    let p = plan(
        std::slice::from_ref(&c),
        &[nodeset()],
        &[],
        &[],
        now(),
        &on(),
    );
    assert!(p.start.is_empty());
    assert_eq!(p.blocked.len(), 1);
    let n = &p.blocked[0];
    assert_eq!(n.reason, EventReason::KubeletCachePinned);
    assert_eq!(n.pinned_by, vec!["login-0".to_string()]);
    assert!(n.message.contains("login-0"));
    assert!(n.message.contains("new name") && n.message.contains("restart the kubelet"));
    // The optional mode does not help when the pinning pod is no NodeSet pod.
    let cfg = PlanConfig {
        replace_pinning_pods: true,
        ..on()
    };
    let p = plan(&[c], &[nodeset()], &[], &[], now(), &cfg);
    assert!(p.start.is_empty());
    assert_eq!(p.blocked.len(), 1);
}

#[test]
fn replace_pinning_pods_replaces_remediable_nodeset_pods_together() {
    let pinned = |name: &str, by: &str| {
        let mut c = pod(
            name,
            "node-a",
            vec![f(
                State::Stale(StaleCause::ImmutableCachePinned),
                SignedDuration::from_mins(10),
            )],
        );
        c.findings[0].pinned_by = vec![by.into()];
        c
    };
    let pods = vec![pinned("w0", "w1"), pinned("w1", "w0")];
    let ns = NodeSetInfo {
        max_unavailable: 2,
        ..nodeset()
    };
    let cfg = PlanConfig {
        replace_pinning_pods: true,
        budget_per_nodeset: 2,
        ..on()
    };
    let p = plan(&pods, std::slice::from_ref(&ns), &[], &[], now(), &cfg);
    let mut names = started(&p);
    names.sort();
    assert_eq!(names, vec!["w0", "w1"]);
    assert!(p.start[0].group.is_some());
    assert_eq!(p.start[0].group, p.start[1].group);
    // Not enough budget for the whole group: none starts.
    let small = PlanConfig {
        budget_per_nodeset: 1,
        ..cfg.clone()
    };
    assert!(
        plan(&pods, std::slice::from_ref(&ns), &[], &[], now(), &small)
            .start
            .is_empty()
    );
    // Off by default.
    let p = plan(&pods, &[ns], &[], &[], now(), &on());
    assert!(p.start.is_empty());
    assert_eq!(p.blocked.len(), 2);
}

#[test]
fn dry_run_computes_the_same_selection_but_starts_nothing() {
    let pods = vec![
        pod("w0", "node-a", vec![stale()]),
        pod("w1", "node-b", vec![stale()]),
    ];
    let cfg = PlanConfig {
        mode: Mode::DryRun,
        ..Default::default()
    };
    let p = plan(&pods, &[nodeset()], &[], &[], now(), &cfg);
    assert!(p.start.is_empty());
    assert_eq!(p.dry_run.len(), 1, "the budget applies in dry-run too");
    let n = &p.dry_run[0];
    assert_eq!(n.reason, EventReason::RemediationDryRun);
    assert!(
        n.message.contains("would drain Slurm node w0"),
        "{}",
        n.message
    );
    assert!(
        n.message
            .contains("mountguard: slurm/w0 volume slurm-etc stale")
    );
}

#[test]
fn attempts_carry_pod_node_and_findings() {
    let p = plan(
        &[pod("w0", "node-a", vec![stale()])],
        &[nodeset()],
        &[],
        &[],
        now(),
        &on(),
    );
    let a = &p.start[0];
    assert_eq!(
        (
            a.namespace.as_str(),
            a.nodeset.as_str(),
            a.pod.as_str(),
            a.pod_uid.as_str()
        ),
        ("slurm", "worker", "w0", "uid-w0")
    );
    assert_eq!((a.node.as_str(), a.slurm_node.as_str()), ("node-a", "w0"));
    assert_eq!(a.phase, Phase::Pending);
    assert_eq!(a.findings[0].state, "Stale/ImmutableCache");
    assert!(a.drain_reason.ends_with(&format!("attempt {}", a.id)));
}

#[test]
fn summary_counts_open_drained_and_failed() {
    let mut a = attempt_in(Phase::Drained);
    a.started_at = t0() - SignedDuration::from_mins(10);
    let mut b = attempt_in(Phase::Failed(FailReason::ReplacementStale));
    b.slurm_node = "n2".into();
    b.kept_drained = true;
    let c = attempt_in(Phase::Succeeded);
    let s = summarize(&[a, b, c], &[], t0());
    assert_eq!(s.open, 2);
    assert_eq!(s.nodes_drained, 2);
    assert_eq!(s.failed_kept_drained, 1);
    assert_eq!(s.oldest_open_age_seconds, 600.0);
    let empty = summarize(&[], &[], t0());
    assert_eq!(
        empty,
        Summary {
            failed_unresolved: OWNER_KINDS.iter().map(|k| (*k, 0)).collect(),
            ..Summary::default()
        }
    );
}
