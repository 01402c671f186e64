//! The report API: `PUT /v1/nodes/{node}/inventory` and
//! `PUT /v1/nodes/{node}/heartbeat`.
//!
//! Order of checks (each failure answers at once, counts
//! `mountguard_report_requests_total{result}`, logs the node and the reason
//! but never the token - at most one line per result per
//! [`REFUSAL_LOG_EVERY`], with the count not logged - and changes nothing): acting replica (503
//! `notLeader`), initial lists done (503 `notReady`), method and path (404 /
//! 405), bearer token (401), authorization for the node (403), reports of
//! the node in flight (429 + `Retry-After` beyond
//! [`ReportConfig::node_in_flight`]) and connections it holds (the same
//! 429, through the serve loop's [`mountguard_serve::Standing`]; the
//! connection is then vouched for, and a refused one demoted, so it is
//! shed first), per-node rate limit (429 + `Retry-After`), body size (413;
//! an oversized body is read and discarded up to a bound so the client
//! sees the answer), body deadline (408 `bodyTimeout` when the body has
//! not arrived within `--report-body-timeout` plus 1 s per
//! [`MIN_BODY_RATE`] bytes received), strict parse and limits (400), node
//! in the body equals the path (400), generation (409 when older than
//! held). Only
//! then is the held generation updated and the inventory handed to the
//! evaluation task.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Body;
use hyper::body::Bytes;
use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::{
    ErrorBody, HEARTBEAT_SCHEMA, Heartbeat, ReportResponse, ReportStatus,
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::eval::Input;
use crate::intake::auth::{AgentDaemonSet, AgentPods, PodFetcher, authorize};
use crate::intake::body::{
    BodyError, CLOCK_SKEW_WARN, MIN_BODY_RATE, ahead_by, clamp_to_received, drain_cap, read_bounded,
};
use crate::intake::limits::{ReportConfig, enforce_limits};
use crate::intake::metrics::IntakeMetrics;
use crate::runtime::http::json_response;
use crate::runtime::limits::TokenBucket;
use crate::runtime::shutdown::Shutdown;
use crate::runtime::token_review::{AuthError, TokenReviewer};
use crate::state::Shared;

#[derive(Debug)]
struct NodeBook {
    generation: Option<u64>,
    bucket: TokenBucket,
}

/// The remote address of the connection a request came on (a request
/// extension set by the server).
#[derive(Debug, Clone, Copy)]
pub struct PeerAddr(pub std::net::SocketAddr);

/// The report handler (shared by every connection).
#[derive(Debug)]
pub struct ReportHandler {
    config: ReportConfig,
    shared: Arc<Shared>,
    /// The report API's metric families.
    metrics: IntakeMetrics,
    reviewer: Arc<dyn TokenReviewer>,
    agents: Arc<AgentPods>,
    fetcher: Option<Arc<dyn PodFetcher>>,
    inputs: mpsc::Sender<Input>,
    book: Mutex<HashMap<String, NodeBook>>,
    inflight: Arc<tokio::sync::Semaphore>,
    refusals: Mutex<RefusalLog>,
    node_in_flight: Mutex<HashMap<String, usize>>,
}

/// One report of a node being handled (released on drop).
struct NodeSlot<'a> {
    map: &'a Mutex<HashMap<String, usize>>,
    node: String,
}

impl Drop for NodeSlot<'_> {
    fn drop(&mut self) {
        let mut map = self.map.lock().unwrap();
        if let Some(n) = map.get_mut(&self.node) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.node);
            }
        }
    }
}

/// At most one warning line per refusal result is written per this
/// period; the next line carries the count of those not logged.
pub const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(10);

/// Which refusals get a warning line: at most one per result label per
/// [`REFUSAL_LOG_EVERY`] (pure: time is passed in). An attacker sets how
/// many refusals there are, not how many lines they write; the counters
/// (`mountguard_report_requests_total{result}`) still count each.
#[derive(Debug, Default)]
pub struct RefusalLog {
    by_result: HashMap<&'static str, RefusalSlot>,
}

#[derive(Debug)]
struct RefusalSlot {
    logged: Instant,
    not_logged: u64,
}

