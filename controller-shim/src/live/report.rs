//! The report API: `PUT /v1/nodes/{node}/inventory` and
//! `PUT /v1/nodes/{node}/heartbeat`.
//!
//! Order of checks (each failure answers at once, counts
//! `mountguard_report_requests_total{result}`, logs the node and the reason
//! but never the token, and changes nothing): acting replica (503
//! `notLeader`), initial lists done (503 `notReady`), method and path (404 /
//! 405), bearer token (401), authorization for the node (403), per-node rate
//! limit (429 + `Retry-After`), body size (413, from `Content-Length` before
//! reading, else while reading), strict parse and limits (400), node in the
//! body equals the path (400), generation (409 when older than held). Only
//! then is the held generation updated and the inventory handed to the
//! evaluation task.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Body;
use hyper::body::Bytes;
use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::{
    ErrorBody, HEARTBEAT_SCHEMA, Heartbeat, ReportResponse, ReportStatus,
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::args::{RateLimit, RunArgs, ServiceAccountRef};
use super::auth::{AgentPods, AuthError, PodFetcher, TokenReviewer, authorize};
use super::eval::Input;
use super::{Shared, Shutdown};

/// Limits on what one inventory may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountLimits {
    /// Pods per inventory.
    pub pods: usize,
    /// Volumes (and subPath entries) per pod.
    pub volumes_per_pod: usize,
    /// Files per volume.
    pub files_per_volume: usize,
    /// Length of a path or name.
    pub path_len: usize,
}

impl Default for CountLimits {
    fn default() -> Self {
        Self {
            pods: 5_000,
            volumes_per_pod: 1_000,
            files_per_volume: 10_000,
            path_len: 4_096,
        }
    }
}

/// Configuration of the handler.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// Token audience.
    pub audience: String,
    /// Agent ServiceAccount.
    pub agent_sa: ServiceAccountRef,
    /// Agent DaemonSet name.
    pub agent_daemonset: String,
    /// Largest body.
    pub max_bytes: u64,
    /// Per-node rate limit.
    pub rate: RateLimit,
    /// Count limits.
    pub limits: CountLimits,
}

impl ReportConfig {
    /// From the command line.
    pub fn from_args(a: &RunArgs) -> Self {
        Self {
            audience: a.token_audience.clone(),
            agent_sa: a.agent_service_account.clone(),
            agent_daemonset: a.agent_daemonset.clone(),
            max_bytes: a.max_report_bytes,
            rate: a.report_rate_limit,
            limits: CountLimits::default(),
        }
    }
}

#[derive(Debug)]
struct NodeBook {
    generation: Option<u64>,
    tokens: f64,
    refilled: Instant,
}

/// The report handler (shared by every connection).
#[derive(Debug)]
pub struct ReportHandler {
    config: ReportConfig,
    shared: Arc<Shared>,
    reviewer: Arc<dyn TokenReviewer>,
    agents: Arc<AgentPods>,
    fetcher: Option<Arc<dyn PodFetcher>>,
    inputs: mpsc::Sender<Input>,
    book: Mutex<HashMap<String, NodeBook>>,
}

type Resp = Response<Full<Bytes>>;

/// A rejection: status, error code, result label, message.
struct Reject {
    status: StatusCode,
    code: &'static str,
    result: &'static str,
    message: String,
    retry_after: Option<u64>,
}

impl Reject {
    fn new(
        status: StatusCode,
        code: &'static str,
        result: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            code,
            result,
            message: message.into(),
            retry_after: None,
        }
    }
    fn bad(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "badRequest",
            "bad_request",
            message,
        )
    }
}

/// A JSON response.
pub fn json_response<T: serde::Serialize>(status: StatusCode, body: &T) -> Resp {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .expect("static response parts are valid")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inventory,
    Heartbeat,
}

impl ReportHandler {
    /// A handler.
    pub fn new(
        config: ReportConfig,
        shared: Arc<Shared>,
        reviewer: Arc<dyn TokenReviewer>,
        agents: Arc<AgentPods>,
        fetcher: Option<Arc<dyn PodFetcher>>,
        inputs: mpsc::Sender<Input>,
    ) -> Self {
        Self {
            config,
            shared,
            reviewer,
            agents,
            fetcher,
            inputs,
            book: Mutex::new(HashMap::new()),
        }
    }

