//! The API server double: the Kubernetes REST API over HTTP (JSON only),
//! with list/watch/resourceVersion semantics, graceful pod deletion,
//! PDB-aware eviction, TokenReviews, the service proxy (`proxy.rs`) and
//! faults on demand.
//!
//! It serves the paths the real `kube` client uses; see
//! [`resources::ALL`] for the types. Storage is [`store::Store`].
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

pub mod patch;
pub mod proxy;
pub mod resources;
pub mod selectors;
pub mod status;
pub mod store;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::http::{self, Body, Server};
use patch::PatchType;
use resources::ResourceType;
use selectors::{FieldSelector, LabelSelector};
pub use status::ApiError;
use store::Store;
pub use store::{DeleteOptions, EventType, Filter, StoredEvent};

/// Who a token authenticates as, for TokenReviews.
#[derive(Debug, Clone, Default)]
pub struct TokenUser {
    /// `user.username`, e.g. `system:serviceaccount:ns:sa`.
    pub username: String,
    /// `user.uid`.
    pub uid: String,
    /// `user.groups`.
    pub groups: Vec<String>,
    /// `user.extra` (e.g. `authentication.kubernetes.io/pod-name`).
    pub extra: BTreeMap<String, Vec<String>>,
    /// Audiences the token is valid for (empty: the API server's own).
    pub audiences: Vec<String>,
}

/// One permission for SubjectAccessReviews, as an RBAC binding gives it:
/// `namespace: None` is a ClusterRoleBinding (every namespace and the
/// cluster scope), `Some(ns)` a RoleBinding in `ns`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessGrant {
    /// A user name, or `group:<name>` for a group.
    pub subject: String,
    /// Verb (`*` for any).
    pub verb: String,
    /// API group (`*` for any).
    pub group: String,
    /// Resource (`*` for any).
    pub resource: String,
    /// Where the binding applies.
    pub namespace: Option<String>,
}

impl AccessGrant {
    /// Whether this grant allows the request (RBAC's rules, written from
    /// `plugin/pkg/auth/authorizer/rbac/rbac.go` `RBACAuthorizer.Authorize`
    /// visiting ClusterRoleBindings everywhere and RoleBindings only in the
    /// request's namespace, and `pkg/apis/rbac/v1/evaluation_helpers.go`
    /// `VerbMatches`, `APIGroupMatches`, `ResourceMatches` with `*`).
    fn allows(&self, user: &str, groups: &[String], attrs: &Value) -> bool {
        let subject = match self.subject.strip_prefix("group:") {
            Some(g) => groups.iter().any(|x| x == g),
            None => self.subject == user,
        };
        let field = |k: &str| attrs[k].as_str().unwrap_or("");
        let m = |rule: &str, want: &str| rule == "*" || rule == want;
        let ns = field("namespace");
        let scope = match &self.namespace {
            None => true,
            Some(b) => !ns.is_empty() && b == ns,
        };
        subject
            && scope
            && m(&self.verb, field("verb"))
            && m(&self.group, field("group"))
            && m(&self.resource, field("resource"))
    }
}

/// How many requests [`ApiHandle::requests`] keeps (the oldest half is
/// dropped when full).
pub const MAX_RECORDED_REQUESTS: usize = 100_000;

/// One recorded request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub uri: String,
}

#[derive(Debug, Default)]
struct Faults {
    delay: Duration,
    /// (status code, remaining count, path substring filter)
    fail: Vec<(u16, usize, Option<String>)>,
}

#[derive(Debug)]
struct Inner {
    store: Mutex<Store>,
    changed: watch::Sender<u64>,
    drop_watches: watch::Sender<u64>,
    expire_watches: watch::Sender<u64>,
    faults: Mutex<Faults>,
    tokens: Mutex<HashMap<String, TokenUser>>,
    grants: Mutex<Vec<AccessGrant>>,
    requests: Mutex<Vec<RequestRecord>>,
    bookmark_interval: Mutex<Duration>,
    url: Mutex<String>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Direct access to the API double's objects (no HTTP), for the other
/// doubles and for tests. Cloneable; every change is visible to watches.
#[derive(Debug, Clone)]
pub struct ApiHandle {
    inner: Arc<Inner>,
}

impl ApiHandle {
    fn mutate<T>(&self, f: impl FnOnce(&mut Store) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let (out, rv) = {
            let mut s = lock(&self.inner.store);
            let out = f(&mut s);
            (out, s.rv())
        };
        self.inner.changed.send_replace(rv);
        out
    }

