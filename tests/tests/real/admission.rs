//! The admission webhook on the real kube-apiserver: the chart's
//! ValidatingWebhookConfiguration (pointed at the controller process of
//! the rig over TLS, with the rig's CA as its caBundle) passes the real
//! API server's validation, the real API server sends real AdmissionReview
//! v1 requests for deletes and creates of Secrets, and its clients get the
//! controller's warnings (the `Warning` response header, what kubectl
//! prints) or its refusal. With the controller stopped the same calls go
//! through (`failurePolicy: Ignore`) within the webhook's timeout.

use std::path::Path;
use std::time::{Duration, Instant};

use mountguard_tests::mountguard::free_addr;
use mountguard_tests::real::{create, raw, raw_warned};
use serde_json::{Value, json};

use crate::harness::{CHART_SCENARIO, RealSystem, wait};

/// The namespace of the tests' objects (the webhook's namespaceSelector
/// sends only its calls, so the rest of the rig is untouched).
const NS: &str = "admission-test";
/// The immutable Secret the pod holds.
const SECRET: &str = "pinned-key";

/// One request through the admin client: status, body and warnings.
async fn call(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Value, Vec<String>) {
    raw_warned(client, method, path, body)
        .await
        .expect("the API server answers")
}

fn secret_body(content: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NS},
        "immutable": true,
        "stringData": {"slurm.key": content},
    })
}

fn secret_path(dry_run: bool) -> String {
    let dry = if dry_run { "?dryRun=All" } else { "" };
    format!("/api/v1/namespaces/{NS}/secrets/{SECRET}{dry}")
}

/// The rig's webhook certificate: a CA and a serving certificate for
/// 127.0.0.1 (the controller process listens there), written under `dir`.
/// Returns (cert file, key file, CA PEM).
fn webhook_pki(dir: &Path) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "admission-test-ca");
    let ca_key = KeyPair::generate().unwrap();
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (c, k) = (dir.join("admission.crt"), dir.join("admission.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (c.display().to_string(), k.display().to_string(), ca.pem())
}

/// The chart's rendered webhook configuration (the rig's scenario), with
/// its client config pointed at `url` with `ca` and its namespace selector
/// narrowed to [`NS`].
fn chart_webhook(sys: &RealSystem, url: &str, ca: &str) -> Value {
    use base64::Engine as _;
    let dir = sys.cluster.dir().join("chart").join(CHART_SCENARIO);
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name().is_some_and(|n| {
                n.to_string_lossy()
                    .contains("-ValidatingWebhookConfiguration-")
            })
        })
        .expect("the chart renders the ValidatingWebhookConfiguration");
    let mut vwc: Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let w = &mut vwc["webhooks"][0];
    assert_eq!(w["failurePolicy"], "Ignore");
    w["clientConfig"] = json!({
        "url": url,
        "caBundle": base64::engine::general_purpose::STANDARD.encode(ca),
    });
    w["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": NS}});
    vwc
}

/// Starts the rig with the controller serving the webhook in `mode`, the
/// chart's webhook configuration registered, an immutable Secret and a pod
/// on node-0 that references it, and waits until the controller's view
/// holds the pod (a dry-run delete is warned about).
async fn start(mode: &str) -> RealSystem {
    let mut sys = RealSystem::start(1).await;
    let (cert, key, ca) = webhook_pki(sys.cluster.dir());
    let addr = free_addr().unwrap();
    let vars = [
        ("MOUNTGUARD_ADMISSION_LISTEN", addr.to_string()),
        ("MOUNTGUARD_ADMISSION_TLS_CERT_FILE", cert),
        ("MOUNTGUARD_ADMISSION_TLS_KEY_FILE", key),
        ("MOUNTGUARD_ADMISSION_MODE", mode.to_string()),
    ];
    let refs: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
    sys.restart_controller_with(&refs).await;
    let client = sys.client.clone();
    mountguard_tests::real::ensure_namespace(&client, NS)
        .await
        .unwrap();
    let vwc = chart_webhook(&sys, &format!("https://{addr}/v1/admission"), &ca);
    create(&client, &vwc)
        .await
        .unwrap_or_else(|e| panic!("the real API server refuses the chart's webhook: {e}"));
    let (code, body, _) = call(
        &client,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(&secret_body("old")),
    )
    .await;
    assert_eq!(code, 201, "{body}");
    let node = sys.cluster.node_names()[0].clone();
    create(
        &client,
        &json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "holder", "namespace": NS},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "c", "image": "registry.example/holder:1",
                                "volumeMounts": [{"name": "key", "mountPath": "/etc/key"}]}],
                "volumes": [{"name": "key", "secret": {"secretName": SECRET}}],
            },
        }),
    )
    .await
    .unwrap();
    // The controller holds the pod as registered once the node double
    // reported its status (startTime): a dry-run delete then warns.
    wait(
        &sys,
        "the webhook to see the holding pod",
        Duration::from_secs(90),
        || {
            let client = client.clone();
            async move {
                let (_, _, w) = call(&client, "DELETE", &secret_path(true), None).await;
                (!w.is_empty()).then_some(())
            }
        },
    )
    .await;
    sys
}

