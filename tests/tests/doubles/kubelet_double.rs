//! The simulated kubelet: AtomicWriter layouts, projection, subPath and env
//! freezing, resync, and the watch-based cache's immutable pin.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use mountguard_tests::apiserver::{ApiHandle, ApiServerDouble, DeleteOptions, resources};
use mountguard_tests::kubelet::{KubeletConfig, KubeletDouble, KubeletHandle, Strategy};
use serde_json::{Value, json};

use crate::eventually;

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

struct Rig {
    api: ApiServerDouble,
    kubelet: KubeletDouble,
    _root: tempfile::TempDir,
}

impl Rig {
    async fn start(strategy: Strategy) -> Self {
        let api = ApiServerDouble::start().await.unwrap();
        let root = tempfile::tempdir().unwrap();
        let mut config = KubeletConfig::new("node-1", root.path());
        config.strategy = strategy;
        config.resync_period = Duration::from_millis(200);
        config.jitter = 0.5;
        let kubelet = KubeletDouble::start(api.handle(), config).await.unwrap();
        api.handle().ensure_namespace("slurm").unwrap();
        Self {
            api,
            kubelet,
            _root: root,
        }
    }

    fn api(&self) -> ApiHandle {
        self.api.handle()
    }

    fn kubelet(&self) -> KubeletHandle {
        self.kubelet.handle()
    }

    async fn stop(mut self) {
        self.kubelet.shutdown().await;
        self.api.shutdown().await;
    }
}

fn secret(name: &str, key: &str, value: &str, immutable: bool) -> Value {
    json!({"metadata": {"name": name}, "immutable": immutable, "data": {key: b64(value)}})
}