    /// Creates an object (`ns` ignored for cluster-scoped types).
    pub fn create(&self, rt: &ResourceType, ns: &str, obj: Value) -> Result<Value, ApiError> {
        self.mutate(|s| s.create(rt, ns, obj))
    }

    /// Gets an object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        let ns = if rt.namespaced { ns } else { "" };
        lock(&self.inner.store).get(rt, ns, name)
    }

    /// Lists objects.
    pub fn list(&self, filter: &Filter) -> (Vec<Value>, u64) {
        lock(&self.inner.store).list(filter)
    }

    /// Lists every object of a type in a namespace (None: all).
    pub fn list_all(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        self.list(&Filter {
            namespace: ns.map(String::from),
            ..Filter::all(*rt)
        })
        .0
    }

    /// Replaces an object (PUT semantics, incl. resourceVersion conflicts).
    pub fn replace(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        self.mutate(|s| s.update(rt, ns, name, obj, None))
    }

    /// Replaces an object's status.
    pub fn replace_status(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        self.mutate(|s| s.update(rt, ns, name, obj, Some("status")))
    }

    /// Applies a JSON merge patch (optionally to a subresource).
    pub fn merge_patch(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        patch: &Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        let body = serde_json::to_vec(patch).unwrap_or_default();
        self.mutate(|s| patch_in(s, rt, ns, name, PatchType::Merge, &body, subresource, None))
    }

    /// Deletes an object.
    pub fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<store::Deleted, ApiError> {
        self.mutate(|s| s.delete(rt, ns, name, opts))
    }

    /// Binds an unbound pod to `node` (the scheduler's `binding` call).
    pub fn bind(&self, ns: &str, name: &str, node: &str) -> Result<Value, ApiError> {
        self.mutate(|s| s.bind(ns, name, node))
    }

    /// Evicts a pod (PDB-aware).
    pub fn evict(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        self.mutate(|s| s.evict(ns, name, &DeleteOptions::default()))
    }

    /// Creates a namespace (ok if it exists).
    pub fn ensure_namespace(&self, name: &str) -> Result<(), ApiError> {
        match self.create(
            &resources::NAMESPACES,
            "",
            json!({"metadata": {"name": name}}),
        ) {
            Ok(_) => Ok(()),
            Err(e) if e.reason == "AlreadyExists" => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        lock(&self.inner.store).rv()
    }

    /// A subscription to the event log from resourceVersion `from`.
    pub fn subscribe(&self, from: u64) -> Subscription {
        Subscription {
            inner: self.inner.clone(),
            last: from,
            rx: self.inner.changed.subscribe(),
        }
    }

    /// Makes TokenReviews authenticate `token` as `user`.
    pub fn add_token(&self, token: &str, user: TokenUser) {
        lock(&self.inner.tokens).insert(token.to_string(), user);
    }

    /// Makes SubjectAccessReviews allow what `grant` allows.
    pub fn grant(&self, grant: AccessGrant) {
        lock(&self.inner.grants).push(grant);
    }

    /// Forgets a token.
    pub fn remove_token(&self, token: &str) {
        lock(&self.inner.tokens).remove(token);
    }

    /// Every request served so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.inner.requests).clone()
    }

    /// Fault: closes every open watch stream (clients reconnect).
    pub fn drop_watches(&self) {
        self.inner.drop_watches.send_modify(|g| *g += 1);
    }

    /// Fault: compacts the event log and sends every open watch an ERROR
    /// event with a `410 Expired` Status, forcing clients to re-list.
    pub fn expire_watches(&self) {
        lock(&self.inner.store).compact_all();
        self.inner.expire_watches.send_modify(|g| *g += 1);
    }

    /// Sets how many events the log keeps (older versions get 410).
    pub fn set_event_log_capacity(&self, cap: usize) {
        lock(&self.inner.store).set_ring_capacity(cap);
    }

