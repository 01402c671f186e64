//! The seed rotation with remediation on, as one body for both rigs: a
//! pinning pod on node-0 keeps the kubelet's cache entry of the old
//! immutable `slurm.key`; the rotation (delete and recreate) leaves every
//! slurmd not responding; node-0 is reported `ImmutableCachePinned`
//! naming the pinning pod (one `KubeletCachePinned` Event, no attempt, no
//! loop) while the other workers are drained through slurmrestd, evicted,
//! recreated by the NodeSet (double), verified on the node by bytes and
//! undrained.

use std::time::Duration;

use mountguard_core::remediation::Phase;
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
/// remediation delay 1 s); `pin` is a pod referencing `slurm-auth-slurm`,
/// named `pin_name`, placed (`spec.nodeName`) on the node of slurmd pod 0
/// (node-0 where the rig places the pods itself; wherever the scheduler
/// put it for the real operator's pods).
pub async fn pinned_cache_is_reported_not_looped<R: Rig>(sys: &R, mut pin: Value, pin_name: &str) {
    use mountguard_tests::apiserver::resources;
    use mountguard_tests::cluster::SLURM_NAMESPACE;
    let api = sys.objects();
    let slurm = sys.slurm();
    let pods = wait_for_slurmd_pods(sys).await;
    let node = api
        .get(&resources::PODS, SLURM_NAMESPACE, &pods[0].0)
        .ok()
        .and_then(|p| p["spec"]["nodeName"].as_str().map(String::from))
        .expect("slurmd pod 0 is bound to a node");
    pin["spec"]["nodeName"] = Value::String(node);
    add_running_pod(&*api, pin).await.unwrap();
    wait_all_fresh(sys).await;
    opt_in(sys);
    rotate_auth_key(&*api).unwrap();
    let others = sys.node_count() - 1;
    wait(
        sys,
        &format!("the {others} unpinned nodes repaired"),
        Duration::from_secs(180),
        || {
            let a = attempts(sys);
            let done = a.iter().filter(|a| a.phase == Phase::Succeeded).count();
            let pinned_event = recorded_events(&*api)
                .iter()
                .any(|e| e.kind == "NodeSet" && e.reason == "KubeletCachePinned");
            async move { (done == others && pinned_event).then_some(()) }
        },
    )
    .await;
    // The other nodes: every phase, a new pod, back in service.
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

/// A PodDisruptionBudget that refuses every eviction of a slurmd pod.
pub const HOLD_PDB: &str = "hold-every-worker";

/// Creates [`HOLD_PDB`].
pub fn hold_evictions<R: Rig>(sys: &R) {
    use mountguard_tests::apiserver::resources;
    use mountguard_tests::cluster::SLURM_NAMESPACE;
    sys.objects()
        .create(
            &resources::PDBS,
            SLURM_NAMESPACE,
            serde_json::json!({"metadata": {"name": HOLD_PDB}, "spec": {
                "maxUnavailable": 0,
                "selector": {"matchLabels": {"app.kubernetes.io/name": "slurmd"}},
            }}),
        )
        .unwrap();
}

/// Deletes [`HOLD_PDB`].
pub fn release_evictions<R: Rig>(sys: &R) {
    use mountguard_tests::apiserver::{DeleteOptions, resources};
    use mountguard_tests::cluster::SLURM_NAMESPACE;
    sys.objects()
        .delete(
            &resources::PDBS,
            SLURM_NAMESPACE,
            HOLD_PDB,
            &DeleteOptions::default(),
        )
        .unwrap();
}

/// The attempt for `pod`, if any.
pub fn attempt_of<R: Rig>(sys: &R, pod: &str) -> Option<mountguard_core::remediation::Attempt> {
    attempts(sys).into_iter().find(|a| a.pod == pod)
}

/// Waits for the first attempt (any pod) to reach `phase`.
pub async fn first_in<R: Rig>(
    sys: &R,
    phase: Phase,
    timeout: Duration,
) -> mountguard_core::remediation::Attempt {
    wait(sys, &format!("an attempt in {phase:?}"), timeout, || {
        let a = attempts(sys).into_iter().find(|a| a.phase == phase);
        async move { a }
    })
    .await
}

/// Waits for `pod`'s attempt to reach `phase`.
pub async fn pod_in<R: Rig>(
    sys: &R,
    pod: &str,
    phase: Phase,
    timeout: Duration,
) -> mountguard_core::remediation::Attempt {
    wait(sys, &format!("{pod} in {phase:?}"), timeout, || {
        let a = attempt_of(sys, pod).filter(|a| a.phase == phase);
        async move { a }
    })
    .await
}

/// `sys` runs the controller with remediation on (jwt.key Secret): a
/// PodDisruptionBudget refusing every eviction of a slurmd pod makes the
/// Eviction API answer 429; the attempt stays Evicting, backs off and asks
/// again, `status` shows the error being retried, and the controller never
/// deletes a pod itself; once the PDB is gone the attempt succeeds.
pub async fn pdb_refusal_is_retried_never_turned_into_a_delete<R: Rig>(sys: &R) {
    let api = sys.objects();
    wait_for_slurmd_pods(sys).await;
    wait_all_fresh(sys).await;
    hold_evictions(sys);
    opt_in(sys);
    rotate_auth_key(&*api).unwrap();
    let a = first_in(sys, Phase::Evicting, Duration::from_secs(120)).await;
    // Refused (429), backed off, asked again; the attempt says why.
    wait(
        sys,
        "a second eviction request after a 429",
        Duration::from_secs(60),
        || {
            let n = sys.evictions_of(&a.pod);
            async move { (n >= 2).then_some(()) }
        },
    )
    .await;
    assert_eq!(attempt_of(sys, &a.pod).unwrap().phase, Phase::Evicting);
    // The error being retried is in memory (not persisted): `status` shows it.
    let doc = verdicts(&sys.metrics_base(), "namespace=slurm")
        .await
        .unwrap();
    let item = doc["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == a.id.as_str())
        .cloned()
        .unwrap();
    assert!(
        item["lastError"]
            .as_str()
            .is_some_and(|e| e.contains("eviction refused")),
        "{item}"
    );
    assert!(sys.pod_deletes().is_empty(), "{:?}", sys.pod_deletes());
    // The budget lets the PDB go: the eviction goes through.
    release_evictions(sys);
    pod_in(sys, &a.pod, Phase::Succeeded, Duration::from_secs(120)).await;
    assert!(sys.pod_deletes().is_empty(), "{:?}", sys.pod_deletes());
    let all: usize = (0..sys.node_count())
        .map(|i| sys.evictions_of(&format!("{}-{i}", mountguard_tests::cluster::NODESET)))
        .sum();
    assert!(all >= 3, "{all}");
}
