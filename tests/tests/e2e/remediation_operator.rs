//! Remediation against the Slinky operator's own Slurm writes (the
//! cluster's `slinky_operator_rules`: the slurmd preStop hook and
//! syncCordon of slurm-operator v1.2.1), for a stale `slurm.key` (the
//! hook cannot authenticate) and a stale hooks ConfigMap read at start
//! (the hook sets DOWN with the operator's reason). Every node's Slurm
//! state is sampled throughout: from mountguard's drain until the
//! replacement is verified, no node is ever open to jobs. The stale-key,
//! leader-failover and restart bodies are shared with the real control
//! plane's tier (tests/tests/shared/operator.rs).

use std::time::Duration;

use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{HOOKS_CONFIGMAP, JWT_SECRET, NODESET, SLURM_NAMESPACE};
use mountguard_tests::operator::PRESTOP_REASON;
use mountguard_tests::scenario::wait_for_slurmd_pods;
use mountguard_tests::slurmrestd::{NodeView, ReturnToService, SlurmHandle};
use serde_json::json;
use tokio::task::JoinHandle;

use crate::harness::{Options, System, wait, wait_all_fresh};
use crate::remediation::{attempts, four_workers, in_service, opt_in, remediation_args};
use crate::shared::operator::{
    assert_closed_until_verified, change_hooks, every_attempt_succeeded, hooks_read_at_start,
    open_to_jobs, sample,
};
use mountguard_core::remediation::Attempt;

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

/// The operator's syncCordon checks the reason on a cache a pass behind
/// and writes on the node as it is now (what the real operator does when
/// its slurm-client cache is refreshed between `IsNodeReasonOurs` and
/// `MakeNodeUndrain`): a fresh DRAIN on an idle node with no reason is
/// undrained by its next pass. With `--drain-state fail` mountguard's first
/// write is its FAIL hold, which that undrain never touches: the hooks body
/// (its nodes stay up between the drain and the eviction) sees no node
/// open from our first write to the verification. With the default
/// `--drain-state drain` the same run fails `DrainRemoved`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_operators_cache_a_pass_behind_a_fresh_drain_is_never_undone() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let mut sys = System::start(Options {
        operator_rules: true,
        operator_cache_lag: true,
        ..Options::default()
    })
    .await;
    let url = sys.cluster.slurmrestd_url();
    sys.opts.extra_controller_args = remediation_args(
        &url,
        "on",
        &["--slurm-jwt-key-secret", &jwt, "--drain-state=fail"],
    );
    sys.start_controller().await;
    crate::shared::operator::stale_hooks_read_at_start_are_repaired_through_the_prestop_hook(
        &sys, true,
    )
    .await;
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_hooks_configmap_read_at_start_is_repaired_against_the_operators_prestop_and_undrain()
 {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    crate::shared::operator::stale_hooks_read_at_start_are_repaired_through_the_prestop_hook(
        &sys, false,
    )
    .await;
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
        crate::remediation::assert_in_service_soon(&slurm, h).await;
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

/// Everything Fresh: a controller restart (stopped, a new replica on the
/// same addresses) makes no Slurm write and no eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_restart_with_everything_fresh_writes_nothing() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let mut sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    crate::shared::operator::restart_with_everything_fresh_writes_nothing(&mut sys).await;
    sys.shutdown().await;
}

/// A second NodeSet with one worker, placed on node-0 next to the pinned
/// pair; it mounts the key Secret but not the hooks ConfigMap, so it pins
/// nothing that is rotated and is never part of a group.
const BYSTANDER: &str = "slurm-bystander";

