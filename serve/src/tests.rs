//! Tests of the bounded accept loop: limits, timeouts, shedding, drain.

use super::*;
use http_body_util::Full;
use hyper::body::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::test_flood::closed_within;

async fn start(limits: Limits) -> (SocketAddr, ServeMetrics, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = ServeMetrics::unregistered();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let m = metrics.clone();
    tokio::spawn(serve(
        "test",
        listener,
        limits,
        Plain,
        m,
        |_| {
            hyper::service::service_fn(|_req| async {
                Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(b"ok"))))
            })
        },
        async {
            let _ = rx.await;
        },
    ));
    (addr, metrics, tx)
}

async fn get(addr: SocketAddr) -> io::Result<String> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// The small limits with these timeouts and cap.
fn limits_with(header_read: Duration, idle: Duration, max_connections: usize) -> Limits {
    Limits {
        header_read_timeout: header_read,
        idle_timeout: idle,
        max_connections,
        ..Limits::small()
    }
}

fn quick() -> Limits {
    limits_with(Duration::from_millis(300), Duration::from_millis(600), 4)
}

#[tokio::test]
async fn idle_and_slow_header_connections_are_closed() {
    let (addr, m, _stop) = start(quick()).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
    assert!(closed_within(&mut idle, Duration::from_secs(3)).await);
    assert!(closed_within(&mut slow, Duration::from_secs(3)).await);
    assert!(get(addr).await.unwrap().contains("200 OK"));
    assert!(m.timed_out.get() >= 2);
}

/// At the cap, a newcomer takes the place of the oldest connection
/// that never sent a head; with only proven connections it is closed
/// at once.
#[tokio::test]
async fn at_the_cap_a_newcomer_takes_the_place_of_the_oldest_idle_connection() {
    let (addr, m, _stop) = start_ranked(Limits {
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        ..quick()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(addr).await.unwrap());
        wait_open(&m, held.len() as i64).await;
    }
    assert!(get(addr).await.unwrap().contains("200 OK"));
    assert!(closed_within(&mut held[0], Duration::from_secs(2)).await);
    assert_eq!(m.shed.get(), 1);
    // Four connections whose requests are being served: a newcomer
    // is closed at once.
    drop(held);
    wait_open(&m, 0).await;
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-slow-ms: 3000\r\n\r\n")
            .await
            .unwrap();
        busy.push(s);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    wait_open(&m, 4).await;
    let mut extra = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut extra, Duration::from_secs(2)).await);
    for s in &mut busy {
        assert!(!closed_within(s, Duration::from_millis(10)).await);
    }
}

