//! Remediation of ordinary workloads' pods on the real control plane: the
//! real kube-controller-manager's ReplicaSet, StatefulSet and DaemonSet
//! controllers recreate the evicted pods and its disruption controller
//! keeps the PodDisruptionBudget's status, the real scheduler places the
//! replacements, the real kubelets (fake CRI runtime) hold the immutable
//! Secret's cache pin and write the replacements' volumes, and the real
//! API server's Eviction API and audit log say what the controller did.
//! The controller runs with the chart's `rig-workloads` scenario (no
//! slurmrestd).

use std::time::Duration;

use mountguard_core::remediation::{ATTEMPTS_ANNOTATION, Attempt, AttemptsRecord, Phase};
use mountguard_tests::cluster::SLURM_NAMESPACE;
use mountguard_tests::real::{create, raw};
use serde_json::{Value, json};

use crate::harness::{RealSystem, events, wait, wait_event};
use crate::kubelet_support::{b64, volume_file};

/// The immutable Secret every workload here mounts (volume `config`).
const SECRET: &str = "app-config";

async fn immutable_secret(sys: &RealSystem, value: &str) {
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": SECRET, "namespace": SLURM_NAMESPACE},
                "immutable": true,
                "data": {"value": b64(value.as_bytes())}}),
    )
    .await
    .unwrap();
}

/// Deletes the immutable Secret and creates it again under the same name
/// with `value`: every kubelet holding a pod that references it keeps
/// serving the old bytes from its cache.
async fn swap_secret(sys: &RealSystem, value: &str) {
    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/secrets/{SECRET}");
    let (code, body) = raw(&sys.client, "DELETE", &path, None).await.unwrap();
    assert_eq!(code, 200, "DELETE {path}: {body}");
    immutable_secret(sys, value).await;
}

/// A pod template of app `app` mounting [`SECRET`]; at most one pod of the
/// app per node (required anti-affinity), so a replacement goes to the
/// node its predecessor left. A grace period above 0: a pod deleted with 0
/// leaves the API before its kubelet unregistered it, and a replacement
/// registered on that node meanwhile keeps the pinned entry (see
/// docs/remediation.md, "Workloads").
fn template(app: &str) -> Value {
    json!({
        "metadata": {"labels": {"app": app}},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": app}},
                "topologyKey": "kubernetes.io/hostname",
            }]}},
            "containers": [{"name": "c", "image": "example.invalid/app:1",
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/app"}]}],
            "volumes": [{"name": "config", "secret": {"secretName": SECRET}}],
        },
    })
}

fn opted_in(name: &str) -> Value {
    json!({"name": name, "namespace": SLURM_NAMESPACE,
           "annotations": {"mountguard.io/remediate": "evict"}})
}

/// `GET` of `apps/v1` `plural` `name` in [`SLURM_NAMESPACE`].
async fn get_workload(sys: &RealSystem, plural: &str, name: &str) -> Value {
    let path = format!("/apis/apps/v1/namespaces/{SLURM_NAMESPACE}/{plural}/{name}");
    let (code, body) = raw(&sys.client, "GET", &path, None).await.unwrap();
    assert_eq!(code, 200, "GET {path}: {body}");
    body
}

/// The attempts persisted in the workload's annotation.
async fn attempts(sys: &RealSystem, plural: &str, name: &str) -> Vec<Attempt> {
    get_workload(sys, plural, name).await["metadata"]["annotations"][ATTEMPTS_ANNOTATION]
        .as_str()
        .map(|s| AttemptsRecord::parse(s).expect("a record the controller wrote"))
        .map(|r| r.attempts)
        .unwrap_or_default()
}

/// Waits for the workload's first attempt to end; returns it.
async fn ended_attempt(sys: &RealSystem, plural: &str, name: &str, within: Duration) -> Attempt {
    let client = sys.client.clone();
    let path = format!("/apis/apps/v1/namespaces/{SLURM_NAMESPACE}/{plural}/{name}");
    wait(
        sys,
        &format!("the attempt on {plural}/{name} to end"),
        within,
        || {
            let (client, path) = (client.clone(), path.clone());
            async move {
                let (_, w) = raw(&client, "GET", &path, None).await.ok()?;
                let r = AttemptsRecord::parse(
                    w["metadata"]["annotations"][ATTEMPTS_ANNOTATION].as_str()?,
                )
                .ok()?;
                r.attempts.into_iter().find(|a| a.phase.is_terminal())
            }
        },
    )
    .await
}

