//! Remediation when things get in the way: a running job, a
//! PodDisruptionBudget that refuses, an administrator's drain, a replacement
//! that is still stale, an unreachable slurmrestd. The real controller with
//! `--remediation on` against the cluster in a box.

use std::time::Duration;

use mountguard_core::remediation::{FailReason, Phase};
use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{JWT_SECRET, SLURM_NAMESPACE};
use mountguard_tests::mountguard::{free_addr, http_get, recorded_events};
use mountguard_tests::scenario::{
    PINNING_POD, add_pinning_pod, rotate_auth_key, slurmd_pod, wait_for_slurmd_pods,
};

use crate::harness::{Options, System, wait, wait_all_fresh, wait_metrics};
use crate::remediation::{
    FULL_RUN, attempts, evictions, four_workers, opt_in, remediation_args, start,
    wait_slurm_errors_counted,
};
use crate::shared::remediation::{attempt_of, first_in, hold_evictions, pod_in, release_evictions};

fn jwt_flag() -> String {
    format!("{SLURM_NAMESPACE}/{JWT_SECRET}")
}

/// Requests the controller received that delete a pod directly.
fn pod_deletes(sys: &System) -> Vec<String> {
    mountguard_tests::rig::Rig::pod_deletes(sys)
}

fn eviction_requests_for(sys: &System, pod: &str) -> usize {
    sys.cluster
        .api()
        .requests()
        .iter()
        .filter(|r| r.uri.contains(&format!("/pods/{pod}/eviction")))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_job_holds_the_eviction_until_it_ends_and_is_never_lost() {
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    // A job on worker 1, then the key rotation: slurmd there stops
    // answering (DOWN, NOT_RESPONDING) while Slurm still holds the job.
    let busy = pods[1].0.clone();
    let job = slurm.start_job(&busy, 2);
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    let a = pod_in(&sys, &busy, Phase::Drained, Duration::from_secs(120)).await;
    let n = slurm.node(&busy).unwrap();
    assert!(
        n.state.iter().any(|s| s == "DRAIN")
            && mountguard_core::remediation::reason_is(&n.reason, &a.drain_reason),
        "{n:?}"
    );
    // The drain holds while the job runs: no eviction, same pod.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let held = attempt_of(&sys, &busy).unwrap();
    assert_eq!(held.phase, Phase::Drained, "{held:?}");
    assert_eq!(eviction_requests_for(&sys, &busy), 0);
    assert_eq!(slurmd_pod(&api, 1).map(|p| p.1).as_ref(), Some(&pods[1].1));
    // `status` shows the open attempt.
    let doc = sys.verdicts("namespace=slurm").await;
    assert!(
        doc["attempts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["pod"] == busy.as_str() && x["phase"] == "Drained" && x["open"] == true),
        "{doc}"
    );
    slurm.end_job(job);
    wait(
        &sys,
        "every worker repaired",
        Duration::from_secs(180),
        || {
            let a = attempts(&sys);
            async move {
                (a.len() == 3 && a.iter().all(|a| a.phase == Phase::Succeeded)).then_some(())
            }
        },
    )
    .await;
    let a = attempt_of(&sys, &busy).unwrap();
    assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
    // The eviction came after the job ended, and no job was killed.
    assert!(slurm.killed_jobs().is_empty(), "{:?}", slurm.killed_jobs());
    for (host, _) in &pods {
        crate::remediation::assert_in_service_soon(&slurm, host).await;
    }
    assert!(pod_deletes(&sys).is_empty(), "{:?}", pod_deletes(&sys));
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_refusal_is_retried_never_turned_into_a_delete() {
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    crate::shared::remediation::pdb_refusal_is_retried_never_turned_into_a_delete(&sys).await;
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_refused_until_the_timeout_fails_and_releases_the_untouched_node() {
    let sys = start(
        "on",
        &[
            "--slurm-jwt-key-secret",
            &jwt_flag(),
            "--eviction-timeout",
            "8s",
        ],
    )
    .await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    hold_evictions(&sys);
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    let a = first_in(&sys, Phase::Evicting, Duration::from_secs(120)).await;
    let failed = pod_in(
        &sys,
        &a.pod,
        Phase::Failed(FailReason::EvictionTimeout),
        Duration::from_secs(60),
    )
    .await;
    // The pod was never touched: the drain is released, not kept.
    let i = pods.iter().position(|p| p.0 == a.pod).unwrap();
    assert_eq!(slurmd_pod(&api, i).map(|p| p.1).as_ref(), Some(&pods[i].1));
    assert!(!failed.kept_drained, "{failed:?}");
    wait(&sys, "our drain released", Duration::from_secs(30), || {
        let n = slurm.node(&a.slurm_node).unwrap();
        async move { (!n.state.iter().any(|s| s == "DRAIN")).then_some(()) }
    })
    .await;
    // The Event is posted by the events task after the record is written.
    wait(
        &sys,
        "a RemediationFailed Event for the eviction timeout",
        Duration::from_secs(30),
        || {
            let found = recorded_events(&api).iter().any(|e| {
                e.reason == "RemediationFailed"
                    && e.message.contains("EvictionTimeout")
                    && e.message.contains("releasing")
            });
            async move { found.then_some(()) }
        },
    )
    .await;
    let text = http_get(&format!("{}/metrics", sys.metrics_base()))
        .await
        .unwrap();
    assert!(
        text.lines().any(|l| l
            == "mountguard_remediation_attempts_total{phase=\"Failed\",result=\"EvictionTimeout\"} 1"),
        "{text}"
    );
    // No node is kept drained, but the pod stays stale and is not tried
    // again: the unresolved failure is what pages.
    wait_metrics(
        &sys,
        "mountguard_remediation_failed_unresolved{owner_kind=\"NodeSet\"} 1",
        Duration::from_secs(30),
        |text| {
            text.lines()
                .any(|l| l == "mountguard_remediation_failed_unresolved{owner_kind=\"NodeSet\"} 1")
                .then_some(())
        },
    )
    .await;
    let text = http_get(&format!("{}/metrics", sys.metrics_base()))
        .await
        .unwrap();
    assert!(
        text.lines().any(|l| l == "mountguard_remediation_failed 0"),
        "{text}"
    );
    assert!(pod_deletes(&sys).is_empty(), "{:?}", pod_deletes(&sys));
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_drain_arriving_during_the_attempt_is_never_undrained() {
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    let host = pods[2].0.clone();
    let job = slurm.start_job(&host, 1);
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    pod_in(&sys, &host, Phase::Drained, Duration::from_secs(120)).await;
    // The administrator drains the node for their own reason meanwhile.
    let admin_reason = "admin: replace DIMM B2";
    slurm.admin_drain(&host, admin_reason, "root");
    slurm.end_job(job);
    let done = pod_in(&sys, &host, Phase::Succeeded, Duration::from_secs(120)).await;
    // Theirs, as Slurm shows it (it may have appended " : Not responding"
    // when the evicted slurmd's node went DOWN).
    assert!(
        done.foreign_drain
            .as_deref()
            .is_some_and(|r| mountguard_core::remediation::reason_is(r, admin_reason)),
        "{done:?}"
    );
    // The replacement was verified, and the admin's drain is still there.
    let n = slurm.node(&host).unwrap();
    assert!(n.state.iter().any(|s| s == "DRAIN"), "{n:?}");
    assert!(
        mountguard_core::remediation::reason_is(&n.reason, admin_reason),
        "{n:?}"
    );
    let undrains: Vec<_> = slurm
        .writes()
        .into_iter()
        .filter(|w| w.node == host && w.body.to_string().contains("UNDRAIN"))
        .collect();
    assert!(undrains.is_empty(), "{undrains:?}");
    // The executor persists the attempt's end before it publishes the
    // Event that tells it: wait for the Event.
    wait(
        &sys,
        "the Event that the node was left drained",
        Duration::from_secs(10),
        || {
            let ev = recorded_events(&api);
            async move {
                ev.iter()
                    .any(|e| {
                        e.reason == "RemediationSucceeded"
                            && e.message.contains("left drained")
                            && e.message.contains(admin_reason)
                    })
                    .then_some(())
            }
        },
    )
    .await;
    assert!(slurm.killed_jobs().is_empty());
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_still_stale_fails_and_keeps_the_node_drained_with_a_reason() {
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    hold_evictions(&sys);
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    let a = first_in(&sys, Phase::Evicting, Duration::from_secs(120)).await;
    // While the eviction waits, a pod on the same node starts referencing
    // the Secret: it keeps the kubelet's stale cache entry alive, so the
    // replacement will be served the old key.
    add_pinning_pod(&api, &a.node).await.unwrap();
    release_evictions(&sys);
    let failed = pod_in(
        &sys,
        &a.pod,
        Phase::Failed(FailReason::ReplacementStale),
        Duration::from_secs(120),
    )
    .await;
    assert!(failed.kept_drained, "{failed:?}");
    assert!(
        failed
            .failure
            .as_deref()
            .is_some_and(|f| f.contains("slurm-etc") && f.contains(PINNING_POD)),
        "{failed:?}"
    );
    // Kept closed (by the FAIL hold set before the eviction), with our
    // reason, and said so.
    let i = pods.iter().position(|p| p.0 == a.pod).unwrap();
    assert_ne!(slurmd_pod(&api, i).map(|p| p.1).as_ref(), Some(&pods[i].1));
    let n = slurm.node(&a.slurm_node).unwrap();
    assert!(n.state.iter().any(|s| s == "FAIL"), "{n:?}");
    assert!(n.reason.starts_with("mountguard:"), "{n:?}");
    // The attempt is persisted Failed before its Event is written: wait for
    // the Event rather than race it.
    wait(
        &sys,
        "the RemediationFailed Event",
        Duration::from_secs(30),
        || {
            let ev = recorded_events(&api);
            async move {
                ev.iter()
                    .any(|e| {
                        e.reason == "RemediationFailed"
                            && e.message.contains("ReplacementStale")
                            && e.message.contains("kept drained")
                    })
                    .then_some(())
            }
        },
    )
    .await;
    // The gauge is computed from the attempts in the next round: wait for it.
    wait_metrics(
        &sys,
        "mountguard_remediation_failed 1",
        Duration::from_secs(30),
        |text| {
            text.lines()
                .any(|l| l == "mountguard_remediation_failed 1")
                .then_some(())
        },
    )
    .await;
    // No loop: a few rounds later there is still exactly one attempt on
    // that pod and the node stays drained.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let on_pod: Vec<_> = attempts(&sys)
        .into_iter()
        .filter(|x| x.pod == a.pod)
        .collect();
    assert_eq!(on_pod.len(), 1, "{on_pod:?}");
    assert!(
        slurm
            .node(&a.slurm_node)
            .unwrap()
            .reason
            .starts_with("mountguard:")
    );
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_slurmrestd_drains_nothing_and_touches_no_pod() {
    let mut sys = System::start(Options::default()).await;
    let api = sys.cluster.api();
    // Nothing listens there.
    let url = format!("http://{}", free_addr().unwrap());
    let jwt = jwt_flag();
    sys.opts.extra_controller_args =
        remediation_args(&url, "on", &["--slurm-jwt-key-secret", &jwt]);
    sys.start_controller().await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    wait_slurm_errors_counted(&sys).await;
    // Well past the remediation delay: still nothing written anywhere.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let doc = sys.verdicts("namespace=slurm").await;
    let stale = doc["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["state"] == "Stale")
        .count();
    assert!(stale >= 3, "{doc}");
    assert!(attempts(&sys).is_empty());
    assert_eq!(evictions(&sys), 0);
    for (i, (_, uid)) in pods.iter().enumerate() {
        assert_eq!(slurmd_pod(&api, i).map(|p| p.1).as_ref(), Some(uid));
    }
    assert!(
        sys.logs().contains("cannot list Slurm nodes"),
        "{}",
        sys.logs()
    );
    sys.shutdown().await;
}

/// While the controller is down: every Slurm node carrying a `mountguard:`
/// drain has an open, persisted attempt owning exactly that reason.
fn assert_every_drain_has_a_live_attempt(sys: &System, hosts: &[String], when: &str) {
    let slurm = sys.cluster.slurm();
    let persisted = attempts(sys);
    for h in hosts {
        let n = slurm.node(h).unwrap();
        if n.state.iter().any(|s| s == "DRAIN") && n.reason.starts_with("mountguard:") {
            assert!(
                persisted.iter().any(|a| a.is_open()
                    && mountguard_core::remediation::reason_is(&n.reason, &a.drain_reason)),
                "{when}: {h} drained ({:?}) without a live attempt: {persisted:?}",
                n.reason
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_killed_at_every_step_leaves_no_orphan_drain_and_loses_no_job() {
    let mut sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(&sys).await;
    let mut job = Some(slurm.start_job(&hosts[0], 2));
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();

    // Every phase of a run but the first (Pending) and the last (Succeeded).
    let steps = &FULL_RUN[1..FULL_RUN.len() - 1];
    let mut killed_in: Vec<&str> = Vec::new();
    let mut orphan: Option<String> = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
    loop {
        let now = attempts(&sys);
        if now.len() == 3 && now.iter().all(|a| a.phase == Phase::Succeeded) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not done after 300 s; killed in {killed_in:?}; attempts {now:?}\n{}",
            sys.logs()
        );
        let hit = now
            .iter()
            .filter(|a| !a.phase.is_terminal())
            .map(|a| a.phase.name())
            .find(|p| steps.contains(p) && !killed_in.contains(p));
        if let Some(phase) = hit {
            // SIGKILL: no shutdown path runs.
            if let Some(mut c) = sys.controller.take() {
                c.kill();
            }
            killed_in.push(phase);
            assert_every_drain_has_a_live_attempt(&sys, &hosts, &format!("killed in {phase}"));
            if orphan.is_none() {
                // A drain with our prefix that no persisted attempt owns
                // (say, its record was lost): the next start releases it.
                let free = hosts
                    .iter()
                    .find(|h| attempts(&sys).iter().all(|a| &a.slurm_node != *h))
                    .cloned();
                if let Some(h) = free {
                    slurm.admin_drain(
                        &h,
                        "mountguard: slurm/gone volume slurm-etc stale (mounted 000000000000 vs current 111111111111) attempt 0badc0ffee",
                        "slurm",
                    );
                    orphan = Some(h);
                }
            }
            sys.start_controller().await;
        }
        // Worker 0's job ends once a kill hit the Drained phase.
        if killed_in.contains(&"Drained")
            && let Some(j) = job
            && attempt_of(&sys, &hosts[0]).is_some_and(|a| a.phase == Phase::Drained)
        {
            slurm.end_job(j);
            job = None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(killed_in.len(), steps.len(), "killed in {killed_in:?}");
    for a in attempts(&sys) {
        assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
    }
    assert!(job.is_none(), "worker 0 was repaired while its job ran");
    assert!(slurm.killed_jobs().is_empty(), "{:?}", slurm.killed_jobs());
    let orphan = orphan.expect("an orphan drain was planted");
    let writes: Vec<String> = slurm
        .writes()
        .into_iter()
        .filter(|w| w.node == orphan)
        .map(|w| w.body.to_string())
        .collect();
    assert!(
        writes.first().is_some_and(|w| w.contains("UNDRAIN")),
        "the orphan drain is released first: {writes:?}"
    );
    for h in &hosts {
        crate::remediation::assert_in_service_soon(&slurm, h).await;
    }
    assert!(pod_deletes(&sys).is_empty(), "{:?}", pod_deletes(&sys));
    sys.shutdown().await;
}

/// The controller killed by its fail point right after each persist,
/// before the write it persisted for (the kills above land after writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_killed_after_every_persisted_step_finishes_each_attempt_once() {
    let mut sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    crate::shared::crash::killed_after_every_persist_finishes_each_attempt_once(&mut sys).await;
    sys.shutdown().await;
}

/// The Lease lost while the eviction is pending: the replica stopped after
/// it persisted `Evicting` past its Lease, another holder took the Lease;
/// continued, it does not evict, and finishes once it holds the Lease
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_stopped_past_its_lease_before_an_eviction_does_not_evict_when_continued() {
    let mut sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    crate::shared::crash::stalled_past_its_lease_writes_nothing_when_it_goes_on(&mut sys).await;
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pinning_nodeset_pods_are_replaced_together_when_enabled() {
    let sys = start(
        "on",
        &[
            "--slurm-jwt-key-secret",
            &jwt_flag(),
            "--replace-pinning-pods",
            "--remediation-budget-per-nodeset",
            "2",
        ],
    )
    .await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    // A fourth worker lands on node-0 next to worker 0: the two pin each
    // other's cache entry of the key Secret.
    four_workers(&sys).await;
    let fourth = format!("{}-3", mountguard_tests::cluster::NODESET);
    let first = format!("{}-0", mountguard_tests::cluster::NODESET);
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    wait(
        &sys,
        "all four workers repaired",
        Duration::from_secs(240),
        || {
            let a = attempts(&sys);
            async move {
                let ok = a.iter().filter(|a| a.phase == Phase::Succeeded).count();
                (ok == 4).then_some(a)
            }
        },
    )
    .await;
    let a = attempts(&sys);
    let g0 = attempt_of(&sys, &first).unwrap();
    let g3 = attempt_of(&sys, &fourth).unwrap();
    assert!(g0.group.is_some() && g0.group == g3.group, "{a:?}");
    for x in &a {
        assert_eq!(x.phase_names(), FULL_RUN, "{x:?}");
    }
    // Both replacements are fresh on node-0, and nobody looped.
    wait_all_fresh(&sys).await;
    assert_eq!(a.len(), 4, "{a:?}");
    for h in [&first, &fourth] {
        let n = slurm.node(h).unwrap();
        assert!(
            !n.state.iter().any(|s| s == "DRAIN" || s == "DOWN"),
            "{h}: {n:?}"
        );
    }
    let ev = recorded_events(&api);
    assert!(
        !ev.iter().any(|e| e.reason == "RemediationFailed"),
        "{ev:?}"
    );
    // node-0 was cordoned while the old pair went away, and is not any more.
    let node_patches = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.uri.starts_with("/api/v1/nodes/node-0"))
        .count();
    assert!(node_patches >= 2, "cordon and uncordon: {node_patches}");
    let n = api.get(&resources::NODES, "", "node-0").unwrap();
    assert_ne!(n["spec"]["unschedulable"], true, "{n}");
    assert!(
        n["metadata"]["annotations"]["mountguard.io/cordoned-by"].is_null(),
        "{n}"
    );
    sys.shutdown().await;
}
