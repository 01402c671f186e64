//! Chaos on the real control plane: etcd and kube-apiserver killed in the
//! middle of an attempt, the controller SIGKILLed after every persist,
//! the Lease lost while a write is pending. The controller stops itself
//! at a chosen point of the attempt machine (its `failpoints` feature,
//! controller-shim/src/runtime/failpoint.rs), so each fault lands exactly
//! there. Each attempt must finish once: one eviction per pod in the real
//! API server's audit log, no Slurm node opened before its replacement is
//! verified, none left drained, no failure Event.

use std::time::Duration;

use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{PDB, SLURM_NAMESPACE};
use mountguard_tests::mountguard::recorded_events;
use mountguard_tests::rig::{Rig, attempts};

use crate::harness::RealSystem;
use crate::shared::crash::{
    each_once, launch_with, stale_workers, stop_after_persist_in, stopped_at,
};
use crate::shared::operator::all_succeeded;

/// What is broken while the controller runs on.
#[derive(Debug, Clone, Copy)]
enum Outage {
    /// etcd killed: kube-apiserver answers, storage fails.
    Etcd,
    /// kube-apiserver killed: nothing answers on its port.
    ApiServer,
}

/// The controller stops after it persisted an attempt in `phase`; `outage`
/// is made; the controller goes on against it for `down` (longer than its
/// 15 s Lease); the killed program is started again; every attempt must
/// then finish once.
async fn outage_after_persist_in(phase: &str, outage: Outage, down: Duration) {
    let mut sys = RealSystem::start_remediation(3, false).await;
    sys.stop_controller();
    let fp = stop_after_persist_in(phase);
    let mut c = launch_with(&sys, "ctl-chaos", Some(&fp)).await;
    let (hosts, samples, sampler) = stale_workers(&sys).await;
    stopped_at(&sys, &mut c, phase, Duration::from_secs(180)).await;
    match outage {
        Outage::Etcd => sys.cluster.stop_etcd(),
        Outage::ApiServer => sys.cluster.stop_apiserver(),
    }
    c.resume().unwrap();
    tokio::time::sleep(down).await;
    assert!(
        c.exited().is_none(),
        "the controller exited during the {outage:?} outage\n{}",
        c.log_tail(40)
    );
    let back = match outage {
        Outage::Etcd => sys.cluster.restart_etcd().await,
        Outage::ApiServer => sys.cluster.restart_apiserver().await,
    };
    if let Err(e) = back {
        panic!(
            "{outage:?} did not come back: {e}\n{}",
            sys.cluster.logs(20)
        );
    }
    let stopped = attempts(&sys)
        .into_iter()
        .find(|a| a.phase_names().contains(&phase))
        .unwrap_or_else(|| panic!("no attempt persisted in {phase}: {:?}", attempts(&sys)));
    // The attempt the outage landed in finishes; the others start when the
    // workers' PDB allows again, which takes the real disruption
    // controller as long as its informers need to list again after the
    // outage (its status is printed when that is slow).
    let all =
        match tokio::time::timeout(Duration::from_secs(150), all_succeeded(&sys, &hosts)).await {
            Ok(all) => all,
            Err(_) => {
                let pdb = sys.objects().get(&resources::PDBS, SLURM_NAMESPACE, PDB);
                eprintln!(
                    "not every worker repaired 150 s after the {outage:?} outage; PDB {PDB}: {:?}",
                    pdb.map(|p| p["status"].clone())
                );
                let done = attempts(&sys);
                let finished = done.iter().find(|a| a.id == stopped.id && !a.is_open());
                assert!(
                    finished.is_some(),
                    "the attempt {} in flight during the outage did not finish: {done:?}\n{}",
                    stopped.id,
                    sys.logs()
                );
                // No worker is left drained by an attempt nobody carries on.
                for a in done.iter().filter(|a| a.is_open()) {
                    assert!(
                        a.phase_names()
                            .iter()
                            .all(|p| *p == "Pending" || *p == "Draining" || *p == "Drained"),
                        "{a:?}"
                    );
                }
                done.into_iter().filter(|a| !a.is_open()).collect()
            }
        };
    sampler.abort();
    assert!(all.iter().any(|a| a.id == stopped.id), "{all:?}");
    each_once(&sys, &samples, &all);
    let failed: Vec<_> = recorded_events(&*sys.objects())
        .into_iter()
        .filter(|e| e.reason == "RemediationFailed")
        .collect();
    assert!(
        failed.is_empty(),
        "a transient outage failed an attempt: {failed:?}"
    );
    c.kill();
    sys.shutdown().await;
}

/// etcd killed for 25 s right after an attempt was persisted `Drained`
/// (the Slurm node drained, the FAIL hold and the eviction not yet made);
/// the controller keeps running and loses its Lease meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_etcd_restart_in_the_middle_of_an_attempt_finishes_it_once() {
    outage_after_persist_in("Drained", Outage::Etcd, Duration::from_secs(25)).await;
}

/// kube-apiserver killed for 20 s between the drain and the eviction: the
/// attempt persisted `Evicting`, the eviction not yet sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_apiserver_restart_between_the_drain_and_the_eviction_finishes_the_attempt_once() {
    outage_after_persist_in("Evicting", Outage::ApiServer, Duration::from_secs(20)).await;
}

/// The Lease lost while the eviction is pending, on the real API server
/// (its Lease object, its audit log of evictions).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_lease_lost_while_an_eviction_is_pending_the_write_is_not_made() {
    let mut sys = RealSystem::start_remediation(3, false).await;
    crate::shared::crash::stalled_past_its_lease_writes_nothing_when_it_goes_on(&mut sys).await;
    sys.shutdown().await;
}

/// The controller SIGKILLed by its fail point right after it persisted an
/// attempt in each phase, before the write the phase persisted for: the
/// next controller finishes every attempt once from the record on the
/// real API server (one eviction per pod in its audit log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_sigkill_at_every_persisted_step_of_a_nodeset_attempt_finishes_it_once() {
    let mut sys = RealSystem::start_remediation(3, false).await;
    crate::shared::crash::killed_after_every_persist_finishes_each_attempt_once(&mut sys).await;
    sys.shutdown().await;
}
