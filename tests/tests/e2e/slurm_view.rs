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
use mountguard_tests::mountguard::recorded_events;
use mountguard_tests::scenario::{rotate_auth_key, wait_for_slurmd_pods};
use serde_json::{Value, json};

use crate::harness::{Options, System, wait, wait_all_fresh, wait_verdicts};
use crate::remediation::remediation_args;

/// The `volume slurm-etc` items of the slurmd pods `hosts`, once every one
/// is Stale and `ok` holds for it.
async fn key_items(sys: &System, hosts: &[String], ok: fn(&Value) -> bool) -> Vec<Value> {
    wait_verdicts(
        sys,
        "every worker's slurm-etc Stale with its Slurm side",
        Duration::from_secs(60),
        "namespace=slurm",
        |doc| {
            let items: Vec<Value> = doc["verdicts"]
                .as_array()?
                .iter()
                .filter(|v| v["subject"] == "volume slurm-etc" && v["state"] == "Stale")
                .filter(|v| ok(v))
                .cloned()
                .collect();
            (items.len() == hosts.len()).then_some(items)
        },
    )
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
    let mut sys = System::start(Options {
        nodes,
        ..Options::default()
    })
    .await;
    let url = sys.cluster.slurmrestd_url();
    sys.opts.extra_controller_args =
        remediation_args(&url, "dry-run", &["--slurm-jwt-key-secret", &jwt]);
    sys.start_controller().await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|(h, _)| h.clone()).collect();
    wait_all_fresh(&sys).await;
    // Nothing needs Slurm's side while every worker is fresh.
    let doc = sys.verdicts("namespace=slurm&all=1").await;
    assert!(
        doc["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v.get("slurm").is_none()),
        "{doc}"
    );
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
    let events = wait(
        &sys,
        "StaleMount Events of the workers",
        Duration::from_secs(30),
        || {
            let ev: Vec<String> = recorded_events(&api)
                .into_iter()
                .filter(|e| e.reason == "StaleMount" && e.message.contains("volume slurm-etc"))
                .map(|e| e.message)
                .collect();
            async move { (ev.len() >= workers).then_some(ev) }
        },
    )
    .await;
    assert!(
        events.iter().all(|m| m.contains(". Replace the pod")
            && (m.contains("has not registered since") || m.contains("Slurm not read yet"))),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|m| m.contains("has not registered since")),
        "{events:?}"
    );
    // Read only: nothing written to Slurm.
    assert!(slurm.writes().is_empty(), "{:?}", slurm.writes());
    assert_eq!(hosts.len(), nodes);
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_slurm_read_says_so_and_changes_no_verdict() {
    let bogus = "slurm-bogus-token";
    let mut sys = System::start(Options::default()).await;
    let api = sys.cluster.api();
    api.create(
        &resources::SECRETS,
        SLURM_NAMESPACE,
        json!({"metadata": {"name": bogus}, "data": {"SLURM_JWT": "bm90LWEtdG9rZW4="}}),
    )
    .unwrap();
    let url = sys.cluster.slurmrestd_url();
    let secret = format!("{SLURM_NAMESPACE}/{bogus}");
    sys.opts.extra_controller_args =
        remediation_args(&url, "dry-run", &["--slurm-token-secret", &secret]);
    sys.start_controller().await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|(h, _)| h.clone()).collect();
    wait_all_fresh(&sys).await;
    rotate_auth_key(&api).unwrap();
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
