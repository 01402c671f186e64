//! mountguard against the real kubelet: the agents read the volumes the
//! real kubelet wrote (tmpfs under its root), the controller judges them.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::time::Duration;

use mountguard_tests::cluster::{AUTH_SECRET, NODESET, SLURM_NAMESPACE};
use mountguard_tests::real::{create, raw};
use mountguard_tests::scenario::{KEY_VOLUME, PINNING_POD, find_verdict, pinning_pod, state_tag};
use serde_json::{Value, json};

use crate::harness::{Nodes, RealSystem, slurmd_pod, wait, wait_all_fresh, wait_event};

fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

async fn running_uid(sys: &RealSystem, ns: &str, name: &str) -> String {
    let client = sys.client.clone();
    let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
    wait(
        sys,
        &format!("pod {name} to run"),
        Duration::from_secs(90),
        || {
            let client = client.clone();
            let path = path.clone();
            async move {
                let (_, p) = raw(&client, "GET", &path, None).await.ok()?;
                if p["status"]["phase"] != "Running"
                    || !p["metadata"]["deletionTimestamp"].is_null()
                {
                    return None;
                }
                p["metadata"]["uid"].as_str().map(String::from)
            }
        },
    )
    .await
}

/// Deletes slurmd pod `i` and creates it again (what the operator does for
/// a deleted NodeSet pod); returns the new pod's UID once it runs.
async fn replace_slurmd_pod(sys: &RealSystem, i: usize) -> String {
    let name = format!("{NODESET}-{i}");
    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/pods/{name}");
    let (_, old) = raw(&sys.client, "GET", &path, None).await.unwrap();
    let owner = old["metadata"]["ownerReferences"][0]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, body) = raw(&sys.client, "DELETE", &path, None).await.unwrap();
    assert!(code == 200 || code == 202, "{code} {body}");
    let client = sys.client.clone();
    wait(
        sys,
        &format!("{name} to be gone"),
        Duration::from_secs(90),
        || {
            let client = client.clone();
            let path = path.clone();
            async move {
                let (code, _) = raw(&client, "GET", &path, None).await.ok()?;
                (code == 404).then_some(())
            }
        },
    )
    .await;
    create(&sys.client, &slurmd_pod(i, &owner)).await.unwrap();
    running_uid(sys, SLURM_NAMESPACE, &name).await
}

fn served(sys: &RealSystem, i: usize, uid: &str) -> Vec<u8> {
    std::fs::read(
        sys.kubelets[i]
            .root()
            .join("pods")
            .join(uid)
            .join("volumes/kubernetes.io~projected")
            .join(KEY_VOLUME)
            .join("slurm.key"),
    )
    .unwrap_or_default()
}