/// The running, not terminating pods of app `app`, once there are `n`.
async fn running(sys: &RealSystem, app: &str, n: usize) -> Vec<Value> {
    let client = sys.client.clone();
    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/pods?labelSelector=app%3D{app}");
    wait(
        sys,
        &format!("{n} running pods of {app}"),
        Duration::from_secs(120),
        || {
            let (client, path) = (client.clone(), path.clone());
            async move {
                let (_, list) = raw(&client, "GET", &path, None).await.ok()?;
                let pods: Vec<Value> = list["items"]
                    .as_array()?
                    .iter()
                    .filter(|p| {
                        p["status"]["phase"] == "Running"
                            && p["metadata"]["deletionTimestamp"].is_null()
                    })
                    .cloned()
                    .collect();
                (pods.len() == n).then_some(pods)
            }
        },
    )
    .await
}

fn name(p: &Value) -> String {
    p["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn uid(p: &Value) -> String {
    p["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn node(p: &Value) -> String {
    p["spec"]["nodeName"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// What the real kubelet wrote into pod `p`'s `config` volume, read from
/// its root (not through the agent).
fn served(sys: &RealSystem, p: &Value) -> String {
    let i: usize = node(p)
        .trim_start_matches("node-")
        .parse()
        .expect("node-<i>");
    let f = volume_file(sys, i, &uid(p), "secret", "config/value");
    String::from_utf8(std::fs::read(&f).unwrap_or_default()).unwrap_or_default()
}

/// Waits until the kubelet serves `pod` (running on a real kubelet) the
/// Secret's bytes `value`.
async fn serves(sys: &RealSystem, p: &Value, value: &str) {
    wait(
        sys,
        &format!("{} to be served {value:?}", name(p)),
        Duration::from_secs(60),
        || {
            let got = served(sys, p);
            async move { (got == value).then_some(()) }
        },
    )
    .await;
}

fn phases(a: &Attempt) -> Vec<&'static str> {
    a.phase_names()
}

const WORKLOAD_PHASES: [&str; 5] = [
    "Pending",
    "Evicting",
    "AwaitingReplacement",
    "Verifying",
    "Succeeded",
];

/// Deployment `web` of three on three real kubelets: its first pod is
/// served the old bytes of the immutable Secret after its recreation (it
/// kept referencing the name across the swap), the two others, created
/// after it on the other nodes, the new ones. Returns (first, others).
async fn stale_deployment(sys: &RealSystem) -> (Value, Vec<Value>) {
    immutable_secret(sys, "v1").await;
    create(
        &sys.client,
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": opted_in("web"),
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                         "template": template("web")}}),
    )
    .await
    .unwrap();
    let first = running(sys, "web", 1).await.remove(0);
    serves(sys, &first, "v1").await;
    swap_secret(sys, "v2").await;
    // Two more pods, on the two other nodes: served the new bytes.
    let (code, body) = raw(
        &sys.client,
        "PATCH",
        &format!("/apis/apps/v1/namespaces/{SLURM_NAMESPACE}/deployments/web"),
        Some(&json!({"spec": {"replicas": 3}})),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let pods = running(sys, "web", 3).await;
    let others: Vec<Value> = pods
        .iter()
        .filter(|p| uid(p) != uid(&first))
        .cloned()
        .collect();
    for p in &others {
        serves(sys, p, "v2").await;
    }
    (first, others)
}

/// The pods `others` still run (in `now`) under their UIDs, and Deployment
/// `web` has one attempt on record.
async fn untouched_with_one_attempt(sys: &RealSystem, now: &[Value], others: &[Value]) {
    for p in others {
        assert!(
            now.iter().any(|q| uid(q) == uid(p)),
            "{} was replaced",
            name(p)
        );
    }
    assert_eq!(
        attempts(sys, "deployments", "web").await.len(),
        1,
        "one attempt"
    );
}

/// A Deployment of three, one of whose pods sits on a node whose kubelet
/// keeps serving the old bytes of the immutable Secret after it was
/// recreated (its pod kept referencing the name across the swap; the other
/// two pods were created after it on nodes without that cache entry). Only
/// that pod is evicted, through the real Eviction API; the real ReplicaSet
/// controller replaces it (under a new name); the replacement is verified
/// fresh on the node it landed on, and the kubelet there serves it the
/// new bytes. The other two pods are never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_deployment_only_the_stale_pod_is_evicted_and_its_replacement_is_fresh() {
    let sys = RealSystem::start_workload_remediation_on_real_kubelets(3).await;
    let (first, others) = stale_deployment(&sys).await;
    let a = ended_attempt(&sys, "deployments", "web", Duration::from_secs(180)).await;
    assert_eq!(a.phase, Phase::Succeeded, "{:?}\n{}", a.failure, sys.logs());
    assert_eq!(
        (a.pod.as_str(), a.pod_uid.as_str()),
        (name(&first).as_str(), uid(&first).as_str())
    );
    assert_eq!(phases(&a), WORKLOAD_PHASES);
    assert_eq!(
        a.findings[0].state, "Stale/ImmutableCache",
        "{:?}",
        a.findings
    );
    let new_name = a
        .new_pod_name
        .clone()
        .expect("a ReplicaSet's replacement has its own name");
    assert_ne!(new_name, name(&first));
    assert_eq!(
        a.new_pod_node.as_deref(),
        Some(node(&first).as_str()),
        "the node the pod left"
    );
    // The replacement: running, served the new bytes by the real kubelet.
    let now = running(&sys, "web", 3).await;
    let replacement = now
        .iter()
        .find(|p| Some(uid(p)) == a.new_pod_uid)
        .expect("the verified replacement runs");
    assert_eq!(name(replacement), new_name);
    assert_eq!(served(&sys, replacement), "v2");
    // Only the stale pod was evicted (audit log), never deleted; the other
    // two still run under their UIDs.
    assert_eq!(sys.evicted_never_deleted(), [name(&first)]);
    untouched_with_one_attempt(&sys, &now, &others).await;
    let ev = events(&sys.client, SLURM_NAMESPACE).await;
    for (reason, kind) in [
        ("RemediationStarted", "Deployment"),
        ("PodEvicted", "Pod"),
        ("RemediationSucceeded", "Pod"),
        ("RemediationSucceeded", "Deployment"),
    ] {
        assert!(
            ev.iter().any(|(r, k, _, _)| r == reason && k == kind),
            "no {reason} Event on the {kind}: {ev:?}"
        );
    }
    assert!(
        ev.iter().any(|(r, k, n, note)| r == "RemediationSucceeded"
            && k == "Pod"
            && *n == new_name
            && note.contains("verified fresh on node")),
        "{ev:?}"
    );
    // The rollout gate on the Deployment: its three pods (found through
    // the ReplicaSet it controls) are every consumer, all fresh.
    let out = tokio::process::Command::new(
        mountguard_tests::mountguard::binary("mountguard-controller").unwrap(),
    )
    .args([
        "wait",
        &format!("deployment/{SLURM_NAMESPACE}/web"),
        "--url",
        &sys.metrics_base(),
    ])
    .args(["--token", mountguard_tests::mountguard::STATUS_READER_TOKEN])
    .args([
        "--timeout",
        "60s",
        "--interval",
        "500ms",
        "--output",
        "json",
    ])
    .output()
    .await
    .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "wait: {stdout}\n{stderr}");
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (&result["complete"], &result["verified"], &result["total"]),
        (&json!(true), &json!(3), &json!(3)),
        "{result}"
    );
    let doc: Value = serde_json::from_str(
        &mountguard_tests::mountguard::http_get(&format!(
            "{}/v1/rollouts/deployment/{SLURM_NAMESPACE}/web",
            sys.metrics_base()
        ))
        .await
        .unwrap(),
    )
    .unwrap();
    let mut gated: Vec<String> = doc["consumers"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| c["pod"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default();
    gated.sort();
    let mut want: Vec<String> = now.iter().map(name).collect();
    want.sort();
    assert_eq!(gated, want, "the Deployment's pods: {doc}");
    sys.shutdown().await;
}

/// A StatefulSet's stale pod is evicted and the real StatefulSet
/// controller recreates it under its own name: the attempt tells the
/// replacement by its new UID and verifies it fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_statefulset_a_stale_pod_is_repaired_under_its_own_name() {
    let sys = RealSystem::start_workload_remediation_on_real_kubelets(2).await;
    immutable_secret(&sys, "v1").await;
    create(
        &sys.client,
        &json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": opted_in("db"),
                "spec": {"replicas": 1, "serviceName": "db",
                         "selector": {"matchLabels": {"app": "db"}},
                         "template": template("db")}}),
    )
    .await
    .unwrap();
    let old = running(&sys, "db", 1).await.remove(0);
    assert_eq!(name(&old), "db-0");
    serves(&sys, &old, "v1").await;
    swap_secret(&sys, "v2").await;
    let a = ended_attempt(&sys, "statefulsets", "db", Duration::from_secs(180)).await;
    assert_eq!(a.phase, Phase::Succeeded, "{:?}\n{}", a.failure, sys.logs());
    assert_eq!(phases(&a), WORKLOAD_PHASES);
    assert_eq!(a.new_pod_name, None, "same name");
    assert_eq!(a.new_pod(), "db-0");
    let new_uid = a.new_pod_uid.clone().expect("replaced");
    assert_ne!(new_uid, uid(&old));
    let now = running(&sys, "db", 1).await.remove(0);
    assert_eq!((name(&now), uid(&now)), ("db-0".to_string(), new_uid));
    assert_eq!(served(&sys, &now), "v2");
    assert_eq!(sys.evicted_never_deleted(), ["db-0"]);
    sys.shutdown().await;
}