/// A pod like a Slinky slurmd pod: slurm.key through projected volume
/// `slurm-etc` (0600), an sshd ConfigMap through subPath, a hooks
/// ConfigMap as a normal volume, env from the hooks ConfigMap.
fn worker_pod(name: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "slurmd"}},
        "spec": {
            "nodeName": "node-1",
            "containers": [{
                "name": "slurmd", "image": "slurmd:25.11",
                "env": [{"name": "HOOK_MODE", "valueFrom": {"configMapKeyRef": {"name": "hooks", "key": "mode"}}}],
                "volumeMounts": [
                    {"name": "slurm-etc", "mountPath": "/etc/slurm"},
                    {"name": "sshd", "mountPath": "/etc/ssh/sshd_config", "subPath": "sshd_config"},
                    {"name": "hooks", "mountPath": "/etc/hooks"},
                ],
            }],
            "volumes": [
                {"name": "slurm-etc", "projected": {"defaultMode": 0o600, "sources": [
                    {"secret": {"name": "slurm-auth-slurm", "items": [{"key": "slurm.key", "path": "slurm.key"}]}},
                    {"downwardAPI": {"items": [{"path": "podname", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                ]}},
                {"name": "sshd", "configMap": {"name": "sshd", "defaultMode": 0o644}},
                {"name": "hooks", "configMap": {"name": "hooks"}},
            ],
        },
    })
}

fn setup_objects(api: &ApiHandle, key: &str) {
    api.create(
        &resources::SECRETS,
        "slurm",
        secret("slurm-auth-slurm", "slurm.key", key, true),
    )
    .unwrap();
    api.create(
        &resources::CONFIGMAPS,
        "slurm",
        json!({"metadata": {"name": "sshd"}, "data": {"sshd_config": "Port 22\n"}}),
    )
    .unwrap();
    api.create(
        &resources::CONFIGMAPS,
        "slurm",
        json!({"metadata": {"name": "hooks"}, "data": {"mode": "v1", "prolog.sh": "echo v1\n"}}),
    )
    .unwrap();
}

async fn running_uid(api: &ApiHandle, name: &str, not: Option<&str>) -> String {
    eventually(10, &format!("pod {name} running"), || {
        let p = api.get(&resources::PODS, "slurm", name).ok();
        let not = not.map(String::from);
        async move {
            let p = p?;
            let uid = p["metadata"]["uid"].as_str()?.to_string();
            (p["status"]["phase"] == "Running" && Some(&uid) != not.as_ref()).then_some(uid)
        }
    })
    .await
}

async fn delete_and_wait_gone(api: &ApiHandle, name: &str) {
    api.delete(&resources::PODS, "slurm", name, &DeleteOptions::default())
        .unwrap();
    eventually(10, &format!("pod {name} gone"), || {
        let gone = api.get(&resources::PODS, "slurm", name).is_err();
        async move { gone.then_some(()) }
    })
    .await;
}

/// Creates worker pod `name` and waits until it runs; its UID.
async fn start_worker(api: &ApiHandle, name: &str) -> String {
    api.create(&resources::PODS, "slurm", worker_pod(name))
        .unwrap();
    running_uid(api, name, None).await
}

/// Deletes worker pod `name` (UID `old`), waits until it is gone, creates it
/// again and waits until the new pod runs; its UID.
async fn replace_worker(api: &ApiHandle, name: &str, old: &str) -> String {
    delete_and_wait_gone(api, name).await;
    api.create(&resources::PODS, "slurm", worker_pod(name))
        .unwrap();
    running_uid(api, name, Some(old)).await
}

fn vol(k: &KubeletHandle, uid: &str, plugin: &str, name: &str) -> PathBuf {
    k.volume_dir(uid, plugin, name)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn slurm_key(k: &KubeletHandle, uid: &str) -> String {
    read(&vol(k, uid, "kubernetes.io~projected", "slurm-etc").join("slurm.key"))
}

#[tokio::test]
async fn kubelet_double_writes_atomicwriter_layout_with_projection_rules_and_modes() {
    use std::os::unix::fs::PermissionsExt;
    let rig = Rig::start(Strategy::Watch).await;
    let api = rig.api();
    setup_objects(&api, "key-1");
    let uid = start_worker(&api, "w-0").await;
    let k = rig.kubelet();
    let dir = vol(&k, &uid, "kubernetes.io~projected", "slurm-etc");
    // AtomicWriter layout: ..data -> ..<timestamp>, top-level links.
    let data = std::fs::read_link(dir.join("..data")).unwrap();
    assert!(data.to_str().unwrap().starts_with("..20"), "{data:?}");
    assert_eq!(
        std::fs::read_link(dir.join("slurm.key")).unwrap(),
        Path::new("..data/slurm.key")
    );
    assert_eq!(read(&dir.join("slurm.key")), "key-1");
    assert_eq!(read(&dir.join("podname")), "w-0");
    let mode = std::fs::metadata(dir.join("..data/slurm.key"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let hooks = vol(&k, &uid, "kubernetes.io~configmap", "hooks");
    assert_eq!(read(&hooks.join("prolog.sh")), "echo v1\n");
    assert_eq!(read(&hooks.join("mode")), "v1");
    // Pod status as the real kubelet reports it.
    let pod = api.get(&resources::PODS, "slurm", "w-0").unwrap();
    assert_eq!(
        pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"],
        json!(k.started(&uid)["slurmd"].started_at)
    );
    assert!(
        pod["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    );
    // A missing non-optional key keeps a pod from starting.
    let mut bad = worker_pod("w-bad");
    bad["spec"]["volumes"][0]["projected"]["sources"][0]["secret"]["items"][0]["key"] =
        json!("nope");
    let bad = api.create(&resources::PODS, "slurm", bad).unwrap();
    let bad_uid = bad["metadata"]["uid"].as_str().unwrap().to_string();
    let err = eventually(10, "sync error", || {
        let e = k.pod_error(&bad_uid);
        async move { e }
    })
    .await;
    assert!(err.contains("references non-existent key: nope"), "{err}");
    assert_eq!(
        api.get(&resources::PODS, "slurm", "w-bad").unwrap()["status"]["phase"],
        "Pending"
    );
    rig.stop().await;
}

#[tokio::test]
async fn kubelet_double_resyncs_mutable_volumes_but_never_subpath_or_env() {
    let rig = Rig::start(Strategy::Watch).await;
    let api = rig.api();
    let k = rig.kubelet();
    setup_objects(&api, "key-1");
    let uid = start_worker(&api, "w-0").await;
    let subpath = mountguard_inventory::layout::subpath_target(k.root(), &uid, "sshd", "slurmd", 1);
    assert_eq!(read(&subpath), "Port 22\n");
    let hooks = vol(&k, &uid, "kubernetes.io~configmap", "hooks");
    let sshd = vol(&k, &uid, "kubernetes.io~configmap", "sshd");
    let before = std::fs::read_link(hooks.join("..data")).unwrap();

    api.merge_patch(
        &resources::CONFIGMAPS,
        "slurm",
        "hooks",
        &json!({"data": {"mode": "v2", "prolog.sh": "echo v2\n"}}),
        None,
    )
    .unwrap();
    api.merge_patch(
        &resources::CONFIGMAPS,
        "slurm",
        "sshd",
        &json!({"data": {"sshd_config": "Port 2222\n"}}),
        None,
    )
    .unwrap();
    eventually(10, "hooks volume refreshed by resync", || {
        let v = std::fs::read_to_string(hooks.join("prolog.sh")).unwrap_or_default();
        async move { (v == "echo v2\n").then_some(()) }
    })
    .await;
    eventually(10, "sshd volume refreshed", || {
        let v = std::fs::read_to_string(sshd.join("sshd_config")).unwrap_or_default();
        async move { (v == "Port 2222\n").then_some(()) }
    })
    .await;
    assert_ne!(std::fs::read_link(hooks.join("..data")).unwrap(), before);
    // The subPath copy and the env stay as they were at container start.
    assert_eq!(read(&subpath), "Port 22\n");
    assert_eq!(k.started(&uid)["slurmd"].env["HOOK_MODE"], "v1");

    // An unchanged payload is not rewritten.
    let data_dir = std::fs::read_link(hooks.join("..data")).unwrap();
    let syncs = k.sync_count();
    eventually(10, "two more resyncs", || {
        let n = k.sync_count();
        async move { (n >= syncs + 2).then_some(()) }
    })
    .await;
    assert_eq!(std::fs::read_link(hooks.join("..data")).unwrap(), data_dir);

    // Partition: no more syncing until healed.
    k.partition(true);
    let syncs = k.sync_count();
    api.merge_patch(
        &resources::CONFIGMAPS,
        "slurm",
        "hooks",
        &json!({"data": {"prolog.sh": "echo v3\n"}}),
        None,
    )
    .unwrap();
    // Several resync periods pass without a sync.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(k.sync_count(), syncs, "a partitioned kubelet does not sync");
    assert_eq!(read(&hooks.join("prolog.sh")), "echo v2\n");
    let ready = |api: &ApiHandle| {
        api.get(&resources::NODES, "", "node-1").unwrap()["status"]["conditions"][0]["status"]
            .clone()
    };
    assert_eq!(ready(&api), "Unknown");
    k.partition(false);
    assert_eq!(ready(&api), "True");
    eventually(10, "sync after the partition heals", || {
        let v = std::fs::read_to_string(hooks.join("prolog.sh")).unwrap_or_default();
        async move { (v == "echo v3\n").then_some(()) }
    })
    .await;
    rig.stop().await;
}

#[tokio::test]
async fn kubelet_double_deletion_removes_volumes_unregisters_and_confirms() {
    let rig = Rig::start(Strategy::Watch).await;
    let api = rig.api();
    let k = rig.kubelet();
    setup_objects(&api, "key-1");
    let uid = start_worker(&api, "w-0").await;
    assert_eq!(
        k.secret_cache("slurm", "slurm-auth-slurm")
            .unwrap()
            .refs
            .len(),
        1
    );
    delete_and_wait_gone(&api, "w-0").await;
    assert!(!mountguard_inventory::layout::pod_dir(k.root(), &uid).exists());
    assert!(
        k.secret_cache("slurm", "slurm-auth-slurm").is_none(),
        "item dropped with its last reference"
    );
    assert!(k.pod_uids().is_empty());
    rig.stop().await;
}

/// Deletes and recreates the immutable Secret with new bytes.
fn rotate_immutable_key(api: &ApiHandle, value: &str) {
    api.delete(
        &resources::SECRETS,
        "slurm",
        "slurm-auth-slurm",
        &DeleteOptions::default(),
    )
    .unwrap();
    api.create(
        &resources::SECRETS,
        "slurm",
        secret("slurm-auth-slurm", "slurm.key", value, true),
    )
    .unwrap();
}

#[tokio::test]
async fn kubelet_double_reproduces_the_immutable_pin_when_another_pod_keeps_the_reference() {
    let rig = Rig::start(Strategy::Watch).await;
    let api = rig.api();
    let k = rig.kubelet();
    setup_objects(&api, "old-key");
    api.create(&resources::PODS, "slurm", worker_pod("w-0"))
        .unwrap();
    api.create(&resources::PODS, "slurm", worker_pod("other"))
        .unwrap();
    let uid0 = running_uid(&api, "w-0", None).await;
    let other = running_uid(&api, "other", None).await;
    assert_eq!(slurm_key(&k, &uid0), "old-key");
    let item = k.secret_cache("slurm", "slurm-auth-slurm").unwrap();
    assert!(item.immutable_stopped);
    assert_eq!(item.refs.len(), 2);

    rotate_immutable_key(&api, "new-key");
    let uid1 = replace_worker(&api, "w-0", &uid0).await;
    // The replacement pod gets the OLD bytes: the cache item survived the
    // swap because "other" kept referencing it.
    assert_eq!(slurm_key(&k, &uid1), "old-key");
    let api_bytes = api
        .get(&resources::SECRETS, "slurm", "slurm-auth-slurm")
        .unwrap()["data"]["slurm.key"]
        .clone();
    assert_eq!(api_bytes, json!(b64("new-key")));
    // Resyncs keep serving the pinned bytes.
    let syncs = k.sync_count();
    eventually(10, "resyncs", || {
        let n = k.sync_count();
        async move { (n >= syncs + 3).then_some(()) }
    })
    .await;
    assert_eq!(slurm_key(&k, &uid1), "old-key");
    assert_eq!(slurm_key(&k, &other), "old-key");
    // Restarting the kubelet releases the pin: fresh caches, volumes
    // rewritten on the next sync.
    k.restart();
    eventually(10, "fresh key after a kubelet restart", || {
        let a = std::fs::read_to_string(
            vol(&k, &uid1, "kubernetes.io~projected", "slurm-etc").join("slurm.key"),
        )
        .unwrap_or_default();
        let b = std::fs::read_to_string(
            vol(&k, &other, "kubernetes.io~projected", "slurm-etc").join("slurm.key"),
        )
        .unwrap_or_default();
        async move { (a == "new-key" && b == "new-key").then_some(()) }
    })
    .await;
    rig.stop().await;
}

/// A pod whose only reference is the env of an init container that ran to
/// completion: registered all the same (`VisitPodSecretNames` visits every
/// container whatever its state), so it pins.
fn init_env_pod(name: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": "node-1",
            "initContainers": [{"name": "fetch-key", "image": "busybox",
                "env": [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "slurm-auth-slurm", "key": "slurm.key"}}}]}],
            "containers": [{"name": "main", "image": "busybox"}],
        },
    })
}

