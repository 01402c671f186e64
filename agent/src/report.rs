//! Where each new inventory goes: the seam for the controller's report API.
//!
//! The daemon calls [`InventorySink::publish`] with every new inventory
//! generation and [`InventorySink::heartbeat`] once per heartbeat interval.
//! A slow sink never delays scanning: it runs in its own task and always gets
//! the latest inventory, skipping intermediate generations. While a publish
//! is under way, the daemon tells the sink about newer generations through
//! [`InventorySink::superseded`], so a pending retry of an older body is
//! dropped instead of waited out.
//!
//! [`HttpSink`] is the real sink: it speaks the report protocol of
//! `mountguard_inventory::report` to the controller (`PUT
//! /v1/nodes/{node}/inventory` and `/heartbeat`, bearer token re-read from a
//! file on every request, http or https with a CA file).

use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use jiff::Timestamp;
use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::{
    ErrorBody, Heartbeat, ReportResponse, ReportStatus, heartbeat_path, inventory_path,
};
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use tokio::sync::watch;

use crate::Error;

/// Receives the node inventory.
pub trait InventorySink: Send + Sync + 'static {
    /// Hands over a new inventory generation. An error is logged and
    /// counted; the next change or heartbeat tries again.
    fn publish(&self, inv: &NodeInventory) -> impl Future<Output = Result<(), Error>> + Send;

    /// A periodic sign of life for the current inventory, last confirmed by
    /// a rescan at `scanned_at`. The default publishes the inventory again.
    fn heartbeat(
        &self,
        inv: &NodeInventory,
        scanned_at: Timestamp,
    ) -> impl Future<Output = Result<(), Error>> + Send {
        let _ = scanned_at;
        self.publish(inv)
    }

    /// A newer generation exists than the one being published: a retry of
    /// an older body may stop. Called while `publish` runs.
    fn superseded(&self, generation: u64) {
        let _ = generation;
    }

    /// Registers the sink's metrics in the agent's registry (called once by
    /// [`crate::Daemon::start`]).
    fn register(&self, registry: &Registry) -> Result<(), Error> {
        let _ = registry;
        Ok(())
    }
}

/// A sink that only logs a summary (never content or digests).
#[derive(Debug, Default, Clone, Copy)]
pub struct LogSink;

impl InventorySink for LogSink {
    async fn publish(&self, inv: &NodeInventory) -> Result<(), Error> {
        let volumes: usize = inv.pods.iter().map(|p| p.volumes.len()).sum();
        let sub_paths: usize = inv.pods.iter().map(|p| p.sub_paths.len()).sum();
        let errors: usize = inv
            .pods
            .iter()
            .map(|p| {
                p.errors.len()
                    + p.volumes.iter().map(|v| v.errors.len()).sum::<usize>()
                    + p.sub_paths.iter().map(|s| s.errors.len()).sum::<usize>()
            })
            .sum();
        tracing::info!(
            generation = inv.generation,
            pods = inv.pods.len(),
            volumes,
            sub_paths,
            errors,
            "inventory"
        );
        Ok(())
    }
}

