//! The controller killed (SIGKILL, by its own fail point) right after it
//! persisted an attempt in each phase, before the write that phase
//! persisted for, as one body for both rigs. The record alone must carry
//! the attempt: each one finishes once, every pod is evicted once, no node
//! is opened before its replacement is verified, and none stays drained.
//! The controller binary of the test build has the `failpoints` feature
//! (controller-shim/src/runtime/failpoint.rs).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use mountguard_controller::runtime::failpoint::PERSISTED;
use mountguard_tests::apiserver::resources;
use mountguard_tests::mountguard::{ChildGuard, poll, wait_ready};
use mountguard_tests::rig::{Rig, attempts, opt_in, wait_all_fresh, wait_for_slurmd_pods};
use mountguard_tests::scenario::rotate_auth_key;

use super::operator::{Samples, all_succeeded, assert_closed_until_verified, sample};
use super::remediation::FULL_RUN;
use mountguard_core::remediation::Attempt;
use tokio::task::JoinHandle;

/// The replica every controller of these tests acts as.
const REPLICA: &str = "ctl-crash";

/// Once every worker is Fresh: samples their Slurm nodes, opts the
/// NodeSet in and rotates the auth key, which leaves every worker stale.
/// Returns the Slurm hosts, the samples and the sampling task.
pub async fn stale_workers<R: Rig>(sys: &R) -> (Vec<String>, Samples, JoinHandle<()>) {
    let pods = wait_for_slurmd_pods(sys).await;
    let hosts: Vec<String> = pods.iter().map(|p| p.0.clone()).collect();
    wait_all_fresh(sys).await;
    let (samples, sampler) = sample(sys.slurm(), hosts.clone());
    opt_in(sys);
    rotate_auth_key(&*sys.objects()).unwrap();
    (hosts, samples, sampler)
}

/// Every attempt of `all` went through each phase of [`FULL_RUN`] once,
/// kept its node closed until verified and evicted its pod once; no pod
/// was deleted.
pub fn each_once<R: Rig>(sys: &R, samples: &Samples, all: &[Attempt]) {
    for a in all {
        assert_eq!(a.phase_names(), FULL_RUN, "{a:?}");
        assert_closed_until_verified(samples, a);
        assert_eq!(sys.evictions_of(&a.pod), 1, "{}: evicted once", a.pod);
    }
    assert!(sys.pod_deletes().is_empty(), "{:?}", sys.pod_deletes());
}

/// `FAILPOINTS` that kills the controller after its first persist of an
/// attempt in `phase`.
pub fn kill_after_persist_in(phase: &str) -> String {
    format!("{PERSISTED}=return({phase})")
}

/// `FAILPOINTS` that stops the controller (SIGSTOP) after its first
/// persist of an attempt in `phase`.
pub fn stop_after_persist_in(phase: &str) -> String {
    format!("{PERSISTED}=return({phase}:stop)")
}

/// Starts replica `name` with `FAILPOINTS` set to `failpoints` (`None`:
/// none) and waits until it is ready.
pub async fn launch_with<R: Rig>(sys: &R, name: &str, failpoints: Option<&str>) -> ChildGuard {
    let env: Vec<(&str, &str)> = failpoints.iter().map(|f| ("FAILPOINTS", *f)).collect();
    let mut c = sys.launch_replica(name, &env).await;
    if let Err(e) = wait_ready(&mut c, &sys.metrics_base(), Duration::from_secs(60)).await {
        panic!("{name} did not become ready: {e}\n{}", sys.logs());
    }
    c
}

/// Starts the replica with the kill set for `phase` (`None`: no fail
/// point) and waits until it is ready.
pub async fn launch<R: Rig>(sys: &R, phase: Option<&str>) -> ChildGuard {
    let fp = phase.map(kill_after_persist_in);
    launch_with(sys, REPLICA, fp.as_deref()).await
}