/// The seed scenario with the real kubelet writing the volumes: all Fresh
/// at first; the immutable `slurm-auth-slurm` deleted and recreated with a
/// new key while `slurm-auth-check` on node-0 also mounts it. Before any
/// replacement mountguard says node-0's slurmd pod is
/// `Stale/ImmutableCachePinned` and node-1's (nothing else references the
/// Secret there) `Stale/ImmutableCache`, the cause a replacement fixes,
/// with a `StaleMount` Event. node-0's replacement slurmd pod is served
/// the OLD key by the real kubelet and is `Stale/ImmutableCachePinned`
/// naming the pin; node-1's replacement gets the new key and is Fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_rotation_is_pinned_on_the_pinned_node_and_fixed_by_a_replacement_elsewhere() {
    let sys = RealSystem::start_with(2, Nodes::RealKubelets).await;
    let mut pin = pinning_pod("node-0");
    pin["apiVersion"] = json!("v1");
    pin["kind"] = json!("Pod");
    pin["metadata"]["namespace"] = json!(SLURM_NAMESPACE);
    pin["spec"]["automountServiceAccountToken"] = json!(false);
    create(&sys.client, &pin).await.unwrap();
    running_uid(&sys, SLURM_NAMESPACE, PINNING_POD).await;
    wait_all_fresh(&sys).await;

    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/secrets/{AUTH_SECRET}");
    let (code, body) = raw(&sys.client, "DELETE", &path, None).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let new_key = b"the rotated slurm.key".repeat(40);
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": AUTH_SECRET, "namespace": SLURM_NAMESPACE},
                "immutable": true, "data": {"slurm.key": b64(&new_key)}}),
    )
    .await
    .unwrap();

    // Before any replacement: node-1's slurmd pod, the only reference to
    // the Secret on its node, is `Stale/ImmutableCache` (what a
    // replacement fixes, docs/verdicts.md) with no pinning pod, and gets
    // a `StaleMount` Event; node-0's is pinned by `slurm-auth-check`.
    let base = sys.metrics_base();
    let doc: Value = wait(
        &sys,
        "node-1's slurmd pod Stale/ImmutableCache, node-0's Stale/ImmutableCachePinned",
        Duration::from_secs(60),
        || {
            let base = base.clone();
            async move {
                let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                    .await
                    .ok()?;
                let v0 = find_verdict(&doc, &format!("{NODESET}-0"), "volume slurm-etc")?;
                let v1 = find_verdict(&doc, &format!("{NODESET}-1"), "volume slurm-etc")?;
                (state_tag(v0) == "Stale/ImmutableCachePinned"
                    && state_tag(v1) == "Stale/ImmutableCache")
                    .then_some(doc)
            }
        },
    )
    .await;
    let v1 = find_verdict(&doc, &format!("{NODESET}-1"), "volume slurm-etc").unwrap();
    assert!(
        v1["pinnedBy"].as_array().is_none_or(|p| p.is_empty())
            && !v1.to_string().contains("cannot help"),
        "node-1's verdict says a replacement fixes it: {v1}"
    );
    let pod1 = format!("{NODESET}-1");
    let note = wait_event(
        &sys,
        "a StaleMount Event on node-1's slurmd pod",
        Duration::from_secs(30),
        |reason, kind, name, _| reason == "StaleMount" && kind == "Pod" && name == pod1,
    )
    .await;
    assert!(
        note.contains("Stale/ImmutableCache") && !note.contains("pinned"),
        "{note}"
    );

    let uid0 = replace_slurmd_pod(&sys, 0).await;
    assert_ne!(
        served(&sys, 0, &uid0),
        new_key,
        "node-0's kubelet served the new key"
    );
    // node-1: no other reference. A replacement started before the kubelet
    // has unregistered the deleted pod from its Secret manager may still
    // share the old cache entry (nothing observable says when that is
    // done): replaced again until one is served the new key.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let uid1 = replace_slurmd_pod(&sys, 1).await;
        if served(&sys, 1, &uid1) == new_key {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no replacement on node-1 was served the new key in 120 s\n{}",
            sys.logs()
        );
    }

    let doc: Value = wait(
        &sys,
        "node-0's replacement Stale/ImmutableCachePinned, node-1's Fresh",
        Duration::from_secs(60),
        || {
            let base = base.clone();
            async move {
                let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                    .await
                    .ok()?;
                let v0 = find_verdict(&doc, &format!("{NODESET}-0"), "volume slurm-etc")?;
                let v1 = find_verdict(&doc, &format!("{NODESET}-1"), "volume slurm-etc")?;
                (state_tag(v0) == "Stale/ImmutableCachePinned" && v1["state"] == "Fresh")
                    .then_some(doc)
            }
        },
    )
    .await;
    let v0 = find_verdict(&doc, &format!("{NODESET}-0"), "volume slurm-etc").unwrap();
    assert!(
        v0.to_string().contains(PINNING_POD),
        "the verdict names the pinning pod: {v0}"
    );
    // The kubelet (1.37 here) also checks images pulled with a pinned
    // Secret against the old object's credentials: the advice says so.
    assert!(
        v0["advice"]
            .as_str()
            .is_some_and(|a| a.contains("pull images with this Secret")),
        "the advice tells what the pin does to pull Secrets: {v0}"
    );
    sys.shutdown().await;
}

