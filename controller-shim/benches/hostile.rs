//! Report API under abuse: 2,000 hostile connections (half idle, half
//! trickling a request head one byte a second, each reconnecting as soon
//! as the server closes it) are held open while 5,000 agents' heartbeats
//! are sent. Prints heartbeat latency, throughput, the controller's memory
//! with and without the hostile connections, and what the bounded server
//! loop closed.
//!
//! Then the slow-body attack, on a second listener of the same handler
//! whose connection cap (`--slow-cap`, default half of `--hostile`) the
//! attacker exceeds: `--hostile` connections from 127.0.0.2 with node 0's valid token,
//! each trickling a chunked heartbeat body one byte a second, reopened 50
//! ms after the server closes it. Meanwhile every other node sends
//! `--rounds` heartbeats, and more rounds until `--slow-secs` (default 12,
//! past the 10 s body deadline) have passed, each on a new connection from
//! the node's own address (127.1.x.y; the worst case of agents that all
//! reconnect, e.g. after a controller restart: an agent otherwise keeps
//! its connection across heartbeats). Prints the other nodes' heartbeats
//! answered and shed, their rate and latency.
//!
//! The controller side (the real report handler and TokenReview cache,
//! the shared bounded serve loop with its default limits) runs in this
//! process; the agents and the attacker are this binary re-executed as a
//! child, so memory and CPU are the controller's alone. The evaluation is
//! replaced by a sink (the reports benchmark measures it).
//!
//! Run: `cargo bench -p mountguard-controller --bench hostile`
//! (`-- --nodes N --hostile H --rounds R`).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use mountguard_controller::eval::Input;
use mountguard_controller::intake::auth::AgentPods;
use mountguard_controller::intake::limits::{self};
use mountguard_controller::intake::metrics::IntakeMetrics;
use mountguard_controller::intake::report::{self, ReportHandler};
use mountguard_controller::runtime::metrics::Metrics;
use mountguard_controller::runtime::shutdown::Shutdown;
use mountguard_controller::runtime::token_review::metrics::TokenReviewMetrics;
use mountguard_controller::runtime::token_review::{CachedReviewer, ReviewLimits};
use mountguard_controller::state::Shared;
use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::Heartbeat;
use tokio::io::AsyncWriteExt;

use common::{
    Reviewer, agent_pod, arg, client_runtime, heartbeat_rounds, load_generator, node_name,
    peak_rss_mib, put_inventories, report_config, status_mib,
};

mod common;

// ---------------------------------------------------------------- client

