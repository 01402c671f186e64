//! The remediation toggle flipped with `helm upgrade`, and `helm
//! uninstall`, with the real Helm CLI on the real node, Helm 4 (server-side
//! apply, the method `upgrade` keeps) and Helm 3 (client-side three-way
//! merge): what the controller's process runs with and what its
//! ServiceAccount may do follow each upgrade, and the uninstall leaves no
//! object of the release behind, cluster-scoped ones (ClusterRoles,
//! bindings, the admission webhook) included. And Helm 4's upgrade over a
//! field changed by hand, as docs/install.md ("Helm 3 and Helm 4") tells
//! users: a conflict, until `--force-conflicts`.

use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::{create, raw};
use mountguard_tests::real_node_or_skip;
use serde_json::{Value, json};

use crate::harness::container_id;
use crate::helm::{
    CONTROLLER, Helm, NAMESPACE, RELEASE, controller_with_remediation, install, uninstall_args,
    upgrade, upgrade_args,
};

/// The release's instance label selector, URL-encoded.
const INSTANCE: &str = "app.kubernetes.io%2Finstance%3Dmountguard";

/// The environment of the controller's running process (read from the
/// host's /proc: the container's task is a process of this host).
fn process_env(node: &mountguard_tests::real::real_node::RealNode, pod: &Value) -> Vec<String> {
    let pid = node
        .runtime
        .task_pid(&container_id(pod, "controller"))
        .expect("controller task");
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default())
        .split('\0')
        .map(str::to_string)
        .collect()
}