/// Default token file (the projected service-account token, audience
/// `mountguard`).
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/mountguard/token";
/// Default heartbeat interval.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);
/// Largest response body read from the controller.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Retry timing of [`HttpSink`]: jittered exponential backoff, bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay (before jitter).
    pub initial: Duration,
    /// Largest delay (before jitter).
    pub max: Duration,
    /// Smallest delay after a 401/403: the token may be rotating, do not
    /// hammer the controller (and its TokenReviews).
    pub auth_min: Duration,
    /// Retries of one body stop once this much time has passed since its
    /// first attempt; the next heartbeat picks up from there.
    pub window: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            auth_min: Duration::from_secs(10),
            window: DEFAULT_HEARTBEAT_INTERVAL,
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0 = first retry): `initial *
    /// 2^attempt`, capped at `max`, then scaled by `0.5 + 0.5 * unit` (`unit`
    /// in `[0, 1)`, the jitter), so every delay lies in `[base/2, base)`.
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
            .min(self.max);
        base.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// Where and how [`HttpSink`] reports.
#[derive(Debug, Clone)]
pub struct HttpSinkConfig {
    /// The controller's report URL (`http://` or `https://`, scheme and
    /// authority; a path is ignored).
    pub controller_url: Uri,
    /// This node's name (the `{node}` in the paths).
    pub node: String,
    /// File holding the bearer token; re-read on every request.
    pub token_file: PathBuf,
    /// PEM file with the CA certificate(s) to trust for https.
    pub ca_file: Option<PathBuf>,
    /// Bound on one request, connection included.
    pub request_timeout: Duration,
    /// Retry timing.
    pub backoff: Backoff,
}

impl HttpSinkConfig {
    /// Defaults: token file [`DEFAULT_TOKEN_FILE`], no CA file, 10 s
    /// timeout, default backoff.
    pub fn new(controller_url: Uri, node: impl Into<String>) -> Self {
        Self {
            controller_url,
            node: node.into(),
            token_file: PathBuf::from(DEFAULT_TOKEN_FILE),
            ca_file: None,
            request_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
        }
    }
}

/// Report metrics (`mountguard_agent_report*`).
#[derive(Debug, Clone)]
struct ReportMetrics {
    reports: IntCounterVec,
    duration: Histogram,
    last_report: Gauge,
}

impl ReportMetrics {
    fn new() -> Result<Self, Error> {
        let reports = IntCounterVec::new(
            Opts::new(
                "mountguard_agent_reports_total",
                "Reports sent to the controller, by kind (inventory, heartbeat) and result \
                 (accepted, unchanged, resend, error = no answer or 5xx, rejected = 4xx).",
            ),
            &["kind", "result"],
        )?;
        for kind in ["inventory", "heartbeat"] {
            for result in ["accepted", "unchanged", "resend", "error", "rejected"] {
                reports.with_label_values(&[kind, result]);
            }
        }
        let duration = Histogram::with_opts(
            HistogramOpts::new(
                "mountguard_agent_report_duration_seconds",
                "Wall time of one report request, connection included.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        let last_report = Gauge::with_opts(Opts::new(
            "mountguard_agent_last_report_timestamp_seconds",
            "Unix time of the last report the controller answered with 200.",
        ))?;
        Ok(Self {
            reports,
            duration,
            last_report,
        })
    }
}

/// The kind of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Inventory,
    Heartbeat,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Inventory => "inventory",
            Kind::Heartbeat => "heartbeat",
        }
    }
}

/// What one request ended in.
#[derive(Debug)]
enum Outcome {
    /// 200 with a report response.
    Done(ReportStatus),
    /// 409: the controller holds a newer generation; drop this body.
    Conflict(String),
    /// 400 or 413 (or another 4xx): resending the same body cannot help.
    Fatal(String),
    /// 401 or 403: retry slowly.
    Auth(String),
    /// 429: wait as told.
    RetryAfter(Duration, String),
    /// No answer, timeout, 5xx, unreadable token file: retry with backoff.
    Transient(String),
}

/// Reports to the controller over http or https. See the module docs.
#[derive(Debug, Clone)]
pub struct HttpSink {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    base: Uri,
    node: String,
    token_file: PathBuf,
    request_timeout: Duration,
    backoff: Backoff,
    newest: watch::Sender<u64>,
    metrics: ReportMetrics,
}

