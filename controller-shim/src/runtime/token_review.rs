//! Authentication by TokenReview: who a bearer token belongs to (its user,
//! and for a projected token the pod and node it was issued for), asked of
//! the API server and cached, with bounded reviews in flight and a token
//! bucket per source address for tokens not yet known. The report API
//! (agents) and the status API (readers) each use one. Its metric
//! families: `token_review/metrics.rs`.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::{Api, PostParams};
use sha2::{Digest as _, Sha256};

use crate::runtime::limits::SourceBuckets;
use crate::runtime::metrics::Metrics;

pub mod metrics;
use metrics::TokenReviewMetrics;

/// `user.extra` key of the pod name in a projected token.
pub const EXTRA_POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// `user.extra` key of the pod UID.
pub const EXTRA_POD_UID: &str = "authentication.kubernetes.io/pod-uid";
/// `user.extra` key of the node name.
pub const EXTRA_NODE_NAME: &str = "authentication.kubernetes.io/node-name";

/// The user a TokenReview authenticated.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReviewedUser {
    /// `user.username`.
    pub username: String,
    /// `user.uid`.
    pub uid: String,
    /// `user.extra`.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl ReviewedUser {
    pub fn extra_one(&self, key: &str) -> Option<&str> {
        self.extra
            .get(key)
            .and_then(|v| v.first())
            .map(String::as_str)
    }
}

/// Why a token was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No, malformed or rejected token.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The TokenReview could not be made (API trouble): try again later.
    #[error("token review unavailable: {0}")]
    Unavailable(String),
    /// Too many TokenReviews for this source (or in flight): retry after
    /// the given seconds.
    #[error("token review throttled: {0}")]
    Throttled(String, u64),
}

/// Checks a bearer token (e.g. with a TokenReview).
pub trait TokenReviewer: Send + Sync + std::fmt::Debug {
    /// Authenticates `token` for `audience`.
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>>;

    /// Authenticates `token` for `audience` on behalf of a caller at
    /// `source` (its address, before any authentication), so a reviewer
    /// can limit the reviews one source drives.
    fn review_from<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
        source: Option<std::net::IpAddr>,
    ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
        let _ = source;
        self.review(token, audience)
    }
}

/// Limits on the TokenReviews that callers not yet authenticated can
/// cause (cache misses only: a cached answer costs nothing).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReviewLimits {
    /// Reviews in flight at once, all sources together.
    pub in_flight: usize,
    /// How long a review waits for a free slot before answering 503.
    pub queue_timeout: Duration,
    /// Per source address: reviews per second.
    pub per_source_rate: f64,
    /// Per source address: burst.
    pub per_source_burst: u32,
    /// Source addresses remembered at most.
    pub sources: usize,
}

impl Default for ReviewLimits {
    fn default() -> Self {
        Self {
            in_flight: 16,
            queue_timeout: Duration::from_secs(2),
            per_source_rate: 2.0,
            per_source_burst: 20,
            sources: 10_000,
        }
    }
}

/// TokenReview through the API server (`authentication.k8s.io/v1`).
#[derive(Clone)]
pub struct KubeTokenReviewer {
    api: Api<TokenReview>,
}

impl std::fmt::Debug for KubeTokenReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubeTokenReviewer")
    }
}

impl KubeTokenReviewer {
    /// A reviewer using `client`.
    pub fn new(client: kube::Client) -> Self {
        Self {
            api: Api::all(client),
        }
    }
}

impl TokenReviewer for KubeTokenReviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
        Box::pin(async move {
            let tr = TokenReview {
                spec: TokenReviewSpec {
                    token: token.to_string(),
                    audiences: Some(vec![audience.to_string()]),
                },
                ..Default::default()
            };
            let out = self
                .api
                .create(&PostParams::default(), &tr)
                .await
                .map_err(|e| AuthError::Unavailable(e.to_string()))?;
            reviewed_user(out.status.unwrap_or_default(), audience)
        })
    }
}

