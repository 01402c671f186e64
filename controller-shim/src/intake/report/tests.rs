//! Tests of the report handler and its listener: authentication, limits,
//! slow and oversized bodies, refusal logs, rate limits, connections.

use super::*;
use crate::intake::auth::tests::{FakeReviewer, agent_pod, agent_user};
use crate::intake::body::*;
use crate::intake::limits::*;
use crate::runtime::limits::RateLimit;
use crate::runtime::metrics::Metrics;
use crate::state::Shared;
use http_body_util::BodyExt;
use mountguard_serve::test_flood::closed_within;
use std::sync::atomic::Ordering;

struct Rig {
    handler: ReportHandler,
    rx: mpsc::Receiver<Input>,
    shared: Arc<Shared>,
    metrics: IntakeMetrics,
}

fn rig(max_bytes: u64, rate: RateLimit) -> Rig {
    let shared = Arc::new(Shared::new(Metrics::new()));
    shared.acting.store(true, Ordering::SeqCst);
    shared.ready.store(true, Ordering::SeqCst);
    let mut f = FakeReviewer::default();
    f.tokens
        .insert("tok-a".into(), agent_user("agent-a", "ua", Some("node-a")));
    f.tokens
        .insert("tok-b".into(), agent_user("agent-b", "ub", None));
    let agents = Arc::new(AgentPods::default());
    agents.set_daemonset_uid(Some(crate::intake::auth::tests::DS_UID.into()));
    agents.apply(agent_pod("agent-a", "ua", "node-a"));
    agents.apply(agent_pod("agent-b", "ub", "node-b"));
    let (tx, rx) = mpsc::channel(100);
    let metrics = IntakeMetrics::register(&shared.metrics);
    let handler = ReportHandler::new(
        ReportConfig {
            audience: "mountguard".into(),
            agent_sa: "mg:agent".parse().unwrap(),
            agent_daemonset: "agent".into(),
            max_bytes,
            rate,
            limits: CountLimits {
                pods: 3,
                ..Default::default()
            },
            body_timeout: Duration::from_secs(10),
            node_in_flight: NODE_IN_FLIGHT,
        },
        shared.clone(),
        metrics.clone(),
        Arc::new(f),
        agents,
        None,
        tx,
    );
    Rig {
        handler,
        rx,
        shared,
        metrics,
    }
}

fn inventory(node: &str, generation: u64) -> Vec<u8> {
    let mut inv = NodeInventory::new(node, "test", "2026-11-30T10:00:00Z".parse().unwrap());
    inv.generation = generation;
    serde_json::to_vec(&inv).unwrap()
}

fn heartbeat(node: &str, generation: u64) -> Vec<u8> {
    serde_json::to_vec(&Heartbeat::new(
        node,
        generation,
        "2026-11-30T10:00:30Z".parse().unwrap(),
    ))
    .unwrap()
}

fn req(path: &str, token: Option<&str>, body: Vec<u8>) -> Request<Full<Bytes>> {
    let mut b = Request::put(path).header(header::CONTENT_LENGTH, body.len());
    if let Some(t) = token {
        b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
    }
    b.body(Full::new(Bytes::from(body))).unwrap()
}

async fn call(r: &Rig, q: Request<Full<Bytes>>) -> (StatusCode, serde_json::Value, Option<String>) {
    let resp = r.handler.handle(q).await;
    let status = resp.status();
    let retry = resp
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, serde_json::from_slice(&body).unwrap(), retry)
}

fn counter(r: &Rig, result: &str) -> u64 {
    r.metrics.report_requests.with_label_values(&[result]).get()
}

fn no_input(r: &mut Rig) {
    assert!(
        r.rx.try_recv().is_err(),
        "a rejected report reached the evaluation"
    );
}

const INV_A: &str = "/v1/nodes/node-a/inventory";

/// A writer into a shared buffer, for capturing log lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self, containing: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|l| l.contains(containing))
            .count()
    }
}

