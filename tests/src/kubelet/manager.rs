//! The kubelet's Secret/ConfigMap managers, reproduced
//! (`pkg/kubelet/util/manager/watch_based_manager.go` and the `Get` strategy).
//!
//! Watch strategy:
//! - one cache item per namespace/name, reference-counted by pod UID
//!   (`AddReference` / `DeleteReference` through `register_pod` /
//!   `unregister_pod`); the item is dropped only when no registered pod
//!   references it;
//! - the item's "reflector" keeps its object current from the API's watch
//!   events, until `get` sees the object is immutable: then the reflector is
//!   stopped for good and the cached object is served as it is, even after
//!   the API object is deleted and recreated with new data (the pin).
//!
//! Get strategy: every `get` reads the API server.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::apiserver::resources::ResourceType;
use crate::apiserver::{ApiHandle, EventType, StoredEvent};

/// Change-detection strategy (`configMapAndSecretChangeDetectionStrategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// `Watch` (the kubelet's default).
    Watch,
    /// `Get`.
    Get,
}

/// (namespace, name)
pub type ObjKey = (String, String);

/// One cache item.
#[derive(Debug, Clone)]
pub struct CacheItem {
    /// Pod UIDs referencing the item, with counts.
    pub refs: BTreeMap<String, u32>,
    /// The cached object (None: not found).
    pub object: Option<Value>,
    /// The reflector was stopped because the object is immutable.
    pub immutable_stopped: bool,
}

/// One manager (for Secrets or for ConfigMaps).
#[derive(Debug)]
pub struct Manager {
    strategy: Strategy,
    rt: ResourceType,
    items: BTreeMap<ObjKey, CacheItem>,
    registered: BTreeMap<String, BTreeSet<ObjKey>>,
}

impl Manager {
    /// A manager for `rt` (secrets or configmaps).
    pub fn new(strategy: Strategy, rt: ResourceType) -> Self {
        Self {
            strategy,
            rt,
            items: BTreeMap::new(),
            registered: BTreeMap::new(),
        }
    }

    fn add_reference(&mut self, api: &ApiHandle, key: &ObjKey, uid: &str) {
        let rt = self.rt;
        let item = self.items.entry(key.clone()).or_insert_with(|| CacheItem {
            refs: BTreeMap::new(),
            // A new reflector lists the object first.
            object: api.get(&rt, &key.0, &key.1).ok(),
            immutable_stopped: false,
        });
        *item.refs.entry(uid.to_string()).or_default() += 1;
    }

    fn delete_reference(&mut self, key: &ObjKey, uid: &str) {
        if let Some(item) = self.items.get_mut(key) {
            if let Some(n) = item.refs.get_mut(uid) {
                *n -= 1;
                if *n == 0 {
                    item.refs.remove(uid);
                }
            }
            if item.refs.is_empty() {
                self.items.remove(key);
            }
        }
    }

    /// `RegisterPod`: references for the new set of names first, then the
    /// previous registration's references are released.
    pub fn register_pod(&mut self, api: &ApiHandle, uid: &str, names: BTreeSet<ObjKey>) {
        if self.strategy == Strategy::Get {
            self.registered.insert(uid.to_string(), names);
            return;
        }
        for k in &names {
            self.add_reference(api, k, uid);
        }
        if let Some(prev) = self.registered.insert(uid.to_string(), names) {
            for k in &prev {
                self.delete_reference(k, uid);
            }
        }
    }

    /// `UnregisterPod`.
    pub fn unregister_pod(&mut self, uid: &str) {
        if let Some(prev) = self.registered.remove(uid)
            && self.strategy == Strategy::Watch
        {
            for k in &prev {
                self.delete_reference(k, uid);
            }
        }
    }

    /// `GetObject`: Err(message) when not registered or not found.
    pub fn get(&mut self, api: &ApiHandle, ns: &str, name: &str) -> Result<Value, String> {
        match self.strategy {
            Strategy::Get => api.get(&self.rt, ns, name).map_err(|e| e.message),
            Strategy::Watch => {
                let rt = self.rt;
                let item = self
                    .items
                    .get_mut(&(ns.to_string(), name.to_string()))
                    .ok_or_else(|| format!("object {ns:?}/{name:?} not registered"))?;
                match &item.object {
                    Some(obj) => {
                        if obj["immutable"].as_bool() == Some(true) {
                            item.immutable_stopped = true;
                        }
                        Ok(obj.clone())
                    }
                    None => Err(format!("{} \"{}\" not found", rt.resource, name)),
                }
            }
        }
    }

