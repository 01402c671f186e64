//! The real `mountguard-controller` and agents on the real control plane,
//! with the identity and RBAC the chart renders.

use std::time::Duration;

use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::inventory_path;
use mountguard_tests::cluster::{HOOKS_CONFIGMAP, NODESET, SLURM_NAMESPACE};
use mountguard_tests::kubelet::projection::service_account_token;
use mountguard_tests::mountguard::http_request;
use mountguard_tests::real::{raw, token_request};
use mountguard_tests::scenario::find_verdict;
use serde_json::json;

use crate::harness::{
    AGENT, Audited, CONTROLLER_POD, HEARTBEAT, NAMESPACE, RealSystem, events, wait, wait_all_fresh,
    wait_event,
};

const HOOKS: &str = "volume hooks";

/// Every request the controller made that the real authorizer refused.
fn refused(sys: &RealSystem) -> Vec<Audited> {
    sys.controller_requests()
        .into_iter()
        .filter(Audited::is_refused)
        .collect()
}

/// The chart's ServiceAccount, ClusterRoles and bindings are enough: the
/// controller, running with a token of the chart's ServiceAccount, lists
/// and watches what it needs, authenticates the agents' real tokens with
/// TokenReview, reaches ready and judges every mount Fresh, and the real
/// authorizer refused none of its requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_controller_with_chart_rbac_judges_fresh_without_permission_errors() {
    let sys = RealSystem::start(2).await;
    let doc = wait_all_fresh(&sys).await;
    for i in 0..2 {
        let v = find_verdict(&doc, &format!("{NODESET}-{i}"), "volume slurm-etc");
        assert_eq!(v.map(|v| v["state"].clone()), Some(json!("Fresh")), "{doc}");
    }
    // Several heartbeats later, still nothing refused.
    tokio::time::sleep(HEARTBEAT * 3).await;
    let requests = sys.controller_requests();
    assert!(
        requests
            .iter()
            .any(|r| r.verb == "watch" && r.resource == "pods"),
        "the audit log shows the controller's pod watch: {requests:?}"
    );
    assert!(
        requests
            .iter()
            .any(|r| r.verb == "create" && r.resource == "tokenreviews" && r.code == 201),
        "the audit log shows the controller's TokenReviews: {requests:?}"
    );
    assert_eq!(
        refused(&sys),
        Vec::new(),
        "refused requests\n{}",
        sys.logs()
    );
    let log = sys.controller_log();
    assert!(
        !log.contains("forbidden") && !log.contains("Forbidden"),
        "controller log mentions a refusal:\n{log}"
    );
    sys.shutdown().await;
}

/// The report API's authentication is the real TokenReview: node-1's real
/// token is refused for node-0, a forged token, a token for another
/// audience and a token of the agent ServiceAccount bound to no pod are
/// refused, and the agents' own reports go on being accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_token_review_rejects_wrong_node_and_forged_tokens() {
    let sys = RealSystem::start(2).await;
    wait_all_fresh(&sys).await;
    let (a, b) = (&sys.agents[0], &sys.agents[1]);
    let pod = json!({"metadata": {"name": a.pod, "namespace": NAMESPACE, "uid": a.uid, "creationTimestamp": "2026-01-01T00:00:00Z"},
                     "spec": {"serviceAccountName": AGENT}});
    let forged = service_account_token(&pod, &a.node, "mountguard", 3600);
    let unbound = token_request(&sys.client, NAMESPACE, AGENT, &["mountguard"], 3600, None)
        .await
        .unwrap();
    let other_audience = token_request(
        &sys.client,
        NAMESPACE,
        AGENT,
        &[],
        3600,
        Some((&a.pod, &a.uid)),
    )
    .await
    .unwrap();
    let mut inv = NodeInventory::new(&a.node, "forged", jiff::Timestamp::now());
    inv.generation = 1 << 62;
    let body = serde_json::to_vec(&inv).unwrap();
    let cases = [
        ("node-1's token for node-0", b.token(), 403, "forbidden"),
        ("a forged token", forged, 401, "unauthenticated"),
        (
            "a token for the API audience",
            other_audience,
            401,
            "unauthenticated",
        ),
        ("a token bound to no pod", unbound, 403, "forbidden"),
    ];
    for (what, token, code, error) in cases {
        let auth = format!("Bearer {token}");
        let (got, text) = http_request(
            "PUT",
            &format!("{}{}", sys.report_base(), inventory_path(&a.node)),
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ],
            body.clone(),
        )
        .await
        .unwrap();
        assert_eq!(got, code, "{what}: {text}");
        let err: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(err["error"], error, "{what}: {text}");
    }
    // The real agents still report (no generation stolen): verdicts stay
    // Fresh over further heartbeats.
    tokio::time::sleep(HEARTBEAT * 3).await;
    wait_all_fresh(&sys).await;
    sys.shutdown().await;
}

