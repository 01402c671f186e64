//! Remediation with the real kubelet running every node's pods: the
//! seed rotation's shared test body (tests/tests/shared) on real kubelets
//! (fake CRI runtime), with the NodeSet and slurmrestd doubles as clients
//! of the real API server. The real kubelet's Secret manager holds the
//! pin, its volume manager writes the replacements' volumes, and the
//! bytes mountguard verifies are the ones it wrote.

use mountguard_tests::cluster::{AUTH_SECRET, NODESET, SLURM_NAMESPACE, decode_key};
use mountguard_tests::real::kubelet::MAX_RESYNC;
use mountguard_tests::real::raw;
use mountguard_tests::scenario::{PINNING_POD, pinning_pod};
use serde_json::json;

use crate::harness::RealSystem;

/// node-0 also runs `slurm-auth-check`, which references the immutable
/// `slurm-auth-slurm`: after the rotation the real kubelet keeps serving
/// the old key there, so mountguard reports `ImmutableCachePinned` naming
/// it and makes no attempt; node-1's worker is drained, evicted through
/// the real Eviction API, recreated by the NodeSet double, verified on the
/// node and undrained, and its replacement holds the new key the real
/// kubelet wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_remediation_repairs_the_unpinned_worker_and_reports_the_pinned_one() {
    let sys = RealSystem::start_remediation_on_real_kubelets(2, false).await;
    let mut pin = pinning_pod("node-0");
    pin["spec"]["automountServiceAccountToken"] = json!(false);
    crate::shared::remediation::pinned_cache_is_reported_not_looped(&sys, pin, PINNING_POD).await;

    // The bytes on the nodes, read from the real kubelets' roots: the
    // repaired worker was served the current key, the pinned one the old.
    let (code, secret) = raw(
        &sys.client,
        "GET",
        &format!("/api/v1/namespaces/{SLURM_NAMESPACE}/secrets/{AUTH_SECRET}"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{secret}");
    let current = decode_key(&secret, "slurm.key").expect("the rotated key");
    for (i, want_current) in [(0, false), (1, true)] {
        let name = format!("{NODESET}-{i}");
        let (_, pod) = raw(
            &sys.client,
            "GET",
            &format!("/api/v1/namespaces/{SLURM_NAMESPACE}/pods/{name}"),
            None,
        )
        .await
        .unwrap();
        let uid = pod["metadata"]["uid"].as_str().expect("a running pod");
        let served = std::fs::read(crate::kubelet_support::volume_file(
            &sys,
            i,
            uid,
            "projected",
            "slurm-etc/slurm.key",
        ))
        .unwrap_or_default();
        assert!(!served.is_empty(), "{name}: no slurm.key on node-{i}");
        assert_eq!(
            served == current,
            want_current,
            "{name} on node-{i}: served the current key: {}",
            served == current
        );
    }
    // Evicted through the real Eviction API, never deleted by the
    // controller.
    let evicted = sys.evicted_never_deleted();
    assert_eq!(evicted, [format!("{NODESET}-1")], "{evicted:?}");
    sys.shutdown().await;
}

/// The stale `slurm.key` repaired against the operator double's rules on
/// real kubelets: the real kubelet runs the Slinky worker's preStop
/// command on the eviction's graceful deletion (through fakecri's exec
/// hook), and no node is open to jobs before mountguard's verification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_a_stale_slurm_key_is_repaired_against_the_operators_rules_with_the_kubelets_prestop()
 {
    let sys = RealSystem::start_remediation_on_real_kubelets(3, true).await;
    crate::shared::operator::stale_key_is_repaired_against_the_operators_rules(&sys).await;
    sys.shutdown().await;
}

/// A stale hooks ConfigMap read at start, repaired on real kubelets
/// against the operator double's rules: the key is current, so the
/// Slinky worker's preStop command, run by the real kubelet (through
/// fakecri's exec hook) when the eviction's graceful deletion reaches it,
/// authenticates and sets DOWN with the operator's reason; mountguard
/// holds the node again and releases it only after the verification.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kubelet_a_stale_hooks_configmap_is_repaired_through_the_kubelets_prestop_hook() {
    let mut sys = RealSystem::start_remediation_on_real_kubelets(3, true).await;
    // A ConfigMap change reaches a running pod's volume at the pod's next
    // sync, up to `MAX_RESYNC` later (the rig's kubelet configuration): a
    // grace period above that, as an operator would set it, so the hooks
    // volume is Propagating, then Frozen/ReadAtStart once the kubelet
    // rewrote it, never Stale in between.
    let grace = format!("{}s", MAX_RESYNC.as_secs() * 2);
    sys.restart_controller_with(&[("MOUNTGUARD_GRACE", &grace)])
        .await;
    crate::shared::operator::stale_hooks_read_at_start_are_repaired_through_the_prestop_hook(
        &sys, false,
    )
    .await;
    // The real kubelet asked its runtime to run each evicted slurmd pod's
    // preStop command, once per pod, on the pod's node, in the slurmd
    // container.
    let prestop = mountguard_tests::real::slinky::slurmd_prestop_command();
    for a in mountguard_tests::rig::attempts(&sys) {
        let node: usize = a.node.trim_start_matches("node-").parse().unwrap();
        let calls: Vec<_> = sys.kubelets[node]
            .exec_calls()
            .into_iter()
            .filter(|c| c.pod == format!("{SLURM_NAMESPACE}/{}", a.pod))
            .collect();
        assert_eq!(calls.len(), 1, "{}: {calls:?}", a.pod);
        assert_eq!(calls[0].container, "slurmd", "{calls:?}");
        assert_eq!(json!(calls[0].command), prestop, "{calls:?}");
    }
    sys.shutdown().await;
}