    /// Fault: delays every response.
    pub fn set_delay(&self, d: Duration) {
        lock(&self.inner.faults).delay = d;
    }

    /// Fault: the next `count` requests whose path contains `path` (any if
    /// None) fail with `code` (500 InternalError, 429 TooManyRequests, ...).
    pub fn fail_requests(&self, code: u16, count: usize, path: Option<&str>) {
        lock(&self.inner.faults)
            .fail
            .push((code, count, path.map(String::from)));
    }

    /// Clears every fault.
    pub fn clear_faults(&self) {
        *lock(&self.inner.faults) = Faults::default();
    }

    /// Sets how often watches with `allowWatchBookmarks` get a BOOKMARK.
    pub fn set_bookmark_interval(&self, d: Duration) {
        *lock(&self.inner.bookmark_interval) = d;
    }

    /// The server URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        lock(&self.inner.url).clone()
    }
}

/// An in-process subscription to the event log.
#[derive(Debug)]
pub struct Subscription {
    inner: Arc<Inner>,
    last: u64,
    rx: watch::Receiver<u64>,
}

impl Subscription {
    /// The next batch of events; `Err(410)` if this subscription fell behind
    /// the log (re-list and subscribe again).
    pub async fn next(&mut self) -> Result<Vec<StoredEvent>, ApiError> {
        loop {
            {
                let s = lock(&self.inner.store);
                let evs = s.events_since(self.last)?;
                if let Some(last) = evs.last() {
                    self.last = last.rv;
                    return Ok(evs);
                }
            }
            if self.rx.changed().await.is_err() {
                return Err(ApiError::internal("API server double stopped"));
            }
        }
    }

    /// The last resourceVersion delivered.
    pub fn position(&self) -> u64 {
        self.last
    }
}

/// Configuration of the API server double.
#[derive(Debug, Clone)]
pub struct ApiServerConfig {
    /// Events kept for watches.
    pub event_log_capacity: usize,
    /// BOOKMARK interval.
    pub bookmark_interval: Duration,
}

impl Default for ApiServerConfig {
    fn default() -> Self {
        Self {
            event_log_capacity: 10_000,
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

/// A running API server double.
#[derive(Debug)]
pub struct ApiServerDouble {
    handle: ApiHandle,
    server: Server,
    stop: watch::Sender<bool>,
}

impl ApiServerDouble {
    /// Starts with defaults on `127.0.0.1:0`; creates the `default` namespace.
    pub async fn start() -> std::io::Result<Self> {
        Self::start_with(ApiServerConfig::default()).await
    }

    /// Starts with a configuration.
    pub async fn start_with(config: ApiServerConfig) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            store: Mutex::new(Store::new(config.event_log_capacity)),
            changed: watch::channel(0).0,
            drop_watches: watch::channel(0).0,
            expire_watches: watch::channel(0).0,
            faults: Mutex::new(Faults::default()),
            tokens: Mutex::new(HashMap::new()),
            grants: Mutex::new(Vec::new()),
            requests: Mutex::new(Vec::new()),
            bookmark_interval: Mutex::new(config.bookmark_interval),
            url: Mutex::new(String::new()),
        });
        let (stop, stop_rx) = watch::channel(false);
        let handle = ApiHandle {
            inner: inner.clone(),
        };
        let h = handle.clone();
        let server = Server::start(move |req| {
            let h = h.clone();
            let stop_rx = stop_rx.clone();
            async move { serve(h, req, stop_rx).await }
        })
        .await?;
        *lock(&inner.url) = server.url();
        for ns in ["default", "kube-system"] {
            handle
                .ensure_namespace(ns)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
        }
        Ok(Self {
            handle,
            server,
            stop,
        })
    }

    /// The URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Direct object access.
    pub fn handle(&self) -> ApiHandle {
        self.handle.clone()
    }

    /// Stops the server and ends every watch.
    pub async fn shutdown(&mut self) {
        let _ = self.stop.send(true);
        self.server.shutdown().await;
    }
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = http::json(e.status_code(), &e.to_status());
    if e.code == 429
        && e.details
            .as_ref()
            .is_some_and(|d| d.get("retryAfterSeconds").is_some())
    {
        r.headers_mut()
            .insert("retry-after", ::http::HeaderValue::from_static("1"));
    }
    r
}

