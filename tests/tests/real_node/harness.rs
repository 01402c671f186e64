//! Helpers of the real-node tests: pods on the real kubelet.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::path::Path;
use std::time::Duration;

use mountguard_tests::mountguard::{clean_command, kubectl_plugin, poll};
use mountguard_tests::real::real_node::{NODE, RealNode};
use mountguard_tests::real::{create, raw};

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

/// A pod of the list `query` (a `labelSelector=` or `fieldSelector=`
/// of namespace `ns`) that is Running and not being deleted, other than
/// UID `not`; waits up to 240 s.
pub async fn running_pod(client: &kube::Client, ns: &str, query: &str, not: Option<&str>) -> Value {
    let path = format!("/api/v1/namespaces/{ns}/pods?{query}");
    let what = format!("a Running pod of {ns} ({query}) other than {not:?}");
    poll(&what, Duration::from_secs(240), || {
        let (client, path) = (client.clone(), path.clone());
        async move {
            let (_, list) = raw(&client, "GET", &path, None).await.ok()?;
            list["items"]
                .as_array()?
                .iter()
                .find(|p| {
                    p["status"]["phase"] == "Running"
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && not.is_none_or(|uid| p["metadata"]["uid"] != uid)
                })
                .cloned()
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The bytes the kubelet wrote for pod `uid` at `volume_file` (relative to
/// its `volumes/` directory, e.g. `kubernetes.io~secret/key/app.key`);
/// empty when there is no such file.
pub fn served(node: &RealNode, uid: &str, volume_file: &str) -> Vec<u8> {
    std::fs::read(
        node.kubelet
            .root()
            .join(format!("pods/{uid}/volumes/{volume_file}")),
    )
    .unwrap_or_default()
}

/// Deletes immutable Secret `ns/name` and creates `secret` in its place
/// (the same name): the kubelet keeps serving running pods the old bytes
/// (pkg/kubelet/util/manager/watch_based_manager.go: an immutable object's
/// item is no longer watched while a registered pod references it).
/// Returns the new object's UID.
pub async fn recreate_secret(client: &kube::Client, secret: &Value) -> String {
    let path = format!(
        "/api/v1/namespaces/{}/secrets/{}",
        secret["metadata"]["namespace"].as_str().expect("namespace"),
        secret["metadata"]["name"].as_str().expect("name")
    );
    let (code, body) = raw(client, "DELETE", &path, None).await.expect("delete");
    assert_eq!(code, 200, "DELETE {path}: {body}");
    let created = create(client, secret).await.expect("secret");
    created["metadata"]["uid"]
        .as_str()
        .expect("uid")
        .to_string()
}

/// Fails unless the controller's remediation writes
/// ([`remediation_writes`]) hold exactly one eviction, of pod `ns/pod`, and
/// no pod deletion. A dry-run eviction (`dryRun=All`, asked before a
/// workload's node is held) evicts nothing and is not counted.
pub fn assert_one_eviction(node: &RealNode, ns: &str, pod: &str) {
    let writes = remediation_writes(node);
    let evictions: Vec<&str> = writes
        .iter()
        .filter(|(_, _, uri)| !uri.contains("dryRun="))
        .map(|(_, v, uri)| (v, uri.split('?').next().unwrap_or("")))
        .filter(|(v, path)| *v == "create" && path.ends_with("/eviction"))
        .map(|(_, path)| path)
        .collect();
    assert_eq!(
        evictions,
        [format!("/api/v1/namespaces/{ns}/pods/{pod}/eviction").as_str()],
        "one eviction, of the stale pod: {writes:#?}"
    );
    assert!(
        !writes
            .iter()
            .any(|(_, v, uri)| v == "delete" && uri.contains("/pods/")),
        "evicted, never deleted: {writes:#?}"
    );
}
