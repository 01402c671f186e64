//! Both sides of the boundary, end to end: the real controller with
//! slurmrestd configured (dry-run, no NodeSet opted in) against the
//! slurmrestd double, after the seed's rotation (the immutable
//! `slurm-auth-slurm` recreated with a new key, slurmctld restarted on it,
//! every slurmd still on the old one). Each worker's Stale `slurm-etc`
//! verdict says what Slurm shows of its node: no registration since the
//! rotation, whether the nodes are read one by one (three workers) or in
//! one list (five due at once). A slurmrestd that refuses the controller's
//! token leaves the verdicts Stale and says "Slurm not read".

use std::time::Duration;

use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{JWT_SECRET, SLURM_NAMESPACE};
use mountguard_tests::scenario::{rotate_auth_key, wait_for_slurmd_pods};
use serde_json::{Value, json};

use crate::harness::{Options, System, wait_all_fresh};
use crate::remediation::remediation_args;
use crate::support::{wait_events, wait_verdicts};

/// The system with `nodes` workers and the controller remediating in
/// dry-run against the slurmrestd double, authenticated by `flag` with
/// the value `secret` gives (which may first create what it names); the
/// slurmd pods' hosts, once every verdict is Fresh.
async fn dry_run(
    nodes: usize,
    flag: &str,
    secret: impl FnOnce(&System) -> String,
) -> (System, Vec<String>) {
    let mut sys = System::start(Options {
        nodes,
        ..Options::default()
    })
    .await;
    let value = secret(&sys);
    let url = sys.cluster.slurmrestd_url();
    sys.opts.extra_controller_args = remediation_args(&url, "dry-run", &[flag, &value]);
    sys.start_controller().await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts = pods.into_iter().map(|(h, _)| h).collect();
    wait_all_fresh(&sys).await;
    (sys, hosts)
}

/// The `volume slurm-etc` items of the slurmd pods `hosts`, once every one
/// is Stale and `ok` holds for it.
async fn key_items(sys: &System, hosts: &[String], ok: fn(&Value) -> bool) -> Vec<Value> {
    let what = "every worker's slurm-etc Stale with its Slurm side";
    let query = "namespace=slurm";
    wait_verdicts(sys, what, Duration::from_secs(60), query, |doc| {
        let items: Vec<Value> = doc["verdicts"]
            .as_array()?
            .iter()
            .filter(|v| v["subject"] == "volume slurm-etc" && v["state"] == "Stale")
            .filter(|v| ok(v))
            .cloned()
            .collect();
        (items.len() == hosts.len()).then_some(items)
    })
    .await
}

/// Three workers: each node is read with `GET node/{name}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_workers_verdict_says_its_node_has_not_registered_since_the_rotation() {
    not_registered_since_the_rotation(3).await;
}

/// Five workers due at once: read with one `GET nodes/`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_stale_workers_are_read_with_one_list_and_say_the_same() {
    not_registered_since_the_rotation(5).await;
}

async fn not_registered_since_the_rotation(nodes: usize) {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let (sys, hosts) = dry_run(nodes, "--slurm-jwt-key-secret", |_| jwt).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    // Nothing needs Slurm's side while every worker is fresh.
    let doc = sys.verdicts("namespace=slurm&all=1").await;
    for v in doc["verdicts"].as_array().unwrap() {
        assert!(v.get("slurm").is_none(), "{v}");
    }
    rotate_auth_key(&api).unwrap();
    let items = key_items(&sys, &hosts, |v| v["slurm"]["finding"] == "NotRegistered").await;
    for v in &items {
        let host = v["pod"].as_str().unwrap();
        let side = &v["slurm"];
        assert_eq!(side["node"], host, "{v}");
        // slurmctld restarted on the new key holds no registration of a
        // slurmd still on the old one; Slurm's state proves nothing.
        assert!(side.get("slurmdStartTime").is_none(), "{v}");
        assert!(side["contentChangedAt"].is_string(), "{v}");
        let n = slurm.node(host).unwrap();
        assert!(!n.state.iter().any(|s| s == "DOWN"), "{n:?}");
        let advice = v["advice"].as_str().unwrap();
        assert!(
            advice.starts_with("Replace the pod")
                && advice.contains(&format!("Slurm: node {host} has not registered since"))
                && advice.ends_with(side["message"].as_str().unwrap()),
            "{advice}"
        );
    }
    // The StaleMount Events end with Slurm's side as read before the
    // verdict turned Stale (it was read while Propagating).
    let workers = hosts.len();
    let what = "StaleMount Events of the workers";
    let events = wait_events(&sys, what, Duration::from_secs(30), |all| {
        let ev: Vec<String> = all
            .into_iter()
            .filter(|e| e.reason == "StaleMount" && e.message.contains("volume slurm-etc"))
            .map(|e| e.message)
            .collect();
        (ev.len() >= workers).then_some(ev)
    })
    .await;
    for m in &events {
        let slurm_side = m.contains("has not registered since") || m.contains("Slurm not read yet");
        assert!(m.contains(". Replace the pod") && slurm_side, "{events:?}");
    }
    let registered = |m: &String| m.contains("has not registered since");
    assert!(events.iter().any(registered), "{events:?}");
    // Read only: nothing written to Slurm.
    assert!(slurm.writes().is_empty(), "{:?}", slurm.writes());
    assert_eq!(hosts.len(), nodes);
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_slurm_read_says_so_and_changes_no_verdict() {
    let bogus = "slurm-bogus-token";
    let nodes = Options::default().nodes;
    let (sys, hosts) = dry_run(nodes, "--slurm-token-secret", |sys| {
        let token = json!({"metadata": {"name": bogus}, "data": {"SLURM_JWT": "bm90LWEtdG9rZW4="}});
        let secrets = &resources::SECRETS;
        sys.cluster
            .api()
            .create(secrets, SLURM_NAMESPACE, token)
            .unwrap();
        format!("{SLURM_NAMESPACE}/{bogus}")
    })
    .await;
    rotate_auth_key(&sys.cluster.api()).unwrap();
    let items = key_items(&sys, &hosts, |v| v["slurm"]["finding"] == "NotRead").await;
    for v in &items {
        let message = v["slurm"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("Slurm not read: slurmrestd")
                && v["slurm"]["readAt"].is_string()
                && v["advice"].as_str().unwrap().ends_with(message),
            "{v}"
        );
    }
    sys.shutdown().await;
}
