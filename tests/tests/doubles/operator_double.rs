//! The Slinky operator's Slurm-side rules (slurm-operator v1.2.1, see
//! `mountguard_tests::operator`): the pure rules, then the cluster in a box
//! applying them through the slurmrestd double.

use mountguard_tests::apiserver::{DeleteOptions, resources};
use mountguard_tests::cluster::{self, Cluster};
use mountguard_tests::operator::{
    ANNOTATION_POD_CORDON, PRESTOP_REASON, PodFacts, SlurmFacts, SlurmUpdate, make_drain,
    make_undrain, prestop, sync_cordon, sync_pod_uncordon,
};
use mountguard_tests::scenario::{rotate_auth_key, wait_for_slurmd_pods};
use serde_json::{Value, json};

use crate::{eventually, set_unschedulable};

fn facts(state: &[&str], reason: &str) -> SlurmFacts {
    SlurmFacts {
        state: state.iter().map(|s| s.to_string()).collect(),
        reason: reason.into(),
    }
}

fn pod(node_cordoned: bool, pod_cordoned: bool) -> PodFacts {
    PodFacts {
        pod: "slurm/worker-0".into(),
        node: "node-0".into(),
        node_cordoned,
        pod_cordoned,
    }
}

#[test]
fn sync_cordon_leaves_foreign_reasons_and_unresponsive_nodes_alone() {
    for n in [
        facts(
            &["IDLE", "DRAIN"],
            "mountguard: slurm/worker-0 ... attempt 1",
        ),
        facts(&["IDLE", "DRAIN"], "admin: replace DIMM"),
        // DOWN for not responding, even with no reason of anyone else.
        facts(&["DOWN", "NOT_RESPONDING"], "Not responding"),
    ] {
        for (nc, pc) in [(false, false), (true, false), (false, true), (true, true)] {
            let out = sync_cordon(&pod(nc, pc), &n);
            assert_eq!(out, Default::default(), "{n:?} node {nc} pod {pc}");
        }
    }
}

#[test]
fn sync_cordon_drains_for_a_cordoned_node_or_pod_and_undrains_otherwise() {
    // Node cordoned: cordon the pod and drain with the operator's reason.
    let out = sync_cordon(&pod(true, false), &facts(&["IDLE"], ""));
    assert!(out.cordon_pod);
    assert_eq!(
        out.update,
        Some(SlurmUpdate::Drain(
            "slurm-operator: Node (node-0) was cordoned, Pod (slurm/worker-0) must be cordoned"
                .into()
        ))
    );
    // Pod cordoned: drain.
    let out = sync_cordon(&pod(false, true), &facts(&["IDLE"], ""));
    assert!(!out.cordon_pod);
    assert_eq!(
        out.update,
        Some(SlurmUpdate::Drain(
            "slurm-operator: Pod (slurm/worker-0) was cordoned".into()
        ))
    );
    // Neither: undrain a node drained with an operator reason, or with no
    // reason at all (empty counts as the operator's).
    for r in ["slurm-operator: Pod is terminating", ""] {
        let out = sync_cordon(&pod(false, false), &facts(&["IDLE", "DRAIN"], r));
        assert_eq!(
            out.update,
            Some(SlurmUpdate::Undrain(
                "slurm-operator: Pod (slurm/worker-0) was uncordoned".into()
            )),
            "{r:?}"
        );
    }
    // Not drained: nothing to undrain.
    assert_eq!(
        sync_cordon(&pod(false, false), &facts(&["IDLE"], "")).update,
        None
    );
    // The preStop hook's DOWN is the operator's reason but not "Not
    // responding": syncCordon undrains it (DOWN stays).
    let out = sync_cordon(
        &pod(false, false),
        &facts(&["DOWN", "DRAIN"], PRESTOP_REASON),
    );
    assert!(
        matches!(out.update, Some(SlurmUpdate::Undrain(_))),
        "{out:?}"
    );
}