/// Waits until the controller `c` killed itself at the fail point of
/// `phase`; panics if it does not within `within` or exits otherwise.
pub async fn killed_at<R: Rig>(sys: &R, c: &mut ChildGuard, phase: &str, within: Duration) {
    let status = poll(
        &format!("the kill after a persist in {phase}"),
        within,
        || {
            let s = c.exited();
            async move { s }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", sys.logs()));
    assert_eq!(
        status.signal(),
        Some(9),
        "{REPLICA} exited ({status:?}) instead of at the fail point in {phase}\n{}",
        c.log_tail(40)
    );
    let log = c.log_tail(5);
    assert!(
        log.contains("fail point: signalling this process") && log.contains(phase),
        "not killed by the fail point in {phase}: {log}"
    );
}

/// `sys` runs the controller with remediation on (jwt.key Secret), on
/// three workers; the key rotation leaves every worker stale. The rig's
/// controller is stopped and replaced by one replica started again after
/// each kill, once for every phase of [`FULL_RUN`] that is persisted (all
/// but `Pending`, which lives in memory until its drain is persisted with
/// `Draining`: controller-shim/core/src/remediation/machine.rs, `step`).
pub async fn killed_after_every_persist_finishes_each_attempt_once<R: Rig>(sys: &mut R) {
    sys.stop_controller();
    let slurm = sys.slurm();
    let persisted_phases = &FULL_RUN[1..];
    let mut c = launch(sys, Some(persisted_phases[0])).await;
    let (hosts, samples, sampler) = stale_workers(sys).await;
    for (i, phase) in persisted_phases.iter().enumerate() {
        killed_at(sys, &mut c, phase, Duration::from_secs(180)).await;
        // Down between the persist and the write: every Slurm node with
        // our reason has its open attempt on record.
        let persisted = attempts(sys);
        for h in &hosts {
            let n = slurm.node(h).unwrap();
            if n.reason.starts_with("mountguard:") && !super::remediation::in_service(&n) {
                assert!(
                    persisted.iter().any(|a| a.is_open()
                        && mountguard_core::remediation::reason_is(&n.reason, &a.drain_reason)),
                    "killed in {phase}: {h} closed ({:?}) without a live attempt: {persisted:?}",
                    n.reason
                );
            }
        }
        c = launch(sys, persisted_phases.get(i + 1).copied()).await;
    }
    let all = all_succeeded(sys, &hosts).await;
    sampler.abort();
    each_once(sys, &samples, &all);
    c.kill();
}

/// The replica stopped after a persist, and the holder that takes its
/// Lease meanwhile (written by the test: no process behind it).
const STALLED: &str = "ctl-stalled";
const OTHER_HOLDER: &str = "ctl-other-holder";

/// Waits until `c` stopped itself (SIGSTOP) at its fail point.
pub async fn stopped_at<R: Rig>(sys: &R, c: &mut ChildGuard, phase: &str, within: Duration) {
    let r = poll(
        &format!("{} to stop after a persist in {phase}", c.name()),
        within,
        || {
            let r = match c.exited() {
                Some(s) => Some(Err(s)),
                None => c.is_stopped().then_some(Ok(())),
            };
            async move { r }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", sys.logs()));
    if let Err(s) = r {
        panic!(
            "{} exited ({s:?}) instead of stopping\n{}",
            c.name(),
            c.log_tail(40)
        );
    }
    let log = c.log_tail(5);
    assert!(
        log.contains("fail point: signalling this process") && log.contains(phase),
        "not stopped by the fail point in {phase}: {log}"
    );
}

/// The Lease whose holder names `replica`: (namespace, name, spec).
fn lease_held_by<R: Rig>(sys: &R, replica: &str) -> (String, String, Value) {
    let leases = sys.objects().list_all(&resources::LEASES, None);
    leases
        .iter()
        .find(|l| {
            l["spec"]["holderIdentity"]
                .as_str()
                .is_some_and(|h| h.contains(replica))
        })
        .map(|l| {
            (
                l["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                l["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                l["spec"].clone(),
            )
        })
        .unwrap_or_else(|| panic!("no Lease held by {replica}: {leases:?}"))
}

/// A Lease time (`MicroTime`, RFC 3339 with microseconds).
fn micro_time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

/// The Lease lost while a write is pending: the replica persisted an
/// attempt in `Evicting` and stops (SIGSTOP) before the eviction. Once its
/// Lease has expired, another holder takes it (as a second replica would,
/// by the rules of client-go's leader elector,
/// tools/leaderelection/leaderelection.go `tryAcquireOrRenew`). Continued,
/// the replica goes on with the step it stopped in: the eviction must be
/// judged again against the Lease and not be made. When the other holder
/// lets its Lease expire, the replica takes it again and finishes every
/// attempt from the record, each pod evicted once.
pub async fn stalled_past_its_lease_writes_nothing_when_it_goes_on<R: Rig>(sys: &mut R) {
    sys.stop_controller();
    let fp = stop_after_persist_in("Evicting");
    let mut stalled = launch_with(sys, STALLED, Some(&fp)).await;
    let (hosts, samples, sampler) = stale_workers(sys).await;
    stopped_at(sys, &mut stalled, "Evicting", Duration::from_secs(180)).await;
    let pending: Vec<_> = attempts(sys)
        .into_iter()
        .filter(|a| a.phase.name() == "Evicting")
        .collect();
    assert_eq!(
        pending.len(),
        1,
        "one attempt stopped in Evicting: {pending:?}"
    );
    let pending = pending[0].clone();
    assert_eq!(
        sys.evictions_of(&pending.pod),
        0,
        "stopped before the eviction"
    );
    // Wait until the stopped replica's Lease has expired, then take it.
    let (ns, name, spec) = lease_held_by(sys, STALLED);
    let renewed: Timestamp = spec["renewTime"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("Lease {ns}/{name} without renewTime: {spec}"));
    let duration = spec["leaseDurationSeconds"].as_u64().unwrap_or(15);
    let expired = renewed + SignedDuration::from_secs(duration as i64 + 1);
    if let Ok(left) = Duration::try_from(expired - Timestamp::now()) {
        tokio::time::sleep(left).await;
    }
    let now = micro_time(Timestamp::now());
    let transitions = spec["leaseTransitions"].as_u64().unwrap_or(0) + 1;
    sys.objects()
        .merge_patch(
            &resources::LEASES,
            &ns,
            &name,
            &json!({"spec": {
                "holderIdentity": OTHER_HOLDER,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": transitions,
            }}),
            None,
        )
        .unwrap_or_else(|e| panic!("taking Lease {ns}/{name}: {e:?}"));
    stalled.resume().unwrap();
    // Continued, it finds the Lease taken and pauses instead of evicting.
    let paused = poll(
        &format!("{STALLED} to go on and pause"),
        Duration::from_secs(30),
        || {
            let log = stalled.log_tail(200);
            async move { log.contains("remediation paused").then_some(()) }
        },
    )
    .await;
    if let Err(e) = paused {
        panic!("{e}\n{}", stalled.log_tail(40));
    }
    assert_eq!(
        sys.evictions_of(&pending.pod),
        0,
        "{STALLED} evicted {} after it lost the Lease\n{}",
        pending.pod,
        stalled.log_tail(60)
    );
    // The other holder never renews: the replica takes the Lease again.
    let all = all_succeeded(sys, &hosts).await;
    sampler.abort();
    each_once(sys, &samples, &all);
    assert!(
        all.iter().any(|a| a.id == pending.id),
        "the stopped attempt {} finished: {all:?}",
        pending.id
    );
    stalled.kill();
}
