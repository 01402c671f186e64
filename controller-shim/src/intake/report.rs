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
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use hyper::body::Bytes;
use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::{
    ErrorBody, HEARTBEAT_SCHEMA, Heartbeat, ReportResponse, ReportStatus,
};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::eval::Input;
use crate::intake::auth::{
    AgentDaemonSet, AgentPods, AuthError, PodFetcher, ServiceAccountRef, TokenReviewer, authorize,
};
use crate::runtime::limits::{RateLimit, TokenBucket};
use crate::runtime::shutdown::Shutdown;
use crate::state::Shared;

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
    /// Longest time a body may take to arrive, plus one second per
    /// [`MIN_BODY_RATE`] bytes received (`--report-body-timeout`).
    pub body_timeout: Duration,
    /// Reports of one node handled at once at most (and connections one
    /// node holds, with the serve loop's [`mountguard_serve::Standing`]).
    pub node_in_flight: usize,
}

/// Default of [`ReportConfig::node_in_flight`]: an agent sends one report
/// at a time.
pub const NODE_IN_FLIGHT: usize = 4;

/// hyper's read buffer limit on the report port, which bounds a request
/// head: its minimum, 8 KiB, not the 16 KiB of the small ports. An agent's
/// request head is a projected service account token (about 1-2 KiB) and a
/// few fields. hyper's read buffer grows towards this limit while it reads
/// a large body (an inventory) and keeps what it grew to (hyper
/// `src/proto/h1/io.rs`, `Buffered::poll_read_from_io` and
/// `ReadStrategy::record`), and every agent
/// keeps its connection open between heartbeats, so the limit also bounds
/// what each idle agent connection holds after its last inventory.
pub const READ_BUFFER: usize = 8 * 1024;

/// The report port's serve limits: the header-read and idle timeouts and
/// the connection cap given, half of it for the connections of one source
/// address that no authorized report came on, [`READ_BUFFER`], and
/// [`NODE_IN_FLIGHT`] connections per node vouched for. Refused and
/// unproven connections are shed first (the serve loop's rule for every
/// listener).
pub fn limits(
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
) -> mountguard_serve::Limits {
    mountguard_serve::Limits {
        header_read_timeout,
        idle_timeout,
        max_connections,
        // Agents' connections are vouched for and not counted: nodes
        // behind one address (SNAT) still get in.
        per_source: (max_connections / 2).max(1),
        max_buf_size: READ_BUFFER,
        per_identity: NODE_IN_FLIGHT,
        ..mountguard_serve::Limits::small()
    }
}

/// The rate a body must keep up beyond the body timeout: each this many
/// bytes received extend its deadline by one second.
pub const MIN_BODY_RATE: u64 = 64 << 10;

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
                .get(crate::intake::auth::EXTRA_POD_NAME)
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
        self.shared.metrics.report_clock_skew(node, skew);
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
        self.shared
            .metrics
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

/// Clock skew above which a clamp is logged.
const CLOCK_SKEW_WARN: Duration = Duration::from_secs(5);

/// How far `t` is ahead of `received` (zero when it is not).
fn ahead_by(t: jiff::Timestamp, received: jiff::Timestamp) -> Duration {
    Duration::try_from(t.duration_since(received)).unwrap_or(Duration::ZERO)
}

/// The agent's clock is not trusted: every time in an inventory that lies
/// ahead of the controller's clock at receipt (`scannedAt`, a volume's
/// `writtenAt`) is clamped to the receipt time, so a node's inventory ages
/// and a mismatch is timed on the controller's clock. A time behind it is
/// kept (it only makes the inventory look older: the safe direction).
/// Returns how far `scannedAt` was ahead.
pub fn clamp_to_received(inv: &mut NodeInventory, received: jiff::Timestamp) -> Duration {
    let skew = ahead_by(inv.scanned_at, received);
    inv.scanned_at = inv.scanned_at.min(received);
    for p in &mut inv.pods {
        for v in &mut p.volumes {
            if let Some(w) = v.written_at.as_mut() {
                *w = (*w).min(received);
            }
        }
    }
    skew
}

/// How many bytes of an oversized body are read and discarded before the
/// 413 is sent. Answering without reading makes the kernel reset the
/// connection while the client is still writing, so an agent whose
/// inventory outgrew `--max-report-bytes` would log a broken pipe instead
/// of the reason. Only authenticated, authorized and rate-limited callers
/// get this far.
fn drain_cap(max: u64) -> u64 {
    max.saturating_mul(4).clamp(8 << 20, 64 << 20)
}

/// The longest time spent discarding an oversized body.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

enum BodyError {
    TooLarge,
    TimedOut,
    Read(Box<dyn std::error::Error + Send + Sync>),
}

