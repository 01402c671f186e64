//! Who may read the status API (`GET /v1/verdicts`, `GET /v1/rollouts/...`).
//!
//! The verdicts name pods, volumes and Secrets and carry keyed
//! fingerprints, so by default only an authorized reader gets them:
//! 1. the bearer token comes from `Authorization: Bearer ...` or, through
//!    the API server's service proxy, from `X-Mountguard-Authorization:
//!    Bearer ...` (the API server deletes `Authorization` after it
//!    authenticated the caller and passes the other headers on:
//!    `staging/src/k8s.io/apiserver/pkg/endpoints/filters/authentication.go`
//!    `WithAuthentication`); no token: 401;
//! 2. a TokenReview with no audiences (so the API server's own audiences:
//!    a user's or ServiceAccount's ordinary token) says who it is; not
//!    authenticated: 401;
//! 3. a SubjectAccessReview asks whether that user may `get` the virtual
//!    resource `verdicts.mountguard.io` in the namespace the request reads
//!    (a rollout's namespace, `?namespace=`), or cluster-wide for an
//!    unfiltered `/v1/verdicts`; RBAC answers it like any other resource
//!    (a RoleBinding of the chart's reader ClusterRole gives one
//!    namespace, a ClusterRoleBinding all); denied: 403.
//!
//! Answers are cached per token and namespace (allowed for
//! [`StatusAuthLimits::allowed_ttl`], denied and unauthenticated apart, in
//! their own bound, for [`StatusAuthLimits::denied_ttl`], so a flood of
//! refused tokens never evicts a reader's entry). An API error is a 503,
//! never an answer. `--status-auth none` opens the API to anyone who
//! reaches the port (docs/security.md).
//!
//! A token is *known* once it was allowed somewhere: for
//! [`StatusAuthLimits::known_ttl`] its reviews (a new namespace, or again
//! after its answer expired) are neither charged to its source nor kept
//! from the review slots by unknown tokens. An unknown token costs a
//! TokenReview, so it is charged first to its source address, in the same
//! per-source bucket as the report API's unknown tokens
//! ([`crate::runtime::limits::SourceBuckets`]; over it: 429 with `Retry-After`), and
//! its review may use at most [`StatusAuthLimits::unknown_in_flight`] of
//! the [`StatusAuthLimits::in_flight`] review slots (503 beyond): a flood
//! of random tokens from one address costs at most its bucket in
//! TokenReviews and never the slots a known reader needs.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use sha2::{Digest as _, Sha256};

use crate::runtime::limits::SourceBuckets;

/// The header that carries the bearer token through the API server's
/// service proxy.
pub const PROXY_AUTH_HEADER: &str = "x-mountguard-authorization";

/// The API group of the virtual resource readers are authorized for.
pub const READER_GROUP: &str = "mountguard.io";

/// The virtual resource readers are authorized for.
pub const READER_RESOURCE: &str = "verdicts";

/// The verb readers are authorized for.
pub const READER_VERB: &str = "get";

/// Who a token authenticates as.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reader {
    /// `user.username`.
    pub username: String,
    /// `user.uid`.
    pub uid: String,
    /// `user.groups`.
    pub groups: Vec<String>,
    /// `user.extra`.
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// Why a reader was not let in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// No token, or one the API server does not accept (401).
    Unauthenticated(String),
    /// Authenticated, not authorized for the namespace (403).
    Forbidden(String),
    /// The API server could not answer, or too many reviews are in
    /// flight (503): try again.
    Unavailable(String),
    /// Too many unknown tokens from the caller's address (429): retry
    /// after the given seconds.
    Throttled(String, u64),
}

impl Refusal {
    /// The HTTP status of the refusal.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            Refusal::Forbidden(_) => StatusCode::FORBIDDEN,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Refusal::Throttled(..) => StatusCode::TOO_MANY_REQUESTS,
        }
    }

    /// The `result` label of `mountguard_status_requests_total`.
    pub fn result(&self) -> &'static str {
        match self {
            Refusal::Unauthenticated(_) => "unauthenticated",
            Refusal::Forbidden(_) => "forbidden",
            Refusal::Unavailable(_) => "unavailable",
            Refusal::Throttled(..) => "rate_limited",
        }
    }

    /// The message for the client.
    pub fn message(&self) -> &str {
        match self {
            Refusal::Unauthenticated(m)
            | Refusal::Forbidden(m)
            | Refusal::Unavailable(m)
            | Refusal::Throttled(m, _) => m,
        }
    }

    /// Seconds the client should wait before retrying (503, 429).
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Refusal::Unavailable(_) => Some(1),
            Refusal::Throttled(_, wait) => Some(*wait),
            Refusal::Unauthenticated(_) | Refusal::Forbidden(_) => None,
        }
    }
}