/// 48 unauthenticated and 48 rate-limited requests write one warning
/// line each result, not 96; every refusal is still counted.
#[tokio::test]
async fn refusal_log_rate() {
    let out = Captured::default();
    let w = out.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let r = rig(1 << 20, "0.001/s,1".parse().unwrap());
    for i in 0..48 {
        let (s, _, _) = call(&r, req(INV_A, Some(&format!("bad-{i}")), vec![])).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
    }
    let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
    assert_eq!(s, StatusCode::OK);
    for _ in 0..48 {
        let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
        assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(counter(&r, "unauthenticated"), 48);
    assert_eq!(counter(&r, "rate_limited"), 48);
    assert_eq!(
        out.lines("report rejected"),
        2,
        "{}",
        String::from_utf8_lossy(&out.0.lock().unwrap())
    );
    assert_eq!(out.lines("result=\"unauthenticated\""), 1);
    assert_eq!(out.lines("result=\"rate_limited\""), 1);
}

/// One line per result per period; the next line says how many were
/// not logged.
#[test]
fn refusal_lines_summarize_what_they_did_not_log() {
    let mut log = RefusalLog::default();
    let t0 = Instant::now();
    assert_eq!(log.admit("unauthenticated", t0), Some(0));
    for i in 1..=47 {
        assert_eq!(
            log.admit("unauthenticated", t0 + Duration::from_millis(i * 100)),
            None
        );
    }
    assert_eq!(log.admit("forbidden", t0 + Duration::from_secs(1)), Some(0));
    assert_eq!(
        log.admit("unauthenticated", t0 + REFUSAL_LOG_EVERY),
        Some(47)
    );
    assert_eq!(log.admit("unauthenticated", t0 + REFUSAL_LOG_EVERY), None);
    assert_eq!(
        log.admit("unauthenticated", t0 + REFUSAL_LOG_EVERY * 3),
        Some(1)
    );
}
const HB_A: &str = "/v1/nodes/node-a/heartbeat";

/// A body that sends one byte a second, forever (a chunked body).
fn trickle(
    path: &str,
    token: &str,
) -> Request<impl Body<Data = Bytes, Error = std::io::Error> + use<>> {
    let stream = futures::stream::unfold((), |()| async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        Some((
            Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from_static(b" "))),
            (),
        ))
    });
    Request::put(path)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(http_body_util::StreamBody::new(stream))
        .unwrap()
}

/// A node's valid token trickling bodies a byte a second: each is
/// answered 408 at the body deadline, and the node holds at most
/// [`NODE_IN_FLIGHT`] of them; another node's heartbeat is answered
/// meanwhile.
#[tokio::test(start_paused = true)]
async fn slow_body() {
    let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
    let t0 = tokio::time::Instant::now();
    let held = futures::future::join_all(
        (0..NODE_IN_FLIGHT).map(|_| r.handler.handle(trickle(HB_A, "tok-a"))),
    );
    let probe = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let over = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
        let other = call(
            &r,
            req(
                "/v1/nodes/node-b/heartbeat",
                Some("tok-b"),
                heartbeat("node-b", 1),
            ),
        )
        .await;
        (over, other, t0.elapsed())
    };
    let (held, ((s, b, retry), (other, _, _), probed)) =
        tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(held, probe) })
            .await
            .expect("a trickled body held its report past the deadline");
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rateLimited"))
    );
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(other, StatusCode::OK);
    assert!(probed < Duration::from_secs(3), "{probed:?}");
    for resp in &held {
        assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
        assert_eq!(resp.headers()[header::CONNECTION], "close");
    }
    let took = t0.elapsed();
    assert!(took <= Duration::from_secs(11), "{took:?}");
    assert_eq!(counter(&r, "body_timeout"), NODE_IN_FLIGHT as u64);
    assert_eq!(counter(&r, "rate_limited"), 1);
    no_input(&mut r);
    // The slots are free again.
    let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
    assert_eq!(s, StatusCode::OK);
}