/// One hostile connection, reopened whenever the server closes it: idle
/// (sends nothing) or slow (a request head one byte a second).
async fn hostile(addr: SocketAddr, slow: bool, open: Arc<AtomicUsize>) {
    loop {
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        open.fetch_add(1, Ordering::Relaxed);
        if slow {
            let head = b"PUT /v1/nodes/node-00000/heartbeat HTTP/1.1\r\nhost: c\r\nx-slow: ";
            let _ = s.write_all(head).await;
            while s.write_all(b"a").await.is_ok() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        } else {
            let mut buf = [0u8; 64];
            let _ = tokio::io::AsyncReadExt::read(&mut s, &mut buf).await;
        }
        open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// One slow-body connection, reopened 50 ms after the server closes it:
/// node 0's valid token, a chunked body one byte a second.
async fn slow_body(
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    use tokio::io::AsyncReadExt;
    while !stop.load(Ordering::Relaxed) {
        // The attacker is one node: its own address (the agents' heartbeats
        // come from 127.0.0.1).
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let Ok(mut s) = sock.connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let head = format!(
            "PUT /v1/nodes/{}/heartbeat HTTP/1.1\r\nhost: c\r\nauthorization: Bearer token-0\r\ntransfer-encoding: chunked\r\n\r\n",
            node_name(0)
        );
        if s.write_all(head.as_bytes()).await.is_ok() {
            open.fetch_add(1, Ordering::Relaxed);
            let mut buf = [0u8; 512];
            loop {
                tokio::select! {
                    r = s.read(&mut buf) => if !matches!(r, Ok(n) if n > 0) { break },
                    () = tokio::time::sleep(Duration::from_secs(1)) => {
                        if s.write_all(b"1\r\n \r\n").await.is_err() || stop.load(Ordering::Relaxed) {
                            break;
                        }
                    }
                }
            }
            open.fetch_sub(1, Ordering::Relaxed);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A heartbeat on a new connection: its latency, or `None` when the
/// connection was closed without an answer (shed) or the answer was not
/// `unchanged`.
async fn fresh_heartbeat(addr: SocketAddr, n: usize) -> Option<Duration> {
    use http_body_util::BodyExt;
    let t = Instant::now();
    // Each node its own address, as in a cluster.
    let sock = tokio::net::TcpSocket::new_v4().ok()?;
    sock.bind(std::net::SocketAddr::from((
        [127, 1, (n / 256) as u8, (n % 256) as u8],
        0,
    )))
    .ok()?;
    let s = sock.connect(addr).await.ok()?;
    let (mut send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .ok()?;
    tokio::spawn(conn);
    let hb = Heartbeat::new(node_name(n), 1, Timestamp::now());
    let req = http::Request::put(format!("/v1/nodes/{}/heartbeat", node_name(n)))
        .header(http::header::HOST, "controller")
        .header(http::header::AUTHORIZATION, format!("Bearer token-{n}"))
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            serde_json::to_vec(&hb).unwrap(),
        )))
        .unwrap();
    let resp = send.send_request(req).await.ok()?;
    let ok = resp.status().is_success();
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    (ok && body.windows(9).any(|w| w == b"unchanged")).then(|| t.elapsed())
}

async fn slow_body_phase(addr: SocketAddr, nodes: usize, hostiles: usize, rounds: usize) {
    let min = Duration::from_secs(arg("--slow-secs", 12) as u64);
    let out = std::io::stdout();
    let open = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let attackers: Vec<_> = (0..hostiles)
        .map(|_| tokio::spawn(slow_body(addr, open.clone(), stop.clone())))
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    writeln!(out.lock(), "slow-open {}", open.load(Ordering::Relaxed)).unwrap();
    out.lock().flush().unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    const CONNS: usize = 64;
    let t = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..CONNS {
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut shed) = (Vec::new(), 0usize);
            let mut round = 0;
            while round < rounds || t.elapsed() < min {
                round += 1;
                let mut n = 1 + c;
                while n < nodes {
                    match fresh_heartbeat(addr, n).await {
                        Some(d) => lat.push(d),
                        None => shed += 1,
                    }
                    n += CONNS;
                }
            }
            (lat, shed)
        }));
    }
    let (mut lat, mut shed) = (Vec::new(), 0);
    for t in tasks {
        let (l, s) = t.await.unwrap();
        lat.extend(l);
        shed += s;
    }
    let secs = t.elapsed().as_secs_f64();
    let still = open.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        a.abort();
    }
    lat.sort();
    let q = |p: f64| {
        lat.get(((lat.len().max(1) - 1) as f64 * p) as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    writeln!(
        out.lock(),
        "slow-heartbeats {} {shed} {secs:.3} {:.2} {:.2} {:.2} {still}",
        lat.len(),
        q(0.5),
        q(0.99),
        q(1.0),
    )
    .unwrap();
    out.lock().flush().unwrap();
}

fn client(addr: SocketAddr, slow_addr: SocketAddr, nodes: usize, hostiles: usize, rounds: usize) {
    client_runtime().block_on(async move {
        const CONNS: usize = 64;
        let out = std::io::stdout();
        // Every node's inventory, so heartbeats are answered `unchanged`.
        put_inventories(addr, nodes, CONNS, |n| {
            let mut inv = NodeInventory::new(node_name(n), "bench", Timestamp::now());
            inv.generation = 1;
            inv
        })
        .await;
        writeln!(out.lock(), "inventories").unwrap();
        out.lock().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        // The attack.
        let open = Arc::new(AtomicUsize::new(0));
        let first: Vec<_> = (0..hostiles)
            .map(|i| tokio::spawn(hostile(addr, i % 2 == 1, open.clone())))
            .collect();
        let t = Instant::now();
        while open.load(Ordering::Relaxed) < hostiles && t.elapsed() < Duration::from_secs(30) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        writeln!(out.lock(), "hostile-open {}", open.load(Ordering::Relaxed)).unwrap();
        out.lock().flush().unwrap();
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        // The heartbeats, while the attack goes on.
        let t = Instant::now();
        let mut lat = heartbeat_rounds(addr, nodes, rounds, CONNS).await;
        let secs = t.elapsed().as_secs_f64();
        lat.sort();
        let q = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize].as_secs_f64() * 1000.0;
        writeln!(
            out.lock(),
            "heartbeats {} {secs:.3} {:.2} {:.2} {:.2} {}",
            lat.len(),
            q(0.5),
            q(0.99),
            q(1.0),
            open.load(Ordering::Relaxed)
        )
        .unwrap();
        out.lock().flush().unwrap();
        for h in first {
            h.abort();
        }
        slow_body_phase(slow_addr, nodes, hostiles, rounds).await;
    });
}

