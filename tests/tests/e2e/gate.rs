//! The rollout gate end to end, as docs/rotation.md describes it: rotate
//! Slinky's immutable `slurm-auth-slurm` (delete and recreate, carrying the
//! labels and `immutable: true`) with remediation and
//! `--replace-pinning-pods` on, then gate on `wait secret/...` run as a
//! real subprocess: as the kubectl plugin (`kubectl-mountguard`, through
//! the API server double's service proxy, with a kubeconfig) and as
//! `mountguard-controller wait --url`.

use std::process::ExitStatus;
use std::time::{Duration, Instant};

use base64::Engine as _;
use mountguard_tests::apiserver::{ApiHandle, DeleteOptions, resources};
use mountguard_tests::cluster::{AUTH_SECRET, Cluster, JWT_SECRET, SLURM_NAMESPACE};
use mountguard_tests::mountguard::{binary, clean_command as command, kubectl_plugin};
use mountguard_tests::scenario::{
    PINNING_POD, add_pinning_pod, random_auth_key, served_key, slurmd_pod, wait_for_slurmd_pods,
};
use serde_json::{Value, json};

use crate::harness::wait_all_fresh;
use crate::remediation::{attempts, four_workers, in_service, opt_in, start};

const TARGET: &str = "secret/slurm/slurm-auth-slurm";

/// The rotation of docs/rotation.md: read the Secret, delete it, create it
/// again with the same labels, `immutable: true` and a new `slurm.key`.
/// Returns the new key and the new object's UID.
fn rotate_carrying_labels(api: &ApiHandle) -> (Vec<u8>, String) {
    let old = api
        .get(&resources::SECRETS, SLURM_NAMESPACE, AUTH_SECRET)
        .unwrap();
    let key = random_auth_key();
    api.delete(
        &resources::SECRETS,
        SLURM_NAMESPACE,
        AUTH_SECRET,
        &DeleteOptions::default(),
    )
    .unwrap();
    let created = api
        .create(
            &resources::SECRETS,
            SLURM_NAMESPACE,
            json!({
                "metadata": {"name": AUTH_SECRET, "labels": old["metadata"]["labels"].clone()},
                "immutable": true,
                "data": {"slurm.key": base64::engine::general_purpose::STANDARD.encode(&key)},
            }),
        )
        .unwrap();
    assert_eq!(created["metadata"]["labels"], old["metadata"]["labels"]);
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    (key, uid)
}

/// Whether worker `i` of the NodeSet runs as a pod other than `old_uid`
/// that its node's kubelet serves `key` and that responds in Slurm (not
/// drained, down or not responding).
fn served_and_responding(cluster: &Cluster, i: usize, old_uid: &str, key: &[u8]) -> bool {
    let api = cluster.api();
    let Some((name, uid)) = slurmd_pod(&api, i) else {
        return false;
    };
    let Some(node) = api
        .get(&resources::PODS, SLURM_NAMESPACE, &name)
        .ok()
        .and_then(|p| p["spec"]["nodeName"].as_str().map(str::to_string))
    else {
        return false;
    };
    let Some(n) = cluster.node_names().iter().position(|x| *x == node) else {
        return false;
    };
    uid != old_uid
        && served_key(cluster, n, &uid).is_ok_and(|k| k == key)
        && cluster.slurm().node(&name).is_some_and(|n| in_service(&n))
}