/// Replaces the hooks ConfigMap by an immutable one holding `script`
/// (delete and recreate, the way an immutable object is rotated).
fn immutable_hooks(api: &mountguard_tests::apiserver::ApiHandle, script: &str) {
    api.delete(
        &resources::CONFIGMAPS,
        SLURM_NAMESPACE,
        HOOKS_CONFIGMAP,
        &mountguard_tests::apiserver::DeleteOptions::default(),
    )
    .unwrap();
    api.create(
        &resources::CONFIGMAPS,
        SLURM_NAMESPACE,
        json!({"metadata": {"name": HOOKS_CONFIGMAP}, "immutable": true,
               "data": {"99-mountguard.sh": script}}),
    )
    .unwrap();
}

async fn running_pod(sys: &System, name: &str) -> serde_json::Value {
    let api = sys.cluster.api();
    wait(
        sys,
        &format!("{name} running"),
        Duration::from_secs(60),
        || {
            let p = api.get(&resources::PODS, SLURM_NAMESPACE, name).ok();
            async move { p.filter(|p| p["status"]["phase"] == "Running") }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_group_on_a_node_never_drains_another_nodeset_worker_on_that_node() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start_with_operator(&[
        "--slurm-jwt-key-secret",
        &jwt,
        "--replace-pinning-pods",
        "--remediation-budget-per-nodeset",
        "2",
    ])
    .await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    // A fourth worker lands on node-0 next to worker 0: the two pin each
    // other's cache entry of the hooks ConfigMap once it is immutable.
    four_workers(&sys).await;
    let first = format!("{NODESET}-0");
    let fourth = format!("{NODESET}-3");
    // The bystander: another NodeSet's worker on node-0.
    let mut template = mountguard_tests::cluster::slurmd_template();
    template["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .retain(|v| v["name"] != "hooks");
    template["spec"]["containers"][0]["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .retain(|v| v["name"] != "hooks");
    api.create(
        &resources::NODESETS,
        SLURM_NAMESPACE,
        json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": BYSTANDER},
            "spec": {
                "controllerRef": {"name": mountguard_tests::cluster::SLURM_CLUSTER, "namespace": SLURM_NAMESPACE},
                "replicas": 1,
                "template": template,
            },
        }),
    )
    .unwrap();
    let bystander = format!("{BYSTANDER}-0");
    let by_pod = running_pod(&sys, &bystander).await;
    assert_eq!(by_pod["spec"]["nodeName"], "node-0", "{by_pod}");
    let by_uid = by_pod["metadata"]["uid"].as_str().unwrap().to_string();
    let by_before = wait(
        &sys,
        "the bystander's slurmd registered",
        Duration::from_secs(30),
        || {
            let n = slurm.node(&bystander);
            async move { n.filter(in_service) }
        },
    )
    .await;
    // New content, so that Fresh means every kubelet has read the
    // immutable object (and stopped watching it).
    immutable_hooks(&api, "#!/bin/sh\nexit 0 # immutable\n");
    wait_all_fresh(&sys).await;
    let mut hosts: Vec<String> = (0..4).map(|i| format!("{NODESET}-{i}")).collect();
    hosts.push(bystander.clone());
    let (samples, sampler) = sample(slurm.clone(), hosts.clone());
    opt_in(&sys);
    immutable_hooks(&api, "#!/bin/sh\necho new hooks\n");
    let all = wait(
        &sys,
        "all four workers repaired",
        Duration::from_secs(300),
        || {
            let a = attempts(&sys);
            async move {
                let done = a.len() == 4 && a.iter().all(|a| !a.is_open());
                done.then_some(a)
            }
        },
    )
    .await;
    sampler.abort();
    for a in &all {
        assert_closed_until_verified(&samples, a);
    }
    let group = |pod: &str| {
        all.iter()
            .find(|a| a.pod == pod)
            .and_then(|a| a.group.clone())
    };
    assert!(
        group(&first).is_some() && group(&first) == group(&fourth),
        "{all:?}"
    );
    // From Slurm's side: nobody ever drained, downed or wrote to the
    // bystander, and it ends as it started.
    {
        let s = samples.lock().unwrap();
        let by: Vec<&NodeView> = s
            .iter()
            .filter(|(_, h, _)| *h == bystander)
            .map(|(_, _, n)| n)
            .collect();
        assert!(!by.is_empty());
        for n in &by {
            assert!(in_service(n) && n.reason.is_empty(), "bystander: {n:?}");
        }
    }
    let by_writes: Vec<_> = slurm
        .writes()
        .into_iter()
        .filter(|w| w.node == bystander)
        .collect();
    assert!(by_writes.is_empty(), "{by_writes:?}");
    assert_eq!(slurm.node(&bystander).unwrap(), by_before);
    let by_pod = api
        .get(&resources::PODS, SLURM_NAMESPACE, &bystander)
        .unwrap();
    assert_eq!(by_pod["metadata"]["uid"], by_uid.as_str(), "never evicted");
    assert!(
        by_pod["metadata"]["annotations"][mountguard_tests::operator::ANNOTATION_POD_CORDON]
            .is_null(),
        "{by_pod}"
    );
    // node-0 carries nothing of mountguard's any more, and was never
    // cordoned.
    let n = api.get(&resources::NODES, "", "node-0").unwrap();
    assert_ne!(n["spec"]["unschedulable"], true, "{n}");
    assert!(
        n["spec"]["taints"]
            .as_array()
            .is_none_or(|t| t.iter().all(|t| t["key"] != "mountguard.io/replacing")),
        "{n}"
    );
    assert!(
        n["metadata"]["annotations"]["mountguard.io/cordoned-by"].is_null(),
        "{n}"
    );
    sys.shutdown().await;
}

/// Plays Slurm's scheduler: every 10 ms, a one-CPU job of 100 ms on every
/// host that can take one right now (checked and started in one step by
/// the double).
fn schedule_jobs(slurm: SlurmHandle, hosts: Vec<String>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            for h in &hosts {
                if let Some(id) = slurm.start_job_if_open(h, 1) {
                    let s = slurm.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        s.end_job(id);
                    });
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

/// Jobs Slurm started on `a`'s node from mountguard's first accepted
/// drain until its release (RESUME, or its UNDRAIN without a reason).
fn jobs_between_drain_and_release(slurm: &SlurmHandle, a: &Attempt) -> Vec<(u64, u32)> {
    let writes = slurm.writes();
    let drain = json!({"state": ["DRAIN"], "reason": a.drain_reason});
    let from = writes
        .iter()
        .find(|w| w.node == a.slurm_node && w.status == 200 && w.body == drain)
        .map(|w| w.seq)
        .expect("our drain");
    let to = writes
        .iter()
        .rev()
        .find(|w| {
            w.node == a.slurm_node
                && w.status == 200
                && (w.body == json!({"state": ["RESUME"]})
                    || w.body == json!({"state": ["UNDRAIN"]}))
        })
        .map(|w| w.seq)
        .expect("our release");
    slurm
        .jobs_started()
        .into_iter()
        .filter(|(seq, h, _)| *h == a.slurm_node && *seq > from && *seq < to)
        .map(|(seq, _, id)| (seq, id))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_return_to_service_2_no_job_starts_between_the_drain_and_the_verification() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    let slurm = sys.cluster.slurm();
    // A registering slurmd returns any DOWN node to service, the preStop
    // hook's included.
    slurm.set_return_to_service(ReturnToService::Always);
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    hooks_read_at_start(&api, &hosts);
    wait_all_fresh(&sys).await;
    let (samples, sampler) = sample(slurm.clone(), hosts.clone());
    let scheduler = schedule_jobs(slurm.clone(), hosts.clone());
    opt_in(&sys);
    change_hooks(&api);
    let all = every_attempt_succeeded(&sys).await;
    scheduler.abort();
    sampler.abort();
    for a in &all {
        let jobs = jobs_between_drain_and_release(&slurm, a);
        assert!(
            jobs.is_empty(),
            "{}: jobs started between mountguard's drain and its release: {jobs:?}\n{:?}",
            a.slurm_node,
            slurm.writes()
        );
        // The hook authenticated (the key is current): its reason replaced
        // ours once, whether or not its DOWN was still there when
        // mountguard looked (a registration clears it at once here).
        let reasons = assert_closed_until_verified(&samples, a);
        assert!(reasons.iter().any(|r| r == PRESTOP_REASON), "{reasons:?}");
    }
    // The scheduler ran jobs on every node before and after.
    for h in &hosts {
        assert!(slurm.jobs_started().iter().any(|(_, n, _)| n == h), "{h}");
    }
    assert!(slurm.killed_jobs().is_empty(), "{:?}", slurm.killed_jobs());
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_an_administrator_drained_before_is_repaired_and_handed_back_with_their_drain() {
    const ADMIN_REASON: &str = "replacing a DIMM, ticket 4711";
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start_with_operator(&["--slurm-jwt-key-secret", &jwt]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    hooks_read_at_start(&api, &hosts);
    wait_all_fresh(&sys).await;
    let admin = hosts[1].clone();
    wait(&sys, "worker 1 idle", Duration::from_secs(30), || {
        let n = slurm.node(&admin);
        async move { n.filter(in_service) }
    })
    .await;
    slurm.admin_drain(&admin, ADMIN_REASON, "root");
    let before = slurm.node(&admin).unwrap();
    assert_eq!(before.state, ["IDLE", "DRAIN"]);
    let (samples, sampler) = sample(slurm.clone(), hosts.clone());
    opt_in(&sys);
    change_hooks(&api);
    let all = every_attempt_succeeded(&sys).await;
    sampler.abort();
    for a in &all {
        assert_closed_until_verified(&samples, a);
    }
    let a = all.iter().find(|a| a.slurm_node == admin).unwrap();
    let prior = a
        .prior_drain
        .as_ref()
        .expect("the administrator's drain recorded");
    assert_eq!(prior.reason, ADMIN_REASON, "{a:?}");
    // From Slurm's side: closed to jobs from the administrator's drain to
    // the end; mountguard's reason in between; theirs again at the end.
    {
        let s = samples.lock().unwrap();
        let mine: Vec<&NodeView> = s
            .iter()
            .filter(|(_, h, _)| *h == admin)
            .map(|(_, _, n)| n)
            .collect();
        assert!(mine.iter().all(|n| !open_to_jobs(n)), "{mine:?}");
        assert!(
            mine.iter()
                .any(|n| mountguard_core::remediation::reason_is(&n.reason, &a.drain_reason)),
            "{mine:?}"
        );
        assert_eq!(mine.first().unwrap().reason, ADMIN_REASON);
    }
    let after = slurm.node(&admin).unwrap();
    assert_eq!(after.reason, ADMIN_REASON, "{after:?}");
    // Their drain is back; the only other difference allowed is the DOWN
    // the operator's preStop hook set (ReturnToService=1 keeps it until
    // they resume the node, which clears both).
    assert!(
        after.state == ["IDLE", "DRAIN"] || after.state == ["DOWN", "DRAIN"],
        "{after:?}"
    );
    // mountguard never undrained or resumed it: it wrote their drain back.
    let writes: Vec<_> = slurm
        .writes()
        .into_iter()
        .filter(|w| w.node == admin && w.status == 200)
        .map(|w| w.body)
        .collect();
    assert!(
        !writes
            .iter()
            .any(|b| b == &json!({"state": ["UNDRAIN"]}) || b == &json!({"state": ["RESUME"]})),
        "{writes:?}"
    );
    assert_eq!(
        writes.last(),
        Some(&json!({"state": ["DRAIN"], "reason": ADMIN_REASON})),
        "{writes:?}"
    );
    for h in hosts.iter().filter(|h| **h != admin) {
        assert!(in_service(&slurm.node(h).unwrap()), "{h}");
    }
    sys.shutdown().await;
}
