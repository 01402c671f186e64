//! Tests of the webhook handler: AdmissionReview in, AdmissionReview out,
//! with the evaluation task's side played by a responder that answers
//! queries with a given view (the view itself is tested in `eval`).

use super::*;
use crate::runtime::metrics::Metrics;
use mountguard_core::admission::{Holder, Operation};
use serde_json::{Value, json};
use std::sync::atomic::Ordering;

fn settings(mode: Mode, answer_timeout: Duration) -> AdmissionSettings {
    AdmissionSettings {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls: ("/c".into(), "/k".into()),
        mode,
        answer_timeout,
        remediation: false,
        client_ca: None,
    }
}

struct Rig {
    handler: Arc<AdmissionHandler>,
    shared: Arc<Shared>,
    metrics: AdmissionMetrics,
    queries: Arc<std::sync::Mutex<Vec<(String, Operation)>>>,
}

/// A handler whose queries are answered with `view` (or never, with
/// `None`), the view synced unless `ready` is false.
fn rig(mode: Mode, view: Option<NameView>, ready: bool) -> Rig {
    rig_with(settings(mode, Duration::from_millis(300)), view, ready)
}

fn rig_with(settings: AdmissionSettings, view: Option<NameView>, ready: bool) -> Rig {
    let shared = Arc::new(Shared::new(Metrics::new()));
    let metrics = AdmissionMetrics::register(&shared.metrics);
    shared.ready.store(ready, Ordering::SeqCst);
    let (tx, mut rx) = mpsc::channel::<Input>(16);
    let queries = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = queries.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Some(i) = rx.recv().await {
            let Input::Admission(q) = i else { continue };
            seen.lock().unwrap().push((
                format!("{}/{}", q.source.namespace, q.source.name),
                q.operation,
            ));
            match &view {
                Some(v) => {
                    let _ = q.reply.send(v.clone());
                }
                // Never answered (kept, so the reply is not dropped).
                None => held.push(q),
            }
        }
    });
    Rig {
        handler: Arc::new(AdmissionHandler::new(
            settings,
            shared.clone(),
            tx,
            metrics.clone(),
        )),
        shared,
        metrics,
        queries,
    }
}

fn pinned() -> NameView {
    NameView {
        holders: vec![
            Holder {
                node: "node-0".into(),
                pod: "slurmd-0".into(),
            },
            Holder {
                node: "node-1".into(),
                pod: "slurmd-1".into(),
            },
        ],
        previous_immutable: true,
    }
}

fn review(operation: &str, kind: &str, immutable: bool) -> Value {
    let object = json!({
        "apiVersion": "v1", "kind": kind,
        "metadata": {"name": "auth", "namespace": "slurm"},
        "immutable": immutable,
        "data": {"slurm.key": "c2VjcmV0"},
    });
    let mut request = json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "", "version": "v1", "kind": kind},
        "resource": {"group": "", "version": "v1", "resource": format!("{}s", kind.to_lowercase())},
        "name": "auth",
        "namespace": "slurm",
        "operation": operation,
        "userInfo": {"username": "alice"},
        "dryRun": false,
    });
    let side = if operation == "DELETE" {
        "oldObject"
    } else {
        "object"
    };
    request[side] = object;
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

fn post(body: Vec<u8>) -> Request<Full<Bytes>> {
    Request::builder()
        .method(Method::POST)
        .uri(PATH)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

async fn send(r: &Rig, body: &Value) -> (StatusCode, Value) {
    let resp = r
        .handler
        .handle(post(serde_json::to_vec(body).unwrap()))
        .await;
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, v)
}

fn count(r: &Rig, operation: &str, result: &str) -> u64 {
    r.metrics
        .requests
        .with_label_values(&[operation, result])
        .get()
}