/// The other way out of a pin that docs/verdicts.md gives: restart the
/// kubelet. After the rotation with `slurm-auth-check` pinning node-0's
/// cache entry, the slurmd pod is `Stale/ImmutableCachePinned`; the real
/// kubelet is killed and started again (runtime, containers and mounts
/// kept): its new Secret manager registers the running pods again, and
/// the first reference to a name starts a new reflector, which lists the
/// current object (pkg/kubelet/util/manager/watch_based_manager.go
/// `AddReference`, `newReflectorLocked`), so both pods' volumes get the
/// new key at their next sync without being replaced (same UIDs,
/// containers not restarted), and mountguard says Fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_restart_releases_the_pin_and_the_pinned_pod_turns_fresh() {
    let mut sys = RealSystem::start_with(1, Nodes::RealKubelets).await;
    let mut pin = pinning_pod("node-0");
    pin["apiVersion"] = json!("v1");
    pin["kind"] = json!("Pod");
    pin["metadata"]["namespace"] = json!(SLURM_NAMESPACE);
    pin["spec"]["automountServiceAccountToken"] = json!(false);
    create(&sys.client, &pin).await.unwrap();
    let pin_uid = running_uid(&sys, SLURM_NAMESPACE, PINNING_POD).await;
    wait_all_fresh(&sys).await;
    let slurmd = format!("{NODESET}-0");
    let slurmd_uid = running_uid(&sys, SLURM_NAMESPACE, &slurmd).await;
    let (_, before) = raw(
        &sys.client,
        "GET",
        &format!("/api/v1/namespaces/{SLURM_NAMESPACE}/pods/{slurmd}"),
        None,
    )
    .await
    .unwrap();

    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/secrets/{AUTH_SECRET}");
    let (code, body) = raw(&sys.client, "DELETE", &path, None).await.unwrap();
    assert_eq!(code, 200, "{body}");
    let new_key = b"the rotated slurm.key".repeat(40);
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": AUTH_SECRET, "namespace": SLURM_NAMESPACE},
                "immutable": true, "data": {"slurm.key": b64(&new_key)}}),
    )
    .await
    .unwrap();
    let base = sys.metrics_base();
    let pinned = |want: &'static str| {
        let base = base.clone();
        let slurmd = slurmd.clone();
        move || {
            let base = base.clone();
            let slurmd = slurmd.clone();
            async move {
                let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                    .await
                    .ok()?;
                let v = find_verdict(&doc, &slurmd, "volume slurm-etc")?;
                let p = find_verdict(&doc, PINNING_POD, "volume auth")?;
                (state_tag(v) == want && (want != "Fresh" || p["state"] == "Fresh")).then_some(())
            }
        }
    };
    wait(
        &sys,
        "the slurmd pod Stale/ImmutableCachePinned",
        Duration::from_secs(60),
        pinned("Stale/ImmutableCachePinned"),
    )
    .await;
    assert_ne!(served(&sys, 0, &slurmd_uid), new_key);

    if let Err(e) = sys.kubelets[0].restart().await {
        panic!("{e}");
    }
    // Within one resync of the new kubelet, both pods' volumes hold the
    // new key.
    let auth_file = sys.kubelets[0]
        .root()
        .join("pods")
        .join(&pin_uid)
        .join("volumes/kubernetes.io~secret/auth/slurm.key");
    let sys_ref = &sys;
    wait(
        &sys,
        "both pods served the new key after the kubelet restart",
        Duration::from_secs(60),
        || {
            let ok = served(sys_ref, 0, &slurmd_uid) == new_key
                && std::fs::read(&auth_file).unwrap_or_default() == new_key;
            async move { ok.then_some(()) }
        },
    )
    .await;
    wait(
        &sys,
        "the slurmd pod and the pinning pod Fresh",
        Duration::from_secs(60),
        pinned("Fresh"),
    )
    .await;
    // Not replaced: same UID, same container start, no restart.
    let (_, after) = raw(
        &sys.client,
        "GET",
        &format!("/api/v1/namespaces/{SLURM_NAMESPACE}/pods/{slurmd}"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    let started =
        |p: &Value| p["status"]["containerStatuses"][0]["state"]["running"]["startedAt"].clone();
    assert!(started(&before).is_string(), "{before}");
    assert_eq!(started(&after), started(&before), "{after}");
    assert_eq!(after["status"]["containerStatuses"][0]["restartCount"], 0);
    sys.shutdown().await;
}