/// A body that keeps up the minimum rate is not cut off at the body
/// timeout: its deadline moves one second per 64 KiB.
#[test]
fn the_body_deadline_moves_with_the_bytes_received() {
    let t0 = tokio::time::Instant::now();
    let d = Duration::from_secs(10);
    assert_eq!(body_deadline(t0, d, 0), t0 + d);
    assert_eq!(
        body_deadline(t0, d, MIN_BODY_RATE * 5),
        t0 + d + Duration::from_secs(5)
    );
}

#[tokio::test]
async fn accepts_then_unchanged_then_conflict_and_resend() {
    let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
    // Nothing held yet: a heartbeat asks for the inventory.
    let (s, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 7))).await;
    assert_eq!((s, b["status"].as_str()), (StatusCode::OK, Some("resend")));
    no_input(&mut r);
    let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 7))).await;
    assert_eq!(
        (s, b["status"].as_str(), b["generation"].as_u64()),
        (StatusCode::OK, Some("accepted"), Some(7))
    );
    assert!(matches!(r.rx.try_recv(), Ok(Input::Inventory(i, _)) if i.generation == 7));
    let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 7))).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("unchanged"))
    );
    assert!(matches!(
        r.rx.try_recv(),
        Ok(Input::Heartbeat { generation: 7, .. })
    ));
    let (s, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 7))).await;
    assert_eq!(
        (s, b["status"].as_str()),
        (StatusCode::OK, Some("unchanged"))
    );
    assert!(matches!(r.rx.try_recv(), Ok(Input::Heartbeat { .. })));
    // Older generation: 409, nothing changes.
    let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 6))).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::CONFLICT, Some("staleGeneration"))
    );
    no_input(&mut r);
    assert_eq!(r.handler.held_generation("node-a"), Some(7));
    // A newer generation is accepted; a heartbeat for an unknown newer one asks to resend.
    let (_, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 9))).await;
    assert_eq!(b["status"], "resend");
    // After a reset (new leader) the held generation is gone.
    r.handler.reset();
    let (_, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 7))).await;
    assert_eq!(b["status"], "resend");
    assert_eq!(counter(&r, "accepted"), 1);
    assert_eq!(counter(&r, "conflict"), 1);
    assert_eq!(counter(&r, "resend"), 3);
}

/// The bound on parsed inventories holds from the parse on: with every
/// permit held, a report is not even parsed (a malformed one is not
/// answered) until one is released.
#[tokio::test(start_paused = true)]
async fn an_inventory_is_parsed_only_within_the_in_flight_bound() {
    let r = rig(1 << 20, "100/s,100".parse().unwrap());
    let held = r
        .handler
        .inflight
        .clone()
        .acquire_many_owned(MAX_INFLIGHT_INVENTORIES as u32)
        .await
        .unwrap();
    let bad = || req(INV_A, Some("tok-a"), b"{not json".to_vec());
    let waited = tokio::time::timeout(Duration::from_secs(5), call(&r, bad())).await;
    assert!(waited.is_err(), "parsed beyond the bound: {waited:?}");
    drop(held);
    let (s, b, _) = call(&r, bad()).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("badRequest"))
    );
}