#[tokio::test]
async fn a_delete_of_a_held_immutable_secret_is_allowed_with_warnings() {
    let r = rig(Mode::Warn, Some(pinned()), true);
    let (status, v) = send(&r, &review("DELETE", "Secret", true)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    let resp = &v["response"];
    assert_eq!(resp["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(resp["allowed"], true);
    let w = resp["warnings"].as_array().expect("warnings");
    assert!(
        w[0].as_str()
            .unwrap()
            .starts_with("immutable Secret \"slurm/auth\" is referenced by 2 pods on 2 nodes"),
        "{w:?}"
    );
    assert_eq!(
        r.queries.lock().unwrap().as_slice(),
        &[("slurm/auth".to_string(), Operation::Delete)]
    );
    assert_eq!(count(&r, "delete", "warned"), 1);
    assert_eq!(
        r.metrics
            .answer
            .with_label_values(&["delete"])
            .get_sample_count(),
        1
    );
}

#[tokio::test]
async fn a_mutable_delete_and_an_unheld_name_are_allowed_without_a_word() {
    let r = rig(Mode::Warn, Some(pinned()), true);
    let (_, v) = send(&r, &review("DELETE", "ConfigMap", false)).await;
    assert_eq!(v["response"]["allowed"], true);
    assert!(
        v["response"].get("warnings").is_none_or(Value::is_null),
        "{v}"
    );
    let r = rig(Mode::Warn, Some(NameView::default()), true);
    let (_, v) = send(&r, &review("CREATE", "Secret", true)).await;
    assert_eq!(v["response"]["allowed"], true);
    assert!(
        v["response"].get("warnings").is_none_or(Value::is_null),
        "{v}"
    );
    assert_eq!(count(&r, "create", "allowed"), 1);
}

#[tokio::test]
async fn deny_mode_refuses_a_create_under_a_held_name_with_409_conflict() {
    let r = rig(Mode::Deny, Some(pinned()), true);
    let (status, v) = send(&r, &review("CREATE", "Secret", true)).await;
    assert_eq!(status, StatusCode::OK);
    let resp = &v["response"];
    assert_eq!(resp["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(resp["allowed"], false);
    assert_eq!(resp["status"]["code"], 409);
    assert_eq!(resp["status"]["reason"], "Conflict");
    let msg = resp["status"]["message"].as_str().unwrap();
    assert!(msg.contains("still cached on 2 nodes"), "{msg}");
    assert_eq!(count(&r, "create", "denied"), 1);
    // A delete in deny mode is only warned about.
    let (_, v) = send(&r, &review("DELETE", "Secret", true)).await;
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"]["warnings"].is_array(), "{v}");
}

#[tokio::test]
async fn before_the_watches_sync_everything_is_allowed_without_asking() {
    let r = rig(Mode::Deny, Some(pinned()), false);
    let (_, v) = send(&r, &review("CREATE", "Secret", true)).await;
    assert_eq!(v["response"]["allowed"], true);
    assert!(r.queries.lock().unwrap().is_empty());
    assert_eq!(count(&r, "create", "not_ready"), 1);
}

#[tokio::test]
async fn a_view_that_does_not_answer_in_time_allows_the_call() {
    let r = rig(Mode::Deny, None, true);
    let started = Instant::now();
    let (_, v) = send(&r, &review("CREATE", "Secret", true)).await;
    let took = started.elapsed();
    assert_eq!(v["response"]["allowed"], true);
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_eq!(count(&r, "create", "busy"), 1);
}

#[tokio::test]
async fn off_mode_and_other_kinds_and_operations_are_allowed_without_asking() {
    let r = rig(Mode::Off, Some(pinned()), true);
    let (_, v) = send(&r, &review("CREATE", "Secret", true)).await;
    assert_eq!(v["response"]["allowed"], true);
    let r2 = rig(Mode::Deny, Some(pinned()), true);
    let (_, v) = send(&r2, &review("CREATE", "Pod", true)).await;
    assert_eq!(v["response"]["allowed"], true);
    let (_, v) = send(&r2, &review("UPDATE", "Secret", true)).await;
    assert_eq!(v["response"]["allowed"], true);
    assert!(r.queries.lock().unwrap().is_empty());
    assert!(r2.queries.lock().unwrap().is_empty());
    assert_eq!(count(&r2, "other", "allowed"), 2);
}

#[tokio::test]
async fn a_create_by_generate_name_reads_the_name_from_the_object() {
    let r = rig(Mode::Warn, Some(NameView::default()), true);
    let mut body = review("CREATE", "Secret", true);
    body["request"]["name"] = json!("");
    body["request"]["object"]["metadata"]["name"] = json!("auth-x7k2p");
    send(&r, &body).await;
    assert_eq!(
        r.queries.lock().unwrap().as_slice(),
        &[("slurm/auth-x7k2p".to_string(), Operation::Create)]
    );
}

#[tokio::test]
async fn bad_requests_get_clear_errors() {
    let r = rig(Mode::Warn, Some(pinned()), true);
    let bytes = |resp: Response<Full<Bytes>>| async move {
        let status = resp.status();
        let b = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&b).to_string())
    };
    let (s, msg) = bytes(r.handler.handle(post(b"{not json".to_vec())).await).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(
        msg.contains("not an admission.k8s.io/v1 AdmissionReview"),
        "{msg}"
    );
    let (s, msg) = bytes(
        r.handler
            .handle(post(
                br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
            ))
            .await,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(msg.contains("without a request"), "{msg}");
    let (s, msg) = bytes(r.handler.handle(post(vec![b' '; MAX_BODY + 1])).await).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert!(msg.contains("at most"), "{msg}");
    let mut get = post(Vec::new());
    *get.method_mut() = Method::GET;
    assert_eq!(
        r.handler.handle(get).await.status(),
        StatusCode::METHOD_NOT_ALLOWED
    );
    let mut other = post(Vec::new());
    *other.uri_mut() = "/v1/other".parse().unwrap();
    assert_eq!(
        r.handler.handle(other).await.status(),
        StatusCode::NOT_FOUND
    );
    assert_eq!(count(&r, "other", "invalid"), 5);
    assert!(r.queries.lock().unwrap().is_empty());
}

/// A CA, the webhook's certificate (`localhost`) and key files signed by
/// it, its PEM in `client-ca.crt`, and a client certificate of the same
/// CA (the API server's): (server cert, server key, client-ca file, CA
/// DER, client cert and key).
#[allow(clippy::type_complexity)]
fn webhook_pki(
    dir: &std::path::Path,
) -> (
    PathBuf,
    PathBuf,
    PathBuf,
    rustls::pki_types::CertificateDer<'static>,
    (
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ),
) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "webhook test CA");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let srv_key = KeyPair::generate().unwrap();
    let srv = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&srv_key, &issuer)
        .unwrap();
    let mut client = CertificateParams::new(Vec::<String>::new()).unwrap();
    client
        .distinguished_name
        .push(rcgen::DnType::CommonName, "kube-apiserver");
    let client_key = KeyPair::generate().unwrap();
    let client = client.signed_by(&client_key, &issuer).unwrap();
    let (cert, key, ca_file) = (
        dir.join("tls.crt"),
        dir.join("tls.key"),
        dir.join("client-ca.crt"),
    );
    std::fs::write(&cert, srv.pem()).unwrap();
    std::fs::write(&key, srv_key.serialize_pem()).unwrap();
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    (
        cert,
        key,
        ca_file,
        ca_cert.der().clone(),
        (
            client.der().clone(),
            rustls::pki_types::PrivateKeyDer::try_from(client_key.serialize_der()).unwrap(),
        ),
    )
}

/// The admission port's cap and four more idle sockets from one pod's
/// address, each reopened as soon as it is closed (they never reach the
/// TLS handshake): reviews from the API server (its client certificate,
/// a fresh connection each, from another address) are all answered, and
/// `deny` still refuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_socket_flood_does_not_starve_admission_reviews() {
    use mountguard_serve::test_flood::Flood;
    use rustls::crypto::ring;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let (cert, key, ca_file, ca_der, client_id) = webhook_pki(dir.path());
    let config = crate::runtime::tls::ReloadingCert::load(cert, key)
        .unwrap()
        .server_config_verifying_clients(&ca_file)
        .unwrap();
    let Rig {
        handler, shared, ..
    } = rig(Mode::Deny, Some(pinned()), true);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = crate::api::routes::limits(Duration::from_secs(10), Duration::from_secs(60));
    let (_stop, shutdown) = Shutdown::new();
    tokio::spawn(serve(
        listener,
        config,
        handler,
        limits,
        shared.metrics.serve("admission"),
        shutdown,
    ));
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_der).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(vec![client_id.0], client_id.1)
        .unwrap();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let body = serde_json::to_vec(&review("CREATE", "Secret", true)).unwrap();
    let api_server = |from: std::net::IpAddr| {
        let connector = connector.clone();
        let body = body.clone();
        async move {
            let s = tokio::net::TcpSocket::new_v4()?;
            s.bind(SocketAddr::new(from, 0))?;
            let s = s.connect(addr).await?;
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let mut t = connector.connect(name, s).await?;
            let head = format!(
                "POST {PATH} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            t.write_all(head.as_bytes()).await?;
            t.write_all(&body).await?;
            let mut out = Vec::new();
            t.read_to_end(&mut out).await?;
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).to_string())
        }
    };
    let flood = Flood::past_the_cap(addr, limits.max_connections).await;
    let mut denied = 0;
    for _ in 0..20 {
        let out = tokio::time::timeout(
            Duration::from_secs(2),
            api_server("127.0.0.1".parse().unwrap()),
        )
        .await;
        if let Ok(Ok(out)) = out
            && out.starts_with("HTTP/1.1 200")
            && out.contains("\"allowed\":false")
        {
            denied += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(flood);
    assert_eq!(denied, 20, "reviews answered (denied) under the flood");
}

/// A request body that never sends a byte, and says whether it was polled.
struct Stalled(Arc<std::sync::atomic::AtomicBool>);

impl Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Infallible>>> {
        self.0.store(true, Ordering::SeqCst);
        std::task::Poll::Pending
    }
}

