//! The status API as an attacker meets it: fingerprints that cannot be
//! compared across objects (the guess oracle), and readers authorized per
//! namespace by a TokenReview and a SubjectAccessReview (here against the
//! API server double's grants).

use std::time::Duration;

use mountguard_tests::apiserver::{AccessGrant, TokenUser, resources};
use mountguard_tests::cluster::SLURM_NAMESPACE;
use mountguard_tests::mountguard::{http_get, http_request};
use serde_json::{Value, json};

use crate::harness::{Options, System, wait, wait_all_fresh};

const TENANT: &str = "tenant";
const TENANT_TOKEN: &str = "tenant-reader-token-0123456789";

fn secret(name: &str, value: &str) -> Value {
    use base64::Engine as _;
    json!({
        "metadata": {"name": name},
        "immutable": true,
        "data": {"password": base64::engine::general_purpose::STANDARD.encode(value)},
    })
}

fn pod(name: &str, secret: &str) -> Value {
    json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": "node-0",
            "containers": [{
                "name": "app",
                "image": "busybox",
                "volumeMounts": [{"name": "db", "mountPath": "/etc/db", "readOnly": true}],
            }],
            "volumes": [{"name": "db", "secret": {"secretName": secret}}],
        },
    })
}

/// `GET path` of the status API with `token` (none: no header).
async fn get(sys: &System, path: &str, token: Option<&str>) -> (u16, String) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth
        .as_deref()
        .map(|a| vec![("authorization", a)])
        .unwrap_or_default();
    http_request(
        "GET",
        &format!("{}{path}", sys.metrics_base()),
        &headers,
        Vec::new(),
    )
    .await
    .unwrap()
}

/// The guess attack of a tenant: a Secret of its own with the guessed value
/// of another namespace's Secret, compared by fingerprint through the
/// status API. Equal content in two objects must show unrelated
/// fingerprints, wherever the status API shows one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fingerprint_oracle_equal_secrets_in_two_namespaces_show_unrelated_fingerprints() {
    let sys = System::start(Options::default()).await;
    wait_all_fresh(&sys).await;
    let api = sys.cluster.api();
    api.ensure_namespace(TENANT).unwrap();
    for (ns, name) in [(SLURM_NAMESPACE, "db"), (TENANT, "db"), (TENANT, "guess")] {
        api.create(&resources::SECRETS, ns, secret(name, "4711"))
            .unwrap();
        api.create(&resources::PODS, ns, pod(&format!("app-{name}"), name))
            .unwrap();
    }
    let base = sys.metrics_base();
    let rollout = |ns: &'static str, name: &'static str| {
        let base = base.clone();
        async move {
            let text = http_get(&format!("{base}/v1/rollouts/secret/{ns}/{name}"))
                .await
                .ok()?;
            let doc: Value = serde_json::from_str(&text).ok()?;
            let c = &doc["consumers"][0];
            (c["state"] == "Fresh").then_some(doc)
        }
    };
    let mut docs = Vec::new();
    for (ns, name) in [(SLURM_NAMESPACE, "db"), (TENANT, "db"), (TENANT, "guess")] {
        docs.push(
            wait(
                &sys,
                &format!("{ns}/{name} verified"),
                Duration::from_secs(20),
                || rollout(ns, name),
            )
            .await,
        );
    }
    // The source's current fingerprint, the one its consumer was verified
    // against, and the mounted volume's (expected = observed: Fresh).
    let mut seen = Vec::new();
    for d in &docs {
        let current = d["sources"][0]["fingerprint"].as_str().unwrap().to_string();
        let verified = d["consumers"][0]["sources"][0]["fingerprint"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(current, verified, "one object's versions compare: {d}");
        seen.push(current);
    }
    let verdicts: Value = serde_json::from_str(
        &http_get(&format!("{base}/v1/verdicts?all=1"))
            .await
            .unwrap(),
    )
    .unwrap();
    for name in ["app-db", "app-guess"] {
        let mounted: Vec<&str> = verdicts["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["pod"] == name && v["subject"] == "volume db")
            .map(|v| v["observed"].as_str().unwrap())
            .collect();
        assert!(!mounted.is_empty(), "{name}: {verdicts}");
        seen.extend(mounted.iter().map(|s| s.to_string()));
    }
    assert_eq!(
        seen.len(),
        6,
        "three sources and their three mounts: {seen:?}"
    );
    let mut distinct = seen.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        seen.len(),
        "equal content, but every object's fingerprint is its own: {seen:?}"
    );
    sys.shutdown().await;
}