/// The user of a TokenReview answer, or why it is refused (pure).
///
/// The answer must be `authenticated` and list `audience` in
/// `status.audiences`. The API server copies into `status.audiences` the
/// audiences the authenticator confirmed (kubernetes/kubernetes,
/// pkg/registry/authentication/tokenreview/storage.go, `(*REST).Create`:
/// `tokenReview.Status.Audiences = resp.Audiences`); an answer without our
/// audience there (an authenticator that ignored the requested audiences,
/// or a proxy in between) proves nothing about the audience and is
/// refused.
pub fn reviewed_user(
    status: k8s_openapi::api::authentication::v1::TokenReviewStatus,
    audience: &str,
) -> Result<ReviewedUser, AuthError> {
    if status.authenticated != Some(true) {
        return Err(AuthError::Unauthenticated(
            status
                .error
                .filter(|e| !e.is_empty())
                .unwrap_or_else(|| "token not authenticated".into()),
        ));
    }
    if !status
        .audiences
        .as_ref()
        .is_some_and(|aud| aud.iter().any(|a| a == audience))
    {
        return Err(AuthError::Unauthenticated(format!(
            "the TokenReview answer does not confirm audience {audience:?}"
        )));
    }
    let user = status.user.unwrap_or_default();
    Ok(ReviewedUser {
        username: user.username.unwrap_or_default(),
        uid: user.uid.unwrap_or_default(),
        extra: user.extra.unwrap_or_default().into_iter().collect(),
    })
}

/// Default lifetime of a cached review when the token carries no `exp`.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// Lifetime of a cached rejection.
pub const NEGATIVE_TTL: Duration = Duration::from_secs(10);

type CacheKey = [u8; 32];
type CacheEntry = (Result<ReviewedUser, AuthError>, Instant);

/// Caches another reviewer's answers by SHA-256 of the token (never the
/// token itself): successes until the token's `exp` (else
/// [`DEFAULT_TTL`]), rejections for [`NEGATIVE_TTL`]; at most `capacity`
/// entries.
///
/// With [`CachedReviewer::for_agent`], only the agent ServiceAccount's
/// answers go to that cache. A token that authenticates as anyone else (a
/// tenant's token with the right audience: refused by the authorization
/// anyway) is kept apart, in a small cache of its own
/// ([`others_capacity`]) where it can only displace its like, and a hit on
/// it is charged to its source as a miss is: a tenant flooding valid
/// tokens neither evicts nor crowds out the agents' entries, whose tokens
/// rotate hourly.
pub struct CachedReviewer<R> {
    inner: R,
    /// The shared families (API errors).
    shared: Metrics,
    metrics: TokenReviewMetrics,
    capacity: usize,
    cache: Mutex<HashMap<CacheKey, CacheEntry>>,
    agent_user: Option<String>,
    others: Mutex<HashMap<CacheKey, CacheEntry>>,
    limits: ReviewLimits,
    in_flight: tokio::sync::Semaphore,
    sources: SourceBuckets,
}

/// Entries of the cache of users that are not the agent, for a main cache
/// of `capacity`.
pub fn others_capacity(capacity: usize) -> usize {
    (capacity / 16).clamp(16, 1024)
}

impl<R> std::fmt::Debug for CachedReviewer<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedReviewer")
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

impl<R: TokenReviewer> CachedReviewer<R> {
    /// Wraps `inner` with the default [`ReviewLimits`].
    pub fn new(inner: R, shared: Metrics, metrics: TokenReviewMetrics, capacity: usize) -> Self {
        Self::with_limits(inner, shared, metrics, capacity, ReviewLimits::default())
    }

    /// Wraps `inner`, measured by `metrics` (and API errors by `shared`).
    pub fn with_limits(
        inner: R,
        shared: Metrics,
        metrics: TokenReviewMetrics,
        capacity: usize,
        limits: ReviewLimits,
    ) -> Self {
        Self {
            inner,
            shared,
            metrics,
            capacity: capacity.max(1),
            cache: Mutex::new(HashMap::new()),
            agent_user: None,
            others: Mutex::new(HashMap::new()),
            in_flight: tokio::sync::Semaphore::new(limits.in_flight.max(1)),
            sources: SourceBuckets::new(
                limits.per_source_rate,
                limits.per_source_burst,
                limits.sources,
            ),
            limits,
        }
    }

