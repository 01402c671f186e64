//! The seed rotation with remediation on, as one body for both rigs: a
//! pinning pod on node-0 keeps the kubelet's cache entry of the old
//! immutable `slurm.key`; the rotation (delete and recreate) leaves every
//! slurmd not responding; node-0 is reported `ImmutableCachePinned`
//! naming the pinning pod (one `KubeletCachePinned` Event, no attempt, no
//! loop) while the other workers are drained through slurmrestd, evicted,
//! recreated by the NodeSet (double), verified on the node by bytes and
//! undrained.

use std::time::Duration;

use mountguard_controller::remediation::Phase;
use mountguard_tests::mountguard::recorded_events;
use mountguard_tests::rig::{Rig, attempts, opt_in, wait, wait_all_fresh, wait_for_slurmd_pods};
use mountguard_tests::scenario::{
    KEY_VOLUME, add_running_pod, find_verdict, rotate_auth_key, slurmd_pod, state_tag, verdicts,
};
use serde_json::Value;

/// The phases of an attempt that succeeds, in order.
pub const FULL_RUN: [&str; 8] = [
    "Pending",
    "Draining",
    "Drained",
    "Evicting",
    "AwaitingReplacement",
    "Verifying",
    "Undraining",
    "Succeeded",
];

/// Whether a Slurm node is back in service: not drained, down or not
/// responding.
pub fn in_service(n: &mountguard_tests::slurmrestd::NodeView) -> bool {
    !n.state
        .iter()
        .any(|s| matches!(s.as_str(), "DRAIN" | "DOWN" | "NOT_RESPONDING"))
}

/// `sys` runs the controller with remediation on (jwt.key Secret,
/// remediation delay 1 s); `pin` is a pod on node-0 referencing
/// `slurm-auth-slurm`, named `pin_name`.
pub async fn pinned_cache_is_reported_not_looped<R: Rig>(sys: &R, pin: Value, pin_name: &str) {
    let api = sys.objects();
    let slurm = sys.slurm();
    let pods = wait_for_slurmd_pods(sys).await;
    add_running_pod(&*api, pin).await.unwrap();
    wait_all_fresh(sys).await;
    opt_in(sys);
    rotate_auth_key(&*api).unwrap();
    wait(
        sys,
        "nodes 1 and 2 repaired",
        Duration::from_secs(180),
        || {
            let a = attempts(sys);
            let done = a.iter().filter(|a| a.phase == Phase::Succeeded).count();
            let pinned_event = recorded_events(&*api)
                .iter()
                .any(|e| e.kind == "NodeSet" && e.reason == "KubeletCachePinned");
            async move { (done == 2 && pinned_event).then_some(()) }
        },
    )
    .await;
    // Nodes 1 and 2: every phase, a new pod, back in service.
    for a in attempts(sys) {
        assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
    }
    for (i, (host, uid)) in pods.iter().enumerate().skip(1) {
        let now = slurmd_pod(&*api, i).map(|p| p.1);
        assert!(now.is_some_and(|u| u != *uid), "{host} replaced");
        wait(
            sys,
            "the repaired node in service",
            Duration::from_secs(30),
            || {
                let n = slurm.node(host);
                async move { n.filter(in_service) }
            },
        )
        .await;
    }
    // Node 0: no attempt, no drain, same pod; the Event names the pinning pod.
    assert!(attempts(sys).iter().all(|a| a.pod != pods[0].0));
    assert_eq!(slurmd_pod(&*api, 0).map(|p| p.1).as_ref(), Some(&pods[0].1));
    let n = slurm.node(&pods[0].0).unwrap();
    assert!(!n.reason.starts_with("mountguard:"), "{n:?}");
    let ev = recorded_events(&*api);
    let pinned: Vec<_> = ev
        .iter()
        .filter(|e| e.kind == "NodeSet" && e.reason == "KubeletCachePinned")
        .collect();
    assert_eq!(pinned.len(), 1, "once, no loop: {pinned:?}");
    assert!(
        pinned[0].message.contains(pin_name),
        "{}",
        pinned[0].message
    );
    // The verdict of the pinned worker's key volume names the pinning pod.
    let doc = verdicts(&sys.metrics_base(), "namespace=slurm")
        .await
        .unwrap();
    let subject = format!("volume {KEY_VOLUME}");
    let v = find_verdict(&doc, &pods[0].0, &subject)
        .unwrap_or_else(|| panic!("no verdict of {}: {doc:#}", pods[0].0));
    assert_eq!(state_tag(v), "Stale/ImmutableCachePinned", "{v:#}");
    let pinned_by: Vec<&str> = v["pinnedBy"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p.as_str())
        .collect();
    assert!(
        pinned_by.len() == 1 && pinned_by[0].ends_with(pin_name),
        "{v:#}"
    );
    let text = mountguard_tests::mountguard::http_get(&format!("{}/metrics", sys.metrics_base()))
        .await
        .unwrap();
    assert!(
        text.lines()
            .any(|l| l == "mountguard_remediation_blocked{reason=\"pinned\"} 1"),
        "{text}"
    );
}
