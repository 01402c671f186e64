//! End to end: kubelet layouts written by the AtomicWriter double, scanned by
//! the real agent scanner, judged by the real `mountguard-controller verify`
//! binary against a `kubectl get -o json` style dump.

use std::path::{Path, PathBuf};
use std::process::Command;

use base64::Engine as _;
use jiff::{SignedDuration, Timestamp};
use mountguard_agent::scan::{ScanOptions, Scanner};
use mountguard_inventory::layout::{subpath_target, volume_dir};
use mountguard_inventory::writer::{AtomicWriterDouble, Payload, PayloadFile};
use mountguard_inventory::{Plugin, file_digest, volume_digest};
use serde_json::{Value, json};

fn write_volume(root: &Path, uid: &str, plugin: Plugin, name: &str, files: &[(&str, &[u8])]) {
    let payload: Payload = files
        .iter()
        .map(|(p, b)| (p.to_string(), PayloadFile::new(*b)))
        .collect();
    AtomicWriterDouble::new(volume_dir(root, uid, plugin, name))
        .write(&payload)
        .expect("write volume");
}

fn write_sub_path(root: &Path, uid: &str, volume: &str, container: &str, index: u32, bytes: &[u8]) {
    let target = subpath_target(root, uid, volume, container, index);
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(target, bytes).unwrap();
}

fn scan(root: &Path, node: &str, out: &Path) -> PathBuf {
    let scan = Scanner::new(ScanOptions::new(root, node))
        .scan()
        .expect("scan");
    let path = out.join(format!("{node}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&*scan.inventory).unwrap()).unwrap();
    path
}

fn t(ts: Timestamp) -> String {
    ts.to_string()
}

fn meta(ns: &str, name: &str, uid: &str, written: Timestamp) -> Value {
    json!({"namespace": ns, "name": name, "uid": uid,
        "creationTimestamp": t(written),
        "managedFields": [{"manager": "kubectl", "operation": "Update", "time": t(written)}]})
}

fn pod(
    name: &str,
    uid: &str,
    node: &str,
    started: Timestamp,
    spec: Value,
    annotations: Value,
) -> Value {
    let containers = spec["containers"].as_array().unwrap().clone();
    let statuses: Vec<Value> = containers
        .iter()
        .map(|c| {
            json!({"name": c["name"], "ready": true, "restartCount": 0, "image": "x", "imageID": "",
                "state": {"running": {"startedAt": t(started)}}})
        })
        .collect();
    let mut spec = spec;
    spec["nodeName"] = json!(node);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "slurm", "name": name, "uid": uid, "annotations": annotations,
            "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "name": "gpu", "uid": "nodeset-uid", "controller": true}]},
        "spec": spec,
        // startTime: the kubelet's status manager stamps it in the pod's
        // first sync, when the pod registers its references.
        "status": {"phase": "Running", "startTime": t(started), "containerStatuses": statuses}})
}