/// When a body that started at `start` must have arrived, `seen` bytes of
/// it received: `timeout` after the start, one second later per
/// [`MIN_BODY_RATE`] bytes (pure).
pub fn body_deadline(
    start: tokio::time::Instant,
    timeout: Duration,
    seen: u64,
) -> tokio::time::Instant {
    start + timeout + Duration::from_secs_f64(seen as f64 / MIN_BODY_RATE as f64)
}

/// Reads a body of at most `max` bytes by its [`body_deadline`]. A longer
/// body is read on (and thrown away) up to [`drain_cap`] bytes or
/// [`DRAIN_TIMEOUT`] so the 413 reaches the client, then reported as too
/// large.
async fn read_bounded<B>(body: B, max: u64, timeout: Duration) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut body = std::pin::pin!(body);
    let mut buf: Vec<u8> = Vec::new();
    let mut seen: u64 = 0;
    let start = tokio::time::Instant::now();
    loop {
        let next = tokio::time::timeout_at(body_deadline(start, timeout, seen), body.frame());
        let frame = match next.await {
            Err(_) => return Err(BodyError::TimedOut),
            Ok(None) => break,
            Ok(Some(Ok(f))) => f,
            Ok(Some(Err(e))) => return Err(BodyError::Read(e.into())),
        };
        if let Ok(data) = frame.into_data() {
            seen = seen.saturating_add(data.len() as u64);
            if seen > max {
                break;
            }
            buf.extend_from_slice(&data);
        }
    }
    if seen <= max {
        return Ok(Bytes::from(buf));
    }
    drop(buf);
    let cap = drain_cap(max);
    let drain = async {
        while seen <= cap {
            match body.frame().await {
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data() {
                        seen = seen.saturating_add(d.len() as u64);
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, drain).await;
    Err(BodyError::TooLarge)
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

/// Applies the count limits to an inventory. Only the pod count (and an
/// overlong pod UID) refuses the whole inventory: a volume over the file
/// cap, or with an overlong path, loses its files and carries a
/// `tooLarge` error instead (so it is Unverifiable on its own), and a pod
/// over the volume cap loses its volumes and subPaths and carries a pod
/// error (all its subjects Unverifiable). The rest of the node stays
/// judged: one tenant's oversized ConfigMap cannot blind a node. Returns
/// how many volumes or pods were marked.
pub fn enforce_limits(inv: &mut NodeInventory, l: &CountLimits) -> Result<usize, String> {
    use mountguard_inventory::{ReadError, ReadErrorKind};
    if inv.pods.len() > l.pods {
        return Err(format!(
            "{} pods, at most {} allowed",
            inv.pods.len(),
            l.pods
        ));
    }
    let long = |s: &str| s.len() > l.path_len;
    let refused = |message: String| ReadError {
        path: String::new(),
        kind: ReadErrorKind::TooLarge,
        message,
    };
    let mut marked = 0;
    for p in &mut inv.pods {
        if long(&p.uid) {
            return Err("pod uid too long".into());
        }
        if p.errors.len() > l.volumes_per_pod || p.errors.iter().any(|e| long(&e.path)) {
            p.errors = vec![refused(format!(
                "more than {} pod errors or an error path over {} bytes; not judged",
                l.volumes_per_pod, l.path_len
            ))];
        }
        let too_many = p.volumes.len() > l.volumes_per_pod || p.sub_paths.len() > l.volumes_per_pod;
        let long_names = p.volumes.iter().any(|v| long(&v.name))
            || p.sub_paths
                .iter()
                .any(|s| long(&s.volume) || long(&s.container));
        if too_many || long_names {
            let message = format!(
                "the pod has {} volumes and {} subPaths (at most {} each) or a name over {} bytes; the controller refused them, the pod is not judged",
                p.volumes.len(),
                p.sub_paths.len(),
                l.volumes_per_pod,
                l.path_len
            );
            p.volumes.clear();
            p.sub_paths.clear();
            p.errors.push(refused(message));
            marked += 1;
            continue;
        }
        for v in &mut p.volumes {
            let over = v.files.len() > l.files_per_volume || v.errors.len() > l.files_per_volume;
            let long_path =
                v.files.keys().any(|k| long(k)) || v.errors.iter().any(|e| long(&e.path));
            if over || long_path {
                let message = format!(
                    "the volume has {} files and {} errors (at most {} each) or a path over {} bytes; the controller refused its content, the volume is not judged",
                    v.files.len(),
                    v.errors.len(),
                    l.files_per_volume,
                    l.path_len
                );
                v.files.clear();
                v.modes.clear();
                v.digest = None;
                v.errors = vec![refused(message)];
                marked += 1;
            }
        }
        for sp in &mut p.sub_paths {
            let over = sp.files.len() > l.files_per_volume || sp.errors.len() > l.files_per_volume;
            let long_path =
                sp.files.keys().any(|k| long(k)) || sp.errors.iter().any(|e| long(&e.path));
            if over || long_path {
                sp.files.clear();
                sp.errors = vec![refused(format!(
                    "the subPath target has more than {} files or errors, or a path over {} bytes; not judged",
                    l.files_per_volume, l.path_len
                ))];
                marked += 1;
            }
        }
    }
    Ok(marked)
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
mod tests {
    use super::*;
    use crate::intake::auth::tests::{FakeReviewer, agent_pod, agent_user};
    use crate::runtime::metrics::Metrics;
    use crate::state::Shared;
    use std::sync::atomic::Ordering;

    struct Rig {
        handler: ReportHandler,
        rx: mpsc::Receiver<Input>,
        shared: Arc<Shared>,
    }

    fn rig(max_bytes: u64, rate: RateLimit) -> Rig {
        let shared = Arc::new(Shared::new(Metrics::new()));
        shared.acting.store(true, Ordering::SeqCst);
        shared.ready.store(true, Ordering::SeqCst);
        let mut f = FakeReviewer::default();
        f.tokens
            .insert("tok-a".into(), agent_user("agent-a", "ua", Some("node-a")));
        f.tokens
            .insert("tok-b".into(), agent_user("agent-b", "ub", None));
        let agents = Arc::new(AgentPods::default());
        agents.set_daemonset_uid(Some(crate::intake::auth::tests::DS_UID.into()));
        agents.apply(agent_pod("agent-a", "ua", "node-a"));
        agents.apply(agent_pod("agent-b", "ub", "node-b"));
        let (tx, rx) = mpsc::channel(100);
        let handler = ReportHandler::new(
            ReportConfig {
                audience: "mountguard".into(),
                agent_sa: "mg:agent".parse().unwrap(),
                agent_daemonset: "agent".into(),
                max_bytes,
                rate,
                limits: CountLimits {
                    pods: 3,
                    ..Default::default()
                },
                body_timeout: Duration::from_secs(10),
                node_in_flight: NODE_IN_FLIGHT,
            },
            shared.clone(),
            Arc::new(f),
            agents,
            None,
            tx,
        );
        Rig {
            handler,
            rx,
            shared,
        }
    }

    fn inventory(node: &str, generation: u64) -> Vec<u8> {
        let mut inv = NodeInventory::new(node, "test", "2026-11-30T10:00:00Z".parse().unwrap());
        inv.generation = generation;
        serde_json::to_vec(&inv).unwrap()
    }

    fn heartbeat(node: &str, generation: u64) -> Vec<u8> {
        serde_json::to_vec(&Heartbeat::new(
            node,
            generation,
            "2026-11-30T10:00:30Z".parse().unwrap(),
        ))
        .unwrap()
    }

    fn req(path: &str, token: Option<&str>, body: Vec<u8>) -> Request<Full<Bytes>> {
        let mut b = Request::put(path).header(header::CONTENT_LENGTH, body.len());
        if let Some(t) = token {
            b = b.header(header::AUTHORIZATION, format!("Bearer {t}"));
        }
        b.body(Full::new(Bytes::from(body))).unwrap()
    }

    async fn call(
        r: &Rig,
        q: Request<Full<Bytes>>,
    ) -> (StatusCode, serde_json::Value, Option<String>) {
        let resp = r.handler.handle(q).await;
        let status = resp.status();
        let retry = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_string());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap(), retry)
    }

    fn counter(r: &Rig, result: &str) -> u64 {
        r.shared
            .metrics
            .report_requests
            .with_label_values(&[result])
            .get()
    }

    fn no_input(r: &mut Rig) {
        assert!(
            r.rx.try_recv().is_err(),
            "a rejected report reached the evaluation"
        );
    }

    const INV_A: &str = "/v1/nodes/node-a/inventory";

    /// A writer into a shared buffer, for capturing log lines.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn lines(&self, containing: &str) -> usize {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .lines()
                .filter(|l| l.contains(containing))
                .count()
        }
    }

    /// 48 unauthenticated and 48 rate-limited requests write one warning
    /// line each result, not 96; every refusal is still counted.
    #[tokio::test]
    async fn refusal_log_rate() {
        let out = Captured::default();
        let w = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || w.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        let r = rig(1 << 20, "0.001/s,1".parse().unwrap());
        for i in 0..48 {
            let (s, _, _) = call(&r, req(INV_A, Some(&format!("bad-{i}")), vec![])).await;
            assert_eq!(s, StatusCode::UNAUTHORIZED);
        }
        let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
        assert_eq!(s, StatusCode::OK);
        for _ in 0..48 {
            let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
            assert_eq!(s, StatusCode::TOO_MANY_REQUESTS);
        }
        assert_eq!(counter(&r, "unauthenticated"), 48);
        assert_eq!(counter(&r, "rate_limited"), 48);
        assert_eq!(
            out.lines("report rejected"),
            2,
            "{}",
            String::from_utf8_lossy(&out.0.lock().unwrap())
        );
        assert_eq!(out.lines("result=\"unauthenticated\""), 1);
        assert_eq!(out.lines("result=\"rate_limited\""), 1);
    }

    /// One line per result per period; the next line says how many were
    /// not logged.
    #[test]
    fn refusal_lines_summarize_what_they_did_not_log() {
        let mut log = RefusalLog::default();
        let t0 = Instant::now();
        assert_eq!(log.admit("unauthenticated", t0), Some(0));
        for i in 1..=47 {
            assert_eq!(
                log.admit("unauthenticated", t0 + Duration::from_millis(i * 100)),
                None
            );
        }
        assert_eq!(log.admit("forbidden", t0 + Duration::from_secs(1)), Some(0));
        assert_eq!(
            log.admit("unauthenticated", t0 + REFUSAL_LOG_EVERY),
            Some(47)
        );
        assert_eq!(log.admit("unauthenticated", t0 + REFUSAL_LOG_EVERY), None);
        assert_eq!(
            log.admit("unauthenticated", t0 + REFUSAL_LOG_EVERY * 3),
            Some(1)
        );
    }
    const HB_A: &str = "/v1/nodes/node-a/heartbeat";

    /// A body that sends one byte a second, forever (a chunked body).
    fn trickle(
        path: &str,
        token: &str,
    ) -> Request<impl Body<Data = Bytes, Error = std::io::Error> + use<>> {
        let stream = futures::stream::unfold((), |()| async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Some((
                Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from_static(b" "))),
                (),
            ))
        });
        Request::put(path)
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(http_body_util::StreamBody::new(stream))
            .unwrap()
    }

    /// A node's valid token trickling bodies a byte a second: each is
    /// answered 408 at the body deadline, and the node holds at most
    /// [`NODE_IN_FLIGHT`] of them; another node's heartbeat is answered
    /// meanwhile.
    #[tokio::test(start_paused = true)]
    async fn slow_body() {
        let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
        let t0 = tokio::time::Instant::now();
        let held = futures::future::join_all(
            (0..NODE_IN_FLIGHT).map(|_| r.handler.handle(trickle(HB_A, "tok-a"))),
        );
        let probe = async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let over = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
            let other = call(
                &r,
                req(
                    "/v1/nodes/node-b/heartbeat",
                    Some("tok-b"),
                    heartbeat("node-b", 1),
                ),
            )
            .await;
            (over, other, t0.elapsed())
        };
        let (held, ((s, b, retry), (other, _, _), probed)) =
            tokio::time::timeout(Duration::from_secs(60), async { tokio::join!(held, probe) })
                .await
                .expect("a trickled body held its report past the deadline");
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("rateLimited"))
        );
        assert_eq!(retry.as_deref(), Some("1"));
        assert_eq!(other, StatusCode::OK);
        assert!(probed < Duration::from_secs(3), "{probed:?}");
        for resp in &held {
            assert_eq!(resp.status(), StatusCode::REQUEST_TIMEOUT);
            assert_eq!(resp.headers()[header::CONNECTION], "close");
        }
        let took = t0.elapsed();
        assert!(took <= Duration::from_secs(11), "{took:?}");
        assert_eq!(counter(&r, "body_timeout"), NODE_IN_FLIGHT as u64);
        assert_eq!(counter(&r, "rate_limited"), 1);
        no_input(&mut r);
        // The slots are free again.
        let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 1))).await;
        assert_eq!(s, StatusCode::OK);
    }

    /// A body that keeps up the minimum rate is not cut off at the body
    /// timeout: its deadline moves one second per 64 KiB.
    #[test]
    fn the_body_deadline_moves_with_the_bytes_received() {
        let t0 = tokio::time::Instant::now();
        let d = Duration::from_secs(10);
        assert_eq!(body_deadline(t0, d, 0), t0 + d);
        assert_eq!(
            body_deadline(t0, d, MIN_BODY_RATE * 5),
            t0 + d + Duration::from_secs(5)
        );
    }

    #[tokio::test]
    async fn accepts_then_unchanged_then_conflict_and_resend() {
        let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
        // Nothing held yet: a heartbeat asks for the inventory.
        let (s, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 7))).await;
        assert_eq!((s, b["status"].as_str()), (StatusCode::OK, Some("resend")));
        no_input(&mut r);
        let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 7))).await;
        assert_eq!(
            (s, b["status"].as_str(), b["generation"].as_u64()),
            (StatusCode::OK, Some("accepted"), Some(7))
        );
        assert!(matches!(r.rx.try_recv(), Ok(Input::Inventory(i, _)) if i.generation == 7));
        let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 7))).await;
        assert_eq!(
            (s, b["status"].as_str()),
            (StatusCode::OK, Some("unchanged"))
        );
        assert!(matches!(
            r.rx.try_recv(),
            Ok(Input::Heartbeat { generation: 7, .. })
        ));
        let (s, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 7))).await;
        assert_eq!(
            (s, b["status"].as_str()),
            (StatusCode::OK, Some("unchanged"))
        );
        assert!(matches!(r.rx.try_recv(), Ok(Input::Heartbeat { .. })));
        // Older generation: 409, nothing changes.
        let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 6))).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::CONFLICT, Some("staleGeneration"))
        );
        no_input(&mut r);
        assert_eq!(r.handler.held_generation("node-a"), Some(7));
        // A newer generation is accepted; a heartbeat for an unknown newer one asks to resend.
        let (_, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 9))).await;
        assert_eq!(b["status"], "resend");
        // After a reset (new leader) the held generation is gone.
        r.handler.reset();
        let (_, b, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-a", 7))).await;
        assert_eq!(b["status"], "resend");
        assert_eq!(counter(&r, "accepted"), 1);
        assert_eq!(counter(&r, "conflict"), 1);
        assert_eq!(counter(&r, "resend"), 3);
    }

    /// The bound on parsed inventories holds from the parse on: with every
    /// permit held, a report is not even parsed (a malformed one is not
    /// answered) until one is released.
    #[tokio::test(start_paused = true)]
    async fn an_inventory_is_parsed_only_within_the_in_flight_bound() {
        let r = rig(1 << 20, "100/s,100".parse().unwrap());
        let held = r
            .handler
            .inflight
            .clone()
            .acquire_many_owned(MAX_INFLIGHT_INVENTORIES as u32)
            .await
            .unwrap();
        let bad = || req(INV_A, Some("tok-a"), b"{not json".to_vec());
        let waited = tokio::time::timeout(Duration::from_secs(5), call(&r, bad())).await;
        assert!(waited.is_err(), "parsed beyond the bound: {waited:?}");
        drop(held);
        let (s, b, _) = call(&r, bad()).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::BAD_REQUEST, Some("badRequest"))
        );
    }

    #[tokio::test]
    async fn malformed_input_is_rejected_and_changes_nothing() {
        let mut r = rig(4096, "100/s,100".parse().unwrap());
        let (s, _, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 5))).await;
        assert_eq!(s, StatusCode::OK);
        let _ = r.rx.try_recv();
        let good = String::from_utf8(inventory("node-a", 9)).unwrap();
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("not json", b"{nope".to_vec()),
            ("truncated", good.as_bytes()[..good.len() / 2].to_vec()),
            ("unknown field", good.replacen('{', r#"{"extra":1,"#, 1).into_bytes()),
            ("wrong schema", good.replace("mountguard.io/node-inventory/v1", "x/v9").into_bytes()),
            ("wrong node", inventory("node-b", 9)),
            ("bad digest", good.replacen(r#""pods":[]"#, r#""pods":[{"uid":"u","volumes":[{"plugin":"secret","name":"v","files":{"a":"zz"}}]}]"#, 1).into_bytes()),
        ];
        for (what, body) in cases {
            let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), body)).await;
            assert_eq!(s, StatusCode::BAD_REQUEST, "{what}: {b}");
            assert_eq!(b["error"], "badRequest", "{what}");
            no_input(&mut r);
        }
        // Too many pods (the limit here is 3).
        let mut inv: NodeInventory = serde_json::from_slice(&inventory("node-a", 9)).unwrap();
        for i in 0..4 {
            inv.pods.push(mountguard_inventory::PodInventory {
                uid: format!("u{i}"),
                volumes: vec![],
                sub_paths: vec![],
                errors: vec![],
            });
        }
        let (s, b, _) = call(
            &r,
            req(INV_A, Some("tok-a"), serde_json::to_vec(&inv).unwrap()),
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{b}");
        assert!(b["message"].as_str().unwrap().contains("pods"), "{b}");
        // Heartbeat with the wrong node or garbage.
        let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), heartbeat("node-b", 5))).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), b"[]".to_vec())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        // Oversized: by Content-Length, and by streaming without it.
        let big = vec![b' '; 5000];
        let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), big.clone())).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::PAYLOAD_TOO_LARGE, Some("tooLarge"))
        );
        let no_len = Request::put(INV_A)
            .header(header::AUTHORIZATION, "Bearer tok-a")
            .body(http_body_util::StreamBody::new(futures::stream::iter(
                (0..10).map(|_| {
                    Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(vec![b' '; 1000])))
                }),
            )))
            .unwrap();
        let resp = r.handler.handle(no_len).await;
        assert_eq!(resp.status(), StatusCode::PAYLOAD_TOO_LARGE);
        no_input(&mut r);
        assert_eq!(r.handler.held_generation("node-a"), Some(5));
        assert_eq!(counter(&r, "bad_request"), 9);
        assert_eq!(counter(&r, "too_large"), 2);
    }

    #[tokio::test]
    async fn an_oversized_body_is_drained_up_to_the_cap_then_refused() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let polled = Arc::new(AtomicUsize::new(0));
        let p = polled.clone();
        // 100 MiB in 1 MiB frames against a 1 MiB limit.
        let body =
            http_body_util::StreamBody::new(futures::stream::iter((0..100).map(move |_| {
                p.fetch_add(1, Ordering::SeqCst);
                Ok::<_, std::io::Error>(hyper::body::Frame::data(Bytes::from(vec![b' '; 1 << 20])))
            })));
        assert!(matches!(
            read_bounded(body, 1 << 20, Duration::from_secs(10)).await,
            Err(BodyError::TooLarge)
        ));
        // Read to the 8 MiB cap so the answer reaches the client, no further.
        let n = polled.load(Ordering::SeqCst);
        assert!((8..=10).contains(&n), "{n} frames read");
        // A body exactly at the limit is kept whole.
        let body = Full::new(Bytes::from(vec![b'x'; 1 << 20]));
        match read_bounded(body, 1 << 20, Duration::from_secs(10)).await {
            Ok(b) => assert_eq!(b.len(), 1 << 20),
            Err(_) => panic!("a body at the limit was refused"),
        }
    }

    #[tokio::test]
    async fn forged_and_unknown_tokens_are_refused() {
        let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
        // Node B's agent reporting for node A.
        let (s, b, _) = call(&r, req(INV_A, Some("tok-b"), inventory("node-a", 1))).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::FORBIDDEN, Some("forbidden"))
        );
        // Node A's token with a node-name claim for A, reporting for B.
        let (s, _, _) = call(
            &r,
            req(
                "/v1/nodes/node-b/inventory",
                Some("tok-a"),
                inventory("node-b", 1),
            ),
        )
        .await;
        assert_eq!(s, StatusCode::FORBIDDEN);
        let (s, b, _) = call(&r, req(INV_A, Some("forged"), inventory("node-a", 1))).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::UNAUTHORIZED, Some("unauthenticated"))
        );
        let (s, _, _) = call(&r, req(INV_A, None, inventory("node-a", 1))).await;
        assert_eq!(s, StatusCode::UNAUTHORIZED);
        no_input(&mut r);
        assert_eq!(r.handler.held_generation("node-a"), None);
        assert_eq!(counter(&r, "forbidden"), 2);
        assert_eq!(counter(&r, "unauthenticated"), 2);
        // Bad paths.
        let resp = r
            .handler
            .handle(req("/v1/nodes/Node_A/inventory", Some("tok-a"), vec![]))
            .await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
        // Not the acting replica.
        r.shared.acting.store(false, Ordering::SeqCst);
        let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 1))).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("notLeader"))
        );
        r.shared.acting.store(true, Ordering::SeqCst);
        r.shared.ready.store(false, Ordering::SeqCst);
        let (s, b, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 1))).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("notReady"))
        );
        no_input(&mut r);
    }

    /// An agent clock 10 minutes ahead: the times handed to the
    /// evaluation are the receipt time, so a change made a moment ago is
    /// not judged as if the grace period had passed (Propagating, not
    /// Stale), and a day-ahead heartbeat does not keep the node fresh.
    #[tokio::test]
    async fn times_ahead_of_the_controller_clock_are_clamped_to_receipt() {
        let mut r = rig(1 << 20, "100/s,100".parse().unwrap());
        let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_mins(10);
        let mut inv = NodeInventory::new("node-a", "test", ahead);
        inv.generation = 3;
        inv.pods.push(mountguard_inventory::PodInventory {
            uid: "u".into(),
            volumes: vec![mountguard_inventory::VolumeInventory {
                plugin: mountguard_inventory::Plugin::Secret,
                name: "v".into(),
                data_dir: None,
                written_at: Some(ahead),
                digest: None,
                files: Default::default(),
                modes: Default::default(),
                errors: vec![],
            }],
            sub_paths: vec![],
            errors: vec![],
        });
        let (s, _, _) = call(
            &r,
            req(INV_A, Some("tok-a"), serde_json::to_vec(&inv).unwrap()),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        let after = jiff::Timestamp::now();
        match r.rx.try_recv() {
            Ok(Input::Inventory(i, _)) => {
                assert!(i.scanned_at <= after, "scannedAt kept at {}", i.scanned_at);
                assert!(i.pods[0].volumes[0].written_at.unwrap() <= after);
            }
            _ => panic!("no inventory"),
        }
        let day = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24);
        let hb = serde_json::to_vec(&Heartbeat::new("node-a", 3, day)).unwrap();
        let (s, _, _) = call(&r, req(HB_A, Some("tok-a"), hb)).await;
        assert_eq!(s, StatusCode::OK);
        match r.rx.try_recv() {
            Ok(Input::Heartbeat { scanned_at, .. }) => {
                assert!(scanned_at <= jiff::Timestamp::now(), "{scanned_at}")
            }
            _ => panic!("no heartbeat"),
        }
        assert_eq!(r.shared.metrics.report_clock_clamped.get(), 2);
        // A time behind the controller's clock is kept as is.
        let behind: jiff::Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let mut inv = NodeInventory::new("node-a", "test", behind);
        assert_eq!(
            clamp_to_received(&mut inv, jiff::Timestamp::now()),
            Duration::ZERO
        );
        assert_eq!(inv.scanned_at, behind);
    }

    #[test]
    fn a_volume_or_pod_over_the_limits_is_marked_alone() {
        use mountguard_inventory::{PodInventory, ReadErrorKind, Sha256Hex, VolumeInventory};
        let vol = |name: &str, files: usize| VolumeInventory {
            plugin: mountguard_inventory::Plugin::Configmap,
            name: name.into(),
            data_dir: None,
            written_at: None,
            digest: None,
            files: (0..files)
                .map(|i| (format!("k{i}"), Sha256Hex([0; 32])))
                .collect(),
            modes: Default::default(),
            errors: vec![],
        };
        let l = CountLimits {
            pods: 3,
            volumes_per_pod: 2,
            files_per_volume: 4,
            path_len: 16,
        };
        let mut inv = NodeInventory::new("n", "t", jiff::Timestamp::now());
        inv.pods.push(PodInventory {
            uid: "a".into(),
            volumes: vec![vol("ok", 4), vol("huge", 5)],
            sub_paths: vec![],
            errors: vec![],
        });
        inv.pods.push(PodInventory {
            uid: "b".into(),
            volumes: vec![vol("x", 1), vol("y", 1), vol("z", 1)],
            sub_paths: vec![],
            errors: vec![],
        });
        inv.pods.push(PodInventory {
            uid: "c".into(),
            volumes: vec![vol("fine", 1), vol("a-name-longer-than-16", 1)],
            sub_paths: vec![],
            errors: vec![],
        });
        assert_eq!(enforce_limits(&mut inv, &l), Ok(3));
        let a = &inv.pods[0];
        assert_eq!(
            a.volumes[0].files.len(),
            4,
            "the volume at the limit is kept"
        );
        assert!(a.volumes[1].files.is_empty());
        assert_eq!(a.volumes[1].errors[0].kind, ReadErrorKind::TooLarge);
        assert!(inv.pods[1].volumes.is_empty());
        assert_eq!(inv.pods[1].errors[0].kind, ReadErrorKind::TooLarge);
        assert!(inv.pods[2].volumes.is_empty());
        inv.pods.push(inv.pods[0].clone());
        assert!(
            enforce_limits(&mut inv, &l).is_err(),
            "too many pods: refused whole"
        );
    }

    #[tokio::test]
    async fn per_node_rate_limit() {
        let mut r = rig(1 << 20, "0.5/s,3".parse().unwrap());
        for g in 1..=3 {
            let (s, _, _) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", g))).await;
            assert_eq!(s, StatusCode::OK);
        }
        let (s, b, retry) = call(&r, req(INV_A, Some("tok-a"), inventory("node-a", 4))).await;
        assert_eq!(
            (s, b["error"].as_str()),
            (StatusCode::TOO_MANY_REQUESTS, Some("rateLimited"))
        );
        assert_eq!(retry.as_deref(), Some("2"));
        // Another node has its own bucket.
        let (s, _, _) = call(
            &r,
            req(
                "/v1/nodes/node-b/heartbeat",
                Some("tok-b"),
                heartbeat("node-b", 1),
            ),
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(r.handler.held_generation("node-a"), Some(3));
        let mut n = 0;
        while r.rx.try_recv().is_ok() {
            n += 1;
        }
        assert_eq!(n, 3);
        assert_eq!(counter(&r, "rate_limited"), 1);
    }

    /// One request on `s` (kept alive); the status line of the answer, or
    /// `None` when the server had closed the connection.
    async fn exchange(s: &mut tokio::net::TcpStream, token: Option<&str>) -> Option<String> {
        exchange_with(s, token, "").await
    }

    /// [`exchange`] with `extra` (whole header lines) in the head.
    async fn exchange_with(
        s: &mut tokio::net::TcpStream,
        token: Option<&str>,
        extra: &str,
    ) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let body = heartbeat("node-a", 1);
        let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
        let head = format!(
            "PUT {HB_A} HTTP/1.1\r\nhost: c\r\n{auth}{extra}content-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(&[head.as_bytes(), &body].concat()).await.ok()?;
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf))
            .await
            .expect("an answer")
            .ok()?;
        (n > 0).then(|| {
            String::from_utf8_lossy(&buf[..n])
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
    }

    /// Whether the server closes `s` within `d`.
    async fn closed_within(s: &mut tokio::net::TcpStream, d: Duration) -> bool {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 512];
        loop {
            match tokio::time::timeout(d, s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }

    /// An agent's connection that sent a valid authenticated report stays
    /// open across a gap between reports longer than the header-read
    /// timeout (the heartbeat interval is longer than it), so the next
    /// heartbeat needs no new connection (no TLS handshake); a connection
    /// idle from the start, or whose request was refused, is still closed
    /// by the header-read timeout.
    #[tokio::test]
    async fn an_authenticated_agent_connection_stays_open_between_heartbeats() {
        let r = rig(1 << 20, "100/s,100".parse().unwrap());
        let Rig {
            handler,
            rx: _rx,
            shared,
        } = r;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let header_read = Duration::from_millis(300);
        let metrics = mountguard_serve::ServeMetrics::unregistered();
        let (_trigger, shutdown) = Shutdown::new();
        tokio::spawn(serve(
            listener,
            None,
            Arc::new(handler),
            limits(header_read, Duration::from_secs(3), 256),
            metrics.clone(),
            shutdown,
        ));
        let connect = || tokio::net::TcpStream::connect(addr);
        let mut agent = connect().await.unwrap();
        let mut idle = connect().await.unwrap();
        let mut refused = connect().await.unwrap();
        let first = exchange(&mut agent, Some("tok-a")).await;
        assert!(
            first.as_deref().is_some_and(|l| l.contains(" 200 ")),
            "{first:?}"
        );
        let denied = exchange(&mut refused, Some("forged")).await;
        assert!(
            denied.as_deref().is_some_and(|l| l.contains(" 401 ")),
            "{denied:?}"
        );
        // A gap of three header-read timeouts.
        tokio::time::sleep(header_read * 3).await;
        assert!(closed_within(&mut idle, Duration::from_millis(50)).await);
        assert!(closed_within(&mut refused, Duration::from_millis(50)).await);
        for _ in 0..2 {
            let next = exchange(&mut agent, Some("tok-a")).await;
            assert!(
                next.as_deref().is_some_and(|l| l.contains(" 200 ")),
                "the agent's connection was closed between heartbeats: {next:?}"
            );
            tokio::time::sleep(header_read * 3).await;
        }
        assert_eq!(metrics.timed_out.get(), 2);
        assert_eq!(counter_of(&shared, "unauthenticated"), 1);
    }

    /// The report port's read buffer bounds a request head at 8 KiB: an
    /// agent's head with a 4 KiB token (more than a projected service
    /// account token carries) is served, one of 12 KiB is refused with 431
    /// and nothing is read from it.
    #[tokio::test]
    async fn the_report_port_serves_an_agents_head_and_refuses_one_over_its_read_buffer() {
        let Rig {
            handler,
            rx: _rx,
            shared,
        } = rig(1 << 20, "100/s,100".parse().unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (_trigger, shutdown) = Shutdown::new();
        let l = limits(Duration::from_secs(3), Duration::from_secs(3), 16);
        assert_eq!(l.max_buf_size, READ_BUFFER);
        tokio::spawn(serve(
            listener,
            None,
            Arc::new(handler),
            l,
            mountguard_serve::ServeMetrics::unregistered(),
            shutdown,
        ));
        let put = |padding: usize| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            let pad = format!("x-pad: {}\r\n", "p".repeat(padding));
            exchange_with(&mut s, Some("tok-a"), &pad)
                .await
                .unwrap_or_default()
        };
        let served = put(4 * 1024).await;
        assert!(served.contains(" 200 "), "{served}");
        let refused = put(12 * 1024).await;
        assert!(refused.contains(" 431 "), "{refused}");
        // Only the first reached the handler.
        let handled: u64 = ["accepted", "unchanged", "resend"]
            .iter()
            .map(|r| counter_of(&shared, r))
            .sum();
        assert_eq!(handled, 1);
    }

    fn counter_of(shared: &Shared, result: &str) -> u64 {
        shared
            .metrics
            .report_requests
            .with_label_values(&[result])
            .get()
    }
}