#[test]
fn sync_pod_uncordon_removes_a_cordon_it_did_not_set_and_undrains_unless_the_node_is_cordoned_or_the_reason_foreign()
 {
    let cordoned = facts(
        &["IDLE", "DRAIN"],
        "slurm-operator: Pod (slurm/w-0) was cordoned",
    );
    // A kept pod cordoned by someone else on a schedulable node: the
    // annotation goes and the node is undrained with no reason.
    let out = sync_pod_uncordon(&pod(false, true), &cordoned, &cordoned);
    assert!(out.uncordon_pod);
    assert_eq!(out.update, Some(SlurmUpdate::Undrain(String::new())));
    // Its Kubernetes node cordoned: left alone.
    let out = sync_pod_uncordon(&pod(true, true), &cordoned, &cordoned);
    assert_eq!((out.uncordon_pod, out.update), (false, None));
    // A reason not its own (mountguard's, an administrator's): left alone.
    for r in ["mountguard: x attempt 1", "admin: DIMM"] {
        let n = facts(&["IDLE", "DRAIN"], r);
        let out = sync_pod_uncordon(&pod(false, true), &n, &n);
        assert_eq!((out.uncordon_pod, out.update), (false, None), "{r}");
    }
    // Its check on an older read (no reason yet), its undrain on the
    // current one: the check-then-act that can undo someone's fresh DRAIN,
    // but never a FAIL.
    let ours = facts(&["IDLE", "DRAIN"], "mountguard: x attempt 1");
    let out = sync_pod_uncordon(&pod(false, false), &facts(&["IDLE"], ""), &ours);
    assert_eq!(out.update, Some(SlurmUpdate::Undrain(String::new())));
    let held = facts(&["IDLE", "FAIL"], "mountguard: x attempt 1");
    let out = sync_pod_uncordon(&pod(false, false), &facts(&["IDLE"], ""), &held);
    assert_eq!(out.update, None);
}

#[test]
fn make_drain_keeps_an_existing_reason_and_does_not_repeat_itself() {
    // An existing operator reason is kept unless overridden.
    let n = facts(&["IDLE"], "slurm-operator: Pod is terminating");
    assert_eq!(
        make_drain(&n, "Pod (slurm/worker-0) was cordoned", false),
        Some(SlurmUpdate::Drain(
            "slurm-operator: Pod is terminating".into()
        ))
    );
    assert_eq!(
        make_drain(&n, "x", true),
        Some(SlurmUpdate::Drain("slurm-operator: x".into()))
    );
    // Already drained with that reason: no request.
    let n = facts(&["IDLE", "DRAIN"], "slurm-operator: x");
    assert_eq!(make_drain(&n, "x", false), None);
    // An empty reason becomes "unknown".
    assert_eq!(
        make_drain(&facts(&["IDLE"], ""), "", false),
        Some(SlurmUpdate::Drain("slurm-operator: unknown".into()))
    );
    // Undrain: only when DRAIN is set and UNDRAIN is not; empty reason sent empty.
    assert_eq!(make_undrain(&facts(&["IDLE"], ""), "x"), None);
    assert_eq!(
        make_undrain(&facts(&["IDLE", "DRAIN", "UNDRAIN"], ""), "x"),
        None
    );
    assert_eq!(
        make_undrain(&facts(&["IDLE", "DRAIN"], ""), ""),
        Some(SlurmUpdate::Undrain(String::new()))
    );
}

#[test]
fn the_prestop_hook_writes_only_when_scontrol_can_authenticate() {
    assert_eq!(
        prestop(true),
        Some(SlurmUpdate::Down(
            "slurm-operator: Pod is terminating".into()
        ))
    );
    assert_eq!(prestop(false), None);
}

