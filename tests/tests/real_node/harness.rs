//! Helpers of the real-node tests: pods on the real kubelet.

use std::path::Path;
use std::time::Duration;

use mountguard_tests::mountguard::{binary, poll};
use mountguard_tests::real::raw;
use mountguard_tests::real::real_node::RealNode;
use serde_json::Value;

/// Waits until pod `ns/name` is Running with every container ready;
/// returns it. Fails with the pod's status and the node's logs.
pub async fn wait_pod_ready(node: &RealNode, ns: &str, name: &str, timeout: Duration) -> Value {
    let client = node.cluster.client().await.expect("admin client");
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
    let r = poll(
        &format!("pod {ns}/{name} Running and Ready"),
        timeout,
        || {
            let (client, path) = (client.clone(), path.clone());
            async move {
                let (code, pod) = raw(&client, "GET", &path, None).await.ok()?;
                let ready = pod["status"]["conditions"]
                    .as_array()?
                    .iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True");
                (code == 200 && pod["status"]["phase"] == "Running" && ready).then_some(pod)
            }
        },
    )
    .await;
    match r {
        Ok(p) => p,
        Err(e) => {
            let pod = raw(&client, "GET", &path, None).await.map(|p| p.1);
            panic!(
                "{e}\npod: {:#}\n{}",
                pod.unwrap_or_default()["status"],
                node.logs(30)
            );
        }
    }
}

/// The runtime's id of container `container` of `pod` (its status'
/// `containerID`, `containerd://<id>`).
pub fn container_id(pod: &Value, container: &str) -> String {
    pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == container)
        .and_then(|c| c["containerID"].as_str())
        .and_then(|id| id.strip_prefix("containerd://"))
        .unwrap_or_else(|| panic!("no containerd id for {container} in {:#}", pod["status"]))
        .to_string()
}

/// The host's mount table (/proc/self/mountinfo) lines for mount points
/// under `dir`.
pub fn host_mounts_under(dir: &str) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.split(' ').nth(4).is_some_and(|m| m.starts_with(dir)))
        .map(String::from)
        .collect()
}

/// `kubectl mountguard <args>` (the controller binary under its plugin
/// name, docs/install.md) with the rig's admin kubeconfig (a client
/// certificate: the plugin mints a token of the chart's status reader):
/// `(exit code, stdout, stderr)`.
pub async fn kubectl_mountguard(
    node: &RealNode,
    dir: &Path,
    args: &[&str],
) -> (Option<i32>, String, String) {
    let link = dir.join("kubectl-mountguard");
    if !link.exists() {
        std::os::unix::fs::symlink(binary("mountguard-controller").expect("binary"), &link)
            .expect("link");
    }
    let mut cmd = tokio::process::Command::new(&link);
    for (k, _) in std::env::vars() {
        if k.starts_with("MOUNTGUARD_") || k == "KUBECONFIG" {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .arg("--kubeconfig")
        .arg(node.cluster.kubeconfig_path())
        .args(args)
        .output()
        .await
        .expect("plugin runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl mountguard wait <target> --uid <uid>` for 15 s, asking every
/// second ([`kubectl_mountguard`]): `(exit code, stdout, stderr)`.
pub async fn wait_secret(
    node: &RealNode,
    dir: &Path,
    target: &str,
    uid: &str,
) -> (Option<i32>, String, String) {
    kubectl_mountguard(
        node,
        dir,
        &[
            "wait",
            target,
            "--uid",
            uid,
            "--timeout",
            "15s",
            "--interval",
            "1s",
        ],
    )
    .await
}
