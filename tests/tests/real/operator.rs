//! The real Slinky operator (slurm-operator v1.2.1's `cmd/manager`, built
//! from checkouts by scripts/upstream.sh; `mountguard_tests::real::operator`)
//! on the real control plane, in place of the operator and NodeSet
//! doubles: its NodeSet controller makes and replaces the slurmd pods
//! (placed by the real scheduler), its slurm client makes its own Slurm
//! writes (pod info, cordon, the reason rules), the node doubles run the
//! slurmd preStop hook of its worker builder, and the slurmrestd double
//! plays slurmrestd and slurmctld. The bodies are the ones the operator
//! double runs (tests/tests/shared).
//!
//! Needs `MOUNTGUARD_SLINKY_OPERATOR_DIR` (scripts/test.sh sets it when
//! scripts/upstream.sh built the operator from checkouts, and leaves these
//! tests out with a SKIPPED line otherwise).

use mountguard_tests::rig::Rig;
use mountguard_tests::scenario::{PINNING_POD, pinning_pod};

use crate::harness::RealSystem;

/// Every request the real operator's slurm client made was one the
/// slurmrestd double serves (a gap would be a difference to close).
fn served_everything(sys: &RealSystem) {
    let unserved = sys.slurm().unserved();
    assert!(
        unserved.is_empty(),
        "requests the slurmrestd double does not serve: {unserved:?}"
    );
}

/// The seed rotation: the immutable `slurm.key` Secret deleted and
/// recreated under its name while another pod on one worker's node keeps
/// referencing it. mountguard reports that worker pinned (naming the pod)
/// and repairs the two others through the real operator's pod
/// replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_operator_seed_rotation_reports_the_pinned_worker_and_repairs_the_others() {
    let sys = RealSystem::start_with_real_operator(3).await;
    crate::shared::remediation::pinned_cache_is_reported_not_looped(
        &sys,
        pinning_pod("node-0"),
        PINNING_POD,
    )
    .await;
    served_everything(&sys);
    sys.shutdown().await;
}

/// A stale `slurm.key` on every worker: each drained by mountguard,
/// evicted, replaced by the real operator, verified Fresh on its node and
/// undrained; no node open to jobs between the drain and the verification,
/// and the operator's preStop hook could not authenticate with the stale
/// key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_operator_stale_slurm_key_is_repaired_with_no_node_open_before_verification() {
    let sys = RealSystem::start_with_real_operator(3).await;
    crate::shared::operator::stale_key_is_repaired_against_the_operators_rules(&sys).await;
    served_everything(&sys);
    sys.shutdown().await;
}

/// The hooks ConfigMap, read by slurmd at start, changes: every worker is
/// Frozen and repaired; the real preStop hook's DOWN (the key is current)
/// replaces mountguard's hold, which mountguard holds again.
///
/// The nodes respond here, so the operator's syncCordon acts on them, and
/// it can undo a fresh DRAIN (it reads the reason and then the state from
/// its slurm-client cache, two reads apart): with the default
/// `--drain-state drain` this failed 2 of 11 runs (docs/testing.md). The
/// controller runs with `--drain-state fail`, which that undrain never
/// touches.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_operator_stale_hooks_read_at_start_are_repaired_through_its_prestop_hook() {
    let mut sys = RealSystem::start_with_real_operator(3).await;
    sys.restart_controller_with(&[("MOUNTGUARD_DRAIN_STATE", "fail")])
        .await;
    crate::shared::operator::stale_hooks_read_at_start_are_repaired_through_the_prestop_hook(
        &sys, true,
    )
    .await;
    served_everything(&sys);
    sys.shutdown().await;
}

/// Everything Fresh: a controller restart makes no Slurm write and no
/// eviction (the operator's own pod-info writes aside).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_operator_controller_restart_with_everything_fresh_writes_nothing() {
    let mut sys = RealSystem::start_with_real_operator(3).await;
    crate::shared::operator::restart_with_everything_fresh_writes_nothing(&mut sys).await;
    served_everything(&sys);
    sys.shutdown().await;
}