#[tokio::test]
async fn the_cluster_applies_prestop_and_sync_cordon_through_slurmrestd() {
    let mut c = Cluster::builder()
        .nodes(2)
        .slinky()
        .slinky_operator_rules()
        .start()
        .await
        .unwrap();
    let api = c.api();
    let slurm = c.slurm();
    let pods = wait_for_slurmd_pods(&c).await.unwrap();
    let (w0, w1) = (pods[0].0.clone(), pods[1].0.clone());
    eventually(15, "both slurmd responding", || {
        let ok = [&w0, &w1].iter().all(|h| {
            slurm
                .node(h)
                .is_some_and(|n| !n.state.iter().any(|s| s == "DOWN"))
        });
        async move { ok.then_some(()) }
    })
    .await;
    // A mountguard drain: syncCordon leaves it, even on a cordoned node.
    let ours = "mountguard: slurm/w volume slurm-etc stale (mounted a vs current b) attempt 1";
    slurm.admin_drain(&w1, ours, "slurm");
    // Cordon node-0: worker 0's pod is cordoned and its Slurm node drained
    // with the operator's reason.
    set_unschedulable(&api, "node-0", true);
    set_unschedulable(&api, "node-1", true);
    eventually(15, "worker 0 drained by the operator", || {
        let n = slurm.node(&w0);
        let p = api
            .get(&resources::PODS, cluster::SLURM_NAMESPACE, &w0)
            .ok();
        async move {
            let n = n?;
            let p = p?;
            (n.state.iter().any(|s| s == "DRAIN")
                && n.reason
                    .starts_with("slurm-operator: Node (node-0) was cordoned")
                && p["metadata"]["annotations"][ANNOTATION_POD_CORDON] == "true")
                .then_some(())
        }
    })
    .await;
    assert_eq!(
        slurm.node(&w1).unwrap().reason,
        ours,
        "a foreign reason is left alone"
    );
    // Uncordon node-0 and the pod: the operator undrains.
    set_unschedulable(&api, "node-0", false);
    api.merge_patch(
        &resources::PODS,
        cluster::SLURM_NAMESPACE,
        &w0,
        &json!({"metadata": {"annotations": {ANNOTATION_POD_CORDON: null}}}),
        None,
    )
    .unwrap();
    eventually(15, "worker 0 undrained by the operator", || {
        let n = slurm.node(&w0);
        async move {
            n.filter(|n| !n.state.iter().any(|s| s == "DRAIN"))
                .map(|_| ())
        }
    })
    .await;
    set_unschedulable(&api, "node-1", false);
    // preStop: deleting worker 0's pod (key current) sets DOWN with the
    // operator's reason.
    api.delete(
        &resources::PODS,
        cluster::SLURM_NAMESPACE,
        &w0,
        &DeleteOptions::default(),
    )
    .unwrap();
    eventually(15, "the preStop hook's DOWN", || {
        let n = slurm.node(&w0);
        async move {
            n.filter(|n| n.state.iter().any(|s| s == "DOWN") && n.reason == PRESTOP_REASON)
                .map(|_| ())
        }
    })
    .await;
    // With a stale key in the pod, scontrol cannot authenticate: deleting
    // worker 1 leaves its state and reason as they were.
    rotate_auth_key(&api).unwrap();
    let before = slurm.node(&w1).unwrap();
    api.delete(
        &resources::PODS,
        cluster::SLURM_NAMESPACE,
        &w1,
        &DeleteOptions::default(),
    )
    .unwrap();
    eventually(15, "worker 1's pod gone", || {
        let gone = api
            .get(&resources::PODS, cluster::SLURM_NAMESPACE, &w1)
            .ok()
            .is_none_or(|p| p["metadata"]["uid"].as_str() != Some(pods[1].1.as_str()));
        async move { gone.then_some(()) }
    })
    .await;
    // The hook wrote nothing: the reason is as it was, but for what Slurm
    // itself appends once the stopped slurmd's node is set DOWN.
    let after = slurm.node(&w1).unwrap().reason;
    assert!(
        after == before.reason || after == format!("{} : Not responding", before.reason),
        "{after:?} (was {:?})",
        before.reason
    );
    assert!(!after.contains(PRESTOP_REASON), "{after:?}");
    c.shutdown().await;
}

