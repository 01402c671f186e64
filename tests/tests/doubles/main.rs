//! Tests of the cluster-in-a-box doubles themselves: that they speak the
//! real protocols well enough for the real clients, and reproduce the
//! behaviours mountguard depends on.

mod apiserver_double;
mod cluster_double;
mod kubelet_double;
mod operator_double;
mod slurmrestd_double;

use std::future::Future;
use std::time::Duration;

use mountguard_tests::apiserver::{ApiHandle, resources};
use serde_json::json;

/// Polls `f` until it returns `Some`, failing the test after `secs` seconds.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Awaits `fut`, failing the test after `secs` seconds.
pub async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(secs), fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {secs}s: {what}"),
    }
}

/// Cordons (`true`) or uncordons (`false`) Kubernetes node `node`: its
/// `spec.unschedulable`, as `kubectl cordon` sets it.
pub fn set_unschedulable(api: &ApiHandle, node: &str, cordoned: bool) {
    api.merge_patch(
        &resources::NODES,
        "",
        node,
        &json!({"spec": {"unschedulable": cordoned}}),
        None,
    )
    .unwrap();
}
