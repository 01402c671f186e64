//! A container restarted in place (the same pod, its UID unchanged) on the
//! real kubelet and containerd: what mountguard reports Frozen before, the
//! restart makes Fresh, because the kubelet binds a subPath and resolves
//! env at each container start, not at pod start (kubelet v1.37.2:
//! pkg/kubelet/kuberuntime/kuberuntime_container.go `startContainer` ->
//! `generateContainerConfig` -> pkg/kubelet/kubelet_pods.go
//! `GenerateRunContainerOptions`, which calls `makeEnvironmentVariables` and
//! `makeMounts`; a subPath bind whose source now resolves to another file
//! is unmounted and bound again, pkg/volume/util/subpath/subpath_linux.go
//! `doBindSubPath`, `checkSubPathFileEqual`). Since 1.35 a container can
//! also be restarted in place by rule (`ContainerRestartRules`); an exit
//! under `restartPolicy: Always` takes the same path.

use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::{create, raw};
use mountguard_tests::real_node_or_skip;
use serde_json::{Value, json};

use crate::harness::{container_id, kubectl_mountguard, running_pod};
use crate::helm::{Helm, install};

/// The namespace of the test's pod.
const NS: &str = "app";

/// The verdicts of pod `app` (`kubectl mountguard status --all`), subject
/// -> state tag (`state` or `state/cause`).
async fn states(
    node: &mountguard_tests::real::real_node::RealNode,
    dir: &std::path::Path,
) -> Vec<(String, String)> {
    let (_, out, _) = kubectl_mountguard(
        node,
        dir,
        &["status", "--namespace", NS, "--all", "--output", "json"],
    )
    .await;
    let doc: Value = serde_json::from_str(&out).unwrap_or_default();
    let mut v: Vec<(String, String)> = doc["verdicts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["pod"] == "app" || v["pod"] == "app/app")
        .map(|v| {
            let tag = match v["cause"].as_str() {
                Some(c) if !c.is_empty() => format!("{}/{c}", v["state"].as_str().unwrap_or("")),
                _ => v["state"].as_str().unwrap_or("").to_string(),
            };
            (v["subject"].as_str().unwrap_or("").to_string(), tag)
        })
        .collect();
    v.sort();
    v
}

/// Waits up to `secs` until the verdicts of pod `app` are exactly `want`
/// (subject, state tag; [`states`]); panics with them and the logs.
async fn until(
    node: &mountguard_tests::real::real_node::RealNode,
    dir: &std::path::Path,
    what: &str,
    secs: u64,
    want: &[(&str, &str)],
) {
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    let reached = poll(what, Duration::from_secs(secs), || async {
        (states(node, dir).await == want).then_some(())
    })
    .await;
    if let Err(e) = reached {
        panic!("{e}: {:?}\n{}", states(node, dir).await, node.logs(30));
    }
}

/// The pod's one container: restart count and container ID.
fn container(pod: &Value) -> (i64, String) {
    let restarts = pod["status"]["containerStatuses"][0]["restartCount"]
        .as_i64()
        .unwrap_or(0);
    (restarts, container_id(pod, "c"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_a_container_restarted_in_place_rebinds_its_subpath_and_rereads_its_env() {
    let node = real_node_or_skip!(
        "real_node_a_container_restarted_in_place_rebinds_its_subpath_and_rereads_its_env"
    );
    let client = node.cluster.client().await.expect("client");
    let helm = Helm::new(&node);
    install(&node, &helm, &[]).await;
    for o in [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "conf", "namespace": NS},
               "data": {"app.conf": "level=info\n"}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "app", "namespace": NS},
               "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                        "restartPolicy": "Always",
                        "containers": [{"name": "c", "image": node.images.pause, "imagePullPolicy": "Never",
                                        "env": [{"name": "SETTING", "valueFrom": {"configMapKeyRef": {"name": "conf", "key": "app.conf"}}}],
                                        "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"},
                                                         {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"}]}],
                        "volumes": [{"name": "cfg", "configMap": {"name": "conf"}}]}}),
    ] {
        create(&client, &o)
            .await
            .unwrap_or_else(|e| panic!("creating the {}: {e}", o["kind"]));
    }
    let pod = running_pod(&client, NS, "fieldSelector=metadata.name%3Dapp", None).await;
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();
    let (restarts, first) = container(&pod);
    assert_eq!(restarts, 0);
    let dir = tempfile::tempdir().expect("dir");
    let fresh = [
        ("env c:SETTING", "Fresh"),
        ("subPath c:cfg/app.conf", "Fresh"),
        ("volume cfg", "Fresh"),
    ];
    until(&node, dir.path(), "every verdict of app Fresh", 120, &fresh).await;

    // The ConfigMap changes a second or more after the container started
    // (startedAt has second precision): the volume follows, the subPath
    // and the env keep what the container started with.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (code, body) = raw(
        &client,
        "PATCH",
        &format!("/api/v1/namespaces/{NS}/configmaps/conf"),
        Some(&json!({"data": {"app.conf": "level=debug\n"}})),
    )
    .await
    .expect("patch");
    assert_eq!(code, 200, "{body}");
    let want_frozen = [
        ("env c:SETTING", "Frozen/Env"),
        ("subPath c:cfg/app.conf", "Frozen/SubPath"),
        ("volume cfg", "Fresh"),
    ];
    until(
        &node,
        dir.path(),
        "subPath and env Frozen",
        240,
        &want_frozen,
    )
    .await;

    // The container is killed; the kubelet starts it again in the same pod.
    let out = node
        .runtime
        .ctr(&["tasks", "kill", "--signal", "SIGKILL", &first])
        .expect("ctr runs");
    assert!(
        out.status.success(),
        "ctr tasks kill: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let restarted = poll(
        "the container restarted",
        Duration::from_secs(120),
        || async {
            let p = running_pod(&client, NS, "fieldSelector=metadata.name%3Dapp", None).await;
            let (n, id) = container(&p);
            (n >= 1 && id != first).then_some(p)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", node.logs(30)));
    assert_eq!(
        restarted["metadata"]["uid"].as_str(),
        Some(uid.as_str()),
        "the same pod"
    );
    let what = "every verdict of app Fresh after the restart";
    until(&node, dir.path(), what, 120, &fresh).await;
    // What the kubelet bound for the new container: the new bytes.
    let bind = node
        .kubelet
        .root()
        .join("pods")
        .join(&uid)
        .join("volume-subpaths/cfg/c/1");
    assert_eq!(
        std::fs::read(&bind).expect("the subPath bind"),
        b"level=debug\n"
    );
}