/// TokenReview and SubjectAccessReview (behind a trait for tests).
pub trait AccessReviewer: Send + Sync + std::fmt::Debug {
    /// Who `token` is (`Ok(None)`: not authenticated).
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<Reader>, String>>;

    /// Whether `reader` may get verdicts in `namespace` (`None`: in every
    /// namespace).
    fn authorize<'a>(
        &'a self,
        reader: &'a Reader,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, String>>;
}

/// The reviews through the API server.
#[derive(Clone)]
pub struct KubeAccessReviewer {
    tokens: Api<TokenReview>,
    access: Api<SubjectAccessReview>,
}

impl std::fmt::Debug for KubeAccessReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeAccessReviewer")
    }
}

impl KubeAccessReviewer {
    /// Reviews with `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            tokens: Api::all(client.clone()),
            access: Api::all(client),
        }
    }
}

impl AccessReviewer for KubeAccessReviewer {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<Reader>, String>> {
        Box::pin(async move {
            let tr = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_string(),
                    // None: the API server's own audiences.
                    audiences: None,
                },
                ..Default::default()
            };
            let out = self
                .tokens
                .create(&PostParams::default(), &tr)
                .await
                .map_err(|e| format!("TokenReview: {e}"))?;
            let status = out.status.unwrap_or_default();
            if status.authenticated != Some(true) {
                return Ok(None);
            }
            let u = status.user.unwrap_or_default();
            Ok(Some(Reader {
                username: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default(),
            }))
        })
    }

    fn authorize<'a>(
        &'a self,
        reader: &'a Reader,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            let sar = access_review(reader, namespace);
            let out = self
                .access
                .create(&PostParams::default(), &sar)
                .await
                .map_err(|e| format!("SubjectAccessReview: {e}"))?;
            Ok(out.status.is_some_and(|s| s.allowed))
        })
    }
}

/// The SubjectAccessReview asking whether `reader` may get verdicts in
/// `namespace` (pure).
pub fn access_review(reader: &Reader, namespace: Option<&str>) -> SubjectAccessReview {
    SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(reader.username.clone()),
            uid: (!reader.uid.is_empty()).then(|| reader.uid.clone()),
            groups: Some(reader.groups.clone()),
            extra: (!reader.extra.is_empty()).then(|| reader.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(READER_GROUP.into()),
                resource: Some(READER_RESOURCE.into()),
                verb: Some(READER_VERB.into()),
                namespace: namespace.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The namespace a status request reads (`None`: every namespace), from
/// its path and query (pure): a rollout's target namespace, the
/// `namespace` filter of `/v1/verdicts`.
pub fn scope_of(path: &str, query: &crate::api::store::Query) -> Option<String> {
    if let Some(rest) = path.strip_prefix("/v1/rollouts/") {
        return rest
            .parse::<mountguard_core::rollout::Target>()
            .ok()
            .map(|t| t.namespaced_name().0.to_string());
    }
    query.namespace.clone()
}

/// The bearer token of a request: `Authorization`, else the service proxy
/// header; `None` when neither holds a `Bearer` token.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    let from = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .filter(|t| !t.is_empty())
    };
    from(header::AUTHORIZATION.as_str()).or_else(|| from(PROXY_AUTH_HEADER))
}

/// Bounds of the status API's review cache and of the reviews callers
/// can cause.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatusAuthLimits {
    /// How long an allowed answer is reused.
    pub allowed_ttl: Duration,
    /// How long a refusal (401/403) is reused.
    pub denied_ttl: Duration,
    /// How long a token stays known after it was last allowed (its
    /// reviews then skip the per-source bucket and may use every slot).
    pub known_ttl: Duration,
    /// Allowed answers kept at most (and known tokens at most).
    pub allowed_entries: usize,
    /// Refusals kept at most (apart: they never evict allowed answers).
    pub denied_entries: usize,
    /// Reviews in flight at once (503 beyond).
    pub in_flight: usize,
    /// Of those, reviews of unknown tokens at most: the others are kept
    /// for known readers.
    pub unknown_in_flight: usize,
    /// Per source address: reviews of unknown tokens per second.
    pub per_source_rate: f64,
    /// Per source address: burst.
    pub per_source_burst: u32,
    /// Source addresses remembered at most.
    pub sources: usize,
}

impl Default for StatusAuthLimits {
    fn default() -> Self {
        // The per-source bucket is the report API's
        // (`crate::runtime::token_review::ReviewLimits`).
        let report = crate::runtime::token_review::ReviewLimits::default();
        Self {
            allowed_ttl: Duration::from_secs(60),
            denied_ttl: Duration::from_secs(10),
            known_ttl: Duration::from_secs(600),
            allowed_entries: 4_096,
            denied_entries: 1_024,
            in_flight: 8,
            unknown_in_flight: 6,
            per_source_rate: report.per_source_rate,
            per_source_burst: report.per_source_burst,
            sources: report.sources,
        }
    }
}