    /// Feeds an API watch event to the item's reflector (if it runs).
    pub fn observe(&mut self, ev: &StoredEvent) {
        if self.strategy != Strategy::Watch || ev.rt != self.rt {
            return;
        }
        let key = (
            ev.object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("")
                .to_string(),
            ev.object["metadata"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        );
        if let Some(item) = self.items.get_mut(&key)
            && !item.immutable_stopped
        {
            item.object = match ev.kind {
                EventType::Deleted => None,
                _ => Some(ev.object.clone()),
            };
        }
    }

    /// Re-lists every running reflector (after a watch gap).
    pub fn relist(&mut self, api: &ApiHandle) {
        let rt = self.rt;
        for (k, item) in self.items.iter_mut() {
            if !item.immutable_stopped {
                item.object = api.get(&rt, &k.0, &k.1).ok();
            }
        }
    }

    /// The cache item for a name (Watch strategy), for tests.
    pub fn item(&self, ns: &str, name: &str) -> Option<CacheItem> {
        self.items.get(&(ns.to_string(), name.to_string())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::{ApiServerDouble, DeleteOptions, resources};
    use serde_json::json;

    fn key(n: &str) -> ObjKey {
        ("default".to_string(), n.to_string())
    }

    #[tokio::test]
    async fn watch_cache_refcounts_and_immutable_stop() {
        let api = ApiServerDouble::start().await.unwrap();
        let h = api.handle();
        h.create(
            &resources::SECRETS,
            "default",
            json!({"metadata": {"name": "m"}, "data": {"k": "MQ=="}}),
        )
        .unwrap();
        h.create(
            &resources::SECRETS,
            "default",
            json!({"metadata": {"name": "i"}, "immutable": true, "data": {"k": "MQ=="}}),
        )
        .unwrap();
        let mut sub = h.subscribe(h.resource_version());
        let mut m = Manager::new(Strategy::Watch, resources::SECRETS);
        m.register_pod(&h, "p1", [key("m"), key("i")].into());
        m.register_pod(&h, "p2", [key("i")].into());
        // Re-registering the same names keeps the counts.
        m.register_pod(&h, "p1", [key("m"), key("i")].into());
        assert_eq!(m.item("default", "i").unwrap().refs.len(), 2);
        assert_eq!(m.item("default", "m").unwrap().refs["p1"], 1);
        assert!(
            m.get(&h, "default", "nope")
                .unwrap_err()
                .contains("not registered")
        );

        // Mutable: follows updates and deletes.
        h.merge_patch(
            &resources::SECRETS,
            "default",
            "m",
            &json!({"data": {"k": "Mg=="}}),
            None,
        )
        .unwrap();
        // Immutable, after a Get: frozen.
        assert!(m.get(&h, "default", "i").is_ok());
        h.delete(
            &resources::SECRETS,
            "default",
            "i",
            &DeleteOptions::default(),
        )
        .unwrap();
        for ev in sub.next().await.unwrap() {
            m.observe(&ev);
        }
        assert_eq!(m.get(&h, "default", "m").unwrap()["data"]["k"], "Mg==");
        assert_eq!(
            m.get(&h, "default", "i").unwrap()["data"]["k"],
            "MQ==",
            "pinned after deletion"
        );
        m.relist(&h);
        assert!(
            m.get(&h, "default", "i").is_ok(),
            "a stopped reflector is not restarted"
        );

        m.unregister_pod("p1");
        assert!(m.item("default", "m").is_none());
        assert!(m.item("default", "i").is_some(), "p2 still references it");
        m.unregister_pod("p2");
        assert!(m.item("default", "i").is_none());
        m.register_pod(&h, "p3", [key("i")].into());
        assert!(m.get(&h, "default", "i").unwrap_err().contains("not found"));
    }
}