fn query_map(query: Option<&str>) -> HashMap<String, String> {
    let mut m = HashMap::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        m.insert(percent_decode(k), percent_decode(v));
    }
    m
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(b) => {
                    out.push(b);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A parsed resource path.
#[derive(Debug)]
struct Target {
    rt: ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    sub: Option<String>,
}

fn parse_path(path: &str) -> Option<Result<Target, ApiError>> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segs.as_slice() {
        ["api", v, rest @ ..] if !rest.is_empty() => ("", *v, rest),
        ["apis", g, v, rest @ ..] if !rest.is_empty() => (*g, *v, rest),
        _ => return None,
    };
    let (ns, res, name, sub) = match rest {
        ["namespaces", ns, res] => (Some(*ns), *res, None, None),
        ["namespaces", ns, res, name] => (Some(*ns), *res, Some(*name), None),
        ["namespaces", ns, res, name, sub] => (Some(*ns), *res, Some(*name), Some(*sub)),
        [res] => (None, *res, None, None),
        [res, name] => (None, *res, Some(*name), None),
        [res, name, sub] => (None, *res, Some(*name), Some(*sub)),
        _ => return None,
    };
    let rt = resources::find(group, version, res)?;
    if ns.is_some() && !rt.namespaced {
        return None;
    }
    if rt.namespaced && name.is_some() && ns.is_none() {
        return None;
    }
    if let Some(s) = sub
        && !rt.subresources.contains(&s)
    {
        return Some(Err(ApiError::not_found(&rt, name.unwrap_or(""))));
    }
    Some(Ok(Target {
        rt,
        namespace: ns.map(String::from),
        name: name.map(String::from),
        sub: sub.map(String::from),
    }))
}

