//! The agent image's linux/arm64 manifest on this amd64 node: its
//! container run by the same containerd and runc under qemu-user (a
//! `binfmt_misc` rule of the test's own, `mountguard_tests::real::binfmt`),
//! reading the kubelet's volumes, reports the inventory the linux/amd64
//! manifest reports.
//!
//! Not through the kubelet: containerd v2.4.2's CRI keeps its image store
//! for the host's platform (`internal/cri/server/images/service.go`
//! `NewService`: `imagestore.NewStore(..., platforms.Default())`), so a pod
//! on an amd64 node runs the amd64 manifest. The containers are started
//! with `ctr run --platform`, the same runtime and image store the kubelet
//! uses.

use std::time::Duration;

use mountguard_tests::real::binfmt::Aarch64Handler;
use mountguard_tests::real::real_node::{NODE, print_skipped};
use mountguard_tests::real::{create, ensure_namespace, wait_for_default_service_account};
use mountguard_tests::real_node_or_skip;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::harness::wait_pod_ready;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_arm64_agent_image_under_qemu_reports_the_same_inventory_as_amd64() {
    const WHAT: &str = "real_node_arm64_agent_image_under_qemu_reports_the_same_inventory_as_amd64";
    let node = real_node_or_skip!(WHAT);
    let client = node.cluster.client().await.expect("client");
    ensure_namespace(&client, "demo").await.expect("namespace");
    wait_for_default_service_account(&client, "demo")
        .await
        .expect("default ServiceAccount");
    for obj in [
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "s", "namespace": "demo"},
               "stringData": {"slurm.key": "k-1", "other": "o"}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap",
               "metadata": {"name": "c", "namespace": "demo"},
               "data": {"hooks.conf": "h-1"}}),
        json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "demo"},
        "spec": {
            "nodeName": NODE,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "c",
                "image": node.images.pause,
                "imagePullPolicy": "Never",
                "volumeMounts": [
                    {"name": "s", "mountPath": "/s", "readOnly": true},
                    {"name": "c", "mountPath": "/c", "readOnly": true}
                ]
            }],
            "volumes": [
                {"name": "s", "secret": {"secretName": "s"}},
                {"name": "c", "configMap": {"name": "c"}}
            ]
        }}),
    ] {
        create(&client, &obj).await.expect("object");
    }
    let pod = wait_pod_ready(&node, "demo", "p", Duration::from_secs(120)).await;
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_string();

    // The image index imported from scripts/images.sh must carry an arm64
    // manifest (scripts/test.sh builds the arm64 binaries before this tier).
    let index = node
        .runtime
        .ctr(&["content", "get", &node.images.agent.1])
        .expect("ctr content get");
    let index: Value = serde_json::from_slice(&index.stdout).unwrap_or_else(|e| {
        panic!(
            "the agent image index {}: {e}: {}",
            node.images.agent.1,
            String::from_utf8_lossy(&index.stderr)
        )
    });
    let platforms: Vec<String> = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let p = &m["platform"];
            format!(
                "{}/{}",
                p["os"].as_str().unwrap_or(""),
                p["architecture"].as_str().unwrap_or("")
            )
        })
        .collect();
    if !platforms.iter().any(|p| p == "linux/arm64") {
        print_skipped(
            WHAT,
            &format!(
                "the agent image {} has no linux/arm64 manifest ({platforms:?}): \
                 build target/aarch64-unknown-linux-musl first (scripts/test.sh, static release binaries)",
                node.images.agent_ref()
            ),
        );
        return;
    }
    assert!(
        platforms.iter().any(|p| p == "linux/amd64"),
        "{platforms:?}"
    );

    let image = node.images.agent_ref();
    let root = node.kubelet.root().to_string_lossy().into_owned();
    let mount = format!("type=bind,src={root},dst=/var/lib/kubelet,options=rbind:ro");
    let run = |platform: &str, id: &str, args: &[&str]| {
        let mut cmd = vec![
            "run",
            "--rm",
            "--platform",
            platform,
            "--mount",
            &mount,
            &image,
            id,
            "/mountguard-agent",
        ];
        cmd.extend_from_slice(args);
        node.runtime.ctr(&cmd).expect("ctr run")
    };
    let scan = [
        "scan",
        "--kubelet-root",
        "/var/lib/kubelet",
        "--node",
        NODE,
        "--output",
        "json",
    ];
    let pid = std::process::id();

    // Without a rule for arm64 programs, the arm64 container cannot start
    // (unless the host registered one of its own, which the rule below
    // then precedes).
    if !Aarch64Handler::host_has_one() {
        let out = run(
            "linux/arm64",
            &format!("mg-arm64-none-{pid}"),
            &["--version"],
        );
        assert!(
            !out.status.success(),
            "an arm64 container ran with no binfmt_misc rule for arm64: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("exec format error"), "{err}");
    }

    let handler = match Aarch64Handler::register() {
        Ok(h) => h,
        Err(why) => {
            print_skipped(
                WHAT,
                &format!("no binfmt_misc rule for arm64 programs: {why}"),
            );
            return;
        }
    };
    let state = handler.state().expect("rule state");

    let version = |platform: &str, tag: &str| {
        let out = run(platform, &format!("mg-{tag}-version-{pid}"), &["--version"]);
        assert!(
            out.status.success(),
            "{platform} --version: {}{}\nrule:\n{state}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(
        version("linux/arm64", "arm64"),
        format!("mountguard-agent {} (linux/arm64)", node.images.version)
    );
    assert_eq!(
        version("linux/amd64", "amd64"),
        format!("mountguard-agent {} (linux/amd64)", node.images.version)
    );

    let inventory = |platform: &str, tag: &str| -> Value {
        let out = run(platform, &format!("mg-{tag}-scan-{pid}"), &scan);
        assert!(
            out.status.success(),
            "{platform} scan: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{platform} scan output: {e}: {}",
                String::from_utf8_lossy(&out.stdout)
            )
        })
    };
    let arm = inventory("linux/arm64", "arm64");
    let amd = inventory("linux/amd64", "amd64");
    assert_eq!(arm["node"], NODE);
    assert_eq!(
        arm["pods"], amd["pods"],
        "arm64 and amd64 inventories differ"
    );

    // And it is the pod's content, not two empty scans.
    let digest = |b: &[u8]| hex::encode(Sha256::digest(b));
    let pods = arm["pods"].as_array().expect("pods");
    let ours = pods
        .iter()
        .find(|p| p["uid"] == uid.as_str())
        .unwrap_or_else(|| panic!("pod {uid} not in the arm64 inventory: {arm:#}"));
    let text = ours.to_string();
    for (what, bytes) in [("slurm.key", b"k-1".as_slice()), ("hooks.conf", b"h-1")] {
        assert!(
            text.contains(&digest(bytes)),
            "{what}'s digest not in the arm64 inventory of the pod: {ours:#}"
        );
    }
}