    /// Keeps the main cache for `username` (the agent ServiceAccount's
    /// user name): every other authenticated user is cached apart.
    pub fn for_agent(mut self, username: impl Into<String>) -> Self {
        self.agent_user = Some(username.into());
        self
    }

    /// Whether an answer belongs in the main cache.
    fn is_agent(&self, r: &Result<ReviewedUser, AuthError>) -> bool {
        match (r, &self.agent_user) {
            (Ok(u), Some(agent)) => u.username == *agent,
            _ => true,
        }
    }

    /// Stores the answer of a user that is not the agent: expired entries
    /// go first, then any one other entry (never an agent's).
    fn store_other(&self, key: CacheKey, entry: CacheEntry, now: Instant) {
        let mut others = self.others.lock().unwrap();
        let cap = others_capacity(self.capacity);
        if others.len() >= cap && !others.contains_key(&key) {
            others.retain(|_, (_, until)| *until > now);
            if others.len() >= cap
                && let Some(k) = others.keys().next().copied()
            {
                others.remove(&k);
            }
        }
        others.insert(key, entry);
    }

    /// Stores an answer. When the cache is full: expired entries go first,
    /// then rejections; live successes are never dropped (with the cache
    /// full of them, the new answer is simply not cached).
    fn store(&self, key: CacheKey, entry: CacheEntry, now: Instant) {
        let mut cache = self.cache.lock().unwrap();
        if cache.len() >= self.capacity && !cache.contains_key(&key) {
            cache.retain(|_, (_, until)| *until > now);
            if cache.len() >= self.capacity {
                cache.retain(|_, (r, _)| r.is_ok());
            }
            if cache.len() >= self.capacity {
                return;
            }
        }
        cache.insert(key, entry);
    }

