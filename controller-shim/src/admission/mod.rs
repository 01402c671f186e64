//! The validating admission webhook (`POST /v1/admission`, HTTPS): warns
//! the caller who deletes an immutable Secret or ConfigMap that registered
//! pods still reference, or creates one under a name whose previous
//! immutable object nodes still serve (refused with `--admission-mode
//! deny`). The decision is the core's ([`mountguard_core::admission`]).
//!
//! Never a dependency of the API: the chart registers the webhook with
//! `failurePolicy: Ignore` and `timeoutSeconds: 2`; this server answers
//! "allowed" at once while the watches have not synced, and "allowed"
//! without a word when the evaluation task has not answered within
//! `--admission-answer-timeout`. An answer reads only the evaluation
//! task's in-memory view ([`Input::Admission`]): no API call per request.
//! The object in the review (a Secret's data included) is dropped as soon
//! as its kind, name and `immutable` field are read.
//!
//! Every replica answers (the evaluation task indexes on replicas that do
//! not act too).

pub mod metrics;
pub mod review;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::{Body, Bytes};
use mountguard_core::admission::{self, Answer, Call, Mode, NameView};
use mountguard_inventory::parse_duration;
use tokio::sync::{Semaphore, mpsc, oneshot};
use tracing::debug;

use crate::eval::{AdmissionQuery, Input};
use crate::runtime::http::json_response;
use crate::runtime::shutdown::Shutdown;
use crate::state::Shared;
use metrics::AdmissionMetrics;
use review::{Reviewed, Verdict};

/// The path the webhook is served on.
pub const PATH: &str = "/v1/admission";

/// Largest AdmissionReview accepted: a Secret or ConfigMap may hold about
/// 1 MiB (`etcd`'s default request limit) and a delete's review carries
/// the old object; room for both and the envelope.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Longest time the review body may take to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(2);

/// Reviews read and parsed at once per replica (from the first byte of the
/// body to the parsed fields); one beyond is answered 503 unread. Each
/// holds at most its body twice while the body is assembled (`MAX_BODY`):
/// 8 x 6 MiB at worst. A review's wait for the view is not counted.
pub const MAX_REVIEWS_AT_ONCE: usize = 8;

/// What the admission webhook does with a create that a node's kubelet
/// cache would not see (`--admission-mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum AdmissionMode {
    /// Allow, with warnings the caller sees.
    #[default]
    Warn,
    /// Refuse a create under a name nodes still serve an immutable
    /// predecessor of (deletes are only warned about).
    Deny,
    /// Allow everything, say nothing.
    Off,
}

/// Flags of the admission webhook (flattened into `run`'s flags; checked
/// by `settings`).
#[derive(Debug, Clone, Args)]
pub struct AdmissionArgs {
    /// Serve the validating admission webhook (HTTPS, `POST /v1/admission`)
    /// on this address; absent: no webhook.
    #[arg(long, env = "MOUNTGUARD_ADMISSION_LISTEN")]
    pub admission_listen: Option<SocketAddr>,
    /// `warn` (allow with warnings), `deny` (refuse a create under a pinned
    /// name) or `off`.
    #[arg(
        long,
        env = "MOUNTGUARD_ADMISSION_MODE",
        value_enum,
        default_value = "warn"
    )]
    pub admission_mode: AdmissionMode,
    /// PEM certificate chain of the webhook (reloaded when it changes);
    /// default: the report API's `--tls-cert-file`.
    #[arg(
        long,
        env = "MOUNTGUARD_ADMISSION_TLS_CERT_FILE",
        requires = "admission_tls_key_file"
    )]
    pub admission_tls_cert_file: Option<PathBuf>,
    /// PEM private key of the webhook; default: `--tls-key-file`.
    #[arg(
        long,
        env = "MOUNTGUARD_ADMISSION_TLS_KEY_FILE",
        requires = "admission_tls_cert_file"
    )]
    pub admission_tls_key_file: Option<PathBuf>,
    /// PEM file of the CA that signs the API server's webhook client
    /// certificate (its AdmissionConfiguration kubeconfig): when given,
    /// clients without such a certificate are refused in the handshake.
    #[arg(long, env = "MOUNTGUARD_ADMISSION_CLIENT_CA_FILE")]
    pub admission_client_ca_file: Option<PathBuf>,
    /// Longest wait for the in-memory view; past it the call is allowed
    /// without a word (keep it under the webhook's `timeoutSeconds`).
    #[arg(long, env = "MOUNTGUARD_ADMISSION_ANSWER_TIMEOUT", default_value = "1500ms", value_parser = parse_duration)]
    pub admission_answer_timeout: Duration,
}

