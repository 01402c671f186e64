//! What the report-API benchmarks (`reports`, `hostile`) share: node
//! names, their flags, the controller's memory and the load generator's
//! HTTP client.

use std::net::SocketAddr;

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
