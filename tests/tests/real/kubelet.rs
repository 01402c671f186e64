//! The real kubelet with upstream's fake CRI runtime against the real
//! control plane.

use std::time::Duration;

use base64::Engine as _;
use mountguard_tests::mountguard::poll;
use mountguard_tests::real::kubelet::RealKubelet;
use mountguard_tests::real::{RealCluster, create, ensure_namespace, raw};
use serde_json::json;

/// The real kubelet registers its Node, runs a pod on the fake runtime
/// (Running, with a container start time) and writes the pod's Secret
/// volume itself: the bytes under its root are the Secret's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_runs_a_pod_and_writes_its_secret_volume() {
    let mut cluster = match RealCluster::builder().nodes(0).start().await {
        Ok(c) => c,
        Err(e) => panic!("the real control plane did not start: {e}"),
    };
    let mut kubelet = match RealKubelet::start(&cluster, "kubelet-0").await {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    };
    let client = cluster.client().await.unwrap();
    ensure_namespace(&client, "t").await.unwrap();
    let data = b"real kubelet bytes\n";
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "t"},
                "data": {"key": base64::engine::general_purpose::STANDARD.encode(data)}}),
    )
    .await
    .unwrap();
    poll(
        "the default ServiceAccount of t",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let (code, _) = raw(
                    &client,
                    "GET",
                    "/api/v1/namespaces/t/serviceaccounts/default",
                    None,
                )
                .await
                .ok()?;
                (code == 200).then_some(())
            }
        },
    )
    .await
    .unwrap();
    let pod = create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "t"},
                "spec": {"nodeName": "kubelet-0", "automountServiceAccountToken": false,
                         "containers": [{"name": "c", "image": "example.invalid/c:1",
                                         "volumeMounts": [{"name": "s", "mountPath": "/s"}]}],
                         "volumes": [{"name": "s", "secret": {"secretName": "s"}}]}}),
    )
    .await
    .unwrap();
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let running = poll(
        "the pod to run on the real kubelet",
        Duration::from_secs(90),
        || {
            let client = client.clone();
            async move {
                let (_, p) = raw(&client, "GET", "/api/v1/namespaces/t/pods/p", None)
                    .await
                    .ok()?;
                (p["status"]["phase"] == "Running").then_some(p)
            }
        },
    )
    .await;
    let running = match running {
        Ok(p) => p,
        Err(e) => panic!("{e}\n{}", kubelet.logs(60)),
    };
    assert!(
        running["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].is_string(),
        "{running}"
    );
    let file = kubelet
        .root()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~secret/s/key");
    assert_eq!(std::fs::read(&file).unwrap(), data);
    kubelet.stop();
    cluster.shutdown().await;
}