/// One address's idle sockets (more than the cap, each reopened as
/// soon as it is closed) hold at most that address's share: probes
/// from another address, and from the flooding address itself (a
/// fresh connection each, as a kubelet's), are all answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_socket_flood_does_not_starve_probes() {
    let limits = Limits::small();
    let (addr, m, _stop) = start(limits).await;
    let flooder: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let flood = test_flood::Flood::start(
        addr,
        flooder,
        limits.max_connections + 4,
        500,
        Duration::from_secs(30),
    );
    flood.wait_reopened(4, Duration::from_secs(10)).await;
    let mut answered = 0;
    for i in 0..30 {
        let from = if i % 3 == 0 {
            flooder
        } else {
            "127.0.0.1".parse().unwrap()
        };
        if test_flood::probe(addr, from, "/healthz").await {
            answered += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(m.shed.get() > 0);
    drop(flood);
    assert_eq!(answered, 30, "probes answered under the flood");
}

/// A server whose service vouches for `x-id: <who>` (answering 429
/// when `who` is over its limit) and demotes on `x-bad`; with
/// `x-read-body` it reads the body and answers `got N` (its length),
/// with `x-slow-ms: N` it answers after N ms.
async fn start_ranked(
    limits: Limits,
) -> (SocketAddr, ServeMetrics, tokio::sync::oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let metrics = ServeMetrics::unregistered();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(serve(
        "test",
        listener,
        limits,
        Plain,
        metrics.clone(),
        |_| {
            hyper::service::service_fn(|req: http::Request<RequestBody>| async move {
                let standing = req.extensions().get::<Standing>().unwrap().clone();
                let mut status = http::StatusCode::OK;
                if let Some(who) = req.headers().get("x-id") {
                    if !standing.vouch(who.to_str().unwrap()) {
                        status = http::StatusCode::TOO_MANY_REQUESTS;
                    }
                } else if req.headers().contains_key("x-bad") {
                    standing.demote();
                    status = http::StatusCode::UNAUTHORIZED;
                }
                if let Some(ms) = req.headers().get("x-slow-ms") {
                    let ms = ms.to_str().unwrap().parse().unwrap();
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                let text = if req.headers().contains_key("x-read-body") {
                    use http_body_util::BodyExt;
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    Bytes::from(format!("got {}", body.len()))
                } else {
                    Bytes::from_static(b"ok")
                };
                let mut resp = http::Response::new(Full::new(text));
                *resp.status_mut() = status;
                Ok::<_, Infallible>(resp)
            })
        },
        async {
            let _ = rx.await;
        },
    ));
    (addr, metrics, tx)
}

/// One keep-alive request on `s`; returns the status line.
async fn ask(s: &mut TcpStream, header: &str) -> String {
    s.write_all(format!("GET / HTTP/1.1\r\nhost: x\r\n{header}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 1024];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

/// Waits (at most 2 s) until `gauge` reads `n`.
async fn wait_gauge(gauge: &prometheus::IntGauge, n: i64, what: &str) {
    for _ in 0..200 {
        if gauge.get() == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("{} {what}, expected {n}", gauge.get());
}

async fn wait_open(m: &ServeMetrics, n: i64) {
    wait_gauge(&m.open, n, "open").await;
}

/// A connection a request was vouched for waits for its next request
/// past the header-read timeout, up to the idle timeout (an agent's
/// heartbeat gap); a connection whose request was not vouched for, or
/// was refused, is closed by the header-read timeout between requests,
/// and a vouched one that trickles its next head is closed by it too.
#[tokio::test]
async fn a_vouched_connection_waits_between_requests_under_the_idle_timeout() {
    let header_read = Duration::from_millis(300);
    let (addr, m, _stop) = start_ranked(Limits {
        header_read_timeout: header_read,
        idle_timeout: Duration::from_millis(1500),
        max_connections: 16,
        ..Limits::small()
    })
    .await;
    let gap = header_read * 3;
    let mut vouched = TcpStream::connect(addr).await.unwrap();
    let mut plain = TcpStream::connect(addr).await.unwrap();
    let mut refused = TcpStream::connect(addr).await.unwrap();
    let mut trickling = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut vouched, "x-id: a").await.contains("200"));
    assert!(ask(&mut plain, "x-plain: 1").await.contains("200"));
    assert!(ask(&mut refused, "x-bad: 1").await.contains("401"));
    assert!(ask(&mut trickling, "x-id: b").await.contains("200"));
    trickling.write_all(b"GET / HTTP/1.1\r\nho").await.unwrap();
    tokio::time::sleep(gap).await;
    assert!(closed_within(&mut plain, Duration::from_millis(50)).await);
    assert!(closed_within(&mut refused, Duration::from_millis(50)).await);
    assert!(closed_within(&mut trickling, Duration::from_millis(50)).await);
    // Open after three header-read timeouts: the next request is
    // answered on the same connection, and again after another gap.
    assert!(ask(&mut vouched, "x-id: a").await.contains("200"));
    tokio::time::sleep(gap).await;
    assert!(ask(&mut vouched, "x-id: a").await.contains("200"));
    assert_eq!(m.timed_out.get(), 3);
    // The idle timeout still ends it.
    assert!(closed_within(&mut vouched, Duration::from_secs(3)).await);
    assert_eq!(m.timed_out.get(), 4);
}

/// The cap full of connections that trickle, idle or were refused: a
/// newcomer (another node's heartbeat) gets in and one of those is
/// shed, the refused one first; connections that were vouched for are
/// never shed for it; one identity holds at most its limit.
#[tokio::test]
async fn slow_body_connections_are_shed_before_proven_ones() {
    let (addr, m, _stop) = start_ranked(Limits {
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: 4,
        per_identity: 2,
        ..Limits::small()
    })
    .await;
    // Two connections of one identity, vouched for; a third is over
    // the limit (and demoted).
    let mut a1 = TcpStream::connect(addr).await.unwrap();
    let mut a2 = TcpStream::connect(addr).await.unwrap();
    let mut a3 = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut a1, "x-id: a").await.contains("200"));
    assert!(ask(&mut a2, "x-id: a").await.contains("200"));
    assert!(ask(&mut a3, "x-id: a").await.contains("429"));
    // An unproven connection sending a slow head.
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"PUT / HTTP/1.1\r\nhost").await.unwrap();
    wait_open(&m, 4).await;
    // A newcomer: the demoted one goes first.
    let mut b = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut b, "x-id: b").await.contains("200"));
    assert!(closed_within(&mut a3, Duration::from_secs(2)).await);
    // The next one: the unproven slow connection goes.
    let mut c = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut c, "x-id: c").await.contains("200"));
    assert!(closed_within(&mut slow, Duration::from_secs(2)).await);
    assert_eq!(m.shed.get(), 2);
    // Only vouched connections are left: a newcomer is closed at once.
    let mut d = TcpStream::connect(addr).await.unwrap();
    assert!(closed_within(&mut d, Duration::from_secs(2)).await);
    assert_eq!(m.shed.get(), 3);
    for s in [&mut a1, &mut a2, &mut b, &mut c] {
        assert!(
            ask(s, "x-ping: 1").await.contains("200"),
            "a vouched connection was shed"
        );
    }
}