fn stalled() -> (Request<Stalled>, Arc<std::sync::atomic::AtomicBool>) {
    let polled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let req = Request::builder()
        .method(Method::POST)
        .uri(PATH)
        .body(Stalled(polled.clone()))
        .unwrap();
    (req, polled)
}

/// Many callers at once (each review's body up to 3 MiB): the replica
/// reads at most `MAX_REVIEWS_AT_ONCE` of them; one beyond is answered 503
/// at once without a byte of its body read (the API server's
/// `failurePolicy: Ignore` allows the call), counted as `overloaded`; a
/// freed place serves the next review.
#[tokio::test]
async fn a_flood_of_concurrent_reviews_is_answered_unread_beyond_the_bound() {
    let r = rig(Mode::Warn, Some(pinned()), true);
    let mut reading = Vec::new();
    for _ in 0..MAX_REVIEWS_AT_ONCE {
        let (req, polled) = stalled();
        let h = r.handler.clone();
        reading.push(tokio::spawn(async move { h.handle(req).await }));
        while !polled.load(Ordering::SeqCst) {
            tokio::task::yield_now().await;
        }
    }
    let (req, polled) = stalled();
    let resp = tokio::time::timeout(Duration::from_millis(500), r.handler.handle(req))
        .await
        .expect("answered at once, without waiting for the body");
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!polled.load(Ordering::SeqCst), "the body was read");
    let msg = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(
        String::from_utf8_lossy(&msg).contains("reviews are being read"),
        "{msg:?}"
    );
    assert_eq!(count(&r, "other", "overloaded"), 1);
    assert!(r.queries.lock().unwrap().is_empty());
    // One reader gone: a review is read and answered again.
    reading.pop().unwrap().abort();
    while r.handler.reading.available_permits() == 0 {
        tokio::task::yield_now().await;
    }
    let (status, v) = send(&r, &review("DELETE", "Secret", true)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(v["response"]["warnings"].is_array(), "{v}");
    for t in reading {
        t.abort();
    }
}