#[tokio::test]
async fn kubelet_double_a_finished_init_containers_env_reference_pins() {
    let rig = Rig::start(Strategy::Watch).await;
    let api = rig.api();
    let k = rig.kubelet();
    setup_objects(&api, "old-key");
    api.create(&resources::PODS, "slurm", init_env_pod("holder"))
        .unwrap();
    api.create(&resources::PODS, "slurm", worker_pod("w-0"))
        .unwrap();
    let holder = running_uid(&api, "holder", None).await;
    let uid0 = running_uid(&api, "w-0", None).await;
    // The init container ran (env frozen from the cache) and completed;
    // the status carries startTime and its terminated state.
    assert_eq!(k.started_init(&holder)["fetch-key"].env["KEY"], "old-key");
    let p = api.get(&resources::PODS, "slurm", "holder").unwrap();
    assert!(p["status"]["startTime"].is_string(), "{p:#}");
    let init = &p["status"]["initContainerStatuses"][0];
    assert_eq!(init["name"], "fetch-key");
    assert_eq!(init["state"]["terminated"]["reason"], "Completed");
    assert!(init["state"]["terminated"]["startedAt"].is_string());
    assert!(init["state"]["running"].is_null());

    rotate_immutable_key(&api, "new-key");
    let uid1 = replace_worker(&api, "w-0", &uid0).await;
    assert_eq!(
        slurm_key(&k, &uid1),
        "old-key",
        "the finished init container's reference kept the cache entry"
    );
    // Once the holder is gone, a replacement gets the new key.
    delete_and_wait_gone(&api, "holder").await;
    let uid2 = replace_worker(&api, "w-0", &uid1).await;
    assert_eq!(slurm_key(&k, &uid2), "new-key");
    rig.stop().await;
}

