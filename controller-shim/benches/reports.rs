//! Report API benchmark: the real report handler (HTTP/1.1 over loopback,
//! plaintext), the evaluation task and the metrics, with a cached fake
//! TokenReview, for 5,000 simulated nodes x 110 pods x 3 volumes (the
//! cluster of `cluster/mod.rs`).
//!
//! The controller side runs in this process on a 2-worker tokio runtime;
//! the load generator is this binary re-executed as a child process, so the
//! CPU time measured with getrusage is the controller's alone.
//!
//! Phases: pods and sources enter through the evaluation channel (as the
//! watches would send them); every node sends its inventory; then
//! `--rounds` rounds of one heartbeat per node, as fast as the controller
//! takes them; then one Secret referenced by one pod in 1,000 (550 at the
//! default size) changes and the time
//! until `mountguard_mounts{state="Propagating"}` moves is measured.
//!
//! Between the heartbeat rounds and the Secret change, the steady state:
//! every node on a connection of its own, as an agent holds one, sends a
//! heartbeat once per interval (spread over it) for `--steady-rounds`
//! rounds, reconnecting whenever the server closed its connection. The
//! time is compressed: a heartbeat every `--hb-interval-ms` (default 3,000)
//! with the server's header-read and idle timeouts scaled as the defaults
//! are to the agents' 30 s heartbeat (10 s and 60 s: a third and twice the
//! interval). The connections opened after each node's first heartbeat,
//! per second, scaled back to the 30 s heartbeat, are the steady-state TLS
//! handshakes of a real cluster (plaintext here; each new connection is one
//! handshake in production). After its last round every node keeps its
//! connection open while the controller counts the open and parked
//! connections and its RSS.
//!
//! Run: `cargo bench -p mountguard-controller --bench reports`
//! (`-- --nodes N --pods P --rounds R` for other sizes; `--pods 30` is the
//! Kubernetes envelope of 150,000 pods on 5,000 nodes).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use jiff::Timestamp;
use mountguard_controller::api::store::ReadModel;
use mountguard_controller::eval::metrics::EvalMetrics;
use mountguard_controller::eval::{self, EvalTask, EvaluationSnapshot, Input};
use mountguard_controller::intake::auth::AgentPods;
use mountguard_controller::intake::limits::{self};
use mountguard_controller::intake::metrics::IntakeMetrics;
use mountguard_controller::intake::report::{self, ReportHandler};
use mountguard_controller::runtime::metrics::Metrics;
use mountguard_controller::runtime::shutdown::Shutdown;
use mountguard_controller::runtime::token_review::CachedReviewer;
use mountguard_controller::runtime::token_review::metrics::TokenReviewMetrics;
use mountguard_controller::state::Shared;
use mountguard_core::model::{Interner, SourceKind};
use mountguard_core::{Config, Engine, Fingerprinter};
use mountguard_inventory::report::Heartbeat;
use nix::sys::resource::{UsageWho, getrusage};

use cluster::Cluster;
use common::{
    Reviewer, agent_pod, arg, client_runtime, connect, heartbeat_rounds, load_generator, node_name,
    peak_rss_mib, put_inventories, report_config, status_mib,
};

mod cluster;
mod common;