#[tokio::test]
async fn malformed_input_is_rejected_and_changes_nothing() {
    let mut r = rig(4096, "100/s,100".parse().unwrap());
    let (s, _, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 5))).await;
    assert_eq!(s, StatusCode::OK);
    let _ = r.rx.try_recv();
    let good = String::from_utf8(inventory("node-a", 9)).unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not json", b"{nope".to_vec()),
        ("truncated", good.as_bytes()[..good.len() / 2].to_vec()),
        ("unknown field", good.replacen('{', r#"{"extra":1,"#, 1).into_bytes()),
        ("wrong schema", good.replace("mountguard.io/node-inventory/v1", "x/v9").into_bytes()),
        ("wrong node", inventory("node-b", 9)),
        ("bad digest", good.replacen(r#""pods":[]"#, r#""pods":[{"uid":"u","volumes":[{"plugin":"secret","name":"v","files":{"a":"zz"}}]}]"#, 1).into_bytes()),
    ];
    for (what, body) in cases {
        let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{what}: {b}");
        assert_eq!(b["error"], "badRequest", "{what}");
        no_input(&mut r);
    }
    // Too many pods (the limit here is 3).
    let mut inv: NodeInventory = serde_json::from_slice(&inventory("node-a", 9)).unwrap();
    for i in 0..4 {
        inv.pods.push(mountguard_inventory::PodInventory {
            uid: format!("u{i}"),
            volumes: vec![],
            sub_paths: vec![],
            errors: vec![],
        });
    }
    let (s, b, _) = call(
        &r,
        req(INV_A, Some("tok-a"), serde_json::to_vec(&inv).unwrap()),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
    assert!(b["message"].as_str().unwrap().contains("pods"), "{b}");
    // Heartbeat with the wrong node or garbage.
    let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-b", 5))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), b"[]".to_vec())).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // Oversized: by Content-Length, and by streaming without it.
    let big = vec![b' '; 5000];
    let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), big.clone())).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("tooLarge"))
    );
    let no_len = Request::put(INV_A)
        .header(header::AUTHORIZATION, "Bearer tok-a")
        .body(http_body_util::StreamBody::new(futures::stream::iter(
            (0..10).map(|_| {
                Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(vec![b' '; 1000])))
            }),
        )))
        .unwrap();
    let resp = r.handler.handle(no_len).await;
    assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
    no_input(&mut r);
    assert_eq!(r.handler.held_generation("node-a"), Some(5));
    assert_eq!(counter(&r, "bad_request"), 9);
    assert_eq!(counter(&r, "too_large"), 2);
}

#[tokio::test]
async fn an_oversized_body_is_drained_up_to_the_cap_then_refused() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let polled = Arc::new(AtomicUsize::new(0));
    let p = polled.clone();
    // 100 MiB in 1 MiB frames against a 1 MiB limit.
    let body = http_body_util::StreamBody::new(futures::stream::iter((0..100).map(move |_| {
        p.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(vec![b' '; 1 << 20])))
    })));
    assert!(matches!(
        read_bounded(body, 1 << 20, Duration::from_secs(10)).await,
        Err(BodyError::TooLarge)
    ));
    // Read to the 8 MiB cap so the answer reaches the client, no further.
    let n = polled.load(Ordering::SeqCst);
    assert!((8..=10).contains(&n), "{n} frames read");
    // A body exactly at the limit is kept whole.
    let body = Full::new(Bytes::from(vec![b'x'; 1 << 20]));
    match read_bounded(body, 1 << 20, Duration::from_secs(10)).await {
        Ok(b) => assert_eq!(b.len(), 1 << 20),
        Err(_) => panic!("a body at the limit was refused"),
    }
}

#[tokio::test]
async fn forged_and_unknown_tokens_are_refused() {
    let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
    // Node B's agent reporting for node A.
    let (s, b, _) = call(&r, req(INV_A, Some("tok-b"), inventory("node-a", 1))).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden"))
    );
    // Node A's token with a node-name claim for A, reporting for B.
    let (s, _, _) = call(
        &r,
        req(
            "/v1/nodes/node-b/inventory",
            Some("tok-a"),
            inventory("node-b", 1),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, b, _) = call(&r, req(INV_A, Some("forged"), inventory("node-a", 1))).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("unauthenticated"))
    );
    let (s, _, _) = call(&r, req(INV_A, None, inventory("node-a", 1))).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    no_input(&mut r);
    assert_eq!(r.handler.held_generation("node-a"), None);
    assert_eq!(counter(&r, "forbidden"), 2);
    assert_eq!(counter(&r, "unauthenticated"), 2);
    // Bad paths.
    let resp = r
        .handler
        .handle(req("/v1/nodes/Node_A/inventory", Some("tok-a"), vec![]))
        .await;
    assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    // Not the acting replica.
    r.shared.acting.store(false, Ordering::SeqCst);
    let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 1))).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("notLeader"))
    );
    r.shared.acting.store(true, Ordering::SeqCst);
    r.shared.ready.store(false, Ordering::SeqCst);
    let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 1))).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, Some("notReady"))
    );
    no_input(&mut r);
}