/// A DaemonSet pod on a node where another pod keeps referencing the
/// immutable Secret: the kubelet there serves the old bytes to any new pod
/// too, and a DaemonSet's replacement lands on the same node, so mountguard
/// reports the pin (KubeletCachePinned, naming the pod) and evicts
/// nothing. Once the pinning pod is gone, the same DaemonSet pod is
/// repaired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_daemonset_a_pod_on_a_pinned_node_is_reported_and_not_evicted() {
    let sys = RealSystem::start_workload_remediation_on_real_kubelets(2).await;
    immutable_secret(&sys, "v1").await;
    let mut t = template("agentd");
    t["spec"]["nodeSelector"] = json!({"kubernetes.io/hostname": "node-0"});
    create(
        &sys.client,
        &json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": opted_in("agentd"),
                "spec": {"selector": {"matchLabels": {"app": "agentd"}}, "template": t}}),
    )
    .await
    .unwrap();
    let mut pin = template("pin");
    pin["spec"]["nodeName"] = json!("node-0");
    pin["spec"].as_object_mut().unwrap().remove("affinity");
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "pin", "namespace": SLURM_NAMESPACE, "labels": {"app": "pin"}},
                "spec": pin["spec"]}),
    )
    .await
    .unwrap();
    let ds = running(&sys, "agentd", 1).await.remove(0);
    running(&sys, "pin", 1).await;
    serves(&sys, &ds, "v1").await;
    swap_secret(&sys, "v2").await;
    // Two KubeletCachePinned Events reach the pod: the verdict's (the
    // evaluation, naming the volume) and the remediation notice (the plan,
    // naming the node and the pins); either may come first. The notice is
    // the one that says remediation leaves the pod alone.
    let pod = name(&ds);
    let note = wait_event(
        &sys,
        "the remediation's KubeletCachePinned Event on the DaemonSet's pod",
        Duration::from_secs(120),
        |r, k, n, note| {
            r == "KubeletCachePinned"
                && k == "Pod"
                && n == pod
                && note.contains("the kubelet on node")
        },
    )
    .await;
    assert!(note.contains("pin") && note.contains("node-0"), "{note}");
    // Past the remediation delay many times over: nothing was evicted and
    // no attempt started; the pod still runs, served the old bytes.
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert!(sys.evicted_never_deleted().is_empty());
    assert!(attempts(&sys, "daemonsets", "agentd").await.is_empty());
    let still = running(&sys, "agentd", 1).await.remove(0);
    assert_eq!(uid(&still), uid(&ds));
    assert_eq!(served(&sys, &still), "v1");
    // The pin goes: the DaemonSet pod alone keeps the entry; its
    // replacement on the same node gets the new bytes.
    let (code, body) = raw(
        &sys.client,
        "DELETE",
        &format!("/api/v1/namespaces/{SLURM_NAMESPACE}/pods/pin"),
        None,
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let a = ended_attempt(&sys, "daemonsets", "agentd", Duration::from_secs(180)).await;
    assert_eq!(a.phase, Phase::Succeeded, "{:?}\n{}", a.failure, sys.logs());
    assert_eq!(a.new_pod_node.as_deref(), Some("node-0"));
    let now = running(&sys, "agentd", 1).await.remove(0);
    assert_eq!(Some(uid(&now)), a.new_pod_uid);
    assert_eq!(served(&sys, &now), "v2");
    assert_eq!(sys.evicted_never_deleted(), [name(&ds)]);
    sys.shutdown().await;
}

