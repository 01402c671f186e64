//! mountguard's Slurm side against real Slurm 26.05 (slurmctld, slurmd and
//! slurmrestd on loopback, built by `scripts/slurm.sh`): the controller's
//! own slurmrestd client, drain reason and verification rules, on the
//! seed's rotation as Slurm shows it. Without a Slurm build each test
//! prints SKIPPED with the reason.

use std::sync::Arc;
use std::time::Duration;

use mountguard_controller::remediation::slurm::{
    JwtMinter, SharedSecret, SlurmClient, SlurmError, SlurmNode,
};
use mountguard_core::remediation::machine::{Attempt, drain_reason, owns_reason, reason_is};
use mountguard_tests::real::slurm::{API, RealSlurm, SLURM_USER, SlurmConfig, random_key};
use mountguard_tests::rig::Rig as _;

const TIMEOUT: Duration = Duration::from_secs(6);

async fn start(test: &str, config: SlurmConfig) -> Option<RealSlurm> {
    let prefix = mountguard_tests::real::slurm::prefix_or_skip(test)?;
    Some(RealSlurm::start(&prefix, config).await.unwrap())
}

/// mountguard's client as the controller builds it with
/// `--slurm-jwt-key-secret`: tokens minted from `jwt_key` for `user`.
fn client(slurm: &RealSlurm, jwt_key: &[u8], user: &str) -> SlurmClient {
    let key = SharedSecret::default();
    key.set(Some(jwt_key.to_vec()));
    let minter = JwtMinter {
        key,
        user: user.to_string(),
        ttl: Duration::from_secs(300),
    };
    SlurmClient::new(
        &slurm.url(),
        None,
        Arc::new(minter),
        Duration::from_secs(10),
    )
    .unwrap()
}

async fn node(c: &SlurmClient, name: &str) -> SlurmNode {
    c.get_node(name).await.unwrap()
}

fn has(n: &SlurmNode, s: &str) -> bool {
    n.state.iter().any(|x| x == s)
}

fn now() -> jiff::Timestamp {
    jiff::Timestamp::now()
}

/// Waits until `f` holds for the node, reading every 250 ms.
async fn until(
    slurm: &RealSlurm,
    c: &SlurmClient,
    name: &str,
    what: &str,
    limit: Duration,
    f: impl Fn(&SlurmNode) -> bool,
) -> SlurmNode {
    slurm
        .wait(what, limit, || {
            let c = c.clone();
            let name = name.to_string();
            let ok = &f;
            async move {
                let n = c.get_node(&name).await.ok()?;
                ok(&n).then_some(n)
            }
        })
        .await
        .unwrap()
}

