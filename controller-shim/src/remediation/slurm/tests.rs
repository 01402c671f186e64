//! Request shape and response handling against a tiny loopback server.

use std::sync::Mutex;

use hyper::body::Incoming;
use mountguard_serve::test_server::TestServer;
use serde_json::{Value, json};

use super::*;

/// Property names of `v0.0.44_update_node_msg` in the slurmrestd OpenAPI
/// description.
const UPDATE_NODE_MSG_FIELDS: &[&str] = &[
    "comment",
    "cpu_bind",
    "extra",
    "features",
    "features_act",
    "gres",
    "address",
    "hostname",
    "name",
    "state",
    "reason",
    "reason_uid",
    "resume_after",
    "topology_str",
    "weight",
];

#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    token: Option<String>,
    content_type: Option<String>,
    body: Value,
}

type Reply = (u16, String);

struct Server {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
    _server: TestServer,
}

async fn server(replies: Vec<Reply>) -> Server {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let replies = Arc::new(Mutex::new(replies.into_iter()));
    let s2 = seen.clone();
    let server = TestServer::start(move |req: Request<Incoming>| {
        let seen = s2.clone();
        let replies = replies.clone();
        async move {
            let method = req.method().to_string();
            let path = req.uri().path().to_string();
            let h = |n: &str| {
                req.headers()
                    .get(n)
                    .and_then(|v| v.to_str().ok())
                    .map(String::from)
            };
            let token = h(TOKEN_HEADER);
            let content_type = h("content-type");
            let bytes = req
                .into_body()
                .collect()
                .await
                .expect("request body")
                .to_bytes();
            let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            seen.lock().expect("lock").push(Seen {
                method,
                path,
                token,
                content_type,
                body,
            });
            let (status, body) = replies
                .lock()
                .expect("lock")
                .next()
                .unwrap_or((500, "{}".into()));
            hyper::Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Full::new(Bytes::from(body)))
                .expect("response")
        }
    })
    .await
    .expect("bind");
    Server {
        url: server.url(),
        seen,
        _server: server,
    }
}

fn ok_envelope() -> String {
    json!({"meta": {}, "errors": [], "warnings": []}).to_string()
}

fn node_envelope(name: &str, state: &[&str], reason: &str) -> String {
    json!({
        "nodes": [{
            "name": name,
            "state": state,
            "reason": reason,
            "reason_set_by_user": "slurm",
            "reason_changed_at": {"set": true, "infinite": false, "number": 1764496800},
            "cpus": 4,
        }],
        "last_update": {"set": true, "infinite": false, "number": 1764496800},
        "meta": {}, "errors": [], "warnings": []
    })
    .to_string()
}

fn static_token(t: &str) -> Arc<dyn TokenSource> {
    let value = SharedSecret::default();
    value.set(Some(t.as_bytes().to_vec()));
    Arc::new(SecretToken { value })
}

fn client(url: &str, token: Arc<dyn TokenSource>) -> SlurmClient {
    SlurmClient::new(url, None, token, Duration::from_secs(5)).expect("client")
}

#[tokio::test]
async fn drain_posts_an_update_node_msg_with_the_token() {
    let s = server(vec![(200, ok_envelope())]).await;
    let c = client(&s.url, static_token("tok-1\n"));
    c.drain("slurm-worker-0", "mountguard: x attempt 1")
        .await
        .expect("drain");
    let seen = s.seen.lock().expect("lock")[0].clone();
    assert_eq!(seen.method, "POST");
    assert_eq!(seen.path, "/slurm/v0.0.44/node/slurm-worker-0");
    assert_eq!(seen.token.as_deref(), Some("tok-1"));
    assert_eq!(seen.content_type.as_deref(), Some("application/json"));
    assert_eq!(
        seen.body,
        json!({"state": ["DRAIN"], "reason": "mountguard: x attempt 1"})
    );
    for k in seen.body.as_object().expect("object").keys() {
        assert!(UPDATE_NODE_MSG_FIELDS.contains(&k.as_str()), "{k}");
    }
}

#[tokio::test]
async fn undrain_re_reads_and_only_clears_our_reason() {
    let s = server(vec![
        (
            200,
            node_envelope("n1", &["IDLE", "DRAIN"], "mountguard: a attempt 1"),
        ),
        (200, ok_envelope()),
        (200, node_envelope("n1", &["IDLE", "DRAIN"], "admin: dimm")),
    ])
    .await;
    let c = client(&format!("{}/", s.url), static_token("t"));
    assert!(
        c.undrain_if_reason("n1", "mountguard: a attempt 1")
            .await
            .expect("undrain")
    );
    assert!(
        !c.undrain_if_reason("n1", "mountguard: a attempt 1")
            .await
            .expect("read")
    );
    let seen = s.seen.lock().expect("lock").clone();
    let methods: Vec<&str> = seen.iter().map(|s| s.method.as_str()).collect();
    assert_eq!(
        methods,
        vec!["GET", "POST", "GET"],
        "no write for a foreign drain"
    );
    assert_eq!(seen[1].body, json!({"state": ["UNDRAIN"]}));
    assert_eq!(seen[0].path, "/slurm/v0.0.44/node/n1");
}

