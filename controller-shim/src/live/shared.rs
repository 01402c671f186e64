//! What every task of the live controller shares: the one shutdown signal,
//! the metrics, whether this replica acts and is ready, the published
//! verdicts and the health of the watches. Tasks depend on this module,
//! never on the wiring in `live/mod.rs` that starts them.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch as tokio_watch;

use super::metrics::Metrics;
use super::status::VerdictStore;

/// The field manager of every write of the controller (server-side
/// bookkeeping of which fields it set: `metadata.managedFields`).
pub const FIELD_MANAGER: &str = "mountguard-controller";

/// Parameters of every patch the controller sends, naming
/// [`FIELD_MANAGER`].
pub fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
}

/// A per-node token bucket: `RATE/s` with an optional burst
/// (`2/s,5` or `2/s burst 5`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    /// Tokens per second.
    pub per_second: f64,
    /// Bucket size.
    pub burst: u32,
}

impl std::str::FromStr for RateLimit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a rate like 2/s or 2/s,5 (rate per second, burst)");
        let s2 = s.trim();
        let (rate, burst) = match s2.split_once(',') {
            Some((r, b)) => (r.trim(), Some(b.trim())),
            None => match s2.split_once("burst") {
                Some((r, b)) => (r.trim(), Some(b.trim())),
                None => (s2, None),
            },
        };
        let rate = rate.strip_suffix("/s").unwrap_or(rate).trim();
        let per_second: f64 = rate.parse().map_err(|_| bad())?;
        if !(per_second.is_finite() && per_second > 0.0) {
            return Err(bad());
        }
        let burst = match burst {
            Some(b) => b.parse::<u32>().map_err(|_| bad())?,
            None => (per_second.ceil() as u32).max(1),
        };
        if burst == 0 {
            return Err(bad());
        }
        Ok(Self { per_second, burst })
    }
}

/// A token bucket: `burst` tokens, refilled at `per_second`.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    refilled: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(burst: u32, now: Instant) -> Self {
        Self {
            tokens: f64::from(burst),
            refilled: now,
        }
    }

    /// Takes one token, or says how many seconds until one is available.
    pub fn take(&mut self, per_second: f64, burst: u32, now: Instant) -> Result<(), u64> {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_second).min(f64::from(burst));
        self.refilled = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - self.tokens) / per_second).ceil().max(1.0) as u64)
        }
    }

    /// Whether the bucket would be full at `now` (nothing to remember).
    pub fn is_full(&self, per_second: f64, burst: u32, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens + elapsed * per_second >= f64::from(burst)
    }
}

/// A [`TokenBucket`] per source address: what callers not yet
/// authenticated may cost (the TokenReviews of unknown tokens, on the
/// report API and on the status API, each with its own). At most
/// `sources` addresses are remembered; a full bucket is forgotten first,
/// and while every remembered address is still throttled (a flood from
/// many addresses) a new one is refused until some recover.
#[derive(Debug)]
pub struct SourceBuckets {
    per_second: f64,
    burst: u32,
    sources: usize,
    buckets: Mutex<HashMap<std::net::IpAddr, TokenBucket>>,
}

impl SourceBuckets {
    /// Buckets of `burst` refilled at `per_second`, for at most `sources`
    /// addresses.
    pub fn new(per_second: f64, burst: u32, sources: usize) -> Self {
        Self {
            per_second,
            burst,
            sources,
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token from `source`'s bucket, or says how many seconds
    /// until one is available.
    pub fn take(&self, source: std::net::IpAddr, now: Instant) -> Result<(), u64> {
        let (rate, burst) = (self.per_second, self.burst);
        let mut buckets = self.buckets.lock().unwrap();
        if buckets.len() >= self.sources && !buckets.contains_key(&source) {
            buckets.retain(|_, b| !b.is_full(rate, burst, now));
            if buckets.len() >= self.sources {
                return Err(1);
            }
        }
        buckets
            .entry(source)
            .or_insert_with(|| TokenBucket::full(burst, now))
            .take(rate, burst, now)
    }
}

/// One shutdown signal shared by every task.
#[derive(Debug, Clone)]
pub struct Shutdown(tokio_watch::Receiver<bool>);

impl Shutdown {
    /// A signal and its trigger.
    pub fn new() -> (tokio_watch::Sender<bool>, Self) {
        let (tx, rx) = tokio_watch::channel(false);
        (tx, Self(rx))
    }

    /// Resolves when shutdown was requested (or the trigger dropped).
    pub async fn wait(&mut self) {
        let _ = self.0.wait_for(|v| *v).await;
    }

    /// Whether shutdown was requested.
    pub fn is_set(&self) -> bool {
        *self.0.borrow()
    }
}

/// State shared between the tasks.
#[derive(Debug)]
pub struct Shared {
    /// Metrics.
    pub metrics: Metrics,
    /// This replica acts (leader, or no election).
    pub acting: AtomicBool,
    /// Every watch finished its initial list.
    pub ready: AtomicBool,
    /// Published verdicts (for `/v1/verdicts`).
    pub verdicts: std::sync::RwLock<VerdictStore>,
    /// Sync state and errors of the watches.
    pub health: Health,
}

impl Shared {
    /// New shared state with `metrics`.
    pub fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            acting: AtomicBool::new(false),
            ready: AtomicBool::new(false),
            verdicts: std::sync::RwLock::new(VerdictStore::default()),
            health: Health::default(),
        }
    }