/// The SHA-256 of a token (never the token itself).
type Digest = [u8; 32];

/// A token and the namespace it reads.
type Key = (Digest, Option<String>);

/// A bounded map of answers that expire.
#[derive(Debug)]
struct Answers<K, V> {
    entries: HashMap<K, (Instant, V)>,
    cap: usize,
}

impl<K: Clone + Eq + std::hash::Hash, V: Clone> Answers<K, V> {
    fn new(cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            cap,
        }
    }

    fn get(&mut self, k: &K, now: Instant) -> Option<V> {
        match self.entries.get(k) {
            Some((until, v)) if *until > now => Some(v.clone()),
            Some(_) => {
                self.entries.remove(k);
                None
            }
            None => None,
        }
    }

    fn remove(&mut self, k: &K) {
        self.entries.remove(k);
    }

    fn put(&mut self, k: K, until: Instant, v: V, now: Instant) {
        if self.cap == 0 {
            return;
        }
        if self.entries.len() >= self.cap && !self.entries.contains_key(&k) {
            self.entries.retain(|_, (u, _)| *u > now);
            if self.entries.len() >= self.cap {
                // Drop the entry closest to expiry.
                if let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (u, _))| *u)
                    .map(|(k, _)| k.clone())
                {
                    self.entries.remove(&oldest);
                }
            }
        }
        self.entries.insert(k, (until, v));
    }
}

/// Who may read the status API (`--status-auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Default)]
pub enum StatusAuthMode {
    /// A bearer token of a user allowed to `get` `verdicts.mountguard.io`
    /// in the namespace read (TokenReview, SubjectAccessReview).
    #[default]
    Kubernetes,
    /// Anyone who reaches the port.
    None,
}

#[derive(Debug)]
struct Cache {
    allowed: Answers<Key, String>,
    denied: Answers<Key, Refusal>,
    /// Tokens allowed somewhere: who they are, and until when that
    /// TokenReview answer is reused (the entry itself lives `known_ttl`).
    known: Answers<Digest, (Reader, Instant)>,
}

/// The status API's gate: [`StatusAuthMode::None`] lets everybody in,
/// [`StatusAuthMode::Kubernetes`] reviews as the module says.
#[derive(Debug)]
pub struct StatusGate {
    mode: StatusAuthMode,
    reviewer: Option<Arc<dyn AccessReviewer>>,
    limits: StatusAuthLimits,
    cache: Mutex<Cache>,
    /// Every review holds one of these.
    in_flight: tokio::sync::Semaphore,
    /// A review of an unknown token holds one of these too.
    unknown_in_flight: tokio::sync::Semaphore,
    sources: SourceBuckets,
}

impl StatusGate {
    /// A gate that lets everybody in (`--status-auth none`).
    pub fn open() -> Self {
        Self::build(StatusAuthMode::None, None, StatusAuthLimits::default())
    }

    /// A gate reviewing with `reviewer`.
    pub fn kubernetes(reviewer: Arc<dyn AccessReviewer>, limits: StatusAuthLimits) -> Self {
        Self::build(StatusAuthMode::Kubernetes, Some(reviewer), limits)
    }

    fn build(
        mode: StatusAuthMode,
        reviewer: Option<Arc<dyn AccessReviewer>>,
        limits: StatusAuthLimits,
    ) -> Self {
        Self {
            mode,
            reviewer,
            limits,
            cache: Mutex::new(Cache {
                allowed: Answers::new(limits.allowed_entries),
                denied: Answers::new(limits.denied_entries),
                known: Answers::new(limits.allowed_entries),
            }),
            in_flight: tokio::sync::Semaphore::new(limits.in_flight),
            unknown_in_flight: tokio::sync::Semaphore::new(
                limits.unknown_in_flight.min(limits.in_flight),
            ),
            sources: SourceBuckets::new(
                limits.per_source_rate,
                limits.per_source_burst,
                limits.sources,
            ),
        }
    }

    /// The mode.
    pub fn mode(&self) -> StatusAuthMode {
        self.mode
    }

