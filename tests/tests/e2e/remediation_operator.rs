//! Remediation against the Slinky operator's own Slurm writes (the
//! cluster's `slinky_operator_rules`: the slurmd preStop hook and
//! syncCordon of slurm-operator v1.2.1), for a stale `slurm.key` (the
//! hook cannot authenticate) and a stale hooks ConfigMap read at start
//! (the hook sets DOWN with the operator's reason). Every node's Slurm
//! state is sampled throughout: from mountguard's drain until the
//! replacement is verified, no node is ever open to jobs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use mountguard_core::remediation::{Attempt, Phase};
use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{HOOKS_CONFIGMAP, JWT_SECRET, NODESET, SLURM_NAMESPACE};
use mountguard_tests::operator::PRESTOP_REASON;
use mountguard_tests::scenario::{rotate_auth_key, wait_for_slurmd_pods};
use mountguard_tests::slurmrestd::{NodeView, SlurmHandle};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::harness::{Options, System, wait, wait_all_fresh};
use crate::remediation::{FULL_RUN, attempts, in_service, opt_in, remediation_args};

type Samples = Arc<Mutex<Vec<(Timestamp, String, NodeView)>>>;

/// Samples every host's Slurm node every 20 ms until aborted.
fn sample(slurm: SlurmHandle, hosts: Vec<String>) -> (Samples, JoinHandle<()>) {
    let out: Samples = Arc::default();
    let o = out.clone();
    let task = tokio::spawn(async move {
        loop {
            for h in &hosts {
                if let Some(n) = slurm.node(h) {
                    o.lock().unwrap().push((Timestamp::now(), h.clone(), n));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (out, task)
}

/// A job could start: neither DRAIN nor DOWN.
fn open_to_jobs(n: &NodeView) -> bool {
    !n.state.iter().any(|s| s == "DRAIN" || s == "DOWN")
}

/// Checks one attempt against the samples of its node: from the first
/// sample with our drain until it entered Undraining (verified), the node
/// is never open to jobs. Returns the reasons seen in that window, in
/// order (each change once).
fn assert_closed_until_verified(samples: &Samples, a: &Attempt) -> Vec<String> {
    let verified = a
        .history
        .iter()
        .find(|e| e.phase == Phase::Undraining)
        .map(|e| e.at)
        .expect("verified");
    let s = samples.lock().unwrap();
    let mine: Vec<&(Timestamp, String, NodeView)> =
        s.iter().filter(|(_, h, _)| *h == a.slurm_node).collect();
    let from = mine
        .iter()
        .find(|(_, _, n)| n.reason == a.drain_reason)
        .map(|(t, _, _)| *t)
        .expect("our drain was seen");
    let mut reasons = Vec::new();
    for (t, _, n) in mine.iter().filter(|(t, _, _)| *t >= from && *t < verified) {
        assert!(
            !open_to_jobs(n),
            "{}: open to jobs at {t} between our drain ({from}) and the verification ({verified}): {n:?}",
            a.slurm_node
        );
        if reasons.last() != Some(&n.reason) {
            reasons.push(n.reason.clone());
        }
    }
    reasons
}

async fn start_with_operator(extra: &[&str]) -> System {
    let mut sys = System::start(Options {
        operator_rules: true,
        ..Options::default()
    })
    .await;
    let url = sys.cluster.slurmrestd_url();
    sys.opts.extra_controller_args = remediation_args(&url, "on", extra);
    sys.start_controller().await;
    sys
}

async fn all_succeeded(sys: &System, hosts: &[String]) -> Vec<Attempt> {
    let all = wait(
        sys,
        "every worker repaired",
        Duration::from_secs(300),
        || {
            let a = attempts(sys);
            async move { (a.len() == 3 && a.iter().all(|a| !a.is_open())).then_some(a) }
        },
    )
    .await;
    for a in &all {
        assert_eq!(a.phase, Phase::Succeeded, "{a:?}\n{}", sys.logs());
        assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
    }
    let slurm = sys.cluster.slurm();
    wait(
        sys,
        "every node in service",
        Duration::from_secs(30),
        || {
            let ok = hosts
                .iter()
                .all(|h| slurm.node(h).is_some_and(|n| in_service(&n)));
            async move { ok.then_some(()) }
        },
    )
    .await;
    assert!(slurm.killed_jobs().is_empty(), "{:?}", slurm.killed_jobs());
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_slurm_key_is_repaired_against_the_operators_rules_with_no_node_open_before_verification()
 {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(&sys).await;
    let (samples, sampler) = sample(sys.cluster.slurm(), hosts.clone());
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    let all = all_succeeded(&sys, &hosts).await;
    sampler.abort();
    for a in &all {
        let reasons = assert_closed_until_verified(&samples, a);
        // The hook could not authenticate with the stale key: only our
        // reason was ever on the node in that window.
        assert_eq!(reasons, vec![a.drain_reason.clone()], "{a:?}");
        assert!(!a.prestop_down, "{a:?}");
    }
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_hooks_configmap_read_at_start_is_repaired_against_the_operators_prestop_and_undrain()
 {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    // slurmd reads its hooks at start: say so on the template and on the
    // running pods.
    let ann = json!({"metadata": {"annotations": {"mountguard.io/read-at-start": "hooks"}}});
    api.merge_patch(
        &resources::NODESETS,
        SLURM_NAMESPACE,
        NODESET,
        &json!({"spec": {"template": ann}}),
        None,
    )
    .unwrap();
    for h in &hosts {
        api.merge_patch(&resources::PODS, SLURM_NAMESPACE, h, &ann, None)
            .unwrap();
    }
    wait_all_fresh(&sys).await;
    let (samples, sampler) = sample(sys.cluster.slurm(), hosts.clone());
    opt_in(&sys);
    api.merge_patch(
        &resources::CONFIGMAPS,
        SLURM_NAMESPACE,
        HOOKS_CONFIGMAP,
        &json!({"data": {"99-mountguard.sh": "#!/bin/sh\necho new hooks\n"}}),
        None,
    )
    .unwrap();
    let all = all_succeeded(&sys, &hosts).await;
    sampler.abort();
    for a in &all {
        assert!(
            a.findings.iter().any(|f| f.state == "Frozen/ReadAtStart"),
            "{a:?}"
        );
        let reasons = assert_closed_until_verified(&samples, a);
        assert!(
            reasons
                .iter()
                .all(|r| *r == a.drain_reason || r == PRESTOP_REASON),
            "only our reason and the hook's: {reasons:?}"
        );
        // The hook authenticated (the key is current): mountguard saw its
        // DOWN and reason replace ours, and drained again with its own.
        assert!(a.prestop_down, "{a:?}");
        let our_drains = sys
            .cluster
            .slurm()
            .writes()
            .iter()
            .filter(|w| {
                w.node == a.slurm_node
                    && w.body == json!({"state": ["DRAIN"], "reason": a.drain_reason})
            })
            .count();
        assert!(our_drains >= 2, "drained, then drained again: {our_drains}");
    }
    // Released by a RESUME after the verification, never by the
    // operator's UNDRAIN of a node that still carried our reason.
    let writes = sys.cluster.slurm().writes();
    for h in &hosts {
        assert!(
            writes
                .iter()
                .any(|w| w.node == *h && w.body == json!({"state": ["RESUME"]})),
            "{h}: {writes:?}"
        );
    }
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_with_everything_fresh_writes_nothing_to_slurm_and_evicts_nothing() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let mut sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    let slurm = sys.cluster.slurm();
    let api = sys.cluster.api();
    let evictions = || {
        api.requests()
            .iter()
            .filter(|r| r.uri.contains("/eviction"))
            .count()
    };
    for round in 0..2 {
        sys.start_controller().await;
        wait_all_fresh(&sys).await;
        // Several executor rounds (and a sweep after recovery) later.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(
            slurm.writes().is_empty(),
            "restart {round}: {:?}",
            slurm.writes()
        );
        assert_eq!(evictions(), 0, "restart {round}");
        assert!(attempts(&sys).is_empty(), "restart {round}");
    }
    for (h, _) in &pods {
        assert!(in_service(&slurm.node(h).unwrap()), "{h}");
    }
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_failover_in_the_middle_of_an_attempt_finishes_it_once() {
    const NS: &str = "mountguard";
    const LEASE: &str = "mountguard-failover-e2e";
    let mut sys = System::start(Options {
        operator_rules: true,
        ..Options::default()
    })
    .await;
    if let Some(mut c) = sys.controller.take() {
        c.kill();
    }
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    for name in ["ctl-a", "ctl-b"] {
        api.create(
            &resources::PODS,
            NS,
            json!({"metadata": {"name": name, "labels": {"app.kubernetes.io/name": "mountguard-controller"}},
                   "spec": {"containers": [{"name": "controller", "image": "mountguard:e2e"}]}}),
        )
        .unwrap();
    }
    let url = sys.cluster.slurmrestd_url();
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    sys.opts.extra_controller_args =
        remediation_args(&url, "on", &["--slurm-jwt-key-secret", &jwt]);
    let election = |pod: &str| -> Vec<String> {
        [
            "--leader-election",
            "--lease-name",
            LEASE,
            "--pod-name",
            pod,
            "--pod-namespace",
            NS,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut a = sys
        .spawn_controller(
            "controller-a",
            sys.report_addr,
            sys.metrics_addr,
            &election("ctl-a"),
        )
        .await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(&sys).await;
    let (samples, sampler) = sample(slurm.clone(), hosts.clone());
    let jobs: Vec<u32> = hosts.iter().map(|h| slurm.start_job(h, 1)).collect();
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    let first = wait(
        &sys,
        "an attempt in Drained",
        Duration::from_secs(120),
        || {
            let a = attempts(&sys)
                .into_iter()
                .find(|a| a.phase == Phase::Drained);
            async move { a }
        },
    )
    .await;
    // The leader dies mid-attempt; the other replica, on the same
    // addresses, takes the Lease once it expires and carries on.
    a.kill();
    let mut b = sys
        .spawn_controller(
            "controller-b",
            sys.report_addr,
            sys.metrics_addr,
            &election("ctl-b"),
        )
        .await;
    wait(
        &sys,
        "replica B acting",
        Duration::from_secs(60),
        || async {
            let doc = sys.verdicts("").await;
            (doc["acting"].as_bool() == Some(true)).then_some(())
        },
    )
    .await;
    for j in jobs {
        slurm.end_job(j);
    }
    let all = all_succeeded(&sys, &hosts).await;
    sampler.abort();
    assert!(
        all.iter().any(|x| x.id == first.id),
        "the same attempt went on: {all:?}"
    );
    for x in &all {
        assert_closed_until_verified(&samples, x);
        let evictions = api
            .requests()
            .iter()
            .filter(|r| r.uri.contains(&format!("/pods/{}/eviction", x.pod)))
            .count();
        assert_eq!(evictions, 1, "{}: evicted once", x.pod);
    }
    b.kill();
    sys.shutdown().await;
}