/// Only authorized readers get verdicts; a reader bound in one namespace
/// reads only that namespace; metrics and probes stay open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_api_answers_only_readers_authorized_for_the_namespace() {
    let sys = System::start(Options::default()).await;
    wait_all_fresh(&sys).await;
    let api = sys.cluster.api();
    api.add_token(
        TENANT_TOKEN,
        TokenUser {
            username: "tenant-user".into(),
            uid: "tenant-uid".into(),
            groups: vec!["tenants".into()],
            ..Default::default()
        },
    );
    // A RoleBinding of the reader role in the tenant's namespace.
    api.grant(AccessGrant {
        subject: "tenant-user".into(),
        verb: "get".into(),
        group: "mountguard.io".into(),
        resource: "verdicts".into(),
        namespace: Some(TENANT.into()),
    });
    let slurm_rollout = format!("/v1/rollouts/secret/{SLURM_NAMESPACE}/slurm-auth-slurm");
    let tenant_rollout = format!("/v1/rollouts/secret/{TENANT}/db");

    // No token, a forged one: 401, the body says what to send.
    for token in [None, Some("forged")] {
        for path in ["/v1/verdicts", slurm_rollout.as_str()] {
            let (code, body) = get(&sys, path, token).await;
            assert_eq!(code, 401, "{path} {token:?}: {body}");
            if token.is_none() {
                assert!(body.contains("bearer token"), "{body}");
            }
            assert!(!body.contains("verdicts\":"), "{body}");
        }
    }
    // The tenant: its namespace only.
    let (code, body) = get(&sys, &tenant_rollout, Some(TENANT_TOKEN)).await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = get(&sys, "/v1/verdicts?namespace=tenant", Some(TENANT_TOKEN)).await;
    assert_eq!(code, 200, "{body}");
    for (path, what) in [
        (slurm_rollout.as_str(), "in namespace \"slurm\""),
        ("/v1/verdicts", "in every namespace"),
        (
            "/v1/verdicts?namespace=slurm&all=1",
            "in namespace \"slurm\"",
        ),
    ] {
        let (code, body) = get(&sys, path, Some(TENANT_TOKEN)).await;
        assert_eq!(code, 403, "{path}: {body}");
        assert!(
            body.contains("\"tenant-user\"") && body.contains(what),
            "{path}: {body}"
        );
    }
    // The rig's cluster-wide reader: everything.
    for path in ["/v1/verdicts?all=1", slurm_rollout.as_str()] {
        http_get(&format!("{}{path}", sys.metrics_base()))
            .await
            .unwrap();
    }
    // Open: metrics and probes.
    for path in ["/metrics", "/healthz", "/readyz"] {
        assert_eq!(get(&sys, path, None).await.0, 200, "{path}");
    }
    let metrics = mountguard_tests::demo::scrape(&sys.metrics_base())
        .await
        .unwrap();
    let count = |result: &str| {
        metrics
            .iter()
            .find(|s| {
                s.name == "mountguard_status_requests_total"
                    && s.labels.get("result").map(String::as_str) == Some(result)
            })
            .map_or(0.0, |s| s.value)
    };
    assert!(count("unauthenticated") >= 4.0, "{metrics:?}");
    assert!(count("forbidden") >= 3.0, "{metrics:?}");
    assert!(count("allowed") >= 2.0, "{metrics:?}");
    sys.shutdown().await;
}