    /// Forgets every held generation (new leader, step-down): the next
    /// heartbeat of each agent is answered `resend`.
    pub fn reset(&self) {
        self.book.lock().unwrap().clear();
    }

    /// The generation held for `node`.
    pub fn held_generation(&self, node: &str) -> Option<u64> {
        self.book
            .lock()
            .unwrap()
            .get(node)
            .and_then(|b| b.generation)
    }

    /// Handles one request.
    pub async fn handle<B>(&self, req: Request<B>) -> Resp
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let start = Instant::now();
        let (kind, node) = match parse_path(req.uri().path()) {
            Some(x) => x,
            None => {
                return json_response(
                    StatusCode::NOT_FOUND,
                    &ErrorBody {
                        error: "notFound".into(),
                        message: "use PUT /v1/nodes/{node}/inventory or /v1/nodes/{node}/heartbeat"
                            .into(),
                    },
                );
            }
        };
        let kind_label = match kind {
            Kind::Inventory => "inventory",
            Kind::Heartbeat => "heartbeat",
        };
        let resp = match self.handle_inner(req, kind, &node).await {
            Ok((status, generation)) => {
                self.shared.metrics.report(match status {
                    ReportStatus::Accepted => "accepted",
                    ReportStatus::Unchanged => "unchanged",
                    ReportStatus::Resend => "resend",
                });
                debug!(node, kind = kind_label, ?status, "report");
                json_response(StatusCode::OK, &ReportResponse { status, generation })
            }
            Err(r) => {
                self.shared.metrics.report(r.result);
                if r.status != StatusCode::SERVICE_UNAVAILABLE {
                    warn!(node, kind = kind_label, result = r.result, reason = %r.message, "report rejected");
                }
                let mut resp = json_response(
                    r.status,
                    &ErrorBody {
                        error: r.code.into(),
                        message: r.message,
                    },
                );
                if let Some(s) = r.retry_after {
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, header::HeaderValue::from(s));
                }
                resp
            }
        };
        self.shared
            .metrics
            .report_duration
            .with_label_values(&[kind_label])
            .observe(start.elapsed().as_secs_f64());
        resp
    }

    async fn handle_inner<B>(
        &self,
        req: Request<B>,
        kind: Kind,
        node: &str,
    ) -> Result<(ReportStatus, Option<u64>), Reject>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        if req.method() != Method::PUT {
            return Err(Reject::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "methodNotAllowed",
                "bad_request",
                "use PUT",
            ));
        }
        if !self.shared.is_acting() {
            return Err(Reject::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "notLeader",
                "not_leader",
                "this replica is not the acting controller; retry (the report Service selects the leader)",
            ));
        }
        if !self.shared.is_ready() {
            return Err(Reject::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "notReady",
                "error",
                "the controller is still loading the cluster state; retry shortly",
            ));
        }
        self.authenticate(&req, node).await?;
        self.take_token(node)?;

        if let Some(len) = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > self.config.max_bytes
        {
            return Err(too_large(self.config.max_bytes));
        }
        let body = match Limited::new(req.into_body(), self.config.max_bytes as usize)
            .collect()
            .await
        {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some()
                {
                    return Err(too_large(self.config.max_bytes));
                }
                return Err(Reject::bad(format!("reading the body failed: {e}")));
            }
        };
        match kind {
            Kind::Inventory => self.inventory(node, &body).await,
            Kind::Heartbeat => self.heartbeat(node, &body).await,
        }
    }

    async fn authenticate<B>(&self, req: &Request<B>, node: &str) -> Result<(), Reject> {
        let unauth = |m: &str| {
            Reject::new(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                "unauthenticated",
                m.to_string(),
            )
        };
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauth("missing bearer token"))?;
        let user = match self.reviewer.review(token, &self.config.audience).await {
            Ok(u) => u,
            Err(AuthError::Unauthenticated(m)) => return Err(unauth(&m)),
            Err(AuthError::Unavailable(m)) => {
                return Err(Reject::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "notReady",
                    "error",
                    format!("token review failed, retry later: {m}"),
                ));
            }
        };
        let sa = &self.config.agent_sa;
        let ds = &self.config.agent_daemonset;
        let mut r = authorize(&user, node, sa, ds, |n| self.agents.get(n));
        if let Err(d) = &r
            && d.may_be_cache_miss()
            && let Some(f) = &self.fetcher
            && let Some(name) = user
                .extra
                .get(super::auth::EXTRA_POD_NAME)
                .and_then(|v| v.first())
            && let Some(p) = f.fetch(name).await
        {
            if p.daemonsets.iter().any(|d| d == ds) {
                self.agents.apply(p.clone());
            }
            r = authorize(&user, node, sa, ds, |n| (n == p.name).then(|| p.clone()));
        }
        r.map(|_| ()).map_err(|d| {
            Reject::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "forbidden",
                format!("not allowed to report for node {node}: {d}"),
            )
        })
    }

    fn take_token(&self, node: &str) -> Result<(), Reject> {
        let rate = self.config.rate;
        let now = Instant::now();
        let mut book = self.book.lock().unwrap();
        let b = book.entry(node.to_string()).or_insert_with(|| NodeBook {
            generation: None,
            tokens: rate.burst as f64,
            refilled: now,
        });
        let elapsed = now.duration_since(b.refilled).as_secs_f64();
        b.tokens = (b.tokens + elapsed * rate.per_second).min(rate.burst as f64);
        b.refilled = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            let wait = ((1.0 - b.tokens) / rate.per_second).ceil().max(1.0) as u64;
            let mut r = Reject::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rateLimited",
                "rate_limited",
                format!("too many reports for node {node}; retry after {wait}s"),
            );
            r.retry_after = Some(wait);
            Err(r)
        }
    }

    async fn inventory(
        &self,
        node: &str,
        body: &[u8],
    ) -> Result<(ReportStatus, Option<u64>), Reject> {
        let inv = NodeInventory::from_json(body)
            .map_err(|e| Reject::bad(format!("invalid inventory: {e}")))?;
        if inv.node != node {
            return Err(Reject::bad(format!(
                "inventory is for node {:?}, the path names {node:?}",
                inv.node
            )));
        }
        check_limits(&inv, &self.config.limits).map_err(Reject::bad)?;
        let generation = inv.generation;
        let decision = {
            let mut book = self.book.lock().unwrap();
            let b = book.get_mut(node).expect("rate limit created the entry");
            match b.generation {
                Some(held) if generation < held => Err(held),
                Some(held) if generation == held => Ok(false),
                _ => {
                    b.generation = Some(generation);
                    Ok(true)
                }
            }
        };
        match decision {
            Err(held) => Err(stale(generation, held)),
            Ok(false) => {
                // Same content; its scan time still counts as a heartbeat.
                self.send(Input::Heartbeat {
                    node: node.to_string(),
                    generation,
                    scanned_at: inv.scanned_at,
                })
                .await?;
                Ok((ReportStatus::Unchanged, Some(generation)))
            }
            Ok(true) => {
                self.send(Input::Inventory(Box::new(inv))).await?;
                Ok((ReportStatus::Accepted, Some(generation)))
            }
        }
    }

    async fn heartbeat(
        &self,
        node: &str,
        body: &[u8],
    ) -> Result<(ReportStatus, Option<u64>), Reject> {
        let hb: Heartbeat = serde_json::from_slice(body)
            .map_err(|e| Reject::bad(format!("invalid heartbeat: {e}")))?;
        if hb.schema != HEARTBEAT_SCHEMA {
            return Err(Reject::bad(format!(
                "heartbeat schema {:?}, expected {HEARTBEAT_SCHEMA:?}",
                hb.schema
            )));
        }
        if hb.node != node {
            return Err(Reject::bad(format!(
                "heartbeat is for node {:?}, the path names {node:?}",
                hb.node
            )));
        }
        let held = self.held_generation(node);
        match held {
            Some(h) if hb.generation < h => Err(stale(hb.generation, h)),
            Some(h) if hb.generation == h => {
                self.send(Input::Heartbeat {
                    node: node.to_string(),
                    generation: h,
                    scanned_at: hb.scanned_at,
                })
                .await?;
                Ok((ReportStatus::Unchanged, Some(h)))
            }
            _ => Ok((ReportStatus::Resend, held)),
        }
    }

    async fn send(&self, input: Input) -> Result<(), Reject> {
        self.inputs.send(input).await.map_err(|_| {
            Reject::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "notReady",
                "error",
                "the controller is shutting down",
            )
        })
    }
}

