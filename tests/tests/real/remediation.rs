//! Remediation on the real control plane: the same test body as the
//! cluster in a box's (tests/tests/shared), here with the real API
//! server's Eviction API and the real disruption controller keeping the
//! workers' PDB status, the node doubles holding the kubelet's immutable
//! pin, and the NodeSet, operator and slurmrestd doubles as clients of the
//! real API server.

use std::time::Duration;

use mountguard_tests::cluster::{PDB, SLURM_NAMESPACE};
use mountguard_tests::real::raw;
use mountguard_tests::scenario::{PINNING_POD, pinning_pod};

use crate::harness::{NAMESPACE, RealSystem, wait};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_a_pinned_cache_is_reported_not_looped_while_the_other_workers_are_repaired() {
    let sys = RealSystem::start_remediation(3, false).await;
    crate::shared::remediation::pinned_cache_is_reported_not_looped(
        &sys,
        pinning_pod("node-0"),
        PINNING_POD,
    )
    .await;

    // What only the real programs show. The evictions went through the
    // real Eviction API (pods/eviction, 201), for the two repaired workers
    // only, and the controller deleted no pod itself.
    let evicted = sys.evicted_never_deleted();
    assert_eq!(evicted.len(), 2, "{evicted:?}");
    assert!(
        !evicted.iter().any(|p| p == "slurm-worker-slinky-0"),
        "{evicted:?}"
    );
    // The PDB's status is the real disruption controller's (nothing else
    // in the rig writes it).
    let client = sys.client.clone();
    wait(
        &sys,
        "the PDB status from the disruption controller",
        Duration::from_secs(30),
        || {
            let client = client.clone();
            async move {
                let (_, pdb) = raw(
                    &client,
                    "GET",
                    &format!(
                        "/apis/policy/v1/namespaces/{SLURM_NAMESPACE}/poddisruptionbudgets/{PDB}"
                    ),
                    None,
                )
                .await
                .ok()?;
                (pdb["status"]["observedGeneration"].as_i64() >= Some(1)
                    && pdb["status"]["disruptionsAllowed"].is_number())
                .then_some(())
            }
        },
    )
    .await;
    // The controller acted as the holder of a real coordination.k8s.io
    // Lease (the chart scenario runs two replicas: leader election).
    let (code, lease) = raw(
        &sys.client,
        "GET",
        &format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/mountguard-controller"
        ),
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{lease}");
    assert_eq!(
        lease["spec"]["holderIdentity"],
        crate::harness::CONTROLLER_POD,
        "{lease}"
    );
    sys.shutdown().await;
}

/// With the operator double's rules: the slurmd preStop hook run by the
/// node doubles on the real API server's graceful deletions (evictions),
/// and syncCordon reading the real pods and Nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_a_stale_slurm_key_is_repaired_against_the_operators_rules_with_no_node_open_before_verification()
 {
    let sys = RealSystem::start_remediation(3, true).await;
    crate::shared::operator::stale_key_is_repaired_against_the_operators_rules(&sys).await;
    sys.shutdown().await;
}

/// Two replicas on the chart's real `coordination.k8s.io` Lease: the
/// leader killed while an attempt waits on a job; the other takes the
/// Lease once it expires and finishes the attempt once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_a_leader_failover_in_the_middle_of_an_attempt_finishes_it_once() {
    let mut sys = RealSystem::start_remediation(3, true).await;
    crate::shared::operator::leader_failover_mid_attempt_finishes_it_once(&mut sys).await;
    let (code, lease) = raw(
        &sys.client,
        "GET",
        &format!(
            "/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/mountguard-controller"
        ),
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{lease}");
    assert!(
        lease["spec"]["leaseTransitions"].as_i64() >= Some(1),
        "the Lease changed hands: {lease}"
    );
    sys.shutdown().await;
}

/// A PDB refusing every eviction of a slurmd pod: the real Eviction API's
/// 429, decided on the real disruption controller's PDB status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_a_pdb_refusal_is_retried_never_turned_into_a_delete() {
    let sys = RealSystem::start_remediation(3, false).await;
    crate::shared::remediation::pdb_refusal_is_retried_never_turned_into_a_delete(&sys).await;
    // The refusals were the real API server's 429s.
    let refused = sys
        .controller_requests()
        .iter()
        .filter(|r| r.resource == "pods" && r.subresource == "eviction" && r.code == 429)
        .count();
    assert!(refused >= 2, "429s in the audit log: {refused}");
    sys.shutdown().await;
}

/// Everything Fresh: a controller restart makes no Slurm write and no
/// eviction (the audit log says which pods the controller evicted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_a_controller_restart_with_everything_fresh_writes_nothing() {
    let mut sys = RealSystem::start_remediation(3, true).await;
    crate::shared::operator::restart_with_everything_fresh_writes_nothing(&mut sys).await;
    sys.shutdown().await;
}