/// The webhook's settings (`run`'s admission flags, checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionSettings {
    /// Address of the webhook.
    pub listen: SocketAddr,
    /// Certificate and key files.
    pub tls: (PathBuf, PathBuf),
    /// What to do with a pin-making call.
    pub mode: Mode,
    /// Longest wait for the evaluation task's view.
    pub answer_timeout: Duration,
    /// Remediation is on (the advice says it may replace pods).
    pub remediation: bool,
    /// When set, only clients with a certificate chaining to this CA (the
    /// API server's webhook client certificate) are served.
    pub client_ca: Option<PathBuf>,
}

/// Answers admission reviews.
#[derive(Debug)]
pub struct AdmissionHandler {
    settings: AdmissionSettings,
    shared: Arc<Shared>,
    inputs: mpsc::Sender<Input>,
    metrics: AdmissionMetrics,
    /// [`MAX_REVIEWS_AT_ONCE`] permits: one per review being read.
    reading: Semaphore,
}

/// What one review became, for the metrics and the answer.
struct Outcome {
    operation: &'static str,
    result: &'static str,
    response: Response<Full<Bytes>>,
}

impl AdmissionHandler {
    /// A handler asking the evaluation task on `inputs`, counting on
    /// `metrics`.
    pub fn new(
        settings: AdmissionSettings,
        shared: Arc<Shared>,
        inputs: mpsc::Sender<Input>,
        metrics: AdmissionMetrics,
    ) -> Self {
        Self {
            settings,
            shared,
            inputs,
            metrics,
            reading: Semaphore::new(MAX_REVIEWS_AT_ONCE),
        }
    }

