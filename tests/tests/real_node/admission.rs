//! The admission webhook as `helm install` sets it up: the chart's own CA
//! (no cert-manager on the node), its Service to the controller's pod, and
//! the real API server calling it through kube-proxy with real
//! AdmissionReview requests.

use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::real_node::NODE;
use mountguard_tests::real::{
    create, ensure_namespace, raw_warned, wait_for_default_service_account,
};
use mountguard_tests::real_node_or_skip;
use serde_json::json;

use crate::harness::wait_pod_ready;
use crate::helm::{Helm, install};

const NS: &str = "admission-demo";

/// A pod on the node holds an immutable Secret; deleting it returns the
/// chart-installed webhook's warning to the client, and the delete goes
/// through. The chart's defaults verify no client certificate, so the
/// warning counts the pod and the node and names neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_admission_webhook_installed_by_helm_warns_a_delete_of_a_held_secret() {
    let node = real_node_or_skip!(
        "real_node_admission_webhook_installed_by_helm_warns_a_delete_of_a_held_secret"
    );
    let helm = Helm::new(&node);
    install(&node, &helm, &[]).await;
    let client = node.cluster.client().await.expect("client");
    ensure_namespace(&client, NS).await.expect("namespace");
    wait_for_default_service_account(&client, NS)
        .await
        .expect("sa");
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Secret", "immutable": true,
        "metadata": {"name": "held", "namespace": NS},
        "stringData": {"key": "v1"}}),
    )
    .await
    .expect("secret");
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "holder", "namespace": NS},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": node.images.pause, "imagePullPolicy": "Never",
                "volumeMounts": [{"name": "s", "mountPath": "/s", "readOnly": true}]}],
            "volumes": [{"name": "s", "secret": {"secretName": "held"}}]}}),
    )
    .await
    .expect("pod");
    wait_pod_ready(&node, NS, "holder", Duration::from_secs(120)).await;
    let path = format!("/api/v1/namespaces/{NS}/secrets/held");
    // A dry-run delete goes through admission too: wait until the
    // controller's view holds the pod.
    let seen = poll(
        "the webhook's warning on a dry-run delete",
        Duration::from_secs(120),
        || {
            let (client, path) = (client.clone(), format!("{path}?dryRun=All"));
            async move {
                let (_, _, w) = raw_warned(&client, "DELETE", &path, None).await.ok()?;
                (!w.is_empty()).then_some(w)
            }
        },
    )
    .await;
    if let Err(e) = seen {
        panic!("{e}\n{}", node.logs(30));
    }
    let (code, body, warnings) = raw_warned(&client, "DELETE", &path, None)
        .await
        .expect("delete");
    assert_eq!(code, 200, "the delete goes through: {body}");
    assert!(
        warnings.iter().any(|w| w
            == &format!(
                "immutable Secret \"{NS}/held\" is referenced by 1 pod on 1 node \
                 (`kubectl mountguard status --namespace {NS} --all` lists them)"
            )),
        "{warnings:?}"
    );
}