fn too_large(max: u64) -> Reject {
    Reject::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "tooLarge",
        "too_large",
        format!("body larger than {max} bytes (--max-report-bytes)"),
    )
}

fn stale(got: u64, held: u64) -> Reject {
    Reject::new(
        StatusCode::CONFLICT,
        "staleGeneration",
        "conflict",
        format!(
            "generation {got} is older than the held generation {held}; do not resend this body"
        ),
    )
}

fn parse_path(path: &str) -> Option<(Kind, String)> {
    let rest = path.strip_prefix("/v1/nodes/")?;
    let (node, what) = rest.split_once('/')?;
    let kind = match what {
        "inventory" => Kind::Inventory,
        "heartbeat" => Kind::Heartbeat,
        _ => return None,
    };
    let valid = !node.is_empty()
        && node.len() <= 253
        && node
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    valid.then(|| (kind, node.to_string()))
}

/// Checks the count limits of an inventory.
pub fn check_limits(inv: &NodeInventory, l: &CountLimits) -> Result<(), String> {
    if inv.pods.len() > l.pods {
        return Err(format!(
            "{} pods, at most {} allowed",
            inv.pods.len(),
            l.pods
        ));
    }
    let long = |s: &str| s.len() > l.path_len;
    for p in &inv.pods {
        if long(&p.uid) {
            return Err("pod uid too long".into());
        }
        if p.volumes.len() > l.volumes_per_pod || p.sub_paths.len() > l.volumes_per_pod {
            return Err(format!(
                "pod {}: more than {} volumes or subPaths",
                p.uid, l.volumes_per_pod
            ));
        }
        for v in &p.volumes {
            if long(&v.name) {
                return Err(format!("pod {}: volume name too long", p.uid));
            }
            if v.files.len() > l.files_per_volume {
                return Err(format!(
                    "pod {} volume {}: {} files, at most {}",
                    p.uid,
                    v.name,
                    v.files.len(),
                    l.files_per_volume
                ));
            }
            if v.files.keys().any(|k| long(k)) || v.errors.iter().any(|e| long(&e.path)) {
                return Err(format!("pod {} volume {}: path too long", p.uid, v.name));
            }
        }
        for s in &p.sub_paths {
            if long(&s.volume) || long(&s.container) {
                return Err(format!("pod {}: subPath name too long", p.uid));
            }
        }
    }
    Ok(())
}

