//! Leader election (`kube-lease-manager`, Lease `--lease-name` in
//! `--pod-namespace`) and the leader label on the acting replica's pod.
//!
//! Without `--leader-election` the replica acts at once. On every change of
//! leadership the report book and the evaluation state are reset: a new
//! leader starts empty, answers heartbeats `resend`, and rebuilds its
//! verdicts from the next inventories without Events for the baseline.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::eval::Input;
use crate::intake::report::ReportHandler;
use crate::runtime::shutdown::Shutdown;
use crate::state::Shared;

/// Label set on the acting replica's pod (the report Service selects it).
pub const LEADER_LABEL: &str = "mountguard.io/leader";

/// Lease duration (seconds): another replica may take the Lease this long
/// after the holder's last renewal.
pub const LEASE_DURATION_SECS: u64 = 15;

/// The holder renews this long (seconds) before the Lease would expire;
/// also the margin a write needs left on the Lease ([`lease_valid_until`]).
pub const LEASE_GRACE_SECS: u64 = 5;

/// Until when `identity` may still write under `spec`: the Lease names it
/// as holder, and its last renewal plus the duration, minus `margin`, is
/// ahead. None: it does not hold the Lease (or the Lease says too little
/// to tell). Pure; the same rule as the client-go leader elector's
/// `IsLeader`/`isLeaseValid` (tools/leaderelection/leaderelection.go),
/// with a margin so that a write started now lands before anyone else can
/// take over.
pub fn lease_valid_until(
    spec: &k8s_openapi::api::coordination::v1::LeaseSpec,
    identity: &str,
    margin: jiff::SignedDuration,
) -> Option<jiff::Timestamp> {
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    let duration = jiff::SignedDuration::from_secs(i64::from(spec.lease_duration_seconds?));
    renewed.checked_add(duration - margin).ok()
}

/// Leader election settings.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Use a Lease.
    pub enabled: bool,
    /// Lease name.
    pub lease_name: String,
    /// Own pod name.
    pub pod_name: Option<String>,
    /// Own namespace.
    pub pod_namespace: Option<String>,
}