/// A PodDisruptionBudget with `maxUnavailable: 0` over a stale Deployment
/// pod: the real Eviction API answers 429 (the real disruption controller
/// keeps the budget at zero), the attempt retries and, at its eviction
/// timeout, fails cleanly: the pod is never evicted nor deleted, and a
/// RemediationFailed Event says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_pdb_max_unavailable_zero_makes_the_attempt_wait_then_fail_at_its_timeout_never_holding_the_node()
 {
    let mut sys = RealSystem::start_workload_remediation_on_real_kubelets(1).await;
    sys.restart_controller_with(&[("MOUNTGUARD_EVICTION_TIMEOUT", "20s")])
        .await;
    immutable_secret(&sys, "v1").await;
    create(
        &sys.client,
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "api", "namespace": SLURM_NAMESPACE},
                "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "api"}}}}),
    )
    .await
    .unwrap();
    create(
        &sys.client,
        &json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": opted_in("api"),
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "api"}},
                         "template": template("api")}}),
    )
    .await
    .unwrap();
    let pod = running(&sys, "api", 1).await.remove(0);
    serves(&sys, &pod, "v1").await;
    swap_secret(&sys, "v2").await;
    let a = ended_attempt(&sys, "deployments", "api", Duration::from_secs(120)).await;
    assert_eq!(
        a.phase,
        Phase::Failed(mountguard_core::remediation::FailReason::EvictionTimeout),
        "{:?}",
        a.failure
    );
    // Refused by the dry runs all along: never held, never evicted.
    assert_eq!(phases(&a), ["Pending", "Failed"]);
    let failure = a.failure.clone().unwrap_or_default();
    assert!(failure.contains("disruption budget"), "{failure}");
    assert_eq!(a.evicted_at, None);
    assert!(!a.cordon_requested, "the node was never held");
    // Asked as dry runs, refused (429) more than once by the real API
    // server's PodDisruptionBudget check; no eviction, no delete, and no
    // write to any node (the hold taint is never asked for).
    let reqs = sys.controller_requests();
    let refused = reqs
        .iter()
        .filter(|r| r.subresource == "eviction" && r.code == 429 && r.dry_run)
        .count();
    assert!(refused >= 2, "{refused} refused dry-run evictions");
    assert!(
        !reqs
            .iter()
            .any(|r| r.subresource == "eviction" && !r.dry_run),
        "{reqs:?}"
    );
    assert!(
        !reqs.iter().any(|r| r.resource == "nodes" && r.is_write()),
        "{reqs:?}"
    );
    assert!(sys.evicted_never_deleted().is_empty());
    let still = running(&sys, "api", 1).await.remove(0);
    assert_eq!(uid(&still), uid(&pod));
    let ev = events(&sys.client, SLURM_NAMESPACE).await;
    assert!(
        ev.iter().any(|(r, k, n, note)| r == "RemediationFailed"
            && k == "Pod"
            && *n == name(&pod)
            && note.contains("EvictionTimeout")),
        "{ev:?}"
    );
    // The pod stays stale and is not tried again: an alert's metric says
    // so, though no node is kept drained.
    let base = sys.metrics_base();
    wait(
        &sys,
        "mountguard_remediation_failed_unresolved{owner_kind=\"Deployment\"} 1",
        Duration::from_secs(30),
        || {
            let url = format!("{base}/metrics");
            async move {
                let n = mountguard_tests::real::helm::metric(
                    &url,
                    "mountguard_remediation_failed_unresolved",
                    &[("owner_kind", "Deployment")],
                )
                .await?;
                (n == 1.0).then_some(())
            }
        },
    )
    .await;
    let kept = mountguard_tests::real::helm::metric(
        &format!("{base}/metrics"),
        "mountguard_remediation_failed",
        &[],
    )
    .await;
    assert_eq!(kept, Some(0.0), "no node is kept drained");
    sys.shutdown().await;
}