// ---------------------------------------------------------------- server

fn main() {
    let nodes = arg("--nodes", 5000);
    let hostiles = arg("--hostile", 2000);
    let rounds = arg("--rounds", 3);
    if let Ok(addr) = std::env::var("MOUNTGUARD_BENCH_CLIENT") {
        let slow: SocketAddr = std::env::var("MOUNTGUARD_BENCH_SLOW")
            .unwrap()
            .parse()
            .unwrap();
        client(addr.parse().unwrap(), slow, nodes, hostiles, rounds);
        return;
    }
    let _ = mountguard_serve::raise_nofile_limit();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let slow_cap = arg("--slow-cap", (hostiles / 2).max(1));
    rt.block_on(server(nodes, hostiles, rounds, slow_cap));
}

async fn server(nodes: usize, hostiles: usize, rounds: usize, slow_cap: usize) {
    let metrics = Metrics::new();
    let intake = IntakeMetrics::register(&metrics);
    let shared = Arc::new(Shared::new(metrics.clone()));
    shared.acting.store(true, Ordering::SeqCst);
    shared.ready.store(true, Ordering::SeqCst);
    let (_trigger, shutdown) = Shutdown::new();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Input>(4096);
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let agents = Arc::new(AgentPods::default());
    agents.set_daemonset_uid(Some("ds".into()));
    for n in 0..nodes {
        agents.apply(agent_pod(n, "ds"));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handler = Arc::new(ReportHandler::new(
        report_config(),
        shared.clone(),
        intake.clone(),
        // Every simulated agent connects from 127.0.0.1: no per-source limit.
        Arc::new(
            CachedReviewer::with_limits(
                Reviewer { nodes: usize::MAX },
                metrics.clone(),
                TokenReviewMetrics::register(&metrics),
                100_000,
                ReviewLimits {
                    per_source_burst: u32::MAX,
                    ..ReviewLimits::default()
                },
            )
            .for_agent("system:serviceaccount:mg:agent"),
        ),
        agents,
        None,
        tx,
    ));
    // The controller's defaults (`--max-connections`, timeouts).
    let small = mountguard_serve::Limits::small();
    let limits = limits::limits(small.header_read_timeout, small.idle_timeout, 10_000)
        .fit_in(mountguard_serve::nofile_limit(), 512);
    tokio::spawn(report::serve(
        listener,
        None,
        handler.clone(),
        limits,
        metrics.serve("report"),
        shutdown.clone(),
    ));
    // The slow-body attack's listener: the same handler and limits, a cap
    // the attacker exceeds.
    let slow_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_addr = slow_listener.local_addr().unwrap();
    let slow_limits = mountguard_serve::Limits {
        max_connections: slow_cap,
        ..limits
    };
    tokio::spawn(report::serve(
        slow_listener,
        None,
        handler,
        slow_limits,
        metrics.serve("slow"),
        shutdown.clone(),
    ));
    let (mut child, mut stdin, mut lrx) = load_generator(
        &[
            ("MOUNTGUARD_BENCH_CLIENT", addr.to_string()),
            ("MOUNTGUARD_BENCH_SLOW", slow_addr.to_string()),
        ],
        &[
            "--nodes".into(),
            nodes.to_string(),
            "--hostile".into(),
            hostiles.to_string(),
            "--rounds".into(),
            rounds.to_string(),
            "--slow-secs".into(),
            arg("--slow-secs", 12).to_string(),
        ],
        |line| line,
    );
    let (mut rss_calm, mut rss_attack, mut opened) = (0.0, 0.0, 0usize);
    let mut server_open = 0;
    let mut hb_line = String::new();
    let (mut slow_open, mut slow_line, mut slow_server_open) = (0usize, String::new(), 0i64);
    let results = |m: &IntakeMetrics| {
        ["body_timeout", "rate_limited"].map(|r| m.report_requests.with_label_values(&[r]).get())
    };
    let mut before_slow = [0; 2];
    while let Some(line) = lrx.recv().await {
        let mut parts = line.split_whitespace();
        match parts.next() {
            Some("inventories") => {
                rss_calm = status_mib("VmRSS");
                writeln!(stdin, "go").unwrap();
                stdin.flush().unwrap();
            }
            Some("hostile-open") => {
                opened = parts.next().unwrap().parse().unwrap();
                tokio::time::sleep(Duration::from_secs(2)).await;
                rss_attack = status_mib("VmRSS");
                server_open = metrics
                    .connections_open
                    .with_label_values(&["report"])
                    .get();
                writeln!(stdin, "go").unwrap();
                stdin.flush().unwrap();
            }
            Some("heartbeats") => hb_line = line.clone(),
            Some("slow-open") => {
                slow_open = parts.next().unwrap().parse().unwrap();
                slow_server_open = metrics.connections_open.with_label_values(&["slow"]).get();
                before_slow = results(&intake);
                writeln!(stdin, "go").unwrap();
                stdin.flush().unwrap();
            }
            Some("slow-heartbeats") => slow_line = line.clone(),
            _ => {}
        }
    }
    assert!(child.wait().unwrap().success(), "load generator failed");
    let f: Vec<&str> = hb_line.split_whitespace().collect();
    let (count, secs, p50, p99, max, still_open) = (f[1], f[2], f[3], f[4], f[5], f[6]);
    let hb: f64 = count.parse().unwrap();
    let secs_f: f64 = secs.parse().unwrap();
    println!(
        "report API under abuse: {nodes} agents, {hostiles} hostile connections (half idle, half slow-header), {rounds} heartbeat rounds, 2 worker threads"
    );
    println!(
        "  limits: header-read timeout {:?}, idle timeout {:?}, cap {} connections, read buffer {} KiB",
        limits.header_read_timeout,
        limits.idle_timeout,
        limits.max_connections,
        limits.max_buf_size / 1024
    );
    println!(
        "  hostile connections open: {opened} (client side), {server_open} open at the server; {still_open} still open at the end"
    );
    println!(
        "  heartbeats during the attack: {count} answered in {secs} s ({:.0}/s; target 167/s = 5,000 per 30 s)",
        hb / secs_f
    );
    println!(
        "  heartbeat latency: p50 {p50} ms, p99 {p99} ms, max {max} ms (target p99 < 1,000 ms)"
    );
    println!(
        "  controller RSS: {rss_calm:.0} MiB before the attack, {rss_attack:.0} MiB with it ({:.1} KiB per hostile connection), peak {:.0} MiB (target < 1 GiB)",
        (rss_attack - rss_calm).max(0.0) * 1024.0 / opened.max(1) as f64,
        peak_rss_mib()
    );
    println!(
        "  closed by the server: {} timed out, {} shed at the cap",
        metrics
            .connections_timed_out
            .with_label_values(&["report"])
            .get(),
        metrics
            .connections_shed
            .with_label_values(&["report"])
            .get()
    );
    let f: Vec<&str> = slow_line.split_whitespace().collect();
    let (answered, shed, secs, p50, p99, max, still) = (f[1], f[2], f[3], f[4], f[5], f[6], f[7]);
    let secs_f: f64 = secs.parse().unwrap();
    let after = results(&intake);
    println!(
        "slow-body attack: {hostiles} connections with node 0's valid token trickling a chunked body at 1 byte/s (reopened 50 ms after a close), connection cap {slow_cap}"
    );
    println!(
        "  attacker connections open: {slow_open} (client side), {slow_server_open} at the server; {still} still open at the end"
    );
    println!(
        "  other nodes' heartbeats (each on a new connection): {answered} answered, {shed} shed, in {secs} s ({:.0}/s answered); latency p50 {p50} ms, p99 {p99} ms, max {max} ms",
        answered.parse::<f64>().unwrap() / secs_f
    );
    println!(
        "  during the attack: {} body_timeout, {} rate_limited answers; {} connections shed on this listener",
        after[0] - before_slow[0],
        after[1] - before_slow[1],
        metrics.connections_shed.with_label_values(&["slow"]).get()
    );
}