impl HttpSink {
    /// Builds the client. Fails on a URL without scheme or host, an unknown
    /// scheme, https without a CA file, or a CA file without a usable
    /// certificate.
    pub fn new(cfg: HttpSinkConfig) -> Result<Self, Error> {
        let HttpSinkConfig {
            controller_url,
            node,
            token_file,
            ca_file,
            request_timeout,
            backoff,
        } = cfg;
        let bad_url = |reason: &str| {
            Error::ReportConfig(format!(
                "--controller-url {controller_url}: {reason}; use e.g. https://{}.{}.svc:8443",
                mountguard_inventory::names::controller(mountguard_inventory::names::RELEASE),
                mountguard_inventory::names::NAMESPACE
            ))
        };
        let scheme = controller_url
            .scheme_str()
            .ok_or_else(|| bad_url("no scheme"))?;
        let authority = controller_url
            .authority()
            .ok_or_else(|| bad_url("no host"))?
            .clone();
        match scheme {
            "http" => {}
            "https" if ca_file.is_none() => {
                return Err(bad_url(
                    "https needs --ca-file (the CA that signed the controller's certificate)",
                ));
            }
            "https" => {}
            _ => return Err(bad_url("the scheme must be http or https")),
        }
        let mut roots = rustls::RootCertStore::empty();
        if let Some(path) = &ca_file {
            use rustls::pki_types::CertificateDer;
            use rustls::pki_types::pem::PemObject as _;
            let bad_ca = |reason: String| {
                Error::ReportConfig(format!(
                    "--ca-file {}: {reason}; give a PEM file with the CA certificate",
                    path.display()
                ))
            };
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad_ca(e.to_string()))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| bad_ca(e.to_string()))?;
            let (added, _) = roots.add_parsable_certificates(certs);
            if added == 0 {
                return Err(bad_ca("no usable certificate".into()));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| Error::ReportConfig(format!("TLS setup: {e}")))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(request_timeout));
        http.set_nodelay(true);
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        let base = Uri::builder()
            .scheme(scheme)
            .authority(authority)
            .path_and_query("/")
            .build()
            .map_err(|e| bad_url(&e.to_string()))?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                base,
                node,
                token_file,
                request_timeout,
                backoff,
                newest: watch::Sender::new(0),
                metrics: ReportMetrics::new()?,
            }),
        })
    }

    fn url(&self, path: &str) -> Result<Uri, Error> {
        let b = &self.inner.base;
        Uri::builder()
            .scheme(b.scheme_str().unwrap_or("http"))
            .authority(b.authority().map(|a| a.as_str()).unwrap_or_default())
            .path_and_query(path)
            .build()
            .map_err(|e| {
                Error::Publish(format!(
                    "bad report URL for node {:?}: {e}",
                    self.inner.node
                ))
            })
    }

    /// One request; never retries.
    async fn send(&self, kind: Kind, path: &str, body: Bytes) -> Outcome {
        let inner = &*self.inner;
        let started = Instant::now();
        let outcome = self.send_inner(path, body).await;
        inner
            .metrics
            .duration
            .observe(started.elapsed().as_secs_f64());
        let result = match &outcome {
            Outcome::Done(ReportStatus::Accepted) => "accepted",
            Outcome::Done(ReportStatus::Unchanged) => "unchanged",
            Outcome::Done(ReportStatus::Resend) => "resend",
            Outcome::Transient(_) => "error",
            Outcome::Conflict(_)
            | Outcome::Fatal(_)
            | Outcome::Auth(_)
            | Outcome::RetryAfter(..) => "rejected",
        };
        inner
            .metrics
            .reports
            .with_label_values(&[kind.as_str(), result])
            .inc();
        if let Outcome::Done(_) = outcome {
            inner
                .metrics
                .last_report
                .set(Timestamp::now().as_millisecond() as f64 / 1000.0);
        }
        outcome
    }

    async fn send_inner(&self, path: &str, body: Bytes) -> Outcome {
        let inner = &*self.inner;
        // Re-read on every request: the kubelet rotates the projected token.
        let token = match std::fs::read_to_string(&inner.token_file) {
            Ok(t) if !t.trim().is_empty() => t.trim().to_string(),
            Ok(_) => {
                return Outcome::Transient(format!(
                    "token file {} is empty",
                    inner.token_file.display()
                ));
            }
            Err(e) => {
                return Outcome::Transient(format!(
                    "token file {}: {e}; check --token-file and the projected token volume",
                    inner.token_file.display()
                ));
            }
        };
        let uri = match self.url(path) {
            Ok(u) => u,
            Err(e) => return Outcome::Fatal(e.to_string()),
        };
        let req = Request::put(uri)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .header(
                header::USER_AGENT,
                concat!("mountguard-agent/", env!("CARGO_PKG_VERSION")),
            )
            .body(Full::new(body));
        let req = match req {
            Ok(r) => r,
            Err(e) => return Outcome::Fatal(format!("building the request: {e}")),
        };
        let exchange = async {
            let resp = inner.client.request(req).await.map_err(|e| {
                let mut msg = e.to_string();
                let mut src = std::error::Error::source(&e);
                while let Some(s) = src {
                    msg.push_str(": ");
                    msg.push_str(&s.to_string());
                    src = s.source();
                }
                msg
            })?;
            let (parts, body) = resp.into_parts();
            let bytes = Limited::new(body, MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| format!("reading the response: {e}"))?
                .to_bytes();
            Ok::<_, String>((parts, bytes))
        };
        let (parts, bytes) = match tokio::time::timeout(inner.request_timeout, exchange).await {
            Err(_) => {
                return Outcome::Transient(format!("no answer within {:?}", inner.request_timeout));
            }
            Ok(Err(e)) => return Outcome::Transient(e),
            Ok(Ok(v)) => v,
        };
        let status = parts.status;
        if status == StatusCode::OK {
            return match serde_json::from_slice::<ReportResponse>(&bytes) {
                Ok(r) => Outcome::Done(r.status),
                Err(e) => Outcome::Transient(format!("200 with an unreadable body: {e}")),
            };
        }
        let detail = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(b) => format!("{} {}: {}", status.as_u16(), b.error, b.message),
            Err(_) => format!(
                "{} {}",
                status.as_u16(),
                String::from_utf8_lossy(&bytes[..bytes.len().min(200)])
            ),
        };
        match status {
            StatusCode::CONFLICT => Outcome::Conflict(detail),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Outcome::Auth(detail),
            StatusCode::TOO_MANY_REQUESTS => {
                let wait = parts
                    .headers
                    .get(header::RETRY_AFTER)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(Duration::from_secs)
                    .unwrap_or(Duration::from_secs(1));
                Outcome::RetryAfter(wait, detail)
            }
            s if s.is_server_error() => Outcome::Transient(detail),
            _ => Outcome::Fatal(detail),
        }
    }

    /// Sends `body` until the controller answers, the body is superseded by
    /// a newer generation, or the retry window is over.
    async fn deliver(&self, kind: Kind, generation: u64, body: Bytes) -> Result<(), Error> {
        let inner = &*self.inner;
        let path = match kind {
            Kind::Inventory => inventory_path(&inner.node),
            Kind::Heartbeat => heartbeat_path(&inner.node),
        };
        let mut newest = inner.newest.subscribe();
        let first = Instant::now();
        let mut attempt = 0u32;
        loop {
            let outcome = self.send(kind, &path, body.clone()).await;
            let (delay, last) = match outcome {
                Outcome::Done(status) => {
                    tracing::debug!(kind = kind.as_str(), generation, ?status, "report sent");
                    return Ok(());
                }
                Outcome::Conflict(_) => {
                    log_failure(kind, generation, &outcome, &inner.token_file);
                    return Ok(());
                }
                Outcome::Fatal(ref detail) => {
                    log_failure(kind, generation, &outcome, &inner.token_file);
                    return Err(Error::Publish(detail.clone()));
                }
                Outcome::Auth(ref detail) => {
                    log_failure(kind, generation, &outcome, &inner.token_file);
                    let d = inner
                        .backoff
                        .delay(attempt, jitter())
                        .max(inner.backoff.auth_min);
                    (d, detail.clone())
                }
                Outcome::RetryAfter(wait, ref detail) => {
                    log_failure(kind, generation, &outcome, &inner.token_file);
                    (wait, detail.clone())
                }
                Outcome::Transient(ref detail) => {
                    log_failure(kind, generation, &outcome, &inner.token_file);
                    (inner.backoff.delay(attempt, jitter()), detail.clone())
                }
            };
            if first.elapsed() + delay > inner.backoff.window {
                return Err(Error::Publish(format!(
                    "gave up after {} attempts: {last}",
                    attempt + 1
                )));
            }
            attempt += 1;
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                _ = newest.wait_for(|g| *g > generation) => {
                    tracing::debug!(generation, "a newer generation supersedes the pending retry");
                    return Ok(());
                }
            }
        }
    }
}

