//! Remediation end to end: the slurmrestd client against the slurmrestd
//! double, and the real controller with `--remediation` on the cluster in
//! a box (NodeSet double, simulated kubelets, slurmd/slurmctld key bridge).

use std::sync::Arc;
use std::time::Duration;

use mountguard_controller::remediation::slurm::{
    JwtMinter, SecretToken, SharedSecret, SlurmClient, SlurmError, TokenSource,
};
use mountguard_core::remediation::{ATTEMPTS_ANNOTATION, AttemptsRecord};
use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{JWT_SECRET, NODESET, SLURM_NAMESPACE};
use mountguard_tests::mountguard::recorded_events;
use mountguard_tests::scenario::{rotate_auth_key, slurmd_pod, wait_for_slurmd_pods};
use mountguard_tests::slurmrestd::SlurmrestdDouble;
use serde_json::json;

use crate::harness::{Options, System, wait, wait_all_fresh, wait_metrics, wait_verdicts};

fn token(t: &str) -> Arc<dyn TokenSource> {
    let value = SharedSecret::default();
    value.set(Some(t.as_bytes().to_vec()));
    Arc::new(SecretToken { value })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slurm_client_against_the_slurmrestd_double() {
    let mut d = SlurmrestdDouble::start("slurm").await.unwrap();
    let h = d.handle();
    h.add_node("w0", 4);
    h.set_controller_key(b"key");
    h.slurmd_started("w0", b"key");
    h.add_token("tok", "slurm");
    let c = SlurmClient::new(&d.url(), None, token("tok"), Duration::from_secs(5)).unwrap();

    // A running job: the drain holds, the node is not drained yet.
    let job = h.start_job("w0", 2);
    let reason = "mountguard: slurm/w0 volume slurm-etc stale (mounted a vs current b) attempt 1";
    c.drain("w0", reason).await.unwrap();
    let n = c.get_node("w0").await.unwrap();
    assert_eq!(n.reason, reason);
    assert_eq!(n.reason_set_by_user, "slurm");
    assert!(n.to_state().drain() && n.to_state().busy(), "{:?}", n.state);
    assert_eq!(n.alloc_cpus, 2);
    // slurmctld moves to another key: as Slurm 26.05 shows it, the node of
    // the slurmd still on the old key is not DOWN, and Slurm still holds
    // the job's CPUs, so the node is still busy.
    h.set_controller_key(b"rotated");
    let n = c.get_node("w0").await.unwrap();
    assert!(!n.state.iter().any(|s| s == "DOWN"), "{:?}", n.state);
    assert!(n.to_state().busy(), "{:?} alloc {}", n.state, n.alloc_cpus);
    h.set_controller_key(b"key");
    h.end_job(job);
    let n = c.get_node("w0").await.unwrap();
    assert!(n.to_state().drained(), "{:?}", n.state);
    assert_eq!(n.alloc_cpus, 0);

    // An admin re-drains: our conditional undrain leaves it.
    h.admin_drain("w0", "admin: replace DIMM", "root");
    assert!(!c.undrain_if_reason("w0", reason).await.unwrap());
    assert!(h.node("w0").unwrap().state.contains(&"DRAIN".to_string()));
    // Ours again: undrained.
    c.drain("w0", reason).await.unwrap();
    assert!(c.undrain_if_reason("w0", reason).await.unwrap());
    assert!(!h.node("w0").unwrap().state.contains(&"DRAIN".to_string()));

    // Every body the double recorded is a valid update_node_msg.
    let writes = h.writes();
    assert!(writes.iter().all(|w| w.status == 200), "{writes:?}");
    assert!(
        writes
            .iter()
            .any(|w| w.body == json!({"state": ["UNDRAIN"]}))
    );

    // Minted HS256 tokens are accepted; a wrong key or token is a 401.
    h.set_jwt_key(b"jwt-key-of-the-double-0123456789");
    let key = SharedSecret::default();
    key.set(Some(b"jwt-key-of-the-double-0123456789".to_vec()));
    let minted = SlurmClient::new(
        &d.url(),
        None,
        Arc::new(JwtMinter {
            key: key.clone(),
            user: "slurm".into(),
            ttl: Duration::from_secs(60),
        }),
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(minted.nodes().await.unwrap().len(), 1);
    key.set(Some(b"some other key".to_vec()));
    let e = minted.get_node("w0").await.unwrap_err();
    assert!(matches!(e, SlurmError::Unauthorized { .. }), "{e}");
    let before = h.writes().len();
    let bad = SlurmClient::new(&d.url(), None, token("wrong"), Duration::from_secs(5)).unwrap();
    let e = bad.drain("w0", reason).await.unwrap_err();
    // A token slurmrestd cannot verify: 511 (Slurm 26.05), not retried.
    assert!(
        matches!(e, SlurmError::Unauthorized { status: 511, .. }),
        "{e}"
    );
    assert!(!e.is_transient());
    let w = h.writes();
    assert_eq!(w.len(), before + 1);
    assert_eq!(w.last().unwrap().status, 511, "refused, nothing changed");
    assert!(!h.node("w0").unwrap().state.contains(&"DRAIN".to_string()));
    let e = c.get_node("nope").await.unwrap_err();
    assert!(matches!(e, SlurmError::NotFound { .. }), "{e}");

    // Down: transient.
    let url = d.url();
    d.shutdown().await;
    let down = SlurmClient::new(&url, None, token("tok"), Duration::from_secs(2)).unwrap();
    let e = down.get_node("w0").await.unwrap_err();
    assert!(e.is_transient(), "{e}");
}

pub(crate) use crate::shared::remediation::FULL_RUN;

pub(crate) fn remediation_args(sys_url: &str, mode: &str, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "--remediation",
        mode,
        "--slurmrestd-url",
        sys_url,
        "--remediation-delay",
        "1s",
        "--replacement-timeout",
        "2m",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

pub(crate) async fn start(mode: &str, extra: &[&str]) -> System {
    // The URL of the cluster's slurmrestd is known only once it runs: start
    // without remediation, then restart the controller with it.
    let mut sys = System::start(Options::default()).await;
    let url = sys.cluster.slurmrestd_url();
    sys.opts.extra_controller_args = remediation_args(&url, mode, extra);
    sys.start_controller().await;
    sys
}

pub(crate) use mountguard_tests::rig::opt_in;

pub(crate) fn attempts(sys: &System) -> Vec<mountguard_core::remediation::Attempt> {
    let ns = sys
        .cluster
        .api()
        .get(&resources::NODESETS, SLURM_NAMESPACE, NODESET)
        .unwrap();
    ns["metadata"]["annotations"][ATTEMPTS_ANNOTATION]
        .as_str()
        .map(|s| AttemptsRecord::parse(s).unwrap().attempts)
        .unwrap_or_default()
}

pub(crate) fn evictions(sys: &System) -> usize {
    sys.cluster
        .api()
        .requests()
        .iter()
        .filter(|r| r.uri.contains("/eviction"))
        .count()
}

/// Scales the NodeSet to a fourth worker (two may be unavailable at a
/// time), which the NodeSet double places on node-0 next to worker 0: two
/// NodeSet pods pinning each other's cache entries of an immutable source,
/// which `--replace-pinning-pods` releases by replacing both together.
/// Waits (up to 60 s) until the four run; returns them (name, UID).
pub(crate) async fn four_workers(sys: &System) -> Vec<(String, String)> {
    let api = sys.cluster.api();
    api.merge_patch(
        &resources::NODESETS,
        SLURM_NAMESPACE,
        NODESET,
        &json!({"spec": {"replicas": 4, "updateStrategy": {"rollingUpdate": {"maxUnavailable": 2}}}}),
        None,
    )
    .unwrap();
    wait(sys, "four workers running", Duration::from_secs(60), || {
        let w = (0..4)
            .map(|i| slurmd_pod(&api, i))
            .collect::<Option<Vec<_>>>();
        async move { w }
    })
    .await
}

pub(crate) use crate::shared::remediation::in_service;

/// Waits until the controller counted a failed slurmrestd call.
pub(crate) async fn wait_slurm_errors_counted(sys: &System) {
    wait_metrics(
        sys,
        "slurmrestd errors counted",
        Duration::from_secs(60),
        |text| {
            text.lines()
                .any(|l| {
                    l.starts_with("mountguard_api_errors_total{operation=\"slurm_")
                        && !l.ends_with(" 0")
                })
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_workers_are_drained_evicted_verified_and_undrained_one_at_a_time() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    // A stale slurm.key leaves every old slurmd not responding (DOWN).
    let drained_by_us = || {
        (0..pods.len())
            .filter(|i| {
                slurm
                    .node(&pods[*i].0)
                    .is_some_and(|n| n.reason.starts_with("mountguard:"))
            })
            .count()
    };
    // Every worker ends replaced, fresh, responding and undrained.
    let mut max_parallel = 1;
    wait(
        &sys,
        "every worker repaired",
        Duration::from_secs(180),
        || {
            max_parallel = max_parallel.max(drained_by_us());
            let done = (0..pods.len()).all(|i| {
                let replaced = slurmd_pod(&api, i).is_some_and(|(_, uid)| uid != pods[i].1);
                let ok = slurm.node(&pods[i].0).is_some_and(|n| in_service(&n));
                replaced && ok
            });
            let a = attempts(&sys);
            let succeeded = a
                .iter()
                .filter(|a| a.phase == mountguard_core::remediation::Phase::Succeeded)
                .count();
            async move { (done && succeeded == 3).then_some(()) }
        },
    )
    .await;
    assert_eq!(max_parallel, 1, "one at a time");
    wait_all_fresh(&sys).await;
    for a in attempts(&sys) {
        assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
    }
    let reasons: Vec<String> = recorded_events(&api)
        .into_iter()
        .map(|e| e.reason)
        .collect();
    for r in [
        "RemediationStarted",
        "SlurmNodeDrained",
        "PodEvicted",
        "RemediationVerified",
        "RemediationSucceeded",
    ] {
        assert!(reasons.iter().any(|x| x == r), "{r} in {reasons:?}");
    }
    // Only evictions, never a bare delete of a slurmd pod by the controller.
    assert!(evictions(&sys) >= 3);
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dry_run_says_what_it_would_do_and_writes_nothing() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start("dry-run", &["--slurm-jwt-key-secret", &jwt]).await;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    wait(
        &sys,
        "a RemediationDryRun Event",
        Duration::from_secs(60),
        || {
            let ev = recorded_events(&api);
            async move {
                ev.iter()
                    .any(|e| e.reason == "RemediationDryRun" && e.message.contains("would drain"))
                    .then_some(())
            }
        },
    )
    .await;
    assert!(slurm.writes().is_empty(), "{:?}", slurm.writes());
    assert_eq!(evictions(&sys), 0);
    assert!(attempts(&sys).is_empty(), "no annotation written");
    for (i, (_, uid)) in pods.iter().enumerate() {
        assert_eq!(slurmd_pod(&api, i).map(|p| p.1).as_ref(), Some(uid));
    }
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_slurm_token_drains_nothing_and_touches_no_pod() {
    let sys_secret = "slurm-bogus-token";
    let mut sys = System::start(Options::default()).await;
    let api = sys.cluster.api();
    api.create(
        &resources::SECRETS,
        SLURM_NAMESPACE,
        json!({"metadata": {"name": sys_secret}, "stringData": {}, "data": {"SLURM_JWT": "bm90LWEtdG9rZW4="}}),
    )
    .unwrap();
    let url = sys.cluster.slurmrestd_url();
    let secret = format!("{SLURM_NAMESPACE}/{sys_secret}");
    sys.opts.extra_controller_args =
        remediation_args(&url, "on", &["--slurm-token-secret", &secret]);
    sys.start_controller().await;
    let slurm = sys.cluster.slurm();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    // slurmrestd refuses the token: the controller says so (API error
    // metric, log) and neither drains nor evicts.
    wait_slurm_errors_counted(&sys).await;
    // Long enough for the stale verdicts to pass the remediation delay.
    wait_verdicts(
        &sys,
        "stale verdicts past the delay",
        Duration::from_secs(30),
        "namespace=slurm",
        |doc| {
            let now = jiff::Timestamp::now();
            let n = doc["verdicts"]
                .as_array()?
                .iter()
                .filter(|v| v["state"] == "Stale")
                .filter(|v| {
                    v["since"]
                        .as_str()
                        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
                        .is_some_and(|t| now.duration_since(t) > jiff::SignedDuration::from_secs(3))
                })
                .count();
            (n >= 3).then_some(())
        },
    )
    .await;
    assert!(
        slurm.writes().iter().all(|w| w.status == 401),
        "{:?}",
        slurm.writes()
    );
    for (i, (host, uid)) in pods.iter().enumerate() {
        assert_eq!(slurmd_pod(&api, i).map(|p| p.1).as_ref(), Some(uid));
        let n = slurm.node(host).unwrap();
        assert!(!n.state.iter().any(|s| s == "DRAIN"), "{n:?}");
    }
    assert_eq!(evictions(&sys), 0);
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_cache_is_reported_not_looped_while_the_other_workers_are_repaired() {
    let pin = mountguard_tests::scenario::pinning_pod("node-0");
    pinned_cache_is_reported_not_looped(pin, mountguard_tests::scenario::PINNING_POD).await;
}

/// The pin held only by the env reference of a finished init container of
/// another pod: detected as ImmutableCachePinned naming that pod, and the
/// pinned worker is not replaced alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pin_held_only_by_a_finished_init_containers_env_is_reported_not_remediated() {
    use mountguard_tests::scenario::{INIT_ENV_PINNING_POD, init_env_pinning_pod};
    pinned_cache_is_reported_not_looped(init_env_pinning_pod("node-0"), INIT_ENV_PINNING_POD).await;
}

async fn pinned_cache_is_reported_not_looped(pin: serde_json::Value, pin_name: &str) {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt]).await;
    crate::shared::remediation::pinned_cache_is_reported_not_looped(&sys, pin, pin_name).await;
    sys.shutdown().await;
}

/// The kubelet doubles mount each new pod's volumes empty and write them
/// 4 s later, starting the containers only then (as the real kubelet sets
/// volumes up before it starts containers): the agents report the
/// replacements' empty volumes while their pods exist and do not run yet.
/// No attempt takes that for a replacement still stale: each waits until
/// its replacement runs, verifies it and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_seen_while_the_kubelet_still_writes_its_volumes_is_not_judged_stale() {
    let jwt = format!("{SLURM_NAMESPACE}/{JWT_SECRET}");
    let sys = start("on", &["--slurm-jwt-key-secret", &jwt]).await;
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    for i in 0..pods.len() {
        sys.cluster
            .kubelet(i)
            .set_volume_setup(Duration::from_secs(4));
    }
    opt_in(&sys);
    rotate_auth_key(&api).unwrap();
    crate::shared::operator::every_attempt_succeeded(&sys).await;
    sys.shutdown().await;
}

/// Asserts that `host` is in service within 3 s: Slurm shows a node
/// `NOT_RESPONDING` for up to 2 s after the UNDRAIN or RESUME that
/// released it (Slurm 26.05; the double's `set_resume_settle`).
pub(crate) async fn assert_in_service_soon(
    slurm: &mountguard_tests::slurmrestd::SlurmHandle,
    host: &str,
) {
    let by = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let n = slurm.node(host);
        if n.as_ref().is_some_and(in_service) {
            return;
        }
        assert!(std::time::Instant::now() < by, "{host}: {n:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
