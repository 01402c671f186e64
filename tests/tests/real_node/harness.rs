//! Helpers of the real-node tests: pods on the real kubelet.

use std::path::Path;
use std::time::Duration;

use mountguard_tests::mountguard::{clean_command, kubectl_plugin, poll};
use mountguard_tests::real::raw;
use mountguard_tests::real::real_node::{NODE, RealNode};

use crate::helm::{CONTROLLER, NAMESPACE};
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
    let link = kubectl_plugin(dir).expect("kubectl-mountguard");
    let mut cmd = clean_command(&link);
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

/// The controller's writes that remediation makes (an eviction, a pod
/// deletion, a write to a node, a Deployment or a ReplicaSet), from the
/// API server's audit log: `(auditID, verb, requestURI)`. Events, its
/// Lease, its TokenReviews and the patch of its own pod's label are not
/// remediation.
pub fn remediation_writes(node: &RealNode) -> Vec<(String, String, String)> {
    let user = format!("system:serviceaccount:{NAMESPACE}:{CONTROLLER}");
    node.cluster
        .audit_events()
        .iter()
        .filter(|e| e["user"]["username"] == user.as_str() && e["stage"] == "ResponseComplete")
        .filter(|e| {
            let r = e["objectRef"]["resource"].as_str().unwrap_or("");
            let sub = e["objectRef"]["subresource"].as_str().unwrap_or("");
            let verb = e["verb"].as_str().unwrap_or("");
            matches!(verb, "create" | "update" | "patch" | "delete")
                && matches!(
                    (r, sub, verb),
                    ("pods", "eviction", _)
                        | ("pods", "", "delete")
                        | ("nodes", _, _)
                        | ("deployments", _, _)
                        | ("replicasets", _, _)
                )
        })
        .map(|e| {
            (
                e["auditID"].as_str().unwrap_or("").to_string(),
                e["verb"].as_str().unwrap_or("").to_string(),
                e["requestURI"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Fails unless node [`NODE`] is left without a taint of mountguard's
/// (its hold).
pub async fn assert_no_hold_taint(client: &kube::Client) {
    let (_, n) = raw(client, "GET", &format!("/api/v1/nodes/{NODE}"), None)
        .await
        .expect("node");
    assert!(
        !n["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| t["key"].as_str().is_some_and(|k| k.contains("mountguard"))),
        "no hold taint left on the node: {}",
        n["spec"]["taints"]
    );
}