impl InventorySink for HttpSink {
    async fn publish(&self, inv: &NodeInventory) -> Result<(), Error> {
        let body = serde_json::to_vec(inv)
            .map_err(|e| Error::Publish(format!("encoding the inventory: {e}")))?;
        self.deliver(Kind::Inventory, inv.generation, Bytes::from(body))
            .await
    }

    async fn heartbeat(&self, inv: &NodeInventory, scanned_at: Timestamp) -> Result<(), Error> {
        let hb = Heartbeat::new(self.inner.node.clone(), inv.generation, scanned_at);
        let body = serde_json::to_vec(&hb)
            .map_err(|e| Error::Publish(format!("encoding the heartbeat: {e}")))?;
        let path = heartbeat_path(&self.inner.node);
        match self
            .send(Kind::Heartbeat, &path, Bytes::from(body.clone()))
            .await
        {
            Outcome::Done(ReportStatus::Resend) => {
                tracing::info!(
                    generation = inv.generation,
                    "the controller does not hold this node's inventory; sending it"
                );
                self.publish(inv).await
            }
            Outcome::Done(_) => Ok(()),
            // No retry for a heartbeat: the next heartbeat is the retry.
            other => {
                log_failure(
                    Kind::Heartbeat,
                    inv.generation,
                    &other,
                    &self.inner.token_file,
                );
                match other {
                    Outcome::Conflict(_) => Ok(()),
                    Outcome::Fatal(d)
                    | Outcome::Auth(d)
                    | Outcome::RetryAfter(_, d)
                    | Outcome::Transient(d) => Err(Error::Publish(d)),
                    Outcome::Done(_) => Ok(()),
                }
            }
        }
    }

    fn superseded(&self, generation: u64) {
        self.inner.newest.send_if_modified(|g| {
            if generation > *g {
                *g = generation;
                true
            } else {
                false
            }
        });
    }

