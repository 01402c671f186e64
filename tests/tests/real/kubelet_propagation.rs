//! The mount propagation the agent's DaemonSet relies on, with the real
//! kubelet's tmpfs mounts. The kubelet makes its root directory a shared
//! mount (pkg/kubelet/kubelet.go `setupDataDirs`, `MakeRShared`), and the
//! chart mounts it into the agent with `mountPropagation: HostToContainer`
//! (an rslave mount, as the runtime sets it up): tmpfs mounts the kubelet
//! makes later under it reach the agent. Without propagation (`None`, a
//! private mount) the agent sees the empty directories under them.
//!
//! No container runtime runs the agent here (the fake CRI runtime starts
//! no process), so the two mount namespaces are made with `unshare
//! --mount --propagation slave|private` before the pod exists, and the
//! real agent scans from inside each with `nsenter --mount`.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::process::Command;
use std::time::Duration;

use mountguard_inventory::ReadErrorKind;
use mountguard_tests::mountguard::{ChildGuard, poll};
use mountguard_tests::real::kubelet::RealKubelet;
use mountguard_tests::real::{
    RealCluster, create, ensure_namespace, raw, wait_for_default_service_account,
};
use serde_json::json;

use crate::kubelet_support::{agent_scan, b64};

/// A process holding a new mount namespace whose mounts are copies of the
/// host's with `propagation` (`slave` or `private`).
fn namespace(cluster: &RealCluster, propagation: &str) -> ChildGuard {
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", propagation, "sleep", "600"]);
    ChildGuard::spawn(
        &format!("mount-ns-{propagation}"),
        cmd,
        &cluster
            .logs_dir()
            .join(format!("mount-ns-{propagation}.log")),
    )
    .unwrap()
}

/// Whether process `pid` runs in a mount namespace other than ours.
fn own_mount_namespace(pid: u32) -> bool {
    let ours = std::fs::read_link("/proc/self/ns/mnt").ok();
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    theirs.is_some() && theirs != ours
}

/// A Secret volume the real kubelet mounted (tmpfs) after two mount
/// namespaces were made: the agent scanning from the HostToContainer-like
/// (slave) namespace sees the same files and digest as on the host; from
/// the private one it sees an empty directory and says
/// `mountPropagation`, not an empty volume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_tmpfs_volumes_reach_the_agent_through_host_to_container_propagation_only() {
    let mut cluster = match RealCluster::builder().nodes(0).start().await {
        Ok(c) => c,
        Err(e) => panic!("the real control plane did not start: {e}"),
    };
    let mut kubelet = match RealKubelet::start(&cluster, "kubelet-0").await {
        Ok(k) => k,
        Err(e) => panic!("{e}"),
    };
    let mut slave = namespace(&cluster, "slave");
    let mut private = namespace(&cluster, "private");
    let pids = [slave.id().unwrap(), private.id().unwrap()];
    poll(
        "the two mount namespaces",
        Duration::from_secs(20),
        || async move { pids.iter().all(|p| own_mount_namespace(*p)).then_some(()) },
    )
    .await
    .unwrap();

    let client = cluster.client().await.unwrap();
    ensure_namespace(&client, "t").await.unwrap();
    wait_for_default_service_account(&client, "t")
        .await
        .unwrap();
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "t"},
                "data": {"key": b64(b"propagated bytes\n")}}),
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
    poll(
        "the pod to run on the real kubelet",
        Duration::from_secs(90),
        || {
            let client = client.clone();
            async move {
                let (_, p) = raw(&client, "GET", "/api/v1/namespaces/t/pods/p", None)
                    .await
                    .ok()?;
                (p["status"]["phase"] == "Running").then_some(())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", kubelet.logs(40)));

    let root = kubelet.root().to_path_buf();
    let volume = |inv: &mountguard_inventory::NodeInventory| {
        inv.pods
            .iter()
            .find(|p| p.uid == uid)
            .and_then(|p| p.volume("s"))
            .cloned()
            .unwrap_or_else(|| panic!("pod {uid}'s volume s is not in the scan: {inv:?}"))
    };
    let host = volume(&agent_scan(&root, "kubelet-0", None));
    assert!(host.errors.is_empty(), "{:?}", host.errors);
    assert_eq!(host.files.keys().collect::<Vec<_>>(), ["key"]);

    let in_slave = volume(&agent_scan(&root, "kubelet-0", Some(pids[0])));
    assert!(in_slave.errors.is_empty(), "{:?}", in_slave.errors);
    assert_eq!(
        in_slave.files, host.files,
        "HostToContainer: the same bytes"
    );
    assert_eq!(in_slave.digest, host.digest);

    let in_private = volume(&agent_scan(&root, "kubelet-0", Some(pids[1])));
    assert!(in_private.files.is_empty(), "{in_private:?}");
    assert!(
        in_private
            .errors
            .iter()
            .any(|e| e.kind == ReadErrorKind::MountPropagation),
        "no propagation: the agent says mountPropagation: {:?}",
        in_private.errors
    );

    slave.kill();
    private.kill();
    kubelet.stop();
    cluster.shutdown().await;
}
