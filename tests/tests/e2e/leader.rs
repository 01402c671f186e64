//! Two controller replicas with `--leader-election`: one Lease holder acts
//! and labels its pod; the other answers reports `503 notLeader` and takes
//! over when the leader dies.

use std::time::Duration;

use mountguard_inventory::report::inventory_path;
use mountguard_tests::apiserver::resources;
use mountguard_tests::mountguard::{free_addr, http_get, http_request};
use serde_json::{Value, json};

use crate::harness::{Options, System, wait, wait_all_fresh};

const NS: &str = "mountguard";
const LEASE: &str = "mountguard-e2e";

fn election(pod: &str) -> Vec<String> {
    [
        "--leader-election",
        "--lease-name",
        LEASE,
        "--pod-name",
        pod,
        "--pod-namespace",
        NS,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

async fn acting(metrics: &str) -> Option<bool> {
    let doc: Value =
        serde_json::from_str(&http_get(&format!("{metrics}/v1/verdicts")).await.ok()?).ok()?;
    doc["acting"].as_bool()
}

async fn leader_gauge(metrics: &str) -> Option<String> {
    let text = http_get(&format!("{metrics}/metrics")).await.ok()?;
    text.lines()
        .find(|l| l.starts_with("mountguard_leader "))
        .map(|l| l["mountguard_leader ".len()..].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_elect_one_leader_that_labels_its_pod_and_fails_over() {
    let mut sys = System::start(Options::default()).await;
    if let Some(mut c) = sys.controller.take() {
        c.kill();
    }
    let api = sys.cluster.api();
    for name in ["ctl-a", "ctl-b"] {
        api.create(
            &resources::PODS,
            NS,
            json!({"metadata": {"name": name, "labels": {"app.kubernetes.io/name": "mountguard-controller"}},
                   "spec": {"containers": [{"name": "controller", "image": "mountguard:e2e"}]}}),
        )
        .unwrap();
    }
    // Replica A first, on the address the agents report to.
    let a_metrics = sys.metrics_base();
    let mut a = sys
        .spawn_controller(
            "controller-a",
            sys.report_addr,
            sys.metrics_addr,
            &election("ctl-a"),
        )
        .await;
    wait(&sys, "replica A acting", Duration::from_secs(30), || {
        let m = a_metrics.clone();
        async move { (acting(&m).await == Some(true)).then_some(()) }
    })
    .await;
    let (b_report, b_metrics_addr) = (free_addr().unwrap(), free_addr().unwrap());
    let b_metrics = format!("http://{b_metrics_addr}");
    let mut b = sys
        .spawn_controller("controller-b", b_report, b_metrics_addr, &election("ctl-b"))
        .await;
    wait_all_fresh(&sys).await;

    // B follows: no verdicts, reports refused with notLeader, gauge 0.
    assert_eq!(acting(&b_metrics).await, Some(false));
    let token = sys.ids[0].token().unwrap();
    // Node 0's real token; the body does not matter to a follower.
    let put_to_b = || async {
        let auth = format!("Bearer {token}");
        http_request(
            "PUT",
            &format!("http://{b_report}{}", inventory_path("node-0")),
            &[
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ],
            b"{}".to_vec(),
        )
        .await
        .unwrap()
    };
    let (code, body) = put_to_b().await;
    assert_eq!(code, 503, "{body}");
    let err: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(err["error"], "notLeader", "{body}");
    assert_eq!(leader_gauge(&a_metrics).await.as_deref(), Some("1"));
    assert_eq!(leader_gauge(&b_metrics).await.as_deref(), Some("0"));

    // The Lease names A, and only A's pod carries the leader label (the
    // report Service selects it).
    let holder = |api: &mountguard_tests::apiserver::ApiHandle| {
        api.get(&resources::LEASES, NS, LEASE)
            .ok()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(String::from))
    };
    let label = |api: &mountguard_tests::apiserver::ApiHandle, pod: &str| {
        api.get(&resources::PODS, NS, pod).unwrap()["metadata"]["labels"]["mountguard.io/leader"]
            .clone()
    };
    assert_eq!(holder(&api).as_deref(), Some("ctl-a"));
    wait(
        &sys,
        "A's pod labelled leader",
        Duration::from_secs(10),
        || {
            let ok = label(&api, "ctl-a") == "true" && label(&api, "ctl-b").is_null();
            async move { ok.then_some(()) }
        },
    )
    .await;

    // A dies hard (no release): B takes over once the Lease expires.
    a.kill();
    wait(&sys, "replica B acting", Duration::from_secs(45), || {
        let m = b_metrics.clone();
        async move { (acting(&m).await == Some(true)).then_some(()) }
    })
    .await;
    assert_eq!(holder(&api).as_deref(), Some("ctl-b"));
    assert_eq!(leader_gauge(&b_metrics).await.as_deref(), Some("1"));
    wait(
        &sys,
        "B's pod labelled leader",
        Duration::from_secs(10),
        || {
            let ok = label(&api, "ctl-b") == "true";
            async move { ok.then_some(()) }
        },
    )
    .await;
    // B now accepts reports (it answers with a decision, not notLeader).
    let (code, body) = put_to_b().await;
    assert_ne!(code, 503, "{body}");
    b.kill();
    sys.shutdown().await;
}