async fn serve(
    h: ApiHandle,
    req: Request<Incoming>,
    stop: watch::Receiver<bool>,
) -> Response<Body> {
    let uri = req.uri().clone();
    {
        let mut log = lock(&h.inner.requests);
        if log.len() >= MAX_RECORDED_REQUESTS {
            log.drain(..MAX_RECORDED_REQUESTS / 2);
        }
        log.push(RequestRecord {
            method: req.method().to_string(),
            uri: uri.to_string(),
        });
    }
    let (delay, fail) = {
        let mut f = lock(&h.inner.faults);
        let path = uri.path().to_string();
        let mut fail = None;
        for (code, remaining, filter) in f.fail.iter_mut() {
            if *remaining > 0 && filter.as_ref().is_none_or(|p| path.contains(p.as_str())) {
                *remaining -= 1;
                fail = Some(*code);
                break;
            }
        }
        f.fail.retain(|(_, r, _)| *r > 0);
        (f.delay, fail)
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(code) = fail {
        let e = match code {
            429 => ApiError::too_many_requests(
                "the API server double was told to throttle this request",
            ),
            c => ApiError {
                code: c,
                reason: match c {
                    503 => "ServiceUnavailable",
                    // As the Eviction API answers when its update of a
                    // PodDisruptionBudget conflicts.
                    409 => "Conflict",
                    _ => "InternalError",
                },
                message: format!("the API server double was told to fail this request with {c}"),
                details: None,
            },
        };
        return error_response(&e);
    }
    match route(&h, req, stop).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

async fn route(
    h: &ApiHandle,
    req: Request<Incoming>,
    stop: watch::Receiver<bool>,
) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    if method == Method::GET
        && let Some(doc) = discovery(h, &path)
    {
        return Ok(http::json(StatusCode::OK, &doc));
    }
    if let Some(t) = proxy::parse(&path) {
        return proxy::serve(h, t?, req).await;
    }
    let Some(target) = parse_path(&path) else {
        return Ok(http::not_found());
    };
    let t = target?;
    let q = query_map(req.uri().query());
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json")
        .to_string();
    let ns = t.namespace.clone().unwrap_or_default();
    match (&method, &t.name, t.sub.as_deref()) {
        (&Method::GET, None, None) => {
            if t.rt.create_only {
                return Err(ApiError::method_not_allowed(t.rt.resource));
            }
            let filter = Filter {
                rt: t.rt,
                namespace: t.namespace.clone(),
                labels: LabelSelector::parse(q.get("labelSelector").map_or("", String::as_str))?,
                fields: FieldSelector::parse(
                    t.rt.resource,
                    q.get("fieldSelector").map_or("", String::as_str),
                )?,
            };
            if matches!(q.get("watch").map(String::as_str), Some("1" | "true")) {
                Ok(watch_response(h, filter, &q, stop))
            } else {
                list_response(h, &filter, &q)
            }
        }
        (&Method::POST, None, None) => {
            let body = json_body(req).await?;
            if t.rt == resources::TOKEN_REVIEWS {
                return Ok(http::json(StatusCode::CREATED, &token_review(h, body)));
            }
            if t.rt == resources::SUBJECT_ACCESS_REVIEWS {
                return Ok(http::json(
                    StatusCode::CREATED,
                    &subject_access_review(h, body),
                ));
            }
            if dry_run(&q) {
                return Err(ApiError::bad_request(
                    "dryRun is not supported by the API server double",
                ));
            }
            let obj = h.create(&t.rt, &ns, body)?;
            Ok(http::json(StatusCode::CREATED, &obj))
        }
        (&Method::GET, Some(name), None | Some("status")) => {
            Ok(http::json(StatusCode::OK, &h.get(&t.rt, &ns, name)?))
        }
        (&Method::PUT, Some(name), sub @ (None | Some("status"))) => {
            let body = json_body(req).await?;
            let obj = h.mutate(|s| s.update(&t.rt, &ns, name, body, sub))?;
            Ok(http::json(StatusCode::OK, &obj))
        }
        (&Method::PATCH, Some(name), sub @ (None | Some("status"))) => {
            let kind = PatchType::from_content_type(&content_type)?;
            let (_, body) = http::read_body(req).await.map_err(ApiError::bad_request)?;
            let manager = q.get("fieldManager").cloned();
            let (obj, created) = h.mutate(|s| {
                if kind == PatchType::Apply {
                    apply_in(s, &t.rt, &ns, name, &body, sub, manager.as_deref())
                } else {
                    patch_in(s, &t.rt, &ns, name, kind, &body, sub, manager.as_deref())
                        .map(|o| (o, false))
                }
            })?;
            let code = if created {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            Ok(http::json(code, &obj))
        }
        (&Method::DELETE, Some(name), None) => {
            let (_, body) = http::read_body(req).await.map_err(ApiError::bad_request)?;
            let mut opts = if body.is_empty() {
                DeleteOptions::default()
            } else {
                let v: Value = serde_json::from_slice(&body)
                    .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?;
                DeleteOptions::from_value(&v)
            };
            if let Some(g) = q.get("gracePeriodSeconds").and_then(|g| g.parse().ok()) {
                opts.grace_period_seconds = Some(g);
            }
            if opts.dry_run || dry_run(&q) {
                return Err(ApiError::bad_request(
                    "dryRun is not supported by the API server double (but for evictions)",
                ));
            }
            let d = h.delete(&t.rt, &ns, name, &opts)?;
            if t.rt == resources::PODS || !d.gone {
                Ok(http::json(StatusCode::OK, &d.object))
            } else {
                let mut details = json!({"name": name, "kind": t.rt.resource, "uid": d.object["metadata"]["uid"]});
                if !t.rt.group.is_empty() {
                    details["group"] = json!(t.rt.group);
                }
                Ok(http::json(
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details}),
                ))
            }
        }
        (&Method::POST, Some(name), Some("eviction")) => {
            let body = json_body(req).await?;
            let mut opts = DeleteOptions::from_value(&body["deleteOptions"]);
            opts.dry_run = eviction_dry_run(&q, &body["deleteOptions"]["dryRun"])?;
            h.mutate(|s| s.evict(&ns, name, &opts))?;
            Ok(http::json(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        _ => Err(ApiError::method_not_allowed(&format!("{method} {path}"))),
    }
}

fn dry_run(q: &HashMap<String, String>) -> bool {
    q.get("dryRun").is_some_and(|v| !v.is_empty())
}

/// Whether an eviction is a dry run: `dryRun` in the query (the create
/// options) or in the Eviction's `deleteOptions`, which must agree when
/// both are given (kubernetes pkg/registry/core/pod/storage/eviction.go,
/// `propagateDryRun`); `All` is the only value
/// (k8s.io/apimachinery/pkg/apis/meta/v1/validation, `ValidateDryRun`).
fn eviction_dry_run(q: &HashMap<String, String>, in_body: &Value) -> Result<bool, ApiError> {
    let query: Vec<&str> = q
        .get("dryRun")
        .map(|v| vec![v.as_str()])
        .unwrap_or_default();
    let body: Vec<&str> = in_body
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(bad) = query.iter().chain(body.iter()).find(|v| **v != "All") {
        return Err(ApiError::bad_request(format!(
            "dryRun: Unsupported value: {bad:?}: supported values: \"All\""
        )));
    }
    if !query.is_empty() && !body.is_empty() && query != body {
        return Err(ApiError::bad_request(format!(
            "Non-matching dry-run options in request and content: {query:?} and {body:?}"
        )));
    }
    Ok(!query.is_empty() || !body.is_empty())
}

async fn json_body(req: Request<Incoming>) -> Result<Value, ApiError> {
    let (_, body) = http::read_body(req).await.map_err(ApiError::bad_request)?;
    serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON: {e}"
        ))
    })
}

