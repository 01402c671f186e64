//! The health of the watches: which listed, which failed lately; readiness
//! and the snapshots' completeness are read from it.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

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

    pub(crate) fn synced(&self, name: &str) {
        let mut g = self.inner.lock().unwrap();
        let h = g.entry(name.to_string()).or_default();
        h.synced = true;
        h.last_error = None;
    }

    pub(crate) fn error(&self, name: &str) {
        self.inner
            .lock()
            .unwrap()
            .entry(name.to_string())
            .or_default()
            .last_error = Some(Instant::now());
    }

    pub(crate) fn ok(&self, name: &str) {
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