async fn connect_from(ip: &str, addr: SocketAddr) -> TcpStream {
    let s = tokio::net::TcpSocket::new_v4().unwrap();
    s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    s.connect(addr).await.unwrap()
}

/// At the cap, a newcomer from an address that has unproven
/// connections sheds its own oldest one, not another address's: an
/// attacker flooding connections from one address cannot push out a
/// node's connection that is still sending its request.
#[tokio::test]
async fn slow_body_flood_from_one_address_sheds_its_own_connections() {
    let (addr, m, _stop) = start_ranked(Limits {
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: 4,
        per_identity: 2,
        ..Limits::small()
    })
    .await;
    let mut agent = connect_from("127.0.0.1", addr).await;
    agent.write_all(b"GET / HTTP/1.1\r\nhost").await.unwrap();
    wait_open(&m, 1).await;
    let mut flood = Vec::new();
    for _ in 0..3 {
        flood.push(connect_from("127.0.0.2", addr).await);
        wait_open(&m, flood.len() as i64 + 1).await;
    }
    // Three more from the flooding address: each sheds its own oldest.
    for i in 0..3 {
        flood.push(connect_from("127.0.0.2", addr).await);
        assert!(
            closed_within(&mut flood[i], Duration::from_secs(2)).await,
            "{i}"
        );
    }
    assert_eq!(m.shed.get(), 3);
    agent.write_all(b": x\r\nx-id: a\r\n\r\n").await.unwrap();
    let mut buf = vec![0u8; 256];
    let n = agent.read(&mut buf).await.unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).contains("200"),
        "the node's connection was shed"
    );
}