/// Waits (at most `within`) until `mounts` mounts are Fresh: every
/// inventory sent was evaluated.
async fn wait_all_fresh(metrics: &EvalMetrics, mounts: i64, within: Duration) {
    let fresh = || metrics.mounts.with_label_values(&["Fresh"]).get();
    let deadline = Instant::now() + within;
    while fresh() < mounts {
        assert!(
            Instant::now() < deadline,
            "inventories not evaluated: {}",
            fresh()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// This process's resident and peak resident memory now, in MiB.
fn memory_mib() -> (f64, f64) {
    (status_mib("VmRSS"), status_mib("VmHWM"))
}

fn cpu_seconds() -> f64 {
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

/// `--nodes N --pods P` (default 5,000 x 110).
fn cluster_arg() -> Cluster {
    Cluster {
        nodes: arg("--nodes", 5000),
        pods_per_node: arg("--pods", 110),
    }
}

/// The agents' heartbeat interval the steady state is scaled to.
const AGENT_HEARTBEAT: Duration = Duration::from_secs(30);

/// The compressed heartbeat interval of the steady state.
fn hb_interval() -> Duration {
    Duration::from_millis(arg("--hb-interval-ms", 3000) as u64)
}

// ---------------------------------------------------------------- client

/// A heartbeat of node `n` on `s`; `Err` when the connection is gone.
async fn try_heartbeat(
    s: &mut hyper::client::conn::http1::SendRequest<http_body_util::Full<hyper::body::Bytes>>,
    n: usize,
) -> Result<(), hyper::Error> {
    use http_body_util::BodyExt;
    s.ready().await?;
    let hb = Heartbeat::new(node_name(n), 1, Timestamp::now());
    let req = http::Request::put(format!("/v1/nodes/{}/heartbeat", node_name(n)))
        .header(http::header::HOST, "controller")
        .header(http::header::AUTHORIZATION, format!("Bearer token-{n}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            serde_json::to_vec(&hb).unwrap(),
        )))
        .unwrap();
    let resp = s.send_request(req).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    assert!(
        status.is_success(),
        "{status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(())
}

/// A client connection as `connect` opens it.
type Conn = hyper::client::conn::http1::SendRequest<http_body_util::Full<hyper::body::Bytes>>;

/// The steady state (see the module docs): returns the connections opened
/// after each node's first heartbeat, the seconds they were counted over,
/// and every node's connection, still open.
async fn steady_state(addr: SocketAddr, nodes: usize, rounds: usize) -> (usize, f64, Vec<Conn>) {
    let interval = hb_interval();
    let reconnects = Arc::new(AtomicUsize::new(0));
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::new();
    for n in 0..nodes {
        let reconnects = reconnects.clone();
        tasks.push(tokio::spawn(async move {
            let first = start + interval.mul_f64(n as f64 / nodes as f64);
            tokio::time::sleep_until(first).await;
            let mut s = connect(addr).await;
            for round in 0..rounds {
                tokio::time::sleep_until(first + interval * round as u32).await;
                // A connection the server closed is noticed before the
                // request or by the request; either way the agent opens a
                // new one (a TLS handshake in production).
                loop {
                    if !s.is_closed() && try_heartbeat(&mut s, n).await.is_ok() {
                        break;
                    }
                    s = connect(addr).await;
                    if round > 0 {
                        reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            s
        }));
    }
    let mut held = Vec::with_capacity(nodes);
    for t in tasks {
        held.push(t.await.unwrap());
    }
    // Counted from each node's first heartbeat to its last.
    let window = interval.as_secs_f64() * rounds.saturating_sub(1) as f64;
    (reconnects.load(Ordering::Relaxed), window, held)
}

fn client(addr: SocketAddr, cluster: Cluster, rounds: usize) {
    let nodes = cluster.nodes;
    client_runtime().block_on(async move {
        const CONNS: usize = 16;
        let out = std::io::stdout();
        let t = Instant::now();
        put_inventories(addr, nodes, CONNS, move |n| {
            cluster.inventory(n, 1, Timestamp::now())
        })
        .await;
        writeln!(out.lock(), "inventories {:.3}", t.elapsed().as_secs_f64()).unwrap();
        out.lock().flush().unwrap();
        // Wait until the controller evaluated them (it writes a line).
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        writeln!(out.lock(), "heartbeats-start").unwrap();
        out.lock().flush().unwrap();
        let t = Instant::now();
        heartbeat_rounds(addr, nodes, rounds, CONNS).await;
        let secs = t.elapsed().as_secs_f64();
        writeln!(out.lock(), "heartbeats-done {secs:.3}").unwrap();
        writeln!(out.lock(), "steady-start").unwrap();
        out.lock().flush().unwrap();
        let (reconnects, window, held) = steady_state(addr, nodes, arg("--steady-rounds", 4)).await;
        writeln!(out.lock(), "steady-done {reconnects} {window:.3}").unwrap();
        out.lock().flush().unwrap();
        // Every agent's connection stays open (waiting for its next
        // heartbeat) until the controller has measured itself.
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        drop(held);
    });
}

// ---------------------------------------------------------------- server

/// The controller binary's allocator (src/main.rs), so the figures are the
/// shipped program's; run with the chart's `MIMALLOC_*` settings (see
/// docs/performance.md).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    if let Ok(addr) = std::env::var("MOUNTGUARD_BENCH_CLIENT") {
        client(addr.parse().unwrap(), cluster_arg(), arg("--rounds", 3));
        return;
    }
    let cluster = cluster_arg();
    let rounds = arg("--rounds", 3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(server(cluster, rounds));
}

async fn server(cluster: Cluster, rounds: usize) {
    let nodes = cluster.nodes;
    let metrics = Metrics::new();
    let evaluation = EvalMetrics::register(&metrics);
    let shared = Arc::new(Shared::new(metrics.clone()));
    let store = ReadModel::default();
    shared.acting.store(true, Ordering::SeqCst);
    let (_trigger, shutdown) = Shutdown::new();
    let (tx, rx) = tokio::sync::mpsc::channel::<Input>(4096);
    let (etx, mut erx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while erx.recv().await.is_some() {} });
    let (stx, _) = tokio::sync::watch::channel(Arc::new(EvaluationSnapshot::default()));
    let engine = Engine::new(Config::default(), Fingerprinter::new(&[9u8; 32]).unwrap());
    tokio::spawn(eval::run(
        EvalTask::new(
            engine,
            shared.clone(),
            evaluation.clone(),
            store.clone(),
            etx,
            stx,
        ),
        rx,
        shutdown.clone(),
    ));

    // Pods and sources, as the watches deliver them.
    let t = Instant::now();
    // The watches' interner lives as long as the watches do.
    let mut ix = Interner::default();
    for (r, c) in cluster::sources(&mut ix) {
        tx.send(Input::Source(r, c)).await.unwrap();
    }
    let agents = Arc::new(AgentPods::default());
    agents.set_daemonset_uid(Some("agent-ds-uid".into()));
    for n in 0..nodes {
        agents.apply(agent_pod(n, "agent-ds-uid"));
        for pod in cluster.node_pods(&mut ix, n) {
            tx.send(Input::Pod(Box::new(pod))).await.unwrap();
        }
    }
    // Readiness gates evaluation: flip it once the "lists" are in.
    shared.ready.store(true, Ordering::SeqCst);
    let pods = cluster.pods();
    let deadline = Instant::now() + Duration::from_secs(600);
    while store.read().unwrap().pods.len() < pods {
        assert!(
            Instant::now() < deadline,
            "initial evaluation did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let load_secs = t.elapsed().as_secs_f64();
    let load_mem = memory_mib();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handler = Arc::new(ReportHandler::new(
        report_config(),
        shared.clone(),
        IntakeMetrics::register(&metrics),
        // Every simulated agent connects from 127.0.0.1: no per-source limit.
        Arc::new(CachedReviewer::with_limits(
            Reviewer { nodes },
            metrics.clone(),
            TokenReviewMetrics::register(&metrics),
            100_000,
            mountguard_controller::runtime::token_review::ReviewLimits {
                per_source_burst: u32::MAX,
                ..Default::default()
            },
        )),
        agents,
        None,
        tx.clone(),
    ));
    tokio::spawn(report::serve(
        listener,
        None,
        handler,
        // The defaults' proportions to the 30 s heartbeat (10 s, 60 s),
        // at the compressed interval.
        // The controller's report limits, with the timeouts compressed.
        limits::limits(hb_interval() / 3, hb_interval() * 2, 20_000),
        metrics.serve("report"),
        shutdown.clone(),
    ));

    let (mut child, mut child_stdin, mut lrx) = load_generator(
        &[("MOUNTGUARD_BENCH_CLIENT", addr.to_string())],
        &[
            "--nodes".into(),
            nodes.to_string(),
            "--pods".into(),
            cluster.pods_per_node.to_string(),
            "--rounds".into(),
            rounds.to_string(),
            "--hb-interval-ms".into(),
            hb_interval().as_millis().to_string(),
            "--steady-rounds".into(),
            arg("--steady-rounds", 4).to_string(),
        ],
        |line| (line, cpu_seconds()),
    );
    let mut inv_secs = 0.0;
    let inv_cpu_start = cpu_seconds();
    let mut inv_cpu = 0.0;
    let mut inv_eval_secs = 0.0;
    let mut inv_mem = (0.0, 0.0);
    let mut hb_cpu_start = 0.0;
    let mut hb = (0.0, 0.0);
    let mut steady_cpu_start = 0.0;
    let mut steady = (0usize, 0.0f64, 0.0f64);
    // Connections open and parked, and RSS, once the steady state is done.
    let mut held = (0i64, 0i64, 0.0f64);
    while let Some((line, cpu)) = lrx.recv().await {
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some("inventories"), Some(s)) => {
                inv_secs = s.parse().unwrap();
                // Every inventory evaluated (all Fresh) before heartbeats.
                let t = Instant::now();
                wait_all_fresh(&evaluation, (pods * 3) as i64, Duration::from_secs(300)).await;
                inv_eval_secs = inv_secs + t.elapsed().as_secs_f64();
                inv_cpu = cpu_seconds() - inv_cpu_start;
                inv_mem = memory_mib();
                writeln!(child_stdin, "go").unwrap();
                child_stdin.flush().unwrap();
            }
            (Some("heartbeats-start"), _) => hb_cpu_start = cpu,
            (Some("heartbeats-done"), Some(s)) => hb = (s.parse().unwrap(), cpu - hb_cpu_start),
            (Some("steady-start"), _) => steady_cpu_start = cpu,
            (Some("steady-done"), Some(r)) => {
                let window: f64 = parts.next().unwrap().parse().unwrap();
                steady = (r.parse().unwrap(), window, cpu - steady_cpu_start);
                let m = metrics.serve("report");
                held = (m.open.get(), m.parked.get(), memory_mib().0);
                writeln!(child_stdin, "measured").unwrap();
                child_stdin.flush().unwrap();
            }
            _ => {}
        }
    }
    assert!(child.wait().unwrap().success(), "load generator failed");
    // Wait for the inventories to be evaluated (all Fresh).
    wait_all_fresh(&evaluation, (pods * 3) as i64, Duration::from_secs(120)).await;

    // A Secret referenced by one pod in 1,000 changes.
    let propagating = || evaluation.mounts.with_label_values(&["Propagating"]).get();
    let before = propagating();
    let t = Instant::now();
    let (r, c) = cluster::source(&mut ix, SourceKind::Secret, "secret-7", 2);
    tx.send(Input::Source(r, c)).await.unwrap();
    while propagating() == before {
        assert!(t.elapsed() < Duration::from_secs(60), "metric never moved");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let change_ms = t.elapsed().as_secs_f64() * 1000.0;
    let heartbeats = (nodes * rounds) as f64;
    let evals = evaluation.evaluation_duration.get_sample_count();

    println!(
        "controller report benchmark: {nodes} nodes x {} pods x 3 volumes ({pods} pods), 2 worker threads",
        cluster.pods_per_node
    );
    println!(
        "  load pods+sources and first full evaluation: {load_secs:.2} s; then RSS {:.0} MiB, peak so far {:.0} MiB",
        load_mem.0, load_mem.1
    );
    println!(
        "  inventories: {nodes} accepted in {inv_secs:.2} s ({:.0}/s), all evaluated after {inv_eval_secs:.2} s (target < 10 s); controller CPU {inv_cpu:.2} s",
        nodes as f64 / inv_secs
    );
    println!(
        "  heartbeats: {heartbeats:.0} in {:.2} s = {:.0} requests/s; controller CPU {:.2} s = {:.3} CPU s per 5,000 heartbeats",
        hb.0,
        heartbeats / hb.0,
        hb.1,
        hb.1 / heartbeats * 5000.0
    );
    println!(
        "  Secret change -> mountguard_mounts{{state=\"Propagating\"}} updated: {change_ms:.0} ms (target < 1,000 ms; {} pods moved)",
        propagating() - before
    );
    let interval = hb_interval();
    let (reconnects, window, steady_cpu) = steady;
    // Per second at the compressed interval, then at the agents' 30 s.
    let measured = reconnects as f64 / window.max(f64::EPSILON);
    let handshakes = measured * interval.as_secs_f64() / AGENT_HEARTBEAT.as_secs_f64();
    println!(
        "  steady state: {nodes} agents on a connection each, a heartbeat every {} ms (header-read timeout {} ms, idle timeout {} ms), {} rounds: {reconnects} connections reopened in {window:.1} s; controller CPU {steady_cpu:.2} s",
        interval.as_millis(),
        (interval / 3).as_millis(),
        (interval * 2).as_millis(),
        arg("--steady-rounds", 4),
    );
    println!(
        "  steady-state TLS handshakes/s: {handshakes:.0} (target 0; {measured:.1}/s at the compressed interval, scaled to a heartbeat every {} s)",
        AGENT_HEARTBEAT.as_secs()
    );
    let (open, parked, held_rss) = held;
    println!(
        "  every agent's connection held after its last heartbeat: {open} open, {parked} parked; RSS {held_rss:.0} MiB, {:.0} MiB above the RSS once every inventory was evaluated (at most {:.1} KiB per connection)",
        held_rss - inv_mem.0,
        (held_rss - inv_mem.0) * 1024.0 / open.max(1) as f64
    );
    println!("  evaluation batches: {evals}");
    println!(
        "  RSS once every inventory is evaluated: {:.0} MiB, peak so far {:.0} MiB",
        inv_mem.0, inv_mem.1
    );
    let target = if pods > 150_000 { 384 } else { 200 };
    println!(
        "  peak RSS (controller process): {:.0} MiB (target < {target} MiB at this size)",
        peak_rss_mib()
    );
}
