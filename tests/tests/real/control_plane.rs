//! The real control plane itself: what the rig relies on from it.

use std::time::Duration;

use mountguard_tests::kubelet::projection::service_account_token;
use mountguard_tests::mountguard::poll;
use mountguard_tests::real::{create, ensure_namespace, raw, token_review};
use serde_json::json;

use crate::harness::start_cluster;

/// A projected token written by the node double is a real TokenRequest
/// token bound to the pod and its node: the real TokenReview names the
/// ServiceAccount, the pod and the node, refuses it for another audience,
/// refuses a forged token, and refuses it once the pod is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_token_review_knows_pod_bound_tokens_and_refuses_forged_ones() {
    let mut cluster = start_cluster(1).await;
    let client = cluster.client().await.unwrap();
    ensure_namespace(&client, "t").await.unwrap();
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent", "namespace": "t"}}),
    )
    .await
    .unwrap();
    let pod = create(
        &client,
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent-0", "namespace": "t"},
            "spec": {
                "nodeName": "node-0",
                "serviceAccountName": "agent",
                "automountServiceAccountToken": false,
                "containers": [{"name": "agent", "image": "example.invalid/agent:1"}],
                "volumes": [{"name": "tok", "projected": {"sources": [
                    {"serviceAccountToken": {"audience": "mountguard", "expirationSeconds": 3600, "path": "token"}},
                ]}}],
            },
        }),
    )
    .await
    .unwrap();
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let file = mountguard_inventory::layout::pod_dir(&cluster.kubelet_root(0), &uid)
        .join("volumes/kubernetes.io~projected/tok/token");
    let token = poll(
        "the node double to project the token",
        Duration::from_secs(60),
        || {
            let file = file.clone();
            async move {
                std::fs::read_to_string(&file)
                    .ok()
                    .filter(|t| !t.is_empty())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs(20)));

    let status = token_review(&client, &token, &["mountguard"])
        .await
        .unwrap();
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(status["user"]["username"], "system:serviceaccount:t:agent");
    let extra = &status["user"]["extra"];
    assert_eq!(
        extra["authentication.kubernetes.io/pod-name"][0], "agent-0",
        "{status}"
    );
    assert_eq!(
        extra["authentication.kubernetes.io/pod-uid"][0],
        uid.as_str(),
        "{status}"
    );
    assert_eq!(
        extra["authentication.kubernetes.io/node-name"][0], "node-0",
        "{status}"
    );
    assert_eq!(status["audiences"][0], "mountguard");

    let other_audience = token_review(&client, &token, &["someone-else"])
        .await
        .unwrap();
    assert_ne!(other_audience["authenticated"], true, "{other_audience}");
    // The cluster in a box's token format (unsigned by this API server).
    let forged = service_account_token(&pod, "node-0", "mountguard", 3600);
    let forged = token_review(&client, &forged, &["mountguard"])
        .await
        .unwrap();
    assert_ne!(forged["authenticated"], true, "{forged}");

    // Deleted pod: the node double confirms the deletion; the bound token
    // is refused from then on.
    let (code, body) = raw(&client, "DELETE", "/api/v1/namespaces/t/pods/agent-0", None)
        .await
        .unwrap();
    assert!(code == 200 || code == 202, "{code} {body}");
    poll(
        "the pod to be gone and its token refused",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let token = token.clone();
            async move {
                let (code, _) = raw(&client, "GET", "/api/v1/namespaces/t/pods/agent-0", None)
                    .await
                    .ok()?;
                let s = token_review(&client, &token, &["mountguard"]).await.ok()?;
                (code == 404 && s["authenticated"] != true).then_some(())
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", cluster.logs(20)));
    cluster.shutdown().await;
}
