//! Remediation across restarts and transient errors: a NodeSet list that
//! fails at start, one "not found" from slurmrestd, a drain of ours left
//! behind while the controller runs, a 409 from the Eviction API, and a
//! leader that can no longer renew its Lease. The real controller with
//! `--remediation on` against the cluster in a box.

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use mountguard_core::remediation::{
    ATTEMPTS_ANNOTATION, Attempt, AttemptsRecord, FailReason, Finding, Phase,
};
use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{JWT_SECRET, NODESET, SLURM_NAMESPACE};
use mountguard_tests::mountguard::http_get;
use mountguard_tests::scenario::{rotate_auth_key, slurmd_pod, wait_for_slurmd_pods};
use serde_json::{Value, json};

use crate::harness::{Options, System, wait, wait_all_fresh};
use crate::remediation::{FULL_RUN, attempts, in_service, opt_in, remediation_args, start};

fn jwt_flag() -> String {
    format!("{SLURM_NAMESPACE}/{JWT_SECRET}")
}

fn has_drain(sys: &System, host: &str, reason: &str) -> bool {
    sys.cluster
        .slurm()
        .node(host)
        .is_some_and(|n| n.state.iter().any(|s| s == "DRAIN") && n.reason == reason)
}

fn undrains_of(sys: &System, host: &str) -> usize {
    sys.cluster
        .slurm()
        .writes()
        .iter()
        .filter(|w| w.node == host && w.body.to_string().contains("UNDRAIN"))
        .count()
}

async fn metric(sys: &System, line_start: &str) -> Option<String> {
    let text = http_get(&format!("{}/metrics", sys.metrics_base()))
        .await
        .ok()?;
    text.lines()
        .find(|l| l.starts_with(line_start))
        .map(|l| l[line_start.len()..].trim().to_string())
}

/// Waits until every one of the `n` attempts is closed; returns them.
async fn all_closed(sys: &System, n: usize, timeout: Duration) -> Vec<Attempt> {
    wait(sys, &format!("{n} attempts closed"), timeout, || {
        let a = attempts(sys);
        async move { (a.len() == n && a.iter().all(|a| !a.is_open())).then_some(a) }
    })
    .await
}