fn output_text(out: &std::process::Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_gate_passes_through_kubectl_plugin_only_once_every_slurmd_is_served_the_new_key()
{
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start(
        "on",
        &[
            "--slurm-jwt-key-secret",
            &jwt,
            "--replace-pinning-pods",
            "--remediation-budget-per-nodeset",
            "2",
        ],
    )
    .await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let pods = four_workers(&sys).await;
    wait_all_fresh(&sys).await;
    sys.expose_metrics();
    let kubectl_mountguard = kubectl_plugin(sys.cluster.dir()).unwrap();
    opt_in(&sys);

    let (key, uid) = rotate_carrying_labels(&api);
    let started = Instant::now();
    let child = command(&kubectl_mountguard)
        .env("KUBECONFIG", sys.cluster.kubeconfig_path())
        .args(["wait", TARGET, "--uid", &uid])
        .args([
            "--timeout",
            "240s",
            "--interval",
            "300ms",
            "--output",
            "json",
        ])
        .spawn()
        .unwrap();
    let gate = tokio::spawn(child.wait_with_output());
    // Watch the cluster while the gate waits: when did every slurmd pod
    // get the new key and respond?
    let mut all_served_at: Option<Instant> = None;
    let out = loop {
        let served =
            (0..pods.len()).all(|i| served_and_responding(&sys.cluster, i, &pods[i].1, &key));
        if served && all_served_at.is_none() {
            all_served_at = Some(Instant::now());
        }
        if gate.is_finished() {
            break gate.await.unwrap().unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(270),
            "the gate outlived its timeout\n{}",
            sys.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let (stdout, stderr) = output_text(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "gate: {stdout}\n{stderr}\n{}",
        sys.logs()
    );
    // Exit 0 only once every slurmd pod was replaced, is served the new
    // key and responds in Slurm (Slurm shows NOT_RESPONDING for up to 2 s
    // after the release's UNDRAIN or RESUME: the double's 1 s settle).
    for (i, (_, old_uid)) in pods.iter().enumerate() {
        let by = Instant::now() + Duration::from_secs(3);
        while !served_and_responding(&sys.cluster, i, old_uid, &key) {
            assert!(
                Instant::now() < by,
                "node-{i} not done when the gate passed: {stdout}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(all_served_at.is_some(), "{stdout}");
    // The pin between workers 0 and 3 on node-0 was released by replacing
    // them together.
    let a = attempts(&sys);
    let group_of = |pod: &str| {
        a.iter()
            .find(|x| x.pod == pod)
            .and_then(|x| x.group.clone())
    };
    let g0 = group_of(&pods[0].0);
    assert!(g0.is_some() && g0 == group_of(&pods[3].0), "{a:?}");
    // It waited: progress was reported on stderr before it passed.
    assert!(stderr.contains("consumers verified"), "{stderr}");
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["complete"], true, "{result}");
    assert_eq!(result["timedOut"], false, "{result}");
    assert!(
        result["total"].as_u64().unwrap() >= pods.len() as u64,
        "{result}"
    );
    assert_eq!(result["verified"], result["total"], "{result}");
    assert_eq!(result["sources"][0]["uid"], uid.as_str(), "{result}");
    let fp = result["sources"][0]["fingerprint"].as_str().unwrap();
    assert_eq!(fp.len(), 12, "a keyed fingerprint: {result}");
    let key_hex = hex::encode(&key);
    let key_b64 = base64::engine::general_purpose::STANDARD.encode(&key);
    for text in [&stdout, &stderr] {
        assert!(!text.contains(&key_hex[..24]) && !text.contains(&key_b64[..24]));
    }

    // A job then runs on every worker.
    for (name, _) in &pods {
        let job = slurm.start_job(name, 1);
        let n = slurm.node(name).unwrap();
        assert!(
            in_service(&n) && n.state.iter().any(|s| s == "MIXED" || s == "ALLOCATED"),
            "{name}: {n:?}"
        );
        slurm.end_job(job);
    }
    assert!(slurm.killed_jobs().is_empty());

    // The plugin's status through the same proxy: nothing needs attention.
    let out = command(&kubectl_mountguard)
        .env("KUBECONFIG", sys.cluster.kubeconfig_path())
        .args(["status", "--namespace", "slurm"])
        .output()
        .await
        .unwrap();
    let (stdout, stderr) = output_text(&out);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("no verdict needs attention"), "{stdout}");
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_gate_times_out_naming_the_node_and_the_pin_nobody_may_release() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start(
        "on",
        &["--slurm-jwt-key-secret", &jwt, "--replace-pinning-pods"],
    )
    .await;
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    // A pod that is not a NodeSet pod pins the old entry on node-0:
    // remediation may not replace it, even with --replace-pinning-pods.
    add_pinning_pod(&api, "node-0").await.unwrap();
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    let (key, uid) = rotate_carrying_labels(&api);
    // Remediation repairs workers 1 and 2; worker 0 stays pinned.
    crate::harness::wait(
        &sys,
        "workers 1 and 2 repaired",
        Duration::from_secs(120),
        || {
            let done =
                (1..pods.len()).all(|i| served_and_responding(&sys.cluster, i, &pods[i].1, &key));
            async move { done.then_some(()) }
        },
    )
    .await;
    let started = Instant::now();
    let out = command(&binary("mountguard-controller").unwrap())
        .args(["wait", TARGET, "--uid", &uid, "--url", &sys.metrics_base()])
        .args(["--token", mountguard_tests::mountguard::STATUS_READER_TOKEN])
        .args(["--timeout", "20s", "--interval", "500ms"])
        .output()
        .await
        .unwrap();
    let elapsed = started.elapsed();
    let (stdout, stderr) = output_text(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "gate: {stdout}\n{stderr}\n{}",
        sys.logs()
    );
    assert!(elapsed >= Duration::from_secs(20), "{elapsed:?}");
    assert!(
        stdout.starts_with(&format!("{TARGET}: timed out after")),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.starts_with(&format!("slurm/{}", pods[0].0)))
        .unwrap_or_else(|| panic!("no row for {}: {stdout}", pods[0].0));
    for part in ["node-0", "Stale/ImmutableCachePinned", PINNING_POD] {
        assert!(row.contains(part), "{part} missing in {row:?}\n{stdout}");
    }
    // The pin itself is a consumer on node-0 and is listed too.
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(&format!("slurm/{PINNING_POD}")) && l.contains("node-0")),
        "{stdout}"
    );
    // The repaired workers are not what the gate complains about.
    assert!(
        !stdout
            .lines()
            .any(|l| l.starts_with(&format!("slurm/{}", pods[1].0))),
        "{stdout}"
    );
    assert!(stderr.contains("consumers verified"), "{stderr}");
    sys.shutdown().await;
}

async fn exit_of(args: &[&str]) -> (ExitStatus, String) {
    let out = command(&binary("mountguard-controller").unwrap())
        .args(args)
        .output()
        .await
        .unwrap();
    let (o, e) = output_text(&out);
    (out.status, format!("{o}{e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_exits_2_on_bad_input_and_when_the_controller_is_unreachable() {
    let (s, text) = exit_of(&["wait", "secret/only-namespace"]).await;
    assert_eq!(s.code(), Some(2), "{text}");
    assert!(text.contains("KIND/NAMESPACE/NAME"), "{text}");
    let (s, text) = exit_of(&["wait", TARGET, "--timeout", "soon"]).await;
    assert_eq!(s.code(), Some(2), "{text}");
    let addr = mountguard_tests::mountguard::free_addr().unwrap();
    let (s, text) = exit_of(&[
        "wait",
        TARGET,
        "--timeout",
        "5s",
        "--url",
        &format!("http://{addr}"),
    ])
    .await;
    assert_eq!(s.code(), Some(2), "{text}");
    assert!(text.contains("error:"), "{text}");
    // The plugin without a reachable API server: 2 as well.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {{server: \"http://{addr}\"}}\n\
             contexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{}}\n"
        ),
    )
    .unwrap();
    let out = command(&kubectl_plugin(dir.path()).unwrap())
        .env("KUBECONFIG", &kubeconfig)
        .args(["wait", TARGET, "--timeout", "5s"])
        .output()
        .await
        .unwrap();
    let (o, e) = output_text(&out);
    assert_eq!(out.status.code(), Some(2), "{o}{e}");
    assert!(e.contains("service proxy"), "{e}");
}