#[allow(clippy::too_many_arguments)]
fn patch_in(
    s: &mut Store,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    kind: PatchType,
    body: &[u8],
    sub: Option<&str>,
    _manager: Option<&str>,
) -> Result<Value, ApiError> {
    let nsk = if rt.namespaced { ns } else { "" };
    let old = s.get(rt, nsk, name)?;
    // A resourceVersion in the patch is a precondition (it replaces the
    // current one and `update` checks it); otherwise the patch applies to the
    // current version.
    let new = patch::apply_patch(&old, kind, body)?;
    s.update(rt, nsk, name, new, sub)
}

fn apply_in(
    s: &mut Store,
    rt: &ResourceType,
    ns: &str,
    name: &str,
    body: &[u8],
    sub: Option<&str>,
    manager: Option<&str>,
) -> Result<(Value, bool), ApiError> {
    let Some(manager) = manager.filter(|m| !m.is_empty()) else {
        return Err(ApiError::bad_request(
            "PATCH, fieldManager: Required value: is required for apply patch",
        ));
    };
    let config: Value = serde_json::from_slice(body).map_err(|_| {
        ApiError::unsupported(
            "the API server double accepts apply configurations in JSON only (a subset of YAML)",
        )
    })?;
    let nsk = if rt.namespaced { ns } else { "" };
    match s.get(rt, nsk, name) {
        Ok(old) => {
            let mut new = patch::server_side_apply(Some(&old), &config, manager, sub)?;
            new["metadata"]["resourceVersion"] =
                match config["metadata"]["resourceVersion"].as_str() {
                    Some(rv) => json!(rv),
                    None => old["metadata"]["resourceVersion"].clone(),
                };
            s.update(rt, nsk, name, new, sub).map(|o| (o, false))
        }
        Err(e) if e.code == 404 && sub.is_none() => {
            let mut new = patch::server_side_apply(None, &config, manager, None)?;
            new["metadata"]["name"] = json!(name);
            s.create(rt, ns, new).map(|o| (o, true))
        }
        Err(e) => Err(e),
    }
}

fn list_response(
    h: &ApiHandle,
    filter: &Filter,
    q: &HashMap<String, String>,
) -> Result<Response<Body>, ApiError> {
    let (items, rv) = h.list(filter);
    let limit: usize = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let start = match q.get("continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            use base64::Engine;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(token)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            let (crv, after) = raw
                .split_once('|')
                .ok_or_else(|| ApiError::bad_request("invalid continue token"))?;
            let crv: u64 = crv
                .parse()
                .map_err(|_| ApiError::bad_request("invalid continue token"))?;
            if crv < lock(&h.inner.store).compacted() {
                return Err(ApiError {
                    code: 410,
                    reason: "Expired",
                    message: "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.".into(),
                    details: None,
                });
            }
            items
                .iter()
                .position(|o| {
                    let (ns, n) = store::object_ref(o);
                    format!("{ns}/{n}").as_str() > after
                })
                .unwrap_or(items.len())
        }
        None => 0,
    };
    let end = start.saturating_add(limit).min(items.len());
    let page = items[start..end].to_vec();
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if end < items.len()
        && let Some(last) = page.last()
    {
        use base64::Engine;
        let (ns, n) = store::object_ref(last);
        metadata["continue"] =
            json!(base64::engine::general_purpose::STANDARD.encode(format!("{rv}|{ns}/{n}")));
        metadata["remainingItemCount"] = json!(items.len() - end);
    }
    Ok(http::json(
        StatusCode::OK,
        &json!({
            "kind": format!("{}List", filter.rt.kind),
            "apiVersion": filter.rt.api_version(),
            "metadata": metadata,
            "items": page,
        }),
    ))
}

