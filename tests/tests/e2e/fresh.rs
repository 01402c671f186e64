//! A fresh cluster; a mutable ConfigMap edit.

use std::time::Duration;

use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{HOOKS_CONFIGMAP, SLURM_NAMESPACE};
use mountguard_tests::mountguard::recorded_events;
use mountguard_tests::scenario::{every_pod_has, state_tag, wait_for_slurmd_pods};
use serde_json::json;

use crate::harness::{Options, System, wait_all_fresh, wait_verdicts};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_cluster_is_all_fresh_or_skipped_without_events() {
    let sys = System::start(Options::default()).await;
    let doc = wait_all_fresh(&sys).await;
    let items = doc["verdicts"].as_array().unwrap();
    // Every slurmd pod's three volumes and its subPath were judged.
    for node in sys.cluster.node_names() {
        let on_node: Vec<_> = items
            .iter()
            .filter(|v| v["node"] == node.as_str())
            .collect();
        assert!(on_node.len() >= 4, "{node}: {on_node:?}");
    }
    // A few more heartbeats: still nothing to report.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let doc = sys.verdicts("").await;
    assert_eq!(doc["verdicts"], json!([]), "{doc}");
    assert!(recorded_events(&sys.cluster.api()).is_empty());
    let metrics = mountguard_tests::demo::scrape(&sys.metrics_base())
        .await
        .unwrap();
    assert!(
        !metrics.iter().any(|s| s.name == "mountguard_mount_state"),
        "no non-fresh mount, no mount_state sample"
    );
    for node in sys.cluster.node_names() {
        assert!(
            metrics
                .iter()
                .any(|s| s.name == "mountguard_node_agent_reporting"
                    && s.labels.get("node") == Some(&node)
                    && s.value == 1.0),
            "{node} not reporting"
        );
    }
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutable_configmap_edit_is_propagating_then_fresh_without_alert() {
    let sys = System::start(Options {
        grace: Duration::from_secs(30),
        ..Options::default()
    })
    .await;
    wait_all_fresh(&sys).await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    // Slow resync on every node so the window between the API change and
    // the kubelet's rewrite is visible.
    for i in 0..pods.len() {
        sys.cluster
            .kubelet(i)
            .set_resync(Duration::from_secs(4), 0.0);
    }
    sys.cluster
        .api()
        .merge_patch(
            &resources::CONFIGMAPS,
            SLURM_NAMESPACE,
            HOOKS_CONFIGMAP,
            &json!({"data": {"99-mountguard.sh": "#!/bin/sh\necho changed\n"}}),
            None,
        )
        .unwrap();
    wait_verdicts(
        &sys,
        "hooks Propagating",
        Duration::from_secs(10),
        "namespace=slurm",
        |doc| {
            doc["verdicts"]
                .as_array()?
                .iter()
                .any(|v| v["subject"] == "volume hooks" && state_tag(v) == "Propagating")
                .then_some(())
        },
    )
    .await;
    for i in 0..pods.len() {
        sys.cluster.kubelet(i).resync_now();
    }
    wait_verdicts(
        &sys,
        "hooks Fresh again",
        Duration::from_secs(15),
        "namespace=slurm&all=1",
        |doc| {
            every_pod_has(&doc, &pods, |v| {
                v["subject"] == "volume hooks" && v["state"] == "Fresh"
            })
            .then_some(())
        },
    )
    .await;
    assert!(
        recorded_events(&sys.cluster.api()).is_empty(),
        "a propagating edit raises no Event"
    );
    sys.shutdown().await;
}
