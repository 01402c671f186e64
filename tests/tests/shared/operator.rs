//! Remediation against the Slinky operator's own Slurm writes (the
//! operator double's rules: the slurmd preStop hook and syncCordon of
//! slurm-operator v1.2.1), as bodies for both rigs: every node's Slurm
//! state is sampled throughout, and from mountguard's drain until the
//! replacement is verified no node is ever open to jobs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use mountguard_core::remediation::{Attempt, Phase};
use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{HOOKS_CONFIGMAP, NODESET, SLURM_NAMESPACE};
use mountguard_tests::objects::Objects;
use mountguard_tests::operator::PRESTOP_REASON;
use mountguard_tests::rig::{
    Rig, attempts, opt_in, wait, wait_all_fresh, wait_for_slurmd_pods, wait_verdicts,
};
use mountguard_tests::scenario::rotate_auth_key;
use mountguard_tests::slurmrestd::{NodeView, SlurmHandle, WriteRecord};
use serde_json::json;
use tokio::task::JoinHandle;

use super::remediation::{FULL_RUN, in_service};

/// Samples of `(when, host, node)`.
pub type Samples = Arc<Mutex<Vec<(Timestamp, String, NodeView)>>>;

/// Samples every host's Slurm node every 20 ms until aborted.
pub fn sample(slurm: SlurmHandle, hosts: Vec<String>) -> (Samples, JoinHandle<()>) {
    let out: Samples = Arc::default();
    let o = out.clone();
    let task = tokio::spawn(async move {
        loop {
            for h in &hosts {
                if let Some(n) = slurm.node(h) {
                    o.lock().unwrap().push((Timestamp::now(), h.clone(), n));
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (out, task)
}

/// A job could start: none of DRAIN, FAIL, DOWN (nor NOT_RESPONDING).
pub fn open_to_jobs(n: &NodeView) -> bool {
    !n.state
        .iter()
        .any(|s| matches!(s.as_str(), "DRAIN" | "FAIL" | "DOWN" | "NOT_RESPONDING"))
}

/// Checks one attempt against the samples of its node: from the first
/// sample with our drain until it entered Undraining (verified), the node
/// is never open to jobs. Returns the reasons seen in that window, in
/// order (each change once).
pub fn assert_closed_until_verified(samples: &Samples, a: &Attempt) -> Vec<String> {
    let verified = a
        .history
        .iter()
        .find(|e| e.phase == Phase::Undraining)
        .map(|e| e.at)
        .expect("verified");
    let s = samples.lock().unwrap();
    let mine: Vec<&(Timestamp, String, NodeView)> =
        s.iter().filter(|(_, h, _)| *h == a.slurm_node).collect();
    let from = mine
        .iter()
        .find(|(_, _, n)| mountguard_core::remediation::reason_is(&n.reason, &a.drain_reason))
        .map(|(t, _, _)| *t)
        .expect("our drain was seen");
    let mut reasons = Vec::new();
    for (t, _, n) in mine.iter().filter(|(t, _, _)| *t >= from && *t < verified) {
        assert!(
            !open_to_jobs(n),
            "{}: open to jobs at {t} between our drain ({from}) and the verification ({verified}): {n:?}",
            a.slurm_node
        );
        if reasons.last() != Some(&n.reason) {
            reasons.push(n.reason.clone());
        }
    }
    reasons
}

/// Waits until every worker's attempt (one per node of the 3-node rigs)
/// is closed, or until one failed, and asserts that each Succeeded with
/// every phase.
pub async fn every_attempt_succeeded<R: Rig>(sys: &R) -> Vec<Attempt> {
    let all = wait(
        sys,
        "every worker repaired",
        // Under the real tier's 300 s test limit, so a stuck attempt
        // fails with the logs instead of being killed without them.
        Duration::from_secs(240),
        || {
            let a = attempts(sys);
            // A failed attempt ends the wait at once (it may keep its
            // node drained, and so stay open): the assertions below say
            // why it failed.
            let failed = a.iter().any(|a| matches!(a.phase, Phase::Failed(_)));
            async move { (failed || (a.len() == 3 && a.iter().all(|a| !a.is_open()))).then_some(a) }
        },
    )
    .await;
    for a in &all {
        assert_eq!(a.phase, Phase::Succeeded, "{a:?}\n{}", sys.logs());
        assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
    }
    all
}

/// [`every_attempt_succeeded`], then every node `hosts` back in service
/// and no job killed.
pub async fn all_succeeded<R: Rig>(sys: &R, hosts: &[String]) -> Vec<Attempt> {
    let all = every_attempt_succeeded(sys).await;
    let slurm = sys.slurm();
    wait(
        sys,
        "every node in service",
        Duration::from_secs(30),
        || {
            let ok = hosts
                .iter()
                .all(|h| slurm.node(h).is_some_and(|n| in_service(&n)));
            async move { ok.then_some(()) }
        },
    )
    .await;
    assert!(slurm.killed_jobs().is_empty(), "{:?}", slurm.killed_jobs());
    all
}

/// `sys` runs the operator's rules and the controller with remediation on
/// (jwt.key Secret): after the key rotation every worker goes through
/// every phase, and only mountguard's reason is ever on a node between its
/// drain and its verification (the preStop hook cannot authenticate with
/// the stale key).
pub async fn stale_key_is_repaired_against_the_operators_rules<R: Rig>(sys: &R) {
    let api = sys.objects();
    let pods = wait_for_slurmd_pods(sys).await;
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(sys).await;
    let (samples, sampler) = sample(sys.slurm(), hosts.clone());
    opt_in(sys);
    rotate_auth_key(&*api).unwrap();
    let all = all_succeeded(sys, &hosts).await;
    sampler.abort();
    for a in &all {
        let reasons = assert_closed_until_verified(&samples, a);
        // The hook could not authenticate with the stale key: only our
        // reason was ever on the node in that window (with what Slurm
        // appends to it when the evicted slurmd's node is set DOWN).
        assert!(!reasons.is_empty(), "{a:?}");
        assert!(
            reasons
                .iter()
                .all(|r| mountguard_core::remediation::reason_is(r, &a.drain_reason)),
            "{reasons:?} {a:?}"
        );
        assert!(!a.prestop_down, "{a:?}");
    }
}

/// Waits (up to 60 s) until the replica answering on the rig's metrics
/// address says it acts (holds the Lease).
async fn wait_acting<R: Rig>(sys: &R, what: &str) {
    wait_verdicts(sys, what, Duration::from_secs(60), "", |doc| {
        (doc["acting"].as_bool() == Some(true)).then_some(())
    })
    .await;
}

/// `sys` runs the operator's rules, its own controller stopped by the
/// body: replica A leads while an attempt waits on a job and is killed;
/// replica B takes the Lease once it expires, resumes the same attempt from
/// the record, and every attempt succeeds with each phase once, each pod
/// evicted once, no node open to jobs before its verification.
pub async fn leader_failover_mid_attempt_finishes_it_once<R: Rig>(sys: &mut R) {
    sys.stop_controller();
    let api = sys.objects();
    let slurm = sys.slurm();
    let mut a = sys.spawn_replica("ctl-a").await;
    let pods = wait_for_slurmd_pods(sys).await;
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(sys).await;
    let (samples, sampler) = sample(slurm.clone(), hosts.clone());
    let jobs: Vec<u32> = hosts.iter().map(|h| slurm.start_job(h, 1)).collect();
    opt_in(sys);
    rotate_auth_key(&*api).unwrap();
    let first = wait(
        sys,
        "an attempt in Drained",
        Duration::from_secs(120),
        || {
            let a = attempts(sys)
                .into_iter()
                .find(|a| a.phase == Phase::Drained);
            async move { a }
        },
    )
    .await;
    // The leader dies mid-attempt; the other replica, on the same
    // addresses, takes the Lease once it expires and carries on.
    a.kill();
    let mut b = sys.spawn_replica("ctl-b").await;
    wait_acting(sys, "replica B acting").await;
    for j in jobs {
        slurm.end_job(j);
    }
    let all = all_succeeded(sys, &hosts).await;
    sampler.abort();
    assert!(
        all.iter().any(|x| x.id == first.id),
        "the same attempt went on: {all:?}"
    );
    for x in &all {
        assert_closed_until_verified(&samples, x);
        // Granted once: while Slurm shows jobs on the worker (a slurmd on a
        // stale key is not DOWN), the operator protects its pod and the
        // PodDisruptionBudget refuses (429) until the jobs end.
        assert_eq!(
            sys.granted_evictions_of(&x.pod),
            1,
            "{}: evicted once",
            x.pod
        );
    }
    b.kill();
}

/// slurmd reads its hooks at start: says so on the NodeSet's template and
/// on the running pods `hosts`.
pub fn hooks_read_at_start(api: &(impl Objects + ?Sized), hosts: &[String]) {
    let ann = json!({"metadata": {"annotations": {"mountguard.io/read-at-start": "hooks"}}});
    api.merge_patch(
        &resources::NODESETS,
        SLURM_NAMESPACE,
        NODESET,
        &json!({"spec": {"template": ann}}),
        None,
    )
    .unwrap();
    for h in hosts {
        api.merge_patch(&resources::PODS, SLURM_NAMESPACE, h, &ann, None)
            .unwrap();
    }
}

/// Changes the (mutable) hooks ConfigMap's script.
pub fn change_hooks(api: &(impl Objects + ?Sized)) {
    api.merge_patch(
        &resources::CONFIGMAPS,
        SLURM_NAMESPACE,
        HOOKS_CONFIGMAP,
        &json!({"data": {"99-mountguard.sh": "#!/bin/sh\necho new hooks\n"}}),
        None,
    )
    .unwrap();
}

/// Waits until two seconds have passed since the latest `startedAt` of the
/// slurmd pods `hosts`: `startedAt` has second precision, so mountguard
/// counts a refresh as later than a container's start only a second after
/// it (controller-shim/core/src/verdict/rules.rs); a change made sooner
/// may be judged read by the container, and so Fresh. Where the pods have
/// just started (the real operator makes them late), the change waits.
pub async fn past_every_container_start(api: &(impl Objects + ?Sized), hosts: &[String]) {
    let latest = hosts
        .iter()
        .filter_map(|h| api.get(&resources::PODS, SLURM_NAMESPACE, h).ok())
        .flat_map(|p| {
            p["status"]["containerStatuses"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter_map(|c| {
            c["state"]["running"]["startedAt"]
                .as_str()?
                .parse::<Timestamp>()
                .ok()
        })
        .max();
    if let Some(t) = latest {
        let until = t + jiff::SignedDuration::from_secs(2);
        let now = Timestamp::now();
        if until > now {
            tokio::time::sleep(until.duration_since(now).unsigned_abs()).await;
        }
    }
}

/// `sys` runs the operator's rules and the controller with remediation on
/// (jwt.key Secret): the hooks ConfigMap, read at start, changes; every
/// worker is `Frozen/ReadAtStart` and repaired. The key is current, so the
/// slurmd preStop hook, run by whatever runs the node's containers on the
/// eviction's graceful deletion, authenticates: its DOWN and reason
/// replace mountguard's drain, which mountguard sees and holds again (FAIL)
/// with its own reason; no node is open to jobs before its verification,
/// and each is released with a RESUME, never by the operator's UNDRAIN of
/// a node that still carried mountguard's reason. `fail_first`: the
/// controller runs with `--drain-state fail` (no DRAIN of ours at all).
pub async fn stale_hooks_read_at_start_are_repaired_through_the_prestop_hook<R: Rig>(
    sys: &R,
    fail_first: bool,
) {
    let api = sys.objects();
    let slurm = sys.slurm();
    let pods = wait_for_slurmd_pods(sys).await;
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    hooks_read_at_start(&*api, &hosts);
    wait_all_fresh(sys).await;
    past_every_container_start(&*api, &hosts).await;
    let (samples, sampler) = sample(slurm.clone(), hosts.clone());
    opt_in(sys);
    change_hooks(&*api);
    let all = all_succeeded(sys, &hosts).await;
    sampler.abort();
    for a in &all {
        assert!(
            a.findings.iter().any(|f| f.state == "Frozen/ReadAtStart"),
            "{a:?}"
        );
        let reasons = assert_closed_until_verified(&samples, a);
        assert!(
            reasons
                .iter()
                .all(|r| *r == a.drain_reason || r == PRESTOP_REASON),
            "only our reason and the hook's: {reasons:?}"
        );
        // The hook authenticated (the key is current): mountguard saw its
        // DOWN and reason replace ours, and drained again with its own.
        assert!(a.prestop_down, "{a:?}");
        // Drained (or, with `--drain-state fail`, held from the first
        // write), held with FAIL before the eviction, held again after the
        // hook: each with our reason.
        let ours = |state: &str| {
            slurm
                .writes()
                .iter()
                .filter(|w| {
                    w.node == a.slurm_node
                        && w.body == json!({"state": [state], "reason": a.drain_reason})
                })
                .count()
        };
        assert_eq!(
            ours("DRAIN"),
            usize::from(!fail_first),
            "drained once, or never with fail first"
        );
        assert!(ours("FAIL") >= 2, "held, then held again: {}", ours("FAIL"));
    }
    let writes = slurm.writes();
    for h in &hosts {
        assert!(
            writes
                .iter()
                .any(|w| w.node == *h && w.body == json!({"state": ["RESUME"]})),
            "{h}: {writes:?}"
        );
    }
}

/// Whether `w` is the Slinky operator's own pod-info write (only the
/// node's `comment`: slurm-operator
/// `internal/controller/nodeset/slurmcontrol/slurmcontrol.go`,
/// `UpdateNodeWithPodInfo`), the one Slurm write a rig's operator makes
/// while nothing is cordoned.
pub fn is_pod_info_comment(w: &WriteRecord) -> bool {
    w.body
        .as_object()
        .is_some_and(|o| o.len() == 1 && o.get("comment").is_some_and(serde_json::Value::is_string))
}

/// `sys` runs the controller with remediation on (jwt.key Secret) and the
/// NodeSet opted in: with everything Fresh, the controller is stopped and
/// a new one started; it takes over (acting) and sees everything Fresh
/// again, and neither process made a Slurm write, an attempt or an
/// eviction: every slurmd pod is the one it was.
pub async fn restart_with_everything_fresh_writes_nothing<R: Rig>(sys: &mut R) {
    let pods = wait_for_slurmd_pods(sys).await;
    wait_all_fresh(sys).await;
    opt_in(sys);
    // A few evaluations with remediation on and the opt-in seen.
    tokio::time::sleep(Duration::from_secs(3)).await;
    sys.stop_controller();
    let mut b = sys.spawn_replica("ctl-restarted").await;
    wait_acting(sys, "the new process acting").await;
    wait_all_fresh(sys).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes: Vec<WriteRecord> = sys
        .slurm()
        .writes()
        .into_iter()
        .filter(|w| !is_pod_info_comment(w))
        .collect();
    assert!(writes.is_empty(), "Slurm writes: {writes:?}");
    assert!(attempts(sys).is_empty(), "{:?}", attempts(sys));
    assert!(sys.pod_deletes().is_empty(), "{:?}", sys.pod_deletes());
    let now = wait_for_slurmd_pods(sys).await;
    assert_eq!(now, pods, "every slurmd pod is the one it was");
    for (p, _) in &pods {
        assert_eq!(sys.evictions_of(p), 0, "{p} evicted");
    }
    b.kill();
}
