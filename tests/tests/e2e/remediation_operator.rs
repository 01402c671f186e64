//! Remediation against the Slinky operator's own Slurm writes (the
//! cluster's `slinky_operator_rules`: the slurmd preStop hook and
//! syncCordon of slurm-operator v1.2.1), for a stale `slurm.key` (the
//! hook cannot authenticate) and a stale hooks ConfigMap read at start
//! (the hook sets DOWN with the operator's reason). Every node's Slurm
//! state is sampled throughout: from mountguard's drain until the
//! replacement is verified, no node is ever open to jobs. The stale-key
//! and leader-failover bodies are shared with the real control plane's
//! tier (tests/tests/shared/operator.rs).

use std::time::Duration;

use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{HOOKS_CONFIGMAP, JWT_SECRET, NODESET, SLURM_NAMESPACE};
use mountguard_tests::operator::PRESTOP_REASON;
use mountguard_tests::scenario::wait_for_slurmd_pods;
use serde_json::json;

use crate::harness::{Options, System, wait_all_fresh};
use crate::remediation::{attempts, in_service, opt_in, remediation_args};
use crate::shared::operator::{all_succeeded, assert_closed_until_verified, sample};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_slurm_key_is_repaired_against_the_operators_rules_with_no_node_open_before_verification()
 {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    crate::shared::operator::stale_key_is_repaired_against_the_operators_rules(&sys).await;
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
    let mut sys = System::start(Options {
        operator_rules: true,
        ..Options::default()
    })
    .await;
    let url = sys.cluster.slurmrestd_url();
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    sys.opts.extra_controller_args =
        remediation_args(&url, "on", &["--slurm-jwt-key-secret", &jwt]);
    crate::shared::operator::leader_failover_mid_attempt_finishes_it_once(&mut sys).await;
    sys.shutdown().await;
}