#[tokio::test]
async fn sync_cordon_reads_the_nodes_cordon_not_its_taints_and_a_taint_holds_new_pods_back() {
    let mut c = Cluster::builder()
        .nodes(2)
        .slinky()
        .slinky_operator_rules()
        .start()
        .await
        .unwrap();
    let api = c.api();
    let slurm = c.slurm();
    let pods = wait_for_slurmd_pods(&c).await.unwrap();
    let (w0, w1) = (pods[0].0.clone(), pods[1].0.clone());
    eventually(15, "both slurmd responding", || {
        let ok = [&w0, &w1]
            .iter()
            .all(|h| slurm.node(h).is_some_and(|n| n.state == ["IDLE"]));
        async move { ok.then_some(()) }
    })
    .await;
    let taint = json!({"spec": {"taints": [
        {"key": "mountguard.io/replacing", "value": "g1", "effect": "NoSchedule"}
    ]}});
    api.merge_patch(&resources::NODES, "", "node-0", &taint, None)
        .unwrap();
    // syncCordon runs for every pod on every pass: once it has drained the
    // worker of cordoned node-1, it has seen node-0's taint too.
    set_unschedulable(&api, "node-1", true);
    eventually(15, "worker 1 drained for its node's cordon", || {
        let n = slurm.node(&w1);
        async move {
            n.filter(|n| n.state.iter().any(|s| s == "DRAIN"))
                .map(|_| ())
        }
    })
    .await;
    let n0 = slurm.node(&w0).unwrap();
    assert_eq!(n0.state, ["IDLE"], "a taint is not a cordon: {n0:?}");
    let p0 = api
        .get(&resources::PODS, cluster::SLURM_NAMESPACE, &w0)
        .unwrap();
    assert!(
        p0["metadata"]["annotations"][ANNOTATION_POD_CORDON].is_null(),
        "{p0}"
    );
    // The untolerated NoSchedule taint keeps the replacement unbound.
    api.delete(
        &resources::PODS,
        cluster::SLURM_NAMESPACE,
        &w0,
        &DeleteOptions::default(),
    )
    .unwrap();
    let old = pods[0].1.clone();
    let pending = eventually(15, "a replacement of worker 0", || {
        let p = api
            .get(&resources::PODS, cluster::SLURM_NAMESPACE, &w0)
            .ok();
        let old = old.clone();
        async move { p.filter(|p| p["metadata"]["uid"].as_str() != Some(old.as_str())) }
    })
    .await;
    assert!(pending["spec"]["nodeName"].is_null(), "{pending}");
    api.merge_patch(
        &resources::NODES,
        "",
        "node-0",
        &json!({"spec": {"taints": null}}),
        None,
    )
    .unwrap();
    eventually(15, "the replacement bound to node-0 once untainted", || {
        let p = api
            .get(&resources::PODS, cluster::SLURM_NAMESPACE, &w0)
            .ok();
        async move { p.filter(|p| p["spec"]["nodeName"] == "node-0").map(|_| ()) }
    })
    .await;
    c.shutdown().await;
}

#[test]
fn the_scheduler_double_matches_tolerations_to_taints_as_kubernetes_does() {
    use mountguard_tests::nodeset::schedulable;
    let node = |taints: Value| json!({"spec": {"taints": taints}});
    let spec = |tolerations: Value| json!({"tolerations": tolerations});
    let ours = json!([{"key": "mountguard.io/replacing", "value": "g1", "effect": "NoSchedule"}]);
    assert!(schedulable(&node(json!(null)), &spec(json!(null))));
    assert!(!schedulable(&node(ours.clone()), &spec(json!(null))));
    // The worker pods' own toleration (worker_app.go) does not cover it.
    let worker =
        json!([{"key": "slinky.slurm.net/worker", "operator": "Equal", "effect": "NoExecute"}]);
    assert!(!schedulable(&node(ours.clone()), &spec(worker)));
    // Exists with no key tolerates everything; Equal compares the value.
    assert!(schedulable(
        &node(ours.clone()),
        &spec(json!([{"operator": "Exists"}]))
    ));
    assert!(schedulable(
        &node(ours.clone()),
        &spec(json!([{"key": "mountguard.io/replacing", "value": "g1"}]))
    ));
    assert!(!schedulable(
        &node(ours.clone()),
        &spec(json!([{"key": "mountguard.io/replacing", "value": "g2"}]))
    ));
    assert!(!schedulable(
        &node(ours),
        &spec(
            json!([{"key": "mountguard.io/replacing", "operator": "Exists", "effect": "NoExecute"}])
        )
    ));
    // PreferNoSchedule does not filter; a cordon does.
    let soft = json!([{"key": "x", "effect": "PreferNoSchedule"}]);
    assert!(schedulable(&node(soft), &spec(json!(null))));
    assert!(!schedulable(
        &json!({"spec": {"unschedulable": true}}),
        &spec(json!(null))
    ));
}