    fn register(&self, registry: &Registry) -> Result<(), Error> {
        let m = &self.inner.metrics;
        registry.register(Box::new(m.reports.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        registry.register(Box::new(m.last_report.clone()))?;
        Ok(())
    }
}

/// Logs a failed report at the level it deserves.
fn log_failure(kind: Kind, generation: u64, outcome: &Outcome, token_file: &std::path::Path) {
    let kind = kind.as_str();
    match outcome {
        Outcome::Done(_) => {}
        Outcome::Conflict(detail) => tracing::info!(
            kind,
            generation,
            %detail,
            "the controller holds a newer generation; dropping this report"
        ),
        Outcome::Fatal(detail) => tracing::error!(
            kind,
            generation,
            %detail,
            "the controller refused the report; not retrying this body (a 413 means the \
             controller's --max-report-bytes is too small for this node)"
        ),
        Outcome::Auth(detail) => tracing::error!(
            kind,
            generation,
            %detail,
            token_file = %token_file.display(),
            "the controller did not accept the agent's token; check the token audience, the \
             agent's ServiceAccount and the controller's --agent-daemonset; retrying slowly"
        ),
        Outcome::RetryAfter(wait, detail) => tracing::warn!(
            kind,
            generation,
            %detail,
            retry_after_s = wait.as_secs(),
            "rate limited by the controller"
        ),
        Outcome::Transient(detail) => {
            tracing::warn!(kind, generation, %detail, "report failed")
        }
    }
}

/// A jitter value in `[0, 1)` (not cryptographic).
fn jitter() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::net::SocketAddr;
    use std::sync::Mutex;

    use hyper::Response;
    use hyper::body::Incoming;
    use mountguard_inventory::report::HEARTBEAT_SCHEMA;

    use super::*;

    /// One request as the test server saw it.
    #[derive(Debug, Clone)]
    struct Seen {
        method: String,
        path: String,
        auth: String,
        content_type: String,
        body: Vec<u8>,
        at: Instant,
    }

    /// A scripted reply: status, optional Retry-After, body.
    #[derive(Debug, Clone)]
    struct Reply(u16, Option<u64>, String);

    fn ok(status: &str) -> Reply {
        Reply(
            200,
            None,
            format!(r#"{{"status":"{status}","generation":1}}"#),
        )
    }

    fn err(code: u16, error: &str) -> Reply {
        Reply(
            code,
            None,
            format!(r#"{{"error":"{error}","message":"test"}}"#),
        )
    }

    /// A loopback controller stand-in that records requests and answers
    /// from a script (the last reply repeats).
    struct TestServer {
        addr: SocketAddr,
        seen: Arc<Mutex<Vec<Seen>>>,
        _server: mountguard_serve::test_server::TestServer,
    }

    impl TestServer {
        async fn start(script: Vec<Reply>) -> Self {
            let seen = Arc::new(Mutex::new(Vec::new()));
            let script = Arc::new(Mutex::new(VecDeque::from(script)));
            let (seen2, script2) = (seen.clone(), script.clone());
            let server = mountguard_serve::test_server::TestServer::start(
                move |req: hyper::Request<Incoming>| {
                    let (seen, script) = (seen2.clone(), script2.clone());
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body.collect().await.unwrap().to_bytes().to_vec();
                        let h = |n: header::HeaderName| {
                            parts
                                .headers
                                .get(n)
                                .and_then(|v| v.to_str().ok())
                                .unwrap_or("")
                                .to_string()
                        };
                        seen.lock().unwrap().push(Seen {
                            method: parts.method.to_string(),
                            path: parts.uri.path().to_string(),
                            auth: h(header::AUTHORIZATION),
                            content_type: h(header::CONTENT_TYPE),
                            body,
                            at: Instant::now(),
                        });
                        let Reply(code, retry, text) = {
                            let mut s = script.lock().unwrap();
                            if s.len() > 1 {
                                s.pop_front().unwrap()
                            } else {
                                s.front().cloned().unwrap()
                            }
                        };
                        let mut resp = Response::builder()
                            .status(code)
                            .header("content-type", "application/json");
                        if let Some(r) = retry {
                            resp = resp.header("retry-after", r.to_string());
                        }
                        resp.body(Full::new(Bytes::from(text))).unwrap()
                    }
                },
            )
            .await
            .unwrap();
            Self {
                addr: server.addr(),
                seen,
                _server: server,
            }
        }

        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().unwrap().clone()
        }

        async fn wait_for_requests(&self, n: usize) -> Vec<Seen> {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let s = self.seen();
                if s.len() >= n {
                    return s;
                }
                assert!(Instant::now() < deadline, "only {} requests", s.len());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }

    struct Fixture {
        server: TestServer,
        sink: HttpSink,
        registry: Registry,
        token: PathBuf,
        _dir: tempfile::TempDir,
    }

    async fn fixture(script: Vec<Reply>, backoff: Backoff) -> Fixture {
        let server = TestServer::start(script).await;
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "token-one\n").unwrap();
        let mut cfg =
            HttpSinkConfig::new(format!("http://{}", server.addr).parse().unwrap(), "node-a");
        cfg.token_file = token.clone();
        cfg.request_timeout = Duration::from_secs(5);
        cfg.backoff = backoff;
        let sink = HttpSink::new(cfg).unwrap();
        let registry = Registry::new();
        sink.register(&registry).unwrap();
        Fixture {
            server,
            sink,
            registry,
            token,
            _dir: dir,
        }
    }

    fn quick() -> Backoff {
        Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(100),
            auth_min: Duration::from_millis(300),
            window: Duration::from_secs(10),
        }
    }

