//! One end-to-end test body, two control planes. [`Rig`] is what a scenario
//! shared by `tests/tests/e2e` (the cluster in a box: API server, kubelet,
//! NodeSet and slurmrestd doubles) and `tests/tests/real` (the real
//! kube-apiserver, etcd, controller-manager and scheduler, with node
//! doubles and the Slinky doubles as their clients) needs of the system
//! under test; the bodies themselves live in `tests/tests/shared/` and are
//! compiled into both test binaries.
//!
//! Objects are read and written through [`Objects`], so the calls of a
//! body are the same on both rigs (they block on the real one: run the
//! bodies on a multi-threaded runtime).

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::apiserver::resources;
use crate::cluster::{NODESET, SLURM_NAMESPACE};
use crate::mountguard::{ChildGuard, poll, wait_ready};
use crate::objects::Objects;
use crate::slurmrestd::SlurmHandle;

/// The system under test, on either control plane.
pub trait Rig {
    /// "cluster in a box" or "real control plane", for messages.
    fn rig_name(&self) -> &'static str;
    /// Admin access to the API objects.
    fn objects(&self) -> Arc<dyn Objects>;
    /// The slurmrestd double.
    fn slurm(&self) -> SlurmHandle;
    /// The controller's metrics server (`http://...`).
    fn metrics_base(&self) -> String;
    /// Number of nodes (one slurmd pod each).
    fn node_count(&self) -> usize;
    /// Logs of every process, for failure messages.
    fn logs(&self) -> String;
    /// Stops the controller the rig started with the system.
    fn stop_controller(&mut self);
    /// Starts one controller replica with leader election, under its own
    /// pod `name` (created when missing), on the addresses the agents
    /// report to, with `env` added to its environment (`FAILPOINTS`, say);
    /// resolves once it is started, not ready: a fail point may kill it
    /// first.
    fn launch_replica(
        &self,
        name: &str,
        env: &[(&str, &str)],
    ) -> impl std::future::Future<Output = ChildGuard>;
    /// [`Rig::launch_replica`] without extra environment; resolves once it
    /// is ready.
    fn spawn_replica(&self, name: &str) -> impl std::future::Future<Output = ChildGuard> {
        async move {
            let mut child = self.launch_replica(name, &[]).await;
            if let Err(e) =
                wait_ready(&mut child, &self.metrics_base(), Duration::from_secs(60)).await
            {
                panic!("replica {name} did not become ready: {e}\n{}", self.logs());
            }
            child
        }
    }
    /// Eviction requests the controller replicas made for pod `pod`.
    fn evictions_of(&self, pod: &str) -> usize;
    /// Those of [`Rig::evictions_of`] the API server granted, where the rig
    /// can tell (the real API server's audit log); every request where it
    /// cannot.
    fn granted_evictions_of(&self, pod: &str) -> usize {
        self.evictions_of(pod)
    }
    /// Pod DELETE requests the controller replicas made (never expected:
    /// remediation evicts).
    fn pod_deletes(&self) -> Vec<String>;
}

/// Polls `check` until it answers or `timeout`; on timeout panics with the
/// rig's logs.
pub async fn wait<R, T, F, Fut>(sys: &R, what: &str, timeout: Duration, check: F) -> T
where
    R: Rig + ?Sized,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match poll(what, timeout, check).await {
        Ok(v) => v,
        Err(e) => panic!("{} ({}):\n{}", e, sys.rig_name(), sys.logs()),
    }
}

/// Waits until every node runs its slurmd pod; their (name, UID) by node.
pub async fn wait_for_slurmd_pods<R: Rig + ?Sized>(sys: &R) -> Vec<(String, String)> {
    let api = sys.objects();
    let n = sys.node_count();
    wait(
        sys,
        "every slurmd pod to run",
        Duration::from_secs(90),
        || {
            let api = api.clone();
            async move {
                (0..n)
                    .map(|i| crate::scenario::slurmd_pod(&*api, i))
                    .collect::<Option<Vec<_>>>()
            }
        },
    )
    .await
}

/// Polls the controller's `/v1/verdicts?{query}` until `check` answers for
/// the document (one that cannot be read is no answer) or `timeout`; on
/// timeout panics with the rig's logs.
pub async fn wait_verdicts<R, T, F>(
    sys: &R,
    what: &str,
    timeout: Duration,
    query: &str,
    check: F,
) -> T
where
    R: Rig + ?Sized,
    F: Fn(Value) -> Option<T>,
{
    let base = sys.metrics_base();
    let (base, check) = (&base, &check);
    wait(sys, what, timeout, || async move {
        check(crate::scenario::verdicts(base, query).await.ok()?)
    })
    .await
}

/// Polls the controller's `/metrics` until `check` answers for the text (an
/// answer that cannot be read is no answer) or `timeout`; on timeout panics
/// with the rig's logs.
pub async fn wait_metrics<R, T, F>(sys: &R, what: &str, timeout: Duration, check: F) -> T
where
    R: Rig + ?Sized,
    F: Fn(&str) -> Option<T>,
{
    let url = format!("{}/metrics", sys.metrics_base());
    let (url, check) = (&url, &check);
    wait(sys, what, timeout, || async move {
        check(&crate::mountguard::http_get(url).await.ok()?)
    })
    .await
}

/// Waits until every slurmd pod's key volume is Fresh and every verdict is
/// Fresh or Skipped; returns the verdicts document.
pub async fn wait_all_fresh<R: Rig + ?Sized>(sys: &R) -> Value {
    let pods = wait_for_slurmd_pods(sys).await;
    wait_verdicts(
        sys,
        "every verdict Fresh or Skipped",
        Duration::from_secs(60),
        "all=1",
        |doc| crate::scenario::all_fresh(&doc, &pods).then_some(doc),
    )
    .await
}

/// Opts the NodeSet in to remediation (its annotation).
pub fn opt_in<R: Rig + ?Sized>(sys: &R) {
    use mountguard_core::remediation::REMEDIATE_ANNOTATION;
    sys.objects()
        .merge_patch(
            &resources::NODESETS,
            SLURM_NAMESPACE,
            NODESET,
            &json!({"metadata": {"annotations": {REMEDIATE_ANNOTATION: "true"}}}),
            None,
        )
        .unwrap_or_else(|e| panic!("opting the NodeSet in ({}): {e}", sys.rig_name()));
}

/// The remediation attempts recorded on the NodeSet.
pub fn attempts<R: Rig + ?Sized>(sys: &R) -> Vec<mountguard_core::remediation::Attempt> {
    nodeset_attempts(&*sys.objects())
}

/// The remediation attempts recorded on NodeSet [`NODESET`] (none when it
/// or its record cannot be read).
pub fn nodeset_attempts<A: Objects + ?Sized>(
    api: &A,
) -> Vec<mountguard_core::remediation::Attempt> {
    use mountguard_core::remediation::{ATTEMPTS_ANNOTATION, AttemptsRecord};
    let Ok(ns) = api.get(&resources::NODESETS, SLURM_NAMESPACE, NODESET) else {
        return Vec::new();
    };
    ns["metadata"]["annotations"][ATTEMPTS_ANNOTATION]
        .as_str()
        .and_then(|s| AttemptsRecord::parse(s).ok())
        .map(|r| r.attempts)
        .unwrap_or_default()
}