#[tokio::test]
async fn kubelet_double_does_not_pin_when_the_replaced_pod_was_the_only_reference() {
    let rig = Rig::start(Strategy::Watch).await;
    let api = rig.api();
    let k = rig.kubelet();
    setup_objects(&api, "old-key");
    let uid0 = start_worker(&api, "w-0").await;
    assert_eq!(slurm_key(&k, &uid0), "old-key");
    rotate_immutable_key(&api, "new-key");
    // The running pod itself keeps the old bytes (its item is pinned).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(slurm_key(&k, &uid0), "old-key");
    let uid1 = replace_worker(&api, "w-0", &uid0).await;
    assert_eq!(slurm_key(&k, &uid1), "new-key");
    rig.stop().await;
}

#[tokio::test]
async fn kubelet_double_get_strategy_serves_fresh_bytes_despite_other_references() {
    let rig = Rig::start(Strategy::Get).await;
    let api = rig.api();
    let k = rig.kubelet();
    setup_objects(&api, "old-key");
    api.create(&resources::PODS, "slurm", worker_pod("w-0"))
        .unwrap();
    api.create(&resources::PODS, "slurm", worker_pod("other"))
        .unwrap();
    let uid0 = running_uid(&api, "w-0", None).await;
    running_uid(&api, "other", None).await;
    rotate_immutable_key(&api, "new-key");
    let uid1 = replace_worker(&api, "w-0", &uid0).await;
    assert_eq!(slurm_key(&k, &uid1), "new-key");
    rig.stop().await;
}