    fn inventory(generation: u64) -> NodeInventory {
        let mut inv = NodeInventory::new("node-a", "test", "2026-11-30T08:00:00Z".parse().unwrap());
        inv.generation = generation;
        inv
    }

    fn count(reg: &Registry, kind: &str, result: &str) -> u64 {
        for mf in reg.gather() {
            if mf.name() != "mountguard_agent_reports_total" {
                continue;
            }
            for m in mf.get_metric() {
                let labels: Vec<(&str, &str)> = m
                    .get_label()
                    .iter()
                    .map(|l| (l.name(), l.value()))
                    .collect();
                if labels.contains(&("kind", kind)) && labels.contains(&("result", result)) {
                    return m.get_counter().get_value() as u64;
                }
            }
        }
        panic!("no reports_total{{kind={kind},result={result}}}")
    }

    /// The sink keeps its connection to the controller between
    /// heartbeats (a pooled client, every answer read to its end), and the
    /// controller's serve loop keeps a connection whose request it vouched
    /// for open past its header-read timeout: heartbeats further apart than
    /// that timeout share one connection, so one TLS handshake.
    #[tokio::test]
    async fn heartbeats_share_one_connection_across_gaps_longer_than_the_header_read_timeout() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let counted = connections.clone();
        let header_read = Duration::from_millis(200);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(mountguard_serve::serve(
            "report",
            listener,
            mountguard_serve::Limits {
                header_read_timeout: header_read,
                idle_timeout: Duration::from_secs(5),
                ..mountguard_serve::Limits::small()
            },
            mountguard_serve::Plain,
            mountguard_serve::ServeMetrics::unregistered(),
            move |_| {
                counted.fetch_add(1, Ordering::SeqCst);
                hyper::service::service_fn(
                    |req: hyper::Request<mountguard_serve::RequestBody>| async move {
                        // As the controller does for an authenticated node.
                        if let Some(st) = req.extensions().get::<mountguard_serve::Standing>() {
                            st.vouch("node-a");
                        }
                        let _ = req.into_body().collect().await;
                        let body = r#"{"status":"unchanged","generation":1}"#;
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body)))
                                .unwrap(),
                        )
                    },
                )
            },
            async {
                let _ = stopped.await;
            },
        ));
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "token-one\n").unwrap();
        let mut cfg = HttpSinkConfig::new(format!("http://{addr}").parse().unwrap(), "node-a");
        cfg.token_file = token;
        cfg.request_timeout = Duration::from_secs(5);
        let sink = HttpSink::new(cfg).unwrap();
        let inv = inventory(1);
        for _ in 0..3 {
            sink.heartbeat(&inv, Timestamp::now()).await.unwrap();
            tokio::time::sleep(header_read * 3).await;
        }
        assert_eq!(connections.load(Ordering::SeqCst), 1, "one connection");
        let _ = stop.send(());
    }

    #[tokio::test]
    async fn requests_carry_path_token_and_schema_and_the_token_is_reread() {
        let f = fixture(vec![ok("accepted"), ok("unchanged")], quick()).await;
        let inv = inventory(3);
        f.sink.publish(&inv).await.unwrap();
        std::fs::write(&f.token, "token-two").unwrap();
        let scanned: Timestamp = "2026-11-30T08:05:00Z".parse().unwrap();
        f.sink.heartbeat(&inv, scanned).await.unwrap();

        let seen = f.server.seen();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(seen[0].method, "PUT");
        assert_eq!(seen[0].path, "/v1/nodes/node-a/inventory");
        assert_eq!(seen[0].auth, "Bearer token-one");
        assert_eq!(seen[0].content_type, "application/json");
        let sent = NodeInventory::from_json(&seen[0].body).unwrap();
        assert_eq!(sent, inv);

        assert_eq!(seen[1].method, "PUT");
        assert_eq!(seen[1].path, "/v1/nodes/node-a/heartbeat");
        assert_eq!(seen[1].auth, "Bearer token-two");
        let hb: Heartbeat = serde_json::from_slice(&seen[1].body).unwrap();
        assert_eq!(hb.schema, HEARTBEAT_SCHEMA);
        assert_eq!(hb, Heartbeat::new("node-a", 3, scanned));

        assert_eq!(count(&f.registry, "inventory", "accepted"), 1);
        assert_eq!(count(&f.registry, "heartbeat", "unchanged"), 1);
        let text = {
            let mut out = Vec::new();
            prometheus::Encoder::encode(
                &prometheus::TextEncoder::new(),
                &f.registry.gather(),
                &mut out,
            )
            .unwrap();
            String::from_utf8(out).unwrap()
        };
        assert!(
            text.contains("mountguard_agent_report_duration_seconds_count 2"),
            "{text}"
        );
        assert!(
            !text.contains("mountguard_agent_last_report_timestamp_seconds 0\n"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn resend_sends_the_inventory_at_once() {
        let f = fixture(vec![ok("resend"), ok("accepted")], quick()).await;
        let inv = inventory(9);
        f.sink.heartbeat(&inv, Timestamp::now()).await.unwrap();
        let seen = f.server.seen();
        let paths: Vec<&str> = seen.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(
            paths,
            ["/v1/nodes/node-a/heartbeat", "/v1/nodes/node-a/inventory"]
        );
        assert_eq!(
            NodeInventory::from_json(&seen[1].body).unwrap().generation,
            9
        );
        assert_eq!(count(&f.registry, "heartbeat", "resend"), 1);
        assert_eq!(count(&f.registry, "inventory", "accepted"), 1);
    }

    #[tokio::test]
    async fn conflict_drops_the_body_without_retrying() {
        let f = fixture(vec![err(409, "staleGeneration")], quick()).await;
        f.sink.publish(&inventory(2)).await.unwrap();
        // Give a wrongly scheduled retry the time to show up.
        tokio::time::sleep(quick().max * 3).await;
        assert_eq!(f.server.seen().len(), 1);
        assert_eq!(count(&f.registry, "inventory", "rejected"), 1);
    }

    #[tokio::test]
    async fn too_large_and_bad_request_are_not_retried() {
        for (code, error) in [(413, "tooLarge"), (400, "badRequest")] {
            let f = fixture(vec![err(code, error)], quick()).await;
            let e = f.sink.publish(&inventory(2)).await.unwrap_err();
            assert!(e.to_string().contains(error), "{e}");
            tokio::time::sleep(quick().max * 3).await;
            assert_eq!(f.server.seen().len(), 1, "{code}");
        }
    }

    #[tokio::test]
    async fn server_errors_are_retried_with_backoff() {
        let f = fixture(
            vec![err(503, "notReady"), err(500, "internal"), ok("accepted")],
            quick(),
        )
        .await;
        f.sink.publish(&inventory(4)).await.unwrap();
        let seen = f.server.seen();
        assert_eq!(seen.len(), 3);
        let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].at - w[0].at).collect();
        // First retry in [10ms, 20ms), second in [20ms, 40ms) (plus scheduling).
        assert!(gaps[0] >= Duration::from_millis(10), "{gaps:?}");
        assert!(gaps[1] >= Duration::from_millis(20), "{gaps:?}");
        assert_eq!(count(&f.registry, "inventory", "error"), 2);
        assert_eq!(count(&f.registry, "inventory", "accepted"), 1);
    }

    #[tokio::test]
    async fn retries_stop_at_the_window() {
        let backoff = Backoff {
            window: Duration::from_millis(300),
            ..quick()
        };
        let f = fixture(vec![err(500, "internal")], backoff).await;
        let started = Instant::now();
        let e = f.sink.publish(&inventory(4)).await.unwrap_err();
        let n = f.server.seen().len();
        assert!(
            e.to_string()
                .contains(&format!("gave up after {n} attempts")),
            "{e} ({n} requests seen)"
        );
        // It stops: no retry starts once the window would be exceeded. The
        // bound is loose on purpose (emulated arm64 runs are slow); what
        // matters is that it ends instead of retrying forever.
        assert!(started.elapsed() < Duration::from_millis(300) + Duration::from_secs(5));
        // Delays of at least 10, 20, 40, 50, 50, ... ms fit at most ~8 in
        // 300 ms, however fast each request is.
        assert!((1..=10).contains(&n), "{n} attempts");
    }

    #[tokio::test]
    async fn a_newer_generation_supersedes_a_pending_retry() {
        let backoff = Backoff {
            initial: Duration::from_secs(20),
            max: Duration::from_secs(20),
            window: Duration::from_secs(60),
            ..quick()
        };
        let f = fixture(vec![err(503, "notReady")], backoff).await;
        let sink = f.sink.clone();
        let task = tokio::spawn(async move { sink.publish(&inventory(5)).await });
        f.server.wait_for_requests(1).await;
        // An older or equal generation does not cancel it.
        f.sink.superseded(5);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!task.is_finished());
        f.sink.superseded(6);
        let r = tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect("the retry was not abandoned")
            .unwrap();
        assert!(r.is_ok());
        assert_eq!(f.server.seen().len(), 1);
    }

    #[tokio::test]
    async fn rate_limit_honours_retry_after() {
        let f = fixture(
            vec![
                Reply(
                    429,
                    Some(1),
                    r#"{"error":"rateLimited","message":"slow down"}"#.into(),
                ),
                ok("accepted"),
            ],
            quick(),
        )
        .await;
        f.sink.publish(&inventory(4)).await.unwrap();
        let seen = f.server.seen();
        assert_eq!(seen.len(), 2);
        assert!(seen[1].at - seen[0].at >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn auth_failures_are_counted_and_retried_slowly_with_the_new_token() {
        let f = fixture(
            vec![
                err(401, "unauthenticated"),
                err(403, "forbidden"),
                ok("accepted"),
            ],
            quick(),
        )
        .await;
        let sink = f.sink.clone();
        let task = tokio::spawn(async move { sink.publish(&inventory(4)).await });
        f.server.wait_for_requests(1).await;
        std::fs::write(&f.token, "rotated").unwrap();
        task.await.unwrap().unwrap();
        let seen = f.server.seen();
        assert_eq!(seen.len(), 3);
        for w in seen.windows(2) {
            assert!(w[1].at - w[0].at >= quick().auth_min, "auth retry too fast");
        }
        assert_eq!(seen[2].auth, "Bearer rotated");
        assert_eq!(count(&f.registry, "inventory", "rejected"), 2);
    }

    #[tokio::test]
    async fn a_missing_token_file_is_an_error_not_a_request() {
        let backoff = Backoff {
            window: Duration::from_millis(200),
            ..quick()
        };
        let f = fixture(vec![ok("accepted")], backoff).await;
        std::fs::remove_file(&f.token).unwrap();
        let e = f.sink.publish(&inventory(1)).await.unwrap_err();
        assert!(e.to_string().contains("token file"), "{e}");
        assert!(f.server.seen().is_empty());
        assert!(count(&f.registry, "inventory", "error") >= 1);
    }

    #[tokio::test]
    async fn an_unreachable_controller_is_a_transient_error() {
        // A port that was just free: connection refused.
        let addr = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("t"), "x").unwrap();
        let mut cfg = HttpSinkConfig::new(format!("http://{addr}").parse().unwrap(), "n");
        cfg.token_file = dir.path().join("t");
        cfg.backoff = Backoff {
            window: Duration::from_millis(100),
            ..quick()
        };
        let sink = HttpSink::new(cfg).unwrap();
        let e = sink.publish(&inventory(1)).await.unwrap_err();
        assert!(e.to_string().contains("gave up"), "{e}");
    }

    #[test]
    fn backoff_is_exponential_jittered_and_capped() {
        let b = Backoff {
            initial: Duration::from_millis(500),
            max: Duration::from_secs(30),
            ..Backoff::default()
        };
        assert_eq!(b.delay(0, 0.0), Duration::from_millis(250));
        assert_eq!(b.delay(1, 0.0), Duration::from_millis(500));
        assert_eq!(b.delay(3, 0.0), Duration::from_secs(2));
        for attempt in 0..100 {
            let base = Duration::from_millis(500)
                .saturating_mul(2u32.saturating_pow(attempt.min(31)))
                .min(b.max);
            for unit in [0.0, 0.3, 0.999_999] {
                let d = b.delay(attempt, unit);
                assert!(d >= base / 2 && d <= base, "{attempt} {unit} {d:?}");
                assert!(d <= b.max);
            }
        }
        for _ in 0..1000 {
            assert!((0.0..1.0).contains(&jitter()));
        }
    }

    #[test]
    fn configuration_errors_say_what_to_fix() {
        let new = |url: &str, ca: Option<PathBuf>| {
            let mut cfg = HttpSinkConfig::new(url.parse().unwrap(), "n");
            cfg.ca_file = ca;
            HttpSink::new(cfg).map(|_| ()).unwrap_err().to_string()
        };
        assert!(new("https://c:8443", None).contains("--ca-file"));
        assert!(new("ftp://c:21", None).contains("http or https"));
        assert!(new("/just/a/path", None).contains("no scheme"));
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("ca.pem");
        std::fs::write(&bad, "not a certificate").unwrap();
        assert!(new("https://c:8443", Some(bad)).contains("no usable certificate"));
        assert!(new("https://c:8443", Some(dir.path().join("missing"))).contains("--ca-file"));
    }
}