    /// Whether this replica acts.
    pub fn is_acting(&self) -> bool {
        self.acting.load(Ordering::Acquire)
    }

    /// Whether the initial lists are done.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// How long after its last error a resource's view counts as not current.
pub const DEGRADED_FOR: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Clone)]
struct ResourceHealth {
    required: bool,
    synced: bool,
    last_error: Option<Instant>,
}

/// Sync state and errors of every watch.
#[derive(Debug, Default)]
pub struct Health {
    inner: Mutex<HashMap<String, ResourceHealth>>,
}

impl Health {
    /// Registers a watch; `required` ones gate readiness.
    pub fn register(&self, name: &str, required: bool) {
        self.inner
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .required |= required;
    }

    pub(super) fn synced(&self, name: &str) {
        let mut g = self.inner.lock().unwrap();
        let h = g.entry(name.to_string()).or_default();
        h.synced = true;
        h.last_error = None;
    }

    pub(super) fn error(&self, name: &str) {
        self.inner
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .last_error = Some(Instant::now());
    }

    pub(super) fn ok(&self, name: &str) {
        if let Some(h) = self.inner.lock().unwrap().get_mut(name) {
            h.last_error = None;
        }
    }

    #[cfg(test)]
    pub(crate) fn synced_for_test(&self, name: &str) {
        self.synced(name);
    }

    #[cfg(test)]
    pub(crate) fn error_for_test(&self, name: &str) {
        self.error(name);
    }

    /// Whether every required watch finished its initial list.
    pub fn all_synced(&self) -> bool {
        self.inner
            .lock()
            .unwrap()
            .values()
            .all(|h| !h.required || h.synced)
    }

    /// Whether every registered watch whose name starts with `prefix` is
    /// in `listed`, and at least one is registered.
    pub fn all_listed(&self, prefix: &str, listed: &HashSet<String>) -> bool {
        let g = self.inner.lock().unwrap();
        let mut names = g.keys().filter(|k| k.starts_with(prefix)).peekable();
        names.peek().is_some() && names.all(|k| listed.contains(k))
    }

    /// Whether every watch named `prefix...` is in `listed` (true when
    /// none is registered).
    pub fn each_listed(&self, prefix: &str, listed: &HashSet<String>) -> bool {
        let g = self.inner.lock().unwrap();
        g.keys()
            .filter(|k| k.starts_with(prefix))
            .all(|k| listed.contains(k))
    }

    /// Whether the Secret or ConfigMap view is not current: a watch not
    /// synced, or failed within [`DEGRADED_FOR`].
    pub fn sources_degraded(&self) -> bool {
        self.inner.lock().unwrap().iter().any(|(k, h)| {
            (k.starts_with("secrets") || k.starts_with("configmaps"))
                && (!h.synced || h.last_error.is_some_and(|t| t.elapsed() < DEGRADED_FOR))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nodeset_watch_gates_readiness_and_snapshots_say_when_it_listed() {
        let h = Health::default();
        for n in [
            "pods",
            "secrets",
            "configmaps",
            "nodesets",
            "nodes",
            "agents",
        ] {
            h.register(n, true);
        }
        for n in ["pods", "secrets", "configmaps", "nodes", "agents"] {
            h.synced(n);
        }
        assert!(!h.all_synced(), "not ready before the NodeSets are listed");
        let mut listed = HashSet::new();
        assert!(!h.all_listed("nodesets", &listed));
        h.synced("nodesets");
        assert!(h.all_synced());
        // The snapshot needs the in-band marker, not only the flag.
        assert!(!h.all_listed("nodesets", &listed));
        listed.insert("nodesets".to_string());
        assert!(h.all_listed("nodesets", &listed));
        // Per namespace: every namespace's watch must have listed.
        let h = Health::default();
        h.register("nodesets/a", true);
        h.register("nodesets/b", true);
        let listed: HashSet<String> = ["nodesets/a".to_string()].into();
        assert!(!h.all_listed("nodesets", &listed));
        // Nothing registered: never complete.
        assert!(!Health::default().all_listed("nodesets", &listed));
    }

    #[test]
    fn workload_snapshots_are_complete_once_every_workload_watch_listed_or_none_is_watched() {
        let h = Health::default();
        let mut listed = HashSet::new();
        // No workload kind watched: nothing to wait for.
        assert!(h.each_listed("deployments", &listed));
        h.register("deployments/a", true);
        h.register("deployments/b", true);
        h.register("agent-daemonset", true);
        h.synced("deployments/a");
        h.synced("deployments/b");
        // Synced flags are not enough: the in-band markers are.
        assert!(!h.each_listed("deployments", &listed));
        listed.insert("deployments/a".to_string());
        assert!(!h.each_listed("deployments", &listed));
        listed.insert("deployments/b".to_string());
        assert!(h.each_listed("deployments", &listed));
        // The agent's DaemonSet watch is not a workload watch.
        assert!(h.each_listed("daemonsets", &listed));
    }
}

#[cfg(test)]
mod patch_tests {
    use super::*;

    #[test]
    fn every_patch_names_the_field_manager() {
        let p = patch_params();
        assert_eq!(p.field_manager.as_deref(), Some("mountguard-controller"));
        assert!(!p.force, "merge patches are never forced");
    }
}