/// A delete of the held immutable Secret returns the warning to the
/// client (and goes through); a re-create under the same name warns that
/// a node still serves the previous object. The rig's API server presents
/// no client certificate the controller verifies, so the warnings count
/// the node and the pod and name neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_admission_delete_and_recreate_of_a_pinned_immutable_secret_warn_the_client() {
    let sys = start("warn").await;
    let client = sys.client.clone();
    let (code, body, warnings) = call(&client, "DELETE", &secret_path(false), None).await;
    assert_eq!(code, 200, "the delete goes through: {body}");
    assert!(
        warnings.iter().any(|w| w
            == &format!(
                "immutable Secret \"{NS}/{SECRET}\" is referenced by 1 pod on 1 node \
                 (`kubectl mountguard status --namespace {NS} --all` lists them)"
            )),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("keeps serving the deleted content")),
        "{warnings:?}"
    );
    // The view hears of the delete through its watch; the create's review
    // finds the previous object held either way.
    let (code, body, warnings) = call(
        &client,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(&secret_body("new")),
    )
    .await;
    assert_eq!(code, 201, "warn mode lets the create through: {body}");
    assert!(
        warnings.iter().any(|w| w
            == &format!(
                "the previous immutable Secret \"{NS}/{SECRET}\" is still cached on 1 node, held by \
                 1 pod (`kubectl mountguard status --namespace {NS} --all` lists them)"
            )),
        "{warnings:?}"
    );
    let m = mountguard_tests::mountguard::http_get(&format!("{}/metrics", sys.metrics_base()))
        .await
        .unwrap();
    for line in [
        "mountguard_admission_requests_total{operation=\"delete\",result=\"warned\"}",
        "mountguard_admission_requests_total{operation=\"create\",result=\"warned\"}",
    ] {
        assert!(
            m.lines().any(|l| l.starts_with(line) && !l.ends_with(" 0")),
            "{line} counted:\n{m}"
        );
    }
    sys.shutdown().await;
}

/// In deny mode the re-create under the held name is refused with the
/// controller's reason and message; the delete before it is still only
/// warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_admission_deny_mode_refuses_the_recreate_of_a_pinned_immutable_secret() {
    let sys = start("deny").await;
    let client = sys.client.clone();
    let (code, body, warnings) = call(&client, "DELETE", &secret_path(false), None).await;
    assert_eq!(code, 200, "deny mode lets the delete through: {body}");
    assert!(!warnings.is_empty());
    let (code, body, _) = call(
        &client,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(&secret_body("new")),
    )
    .await;
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["reason"], "Conflict", "{body}");
    let msg = body["message"].as_str().unwrap_or_default();
    assert!(
        msg.starts_with("admission webhook \"pins.mountguard.io\" denied the request: the previous immutable Secret"),
        "{msg}"
    );
    assert!(msg.contains("under a new name"), "{msg}");
    // Not created.
    let (code, _) = raw(&client, "GET", &secret_path(false), None)
        .await
        .unwrap();
    assert_eq!(code, 404);
    sys.shutdown().await;
}

/// With the controller stopped, the same delete and re-create go through
/// without a warning, each well within the webhook's timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_admission_with_the_controller_stopped_calls_go_through_within_the_timeout() {
    let mut sys = start("deny").await;
    let client = sys.client.clone();
    if let Some(mut c) = sys.controller.take() {
        c.kill();
    }
    let timeout = Duration::from_secs(2);
    let started = Instant::now();
    let (code, body, warnings) = call(&client, "DELETE", &secret_path(false), None).await;
    let took = started.elapsed();
    assert_eq!(code, 200, "{body}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(took < timeout + Duration::from_secs(1), "{took:?}");
    let started = Instant::now();
    let (code, body, _) = call(
        &client,
        "POST",
        &format!("/api/v1/namespaces/{NS}/secrets"),
        Some(&secret_body("new")),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(
        code, 201,
        "deny mode cannot refuse while the controller is down: {body}"
    );
    assert!(took < timeout + Duration::from_secs(1), "{took:?}");
    sys.shutdown().await;
}