fn assert_all_succeeded(sys: &System, all: &[Attempt], hosts: &[String]) {
    for a in all {
        assert_eq!(a.phase, Phase::Succeeded, "{a:?}\n{}", sys.logs());
        assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
    }
    let slurm = sys.cluster.slurm();
    for h in hosts {
        let n = slurm.node(h).unwrap();
        assert!(in_service(&n), "{h}: {n:?}");
    }
    assert!(slurm.killed_jobs().is_empty(), "{:?}", slurm.killed_jobs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodeset_list_failing_at_start_releases_no_kept_drain_and_overwrites_no_record() {
    let mut sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    if let Some(mut c) = sys.controller.take() {
        c.kill();
    }
    // While the controller is down: an attempt that failed after its
    // eviction and keeps worker 1 drained on purpose (alert, budget slot,
    // loop guard), recorded in the NodeSet, and its drain in Slurm.
    let (host, uid) = pods[1].clone();
    let node = api.get(&resources::PODS, SLURM_NAMESPACE, &host).unwrap()["spec"]["nodeName"]
        .as_str()
        .unwrap()
        .to_string();
    let at = Timestamp::now() - SignedDuration::from_mins(10);
    let mut kept = Attempt::new(
        "f00dfeed01".into(),
        SLURM_NAMESPACE,
        NODESET,
        &host,
        "uid-of-the-pod-before",
        &node,
        &host,
        vec![Finding {
            subject: "volume slurm-etc".into(),
            state: "Stale/ImmutableCache".into(),
            mounted: "591b08c85fb0".into(),
            current: "6cc34aeed46b".into(),
        }],
        at,
    );
    kept.drain_requested = true;
    kept.drain_requested_at = Some(at);
    kept.evicted_at = Some(at);
    kept.new_pod_uid = Some(uid.clone());
    kept.phase = Phase::Failed(FailReason::ReplacementStale);
    kept.kept_drained = true;
    kept.failure = Some("ReplacementStale: planted by the test".into());
    let record = AttemptsRecord::from_attempts([&kept]).to_json();
    api.merge_patch(
        &resources::NODESETS,
        SLURM_NAMESPACE,
        NODESET,
        &json!({"metadata": {"annotations": {ATTEMPTS_ANNOTATION: record}}}),
        None,
    )
    .unwrap();
    slurm.admin_drain(&host, &kept.drain_reason, "slurm");
    opt_in(&sys);
    // The first NodeSet request of the new process fails once.
    api.fail_requests(500, 1, Some("nodesets"));
    sys.start_controller().await;
    // The kept attempt is known again (its alert is back)...
    wait(
        &sys,
        "the kept attempt recovered",
        Duration::from_secs(60),
        || async {
            (metric(&sys, "mountguard_remediation_failed ")
                .await
                .as_deref()
                == Some("1"))
            .then_some(())
        },
    )
    .await;
    // ...and a few rounds later the drain and the record are intact.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(
        has_drain(&sys, &host, &kept.drain_reason),
        "{:?}\n{}",
        slurm.node(&host),
        sys.logs()
    );
    assert_eq!(undrains_of(&sys, &host), 0, "{:?}", slurm.writes());
    let now = attempts(&sys);
    let same = now.iter().find(|a| a.id == kept.id).cloned();
    assert!(
        same.as_ref().is_some_and(|a| a.kept_drained && a.is_open()),
        "{now:?}"
    );
    // No new attempt on that pod either (its loop guard holds).
    assert!(
        now.iter().all(|a| a.pod != host || a.id == kept.id),
        "{now:?}"
    );
    assert_eq!(
        metric(&sys, "mountguard_remediation_failed ")
            .await
            .as_deref(),
        Some("1")
    );
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_not_found_from_slurmrestd_while_draining_is_retried_and_the_attempt_completes() {
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(&sys).await;
    // Right after each drain lands, slurmrestd answers "not found" once.
    for h in &hosts {
        slurm.not_found_after_write(h, 1);
    }
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    let all = all_closed(&sys, 3, Duration::from_secs(300)).await;
    assert_eq!(slurm.not_found_served(), 3, "the fault hit every attempt");
    assert_all_succeeded(&sys, &all, &hosts);
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mountguard_drain_left_without_an_attempt_is_swept_while_running() {
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    let orphan = |id: &str| {
        format!(
            "mountguard: slurm/gone volume slurm-etc stale (mounted 000000000000 vs current 111111111111) attempt {id}"
        )
    };
    // The first may be released by recovery or by the sweep; once it is
    // gone recovery is surely done, and the second can only be swept.
    for (i, id) in ["0badc0ffee", "0badf00d42"].iter().enumerate() {
        let host = pods[i].0.clone();
        let reason = orphan(id);
        slurm.admin_drain(&host, &reason, "slurm");
        wait(
            &sys,
            &format!("orphan drain {id} released"),
            Duration::from_secs(120),
            || {
                let gone = !has_drain(&sys, &host, &reason);
                async move { gone.then_some(()) }
            },
        )
        .await;
        assert_eq!(undrains_of(&sys, &host), 1, "{:?}", slurm.writes());
    }
    // An administrator's drain is never swept.
    slurm.admin_drain(&pods[2].0, "admin: replace DIMM B2", "root");
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(has_drain(&sys, &pods[2].0, "admin: replace DIMM B2"));
    assert_eq!(undrains_of(&sys, &pods[2].0), 0);
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_409_from_the_eviction_api_is_not_taken_for_a_gone_pod() {
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt_flag()]).await;
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(&sys).await;
    // The first eviction request conflicts (as a concurrent update of a
    // PodDisruptionBudget's status does); the pod is still there.
    api.fail_requests(409, 1, Some("/eviction"));
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    let all = all_closed(&sys, 3, Duration::from_secs(300)).await;
    assert_all_succeeded(&sys, &all, &hosts);
    let evictions = api
        .requests()
        .iter()
        .filter(|r| r.uri.contains("/eviction"))
        .count();
    assert!(
        evictions >= 4,
        "the conflicting one was asked again: {evictions}"
    );
    for (i, (_, uid)) in pods.iter().enumerate() {
        assert_ne!(slurmd_pod(&api, i).map(|p| p.1).as_ref(), Some(uid));
    }
    sys.shutdown().await;
}

const LEASE_NS: &str = "mountguard";
const LEASE: &str = "mountguard-remediation-e2e";

fn lease_expiry(api: &mountguard_tests::apiserver::ApiHandle) -> Option<Timestamp> {
    let l: Value = api.get(&resources::LEASES, LEASE_NS, LEASE).ok()?;
    let renewed: Timestamp = l["spec"]["renewTime"].as_str()?.parse().ok()?;
    let secs = l["spec"]["leaseDurationSeconds"].as_i64()?;
    Some(renewed + SignedDuration::from_secs(secs))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_cannot_renew_its_lease_stops_writing_before_it_expires() {
    let mut sys = System::start(Options::default()).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    if let Some(mut c) = sys.controller.take() {
        c.kill();
    }
    api.create(
        &resources::PODS,
        LEASE_NS,
        json!({"metadata": {"name": "ctl-a", "labels": {"app.kubernetes.io/name": "mountguard-controller"}},
               "spec": {"containers": [{"name": "controller", "image": "mountguard:e2e"}]}}),
    )
    .unwrap();
    let url = sys.cluster.slurmrestd_url();
    let jwt = jwt_flag();
    let mut args = remediation_args(&url, "on", &["--slurm-jwt-key-secret", &jwt]);
    args.extend(
        [
            "--leader-election",
            "--lease-name",
            LEASE,
            "--pod-name",
            "ctl-a",
            "--pod-namespace",
            LEASE_NS,
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    sys.opts.extra_controller_args = args;
    sys.start_controller().await;
    let acting = || async {
        let doc = sys.verdicts("").await;
        doc["acting"].as_bool()
    };
    wait(
        &sys,
        "the replica leading",
        Duration::from_secs(60),
        || async { (acting().await == Some(true)).then_some(()) },
    )
    .await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(&sys).await;
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
    // The API now refuses every Lease request: the replica cannot renew,
    // and its lease manager keeps saying it leads.
    api.fail_requests(500, 1_000_000, Some("/leases"));
    let expiry = lease_expiry(&api).expect("a Lease with a renewal time");
    wait(
        &sys,
        "the Lease expired",
        Duration::from_secs(60),
        || async { (Timestamp::now() > expiry + SignedDuration::from_secs(1)).then_some(()) },
    )
    .await;
    assert_eq!(
        acting().await,
        Some(true),
        "the replica still believes it leads"
    );
    // From here another replica could take over: this one must not write.
    let writes_before = slurm.writes().len();
    let evictions_before = api
        .requests()
        .iter()
        .filter(|r| r.uri.contains("/eviction"))
        .count();
    let patches_before = api
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.uri.contains("/nodesets/"))
        .count();
    let i = hosts.iter().position(|h| *h == first.pod).unwrap();
    slurm.end_job(jobs[i]);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let reqs = api.requests();
    let evictions = reqs.iter().filter(|r| r.uri.contains("/eviction")).count();
    let patches = reqs
        .iter()
        .filter(|r| r.method == "PATCH" && r.uri.contains("/nodesets/"))
        .count();
    assert_eq!(evictions, evictions_before, "evicted without the Lease");
    assert_eq!(patches, patches_before, "persisted without the Lease");
    assert_eq!(
        slurm.writes().len(),
        writes_before,
        "wrote to Slurm without the Lease"
    );
    assert_eq!(
        attempts(&sys)
            .into_iter()
            .find(|a| a.id == first.id)
            .map(|a| a.phase),
        Some(Phase::Drained)
    );
    // The Lease is renewed again: the attempt goes on, once.
    api.clear_faults();
    for (j, id) in jobs.iter().enumerate() {
        if j != i {
            slurm.end_job(*id);
        }
    }
    let all = all_closed(&sys, 3, Duration::from_secs(300)).await;
    assert_all_succeeded(&sys, &all, &hosts);
    sys.shutdown().await;
}
