//! The metrics and status server: `/metrics`, `/healthz`, `/readyz`,
//! `GET /v1/verdicts`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Bytes;
use tracing::{debug, warn};

use super::report::json_response;
use super::status::Query;
use super::{Shared, Shutdown};

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .expect("static response parts are valid")
}

/// Answers one request.
pub fn route<B>(shared: &Shared, req: &Request<B>) -> Response<Full<Bytes>> {
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
            let doc =
                shared
                    .verdicts
                    .read()
                    .unwrap()
                    .document(&q, shared.is_acting(), shared.is_ready());
            json_response(StatusCode::OK, &doc)
        }
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: /metrics /healthz /readyz /v1/verdicts\n",
        ),
    }
}

/// Serves until shutdown.
pub async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>, mut shutdown: Shutdown) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.wait() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accepting a metrics connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let s = shared.clone();
        let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let s = s.clone();
            async move { Ok::<_, Infallible>(route(&s, &req)) }
        });
        let conn = hyper::server::conn::http1::Builder::new()
            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
        let fut = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = fut.await {
                debug!(%peer, error = %e, "metrics connection ended");
            }
        });
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(3), graceful.shutdown()).await;
}