#[tokio::test]
async fn kubelet_double_projects_service_account_tokens_that_token_review_accepts() {
    let rig = Rig::start(Strategy::Watch).await;
    let api = rig.api();
    let k = rig.kubelet();
    let pod = json!({
        "metadata": {"name": "agent-x"},
        "spec": {
            "nodeName": "node-1", "serviceAccountName": "mountguard-agent",
            "containers": [{"name": "agent", "image": "agent"}],
            "volumes": [{"name": "token", "projected": {"sources": [
                {"serviceAccountToken": {"path": "token", "audience": "mountguard", "expirationSeconds": 3600}},
            ]}}],
        },
    });
    api.create(&resources::PODS, "slurm", pod).unwrap();
    let uid = running_uid(&api, "agent-x", None).await;
    let dir = vol(&k, &uid, "kubernetes.io~projected", "token");
    let token = read(&dir.join("token"));
    let data_dir = std::fs::read_link(dir.join("..data")).unwrap();
    let syncs = k.sync_count();
    eventually(10, "resyncs", || {
        let n = k.sync_count();
        async move { (n >= syncs + 2).then_some(()) }
    })
    .await;
    assert_eq!(
        std::fs::read_link(dir.join("..data")).unwrap(),
        data_dir,
        "token volume not rewritten by resync"
    );

    let client = kube::Client::try_from(kube::Config::new(rig.api.url().parse().unwrap())).unwrap();
    let reviews: kube::Api<k8s_openapi::api::authentication::v1::TokenReview> =
        kube::Api::all(client);
    let review = k8s_openapi::api::authentication::v1::TokenReview {
        spec: k8s_openapi::api::authentication::v1::TokenReviewSpec {
            token,
            audiences: Some(vec!["mountguard".into()]),
        },
        ..Default::default()
    };
    let st = reviews
        .create(&Default::default(), &review)
        .await
        .unwrap()
        .status
        .unwrap();
    assert_eq!(st.authenticated, Some(true));
    let user = st.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:slurm:mountguard-agent")
    );
    let extra = user.extra.unwrap();
    assert_eq!(extra["authentication.kubernetes.io/pod-uid"], vec![uid]);
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"],
        vec!["node-1".to_string()]
    );
    rig.stop().await;
}