impl RefusalLog {
    /// Records a refusal with `result` at `now`: `Some(n)` when it is to
    /// be logged, `n` refusals with that result having gone unlogged since
    /// the last line; `None` when it is only counted.
    pub fn admit(&mut self, result: &'static str, now: Instant) -> Option<u64> {
        match self.by_result.get_mut(result) {
            Some(s) if now.saturating_duration_since(s.logged) < REFUSAL_LOG_EVERY => {
                s.not_logged += 1;
                None
            }
            Some(s) => {
                let n = std::mem::take(&mut s.not_logged);
                s.logged = now;
                Some(n)
            }
            None => {
                self.by_result.insert(
                    result,
                    RefusalSlot {
                        logged: now,
                        not_logged: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

/// Parsed inventories, at most: from the parse until the evaluation has
/// applied them (each may hold megabytes until converted; a report waits
/// for its turn with only its body read, a few times smaller).
pub const MAX_INFLIGHT_INVENTORIES: usize = 32;

type Resp = Response<Full<Bytes>>;

/// A rejection: status, error code, result label, message.
struct Reject {
    status: StatusCode,
    code: &'static str,
    result: &'static str,
    message: String,
    retry_after: Option<u64>,
    /// Close the connection after the answer.
    close: bool,
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
            close: false,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inventory,
    Heartbeat,
}

impl ReportHandler {
    /// A handler, measured by `metrics`.
    pub fn new(
        config: ReportConfig,
        shared: Arc<Shared>,
        metrics: IntakeMetrics,
        reviewer: Arc<dyn TokenReviewer>,
        agents: Arc<AgentPods>,
        fetcher: Option<Arc<dyn PodFetcher>>,
        inputs: mpsc::Sender<Input>,
    ) -> Self {
        Self {
            config,
            shared,
            metrics,
            reviewer,
            agents,
            fetcher,
            inputs,
            book: Mutex::new(HashMap::new()),
            inflight: Arc::new(tokio::sync::Semaphore::new(MAX_INFLIGHT_INVENTORIES)),
            refusals: Mutex::new(RefusalLog::default()),
            node_in_flight: Mutex::new(HashMap::new()),
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
        let standing = req
            .extensions()
            .get::<mountguard_serve::Standing>()
            .cloned();
        let resp = match self.handle_inner(req, kind, &node, standing.as_ref()).await {
            Ok((status, generation)) => {
                self.metrics.report(match status {
                    ReportStatus::Accepted => "accepted",
                    ReportStatus::Unchanged => "unchanged",
                    ReportStatus::Resend => "resend",
                });
                debug!(node, kind = kind_label, ?status, "report");
                json_response(StatusCode::OK, &ReportResponse { status, generation })
            }
            Err(r) => {
                self.metrics.report(r.result);
                // A refused caller's connection is the first to be shed
                // when the connection cap is reached.
                if let Some(st) = &standing
                    && matches!(
                        r.status,
                        StatusCode::UNAUTHORIZED
                            | StatusCode::FORBIDDEN
                            | StatusCode::TOO_MANY_REQUESTS
                            | StatusCode::REQUEST_TIMEOUT
                            | StatusCode::PAYLOAD_TOO_LARGE
                    )
                {
                    st.demote();
                }
                if r.status != StatusCode::SERVICE_UNAVAILABLE
                    && let Some(not_logged) = self
                        .refusals
                        .lock()
                        .unwrap()
                        .admit(r.result, Instant::now())
                {
                    warn!(
                        node,
                        kind = kind_label,
                        result = r.result,
                        reason = %r.message,
                        not_logged_since_last = not_logged,
                        "report rejected (at most one such line per result per 10 s)"
                    );
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
                if r.close {
                    resp.headers_mut().insert(
                        header::CONNECTION,
                        header::HeaderValue::from_static("close"),
                    );
                }
                resp
            }
        };
        self.metrics
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
        standing: Option<&mountguard_serve::Standing>,
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
        let _slot = self.enter(node)?;
        if let Some(st) = standing
            && !st.vouch(node)
        {
            let mut r = Reject::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rateLimited",
                "rate_limited",
                format!("node {node} holds too many connections; use one"),
            );
            r.retry_after = Some(1);
            r.close = true;
            return Err(r);
        }
        self.take_token(node)?;

        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let max = self.config.max_bytes;
        if declared.is_some_and(|len| len > drain_cap(max)) {
            // Far too large to be worth reading: answer at once (the client
            // may see the connection close while it is still writing).
            return Err(too_large(max));
        }
        let timeout = self.config.body_timeout;
        let body = match read_bounded(req.into_body(), max, timeout).await {
            Ok(b) => b,
            Err(BodyError::TooLarge) => return Err(too_large(max)),
            Err(BodyError::TimedOut) => {
                let mut r = Reject::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "bodyTimeout",
                    "body_timeout",
                    format!(
                        "the body did not arrive within {}s plus 1s per {} KiB (--report-body-timeout)",
                        timeout.as_secs_f64(),
                        MIN_BODY_RATE >> 10
                    ),
                );
                r.close = true;
                return Err(r);
            }
            Err(BodyError::Read(e)) => {
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
        let source = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
        let user = match self
            .reviewer
            .review_from(token, &self.config.audience, source)
            .await
        {
            Ok(u) => u,
            Err(AuthError::Unauthenticated(m)) => return Err(unauth(&m)),
            Err(AuthError::Throttled(m, wait)) => {
                let mut r = Reject::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rateLimited",
                    "rate_limited",
                    m,
                );
                r.retry_after = Some(wait);
                return Err(r);
            }
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
        let ds_uid = self.agents.daemonset_uid();
        let ds = &AgentDaemonSet {
            name: &self.config.agent_daemonset,
            uid: ds_uid.as_deref(),
        };
        let mut r = authorize(&user, node, sa, ds, |n| self.agents.get(n));
        if let Err(d) = &r
            && d.may_be_cache_miss()
            && let Some(f) = &self.fetcher
            && let Some(name) = user
                .extra
                .get(crate::runtime::token_review::EXTRA_POD_NAME)
                .and_then(|v| v.first())
            && let Some(p) = f.fetch(name).await
        {
            if p.controlled_by_name(ds.name) {
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

    /// Counts a report of `node` in flight, or refuses it when the node
    /// has [`ReportConfig::node_in_flight`] already.
    fn enter(&self, node: &str) -> Result<NodeSlot<'_>, Reject> {
        let limit = self.config.node_in_flight.max(1);
        let mut map = self.node_in_flight.lock().unwrap();
        let n = map.entry(node.to_string()).or_insert(0);
        if *n >= limit {
            let mut r = Reject::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rateLimited",
                "rate_limited",
                format!("node {node} has {limit} reports in flight; retry after 1s"),
            );
            r.retry_after = Some(1);
            r.close = true;
            return Err(r);
        }
        *n += 1;
        Ok(NodeSlot {
            map: &self.node_in_flight,
            node: node.to_string(),
        })
    }

    fn take_token(&self, node: &str) -> Result<(), Reject> {
        let rate = self.config.rate;
        let now = Instant::now();
        let mut book = self.book.lock().unwrap();
        let b = book.entry(node.to_string()).or_insert_with(|| NodeBook {
            generation: None,
            bucket: TokenBucket::full(rate.burst, now),
        });
        if let Err(wait) = b.bucket.take(rate.per_second, rate.burst, now) {
            let mut r = Reject::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rateLimited",
                "rate_limited",
                format!("too many reports for node {node}; retry after {wait}s"),
            );
            r.retry_after = Some(wait);
            return Err(r);
        }
        Ok(())
    }

    async fn inventory(
        &self,
        node: &str,
        body: &[u8],
    ) -> Result<(ReportStatus, Option<u64>), Reject> {
        // The permit covers the parsed form from its parse on: taken after
        // the parse, every connection could hold a parsed inventory while
        // it waits.
        let permit = self.inflight.clone().acquire_owned().await.ok();
        let mut inv = NodeInventory::from_json(body)
            .map_err(|e| Reject::bad(format!("invalid inventory: {e}")))?;
        if inv.node != node {
            return Err(Reject::bad(format!(
                "inventory is for node {:?}, the path names {node:?}",
                inv.node
            )));
        }
        let marked = enforce_limits(&mut inv, &self.config.limits).map_err(Reject::bad)?;
        if marked > 0 {
            warn!(
                node,
                marked, "inventory over the count limits: those volumes or pods are not judged"
            );
        }
        let skew = clamp_to_received(&mut inv, jiff::Timestamp::now());
        if skew > CLOCK_SKEW_WARN {
            debug!(
                node,
                skew_seconds = skew.as_secs(),
                "inventory times ahead of the controller's clock clamped"
            );
        }
        self.metrics.report_clock_skew(node, skew);
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
                self.send(Input::Inventory(Box::new(inv), permit)).await?;
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
        let received = jiff::Timestamp::now();
        let scanned_at = hb.scanned_at.min(received);
        self.metrics
            .report_clock_skew(node, ahead_by(hb.scanned_at, received));
        match held {
            Some(h) if hb.generation < h => Err(stale(hb.generation, h)),
            Some(h) if hb.generation == h => {
                self.send(Input::Heartbeat {
                    node: node.to_string(),
                    generation: h,
                    scanned_at,
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

/// Serves the report API until shutdown: TLS when `tls` is given, else
/// plain HTTP/1.1, with the shared bounded loop (timeouts, connection
/// cap; see `mountguard-serve`). Open connections get a bounded graceful
/// drain.
pub async fn serve(
    listener: tokio::net::TcpListener,
    tls: Option<crate::runtime::tls::ReloadingCert>,
    handler: Arc<ReportHandler>,
    limits: mountguard_serve::Limits,
    metrics: mountguard_serve::ServeMetrics,
    mut shutdown: Shutdown,
) {
    let make = move |peer: std::net::SocketAddr| {
        let h = handler.clone();
        hyper::service::service_fn(move |mut req: Request<mountguard_serve::RequestBody>| {
            let h = h.clone();
            req.extensions_mut().insert(PeerAddr(peer));
            async move { Ok::<_, Infallible>(h.handle(req).await) }
        })
    };
    let stop = async move { shutdown.wait().await };
    match tls {
        None => {
            mountguard_serve::serve(
                "report",
                listener,
                limits,
                mountguard_serve::Plain,
                metrics,
                make,
                stop,
            )
            .await
        }
        Some(c) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(c.server_config()));
            mountguard_serve::serve(
                "report",
                listener,
                limits,
                crate::runtime::tls::Handshake(acceptor),
                metrics,
                make,
                stop,
            )
            .await
        }
    }
}

#[cfg(test)]
mod tests;