/// Waits for a job to reach `state`; panics with Slurm's logs after `limit`.
/// Waits for a job to reach `state` with nothing else: a job that ended is
/// `COMPLETING` until its node's slurmd confirms the end (and a slurmctld
/// restarted meanwhile would wait for that confirmation from a slurmd it
/// may no longer be able to hear).
async fn job_reaches(slurm: &RealSlurm, id: u64, state: &str, limit: Duration) {
    let waited = slurm
        .wait(&format!("job {id} {state}"), limit, || async move {
            (slurm.job_state(id).await == [state]).then_some(())
        })
        .await;
    if let Err(e) = waited {
        // Every job and node as slurmctld sees them: which job holds the
        // node, and why the one waited for did not run.
        let token = slurm.token(SLURM_USER);
        let (_, jobs) = slurm
            .call("GET", &format!("/slurm/{API}/jobs"), Some(&token), None)
            .await;
        let (_, nodes) = slurm
            .call("GET", &format!("/slurm/{API}/nodes"), Some(&token), None)
            .await;
        let jobs: Vec<_> = jobs["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|j| {
                format!(
                    "job {} {} {} nodes={} reason={}",
                    j["job_id"],
                    j["job_state"],
                    j["state_description"],
                    j["nodes"],
                    j["state_reason"]
                )
            })
            .collect();
        let nodes: Vec<_> = nodes["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| format!("node {} {} reason={}", n["name"], n["state"], n["reason"]))
            .collect();
        panic!("{e}\n{}\n{}", jobs.join("\n"), nodes.join("\n"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_answers_are_classified_by_mountguards_slurmrestd_client() {
    let Some(slurm) = start(
        "real_slurm_answers_are_classified_by_mountguards_slurmrestd_client",
        SlurmConfig::nodes(1),
    )
    .await
    else {
        return;
    };
    let admin = client(&slurm, slurm.jwt_key(), SLURM_USER);

    // A node slurmctld does not know: 200 without nodes on a read, 422/2018
    // on a write; both NotFound, neither transient.
    let e = admin.get_node("node-9").await.unwrap_err();
    assert!(matches!(e, SlurmError::NotFound { .. }), "{e:?}");
    let e = admin.drain("node-9", "mountguard: x").await.unwrap_err();
    assert!(matches!(e, SlurmError::NotFound { .. }), "{e:?}");
    assert!(!e.is_transient());

    // A token signed with another key: 511 (error 1007), an authentication
    // failure that names the key to check, not a transient server error.
    let forged = client(&slurm, &random_key(32), SLURM_USER);
    let e = forged.get_node("node-0").await.unwrap_err();
    assert!(
        matches!(e, SlurmError::Unauthorized { status: 511, .. }),
        "{e:?}"
    );
    assert!(!e.is_transient(), "{e:?}");
    assert!(e.to_string().contains("jwt"), "{e}");

    // A user who is not a Slurm administrator reads, and is refused a write
    // (422/2010) with a message that says so.
    let user = client(&slurm, slurm.jwt_key(), "nobody");
    assert!(user.get_node("node-0").await.is_ok());
    let e = user.drain("node-0", "mountguard: x").await.unwrap_err();
    assert!(matches!(e, SlurmError::Unauthorized { .. }), "{e:?}");
    assert!(e.to_string().contains("administrator"), "{e}");
    assert!(!has(&node(&admin, "node-0").await, "DRAIN"));

    // RESUME of an open node (422/2180) is what a RESUME asks for: done.
    admin.resume("node-0").await.unwrap();

    // A drain, its reason and user as Slurm keeps them, released by reason.
    admin
        .drain("node-0", "mountguard: classified")
        .await
        .unwrap();
    let n = node(&admin, "node-0").await;
    assert!(has(&n, "DRAIN"), "{n:?}");
    assert_eq!(n.reason, "mountguard: classified");
    assert_eq!(n.reason_set_by_user, SLURM_USER);
    assert!(
        !admin
            .undrain_if_reason("node-0", "mountguard: other")
            .await
            .unwrap()
    );
    assert!(
        admin
            .undrain_if_reason("node-0", "mountguard: classified")
            .await
            .unwrap()
    );
    let n = until(&slurm, &admin, "node-0", "node-0 open", TIMEOUT, |n| {
        !has(n, "DRAIN") && !has(n, "NOT_RESPONDING")
    })
    .await;
    assert!(has(&n, "IDLE"), "{n:?}");
}

/// The seed's failure as Slurm shows it, and its repair: slurmctld on the
/// new key, node-1's slurmd still on the old one. The stale node is never
/// DOWN and no read of it looks broken for long, but no job starts on it
/// and its `slurmd_start_time` never moves, so mountguard's verification
/// (a registration after the replacement started) fails it. The repair:
/// drain, the slurmd replaced on the new key, verified by registration,
/// resumed by reason; a job pinned to it then completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_a_slurmd_on_the_old_key_looks_idle_runs_nothing_and_is_repaired_by_registration()
 {
    let Some(slurm) = start(
        "real_slurm_a_slurmd_on_the_old_key_looks_idle_runs_nothing_and_is_repaired_by_registration",
        SlurmConfig::nodes(2),
    )
    .await
    else {
        return;
    };
    let c = client(&slurm, slurm.jwt_key(), SLURM_USER);
    let before = node(&c, "node-1").await;
    let new_key = random_key(64);
    let rotated = now();
    slurm.restart_ctld_with_key(&new_key).await.unwrap();
    let current = slurm.key_file("node-0-new", &new_key).unwrap();
    slurm.start_slurmd("node-0", &current).unwrap();

    // A job pinned to each node: node-0's completes, node-1's never starts.
    let good = slurm
        .submit_pinned_job("node-0", "#!/bin/sh\ntrue\n")
        .await
        .unwrap();
    let stale = slurm
        .submit_pinned_job("node-1", "#!/bin/sh\ntrue\n")
        .await
        .unwrap();
    job_reaches(&slurm, good, "COMPLETED", TIMEOUT * 5).await;
    let mut seen = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + TIMEOUT * 4;
    while tokio::time::Instant::now() < deadline {
        let n = node(&c, "node-1").await;
        seen.extend(n.state.iter().cloned());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        !seen.contains("DOWN"),
        "a stale running slurmd is never DOWN: {seen:?}"
    );
    assert!(seen.contains("IDLE"), "{seen:?}");
    // Between NOT_RESPONDING phases the node looks IDLE, so slurmctld may
    // try the job there; its launch then fails authentication. Either way
    // it never completes.
    let states = slurm.job_state(stale).await;
    assert!(
        !states.iter().any(|s| s == "COMPLETED"),
        "the job pinned to the stale node: {states:?}"
    );
    // A job whose launch failed is requeued and held by Slurm (and would
    // hold the queue of the node under sched/builtin): it has shown what
    // it had to. Cancelled, it stays COMPLETING on node-1 until slurmctld
    // re-sends its termination to a slurmd that answers (the rig's
    // KillWait and MinJobAge: about 16 s after the repair below).
    slurm.cancel_job(stale).await.unwrap();
    // The restarted slurmctld has seen no registration of node-1's slurmd:
    // it shows slurmd_start_time 0 (it was the slurmd's start before).
    let n1 = node(&c, "node-1").await;
    assert!(before.slurmd_start_time > Some(0), "{before:?}");
    assert_eq!(n1.slurmd_start_time, Some(0), "{n1:?}");
    assert!(!Attempt::replacement_registered(
        &n1.to_state(),
        Some(rotated)
    ));
    let n0 = node(&c, "node-0").await;
    assert!(
        Attempt::replacement_registered(&n0.to_state(), Some(rotated)),
        "{n0:?}"
    );

    // The repair, with mountguard's client and rules.
    let reason = drain_reason("slurm", "slinky-1", &[], "a1b2c3d4e5");
    c.drain("node-1", &reason).await.unwrap();
    slurm.stop_slurmd("node-1");
    // A container starts on whole seconds of the node's clock.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let replaced = now();
    let file = slurm.key_file("node-1-new", &new_key).unwrap();
    slurm.start_slurmd("node-1", &file).unwrap();
    let n = until(
        &slurm,
        &c,
        "node-1",
        "node-1 registered on the new key",
        TIMEOUT * 3,
        |n| {
            Attempt::replacement_registered(&n.to_state(), Some(replaced))
                && !has(n, "NOT_RESPONDING")
        },
    )
    .await;
    assert!(
        has(&n, "DRAIN") && owns_reason(&n.reason, "a1b2c3d4e5"),
        "{n:?}"
    );
    assert!(c.resume_if_reason("node-1", &reason).await.unwrap());
    let job = slurm
        .submit_pinned_job("node-1", "#!/bin/sh\ntrue\n")
        .await
        .unwrap();
    // Up to one re-sent termination of the cancelled job, then the job.
    job_reaches(&slurm, job, "COMPLETED", TIMEOUT * 10).await;
}

/// A replacement that takes longer than SlurmdTimeout: Slurm sets the
/// drained node DOWN and rewrites the reason to `<ours> : Not responding`
/// under SlurmUser. The drain is still mountguard's (its attempt id), the
/// node stays DOWN+DRAIN after the new slurmd registers, and mountguard's
/// resume by reason releases it; a pinned job then completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_rewrites_the_drain_reason_past_slurmd_timeout_and_the_drain_stays_mountguards()
{
    let Some(slurm) = start(
        "real_slurm_rewrites_the_drain_reason_past_slurmd_timeout_and_the_drain_stays_mountguards",
        SlurmConfig::nodes(1),
    )
    .await
    else {
        return;
    };
    let c = client(&slurm, slurm.jwt_key(), SLURM_USER);
    let reason = drain_reason("slurm", "slinky-0", &[], "0f1e2d3c4b");
    c.drain("node-0", &reason).await.unwrap();
    slurm.stop_slurmd("node-0");
    let down = until(&slurm, &c, "node-0", "node-0 DOWN", TIMEOUT * 4, |n| {
        has(n, "DOWN")
    })
    .await;
    assert_eq!(
        down.reason,
        format!("{reason} : Not responding"),
        "{down:?}"
    );
    assert_eq!(down.reason_set_by_user, SLURM_USER);
    assert!(owns_reason(&down.reason, "0f1e2d3c4b"), "{down:?}");
    assert!(reason_is(&down.reason, &reason));

    tokio::time::sleep(Duration::from_secs(1)).await;
    let replaced = now();
    let file = slurm
        .key_file("node-0-again", &slurm.cluster_key())
        .unwrap();
    slurm.start_slurmd("node-0", &file).unwrap();
    let n = until(
        &slurm,
        &c,
        "node-0",
        "node-0 registered",
        TIMEOUT * 3,
        |n| {
            Attempt::replacement_registered(&n.to_state(), Some(replaced))
                && !has(n, "NOT_RESPONDING")
        },
    )
    .await;
    // Registered, and still DOWN+DRAIN: Slurm returns only a DOWN whose
    // reason is exactly "Not responding" (ReturnToService=1).
    assert!(has(&n, "DOWN") && has(&n, "DRAIN"), "{n:?}");
    assert!(c.resume_if_reason("node-0", &reason).await.unwrap());
    let n = until(&slurm, &c, "node-0", "node-0 in service", TIMEOUT, |n| {
        !has(n, "DOWN") && !has(n, "DRAIN") && !has(n, "NOT_RESPONDING")
    })
    .await;
    assert!(has(&n, "IDLE"), "{n:?}");
    let job = slurm
        .submit_pinned_job("node-0", "#!/bin/sh\ntrue\n")
        .await
        .unwrap();
    job_reaches(&slurm, job, "COMPLETED", TIMEOUT * 5).await;
}

/// A pinned node: its replacement's slurmd still reads the old key.
/// With ReturnToService=1, Slurm puts a DOWN "Not responding" node whose
/// slurmd answers back in service by itself (IDLE); nothing registered,
/// so mountguard's verification fails it, and no job runs there. Under
/// mountguard's drain, Slurm's rewritten reason keeps the node drained.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_return_to_service_reopens_a_stale_slurmd_and_verification_still_fails_it() {
    let Some(slurm) = start(
        "real_slurm_return_to_service_reopens_a_stale_slurmd_and_verification_still_fails_it",
        SlurmConfig::nodes(2),
    )
    .await
    else {
        return;
    };
    let c = client(&slurm, slurm.jwt_key(), SLURM_USER);
    let old_key = slurm.cluster_key();
    // node-0 without a drain, node-1 under mountguard's; both slurmd
    // stopped (their pods evicted) until Slurm sets them DOWN.
    let reason = drain_reason("slurm", "slinky-1", &[], "9a8b7c6d5e");
    c.drain("node-1", &reason).await.unwrap();
    for n in ["node-0", "node-1"] {
        slurm.stop_slurmd(n);
    }
    for n in ["node-0", "node-1"] {
        until(&slurm, &c, n, "DOWN for not responding", TIMEOUT * 4, |x| {
            has(x, "DOWN")
        })
        .await;
    }
    // The rotation: slurmctld on the new key; the replacements' slurmd
    // still read the old one (the kubelet's pinned copy).
    slurm.restart_ctld_with_key(&random_key(64)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let replaced = now();
    for n in ["node-0", "node-1"] {
        let file = slurm.key_file(&format!("{n}-old"), &old_key).unwrap();
        slurm.start_slurmd(n, &file).unwrap();
    }
    let reopened = until(
        &slurm,
        &c,
        "node-0",
        "node-0 back in service",
        TIMEOUT * 4,
        |n| !has(n, "DOWN"),
    )
    .await;
    assert!(
        !Attempt::replacement_registered(&reopened.to_state(), Some(replaced)),
        "{reopened:?}"
    );
    let job = slurm
        .submit_pinned_job("node-0", "#!/bin/sh\ntrue\n")
        .await
        .unwrap();
    tokio::time::sleep(TIMEOUT * 2).await;
    // Slurm may try it there between NOT_RESPONDING phases; its launch
    // fails authentication: it never completes.
    let states = slurm.job_state(job).await;
    assert!(
        !states.iter().any(|s| s == "COMPLETED"),
        "the job pinned to the reopened stale node: {states:?}"
    );
    let held = node(&c, "node-1").await;
    assert!(
        has(&held, "DRAIN") && reason_is(&held.reason, &reason),
        "{held:?}"
    );
    assert!(!Attempt::replacement_registered(
        &held.to_state(),
        Some(replaced)
    ));
}

/// Every attempt of the rig closed; panics with the logs when one failed
/// or when they are not all closed within `limit`.
async fn attempts_succeeded(
    sys: &crate::harness::RealSystem,
    slurm: &RealSlurm,
    c: &SlurmClient,
    count: usize,
    limit: Duration,
) -> Vec<Attempt> {
    use mountguard_core::remediation::Phase;
    let deadline = tokio::time::Instant::now() + limit;
    let all = loop {
        let a = mountguard_tests::rig::attempts(sys);
        let failed = a.iter().any(|a| matches!(a.phase, Phase::Failed(_)));
        if failed || (a.len() >= count && a.iter().all(|a| !a.is_open())) {
            break a;
        }
        if tokio::time::Instant::now() > deadline {
            panic!(
                "timed out after {limit:?} waiting for every worker repaired: {a:#?}\nSlurm: {:#?}\n{}\n{}",
                c.nodes().await,
                slurm.logs(15),
                sys.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for a in &all {
        assert_eq!(a.phase, Phase::Succeeded, "{a:?}\n{}", sys.logs());
    }
    all
}

/// The seed's rotation repaired by mountguard's controller with Slurm
/// itself judging it: the immutable `slurm-auth-slurm` recreated with a new
/// key; slurmctld restarted on it; each worker's slurmd (a process on the
/// `slurm.key` file the node wrote into the pod's volume) still on the old
/// key. The controller drains through real slurmrestd, evicts, and
/// verifies the replacement by its registration with the new key before it
/// resumes; a job pinned to each worker then completes. A second rotation
/// with the replacements' slurmd starting 15 s after their containers
/// (longer than SlurmdTimeout): Slurm sets the drained nodes DOWN and
/// rewrites mountguard's reason to `<reason> : Not responding`; the drains
/// are still mountguard's, and released.
///
/// On node doubles (each slurmd on the key file its node double wrote).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_the_controller_repairs_a_stale_key_and_slurm_runs_a_job_on_every_worker() {
    let test = "real_slurm_the_controller_repairs_a_stale_key_and_slurm_runs_a_job_on_every_worker";
    let Some(prefix) = mountguard_tests::real::slurm::prefix_or_skip(test) else {
        return;
    };
    let sys = crate::harness::RealSystem::start_remediation_on_real_slurm(2, prefix, false).await;
    controller_repairs_a_stale_key_on_real_slurm(sys).await;
}

/// The same on real kubelets: each slurmd reads the `slurm.key` the real
/// kubelet's Secret manager and volume manager wrote into its pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_on_real_kubelets_the_controller_repairs_a_stale_key_and_slurm_runs_a_job_on_every_worker()
 {
    let test = "real_slurm_on_real_kubelets_the_controller_repairs_a_stale_key_and_slurm_runs_a_job_on_every_worker";
    let Some(prefix) = mountguard_tests::real::slurm::prefix_or_skip(test) else {
        return;
    };
    let sys = crate::harness::RealSystem::start_remediation_on_real_slurm(2, prefix, true).await;
    controller_repairs_a_stale_key_on_real_slurm(sys).await;
}

/// Submits a job pinned to each of `hosts` and waits until each completed.
async fn a_job_completes_on_each(slurm: &RealSlurm, hosts: &[String]) {
    for h in hosts {
        let job = slurm
            .submit_pinned_job(h, "#!/bin/sh\ntrue\n")
            .await
            .unwrap();
        job_reaches(slurm, job, "COMPLETED", TIMEOUT * 5).await;
    }
}

/// Waits until every worker pod's slurmd registered on the first key and
/// every verdict is fresh, then opts the NodeSet in; returns the workers'
/// Slurm node names.
async fn workers_registered_and_opted_in(
    sys: &crate::harness::RealSystem,
    slurm: &RealSlurm,
    c: &SlurmClient,
) -> Vec<String> {
    let pods = mountguard_tests::rig::wait_for_slurmd_pods(sys).await;
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    for h in &hosts {
        until(
            slurm,
            c,
            h,
            "registered on the first key",
            TIMEOUT * 5,
            |n| n.slurmd_start_time > Some(0) && !has(n, "NOT_RESPONDING"),
        )
        .await;
    }
    mountguard_tests::rig::wait_all_fresh(sys).await;
    mountguard_tests::rig::opt_in(sys);
    hosts
}

/// The body of the two tests above.
async fn controller_repairs_a_stale_key_on_real_slurm(sys: crate::harness::RealSystem) {
    let slurm = sys.cluster.real_slurm().expect("real Slurm");
    let c = client(&slurm, slurm.jwt_key(), SLURM_USER);
    let hosts = workers_registered_and_opted_in(&sys, &slurm, &c).await;

    // Round 1: the rotation; replacements start at once.
    mountguard_tests::scenario::rotate_auth_key(&*sys.objects()).unwrap();
    let first = attempts_succeeded(&sys, &slurm, &c, hosts.len(), Duration::from_secs(200)).await;
    for a in &first {
        let n = until(&slurm, &c, &a.slurm_node, "in service", TIMEOUT * 2, |n| {
            !has(n, "DRAIN") && !has(n, "DOWN") && !has(n, "NOT_RESPONDING")
        })
        .await;
        assert!(n.slurmd_start_time > Some(0), "{n:?}");
    }
    a_job_completes_on_each(&slurm, &hosts).await;

    // Round 2: replacements whose slurmd starts after SlurmdTimeout.
    slurm.set_slurmd_delay(TIMEOUT * 5 / 2);
    let reasons = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let sampler = {
        let (c, hosts, reasons) = (c.clone(), hosts.clone(), reasons.clone());
        tokio::spawn(async move {
            loop {
                for h in &hosts {
                    if let Ok(n) = c.get_node(h).await {
                        reasons.lock().unwrap().insert(n.reason);
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    mountguard_tests::scenario::rotate_auth_key(&*sys.objects()).unwrap();
    let all = attempts_succeeded(&sys, &slurm, &c, hosts.len() * 2, Duration::from_secs(240)).await;
    sampler.abort();
    let second: Vec<&Attempt> = all
        .iter()
        .filter(|a| !first.iter().any(|f| f.id == a.id))
        .collect();
    assert_eq!(second.len(), hosts.len(), "{all:?}");
    let seen = reasons.lock().unwrap().clone();
    for a in &second {
        assert!(
            seen.contains(&format!("{} : Not responding", a.drain_reason)),
            "Slurm rewrote {:?}: {seen:?}",
            a.drain_reason
        );
    }
    for h in &hosts {
        until(&slurm, &c, h, "in service", TIMEOUT * 2, |n| {
            !has(n, "DRAIN") && !has(n, "DOWN") && !has(n, "NOT_RESPONDING")
        })
        .await;
    }
    a_job_completes_on_each(&slurm, &hosts).await;
    sys.shutdown().await;
}

/// Slinky's workers are dynamic Slurm nodes (`slurmd -Z`). The rotation
/// with slurmctld restarted on the new key without its saved state (a new
/// StateSaveLocation): a worker whose slurmd is on the old key never
/// registers, so slurmctld does not know its node at all and there is
/// nothing to drain. With `--absent-slurm-node replace` the controller
/// evicts each worker without a Slurm write; each replacement's slurmd
/// creates its node by registering on the new key; the attempts succeed
/// with no drain and no undrain, and a job pinned to each worker completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_slurm_a_dynamic_node_gone_from_slurmctld_is_replaced_without_a_drain() {
    let test = "real_slurm_a_dynamic_node_gone_from_slurmctld_is_replaced_without_a_drain";
    let Some(prefix) = mountguard_tests::real::slurm::prefix_or_skip(test) else {
        return;
    };
    let mut sys =
        crate::harness::RealSystem::start_remediation_on_real_dynamic_slurm(2, prefix).await;
    sys.restart_controller_with(&[
        ("MOUNTGUARD_ABSENT_SLURM_NODE", "replace"),
        ("MOUNTGUARD_SLURM_NOT_FOUND_GRACE", "5s"),
    ])
    .await;
    let slurm = sys.cluster.real_slurm().expect("real Slurm");
    let c = client(&slurm, slurm.jwt_key(), SLURM_USER);
    let hosts = workers_registered_and_opted_in(&sys, &slurm, &c).await;

    mountguard_tests::scenario::rotate_auth_key(&*sys.objects()).unwrap();
    // slurmctld, restarted on the new key without its state, does not know
    // the workers whose slurmd is still on the old key.
    for h in &hosts {
        slurm
            .wait(&format!("{h} unknown to slurmctld"), TIMEOUT * 10, || {
                let c = c.clone();
                let h = h.clone();
                async move {
                    matches!(c.get_node(&h).await, Err(SlurmError::NotFound { .. })).then_some(())
                }
            })
            .await
            .unwrap();
    }
    let all = attempts_succeeded(&sys, &slurm, &c, hosts.len(), Duration::from_secs(200)).await;
    for a in &all {
        assert!(a.slurm_absent && !a.drain_requested, "{a:?}");
        let phases = a.phase_names();
        assert!(
            !phases.iter().any(|p| p.contains("rain")),
            "no Draining, Drained or Undraining: {phases:?}"
        );
        let n = node(&c, &a.slurm_node).await;
        assert!(
            !has(&n, "DRAIN") && !has(&n, "FAIL") && n.reason.is_empty(),
            "{n:?}"
        );
    }
    a_job_completes_on_each(&slurm, &hosts).await;
}