/// Whether the controller's ClusterRoles (the release's) grant
/// `create pods/eviction`.
async fn may_evict(client: &kube::Client) -> bool {
    let (code, list) = raw(
        client,
        "GET",
        &format!("/apis/rbac.authorization.k8s.io/v1/clusterroles?labelSelector={INSTANCE}"),
        None,
    )
    .await
    .expect("clusterroles");
    assert_eq!(code, 200, "{list}");
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| {
            r["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(CONTROLLER))
        })
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        .any(|rule| {
            rule["resources"]
                .as_array()
                .is_some_and(|r| r.iter().any(|x| x == "pods/eviction"))
                && rule["verbs"]
                    .as_array()
                    .is_some_and(|v| v.iter().any(|x| x == "create"))
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_helm_upgrade_flips_remediation_and_uninstall_leaves_nothing() {
    let node =
        real_node_or_skip!("real_node_helm_upgrade_flips_remediation_and_uninstall_leaves_nothing");
    install_upgrade_uninstall(&node, &Helm::new(&node), "v4.").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_helm3_upgrade_flips_remediation_and_uninstall_leaves_nothing() {
    let node = real_node_or_skip!(
        "real_node_helm3_upgrade_flips_remediation_and_uninstall_leaves_nothing"
    );
    install_upgrade_uninstall(&node, &Helm::v3(&node), "v3.").await;
}

/// A field of the chart's controller Deployment changed by hand (a merge
/// patch as `kubectl edit` sends it, field manager `kubectl-edit`): Helm
/// 4's server-side `helm upgrade` fails with the conflict naming the field
/// and that manager, and leaves the field as it was; with
/// `--force-conflicts` it takes the field back to the chart's value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_helm4_upgrade_over_a_hand_edit_conflicts_until_force_conflicts() {
    let node = real_node_or_skip!(
        "real_node_helm4_upgrade_over_a_hand_edit_conflicts_until_force_conflicts"
    );
    let helm = Helm::new(&node);
    install(&node, &helm, &[]).await;
    let client = node.cluster.client().await.expect("client");
    let path = format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments/{CONTROLLER}");
    let max_surge = |d: &Value| d["spec"]["strategy"]["rollingUpdate"]["maxSurge"].clone();
    let (code, edited) = raw(
        &client,
        "PATCH",
        &format!("{path}?fieldManager=kubectl-edit"),
        Some(&json!({"spec": {"strategy": {"rollingUpdate": {"maxSurge": 2}}}})),
    )
    .await
    .expect("patch");
    assert_eq!(code, 200, "{edited}");
    assert_eq!(max_surge(&edited), json!(2), "{edited}");

    let mut args = upgrade_args(&[]);
    let out = helm.run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains(r#"conflict with "kubectl-edit""#)
            && err.contains(".spec.strategy.rollingUpdate.maxSurge"),
        "helm upgrade over the edit: {}\n{err}",
        out.status
    );
    let (_, d) = raw(&client, "GET", &path, None).await.expect("deployment");
    assert_eq!(max_surge(&d), json!(2), "the failed upgrade left the edit");

    args.push("--force-conflicts".into());
    let out = helm.ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(out.contains("STATUS: deployed"), "{out}");
    let (_, d) = raw(&client, "GET", &path, None).await.expect("deployment");
    assert_eq!(max_surge(&d), json!(1), "the chart's value again: {d}");
}

/// Install, two upgrades (remediation dry-run, then off), uninstall, with
/// `helm`, whose version must start with `major` (`v4.`, `v3.`).
async fn install_upgrade_uninstall(
    node: &mountguard_tests::real::real_node::RealNode,
    helm: &Helm,
    major: &str,
) {
    let version = helm.ok_stdout(&["version", "--short"]);
    assert!(version.starts_with(major), "Helm {major}x: {version}");
    let (_, first) = install(node, helm, &[]).await;
    let client = node.cluster.client().await.expect("client");
    assert!(
        process_env(node, &first).contains(&"MOUNTGUARD_REMEDIATION=off".to_string()),
        "{:?}",
        process_env(node, &first)
    );
    assert!(
        !may_evict(&client).await,
        "remediation off grants no eviction"
    );

    // The token Secret remediation reads (a Slinky Token's Secret).
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "slurm-token-mountguard", "namespace": NAMESPACE},
        "stringData": {"SLURM_JWT": "not-a-real-token"}}),
    )
    .await
    .expect("token secret");
    upgrade(
        helm,
        &[
            "remediation.mode=dry-run",
            "remediation.slurmrestd.url=http://slurm-restapi.slurm.svc:6820",
            "remediation.slurmrestd.tokenSecret.name=slurm-token-mountguard",
        ],
    );
    let dry = controller_with_remediation(node, "dry-run").await;
    assert_ne!(
        dry["metadata"]["uid"], first["metadata"]["uid"],
        "a new pod"
    );
    let env = process_env(node, &dry);
    assert!(
        env.contains(&"MOUNTGUARD_REMEDIATION=dry-run".to_string())
            && env.contains(
                &"MOUNTGUARD_SLURMRESTD_URL=http://slurm-restapi.slurm.svc:6820".to_string()
            ),
        "{env:?}"
    );
    assert!(
        may_evict(&client).await,
        "remediation dry-run grants eviction"
    );

    upgrade(helm, &["remediation.mode=off"]);
    let off = controller_with_remediation(node, "off").await;
    assert!(process_env(node, &off).contains(&"MOUNTGUARD_REMEDIATION=off".to_string()));
    assert!(
        !may_evict(&client).await,
        "back to off: the eviction rule is gone"
    );
    let history = helm.ok_stdout(&["history", RELEASE, "--namespace", NAMESPACE]);
    assert_eq!(history.lines().count(), 4, "three revisions:\n{history}");

    // The release's cluster-scoped admission objects exist before the
    // uninstall (so that their absence after it means something).
    for kind in [
        "validatingadmissionpolicies",
        "validatingadmissionpolicybindings",
    ] {
        let path = format!("/apis/admissionregistration.k8s.io/v1/{kind}?labelSelector={INSTANCE}");
        let (code, list) = raw(&client, "GET", &path, None).await.expect(kind);
        assert_eq!(code, 200, "{list}");
        assert_eq!(
            list["items"].as_array().map(Vec::len),
            Some(1),
            "{kind} of the release: {list}"
        );
    }
    helm.ok(&uninstall_args("3m"));
    let left = poll(
        "no object of the release left",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            async move {
                let mut left = Vec::new();
                for path in [
                    format!("/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={INSTANCE}"),
                    format!("/api/v1/namespaces/{NAMESPACE}/services?labelSelector={INSTANCE}"),
                    format!("/api/v1/namespaces/{NAMESPACE}/serviceaccounts?labelSelector={INSTANCE}"),
                    format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments?labelSelector={INSTANCE}"),
                    format!("/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets?labelSelector={INSTANCE}"),
                    format!("/apis/rbac.authorization.k8s.io/v1/clusterroles?labelSelector={INSTANCE}"),
                    format!("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings?labelSelector={INSTANCE}"),
                    format!(
                        "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations?labelSelector={INSTANCE}"
                    ),
                    format!(
                        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies?labelSelector={INSTANCE}"
                    ),
                    format!(
                        "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings?labelSelector={INSTANCE}"
                    ),
                ] {
                    let (_, list) = raw(&client, "GET", &path, None).await.ok()?;
                    for o in list["items"].as_array()? {
                        left.push(format!("{path}: {}", o["metadata"]["name"]));
                    }
                }
                if !left.is_empty() {
                    eprintln!("left: {left:?}");
                }
                left.is_empty().then_some(())
            }
        },
    )
    .await;
    if let Err(e) = left {
        panic!("{e}");
    }
}