/// The controller SIGKILLed by its fail point right after it persisted the
/// Deployment pod's attempt in each phase (Evicting, AwaitingReplacement,
/// Verifying, Succeeded; `Pending` lives in memory only), before the write
/// the record was persisted for, and started again each time: the attempt
/// finishes once from the Deployment's record, with each phase once; only
/// the stale pod is evicted, once (audit log), never deleted; the other
/// two keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_sigkill_at_every_persisted_step_of_a_deployment_attempt_finishes_it_once() {
    use crate::shared::crash::{killed_at, launch};
    use mountguard_tests::rig::Rig;
    let mut sys = RealSystem::start_workload_remediation_on_real_kubelets(3).await;
    sys.stop_controller();
    let persisted = &WORKLOAD_PHASES[1..];
    let mut c = launch(&sys, Some(persisted[0])).await;
    let (first, others) = stale_deployment(&sys).await;
    for (i, phase) in persisted.iter().enumerate() {
        killed_at(&sys, &mut c, phase, Duration::from_secs(180)).await;
        let open: Vec<Attempt> = attempts(&sys, "deployments", "web").await;
        assert_eq!(open.len(), 1, "killed in {phase}: {open:?}");
        assert_eq!(open[0].phase.name(), *phase, "the record holds {phase}");
        c = launch(&sys, persisted.get(i + 1).copied()).await;
    }
    let a = ended_attempt(&sys, "deployments", "web", Duration::from_secs(60)).await;
    assert_eq!(a.phase, Phase::Succeeded, "{:?}\n{}", a.failure, sys.logs());
    assert_eq!(phases(&a), WORKLOAD_PHASES);
    assert_eq!(a.pod_uid, uid(&first));
    assert_eq!(sys.evictions_of(&name(&first)), 1, "evicted once");
    assert_eq!(sys.evicted_never_deleted(), [name(&first)]);
    let now = running(&sys, "web", 3).await;
    untouched_with_one_attempt(&sys, &now, &others).await;
    c.kill();
    sys.shutdown().await;
}

