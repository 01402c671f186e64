//! The metrics and status server: `/metrics`, `/healthz`, `/readyz`,
//! `GET /v1/verdicts`, `GET /v1/rollouts/{kind}/{namespace}/{name}`.
//! The `/v1/` paths answer only readers the status gate lets in
//! (`status_auth.rs`); the others answer everybody (Prometheus, probes).

use std::convert::Infallible;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Bytes;

use crate::api::authorize::{StatusGate, scope_of};
use crate::api::metrics::ApiMetrics;
use crate::api::store::{Query, ReadModel};
use crate::runtime::http::{json_response, text};
use crate::runtime::shutdown::Shutdown;
use crate::state::Shared;

/// Answers one request.
pub fn route<B>(shared: &Shared, store: &ReadModel, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
    }
    match req.uri().path() {
        "/metrics" => Response::builder()
            .header(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )
            .body(Full::new(Bytes::from(shared.metrics.encode())))
            .expect("static response parts are valid"),
        "/healthz" | "/livez" => text(StatusCode::OK, "ok\n"),
        "/readyz" => {
            if shared.is_ready() {
                text(StatusCode::OK, "ready\n")
            } else {
                text(StatusCode::SERVICE_UNAVAILABLE, "watches not synced\n")
            }
        }
        "/v1/verdicts" => {
            let q = Query::parse(req.uri().query());
            let doc = store
                .read()
                .unwrap()
                .document(&q, shared.is_acting(), shared.is_ready());
            json_response(StatusCode::OK, &doc)
        }
        p if p.starts_with("/v1/rollouts/") => {
            let rest = &p["/v1/rollouts/".len()..];
            match rest.parse::<mountguard_core::rollout::Target>() {
                Ok(t) => {
                    let store = store.read().unwrap();
                    if let Some(why) = store.unanswerable(&t) {
                        return text(StatusCode::BAD_REQUEST, why);
                    }
                    let doc = store.rollout(&t, shared.is_acting(), shared.is_ready());
                    json_response(StatusCode::OK, &doc)
                }
                Err(_) => text(
                    StatusCode::BAD_REQUEST,
                    "use /v1/rollouts/{secret|configmap|nodeset|deployment|replicaset|statefulset|daemonset|pod}/{namespace}/{name}\n",
                ),
            }
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics /healthz /readyz /v1/verdicts /v1/rollouts/{kind}/{namespace}/{name}\n",
        ),
    }
}

/// Answers one request after the status gate for the `/v1/` paths
/// (`source`: the caller's address, which unknown tokens are charged to).
pub async fn answer<B>(
    shared: &Shared,
    metrics: &ApiMetrics,
    store: &ReadModel,
    gate: &StatusGate,
    req: &Request<B>,
    source: Option<std::net::IpAddr>,
) -> Response<Full<Bytes>> {
    let path = req.uri().path();
    if path.starts_with("/v1/") && (req.method() == Method::GET || req.method() == Method::HEAD) {
        let scope = scope_of(path, &Query::parse(req.uri().query()));
        match gate.check(req.headers(), scope, source).await {
            Ok(_) => {
                metrics
                    .status_requests
                    .with_label_values(&["allowed"])
                    .inc();
            }
            Err(r) => {
                metrics
                    .status_requests
                    .with_label_values(&[r.result()])
                    .inc();
                tracing::debug!(path, result = r.result(), "status request refused");
                let mut resp = Response::builder()
                    .status(r.status())
                    .header(header::CONTENT_TYPE, "text/plain; charset=utf-8");
                if r.status() == StatusCode::UNAUTHORIZED {
                    resp = resp.header(header::WWW_AUTHENTICATE, "Bearer");
                }
                if let Some(wait) = r.retry_after() {
                    resp = resp.header(header::RETRY_AFTER, wait.to_string());
                }
                return resp
                    .body(Full::new(Bytes::from(format!("{}\n", r.message()))))
                    .expect("static response parts are valid");
            }
        }
    }
    route(shared, store, req)
}

/// The serve limits of the metrics port and of the admission port (each
/// its own cap): the small ports' defaults (256 connections, at most 128
/// of them from one source address) with the header-read and idle
/// timeouts given.
pub fn limits(
    header_read_timeout: std::time::Duration,
    idle_timeout: std::time::Duration,
) -> mountguard_serve::Limits {
    mountguard_serve::Limits {
        header_read_timeout,
        idle_timeout,
        ..mountguard_serve::Limits::small()
    }
}

