//! The runtime itself: a pod is a process on the host under containerd's
//! shim, with the kubelet's Secret volume (a tmpfs under the kubelet's
//! root) bind mounted into it, and an address on the rig's bridge.

use std::time::Duration;

use mountguard_tests::real::{create, ensure_namespace, wait_for_default_service_account};
use mountguard_tests::real_node_or_skip;
use serde_json::json;

use crate::harness::{container_id, host_mounts_under, wait_pod_ready};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_pod_runs_under_containerd_with_its_secret_volume() {
    let node = real_node_or_skip!("real_node_pod_runs_under_containerd_with_its_secret_volume");
    let client = node.cluster.client().await.expect("client");
    ensure_namespace(&client, "demo").await.expect("namespace");
    wait_for_default_service_account(&client, "demo")
        .await
        .expect("default ServiceAccount");
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "s", "namespace": "demo"},
                "stringData": {"key": "v1"}}),
    )
    .await
    .expect("secret");
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "demo"},
        "spec": {
            "nodeName": "node-0",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "c",
                "image": node.images.pause,
                "imagePullPolicy": "Never",
                "volumeMounts": [{"name": "s", "mountPath": "/s", "readOnly": true}]
            }],
            "volumes": [{"name": "s", "secret": {"secretName": "s"}}]
        }}),
    )
    .await
    .expect("pod");
    let pod = wait_pod_ready(&node, "demo", "p", Duration::from_secs(120)).await;
    let uid = pod["metadata"]["uid"].as_str().expect("uid");

    // The container is a process of this host: /pause, under the shim.
    let id = container_id(&pod, "c");
    let pid = node.runtime.task_pid(&id).expect("task pid");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
    assert!(
        cmdline.starts_with(b"/pause"),
        "container process {pid}: {:?}",
        String::from_utf8_lossy(&cmdline)
    );
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let ppid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("ppid");
    let parent = std::fs::read(format!("/proc/{ppid}/cmdline")).unwrap_or_default();
    assert!(
        String::from_utf8_lossy(&parent).contains("containerd-shim-runc-v2"),
        "parent of {pid} is {:?}",
        String::from_utf8_lossy(&parent)
    );

    // The Secret volume: a tmpfs the kubelet mounted under its root, with
    // the AtomicWriter layout, seen inside the container's mount namespace.
    let vol = node
        .kubelet
        .root()
        .join(format!("pods/{uid}/volumes/kubernetes.io~secret/s"));
    let mounts = host_mounts_under(&vol.to_string_lossy());
    assert!(
        mounts.iter().any(|l| l.contains(" - tmpfs ")),
        "no tmpfs at {}: {mounts:?}",
        vol.display()
    );
    assert_eq!(
        std::fs::read_to_string(vol.join("key")).expect("volume file"),
        "v1"
    );
    assert!(
        vol.join("..data").is_symlink(),
        "no ..data in {}",
        vol.display()
    );
    let inside =
        std::fs::read_to_string(format!("/proc/{pid}/root/s/key")).expect("file in the container");
    assert_eq!(inside, "v1");

    // The pod's address is on the rig's bridge.
    let (_, subnet, _) = node.runtime.network();
    let prefix = subnet.trim_end_matches("0/24");
    let ip = pod["status"]["podIP"].as_str().unwrap_or("");
    assert!(ip.starts_with(prefix), "pod IP {ip:?} not in {subnet}");
}