#[tokio::test]
async fn an_oversized_request_head_is_refused() {
    let (addr, _m, _stop) = start(quick()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = format!(
        "GET / HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let _ = s.write_all(big.as_bytes()).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out);
    assert!(!text.contains("200 OK"), "{text}");
}

async fn wait_parked(m: &ServeMetrics, n: i64) {
    wait_gauge(&m.parked, n, "parked").await;
}

/// Reads one answer (head and a `content-length` body) from `s`;
/// `got` keeps bytes read past it (the next answer's).
async fn answer_after(s: &mut TcpStream, got: &mut Vec<u8>) -> String {
    let mut buf = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(got).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let len: usize = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .map_or(0, |v| v.trim().parse().unwrap());
            if got.len() >= end + 4 + len {
                got.drain(..end + 4 + len);
                return text[..end + 4 + len].to_string();
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .expect("an answer in time")
            .unwrap();
        assert!(n > 0, "closed before the answer: {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// Reads one answer from `s`, which must not send more.
async fn answer(s: &mut TcpStream) -> String {
    let mut got = Vec::new();
    let text = answer_after(s, &mut got).await;
    assert!(got.is_empty(), "more than one answer");
    text
}

fn roomy() -> Limits {
    limits_with(Duration::from_secs(30), Duration::from_secs(30), 16)
}

/// A connection a request was vouched for lets its HTTP state go
/// between requests (parked) and answers the next request on the same
/// stream, again and again; one not vouched for, and one whose body
/// the service left unread, stay with hyper.
#[tokio::test]
async fn a_vouched_connection_is_parked_between_requests_and_answers_the_next() {
    let (addr, m, _stop) = start_ranked(roomy()).await;
    let mut vouched = TcpStream::connect(addr).await.unwrap();
    for round in 0..3 {
        assert!(
            ask(&mut vouched, "x-id: a").await.contains("200"),
            "{round}"
        );
        wait_parked(&m, 1).await;
    }
    // A body read to its end: parked too.
    vouched
        .write_all(b"PUT / HTTP/1.1\r\nhost: x\r\nx-id: a\r\nx-read-body: 1\r\ncontent-length: 5\r\n\r\nhello")
        .await
        .unwrap();
    assert!(answer(&mut vouched).await.ends_with("got 5"));
    wait_parked(&m, 1).await;
    let mut plain = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut plain, "x-plain: 1").await.contains("200"));
    let mut unread = TcpStream::connect(addr).await.unwrap();
    unread
        .write_all(b"PUT / HTTP/1.1\r\nhost: x\r\nx-id: b\r\ncontent-length: 5\r\n\r\nhello")
        .await
        .unwrap();
    assert!(answer(&mut unread).await.contains("200"));
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(m.parked.get(), 1, "only the vouched connection is parked");
    // Both still answer on their streams.
    assert!(ask(&mut plain, "x-plain: 1").await.contains("200"));
    assert!(ask(&mut unread, "x-id: b").await.contains("200"));
    wait_parked(&m, 2).await;
    assert!(ask(&mut vouched, "x-id: a").await.contains("200"));
    wait_parked(&m, 2).await;
    assert_eq!(m.open.get(), 3);
    drop(vouched);
    wait_parked(&m, 1).await;
    wait_open(&m, 2).await;
}

/// Requests sent back to back on a vouched connection (a whole second
/// request, or the start of its head, in the first one's segment) are
/// all answered, in order, on the same stream.
#[tokio::test]
async fn pipelined_requests_on_a_parked_connection_are_all_answered() {
    let (addr, m, _stop) = start_ranked(roomy()).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = |id: &str, body: &str| {
        format!(
            "PUT / HTTP/1.1\r\nhost: x\r\nx-id: {id}\r\nx-read-body: 1\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let two = req("a", "1") + &req("a", "22");
    s.write_all(two.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    assert!(answer_after(&mut s, &mut got).await.ends_with("got 1"));
    assert!(answer_after(&mut s, &mut got).await.ends_with("got 2"));
    assert!(got.is_empty());
    wait_parked(&m, 1).await;
    // One whole request and the start of the next head, the rest later.
    let next = req("a", "333");
    let (start, rest) = next.split_at(20);
    s.write_all((req("a", "4444") + start).as_bytes())
        .await
        .unwrap();
    assert!(answer(&mut s).await.ends_with("got 4"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(rest.as_bytes()).await.unwrap();
    assert!(answer(&mut s).await.ends_with("got 3"));
    wait_parked(&m, 1).await;
    assert_eq!(m.open.get(), 1);
}

/// A vouched connection that sent the start of its next head with
/// its request (before the answer) and then stalls is closed by the
/// header-read timeout, not left to the idle timeout.
#[tokio::test]
async fn a_head_begun_before_the_answer_is_bound_by_the_header_read_timeout() {
    let header_read = Duration::from_millis(300);
    let (addr, m, _stop) = start_ranked(limits_with(header_read, Duration::from_secs(5), 16)).await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-id: a\r\n\r\nGET / HTTP/1.1\r\nho")
        .await
        .unwrap();
    assert!(answer(&mut s).await.contains("200"));
    assert!(
        closed_within(&mut s, header_read * 4).await,
        "still open after four header-read timeouts"
    );
    assert_eq!(m.timed_out.get(), 1);
}

/// At shutdown a parked connection is closed at once and a request
/// being served is answered first (within the drain).
#[tokio::test]
async fn shutdown_closes_parked_connections_and_answers_requests_in_flight() {
    let (addr, m, stop) = start_ranked(roomy()).await;
    let mut parked = TcpStream::connect(addr).await.unwrap();
    assert!(ask(&mut parked, "x-id: a").await.contains("200"));
    wait_parked(&m, 1).await;
    let mut busy = TcpStream::connect(addr).await.unwrap();
    busy.write_all(b"GET / HTTP/1.1\r\nhost: x\r\nx-id: b\r\nx-slow-ms: 400\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.send(()).unwrap();
    assert!(closed_within(&mut parked, Duration::from_millis(300)).await);
    let text = answer(&mut busy).await;
    assert!(text.contains("200"), "{text}");
    assert!(closed_within(&mut busy, Duration::from_secs(2)).await);
    wait_open(&m, 0).await;
}

#[test]
fn the_cap_fits_in_the_descriptors() {
    assert_eq!(Limits::small().fit_in(1024, 128).max_connections, 256);
    assert_eq!(Limits::small().fit_in(200, 128).max_connections, 72);
    assert_eq!(Limits::small().fit_in(10, 128).max_connections, 1);
    assert_eq!(Limits::small().fit_in(1024, 128).per_source, 128);
    assert_eq!(Limits::small().fit_in(200, 128).per_source, 36);
    assert_eq!(Limits::small().fit_in(10, 128).per_source, 1);
    let unlimited = Limits {
        per_source: 0,
        ..Limits::small()
    };
    assert_eq!(unlimited.fit_in(200, 128).per_source, 0);
    assert!(raise_nofile_limit().unwrap() >= nofile_limit().min(1024));
}