#[tokio::test]
async fn get_node_parses_state_reason_and_user() {
    let s = server(vec![(
        200,
        node_envelope("n1", &["MIXED", "DRAIN"], "mountguard: a attempt 1"),
    )])
    .await;
    let n = client(&s.url, static_token("t"))
        .get_node("n1")
        .await
        .expect("node");
    assert_eq!(n.state, vec!["MIXED", "DRAIN"]);
    assert_eq!(n.reason, "mountguard: a attempt 1");
    assert_eq!(n.reason_set_by_user, "slurm");
    assert_eq!(n.reason_changed_at, Some(1764496800));
    let st = n.to_state();
    assert!(st.drain() && st.busy() && !st.drained() && st.responding());
}

#[tokio::test]
async fn error_classes() {
    let err = |d: &str, n: i64| {
        json!({"meta": {}, "errors": [{"description": d, "error_number": n, "error": d, "source": "x"}], "warnings": []})
            .to_string()
    };
    let s = server(vec![
        (401, err("Authentication failure", 1007)),
        (500, err("Invalid node name specified", 2018)),
        (503, "<html>bad gateway</html>".into()),
        (200, "not json".into()),
        (400, err("You must specify a reason", 2020)),
        (
            200,
            json!({"nodes": [], "last_update": {}, "errors": []}).to_string(),
        ),
        (500, err("Unable to contact slurmctld", 1007)),
    ])
    .await;
    let c = client(&s.url, static_token("t"));
    let e = c.get_node("n1").await.expect_err("401");
    assert!(
        matches!(e, SlurmError::Unauthorized { status: 401, .. }),
        "{e}"
    );
    assert!(!e.is_transient());
    assert!(e.to_string().contains("Authentication failure"));
    let e = c.get_node("n1").await.expect_err("404");
    assert!(matches!(e, SlurmError::NotFound { .. }), "{e}");
    assert!(!e.is_transient());
    let e = c.get_node("n1").await.expect_err("503");
    assert!(matches!(e, SlurmError::Server { status: 503, .. }), "{e}");
    assert!(e.is_transient());
    let e = c.get_node("n1").await.expect_err("garbage");
    assert!(matches!(e, SlurmError::BadResponse { .. }), "{e}");
    let e = c.drain("n1", "r").await.expect_err("rejected");
    assert!(matches!(e, SlurmError::Rejected { status: 400, .. }), "{e}");
    assert!(!e.is_transient());
    let e = c.get_node("n1").await.expect_err("empty");
    assert!(matches!(e, SlurmError::NotFound { .. }), "{e}");
    let e = c.drain("n1", "r").await.expect_err("500");
    assert!(e.is_transient(), "{e}");
}

#[tokio::test]
async fn unreachable_and_tokenless_are_transient_and_send_nothing() {
    // A port that was just free.
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let url = format!("http://{}", l.local_addr().expect("addr"));
    drop(l);
    let e = client(&url, static_token("t"))
        .get_node("n1")
        .await
        .expect_err("refused");
    assert!(matches!(e, SlurmError::Transport(_)), "{e}");
    assert!(e.is_transient());

    let s = server(vec![]).await;
    let unset: Arc<dyn TokenSource> = Arc::new(SecretToken::default());
    let e = client(&s.url, unset)
        .drain("n1", "r")
        .await
        .expect_err("no token");
    assert!(matches!(e, SlurmError::Token(_)), "{e}");
    assert!(s.seen.lock().expect("lock").is_empty());
}

#[tokio::test]
async fn minted_tokens_are_hs256_with_sun_iat_exp_and_follow_key_changes() {
    let s = server(vec![(200, ok_envelope()), (200, ok_envelope())]).await;
    let key = SharedSecret::default();
    key.set(Some(b"0123456789abcdef0123456789abcdef".to_vec()));
    let minter = JwtMinter {
        key: key.clone(),
        user: "slurm".into(),
        ttl: Duration::from_secs(300),
    };
    let c = client(&s.url, Arc::new(minter));
    c.undrain("n1").await.expect("ok");
    key.set(Some(b"another key, rotated".to_vec()));
    c.undrain("n1").await.expect("ok");
    let seen = s.seen.lock().expect("lock").clone();
    let check = |tok: &str, k: &[u8]| {
        let (signing, sig) = tok.rsplit_once('.').expect("jwt");
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(k).expect("key");
        mac.update(signing.as_bytes());
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        mac.verify_slice(&b64.decode(sig).expect("b64"))
            .expect("signed with the key");
        let (head, body) = signing.split_once('.').expect("parts");
        let head: Value = serde_json::from_slice(&b64.decode(head).expect("b64")).expect("json");
        assert_eq!(head["alg"], "HS256");
        let claims: Value = serde_json::from_slice(&b64.decode(body).expect("b64")).expect("json");
        assert_eq!(claims["sun"], "slurm");
        let iat = claims["iat"].as_i64().expect("iat");
        assert_eq!(claims["exp"].as_i64(), Some(iat + 300));
        assert!((iat - Timestamp::now().as_second()).abs() < 60);
    };
    check(
        seen[0].token.as_deref().expect("token"),
        b"0123456789abcdef0123456789abcdef",
    );
    check(
        seen[1].token.as_deref().expect("token"),
        b"another key, rotated",
    );
}