    /// Handles one HTTP request.
    pub async fn handle<B>(&self, req: Request<B>) -> Response<Full<Bytes>>
    where
        B: Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let started = Instant::now();
        let out = self.outcome(req, started).await;
        let m = &self.metrics;
        m.requests
            .with_label_values(&[out.operation, out.result])
            .inc();
        m.answer
            .with_label_values(&[out.operation])
            .observe(started.elapsed().as_secs_f64());
        out.response
    }

    async fn outcome<B>(&self, req: Request<B>, started: Instant) -> Outcome
    where
        B: Body,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let invalid = |code: StatusCode, msg: String| Outcome {
            operation: "other",
            result: "invalid",
            response: text(code, msg),
        };
        if req.uri().path() != PATH {
            return invalid(
                StatusCode::NOT_FOUND,
                format!("not found; the webhook is {PATH}"),
            );
        }
        if req.method() != Method::POST {
            return invalid(
                StatusCode::METHOD_NOT_ALLOWED,
                "POST an AdmissionReview".into(),
            );
        }
        // Bound before the first byte of the body is read: what a review
        // costs is its body (and, briefly, a copy of it).
        let Ok(permit) = self.reading.try_acquire() else {
            return Outcome {
                operation: "other",
                result: "overloaded",
                response: text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "{MAX_REVIEWS_AT_ONCE} reviews are being read; this one is not \
                         (failurePolicy Ignore lets the call through)"
                    ),
                ),
            };
        };
        let body = match tokio::time::timeout(
            BODY_TIMEOUT,
            Limited::new(req.into_body(), MAX_BODY).collect(),
        )
        .await
        {
            Err(_) => {
                return invalid(
                    StatusCode::REQUEST_TIMEOUT,
                    format!("the review did not arrive within {BODY_TIMEOUT:?}"),
                );
            }
            Ok(Err(e)) => {
                return invalid(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    format!("reading the review (at most {MAX_BODY} bytes): {e}"),
                );
            }
            Ok(Ok(b)) => b.to_bytes(),
        };
        let review = review::parse(&body);
        // The body (a Secret's data) goes now.
        drop(body);
        drop(permit);
        let (uid, reviewed) = match review {
            Ok(r) => (r.uid, r.subject),
            Err(msg) => return invalid(StatusCode::BAD_REQUEST, msg),
        };
        let allowed = Verdict::Allow(Vec::new());
        let Some(reviewed) = reviewed else {
            return answer("other", "allowed", &uid, &allowed);
        };
        let operation = reviewed.operation.as_str();
        if self.settings.mode == Mode::Off {
            return answer(operation, "allowed", &uid, &allowed);
        }
        if !self.shared.is_ready() {
            return answer(operation, "not_ready", &uid, &allowed);
        }
        let deadline = started + self.settings.answer_timeout;
        let view = match self.ask(&reviewed, deadline).await {
            Some(v) => v,
            None => {
                debug!(
                    operation,
                    object = %reviewed.source.name,
                    "the view did not answer in time: allowed without a word"
                );
                return answer(operation, "busy", &uid, &allowed);
            }
        };
        let call = Call {
            operation: reviewed.operation,
            source: &reviewed.source,
            immutable: reviewed.immutable,
            remediation: self.settings.remediation,
            // With a client CA the handshake refused every caller without
            // the API server's certificate.
            verified_caller: self.settings.client_ca.is_some(),
        };
        match admission::decide(self.settings.mode, &call, &view) {
            Answer::Allow => answer(operation, "allowed", &uid, &allowed),
            Answer::Warn(w) => answer(operation, "warned", &uid, &Verdict::Allow(w)),
            Answer::Deny {
                code,
                reason,
                message,
            } => answer(
                operation,
                "denied",
                &uid,
                &Verdict::Deny {
                    code,
                    reason,
                    message,
                },
            ),
        }
    }

    /// The evaluation task's view of the name, or `None` past `deadline`.
    async fn ask(&self, r: &Reviewed, deadline: Instant) -> Option<NameView> {
        let (reply, rx) = oneshot::channel();
        let q = Input::Admission(AdmissionQuery {
            source: r.source.clone(),
            operation: r.operation,
            reply,
        });
        let deadline = tokio::time::Instant::from_std(deadline);
        tokio::time::timeout_at(deadline, self.inputs.send(q))
            .await
            .ok()?
            .ok()?;
        tokio::time::timeout_at(deadline, rx).await.ok()?.ok()
    }
}

fn answer(operation: &'static str, result: &'static str, uid: &str, verdict: &Verdict) -> Outcome {
    Outcome {
        operation,
        result,
        response: json_response(StatusCode::OK, &review::answer(uid, verdict)),
    }
}

fn text(code: StatusCode, msg: String) -> Response<Full<Bytes>> {
    crate::runtime::http::text(code, msg + "\n")
}

/// Serves the webhook over TLS (`config`: with or without client
/// certificates) until shutdown, with the shared bounded
/// loop (timeouts, connection cap; see `mountguard-serve`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    config: rustls::ServerConfig,
    handler: Arc<AdmissionHandler>,
    limits: mountguard_serve::Limits,
    metrics: mountguard_serve::ServeMetrics,
    mut shutdown: Shutdown,
) {
    let make = move |_peer: SocketAddr| {
        let h = handler.clone();
        hyper::service::service_fn(move |req: Request<mountguard_serve::RequestBody>| {
            let h = h.clone();
            async move { Ok::<_, Infallible>(h.handle(req).await) }
        })
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    mountguard_serve::serve(
        "admission",
        listener,
        limits,
        crate::runtime::tls::Handshake(acceptor),
        metrics,
        make,
        async move { shutdown.wait().await },
    )
    .await
}

#[cfg(test)]
mod tests;