/// The leader killed while an attempt waits on a job; the other replica
/// takes the Lease and finishes the attempt once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_operator_leader_failover_mid_attempt_finishes_it_once() {
    let mut sys = RealSystem::start_with_real_operator(3).await;
    crate::shared::operator::leader_failover_mid_attempt_finishes_it_once(&mut sys).await;
    served_everything(&sys);
    sys.shutdown().await;
}

/// The operator's own slurmrestd pod mounts `slurm.key` too
/// (`restapibuilder`, `restapi_app.go`): once the RestApi has a replica,
/// the seed rotation leaves the worker on that pod's node
/// `Stale/ImmutableCachePinned`, naming the slurmrestd pod, and not
/// remediated; the two other workers are repaired through the operator's
/// pod replacement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_operator_its_own_slurmrestd_pod_pins_the_worker_on_its_node() {
    use std::time::Duration;

    use mountguard_core::remediation::Phase;
    use mountguard_tests::apiserver::resources;
    use mountguard_tests::cluster::SLURM_NAMESPACE;
    use mountguard_tests::real::operator::RESTAPI;
    use mountguard_tests::rig::{attempts, opt_in, wait, wait_all_fresh, wait_for_slurmd_pods};
    use mountguard_tests::scenario::{find_verdict, rotate_auth_key, state_tag, verdicts};
    use serde_json::json;

    let sys = RealSystem::start_with_real_operator(3).await;
    let api = sys.objects();
    let workers = wait_for_slurmd_pods(&sys).await;
    let (code, body) = mountguard_tests::real::raw(
        &sys.client,
        "PATCH",
        &format!("/apis/slinky.slurm.net/v1beta1/namespaces/{SLURM_NAMESPACE}/restapis/{RESTAPI}"),
        Some(&json!({"spec": {"replicas": 1}})),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let objects = sys.objects.clone();
    let (restd, node) = wait(
        &sys,
        "the operator's slurmrestd pod running",
        Duration::from_secs(90),
        || {
            let objects = objects.clone();
            async move {
                let pods = objects
                    .try_list(&resources::PODS, Some(SLURM_NAMESPACE))
                    .ok()?;
                pods.iter()
                    .find(|p| {
                        p["metadata"]["labels"]["app.kubernetes.io/name"] == "slurmrestd"
                            && p["status"]["phase"] == "Running"
                    })
                    .and_then(|p| {
                        Some((
                            p["metadata"]["name"].as_str()?.to_string(),
                            p["spec"]["nodeName"].as_str()?.to_string(),
                        ))
                    })
            }
        },
    )
    .await;
    let node_of = |pod: &str| {
        api.get(&resources::PODS, SLURM_NAMESPACE, pod)
            .ok()
            .and_then(|p| p["spec"]["nodeName"].as_str().map(String::from))
    };
    let pinned = workers
        .iter()
        .find(|(w, _)| node_of(w).as_deref() == Some(node.as_str()))
        .map(|(w, _)| w.clone())
        .expect("a worker on every node (one per node)");
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    rotate_auth_key(&*api).unwrap();
    let base = sys.metrics_base();
    let v = wait(
        &sys,
        "two workers repaired, the third pinned by slurmrestd",
        Duration::from_secs(180),
        || {
            let base = base.clone();
            let pinned = pinned.clone();
            let done = attempts(&sys)
                .iter()
                .filter(|a| a.phase == Phase::Succeeded)
                .count();
            async move {
                let doc = verdicts(&base, "namespace=slurm").await.ok()?;
                let v = find_verdict(&doc, &pinned, "volume slurm-etc")?.clone();
                (done == 2 && state_tag(&v) == "Stale/ImmutableCachePinned").then_some(v)
            }
        },
    )
    .await;
    let by: Vec<&str> = v["pinnedBy"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str())
        .collect();
    assert!(by.iter().any(|p| p.ends_with(&restd)), "{v:#}");
    assert!(
        attempts(&sys).iter().all(|a| a.pod != pinned),
        "{:?}",
        attempts(&sys)
    );
    served_everything(&sys);
    sys.shutdown().await;
}