/// Serves until shutdown, with the shared bounded loop.
#[allow(clippy::too_many_arguments)]
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: Arc<Shared>,
    api_metrics: ApiMetrics,
    store: ReadModel,
    gate: Arc<StatusGate>,
    limits: mountguard_serve::Limits,
    serve_metrics: mountguard_serve::ServeMetrics,
    mut shutdown: Shutdown,
) {
    let make = move |peer: std::net::SocketAddr| {
        let s = shared.clone();
        let m = api_metrics.clone();
        let store = store.clone();
        let gate = gate.clone();
        hyper::service::service_fn(move |req: Request<mountguard_serve::RequestBody>| {
            let s = s.clone();
            let m = m.clone();
            let store = store.clone();
            let gate = gate.clone();
            async move {
                Ok::<_, Infallible>(answer(&s, &m, &store, &gate, &req, Some(peer.ip())).await)
            }
        })
    };
    mountguard_serve::serve(
        "metrics",
        listener,
        limits,
        mountguard_serve::Plain,
        serve_metrics,
        make,
        async move { shutdown.wait().await },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::metrics::Metrics;
    use std::sync::atomic::Ordering;

    fn get(shared: &Shared, store: &ReadModel, path: &str) -> (StatusCode, String) {
        use http_body_util::BodyExt;
        let req = Request::get(path).body(()).unwrap();
        let resp = route(shared, store, &req);
        let status = resp.status();
        let body = futures::executor::block_on(resp.into_body().collect())
            .unwrap()
            .to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[test]
    fn readiness_metrics_and_verdicts() {
        let shared = Shared::new(Metrics::new());
        let store = ReadModel::default();
        assert_eq!(get(&shared, &store, "/healthz").0, StatusCode::OK);
        assert_eq!(
            get(&shared, &store, "/readyz").0,
            StatusCode::SERVICE_UNAVAILABLE
        );
        shared.ready.store(true, Ordering::SeqCst);
        assert_eq!(get(&shared, &store, "/readyz").0, StatusCode::OK);
        let (s, m) = get(&shared, &store, "/metrics");
        assert_eq!(s, StatusCode::OK);
        assert!(m.contains("mountguard_build_info{version="), "{m}");
        let (s, v) = get(&shared, &store, "/v1/verdicts?all=1");
        assert_eq!(s, StatusCode::OK);
        let doc: crate::api::store::StatusDoc = serde_json::from_str(&v).unwrap();
        assert!(!doc.acting && doc.ready && doc.verdicts.is_empty());
        assert_eq!(get(&shared, &store, "/nope").0, StatusCode::NOT_FOUND);
        let (s, v) = get(
            &shared,
            &store,
            "/v1/rollouts/secret/slurm/slurm-auth-slurm",
        );
        assert_eq!(s, StatusCode::OK);
        let doc: mountguard_core::rollout::RolloutDoc = serde_json::from_str(&v).unwrap();
        assert_eq!(doc.target, "secret/slurm/slurm-auth-slurm");
        assert!(!doc.acting && !doc.sources[0].present, "{doc:?}");
        for bad in [
            "/v1/rollouts/job/a/b",
            "/v1/rollouts/secret/a",
            "/v1/rollouts/secret/a/b/c",
        ] {
            assert_eq!(
                get(&shared, &store, bad).0,
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
        // Workloads: a StatefulSet's, DaemonSet's or ReplicaSet's pods are
        // known from their owner; a Deployment's only with its ReplicaSets
        // watched.
        for ok in [
            "/v1/rollouts/statefulset/a/b",
            "/v1/rollouts/ds/a/b",
            "/v1/rollouts/replicaset/a/b-5d4f8",
        ] {
            let (s, v) = get(&shared, &store, ok);
            assert_eq!(s, StatusCode::OK, "{ok}: {v}");
        }
        let (s, v) = get(&shared, &store, "/v1/rollouts/deployment/a/b");
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert!(
            v.contains("--remediate-workloads including deployment"),
            "{v}"
        );
        store.write().unwrap().replicasets_watched = true;
        let (s, v) = get(&shared, &store, "/v1/rollouts/deployment/a/b");
        assert_eq!(s, StatusCode::OK, "{v}");
        let doc: mountguard_core::rollout::RolloutDoc = serde_json::from_str(&v).unwrap();
        assert_eq!(doc.target, "deployment/a/b");
    }

    #[test]
    fn source_watch_health() {
        let h = crate::runtime::health::Health::default();
        h.register("pods", true);
        h.register("secrets/ns", true);
        h.register("nodesets", false);
        assert!(!h.all_synced());
        assert!(h.sources_degraded(), "not synced yet");
        h.synced_for_test("pods");
        h.synced_for_test("secrets/ns");
        assert!(h.all_synced(), "optional watches do not gate readiness");
        assert!(!h.sources_degraded());
        h.error_for_test("pods");
        assert!(!h.sources_degraded(), "only Secret/ConfigMap watches count");
        h.error_for_test("secrets/ns");
        assert!(h.sources_degraded());
    }

    /// The metrics port's cap and four more idle sockets from one address,
    /// each reopened as soon as it is closed: the kubelet's liveness and
    /// readiness probes (a fresh connection each, from the node's
    /// address) and a scrape are all answered.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_socket_flood_does_not_starve_healthz() {
        use mountguard_serve::test_flood::{Flood, probe};
        use std::time::Duration;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared::new(Metrics::new()));
        shared.ready.store(true, Ordering::SeqCst);
        let limits = limits(Duration::from_secs(10), Duration::from_secs(60));
        let (_stop, shutdown) = Shutdown::new();
        tokio::spawn(serve(
            listener,
            shared.clone(),
            ApiMetrics::register(&shared.metrics),
            ReadModel::default(),
            Arc::new(StatusGate::open()),
            limits,
            shared.metrics.serve("metrics"),
            shutdown,
        ));
        let flood = Flood::past_the_cap(addr, limits.max_connections).await;
        let node = "127.0.0.1".parse().unwrap();
        let mut answered = 0;
        for path in ["/healthz", "/readyz", "/metrics"].repeat(10) {
            answered += usize::from(probe(addr, node, path).await);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(flood);
        assert_eq!(answered, 30, "probes answered under the flood");
    }
}