async fn set_label(client: &kube::Client, cfg: &LeaderConfig, shared: &Shared, on: bool) {
    let (Some(name), Some(ns)) = (&cfg.pod_name, &cfg.pod_namespace) else {
        return;
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let value = if on {
        serde_json::Value::String("true".into())
    } else {
        serde_json::Value::Null
    };
    let patch = serde_json::json!({"metadata": {"labels": {LEADER_LABEL: value}}});
    for attempt in 0..3 {
        match tokio::time::timeout(
            Duration::from_secs(5),
            api.patch(
                name,
                &crate::runtime::kube::patch_params(),
                &Patch::Merge(&patch),
            ),
        )
        .await
        {
            Ok(Ok(_)) => {
                info!(pod = %name, leader = on, "leader label updated");
                return;
            }
            Ok(Err(e)) => {
                shared.metrics.api_error("patch_leader_label");
                warn!(pod = %name, attempt, error = %e, "updating the leader label failed");
            }
            Err(_) => {
                shared.metrics.api_error("patch_leader_label");
                warn!(pod = %name, attempt, "updating the leader label timed out");
            }
        }
        tokio::time::sleep(Duration::from_millis(500 * (attempt + 1))).await;
    }
}

async fn become_acting(
    client: &kube::Client,
    cfg: &LeaderConfig,
    shared: &Shared,
    handler: &ReportHandler,
    tx: &mpsc::Sender<Input>,
    acting: bool,
) {
    if shared.acting.load(Ordering::Acquire) == acting {
        return;
    }
    handler.reset();
    let _ = tx.send(Input::Reset).await;
    shared.acting.store(acting, Ordering::Release);
    shared.metrics.leader.set(i64::from(acting));
    info!(acting, "leadership changed");
    set_label(client, cfg, shared, acting).await;
}

/// Runs leader election (or acts at once) until shutdown; on shutdown
/// removes the leader label and releases the Lease.
pub async fn run(
    client: kube::Client,
    cfg: LeaderConfig,
    shared: Arc<Shared>,
    handler: Arc<ReportHandler>,
    tx: mpsc::Sender<Input>,
    mut shutdown: Shutdown,
) {
    if !cfg.enabled {
        become_acting(&client, &cfg, &shared, &handler, &tx, true).await;
        shutdown.wait().await;
        if shared.is_acting() {
            shared.acting.store(false, Ordering::Release);
            set_label(&client, &cfg, &shared, false).await;
        }
        return;
    }
    let (Some(identity), Some(ns)) = (cfg.pod_name.clone(), cfg.pod_namespace.clone()) else {
        warn!("leader election needs --pod-name and --pod-namespace");
        return;
    };
    // Building the manager talks to the API: retry until it works.
    let manager = loop {
        match LeaseManagerBuilder::new(client.clone(), &cfg.lease_name)
            .with_namespace(&ns)
            .with_identity(&identity)
            .with_duration(LEASE_DURATION_SECS)
            .with_grace(LEASE_GRACE_SECS)
            .build()
            .await
        {
            Ok(m) => break m,
            Err(e) => {
                shared.metrics.api_error("lease");
                warn!(error = %e, "creating the lease manager failed; retrying");
                tokio::select! {
                    _ = shutdown.wait() => return,
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                }
            }
        }
    };
    let (mut rx, task) = manager.watch().await;
    loop {
        let leader = *rx.borrow_and_update();
        become_acting(&client, &cfg, &shared, &handler, &tx, leader).await;
        tokio::select! {
            _ = shutdown.wait() => break,
            r = rx.changed() => if r.is_err() {
                warn!("lease manager stopped; stepping down");
                become_acting(&client, &cfg, &shared, &handler, &tx, false).await;
                return;
            },
        }
    }
    if shared.is_acting() {
        shared.acting.store(false, Ordering::Release);
        shared.metrics.leader.set(0);
        set_label(&client, &cfg, &shared, false).await;
    }
    // Closing the channel makes the manager release the Lease.
    drop(rx);
    match tokio::time::timeout(Duration::from_secs(5), task).await {
        Ok(Ok(Ok(_))) => info!("lease released"),
        Ok(Ok(Err(e))) => warn!(error = %e, "releasing the lease failed"),
        _ => warn!("releasing the lease did not finish in time"),
    }
}

#[cfg(test)]
mod tests {
    use jiff::{SignedDuration, Timestamp};
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn spec(holder: &str, renewed: &str) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            ..Default::default()
        }
    }

    #[test]
    fn a_write_needs_the_lease_held_with_the_margin_left() {
        let m = SignedDuration::from_secs(5);
        let until = lease_valid_until(&spec("ctl-a", "2026-12-01T08:00:00Z"), "ctl-a", m);
        let want: Timestamp = "2026-12-01T08:00:10Z".parse().unwrap();
        assert_eq!(until, Some(want));
        // Another holder, or no holder: never.
        assert_eq!(
            lease_valid_until(&spec("ctl-b", "2026-12-01T08:00:00Z"), "ctl-a", m),
            None
        );
        let mut s = spec("ctl-a", "2026-12-01T08:00:00Z");
        s.holder_identity = None;
        assert_eq!(lease_valid_until(&s, "ctl-a", m), None);
        // Without a renewal time or a duration nothing can be told.
        let mut s = spec("ctl-a", "2026-12-01T08:00:00Z");
        s.renew_time = None;
        assert_eq!(lease_valid_until(&s, "ctl-a", m), None);
        let mut s = spec("ctl-a", "2026-12-01T08:00:00Z");
        s.lease_duration_seconds = None;
        assert_eq!(lease_valid_until(&s, "ctl-a", m), None);
    }
}