    /// Lets the request in (`Ok(user)`, `"anonymous"` when open) or says
    /// why not. `namespace` is what it reads ([`scope_of`]), `source` the
    /// caller's address (`None`: not charged to any).
    pub async fn check(
        &self,
        headers: &HeaderMap,
        namespace: Option<String>,
        source: Option<IpAddr>,
    ) -> Result<String, Refusal> {
        let Some(reviewer) = self
            .reviewer
            .as_ref()
            .filter(|_| self.mode == StatusAuthMode::Kubernetes)
        else {
            return Ok("anonymous".into());
        };
        let Some(token) = bearer(headers) else {
            return Err(Refusal::Unauthenticated(format!(
                "the status API needs a bearer token of a user allowed to {READER_VERB} \
                 {READER_RESOURCE}.{READER_GROUP} (Authorization: Bearer, or {} through the API \
                 server's service proxy; see docs/security.md)",
                "X-Mountguard-Authorization"
            )));
        };
        let digest: Digest = Sha256::digest(token.as_bytes()).into();
        let key: Key = (digest, namespace.clone());
        let now = Instant::now();
        let known = {
            let mut c = self.cache.lock().unwrap();
            if let Some(user) = c.allowed.get(&key, now) {
                return Ok(user);
            }
            if let Some(r) = c.denied.get(&key, now) {
                return Err(r);
            }
            c.known.get(&digest, now)
        };
        // A known token's review holds any slot; an unknown one's is
        // charged to its source, then holds one of the slots unknown
        // tokens may use as well.
        let _unknown_permit = match &known {
            Some(_) => None,
            None => {
                if let Some(ip) = source
                    && let Err(wait) = self.sources.take(ip, now)
                {
                    return Err(Refusal::Throttled(
                        format!(
                            "too many unknown tokens from {ip}; retry after {wait}s (a reader \
                             allowed in the last {}s is not limited)",
                            self.limits.known_ttl.as_secs()
                        ),
                        wait,
                    ));
                }
                let Ok(p) = self.unknown_in_flight.try_acquire() else {
                    return Err(busy());
                };
                Some(p)
            }
        };
        let Ok(_permit) = self.in_flight.try_acquire() else {
            return Err(busy());
        };
        // A known token's identity is reused while fresh: a new namespace
        // then costs a SubjectAccessReview only.
        let fresh = known.filter(|(_, until)| *until > now);
        let answer = self
            .review(reviewer.as_ref(), token, fresh, namespace.as_deref())
            .await;
        let now = Instant::now();
        let mut c = self.cache.lock().unwrap();
        match answer {
            Ok((reader, identity_until)) => {
                let user = reader.username.clone();
                c.allowed
                    .put(key, now + self.limits.allowed_ttl, user.clone(), now);
                c.known.put(
                    digest,
                    now + self.limits.known_ttl,
                    (reader, identity_until),
                    now,
                );
                Ok(user)
            }
            Err(r @ (Refusal::Unauthenticated(_) | Refusal::Forbidden(_))) => {
                if matches!(r, Refusal::Unauthenticated(_)) {
                    // Revoked or expired: no longer known.
                    c.known.remove(&digest);
                }
                c.denied
                    .put(key, now + self.limits.denied_ttl, r.clone(), now);
                Err(r)
            }
            // Transient: never remembered.
            Err(r @ (Refusal::Unavailable(_) | Refusal::Throttled(..))) => Err(r),
        }
    }

    /// Reviews `token` (a TokenReview, unless `fresh` holds who it is and
    /// until when that answer is reused), then its access to `namespace`;
    /// on success, who it is and until when that is reused.
    async fn review(
        &self,
        reviewer: &dyn AccessReviewer,
        token: &str,
        fresh: Option<(Reader, Instant)>,
        namespace: Option<&str>,
    ) -> Result<(Reader, Instant), Refusal> {
        let (reader, until) = match fresh {
            Some(known) => known,
            None => match reviewer.authenticate(token).await {
                Ok(Some(r)) => (r, Instant::now() + self.limits.allowed_ttl),
                Ok(None) => {
                    return Err(Refusal::Unauthenticated(
                        "the API server does not accept this token (TokenReview)".into(),
                    ));
                }
                Err(e) => {
                    return Err(Refusal::Unavailable(format!(
                        "could not review the token: {e}"
                    )));
                }
            },
        };
        match reviewer.authorize(&reader, namespace).await {
            Ok(true) => Ok((reader, until)),
            Ok(false) => Err(Refusal::Forbidden(format!(
                "user {:?} may not {READER_VERB} {READER_RESOURCE}.{READER_GROUP} {}: bind the \
                 chart's status reader ClusterRole to it (docs/security.md)",
                reader.username,
                match namespace {
                    Some(ns) => format!("in namespace {ns:?}"),
                    None => "in every namespace (or ask with ?namespace=)".into(),
                }
            ))),
            Err(e) => Err(Refusal::Unavailable(format!(
                "could not review the access: {e}"
            ))),
        }
    }
}

/// The refusal when every review slot a request may use is taken.
fn busy() -> Refusal {
    Refusal::Unavailable("too many status API reviews in flight; retry in a second".into())
}

#[cfg(test)]
mod tests;
