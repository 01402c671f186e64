//! The chart's alert rules evaluated by a real Prometheus (Debian's
//! package) scraping the controller installed by `helm install`.

use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::prometheus::{Prometheus, Target};
use mountguard_tests::real::raw;
use mountguard_tests::real::real_node::pinned_rotation;
use mountguard_tests::real_node_or_skip;

use crate::harness::wait_secret;
use crate::helm::{Helm, NAMESPACE, chart_rules, controller_honor_labels, install};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_alert_kubelet_cache_pinned_fires_in_a_real_prometheus() {
    let node =
        real_node_or_skip!("real_node_alert_kubelet_cache_pinned_fires_in_a_real_prometheus");
    let helm = Helm::new(&node);
    let (_, controller) = install(&node, &helm, &["--set", "controller.grace=10s"]).await;
    let rules = chart_rules(&helm, &["metrics.prometheusRule.for.kubeletCachePinned=0m"]);
    let ip = controller["status"]["podIP"]
        .as_str()
        .expect("controller IP");
    let pod_name = controller["metadata"]["name"].as_str().unwrap_or("");
    let dir = tempfile::tempdir().expect("dir");
    let prom = Prometheus::start(
        dir.path(),
        &node.cluster.logs_dir().join("prometheus.log"),
        &[Target {
            job: "mountguard-controller".into(),
            addr: format!("{ip}:8080"),
            // The labels prometheus-operator's relabelling gives a
            // ServiceMonitor's target; the series' own namespace and pod
            // (the checked pod's) win where honorLabels says so.
            labels: vec![
                ("namespace".into(), NAMESPACE.into()),
                ("pod".into(), pod_name.into()),
            ],
            honor_labels: controller_honor_labels(&helm),
        }],
        &rules,
    )
    .await
    .expect("prometheus");
    // Every rule of the chart loads and evaluates.
    let health = poll(
        "the chart's rules evaluated",
        Duration::from_secs(60),
        || async {
            let h = prom.rule_health().await.ok()?;
            (!h.is_empty() && h.iter().all(|(_, s)| s == "ok")).then_some(h)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", prom.log_tail(20)));
    assert!(
        health
            .iter()
            .any(|(n, _)| n == "MountguardKubeletCachePinned"),
        "{health:?}"
    );
    prom.wait_scraped("mountguard-controller", Duration::from_secs(60))
        .await
        .expect("scraped");

    // The immutable key, a pod pinning it in the kubelet's cache, the key
    // recreated with new bytes, a new worker mounting it.
    let client = node.cluster.client().await.expect("client");
    pinned_rotation(&client, &node.images.pause)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", node.logs(30)));

    let firing = poll(
        "MountguardKubeletCachePinned firing",
        Duration::from_secs(180),
        || async {
            let alerts = prom.alerts().await.ok()?;
            alerts.into_iter().find(|(n, s, l)| {
                n == "MountguardKubeletCachePinned" && s == "firing" && l["pod"] == "worker"
            })
        },
    )
    .await;
    match firing {
        Ok((_, _, labels)) => {
            assert_eq!(labels["namespace"], "demo");
            assert_eq!(labels["source_name"], "slurm-key");
        }
        Err(e) => {
            let states = prom
                .query("mountguard_mount_state > 0")
                .await
                .unwrap_or_default();
            panic!(
                "{e}\nstates: {states:#?}\nalerts: {:?}\n{}",
                prom.alerts().await,
                node.logs(30)
            );
        }
    }

    // The rollout gate on the recreated key, as an operator runs it
    // (`kubectl mountguard`, docs/install.md): not fresh on this node,
    // exit 1 naming the pod that pins the old bytes.
    let (_, key) = raw(
        &client,
        "GET",
        "/api/v1/namespaces/demo/secrets/slurm-key",
        None,
    )
    .await
    .expect("secret");
    let uid = key["metadata"]["uid"].as_str().expect("uid");
    let bin = tempfile::tempdir().expect("bin");
    let (code, out, err) = wait_secret(&node, bin.path(), "secret/demo/slurm-key", uid).await;
    assert_eq!(code, Some(1), "wait on the pinned key:\n{out}\n{err}");
    assert!(
        out.contains("worker") && out.contains("pinner"),
        "wait names the stale pod and its pin:\n{out}"
    );
}