/// Serves the report API until shutdown: TLS when `tls` is given, else
/// plain HTTP/1.1. Open connections get a bounded graceful drain.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<super::tls::ReloadingCert>,
    handler: Arc<ReportHandler>,
    mut shutdown: Shutdown,
) {
    let acceptor = tls.map(|c| tokio_rustls::TlsAcceptor::from(Arc::new(c.server_config())));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.wait() => break,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    warn!(error = %e, "accepting a report connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let h = handler.clone();
        let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
            let h = h.clone();
            async move { Ok::<_, Infallible>(h.handle(req).await) }
        });
        let builder = hyper::server::conn::http1::Builder::new();
        match &acceptor {
            None => {
                let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                let fut = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = fut.await {
                        debug!(%peer, error = %e, "report connection ended");
                    }
                });
            }
            Some(acc) => {
                let acc = acc.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let tls =
                        match tokio::time::timeout(Duration::from_secs(10), acc.accept(stream))
                            .await
                        {
                            Ok(Ok(s)) => s,
                            Ok(Err(e)) => {
                                debug!(%peer, error = %e, "TLS handshake failed");
                                return;
                            }
                            Err(_) => return,
                        };
                    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
                    if let Err(e) = watcher.watch(conn).await {
                        debug!(%peer, error = %e, "report connection ended");
                    }
                });
            }
        }
    }
    drop(listener);
    let _ = tokio::time::timeout(Duration::from_secs(5), graceful.shutdown()).await;
}
