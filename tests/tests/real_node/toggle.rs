//! The remediation toggle flipped with `helm upgrade` on the real node, as
//! an operator flips it: with remediation off a stale pod of an opted-in
//! Deployment is reported, alerted by a real Prometheus and gated by
//! `kubectl mountguard wait`, never touched; `helm upgrade --set
//! remediation.mode=on` and the controller's new pod repairs it through
//! the real Eviction API (the real ReplicaSet controller and scheduler
//! make the replacement, the real kubelet on containerd writes its
//! volume), the alert resolves and the gate opens; `helm upgrade --set
//! remediation.mode=off` and a new stale pod is only reported again.

use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::prometheus::{Prometheus, Target};
use mountguard_tests::real::real_node::RealNode;
use mountguard_tests::real::{create, ensure_namespace, wait_for_default_service_account};
use mountguard_tests::real_node_or_skip;
use serde_json::{Value, json};

use crate::harness::{
    assert_no_hold_taint, assert_one_eviction, kubectl_mountguard, recreate_secret,
    remediation_writes, running_pod, served, wait_secret,
};
use crate::helm::{
    Helm, NAMESPACE, chart_rules, controller_honor_labels, controller_with_remediation, install,
    upgrade,
};

/// The namespace of the workload.
const NS: &str = "shop";
/// The immutable Secret the workload mounts (volume `key`, file `app.key`).
const SECRET: &str = "app-key";
/// The Deployment (label `app: workers`), opted in to remediation.
const DEPLOYMENT: &str = "workers";

fn secret(value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "immutable": true,
        "metadata": {"name": SECRET, "namespace": NS},
        "stringData": {"app.key": value}})
}

/// The Deployment's one pod that runs and is not being deleted.
async fn running_worker(client: &kube::Client, not: Option<&str>) -> Value {
    running_pod(
        client,
        NS,
        &format!("labelSelector=app%3D{DEPLOYMENT}"),
        not,
    )
    .await
}

/// The bytes of `app.key` the kubelet wrote for pod `uid`.
fn served_key(node: &RealNode, uid: &str) -> Vec<u8> {
    served(node, uid, "kubernetes.io~secret/key/app.key")
}

/// The scrape target of controller pod `pod`, with the labels
/// prometheus-operator's relabelling gives it.
fn target(helm: &Helm, pod: &Value) -> Target {
    Target {
        job: "mountguard-controller".into(),
        addr: format!("{}:8080", pod["status"]["podIP"].as_str().expect("IP")),
        labels: vec![
            ("namespace".into(), NAMESPACE.into()),
            (
                "pod".into(),
                pod["metadata"]["name"].as_str().unwrap_or("").into(),
            ),
        ],
        honor_labels: controller_honor_labels(helm),
    }
}