fn kaa(name: &str) -> Value {
    json!({"name": name, "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
    ]}})
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn verify(args: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_mountguard-controller"))
        .arg("verify")
        .args(args)
        .output()
        .expect("run mountguard-controller");
    Run {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

fn find<'a>(doc: &'a Value, pod: &str, field: &str, value: &str) -> &'a Value {
    doc["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["pod"] == pod && v[field] == value)
        .unwrap_or_else(|| panic!("no verdict for {pod} {field}={value}: {doc:#}"))
}

#[test]
fn verify_judges_layouts_written_like_the_kubelet_and_scanned_by_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let (root_a, root_b) = (dir.path().join("node-a"), dir.path().join("node-b"));
    let now = Timestamp::now();
    let started = now - SignedDuration::from_hours(2);

    // What the kubelets wrote.
    // node-a: worker-0 still has the old slurm.key (immutable Secret
    // recreated; login-0 keeps the cache entry alive), a fresh sshd volume but
    // an old subPath copy, and kube-api-access with a rotating token.
    write_volume(
        &root_a,
        "w0",
        Plugin::Projected,
        "slurm-etc",
        &[("slurm.key", b"old-key")],
    );
    write_volume(
        &root_a,
        "w0",
        Plugin::Configmap,
        "sshd",
        &[("sshd_config", b"new-sshd")],
    );
    write_sub_path(&root_a, "w0", "sshd", "slurmd", 1, b"old-sshd");
    write_volume(
        &root_a,
        "w0",
        Plugin::Projected,
        "kube-api-access-w0abc",
        &[
            ("ca.crt", b"CA"),
            ("token", b"eyJ-token-w0"),
            ("namespace", b"slurm"),
        ],
    );
    // node-b: worker-1 got the new key, after slurmd started; app-0 shows an
    // old ConfigMap long after it changed.
    write_volume(
        &root_b,
        "w1",
        Plugin::Projected,
        "slurm-etc",
        &[("slurm.key", b"new-key")],
    );
    write_volume(
        &root_b,
        "a0",
        Plugin::Configmap,
        "app",
        &[("app.yaml", b"old-app"), ("conf.d/x", b"x")],
    );

    let inv_a = scan(&root_a, "node-a", dir.path());
    let inv_b = scan(&root_b, "node-b", dir.path());

    // What the API server says.
    let slurm_etc = json!({"name": "slurm-etc", "projected": {"defaultMode": 384, "sources": [
        {"secret": {"name": "slurm-auth", "items": [{"key": "slurm.key", "path": "slurm.key"}]}}]}});
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Secret", "immutable": true,
         "metadata": meta("slurm", "slurm-auth", "s-2", now - SignedDuration::from_hours(1)),
         "data": {"slurm.key": b64(b"new-key")}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": meta("slurm", "sshd-config", "c-1", now - SignedDuration::from_mins(20)),
         "data": {"sshd_config": "new-sshd"}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": meta("slurm", "kube-root-ca.crt", "c-2", now - SignedDuration::from_hours(24)),
         "data": {"ca.crt": "CA"}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": meta("slurm", "app-config", "c-3", now - SignedDuration::from_mins(30)),
         "data": {"app.yaml": "new-app"}, "binaryData": {"x": b64(b"x")}},
        pod("worker-0", "w0", "node-a", started, json!({
            "volumes": [slurm_etc, {"name": "sshd", "configMap": {"name": "sshd-config"}}, kaa("kube-api-access-w0abc")],
            "containers": [{"name": "slurmd", "image": "x", "volumeMounts": [
                {"name": "slurm-etc", "mountPath": "/etc/slurm"},
                {"name": "sshd", "mountPath": "/etc/ssh/sshd_config", "subPath": "sshd_config"},
                {"name": "kube-api-access-w0abc", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}]
        }), json!({})),
        pod("login-0", "l0", "node-a", started, json!({
            "containers": [{"name": "login", "image": "x", "env": [
                {"name": "SLURM_KEY", "valueFrom": {"secretKeyRef": {"name": "slurm-auth", "key": "slurm.key"}}}]}]
        }), json!({})),
        pod("worker-1", "w1", "node-b", started, json!({
            "volumes": [slurm_etc],
            "containers": [{"name": "slurmd", "image": "x", "volumeMounts": [
                {"name": "slurm-etc", "mountPath": "/etc/slurm"}]}]
        }), json!({"mountguard.io/read-at-start": "slurm-etc"})),
        pod("app-0", "a0", "node-b", started, json!({
            "volumes": [{"name": "app", "configMap": {"name": "app-config",
                "items": [{"key": "app.yaml", "path": "app.yaml"}, {"key": "x", "path": "conf.d/x"}]}}],
            "containers": [{"name": "app", "image": "x"}]
        }), json!({})),
        pod("orphan-0", "o0", "node-c", started, json!({
            "volumes": [{"name": "cfg", "configMap": {"name": "app-config"}}],
            "containers": [{"name": "c", "image": "x"}]
        }), json!({}))
    ]});
    let objects_path = dir.path().join("objects.json");
    std::fs::write(&objects_path, serde_json::to_vec_pretty(&objects).unwrap()).unwrap();
    let key_path = dir.path().join("fingerprint.key");
    std::fs::write(&key_path, b"an-installation-key-for-tests-0123").unwrap();

    let now_arg = t(now + SignedDuration::from_secs(10));
    let (objs, a, b, key) = (
        objects_path.to_str().unwrap(),
        inv_a.to_str().unwrap(),
        inv_b.to_str().unwrap(),
        key_path.to_str().unwrap(),
    );
    let common = [
        "--objects",
        objs,
        "--inventory",
        a,
        b,
        "--now",
        &now_arg,
        "--fingerprint-key-file",
        key,
    ];

    let r = verify(&[&common[..], &["--output", "json"]].concat());
    assert_eq!(r.code, 0, "no --fail-on: {}", r.stderr);
    let doc: Value = serde_json::from_str(&r.stdout).expect("JSON output");

    let v = find(&doc, "worker-0", "volume", "slurm-etc");
    assert_eq!(
        (v["state"].as_str(), v["cause"].as_str()),
        (Some("Stale"), Some("ImmutableCachePinned")),
        "{v:#}"
    );
    assert_eq!(v["pinnedBy"], json!(["login-0"]));
    assert_eq!(v["differingPaths"], json!(["slurm.key"]));
    assert_eq!(v["nodeset"], "gpu");
    assert_ne!(v["expected"], v["observed"]);

    let v = find(&doc, "worker-0", "subject", "subPath");
    assert_eq!(
        (v["state"].as_str(), v["cause"].as_str()),
        (Some("Frozen"), Some("SubPath")),
        "{v:#}"
    );
    assert_eq!(v["subPath"], "sshd_config");
    assert_eq!(v["container"], "slurmd");
    assert_eq!(find(&doc, "worker-0", "volume", "sshd")["state"], "Fresh");

    let v = find(&doc, "worker-0", "volume", "kube-api-access-w0abc");
    assert_eq!(
        v["state"], "Fresh",
        "token and namespace are skipped: {v:#}"
    );
    let skipped: Vec<&Value> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["state"] == "skipped")
        .collect();
    assert_eq!(skipped.len(), 2, "{v:#}");

    // login-0 read the key from the same kubelet cache entry, which it and
    // worker-0 kept alive across the recreation: a restart would get the
    // old key again, so this is Stale (pinned), not Frozen.
    let v = find(&doc, "login-0", "env", "SLURM_KEY");
    assert_eq!(
        (v["state"].as_str(), v["cause"].as_str()),
        (Some("Stale"), Some("ImmutableCachePinned")),
        "{v:#}"
    );
    assert_eq!(v["pinnedBy"], json!(["worker-0"]));

    let v = find(&doc, "worker-1", "volume", "slurm-etc");
    assert_eq!(
        (v["state"].as_str(), v["cause"].as_str()),
        (Some("Frozen"), Some("ReadAtStart")),
        "{v:#}"
    );
    assert_eq!(v["expected"], v["observed"]);
    // worker-1 and worker-0 expect the same content: same fingerprint.
    assert_eq!(
        v["expected"],
        find(&doc, "worker-0", "volume", "slurm-etc")["expected"]
    );

    let v = find(&doc, "app-0", "volume", "app");
    assert_eq!(
        (v["state"].as_str(), v["cause"].as_str()),
        (Some("Stale"), Some("Unknown")),
        "{v:#}"
    );
    assert_eq!(v["differingPaths"], json!(["app.yaml"]));

    let v = find(&doc, "orphan-0", "volume", "cfg");
    assert_eq!(
        (v["state"].as_str(), v["cause"].as_str()),
        (Some("Unverifiable"), Some("NoInventory"))
    );

    // Nothing that identifies content without the key leaks.
    for content in [
        &b"new-key"[..],
        b"old-key",
        b"new-sshd",
        b"old-sshd",
        b"old-app",
    ] {
        let fd = hex::encode(file_digest(content));
        assert!(
            !r.stdout.contains(&fd[..12]),
            "digest prefix of {content:?} leaked"
        );
        assert!(
            !r.stdout.contains(std::str::from_utf8(content).unwrap()),
            "plaintext leaked"
        );
    }
    let vd = hex::encode(volume_digest([("slurm.key", &file_digest(b"new-key"))]));
    assert!(!r.stdout.contains(&vd[..12]));

    // Table output and --fail-on.
    let r = verify(&[&common[..], &["--fail-on", "stale"]].concat());
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stdout
            .contains("ImmutableCachePinned (pinned by login-0)"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(
            "slurm/worker-0 subPath slurmd:sshd/sshd_config: differing paths: (the file)"
        ),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("summary: 5 pods"), "{}", r.stdout);
    assert!(
        !r.stdout.lines().any(|l| l.starts_with("Fresh")),
        "fresh rows are not printed"
    );
    assert_eq!(
        verify(&[&common[..], &["--fail-on", "frozen"]].concat()).code,
        1
    );

    // Only fresh content: exit 0 even with --fail-on any.
    let fresh_only = json!({"apiVersion": "v1", "kind": "List", "items": [
        objects["items"][2].clone(), objects["items"][1].clone(),
        pod("worker-0", "w0", "node-a", now + SignedDuration::from_hours(1), json!({
            "volumes": [{"name": "sshd", "configMap": {"name": "sshd-config"}}, kaa("kube-api-access-w0abc")],
            "containers": [{"name": "slurmd", "image": "x"}]}), json!({}))
    ]});
    let fresh_path = dir.path().join("fresh.json");
    std::fs::write(&fresh_path, fresh_only.to_string()).unwrap();
    let r = verify(&[
        "--objects",
        fresh_path.to_str().unwrap(),
        "--inventory",
        a,
        "--now",
        &now_arg,
        "--fail-on",
        "any",
    ]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("Fresh=2"), "{}", r.stdout);

    // Bad input: exit 2 and a message naming the file and the place.
    let text = std::fs::read_to_string(&objects_path).unwrap();
    let trunc = dir.path().join("truncated.json");
    std::fs::write(&trunc, &text[..text.len() * 2 / 3]).unwrap();
    let r = verify(&["--objects", trunc.to_str().unwrap(), "--inventory", a]);
    assert_eq!(r.code, 2);
    assert!(
        r.stderr.contains("truncated.json: invalid JSON at line"),
        "{}",
        r.stderr
    );
    let r = verify(&["--objects", objs, "--inventory", "/nonexistent/inv.json"]);
    assert_eq!(r.code, 2);
    assert!(r.stderr.contains("/nonexistent/inv.json"), "{}", r.stderr);
    // The cause is said once, on one line.
    assert_eq!(
        r.stderr,
        "error: /nonexistent/inv.json: No such file or directory (os error 2)\n"
    );
    let r = verify(&["--objects", objs, "--grace", "soon"]);
    assert_eq!(r.code, 2, "bad flags are bad input");
}