    /// Number of cached entries (both caches).
    pub fn len(&self) -> usize {
        self.cache.lock().unwrap().len() + self.others.lock().unwrap().len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn cache_key(token: &str, audience: &str) -> CacheKey {
    let mut h = Sha256::new();
    h.update(audience.as_bytes());
    h.update([0]);
    h.update(token.as_bytes());
    h.finalize().into()
}

/// Seconds since the epoch of the token's `exp` claim, if the token is a
/// JWT with one (no signature check: the TokenReview verified the token).
pub fn jwt_exp(token: &str) -> Option<i64> {
    use base64::Engine as _;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("exp")?.as_i64()
}

fn ttl_for(token: &str, now_unix: i64) -> Duration {
    match jwt_exp(token) {
        Some(exp) if exp > now_unix => Duration::from_secs((exp - now_unix) as u64),
        Some(_) => Duration::ZERO,
        None => DEFAULT_TTL,
    }
}

impl<R: TokenReviewer> TokenReviewer for CachedReviewer<R> {
    fn review<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
    ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
        self.review_from(token, audience, None)
    }

    fn review_from<'a>(
        &'a self,
        token: &'a str,
        audience: &'a str,
        source: Option<std::net::IpAddr>,
    ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
        Box::pin(async move {
            let key = cache_key(token, audience);
            let now = Instant::now();
            if let Some((r, until)) = self.cache.lock().unwrap().get(&key)
                && *until > now
            {
                return r.clone();
            }
            let other = self
                .others
                .lock()
                .unwrap()
                .get(&key)
                .filter(|(_, until)| *until > now)
                .map(|(r, _)| r.clone());
            // A miss costs a TokenReview: charged to the source, then
            // bounded in flight across all sources. A user that is not the
            // agent is charged on a hit too.
            if let Some(ip) = source
                && let Err(wait) = self.sources.take(ip, now)
            {
                self.metrics.tokenreview_throttled("source");
                return Err(AuthError::Throttled(
                    format!("too many unknown tokens from {ip}; retry after {wait}s"),
                    wait,
                ));
            }
            if let Some(r) = other {
                return r;
            }
            let Ok(Ok(_permit)) =
                tokio::time::timeout(self.limits.queue_timeout, self.in_flight.acquire()).await
            else {
                self.metrics.tokenreview_throttled("in_flight");
                return Err(AuthError::Unavailable(
                    "too many token reviews in flight".into(),
                ));
            };
            let timer = self.metrics.tokenreview_duration.start_timer();
            let r = self.inner.review(token, audience).await;
            timer.observe_duration();
            let ttl = match &r {
                Ok(_) => ttl_for(token, jiff::Timestamp::now().as_second()),
                Err(AuthError::Unauthenticated(_)) => NEGATIVE_TTL,
                Err(AuthError::Unavailable(_)) => {
                    self.shared.api_error("tokenreview");
                    return r;
                }
                Err(AuthError::Throttled(..)) => return r,
            };
            if !ttl.is_zero() {
                if self.is_agent(&r) {
                    self.store(key, (r.clone(), now + ttl), now);
                } else {
                    self.store_other(key, (r.clone(), now + ttl), now);
                }
            }
            r
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A reviewer of `inner` measured on a new registry.
    fn cached<R: TokenReviewer>(
        inner: R,
        capacity: usize,
        limits: ReviewLimits,
    ) -> CachedReviewer<R> {
        let shared = Metrics::new();
        let metrics = TokenReviewMetrics::register(&shared);
        CachedReviewer::with_limits(inner, shared, metrics, capacity, limits)
    }

    pub(crate) fn agent_user(pod: &str, uid: &str, node: Option<&str>) -> ReviewedUser {
        let mut extra = BTreeMap::new();
        extra.insert(EXTRA_POD_NAME.to_string(), vec![pod.to_string()]);
        extra.insert(EXTRA_POD_UID.to_string(), vec![uid.to_string()]);
        if let Some(n) = node {
            extra.insert(EXTRA_NODE_NAME.to_string(), vec![n.to_string()]);
        }
        ReviewedUser {
            username: "system:serviceaccount:mg:agent".into(),
            uid: "sa-uid".into(),
            extra,
        }
    }

    #[test]
    fn a_token_review_answer_must_confirm_the_audience() {
        use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo};
        let ok = |aud: Option<Vec<&str>>| TokenReviewStatus {
            authenticated: Some(true),
            audiences: aud.map(|a| a.into_iter().map(String::from).collect()),
            user: Some(UserInfo {
                username: Some("system:serviceaccount:mg:agent".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(reviewed_user(ok(Some(vec!["mountguard"])), "mountguard").is_ok());
        for aud in [None, Some(vec![]), Some(vec!["api"])] {
            assert!(
                matches!(
                    reviewed_user(ok(aud.clone()), "mountguard"),
                    Err(AuthError::Unauthenticated(_))
                ),
                "{aud:?}"
            );
        }
        let mut no = ok(Some(vec!["mountguard"]));
        no.authenticated = Some(false);
        assert!(reviewed_user(no, "mountguard").is_err());
    }

    /// A reviewer with a fixed token table that counts calls.
    #[derive(Debug, Default)]
    pub(crate) struct FakeReviewer {
        pub tokens: HashMap<String, ReviewedUser>,
        pub calls: AtomicUsize,
        pub unavailable: std::sync::atomic::AtomicBool,
    }

    impl TokenReviewer for FakeReviewer {
        fn review<'a>(
            &'a self,
            token: &'a str,
            audience: &'a str,
        ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
            Box::pin(async move {
                self.calls.fetch_add(1, Ordering::SeqCst);
                if self.unavailable.load(Ordering::SeqCst) {
                    return Err(AuthError::Unavailable("503".into()));
                }
                if audience != "mountguard" {
                    return Err(AuthError::Unauthenticated("audience".into()));
                }
                self.tokens
                    .get(token)
                    .cloned()
                    .ok_or_else(|| AuthError::Unauthenticated("unknown token".into()))
            })
        }
    }

    #[tokio::test]
    async fn unknown_tokens_from_one_source_cost_at_most_its_burst() {
        let c = cached(
            FakeReviewer::default(),
            100,
            ReviewLimits {
                per_source_rate: 0.001,
                per_source_burst: 5,
                ..ReviewLimits::default()
            },
        );
        let attacker: std::net::IpAddr = "10.0.0.66".parse().unwrap();
        let mut throttled = 0;
        for i in 0..200 {
            match c
                .review_from(&format!("random-{i}"), "mountguard", Some(attacker))
                .await
            {
                Err(AuthError::Throttled(_, wait)) => {
                    assert!(wait >= 1);
                    throttled += 1;
                }
                Err(AuthError::Unauthenticated(_)) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 5);
        assert_eq!(throttled, 195);
        // Another source is not affected.
        let other: std::net::IpAddr = "10.0.0.7".parse().unwrap();
        assert!(matches!(
            c.review_from("x", "mountguard", Some(other)).await,
            Err(AuthError::Unauthenticated(_))
        ));
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 6);
    }

    #[tokio::test]
    async fn a_full_cache_drops_rejections_first_and_never_live_answers() {
        let now = jiff::Timestamp::now().as_second();
        let live: Vec<String> = (0..3).map(|i| jwt(now + 3600 + i)).collect();
        let mut f = FakeReviewer::default();
        for t in &live {
            f.tokens
                .insert(t.clone(), agent_user("agent-a", "ua", None));
        }
        let c = cached(f, 4, ReviewLimits::default());
        for t in &live {
            assert!(c.review(t, "mountguard").await.is_ok());
        }
        for i in 0..50 {
            let _ = c.review(&format!("junk-{i}"), "mountguard").await;
        }
        assert!(c.len() <= 4);
        let before = c.inner.calls.load(Ordering::SeqCst);
        for t in &live {
            assert!(c.review(t, "mountguard").await.is_ok());
        }
        assert_eq!(
            c.inner.calls.load(Ordering::SeqCst),
            before,
            "a live answer was evicted by rejections"
        );
    }

    /// 1,000 valid tokens of another ServiceAccount with the audience, 20
    /// from each of 50 addresses (within the per-source burst): the
    /// agents' entries stay, a rotated agent token costs one review for
    /// five reports, and replaying a tenant token is charged to its source.
    #[tokio::test]
    async fn token_review_cache_flush() {
        let mut f = FakeReviewer::default();
        let tenant = |i: usize| ReviewedUser {
            username: "system:serviceaccount:tenant:default".into(),
            uid: format!("t{i}"),
            extra: BTreeMap::new(),
        };
        for i in 0..1000 {
            f.tokens.insert(format!("tenant-{i}"), tenant(i));
        }
        for t in ["agent-old", "agent-new"] {
            f.tokens.insert(t.into(), agent_user("agent-a", "ua", None));
        }
        let c = cached(
            f,
            100,
            ReviewLimits {
                per_source_rate: 0.001,
                per_source_burst: 20,
                ..ReviewLimits::default()
            },
        )
        .for_agent("system:serviceaccount:mg:agent");
        let agent_ip: std::net::IpAddr = "10.0.0.1".parse().unwrap();
        assert!(
            c.review_from("agent-old", "mountguard", Some(agent_ip))
                .await
                .is_ok()
        );
        for i in 0..1000 {
            let ip = std::net::IpAddr::from([127, 0, 1, (i / 20) as u8]);
            let r = c
                .review_from(&format!("tenant-{i}"), "mountguard", Some(ip))
                .await;
            assert_eq!(r.map(|u| u.uid), Ok(format!("t{i}")));
        }
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 1001);
        assert!(c.len() <= 100 + others_capacity(100), "{}", c.len());
        // The agent's cached token was not evicted.
        assert!(
            c.review_from("agent-old", "mountguard", Some(agent_ip))
                .await
                .is_ok()
        );
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 1001);
        // The rotated token: one review, then cached.
        for _ in 0..5 {
            assert!(
                c.review_from("agent-new", "mountguard", Some(agent_ip))
                    .await
                    .is_ok()
            );
        }
        assert_eq!(
            c.inner.calls.load(Ordering::SeqCst),
            1002,
            "a rotated agent token cost more than one review"
        );
        // A tenant token replayed from its exhausted source: throttled.
        let last = std::net::IpAddr::from([127, 0, 1, 49]);
        assert!(matches!(
            c.review_from("tenant-999", "mountguard", Some(last)).await,
            Err(AuthError::Throttled(..))
        ));
    }

    /// A reviewer that takes time and records the most reviews at once.
    #[derive(Debug, Default)]
    struct SlowReviewer {
        now: AtomicUsize,
        max: AtomicUsize,
    }

    impl TokenReviewer for SlowReviewer {
        fn review<'a>(
            &'a self,
            _token: &'a str,
            _audience: &'a str,
        ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
            Box::pin(async move {
                let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
                self.max.fetch_max(n, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                self.now.fetch_sub(1, Ordering::SeqCst);
                Err(AuthError::Unauthenticated("no".into()))
            })
        }
    }

    #[tokio::test]
    async fn reviews_in_flight_are_bounded_across_sources() {
        let c = std::sync::Arc::new(cached(
            SlowReviewer::default(),
            1000,
            ReviewLimits {
                in_flight: 3,
                queue_timeout: Duration::from_millis(120),
                ..ReviewLimits::default()
            },
        ));
        let tasks: Vec<_> = (0..40u8)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    let ip = std::net::IpAddr::from([10, 1, 0, i]);
                    c.review_from(&format!("t{i}"), "mountguard", Some(ip))
                        .await
                })
            })
            .collect();
        let mut unavailable = 0;
        for t in tasks {
            if matches!(t.await.unwrap(), Err(AuthError::Unavailable(_))) {
                unavailable += 1;
            }
        }
        assert!(c.inner.max.load(Ordering::SeqCst) <= 3);
        assert!(
            unavailable > 0,
            "40 slow reviews, 3 at a time, 120 ms queue"
        );
        assert_eq!(
            c.metrics
                .tokenreview_throttled
                .with_label_values(&["in_flight"])
                .get(),
            unavailable
        );
    }

    fn jwt(exp: i64) -> String {
        use base64::Engine as _;
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.sig",
            e.encode(br#"{"alg":"RS256"}"#),
            e.encode(format!(r#"{{"exp":{exp},"sub":"x"}}"#))
        )
    }

    #[tokio::test]
    async fn cache_answers_until_expiry_and_never_caches_api_trouble() {
        let now = jiff::Timestamp::now().as_second();
        let live = jwt(now + 3600);
        let expired = jwt(now - 10);
        let mut f = FakeReviewer::default();
        f.tokens
            .insert(live.clone(), agent_user("agent-a", "ua", None));
        f.tokens
            .insert(expired.clone(), agent_user("agent-a", "ua", None));
        let c = cached(f, 4, ReviewLimits::default());
        for _ in 0..3 {
            assert!(c.review(&live, "mountguard").await.is_ok());
        }
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 1);
        // An already-expired token is never cached.
        for _ in 0..2 {
            let _ = c.review(&expired, "mountguard").await;
        }
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 3);
        // Unknown tokens: cached briefly as rejections.
        for _ in 0..2 {
            assert!(matches!(
                c.review("nope", "mountguard").await,
                Err(AuthError::Unauthenticated(_))
            ));
        }
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 4);
        // API trouble is not cached.
        c.inner.unavailable.store(true, Ordering::SeqCst);
        for _ in 0..2 {
            assert!(matches!(
                c.review("other", "mountguard").await,
                Err(AuthError::Unavailable(_))
            ));
        }
        assert_eq!(c.inner.calls.load(Ordering::SeqCst), 6);
        // Bounded.
        for i in 0..10 {
            let _ = c.review(&format!("t{i}"), "mountguard").await;
        }
        assert!(c.len() <= 4);
        assert_eq!(jwt_exp(&live), Some(now + 3600));
        assert_eq!(jwt_exp("not-a-jwt"), None);
        assert_eq!(ttl_for("opaque", now), DEFAULT_TTL);
    }
}