/// Waits until Prometheus has `MountguardStaleMount` firing for pod
/// `pod`; fails with the series and alerts it has and the node's logs.
async fn stale_alert_firing(node: &RealNode, prom: &Prometheus, pod: &str) {
    let alert = poll(
        &format!("MountguardStaleMount firing for {pod}"),
        Duration::from_secs(180),
        || async {
            let alerts = prom.alerts().await.ok()?;
            alerts
                .iter()
                .any(|(n, s, l)| n == "MountguardStaleMount" && s == "firing" && l["pod"] == pod)
                .then_some(())
        },
    )
    .await;
    if let Err(e) = alert {
        panic!(
            "{e}\nstates: {:#?}\nalerts: {:?}\n{}",
            prom.query("mountguard_mount_state > 0").await,
            prom.alerts().await,
            node.logs(30)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_helm_upgrade_toggle_on_repairs_the_stale_pod_and_off_writes_nothing() {
    let node = real_node_or_skip!(
        "real_node_helm_upgrade_toggle_on_repairs_the_stale_pod_and_off_writes_nothing"
    );
    let helm = Helm::new(&node);
    // What may be remediated is configured; the toggle stays off.
    let (_, first) = install(
        &node,
        &helm,
        &[
            "--set",
            "controller.grace=10s",
            "--set",
            "remediation.delay=5s",
            "--set",
            "remediation.workloads.kinds={deployment}",
        ],
    )
    .await;
    let client = node.cluster.client().await.expect("client");
    let rules = chart_rules(&helm, &["metrics.prometheusRule.for.staleMount=0m"]);
    let pdir = tempfile::tempdir().expect("dir");
    let prom = Prometheus::start(
        pdir.path(),
        &node.cluster.logs_dir().join("prometheus.log"),
        &[target(&helm, &first)],
        &rules,
    )
    .await
    .expect("prometheus");
    prom.wait_scraped("mountguard-controller", Duration::from_secs(60))
        .await
        .expect("scraped");

    // The opted-in Deployment: one pod mounting the immutable Secret; a
    // grace period above 0 (docs/remediation.md, "Workloads").
    ensure_namespace(&client, NS).await.expect("namespace");
    wait_for_default_service_account(&client, NS)
        .await
        .expect("service account");
    create(&client, &secret("key-1")).await.expect("secret");
    create(
        &client,
        &json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": DEPLOYMENT, "namespace": NS,
                "annotations": {"mountguard.io/remediate": "evict"}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": DEPLOYMENT}},
                "template": {"metadata": {"labels": {"app": DEPLOYMENT}},
                    "spec": {"automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 5,
                        "containers": [{"name": "c", "image": node.images.pause,
                            "imagePullPolicy": "Never",
                            "volumeMounts": [{"name": "key", "mountPath": "/etc/app",
                                "readOnly": true}]}],
                        "volumes": [{"name": "key", "secret": {"secretName": SECRET}}]}}}}),
    )
    .await
    .expect("deployment");
    let old = running_worker(&client, None).await;
    let old_uid = old["metadata"]["uid"].as_str().expect("uid").to_string();
    let old_name = old["metadata"]["name"].as_str().expect("name").to_string();
    poll("the first key served", Duration::from_secs(60), || async {
        (served_key(&node, &old_uid) == b"key-1").then_some(())
    })
    .await
    .expect("served");

    // Off: the rotation leaves the pod stale; it is alerted and gated,
    // and nothing is written.
    let new_secret_uid = recreate_secret(&client, &secret("key-2")).await;
    stale_alert_firing(&node, &prom, &old_name).await;
    let bin = tempfile::tempdir().expect("bin");
    let target_secret = format!("secret/{NS}/{SECRET}");
    let (code, out, err) = wait_secret(&node, bin.path(), &target_secret, &new_secret_uid).await;
    assert_eq!(code, Some(1), "wait with the pod stale:\n{out}\n{err}");
    assert!(out.contains(&old_name), "wait names the stale pod:\n{out}");
    assert_eq!(served_key(&node, &old_uid), b"key-1", "the kubelet's cache");
    assert_eq!(
        remediation_writes(&node),
        [],
        "remediation off writes nothing"
    );

    // On: the new controller pod repairs it.
    upgrade(&helm, &["remediation.mode=on"]);
    let on = controller_with_remediation(&node, "on").await;
    prom.retarget(&target(&helm, &on)).expect("retarget");
    let new = running_worker(&client, Some(&old_uid)).await;
    let new_uid = new["metadata"]["uid"].as_str().expect("uid").to_string();
    let new_name = new["metadata"]["name"].as_str().expect("name").to_string();
    poll(
        "the current key served to the replacement",
        Duration::from_secs(60),
        || async { (served_key(&node, &new_uid) == b"key-2").then_some(()) },
    )
    .await
    .expect("served");
    let (code, out, err) = kubectl_mountguard(
        &node,
        bin.path(),
        &[
            "wait",
            &format!("deploy/{NS}/{DEPLOYMENT}"),
            "--timeout",
            "120s",
            "--interval",
            "1s",
        ],
    )
    .await;
    assert_eq!(code, Some(0), "wait after the repair:\n{out}\n{err}");
    // The new controller is scraped (its mounts counted Fresh under its
    // pod's target label), it has no series of a mount of the workload's
    // namespace that is not Fresh (the gauge lists only those), and no
    // stale-mount alert is left firing.
    let on_name = on["metadata"]["name"].as_str().expect("name").to_string();
    let resolved = poll(
        "the new controller scraped, the workload Fresh, the alert resolved",
        Duration::from_secs(120),
        || async {
            let scraped = prom
                .query(&format!(
                    "mountguard_mounts{{state=\"Fresh\",pod=\"{on_name}\"}} > 0"
                ))
                .await
                .ok()?;
            let not_fresh = prom
                .query(&format!("mountguard_mount_state{{namespace=\"{NS}\"}} > 0"))
                .await
                .ok()?;
            let alerts = prom.alerts().await.ok()?;
            (!scraped.is_empty()
                && not_fresh.is_empty()
                && !alerts
                    .iter()
                    .any(|(n, s, _)| n == "MountguardStaleMount" && s == "firing"))
            .then_some(())
        },
    )
    .await;
    if let Err(e) = resolved {
        panic!(
            "{e}\nmounts: {:#?}\nstates: {:#?}\nalerts: {:?}",
            prom.query("mountguard_mounts").await,
            prom.query("mountguard_mount_state > 0").await,
            prom.alerts().await
        );
    }
    assert_one_eviction(&node, NS, &old_name);

    // Off again: a new rotation is reported and alerted, nothing written.
    upgrade(&helm, &["remediation.mode=off"]);
    let off = controller_with_remediation(&node, "off").await;
    prom.retarget(&target(&helm, &off)).expect("retarget");
    let before: Vec<String> = remediation_writes(&node)
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    recreate_secret(&client, &secret("key-3")).await;
    stale_alert_firing(&node, &prom, &new_name).await;
    // Well past the delay and the grace: still the same pod, no write.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let after: Vec<(String, String, String)> = remediation_writes(&node)
        .into_iter()
        .filter(|(id, _, _)| !before.contains(id))
        .collect();
    assert_eq!(after, [], "remediation off again writes nothing");
    let still = running_worker(&client, None).await;
    assert_eq!(still["metadata"]["uid"], new_uid.as_str(), "not replaced");
    assert_eq!(
        served_key(&node, &new_uid),
        b"key-2",
        "still the cached key"
    );
    assert_no_hold_taint(&client).await;
}
