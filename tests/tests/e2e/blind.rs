//! One tenant cannot blind a node: a volume over the count limits is
//! Unverifiable on its own, every other mount on the node stays judged.

use std::time::Duration;

use mountguard_tests::apiserver::resources;
use mountguard_tests::mountguard::poll;
use serde_json::{Value, json};

use crate::harness::{Options, System, wait, wait_all_fresh};

const NS: &str = "tenant";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_over_the_file_limit_blinds_only_its_own_volume() {
    let sys = System::start(Options {
        extra_controller_args: vec!["--inventory-max-age".into(), "6s".into()],
        ..Options::default()
    })
    .await;
    wait_all_fresh(&sys).await;
    let api = sys.cluster.api();
    api.ensure_namespace(NS).unwrap();
    // 10,001 keys: one over the controller's 10,000 files per volume.
    let data: serde_json::Map<String, Value> = (0..10_001)
        .map(|i| (format!("k{i}"), Value::from("v")))
        .collect();
    api.create(
        &resources::CONFIGMAPS,
        NS,
        json!({"metadata": {"name": "huge"}, "data": data}),
    )
    .unwrap();
    api.create(
        &resources::PODS,
        NS,
        json!({
            "metadata": {"name": "greedy"},
            "spec": {
                "nodeName": "node-0",
                "containers": [{"name": "c", "image": "busybox",
                    "volumeMounts": [{"name": "huge", "mountPath": "/etc/huge"}]}],
                "volumes": [{"name": "huge", "configMap": {"name": "huge"}}],
            },
        }),
    )
    .unwrap();
    poll(
        "the greedy pod running",
        Duration::from_secs(30),
        || async {
            api.get(&resources::PODS, NS, "greedy")
                .is_ok_and(|p| p["status"]["phase"] == "Running")
                .then_some(())
        },
    )
    .await
    .unwrap();
    let base = sys.metrics_base();
    let judged = || {
        let base = base.clone();
        async move {
            let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                .await
                .ok()?;
            let items = doc["verdicts"].as_array()?.clone();
            let greedy = items
                .iter()
                .find(|v| v["pod"] == "greedy" && v["subject"] == "volume huge")?
                .clone();
            let others_on_node: Vec<Value> = items
                .iter()
                .filter(|v| v["node"] == "node-0" && v["pod"] != "greedy")
                .cloned()
                .collect();
            Some((greedy, others_on_node))
        }
    };
    wait(
        &sys,
        "the greedy volume Unverifiable because of a read error",
        Duration::from_secs(60),
        || {
            let judged = judged();
            async move {
                let (greedy, _) = judged.await?;
                (greedy["state"] == "Unverifiable" && greedy["cause"] == "ReadError").then_some(())
            }
        },
    )
    .await;
    // Longer than the inventory max age: node-0's agent keeps reporting
    // (its inventories are accepted), so the other mounts stay Fresh.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let (greedy, others) = judged().await.unwrap();
    assert_eq!(greedy["state"], "Unverifiable", "{greedy}");
    assert!(!others.is_empty());
    for v in &others {
        assert!(
            v["state"] == "Fresh" || v["state"] == "Skipped",
            "{v}\n{}",
            sys.logs()
        );
    }
    sys.shutdown().await;
}