/// The API server always sends the object being deleted as `oldObject`: a
/// delete review without one (absent or null) is not taken as the delete
/// of an immutable object, so it learns nothing about who holds the name.
#[tokio::test]
async fn a_delete_review_without_an_old_object_is_not_taken_as_immutable() {
    let r = rig(Mode::Warn, Some(pinned()), true);
    for old in [None, Some(Value::Null)] {
        let mut body = review("DELETE", "ConfigMap", false);
        match old {
            None => {
                body["request"].as_object_mut().unwrap().remove("oldObject");
            }
            Some(v) => body["request"]["oldObject"] = v,
        }
        let (status, v) = send(&r, &body).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["response"]["allowed"], true);
        assert!(
            v["response"].get("warnings").is_none_or(Value::is_null),
            "{v}"
        );
    }
    assert_eq!(count(&r, "delete", "allowed"), 2);
}

/// Without a client CA anyone who reaches the port can send a review for
/// any name: the answer counts holders and names no node and no pod. With
/// one (the handshake verified the API server) it names them.
#[tokio::test]
async fn an_unverified_caller_learns_no_node_or_pod_name() {
    let said = |client_ca: Option<PathBuf>, operation: &'static str| async move {
        let s = AdmissionSettings {
            client_ca,
            ..settings(Mode::Warn, Duration::from_millis(300))
        };
        let r = rig_with(s, Some(pinned()), true);
        let (_, v) = send(&r, &review(operation, "Secret", true)).await;
        assert_eq!(v["response"]["allowed"], true);
        v["response"]["warnings"].to_string()
    };
    for operation in ["DELETE", "CREATE"] {
        let w = said(None, operation).await;
        assert!(w.contains("2 pods"), "{w}");
        assert!(
            w.contains("kubectl mountguard status --namespace slurm"),
            "{w}"
        );
        for name in ["node-0", "node-1", "slurmd-0", "slurmd-1"] {
            assert!(!w.contains(name), "{name} named to anyone: {w}");
        }
        let w = said(Some("/ca.crt".into()), operation).await;
        assert!(w.contains("node-0"), "{w}");
    }
}

/// The answer is an admission.k8s.io/v1 AdmissionReview echoing the uid;
/// a review of another version is refused (the webhook is registered
/// with v1 only, and the API server expects its own version back).
#[tokio::test]
async fn an_answer_speaks_admission_v1_and_echoes_the_uid() {
    let r = rig(Mode::Warn, Some(NameView::default()), true);
    let mut body = review("CREATE", "Secret", false);
    body["request"]["uid"] = json!("0c9a8d74-9cb7-44dd-b98e-09fd62def2f4");
    let (status, v) = send(&r, &body).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        v,
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "response": {"uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4", "allowed": true}})
    );
    body["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let (status, _) = send(&r, &body).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