/// An agent clock 10 minutes ahead: the times handed to the
/// evaluation are the receipt time, so a change made a moment ago is
/// not judged as if the grace period had passed (Propagating, not
/// Stale), and a day-ahead heartbeat does not keep the node fresh.
#[tokio::test]
async fn times_ahead_of_the_controller_clock_are_clamped_to_receipt() {
    let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
    let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_mins(10);
    let mut inv = NodeInventory::new("node-a", "test", ahead);
    inv.generation = 3;
    inv.pods.push(mountguard_inventory::PodInventory {
        uid: "u".into(),
        volumes: vec![mountguard_inventory::VolumeInventory {
            plugin: mountguard_inventory::Plugin::Secret,
            name: "v".into(),
            data_dir: None,
            written_at: Some(ahead),
            digest: None,
            files: Default::default(),
            modes: Default::default(),
            errors: vec![],
        }],
        sub_paths: vec![],
        errors: vec![],
    });
    let (s, _, _) = call(
        &r,
        req(INV_A, Some("tok-a"), serde_json::to_vec(&inv).unwrap()),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    let after = jiff::Timestamp::now();
    match r.rx.try_recv() {
        Ok(Input::Inventory(i, _)) => {
            assert!(i.scanned_at <= after, "scannedAt kept at {}", i.scanned_at);
            assert!(i.pods[0].volumes[0].written_at.unwrap() <= after);
        }
        _ => panic!("no inventory"),
    }
    let day = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24);
    let hb = serde_json::to_vec(&Heartbeat::new("node-a", 3, day)).unwrap();
    let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), hb)).await;
    assert_eq!(s, StatusCode::OK);
    match r.rx.try_recv() {
        Ok(Input::Heartbeat { scanned_at, .. }) => {
            assert!(scanned_at <= jiff::Timestamp::now(), "{scanned_at}")
        }
        _ => panic!("no heartbeat"),
    }
    assert_eq!(r.metrics.report_clock_clamped.get(), 2);
    // A time behind the controller's clock is kept as is.
    let behind: jiff::Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
    let mut inv = NodeInventory::new("node-a", "test", behind);
    assert_eq!(
        clamp_to_received(&mut inv, jiff::Timestamp::now()),
        Duration::ZERO
    );
    assert_eq!(inv.scanned_at, behind);
}

#[tokio::test]
async fn per_node_rate_limit() {
    let mut r = rig(1 << 20, "0.5/s,3".parse().unwrap());
    for g in 1..=3 {
        let (s, _, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", g))).await;
        assert_eq!(s, StatusCode::OK);
    }
    let (s, b, retry) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 4))).await;
    assert_eq!(
        (s, b["error"].as_str()),
        (StatusCode::TOO_MANY_REQUESTS, Some("rateLimited"))
    );
    assert_eq!(retry.as_deref(), Some("2"));
    // Another node has its own bucket.
    let (s, _, _) = call(
        &r,
        req(
            "/v1/nodes/node-b/heartbeat",
            Some("tok-b"),
            heartbeat("node-b", 1),
        ),
    )
    .await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(r.handler.held_generation("node-a"), Some(3));
    let mut n = 0;
    while r.rx.try_recv().is_ok() {
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(counter(&r, "rate_limited"), 1);
}

/// One request on `s` (kept alive); the status line of the answer, or
/// `None` when the server had closed the connection.
async fn exchange(s: &mut tokio::net::TcpStream, token: Option<&str>) -> Option<String> {
    exchange_with(s, token, "").await
}

/// [`exchange`] with `extra` (whole header lines) in the head.
async fn exchange_with(
    s: &mut tokio::net::TcpStream,
    token: Option<&str>,
    extra: &str,
) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = heartbeat("node-a", 1);
    let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
    let head = format!(
        "PUT {HB_A} HTTP/1.1\r\nhost: c\r\n{auth}{extra}content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(&[head.as_bytes(), &body].concat()).await.ok()?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .expect("an answer")
        .ok()?;
    (n > 0).then(|| {
        String::from_utf8_lossy(&buf[..n])
            .lines()
            .next()
            .unwrap_or("")
            .to_string()
    })
}