#[test]
fn configuration_errors_are_clear_and_tokens_never_print() {
    let t = static_token("very-secret");
    let e =
        SlurmClient::new("ftp://x", None, t.clone(), Duration::from_secs(1)).expect_err("scheme");
    assert!(e.to_string().contains("http or https"), "{e}");
    let e = SlurmClient::new(
        "https://slurmrestd:6820",
        Some(b"not pem"),
        t.clone(),
        Duration::from_secs(1),
    )
    .expect_err("ca");
    assert!(e.to_string().contains("--slurmrestd-ca-file"), "{e}");
    let c = SlurmClient::new(
        "http://127.0.0.1:6820",
        None,
        t.clone(),
        Duration::from_secs(1),
    )
    .expect("ok");
    assert!(!format!("{c:?}").contains("very-secret"));
    assert!(!format!("{t:?}").contains("very-secret"));
    assert!(SlurmClient::node_path("n1/../../x").is_err());
    assert!(SlurmClient::node_path("slurm-worker-0.cluster").is_ok());
}

/// The controller's image (a static binary on an empty base) has no system
/// CA roots. A client for plain http (Slinky's slurmrestd Service) builds
/// without them; one for https without a CA file says what to give. Run in
/// a child process of this test binary whose `SSL_CERT_FILE` and
/// `SSL_CERT_DIR` (read by rustls-native-certs before the system's paths)
/// hold no certificate.
#[test]
fn without_system_ca_roots_http_builds_and_https_asks_for_a_ca() {
    const NAME: &str =
        "remediation::slurm::tests::without_system_ca_roots_http_builds_and_https_asks_for_a_ca";
    if std::env::var_os("MOUNTGUARD_TEST_NO_CA_ROOTS").is_none() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, b"").unwrap();
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
            .env("MOUNTGUARD_TEST_NO_CA_ROOTS", "1")
            .env("SSL_CERT_FILE", &empty)
            .env("SSL_CERT_DIR", dir.path())
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    let t = static_token("t");
    SlurmClient::new(
        "http://slurm-restapi.slurm.svc:6820",
        None,
        t.clone(),
        Duration::from_secs(1),
    )
    .expect("plain http needs no CA roots");
    let e = SlurmClient::new(
        "https://slurm-restapi.slurm.svc:6820",
        None,
        t,
        Duration::from_secs(1),
    )
    .expect_err("https without roots");
    assert!(
        e.to_string().contains("--slurmrestd-ca-file")
            && e.to_string().contains("remediation.slurmrestd.caSecret"),
        "{e}"
    );
}

/// The answers Slurm 26.05's slurmrestd gave when run here, each taken for
/// what it means (docs/testing.md, "Slurm").
#[tokio::test]
async fn real_slurm_26_05_answers_are_classified_for_what_they_mean() {
    let err = |d: &str, n: i64| {
        json!({"meta": {}, "errors": [{"description": d, "error_number": n, "error": d, "source": "x"}], "warnings": []})
            .to_string()
    };
    let s = server(vec![
        // GET of a node slurmctld does not know: 200, no nodes, error 0.
        (200, err("Failure to query node n9", 0)),
        // A token with a bad signature or expired: 511, error 1007.
        (511, err("Protocol authentication error", 1007)),
        // No token: 401 with a text/plain body.
        (401, "Authentication failure\n".into()),
        // A non-admin user's write: 422, error 2010.
        (422, err("User ID missing from credential", 2010)),
        // A write to an unknown node: 422, error 2018.
        (422, err("Invalid node name specified", 2018)),
        // RESUME of a node that is open already: 422, error 2180.
        (422, err("Invalid node state transition requested", 2180)),
    ])
    .await;
    let c = client(&s.url, static_token("t"));
    let e = c.get_node("n9").await.expect_err("unknown node");
    assert!(matches!(e, SlurmError::NotFound { .. }), "{e}");
    let e = c.get_node("n1").await.expect_err("511");
    assert!(
        matches!(e, SlurmError::Unauthorized { status: 511, .. }),
        "{e}"
    );
    assert!(
        !e.is_transient(),
        "a refused token is not retried as transient"
    );
    assert!(e.to_string().contains("jwt_key"), "{e}");
    let e = c.get_node("n1").await.expect_err("401");
    assert!(
        matches!(e, SlurmError::Unauthorized { status: 401, .. }),
        "{e}"
    );
    let e = c.drain("n1", "r").await.expect_err("2010");
    assert!(
        matches!(e, SlurmError::Unauthorized { status: 422, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("not a Slurm administrator"), "{e}");
    let e = c.drain("n9", "r").await.expect_err("2018");
    assert!(matches!(e, SlurmError::NotFound { .. }), "{e}");
    c.resume("n1")
        .await
        .expect("a RESUME of an open node is done");
}
