//! A partitioned kubelet: `KubeletNotSyncing` for that node only.

use std::time::Duration;

use mountguard_tests::apiserver::resources;
use mountguard_tests::mountguard::poll;
use mountguard_tests::scenario::state_tag;
use serde_json::json;

use crate::harness::{Options, System, wait_all_fresh, wait_verdicts};

const NS: &str = "e2e";
const MAPS: [&str; 3] = ["e2e-a", "e2e-b", "e2e-c"];

fn reader_pod(node: &str) -> serde_json::Value {
    json!({
        "metadata": {"name": format!("cfg-reader-{node}")},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "image": "busybox", "volumeMounts": MAPS.iter().map(|m| json!({"name": m, "mountPath": format!("/etc/{m}")})).collect::<Vec<_>>()}],
            "volumes": MAPS.iter().map(|m| json!({"name": m, "configMap": {"name": m}})).collect::<Vec<_>>(),
        },
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_partition_is_kubelet_not_syncing_for_that_node_only() {
    let sys = System::start(Options::default()).await;
    let api = sys.cluster.api();
    api.ensure_namespace(NS).unwrap();
    for m in MAPS {
        api.create(
            &resources::CONFIGMAPS,
            NS,
            json!({"metadata": {"name": m}, "data": {"v": "1"}}),
        )
        .unwrap();
    }
    let nodes = sys.cluster.node_names();
    for n in &nodes {
        api.create(&resources::PODS, NS, reader_pod(n)).unwrap();
    }
    poll("reader pods running", Duration::from_secs(15), || async {
        nodes
            .iter()
            .all(|n| {
                api.get(&resources::PODS, NS, &format!("cfg-reader-{n}"))
                    .is_ok_and(|p| p["status"]["phase"] == "Running")
            })
            .then_some(())
    })
    .await
    .unwrap();
    wait_all_fresh(&sys).await;

    sys.cluster.kubelet(1).partition(true);
    for m in MAPS {
        api.merge_patch(
            &resources::CONFIGMAPS,
            NS,
            m,
            &json!({"data": {"v": "2"}}),
            None,
        )
        .unwrap();
    }
    let doc = wait_verdicts(
        &sys,
        "node-1 KubeletNotSyncing, others Fresh",
        Duration::from_secs(25),
        &format!("namespace={NS}&all=1"),
        |doc| {
            let items = doc["verdicts"].as_array()?;
            let ok = nodes.iter().all(|n| {
                let pod = format!("cfg-reader-{n}");
                let want = if n == "node-1" {
                    "Stale/KubeletNotSyncing"
                } else {
                    "Fresh"
                };
                MAPS.iter().all(|m| {
                    items.iter().any(|v| {
                        v["pod"] == pod.as_str()
                            && v["subject"] == format!("volume {m}").as_str()
                            && state_tag(v) == want
                    })
                })
            });
            ok.then_some(doc)
        },
    )
    .await;
    // No other node has a KubeletNotSyncing verdict.
    let all = sys.verdicts("all=1").await;
    for v in all["verdicts"].as_array().unwrap() {
        if v["cause"] == "KubeletNotSyncing" {
            assert_eq!(v["node"], "node-1", "{v}");
        }
    }
    drop(doc);
    // Healing: the kubelet catches up and every verdict is Fresh again.
    sys.cluster.kubelet(1).partition(false);
    sys.cluster.kubelet(1).resync_now();
    wait_verdicts(
        &sys,
        "node-1 Fresh after the partition",
        Duration::from_secs(20),
        &format!("namespace={NS}"),
        |doc| doc["verdicts"].as_array()?.is_empty().then_some(()),
    )
    .await;
    sys.shutdown().await;
}
