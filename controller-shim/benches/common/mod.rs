//! What the report-API benchmarks (`reports`, `hostile`) share: node
//! names, their flags, the controller's memory, the agents' TokenReview
//! answers and the load generator's HTTP client: every node's inventory,
//! then rounds of heartbeats.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use jiff::Timestamp;
use mountguard_controller::intake::auth::AgentPod;
use mountguard_controller::intake::limits::{self, CountLimits, ReportConfig};
use mountguard_controller::runtime::token_review::{
    AuthError, EXTRA_POD_NAME, EXTRA_POD_UID, ReviewedUser, TokenReviewer,
};
use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::Heartbeat;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use nix::sys::resource::{UsageWho, getrusage};

/// The name of simulated node `n`.
pub fn node_name(n: usize) -> String {
    format!("node-{n:05}")
}

/// The value of flag `name` (`--nodes 100`), or `default`.
pub fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A memory field of this process's `/proc/self/status` (`VmRSS`,
/// `VmHWM`), in MiB; 0 when it cannot be read.
pub fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// This process's peak RSS in MiB.
pub fn peak_rss_mib() -> f64 {
    getrusage(UsageWho::RUSAGE_SELF)
        .map(|u| u.max_rss() as f64 / 1024.0)
        .unwrap_or(0.0)
}

/// One HTTP/1.1 connection to the controller.
pub async fn connect(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    send
}

/// A report `PUT`; panics unless it succeeds; returns the answer's
/// `status` (`accepted`, `unchanged`, ...).
pub async fn put(
    sender: &mut hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    path: &str,
    token: &str,
    body: Vec<u8>,
) -> String {
    let req = http::Request::put(path)
        .header(http::header::HOST, "controller")
        .header(http::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = sender.send_request(req).await.expect("request");
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(
        status.is_success(),
        "{status}: {}",
        String::from_utf8_lossy(&body)
    );
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["status"].as_str().unwrap_or("").to_string()
}

/// The agents' TokenReview answers: `token-<n>` is agent pod `agent-<n>`
/// for every `n` below `nodes`.
#[derive(Debug)]
pub struct Reviewer {
    /// Nodes with an agent.
    pub nodes: usize,
}

impl TokenReviewer for Reviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        _audience: &'a str,
    ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
        Box::pin(async move {
            let n: usize = token
                .strip_prefix("token-")
                .and_then(|s| s.parse().ok())
                .filter(|n| *n < self.nodes)
                .ok_or_else(|| AuthError::Unauthenticated("unknown".into()))?;
            let mut extra = BTreeMap::new();
            extra.insert(EXTRA_POD_NAME.to_string(), vec![format!("agent-{n}")]);
            extra.insert(EXTRA_POD_UID.to_string(), vec![format!("agent-uid-{n}")]);
            Ok(ReviewedUser {
                username: "system:serviceaccount:mg:agent".into(),
                uid: format!("sa-{n}"),
                extra,
            })
        })
    }
}

/// Every node's inventory (`inventory(n)`), over `conns` connections, each
/// answered `accepted`.
pub async fn put_inventories<F>(addr: SocketAddr, nodes: usize, conns: usize, inventory: F)
where
    F: Fn(usize) -> NodeInventory + Clone + Send + 'static,
{
    let mut tasks = Vec::new();
    for c in 0..conns {
        let inventory = inventory.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = connect(addr).await;
            let mut n = c;
            while n < nodes {
                let inv = inventory(n);
                let st = put(
                    &mut s,
                    &format!("/v1/nodes/{}/inventory", node_name(n)),
                    &format!("token-{n}"),
                    serde_json::to_vec(&inv).unwrap(),
                )
                .await;
                assert_eq!(st, "accepted");
                n += conns;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// `rounds` heartbeats of every node over `conns` connections, each
/// answered `unchanged`; returns each heartbeat's latency.
pub async fn heartbeat_rounds(
    addr: SocketAddr,
    nodes: usize,
    rounds: usize,
    conns: usize,
) -> Vec<Duration> {
    let mut tasks = Vec::new();
    for c in 0..conns {
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let mut s = connect(addr).await;
            for _ in 0..rounds {
                let mut n = c;
                while n < nodes {
                    let hb = Heartbeat::new(node_name(n), 1, Timestamp::now());
                    let t = Instant::now();
                    let st = put(
                        &mut s,
                        &format!("/v1/nodes/{}/heartbeat", node_name(n)),
                        &format!("token-{n}"),
                        serde_json::to_vec(&hb).unwrap(),
                    )
                    .await;
                    lat.push(t.elapsed());
                    assert_eq!(st, "unchanged");
                    n += conns;
                }
            }
            lat
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.unwrap());
    }
    lat
}

/// The report API's settings of both benchmarks: the chart's audience and
/// agent names, 32 MiB bodies, 100/s per node, the default count limits.
pub fn report_config() -> ReportConfig {
    ReportConfig {
        audience: "mountguard".into(),
        agent_sa: "mg:agent".parse().unwrap(),
        agent_daemonset: "agent".into(),
        max_bytes: 32 << 20,
        rate: "100/s,100".parse().unwrap(),
        limits: CountLimits::default(),
        body_timeout: std::time::Duration::from_secs(10),
        node_in_flight: limits::NODE_IN_FLIGHT,
    }
}

/// The agent pod of node `n`, controlled by the DaemonSet `daemonset_uid`.
pub fn agent_pod(n: usize, daemonset_uid: &str) -> AgentPod {
    AgentPod {
        namespace: "mg".into(),
        name: format!("agent-{n}"),
        uid: format!("agent-uid-{n}"),
        node: Some(node_name(n)),
        controller: Some(("agent".into(), daemonset_uid.into())),
    }
}

/// The load generator: this benchmark's own binary started again with the
/// environment `env` (`MOUNTGUARD_BENCH_CLIENT`, ...) and the flags
/// `args`; returns it, its stdin, and each line it prints as `read(line)`,
/// called when the line is read.
pub fn load_generator<T: Send + 'static>(
    env: &[(&str, String)],
    args: &[String],
    read: impl Fn(String) -> T + Send + 'static,
) -> (
    std::process::Child,
    std::process::ChildStdin,
    tokio::sync::mpsc::UnboundedReceiver<T>,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (ltx, lrx) = tokio::sync::mpsc::unbounded_channel::<T>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = ltx.send(read(line.unwrap()));
        }
    });
    (child, stdin, lrx)
}

/// The load generator's runtime: two worker threads, beside the
/// controller's.
pub fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
