//! The node doubles' watch-based Secret manager against the real API
//! server (`mountguard_tests::real::node::ObjectCache`): the immutable pin
//! as the kubelet's `objectCache` holds it, and its release.

use std::time::Duration;

use base64::Engine as _;
use mountguard_tests::real::node::Kind;
use mountguard_tests::real::{RealCluster, create, ensure_namespace, raw};
use serde_json::{Value, json};

const NS: &str = "pin";
const SECRET: &str = "key";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn pod(name: &str, node: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeName": node,
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "example.invalid/c:1"}],
            "volumes": [{"name": "k", "secret": {"secretName": SECRET}}],
        },
    })
}

/// Creates `name` on `node` and waits until the node double wrote its
/// volume; returns its UID.
async fn run_pod(cluster: &RealCluster, client: &kube::Client, name: &str, node: usize) -> String {
    let p = create(client, &pod(name, &format!("node-{node}")))
        .await
        .unwrap();
    let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
    let file = served(cluster, node, &uid);
    mountguard_tests::mountguard::poll(
        &format!("{name} running with its volume"),
        Duration::from_secs(30),
        || {
            let file = file.clone();
            let client = client.clone();
            let path = format!("/api/v1/namespaces/{NS}/pods/{name}");
            async move {
                let (_, p) = raw(&client, "GET", &path, None).await.ok()?;
                (p["status"]["phase"] == "Running" && file.exists()).then_some(())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs(10)));
    uid
}

fn served(cluster: &RealCluster, node: usize, uid: &str) -> std::path::PathBuf {
    mountguard_inventory::layout::pod_dir(&cluster.kubelet_root(node), uid)
        .join("volumes/kubernetes.io~secret/k/slurm.key")
}

fn read(cluster: &RealCluster, node: usize, uid: &str) -> String {
    std::fs::read_to_string(served(cluster, node, uid)).unwrap_or_default()
}

/// Deletes pod `name` (graceful) and waits until it is gone.
async fn delete_pod(client: &kube::Client, name: &str) {
    let path = format!("/api/v1/namespaces/{NS}/pods/{name}");
    let (code, body) = raw(client, "DELETE", &path, None).await.unwrap();
    assert!(code == 200 || code == 202, "{code} {body}");
    mountguard_tests::mountguard::poll(&format!("{name} gone"), Duration::from_secs(30), || {
        let client = client.clone();
        let path = path.clone();
        async move {
            let (code, _) = raw(&client, "GET", &path, None).await.ok()?;
            (code == 404).then_some(())
        }
    })
    .await
    .unwrap();
}

async fn put_secret(client: &kube::Client, value: &str) {
    create(
        client,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": SECRET, "namespace": NS},
                "immutable": true, "data": {"slurm.key": b64(value)}}),
    )
    .await
    .unwrap();
}

/// An immutable Secret deleted and recreated: on node-0, where another
/// registered pod still references it, a new pod is served the OLD bytes
/// (the item's reflector stopped at the first Get that saw it immutable);
/// on node-1, whose only referencing pod was deleted first, the new pod
/// gets the new bytes; once node-0's last referencing pod is gone, its
/// next pod gets them too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_double_serves_the_old_immutable_secret_while_a_pod_pins_it() {
    let mut cluster = match RealCluster::builder().nodes(2).start().await {
        Ok(c) => c,
        Err(e) => panic!("the real control plane did not start: {e}"),
    };
    let client = cluster.client().await.unwrap();
    ensure_namespace(&client, NS).await.unwrap();
    // ServiceAccount admission needs the namespace's default ServiceAccount
    // (the controller-manager's serviceaccount controller makes it).
    mountguard_tests::mountguard::poll(
        "the default ServiceAccount",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let path = format!("/api/v1/namespaces/{NS}/serviceaccounts/default");
                let (code, _) = raw(&client, "GET", &path, None).await.ok()?;
                (code == 200).then_some(())
            }
        },
    )
    .await
    .unwrap();
    put_secret(&client, "old").await;
    let holder = run_pod(&cluster, &client, "holder", 0).await;
    let a0 = run_pod(&cluster, &client, "a0", 0).await;
    let a1 = run_pod(&cluster, &client, "a1", 1).await;
    assert_eq!(read(&cluster, 0, &a0), "old");
    assert_eq!(read(&cluster, 1, &a1), "old");
    let item = cluster
        .node(0)
        .cache_item(Kind::Secret, NS, SECRET)
        .unwrap();
    assert!(item.immutable, "{item:?}");
    assert_eq!(item.refs.len(), 2, "{item:?}");

    let (code, body) = raw(
        &client,
        "DELETE",
        &format!("/api/v1/namespaces/{NS}/secrets/{SECRET}"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    put_secret(&client, "new").await;
    delete_pod(&client, "a0").await;
    delete_pod(&client, "a1").await;
    let b0 = run_pod(&cluster, &client, "b0", 0).await;
    let b1 = run_pod(&cluster, &client, "b1", 1).await;
    assert_eq!(read(&cluster, 0, &b0), "old", "pinned by the holder pod");
    assert_eq!(
        read(&cluster, 1, &b1),
        "new",
        "no other reference on node-1"
    );
    assert_eq!(read(&cluster, 0, &holder), "old");
    let refs = cluster
        .node(0)
        .cache_item(Kind::Secret, NS, SECRET)
        .unwrap()
        .refs;
    assert!(refs.contains(&holder) && refs.contains(&b0), "{refs:?}");

    // The last references on node-0 go: the item goes with them.
    delete_pod(&client, "holder").await;
    delete_pod(&client, "b0").await;
    // (The node double unregisters a pod right after its confirming
    // DELETE returns, so just after the API stopped serving it.)
    let dropped = mountguard_tests::mountguard::poll(
        "the item dropped with its last reference",
        Duration::from_secs(10),
        || {
            let gone = cluster
                .node(0)
                .cache_item(Kind::Secret, NS, SECRET)
                .is_none();
            async move { gone.then_some(()) }
        },
    )
    .await;
    assert!(
        dropped.is_ok(),
        "holder {holder}, b0 {b0}: {:?}",
        cluster.node(0).cache_item(Kind::Secret, NS, SECRET)
    );
    let c0 = run_pod(&cluster, &client, "c0", 0).await;
    assert_eq!(read(&cluster, 0, &c0), "new");
    cluster.shutdown().await;
}
