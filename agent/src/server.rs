//! The tiny HTTP server: `/metrics`, `/healthz`, `/readyz`.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use http::{Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::service::service_fn;
use tokio::net::TcpListener;

use crate::metrics::Metrics;
use crate::shutdown::Shutdown;

/// How long open connections may take to finish after shutdown starts.
const DRAIN: Duration = Duration::from_secs(5);

/// What the endpoints report on.
#[derive(Debug, Clone)]
pub struct ServerState {
    /// Metrics to expose.
    pub metrics: Metrics,
    /// Set after the first successful full scan.
    pub ready: Arc<AtomicBool>,
}

fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

fn route<B>(state: &ServerState, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.method() != http::Method::GET && req.method() != http::Method::HEAD {
        return respond(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "GET only\n");
    }
    match req.uri().path() {
        "/metrics" => respond(
            StatusCode::OK,
            "text/plain; version=0.0.4",
            state.metrics.encode(),
        ),
        "/healthz" => respond(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if state.ready.load(Ordering::Acquire) {
                respond(StatusCode::OK, "text/plain", "ready\n")
            } else {
                respond(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not ready: the first full scan has not completed\n",
                )
            }
        }
        _ => respond(StatusCode::NOT_FOUND, "text/plain", "not found\n"),
    }
}

/// Bounds of the agent's port: Prometheus and the kubelet's probes only.
/// One source address holds at most half the cap of connections, so a
/// flood of idle sockets from one pod leaves room for the kubelet's probes
/// (which send their request at once and are then kept over idle sockets).
pub fn limits() -> mountguard_serve::Limits {
    mountguard_serve::Limits {
        max_connections: 64,
        per_source: 32,
        ..mountguard_serve::Limits::small()
    }
}

/// Serves until `shutdown` fires, then lets open connections finish
/// (bounded), with the shared bounded loop ([`limits`]).
pub async fn serve(listener: TcpListener, state: ServerState, mut shutdown: Shutdown) {
    let limits = mountguard_serve::Limits {
        drain: DRAIN,
        ..limits()
    }
    .fit_in(mountguard_serve::nofile_limit(), 64);
    let make = move |_peer| {
        let state = state.clone();
        service_fn(move |req: Request<mountguard_serve::RequestBody>| {
            let resp = route(&state, &req);
            async move { Ok::<_, Infallible>(resp) }
        })
    };
    mountguard_serve::serve(
        "agent",
        listener,
        limits,
        mountguard_serve::Plain,
        mountguard_serve::ServeMetrics::unregistered(),
        make,
        async move { shutdown.wait().await },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use mountguard_serve::test_flood::{Flood, probe};

    /// The agent's cap and four more idle sockets from one pod's address,
    /// each reopened as soon as it is closed: the kubelet's probes (a
    /// fresh connection each, from the node's address) are all answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_socket_flood_does_not_starve_the_agents_probes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = ServerState {
            metrics: Metrics::new().unwrap(),
            ready: Arc::new(AtomicBool::new(true)),
        };
        let (_stop, shutdown) = Shutdown::new();
        tokio::spawn(serve(listener, state, shutdown));
        let flood = Flood::past_the_cap(addr, limits().max_connections).await;
        let node = "127.0.0.1".parse().unwrap();
        let mut answered = 0;
        for path in ["/healthz", "/readyz"].repeat(15) {
            answered += usize::from(probe(addr, node, path).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(flood);
        assert_eq!(answered, 30, "probes answered under the flood");
    }
}
