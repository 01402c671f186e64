//! The real kubelet with upstream's fake CRI runtime against the real
//! control plane.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::time::Duration;

use base64::Engine as _;
use mountguard_tests::mountguard::poll;
use mountguard_tests::real::kubelet::RealKubelet;
use mountguard_tests::real::{
    RealCluster, create, ensure_namespace, raw, wait_for_default_service_account,
};
use serde_json::json;

/// The real kubelet registers its Node, runs a pod on the fake runtime
/// (Running, with a container start time) and writes the pod's Secret
/// volume itself: the bytes under its root are the Secret's. The API
/// server reaches the kubelet's API through the node proxy.
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
    wait_for_default_service_account(&client, "t")
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
    // The API server reaches the kubelet's own API (what `kubectl logs`,
    // `exec` and `port-forward` go through): the node proxy answers with
    // the kubelet's healthz, authenticated by the API server's client
    // certificate.
    let (code, body) = raw(
        &client,
        "GET",
        "/api/v1/nodes/kubelet-0/proxy/healthz",
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        (code, body.as_str()),
        (200, Some("ok")),
        "the API server reached the kubelet: {body}\n{}",
        kubelet.logs(20)
    );
    kubelet.stop();
    cluster.shutdown().await;
}

async fn wait_running(
    client: &kube::Client,
    kubelet: &RealKubelet,
    ns: &str,
    name: &str,
) -> String {
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
    let r = poll(
        &format!("pod {name} to run on the real kubelet"),
        Duration::from_secs(90),
        || {
            let client = client.clone();
            let path = path.clone();
            async move {
                let (_, p) = raw(&client, "GET", &path, None).await.ok()?;
                if p["status"]["phase"] != "Running" {
                    return None;
                }
                p["metadata"]["uid"].as_str().map(String::from)
            }
        },
    )
    .await;
    match r {
        Ok(uid) => uid,
        Err(e) => panic!("{e}\n{}", kubelet.logs(40)),
    }
}

fn secret_pod(ns: &str, name: &str, node: &str, secret: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
           "spec": {"nodeName": node, "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "example.invalid/c:1",
                                    "volumeMounts": [{"name": "auth", "mountPath": "/auth"}]}],
                    "volumes": [{"name": "auth", "secret": {"secretName": secret}}]}})
}

fn immutable_secret(ns: &str, key: &[u8]) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "auth", "namespace": ns},
           "immutable": true,
           "data": {"slurm.key": base64::engine::general_purpose::STANDARD.encode(key)}})
}

/// The seed scenario on the real kubelet: an immutable Secret deleted and
/// recreated with a new key while another pod on the node keeps
/// referencing it. A new pod on that node is served the OLD key by the
/// real kubelet (its watch-based Secret manager keeps the immutable object
/// while a pod references it); once no pod on the node references it, a
/// new pod gets the new key.
/// Run by `kubelet_skew` on every kubelet minor; `ns`: a namespace of its
/// own (created here).
pub async fn serves_the_old_immutable_secret_while_a_pod_pins_it(
    client: &kube::Client,
    kubelet: &RealKubelet,
    ns: &str,
) {
    let node = kubelet.name();
    ensure_namespace(client, ns).await.unwrap();
    wait_for_default_service_account(client, ns).await.unwrap();
    let (old, new) = (b"old slurm.key\n".to_vec(), b"new slurm.key\n".to_vec());
    create(client, &immutable_secret(ns, &old)).await.unwrap();
    let served = |uid: &str| {
        std::fs::read(
            kubelet
                .root()
                .join("pods")
                .join(uid)
                .join("volumes/kubernetes.io~secret/auth/slurm.key"),
        )
        .unwrap_or_default()
    };
    create(client, &secret_pod(ns, "pin", node, "auth"))
        .await
        .unwrap();
    let pin = wait_running(client, kubelet, ns, "pin").await;
    assert_eq!(served(&pin), old);

    // The operator's rotation: delete, recreate (still immutable).
    let (code, body) = raw(
        client,
        "DELETE",
        &format!("/api/v1/namespaces/{ns}/secrets/auth"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    create(client, &immutable_secret(ns, &new)).await.unwrap();

    create(client, &secret_pod(ns, "after", node, "auth"))
        .await
        .unwrap();
    let after = wait_running(client, kubelet, ns, "after").await;
    assert_eq!(
        String::from_utf8_lossy(&served(&after)),
        String::from_utf8_lossy(&old),
        "the real kubelet served the new key to a pod started while another pod pins the old one"
    );

    // No pod references the Secret on the node any more: a new pod gets
    // the new key.
    for name in ["pin", "after"] {
        let (code, body) = raw(
            client,
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            None,
        )
        .await
        .unwrap();
        assert!(code == 200 || code == 202, "{code} {body}");
    }
    let pods = format!("/api/v1/namespaces/{ns}/pods");
    poll("the pods to be gone", Duration::from_secs(90), || {
        let client = client.clone();
        let pods = pods.clone();
        async move {
            let (_, list) = raw(&client, "GET", &pods, None).await.ok()?;
            list["items"].as_array()?.is_empty().then_some(())
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", kubelet.logs(30)));
    // The kubelet removed them too: its housekeeping deletes the
    // directories of pods it no longer has (after unregistering them from
    // its Secret manager).
    let pods_dir = kubelet.root().join("pods");
    poll(
        "the kubelet to clean up the deleted pods",
        Duration::from_secs(90),
        || {
            let gone = [&pin, &after].iter().all(|u| !pods_dir.join(u).exists());
            async move { gone.then_some(()) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", kubelet.logs(30)));
    // Nothing observable says when the kubelet has unregistered the pods
    // from its Secret manager (pkg/kubelet/kubelet.go, `SyncTerminatedPod`:
    // `secretManager.UnregisterPod`), which may come after their directories
    // are gone: a new pod started
    // before that still shares the old cache entry. So: a new pod, and if it
    // is served the old key, delete it and try again; within the deadline a
    // new pod must be served the new key.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let mut attempt = 0;
    loop {
        let name = format!("fresh-{attempt}");
        create(client, &secret_pod(ns, &name, node, "auth"))
            .await
            .unwrap();
        let uid = wait_running(client, kubelet, ns, &name).await;
        let got = served(&uid);
        if got == new {
            break;
        }
        assert_eq!(
            got, old,
            "a new pod is served the old or the new key, nothing else"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "no new pod was served the new key in 120 s ({attempt} tries)\n{}",
            kubelet.logs(30)
        );
        let (code, body) = raw(
            client,
            "DELETE",
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            None,
        )
        .await
        .unwrap();
        assert!(code == 200 || code == 202, "{code} {body}");
        let pods_dir = kubelet.root().join("pods");
        poll(
            "the retried pod to be cleaned up",
            Duration::from_secs(90),
            || {
                let gone = !pods_dir.join(&uid).exists();
                async move { gone.then_some(()) }
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", kubelet.logs(30)));
        attempt += 1;
    }
    // The kubelet's container log cleanup removed nothing outside its own
    // empty working directory (it removes every file of the directory it
    // runs in; the test runs in the crate's).
    assert!(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("Cargo.toml")
            .is_file()
    );
}