/// An agent's connection that sent a valid authenticated report stays
/// open across a gap between reports longer than the header-read
/// timeout (the heartbeat interval is longer than it), so the next
/// heartbeat needs no new connection (no TLS handshake); a connection
/// idle from the start, or whose request was refused, is still closed
/// by the header-read timeout.
#[tokio::test]
async fn an_authenticated_agent_connection_stays_open_between_heartbeats() {
    let r = rig(1 << 20, "100/s,100".parse().unwrap());
    let Rig {
        handler,
        rx: _rx,
        metrics: intake,
        ..
    } = r;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let header_read = Duration::from_millis(300);
    let metrics = mountguard_serve::ServeMetrics::unregistered();
    let (_trigger, shutdown) = Shutdown::new();
    tokio::spawn(serve(
        listener,
        None,
        Arc::new(handler),
        limits(header_read, Duration::from_secs(3), 256),
        metrics.clone(),
        shutdown,
    ));
    let connect = || tokio::net::TcpStream::connect(addr);
    let mut agent = connect().await.unwrap();
    let mut idle = connect().await.unwrap();
    let mut refused = connect().await.unwrap();
    let first = exchange(&mut agent, Some("tok-a")).await;
    assert!(
        first.as_deref().is_some_and(|l| l.contains(" 200 ")),
        "{first:?}"
    );
    let denied = exchange(&mut refused, Some("forged")).await;
    assert!(
        denied.as_deref().is_some_and(|l| l.contains(" 401 ")),
        "{denied:?}"
    );
    // A gap of three header-read timeouts.
    tokio::time::sleep(header_read * 3).await;
    assert!(closed_within(&mut idle, Duration::from_millis(50)).await);
    assert!(closed_within(&mut refused, Duration::from_millis(50)).await);
    for _ in 0..2 {
        let next = exchange(&mut agent, Some("tok-a")).await;
        assert!(
            next.as_deref().is_some_and(|l| l.contains(" 200 ")),
            "the agent's connection was closed between heartbeats: {next:?}"
        );
        tokio::time::sleep(header_read * 3).await;
    }
    assert_eq!(metrics.timed_out.get(), 2);
    assert_eq!(counter_of(&intake, "unauthenticated"), 1);
}

/// The report port's read buffer bounds a request head at 8 KiB: an
/// agent's head with a 4 KiB token (more than a projected service
/// account token carries) is served, one of 12 KiB is refused with 431
/// and nothing is read from it.
#[tokio::test]
async fn the_report_port_serves_an_agents_head_and_refuses_one_over_its_read_buffer() {
    let Rig {
        handler,
        rx: _rx,
        metrics: intake,
        ..
    } = rig(1 << 20, "100/s,100".parse().unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (_trigger, shutdown) = Shutdown::new();
    let l = limits(Duration::from_secs(3), Duration::from_secs(3), 16);
    assert_eq!(l.max_buf_size, READ_BUFFER);
    tokio::spawn(serve(
        listener,
        None,
        Arc::new(handler),
        l,
        mountguard_serve::ServeMetrics::unregistered(),
        shutdown,
    ));
    let put = |padding: usize| async move {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let pad = format!("x-pad: {}\r\n", "p".repeat(padding));
        exchange_with(&mut s, Some("tok-a"), &pad)
            .await
            .unwrap_or_default()
    };
    let served = put(4 * 1024).await;
    assert!(served.contains(" 200 "), "{served}");
    let refused = put(12 * 1024).await;
    assert!(refused.contains(" 431 "), "{refused}");
    // Only the first reached the handler.
    let handled: u64 = ["accepted", "unchanged", "resend"]
        .iter()
        .map(|r| counter_of(&intake, r))
        .sum();
    assert_eq!(handled, 1);
}

fn counter_of(metrics: &IntakeMetrics, result: &str) -> u64 {
    metrics.report_requests.with_label_values(&[result]).get()
}