/// A Deployment whose `mountguard.io/remediate` annotation holds a value
/// the controller does not accept (`restart`), with its pod served the old
/// bytes of the immutable Secret: one `InvalidRemediationAnnotation`
/// Warning Event on the Deployment (through the real API server) names the
/// annotation and the value and says nothing is remediated; the pod's
/// volume is judged stale, but the pod is never evicted, and no attempt is
/// persisted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_deployment_with_an_unreadable_remediate_annotation_is_told_and_not_repaired() {
    let sys = RealSystem::start_workload_remediation_on_real_kubelets(1).await;
    immutable_secret(&sys, "v1").await;
    create(
        &sys.client,
        &json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": SLURM_NAMESPACE,
                             "annotations": {"mountguard.io/remediate": "restart"}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                         "template": template("web")}}),
    )
    .await
    .unwrap();
    let pod = running(&sys, "web", 1).await.remove(0);
    serves(&sys, &pod, "v1").await;
    swap_secret(&sys, "v2").await;
    let told = wait_event(
        &sys,
        "the InvalidRemediationAnnotation Event on the Deployment",
        Duration::from_secs(120),
        |r, k, n, _| r == "InvalidRemediationAnnotation" && k == "Deployment" && n == "web",
    )
    .await;
    assert!(
        told.contains("\"restart\"") && told.contains("nothing is remediated"),
        "{told}"
    );
    // The pod is judged stale (its verdict: no alarm Event is owed when the
    // controller's first judgement of the pod is already Stale), and still
    // nothing is done.
    let base = sys.metrics_base();
    let pod_name = name(&pod);
    wait(
        &sys,
        "the pod's volume judged Stale",
        Duration::from_secs(150),
        || {
            let (base, pod_name) = (base.clone(), pod_name.clone());
            async move {
                let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                    .await
                    .ok()?;
                let v = mountguard_tests::scenario::find_verdict(&doc, &pod_name, "volume config")?;
                v["state"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("Stale"))
                    .then_some(())
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(served(&sys, &pod), "v1", "still the old bytes");
    assert!(sys.evicted_never_deleted().is_empty(), "nothing evicted");
    assert!(attempts(&sys, "deployments", "web").await.is_empty());
    let told_once = events(&sys.client, SLURM_NAMESPACE)
        .await
        .into_iter()
        .filter(|(r, _, _, _)| r == "InvalidRemediationAnnotation")
        .count();
    assert_eq!(told_once, 1, "told once while it lasts");
    let now = running(&sys, "web", 1).await;
    assert_eq!(uid(&now[0]), uid(&pod), "the pod still runs");
    sys.shutdown().await;
}
