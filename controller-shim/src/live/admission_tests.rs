//! Tests of the webhook handler: AdmissionReview in, AdmissionReview out,
//! with the evaluation task's side played by a responder that answers
//! queries with a given view (the view itself is tested in `eval`).

use super::*;
use crate::live::metrics::Metrics;
use mountguard_core::admission::Holder;
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
    handler: AdmissionHandler,
    shared: Arc<Shared>,
    queries: Arc<std::sync::Mutex<Vec<(String, Operation)>>>,
}

/// A handler whose queries are answered with `view` (or never, with
/// `None`), the view synced unless `ready` is false.
fn rig(mode: Mode, view: Option<NameView>, ready: bool) -> Rig {
    let shared = Arc::new(Shared::new(Metrics::new()));
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
        handler: AdmissionHandler::new(
            settings(mode, Duration::from_millis(300)),
            shared.clone(),
            tx,
        ),
        shared,
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
    r.shared
        .metrics
        .admission_requests
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
        r.shared
            .metrics
            .admission_answer
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