/// Events the controller records are read back from the real API: a stalled
/// node keeps the old hooks script while the ConfigMap changes (StaleMount
/// on the pod), and MountRecovered once the node writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_events_are_read_back_from_the_api() {
    let sys = RealSystem::start(2).await;
    wait_all_fresh(&sys).await;
    let pod0 = format!("{NODESET}-0");
    sys.cluster.node(0).pause(true);
    let (code, body) = raw(
        &sys.client,
        "PATCH",
        &format!("/api/v1/namespaces/{SLURM_NAMESPACE}/configmaps/{HOOKS_CONFIGMAP}"),
        Some(&json!({"data": {"99-mountguard.sh": "#!/bin/sh\necho changed\n"}})),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let stale = wait_event(
        &sys,
        "a StaleMount Event on node-0's pod",
        Duration::from_secs(60),
        |r, k, n, _| r == "StaleMount" && k == "Pod" && n == pod0,
    )
    .await;
    assert!(
        stale.contains("hooks"),
        "the Event names the volume: {stale:?}"
    );
    sys.cluster.node(0).pause(false);
    wait_event(
        &sys,
        "a MountRecovered Event on node-0's pod",
        Duration::from_secs(60),
        |r, k, n, _| r == "MountRecovered" && k == "Pod" && n == pod0,
    )
    .await;
    // node-1 kept writing: no alarm about its pod.
    let pod1 = format!("{NODESET}-1");
    let evs = events(&sys.client, SLURM_NAMESPACE).await;
    assert!(
        !evs.iter().any(|e| e.0 == "StaleMount" && e.2 == pod1),
        "{evs:?}"
    );
    sys.shutdown().await;
}

/// A controller restart while everything is Fresh writes nothing to the
/// real API (no Event, no status, no pod touched) but the leader label on
/// its own pod: counted in the API server's audit log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_controller_restart_with_all_fresh_makes_zero_writes() {
    let mut sys = RealSystem::start(2).await;
    wait_all_fresh(&sys).await;
    tokio::time::sleep(HEARTBEAT * 2).await;
    let before = sys.controller_requests().len();
    sys.start_controller().await;
    wait_all_fresh(&sys).await;
    tokio::time::sleep(HEARTBEAT * 3).await;
    let after = sys.controller_requests();
    assert!(
        after.len() > before,
        "the new process made requests: {after:?}"
    );
    let own_label = |r: &Audited| {
        r.verb == "patch"
            && r.resource == "pods"
            && r.subresource.is_empty()
            && r.namespace == NAMESPACE
            && r.name == CONTROLLER_POD
    };
    let writes: Vec<&Audited> = after[before..]
        .iter()
        .filter(|r| r.is_write() && !own_label(r))
        .collect();
    assert_eq!(writes, Vec::<&Audited>::new(), "\n{}", sys.logs());
    // The leader label patch is allowed by the chart's Role.
    assert!(
        after[before..]
            .iter()
            .filter(|r| own_label(r))
            .all(|r| r.code == 200),
        "{after:?}"
    );
    assert_eq!(refused(&sys), Vec::new());
    sys.shutdown().await;
}

/// The controller's watches recover after kube-apiserver restarts (etcd
/// kept): a ConfigMap change made after the restart reaches its expected
/// content and the mounts are judged Fresh against it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_watch_recovers_after_apiserver_restart() {
    let mut sys = RealSystem::start(2).await;
    let doc = wait_all_fresh(&sys).await;
    let pod0 = format!("{NODESET}-0");
    let old = find_verdict(&doc, &pod0, HOOKS).unwrap()["expected"].clone();
    if let Err(e) = sys.cluster.restart_apiserver().await {
        panic!("{e}\n{}", sys.logs());
    }
    let client = sys.cluster.client().await.unwrap();
    let (code, body) = raw(
        &client,
        "PATCH",
        &format!("/api/v1/namespaces/{SLURM_NAMESPACE}/configmaps/{HOOKS_CONFIGMAP}"),
        Some(&json!({"data": {"99-mountguard.sh": "#!/bin/sh\necho after restart\n"}})),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let base = sys.metrics_base();
    wait(
        &sys,
        "new expected hooks content, Fresh on both nodes",
        Duration::from_secs(90),
        || {
            let base = base.clone();
            let old = old.clone();
            async move {
                let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                    .await
                    .ok()?;
                (0..2)
                    .all(|i| {
                        find_verdict(&doc, &format!("{NODESET}-{i}"), HOOKS).is_some_and(|v| {
                            v["state"] == "Fresh"
                                && v["expected"] != old
                                && v["observed"] == v["expected"]
                        })
                    })
                    .then_some(())
            }
        },
    )
    .await;
    sys.shutdown().await;
}