fn watch_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

fn watch_response(
    h: &ApiHandle,
    filter: Filter,
    q: &HashMap<String, String>,
    mut stop: watch::Receiver<bool>,
) -> Response<Body> {
    let (tx, body) = http::streaming();
    let bookmarks = matches!(
        q.get("allowWatchBookmarks").map(String::as_str),
        Some("true" | "1")
    );
    let send_initial = matches!(
        q.get("sendInitialEvents").map(String::as_str),
        Some("true" | "1")
    );
    let rv: Option<u64> = q
        .get("resourceVersion")
        .and_then(|v| v.parse().ok())
        .filter(|v| *v > 0);
    let timeout = q
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let inner = h.inner.clone();
    let mut changed = inner.changed.subscribe();
    let mut dropped = inner.drop_watches.subscribe();
    let mut expired = inner.expire_watches.subscribe();
    let interval = *lock(&inner.bookmark_interval);
    let rt = filter.rt;
    let bookmark = move |rv: u64, initial_end: bool| {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        watch_line(
            "BOOKMARK",
            &json!({"kind": rt.kind, "apiVersion": rt.api_version(), "metadata": meta}),
        )
    };
    tokio::spawn(async move {
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        // Initial state: synthetic ADDED events when starting from "any"
        // version or when asked for them (streaming lists).
        let initial = {
            let s = lock(&inner.store);
            match rv {
                Some(rv) if !send_initial => Err(rv),
                _ => Ok(s.list(&filter)),
            }
        };
        let mut last = match initial {
            Err(rv) => rv,
            Ok((items, now)) => {
                for it in &items {
                    if tx.send(watch_line("ADDED", it)).await.is_err() {
                        return;
                    }
                }
                if send_initial && bookmarks && tx.send(bookmark(now, true)).await.is_err() {
                    return;
                }
                now
            }
        };
        loop {
            let batch = lock(&inner.store).events_since(last);
            match batch {
                Err(e) => {
                    let _ = tx.send(watch_line("ERROR", &e.to_status())).await;
                    return;
                }
                Ok(evs) => {
                    for ev in &evs {
                        if let Some((kind, obj)) = filter.translate(ev)
                            && tx.send(watch_line(kind.as_str(), &obj)).await.is_err()
                        {
                            return;
                        }
                        last = ev.rv;
                    }
                }
            }
            tokio::select! {
                r = changed.changed() => if r.is_err() { return },
                _ = ticker.tick(), if bookmarks => {
                    let now = lock(&inner.store).rv();
                    // Only bookmark a version whose events were all delivered.
                    if lock(&inner.store).events_since(last).map(|e| e.is_empty()).unwrap_or(false) {
                        last = last.max(now);
                    }
                    if tx.send(bookmark(last, false)).await.is_err() { return }
                }
                _ = dropped.changed() => return,
                _ = expired.changed() => {
                    let now = lock(&inner.store).compacted();
                    let _ = tx.send(watch_line("ERROR", &ApiError::expired(last, now).to_status())).await;
                    return;
                }
                _ = stop.changed() => return,
                _ = &mut deadline => return,
                _ = tx.closed() => return,
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("transfer-encoding", "chunked")
        .body(body)
        .unwrap_or_else(|_| Response::new(http::full(Bytes::new())))
}

/// The double's own audiences (the real API server's `--api-audiences`,
/// by default its service account issuer).
pub const API_AUDIENCES: [&str; 1] = ["https://kubernetes.default.svc"];

/// The strings of JSON array `v` (none when it is not an array; items that
/// are not strings skipped).
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// A TokenReview, as kubernetes/kubernetes
/// `pkg/registry/authentication/tokenreview/storage.go` `(*REST).Create`
/// answers it: the audiences checked are `spec.audiences`, or when empty
/// the API server's own (`auds = r.apiAudiences`, from `--api-audiences`),
/// never "any"; a token none of whose audiences is among them is not
/// authenticated, and `status.audiences` lists the ones that matched.
fn token_review(h: &ApiHandle, body: Value) -> Value {
    let token = body["spec"]["token"].as_str().unwrap_or("");
    let mut wanted = strings(&body["spec"]["audiences"]);
    if wanted.is_empty() {
        wanted = API_AUDIENCES.iter().map(|a| a.to_string()).collect();
    }
    let user = lock(&h.inner.tokens).get(token).cloned();
    let status = match user {
        None => {
            json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, token lookup failed]"})
        }
        Some(u) => {
            let token_aud = if u.audiences.is_empty() {
                API_AUDIENCES.iter().map(|a| a.to_string()).collect()
            } else {
                u.audiences.clone()
            };
            let matched: Vec<String> = wanted
                .iter()
                .filter(|a| token_aud.contains(a))
                .cloned()
                .collect();
            if matched.is_empty() {
                json!({"authenticated": false, "user": {}, "error": "[invalid bearer token, token audiences is invalid for the target audiences]"})
            } else {
                json!({
                    "authenticated": true,
                    "user": {"username": u.username, "uid": u.uid, "groups": u.groups, "extra": u.extra},
                    "audiences": matched,
                })
            }
        }
    };
    json!({
        "kind": "TokenReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": body["spec"].clone(),
        "status": status,
    })
}

/// A SubjectAccessReview answered from the grants (resource attributes
/// only; a request for a non-resource URL is not allowed).
fn subject_access_review(h: &ApiHandle, body: Value) -> Value {
    let spec = &body["spec"];
    let user = spec["user"].as_str().unwrap_or("");
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|g| g.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default();
    let attrs = &spec["resourceAttributes"];
    let allowed = attrs.is_object()
        && lock(&h.inner.grants)
            .iter()
            .any(|g| g.allows(user, &groups, attrs));
    json!({
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec.clone(),
        "status": if allowed {
            json!({"allowed": true, "reason": "granted by the API server double"})
        } else {
            json!({"allowed": false})
        },
    })
}

fn discovery(h: &ApiHandle, path: &str) -> Option<Value> {
    let p = path.trim_end_matches('/');
    let gvs = resources::group_versions();
    match p {
        "/version" => Some(json!({
            "major": "1", "minor": "37", "gitVersion": "v1.37.0-mountguard-double",
            "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.24", "compiler": "gc",
            "platform": format!("linux/{}", std::env::consts::ARCH),
        })),
        "/healthz" | "/readyz" | "/livez" => Some(json!("ok")),
        "/api" => Some(json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": h.url().trim_start_matches("http://")}],
        })),
        "/api/v1" => Some(resources::resource_list("", "v1")),
        "/apis" => Some(json!({
            "kind": "APIGroupList", "apiVersion": "v1",
            "groups": gvs.iter().filter(|(g, _)| !g.is_empty()).map(|(g, v)| group_doc(g, v)).collect::<Vec<_>>(),
        })),
        _ => {
            let rest = p.strip_prefix("/apis/")?;
            let parts: Vec<&str> = rest.split('/').collect();
            match parts.as_slice() {
                [g] => gvs.iter().find(|(gg, _)| gg == g).map(|(g, v)| {
                    let mut d = group_doc(g, v);
                    d["kind"] = json!("APIGroup");
                    d["apiVersion"] = json!("v1");
                    d
                }),
                [g, v] if gvs.contains(&(*g, *v)) => Some(resources::resource_list(g, v)),
                _ => None,
            }
        }
    }
}

fn group_doc(g: &str, v: &str) -> Value {
    let gv = json!({"groupVersion": format!("{g}/{v}"), "version": v});
    json!({"name": g, "versions": [gv.clone()], "preferredVersion": gv})
}
