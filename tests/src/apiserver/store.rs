//! The API server double's storage: one in-memory map of JSON objects keyed
//! by (resource, namespace, name), a global monotonically increasing
//! resourceVersion, and a bounded event log (the "ring") that watches read.
//! Events older than the ring are compacted: a watch from before them gets
//! `410 Expired`, like a watch from a compacted etcd revision.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, VecDeque};

use base64::Engine;
use serde_json::{Map, Value, json};

use super::resources::{self, ResourceType};
use super::selectors::{FieldSelector, LabelSelector};
use super::status::ApiError;
use crate::util;

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`
    Added,
    /// `MODIFIED`
    Modified,
    /// `DELETED`
    Deleted,
}

impl EventType {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change in the event log.
#[derive(Debug, Clone)]
pub struct StoredEvent {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Resource type.
    pub rt: ResourceType,
    /// What happened.
    pub kind: EventType,
    /// The object after the change (for deletes: the last state).
    pub object: Value,
    /// The object before the change (for modifications).
    pub prev: Option<Value>,
}

/// What a watch or list selects.
#[derive(Debug, Clone)]
pub struct Filter {
    /// Resource type.
    pub rt: ResourceType,
    /// Namespace (None: all).
    pub namespace: Option<String>,
    /// Label selector.
    pub labels: LabelSelector,
    /// Field selector.
    pub fields: FieldSelector,
}

impl Filter {
    /// Everything of one type.
    pub fn all(rt: ResourceType) -> Self {
        Self {
            rt,
            namespace: None,
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
        }
    }

    /// Whether one object is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj["metadata"]["namespace"].as_str() != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// Translates a log event for this watch (an object entering or leaving
    /// the selection becomes ADDED or DELETED, as upstream).
    pub fn translate(&self, ev: &StoredEvent) -> Option<(EventType, Value)> {
        if ev.rt != self.rt {
            return None;
        }
        let now = self.matches(&ev.object);
        match ev.kind {
            EventType::Added | EventType::Deleted => now.then(|| (ev.kind, ev.object.clone())),
            EventType::Modified => {
                let before = ev.prev.as_ref().is_some_and(|p| self.matches(p));
                match (before, now) {
                    (true, true) => Some((EventType::Modified, ev.object.clone())),
                    (false, true) => Some((EventType::Added, ev.object.clone())),
                    (true, false) => Some((EventType::Deleted, ev.object.clone())),
                    (false, false) => None,
                }
            }
        }
    }
}

/// Options of a delete.
#[derive(Debug, Clone, Default)]
pub struct DeleteOptions {
    /// `gracePeriodSeconds`.
    pub grace_period_seconds: Option<i64>,
    /// `preconditions.uid`.
    pub uid: Option<String>,
    /// `preconditions.resourceVersion`.
    pub resource_version: Option<String>,
    /// `dryRun` is not empty: every check, no write (k8s.io/apiserver
    /// pkg/util/dryrun, `IsDryRun`). Only the eviction takes it here.
    pub dry_run: bool,
}

impl DeleteOptions {
    /// Parses a `DeleteOptions` body (and query overrides).
    pub fn from_value(v: &Value) -> Self {
        Self {
            grace_period_seconds: v["gracePeriodSeconds"].as_i64(),
            uid: v["preconditions"]["uid"].as_str().map(String::from),
            resource_version: v["preconditions"]["resourceVersion"]
                .as_str()
                .map(String::from),
            dry_run: v["dryRun"].as_array().is_some_and(|a| !a.is_empty()),
        }
    }

    /// A kubelet-style final delete: grace 0 with a UID precondition.
    pub fn confirm(uid: &str) -> Self {
        Self {
            grace_period_seconds: Some(0),
            uid: Some(uid.to_string()),
            resource_version: None,
            dry_run: false,
        }
    }
}

type Key = (&'static str, &'static str, String, String);

fn key(rt: &ResourceType, ns: &str, name: &str) -> Key {
    (rt.group, rt.resource, ns.to_string(), name.to_string())
}

/// The store.
#[derive(Debug)]
pub struct Store {
    objects: BTreeMap<Key, Value>,
    rv: u64,
    ring: VecDeque<StoredEvent>,
    ring_cap: usize,
    compacted: u64,
}

/// The result of a delete.
#[derive(Debug, Clone)]
pub struct Deleted {
    /// The object (final state, or with `deletionTimestamp` set).
    pub object: Value,
    /// Whether it is gone (false: graceful deletion or finalizers pending).
    pub gone: bool,
}

fn meta(obj: &Value) -> &Value {
    &obj["metadata"]
}

fn name_of(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or("")
}

fn ns_of(obj: &Value) -> &str {
    obj["metadata"]["namespace"].as_str().unwrap_or("")
}

fn strip_rv(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o["metadata"].as_object_mut() {
        m.remove("resourceVersion");
        m.remove("managedFields");
    }
    o
}

fn non_meta(obj: &Value) -> Value {
    let mut o = obj.clone();
    if let Some(m) = o.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    o
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

impl Store {
    /// An empty store keeping `ring_cap` events for watches.
    pub fn new(ring_cap: usize) -> Self {
        Self {
            objects: BTreeMap::new(),
            rv: 1,
            ring: VecDeque::new(),
            ring_cap: ring_cap.max(1),
            compacted: 0,
        }
    }

    /// The current (latest) resourceVersion.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// Highest compacted resourceVersion: a watch from before it gets 410.
    pub fn compacted(&self) -> u64 {
        self.compacted
    }

    /// Changes the ring size, compacting at once if needed.
    pub fn set_ring_capacity(&mut self, cap: usize) {
        self.ring_cap = cap.max(1);
        self.trim();
    }

    /// Forgets every logged event: any watch from an older version gets 410.
    pub fn compact_all(&mut self) {
        self.ring.clear();
        self.compacted = self.rv;
    }

    fn trim(&mut self) {
        while self.ring.len() > self.ring_cap {
            if let Some(ev) = self.ring.pop_front() {
                self.compacted = ev.rv;
            }
        }
    }

    /// Events after `rv`, or 410 when some were compacted.
    pub fn events_since(&self, rv: u64) -> Result<Vec<StoredEvent>, ApiError> {
        if rv < self.compacted {
            return Err(ApiError::expired(rv, self.compacted + 1));
        }
        Ok(self.ring.iter().filter(|e| e.rv > rv).cloned().collect())
    }

    fn log(&mut self, rt: ResourceType, kind: EventType, object: Value, prev: Option<Value>) {
        self.ring.push_back(StoredEvent {
            rv: self.rv,
            rt,
            kind,
            object,
            prev,
        });
        self.trim();
    }

    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// Gets one object.
    pub fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.objects
            .get(&key(rt, ns, name))
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Lists objects (sorted by namespace and name), with the current resourceVersion.
    pub fn list(&self, filter: &Filter) -> (Vec<Value>, u64) {
        let items = self
            .objects
            .iter()
            .filter(|((g, r, _, _), _)| *g == filter.rt.group && *r == filter.rt.resource)
            .map(|(_, v)| v)
            .filter(|v| filter.matches(v))
            .cloned()
            .collect();
        (items, self.rv)
    }

    fn check_namespace(&self, rt: &ResourceType, ns: &str) -> Result<(), ApiError> {
        if rt.namespaced
            && !self
                .objects
                .contains_key(&key(&resources::NAMESPACES, "", ns))
        {
            return Err(ApiError::not_found(&resources::NAMESPACES, ns));
        }
        Ok(())
    }

    /// Type-specific normalisation and validation of an incoming object.
    fn normalize(rt: &ResourceType, obj: &mut Value) -> Result<(), ApiError> {
        let name = name_of(obj).to_string();
        if *rt == resources::SECRETS {
            if let Some(sd) = obj.as_object_mut().and_then(|o| o.remove("stringData"))
                && let Some(sd) = sd.as_object()
            {
                if !obj["data"].is_object() {
                    obj["data"] = json!({});
                }
                for (k, v) in sd {
                    obj["data"][k] = json!(b64().encode(v.as_str().unwrap_or("")));
                }
            }
            if let Some(data) = obj["data"].as_object() {
                for (k, v) in data {
                    let ok = v.as_str().is_some_and(|s| b64().decode(s).is_ok());
                    if !ok {
                        return Err(ApiError::bad_request(format!(
                            "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data in data[{k:?}]"
                        )));
                    }
                }
            }
            if obj["type"].is_null() {
                obj["type"] = json!("Opaque");
            }
        }
        if *rt == resources::CONFIGMAPS
            && let Some(bd) = obj["binaryData"].as_object()
        {
            for (k, v) in bd {
                if v.as_str().is_none_or(|s| b64().decode(s).is_err()) {
                    return Err(ApiError::bad_request(format!(
                        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: illegal base64 data in binaryData[{k:?}]"
                    )));
                }
                if obj["data"].get(k).is_some() {
                    return Err(ApiError::invalid(
                        rt,
                        &name,
                        &[(
                            "data",
                            "FieldValueInvalid",
                            format!("Invalid value: {k:?}: duplicate of key present in binaryData"),
                        )],
                    ));
                }
            }
        }
        if *rt == resources::PODS {
            if obj["status"]["phase"].is_null() {
                obj["status"]["phase"] = json!("Pending");
            }
            if obj["spec"]["terminationGracePeriodSeconds"].is_null() {
                obj["spec"]["terminationGracePeriodSeconds"] = json!(30);
            }
        }
        Ok(())
    }

    /// Creates an object.
    pub fn create(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        mut obj: Value,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        obj["apiVersion"] = json!(rt.api_version());
        obj["kind"] = json!(rt.kind);
        if !obj["metadata"].is_object() {
            obj["metadata"] = json!({});
        }
        if rt.namespaced {
            match obj["metadata"]["namespace"].as_str() {
                Some(n) if !n.is_empty() && n != ns => {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
                _ => obj["metadata"]["namespace"] = json!(ns),
            }
            self.check_namespace(rt, ns)?;
        } else if let Some(m) = obj["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        let name = match meta(&obj)["name"].as_str() {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta(&obj)["generateName"].as_str() {
                Some(g) if !g.is_empty() => format!("{g}{}", util::name_suffix()),
                _ => {
                    return Err(ApiError::invalid(
                        rt,
                        "",
                        &[(
                            "metadata.name",
                            "FieldValueRequired",
                            "Required value: name or generateName is required".into(),
                        )],
                    ));
                }
            },
        };
        obj["metadata"]["name"] = json!(name);
        let ns_key = if rt.namespaced { ns } else { "" };
        if self.objects.contains_key(&key(rt, ns_key, &name)) {
            return Err(ApiError::already_exists(rt, &name));
        }
        Self::normalize(rt, &mut obj)?;
        let m = obj["metadata"]
            .as_object_mut()
            .expect("metadata is an object");
        for k in ["deletionTimestamp", "deletionGracePeriodSeconds"] {
            m.remove(k);
        }
        m.insert("uid".into(), json!(util::new_uid()));
        m.insert("creationTimestamp".into(), json!(util::now_rfc3339()));
        m.insert("generation".into(), json!(1));
        let rv = self.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv);
        self.objects.insert(key(rt, ns_key, &name), obj.clone());
        self.log(*rt, EventType::Added, obj.clone(), None);
        Ok(obj)
    }

    fn immutable_check(rt: &ResourceType, old: &Value, new: &Value) -> Result<(), ApiError> {
        if !(*rt == resources::SECRETS || *rt == resources::CONFIGMAPS) {
            return Ok(());
        }
        if old["immutable"].as_bool() != Some(true) {
            return Ok(());
        }
        const MSG: &str = "Forbidden: field is immutable when `immutable` is set";
        let mut causes: Vec<(&str, &str, String)> = Vec::new();
        if new["immutable"].as_bool() != Some(true) {
            causes.push(("immutable", "FieldValueForbidden", MSG.into()));
        }
        let fields: &[&str] = if *rt == resources::SECRETS {
            &["data"]
        } else {
            &["data", "binaryData"]
        };
        let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(Map::is_empty);
        for f in fields {
            let (o, n) = (&old[*f], &new[*f]);
            if o != n && !(empty(o) && empty(n)) {
                causes.push((f, "FieldValueForbidden", MSG.into()));
            }
        }
        if causes.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(rt, name_of(old), &causes))
        }
    }

    fn pod_spec_check(old: &Value, new: &Value) -> Result<(), ApiError> {
        let strip = |v: &Value| {
            let mut s = v["spec"].clone();
            for list in ["containers", "initContainers"] {
                if let Some(cs) = s[list].as_array_mut() {
                    for c in cs {
                        if let Some(c) = c.as_object_mut() {
                            c.remove("image");
                        }
                    }
                }
            }
            if let Some(o) = s.as_object_mut() {
                o.remove("activeDeadlineSeconds");
                o.remove("tolerations");
            }
            s
        };
        if strip(old) != strip(new) {
            return Err(ApiError::invalid(
                &resources::PODS,
                name_of(old),
                &[(
                    "spec",
                    "FieldValueForbidden",
                    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)".into(),
                )],
            ));
        }
        Ok(())
    }

    /// Replaces an object (PUT), or its status (`subresource = Some("status")`).
    pub fn update(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        mut obj: Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        let ns = if rt.namespaced { ns } else { "" };
        let old = self.get(rt, ns, name)?;
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request is not a JSON object",
            ));
        }
        match meta(&obj)["name"].as_str() {
            Some(n) if n != name => {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({n}) does not match the name on the URL ({name})"
                )));
            }
            _ => {}
        }
        match meta(&obj)["resourceVersion"].as_str() {
            Some(rv) if !rv.is_empty() && Some(rv) != meta(&old)["resourceVersion"].as_str() => {
                return Err(ApiError::conflict(rt, name));
            }
            Some(rv) if !rv.is_empty() => {}
            _ if !rt.unconditional_update => {
                return Err(ApiError::invalid(
                    rt,
                    name,
                    &[(
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update".into(),
                    )],
                ));
            }
            _ => {}
        }
        let mut new = match subresource {
            Some("status") => {
                let mut n = old.clone();
                n["status"] = obj["status"].clone();
                n
            }
            Some("binding") if *rt == resources::PODS => {
                let mut n = old.clone();
                n["spec"]["nodeName"] = obj["spec"]["nodeName"].clone();
                n
            }
            Some(other) => {
                return Err(ApiError::method_not_allowed(&format!(
                    "{}/{other}",
                    rt.resource
                )));
            }
            None => {
                if rt.has_status {
                    obj["status"] = old["status"].clone();
                }
                Self::normalize(rt, &mut obj)?;
                obj
            }
        };
        new["apiVersion"] = json!(rt.api_version());
        new["kind"] = json!(rt.kind);
        if !new["metadata"].is_object() {
            new["metadata"] = json!({});
        }
        // metadata.uid cannot change (`ValidateObjectMetaUpdate`,
        // apimachinery pkg/api/validation/objectmeta.go:
        // `ValidateImmutableField` on `uid`): a patch or update carrying
        // another UID is refused, so a UID in a patch acts as a
        // precondition.
        if let (Some(want), Some(have)) = (
            new["metadata"]["uid"].as_str().filter(|u| !u.is_empty()),
            old["metadata"]["uid"].as_str(),
        ) && want != have
        {
            return Err(ApiError::invalid(
                rt,
                name,
                &[(
                    "metadata.uid",
                    "FieldValueInvalid",
                    format!("Invalid value: \"{want}\": field is immutable"),
                )],
            ));
        }
        for k in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "namespace",
            "generation",
        ] {
            match old["metadata"].get(k) {
                Some(v) => new["metadata"][k] = v.clone(),
                None => {
                    if let Some(m) = new["metadata"].as_object_mut() {
                        m.remove(k);
                    }
                }
            }
        }
        new["metadata"]["name"] = json!(name);
        if new["metadata"].get("managedFields").is_none()
            && let Some(mf) = old["metadata"].get("managedFields")
        {
            new["metadata"]["managedFields"] = mf.clone();
        }
        if new["status"].is_null()
            && let Some(m) = new.as_object_mut()
        {
            m.remove("status");
        }
        Self::immutable_check(rt, &old, &new)?;
        if *rt == resources::PODS && subresource.is_none() {
            Self::pod_spec_check(&old, &new)?;
        }
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"].clone();
        if strip_rv(&new) == strip_rv(&old) {
            return Ok(old);
        }
        if non_meta(&new) != non_meta(&old) {
            let g = old["metadata"]["generation"].as_i64().unwrap_or(1);
            new["metadata"]["generation"] = json!(g + 1);
        }
        // An object being deleted whose finalizers are gone is removed now.
        if !new["metadata"]["deletionTimestamp"].is_null()
            && new["metadata"]["finalizers"]
                .as_array()
                .is_none_or(Vec::is_empty)
            && (*rt != resources::PODS
                || new["metadata"]["deletionGracePeriodSeconds"].as_i64() == Some(0))
        {
            return Ok(self.remove(rt, ns, name, new));
        }
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv);
        self.objects.insert(key(rt, ns, name), new.clone());
        self.log(*rt, EventType::Modified, new.clone(), Some(old));
        Ok(new)
    }

    fn remove(&mut self, rt: &ResourceType, ns: &str, name: &str, mut last: Value) -> Value {
        self.objects.remove(&key(rt, ns, name));
        let rv = self.next_rv();
        last["metadata"]["resourceVersion"] = json!(rv);
        self.log(*rt, EventType::Deleted, last.clone(), None);
        last
    }

    fn modify(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        old: Value,
        mut new: Value,
    ) -> Value {
        let rv = self.next_rv();
        new["metadata"]["resourceVersion"] = json!(rv);
        self.objects.insert(key(rt, ns, name), new.clone());
        self.log(*rt, EventType::Modified, new.clone(), Some(old));
        new
    }

    /// Deletes an object: pods bound to a node are deleted gracefully
    /// (`deletionTimestamp`, then the kubelet's final delete with grace 0);
    /// objects with finalizers get a `deletionTimestamp` and stay.
    pub fn delete(
        &mut self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<Deleted, ApiError> {
        let ns = if rt.namespaced { ns } else { "" };
        let old = self.get(rt, ns, name)?;
        preconditions(rt, name, &old, opts)?;
        let has_finalizers = old["metadata"]["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        let mut grace = 0;
        if *rt == resources::PODS {
            let bound = old["spec"]["nodeName"]
                .as_str()
                .is_some_and(|n| !n.is_empty());
            let finished = matches!(
                old["status"]["phase"].as_str(),
                Some("Succeeded" | "Failed")
            );
            grace = opts
                .grace_period_seconds
                .or_else(|| old["spec"]["terminationGracePeriodSeconds"].as_i64())
                .unwrap_or(30)
                .max(0);
            if !bound || finished {
                grace = 0;
            }
            if let Some(cur) = old["metadata"]["deletionGracePeriodSeconds"].as_i64()
                && cur <= grace
            {
                // Already terminating with a shorter or equal grace period.
                return Ok(Deleted {
                    object: old,
                    gone: false,
                });
            }
        }
        if grace > 0 || has_finalizers {
            let mut new = old.clone();
            let at = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(grace);
            if new["metadata"]["deletionTimestamp"].is_null() || grace > 0 {
                new["metadata"]["deletionTimestamp"] = json!(util::rfc3339(at));
            }
            new["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            if grace == 0 && !has_finalizers {
                let object = self.remove(rt, ns, name, new);
                return Ok(Deleted { object, gone: true });
            }
            if new == old {
                return Ok(Deleted {
                    object: old,
                    gone: false,
                });
            }
            let object = self.modify(rt, ns, name, old, new);
            return Ok(Deleted {
                object,
                gone: false,
            });
        }
        let object = self.remove(rt, ns, name, old);
        Ok(Deleted { object, gone: true })
    }

    /// The Eviction subresource, honouring PodDisruptionBudgets.
    /// The `binding` subresource: assigns an unbound pod to `node`.
    pub fn bind(&mut self, ns: &str, name: &str, node: &str) -> Result<Value, ApiError> {
        let mut pod = self.get(&resources::PODS, ns, name)?;
        if let Some(n) = pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty()) {
            return Err(ApiError::conflict_msg(
                &resources::PODS,
                name,
                &format!("pod {name} is already assigned to node \"{n}\""),
            ));
        }
        pod["spec"]["nodeName"] = json!(node);
        self.update(&resources::PODS, ns, name, pod, Some("binding"))
    }

    pub fn evict(&mut self, ns: &str, name: &str, opts: &DeleteOptions) -> Result<(), ApiError> {
        let pod = self.get(&resources::PODS, ns, name)?;
        let terminating = !pod["metadata"]["deletionTimestamp"].is_null();
        let phase = pod["status"]["phase"].as_str().unwrap_or("Pending");
        let ignore_pdb = terminating || matches!(phase, "Succeeded" | "Failed" | "Pending");
        if !ignore_pdb {
            let pdbs: Vec<Value> = self
                .list(&Filter {
                    namespace: Some(ns.to_string()),
                    ..Filter::all(resources::PDBS)
                })
                .0
                .into_iter()
                .filter(|p| LabelSelector::from_object(&p["spec"]["selector"]).matches(&pod))
                .collect();
            if pdbs.len() > 1 {
                return Err(ApiError::internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ));
            }
            if let Some(pdb) = pdbs.first() {
                // A dry run is checked like the eviction it stands for
                // (EvictionREST.Create calls checkAndDecrement with
                // dryRun, which refuses the same way and returns before
                // the budget's status is written).
                let sel = LabelSelector::from_object(&pdb["spec"]["selector"]);
                let pods: Vec<Value> = self
                    .list(&Filter {
                        namespace: Some(ns.to_string()),
                        ..Filter::all(resources::PODS)
                    })
                    .0
                    .into_iter()
                    .filter(|p| sel.matches(p))
                    .collect();
                let expected = pods.len() as i64;
                let healthy = pods.iter().filter(|p| pod_healthy(p)).count() as i64;
                let (desired, allowed) = pdb_budget(&pdb["spec"], expected, healthy);
                if allowed <= 0 || !pod_healthy(&pod) && healthy < desired {
                    let mut err = ApiError::too_many_requests(
                        "Cannot evict pod as it would violate the pod's disruption budget.",
                    );
                    err.details = Some(json!({"causes": [{
                        "reason": "DisruptionBudget",
                        "message": format!(
                            "The disruption budget {} needs {} healthy pods and has {} currently",
                            name_of(pdb), desired, healthy
                        ),
                    }]}));
                    return Err(err);
                }
            }
        }
        if opts.dry_run {
            // The store's Delete under a dry run: its preconditions are
            // checked, nothing is written (k8s.io/apiserver
            // pkg/registry/generic/registry/store.go, `Store.Delete`).
            return preconditions(&resources::PODS, name, &pod, opts);
        }
        self.delete(&resources::PODS, ns, name, opts).map(|_| ())
    }
}

/// The UID and resourceVersion preconditions of a delete (409 when one
/// does not hold).
fn preconditions(
    rt: &ResourceType,
    name: &str,
    old: &Value,
    opts: &DeleteOptions,
) -> Result<(), ApiError> {
    let uid = old["metadata"]["uid"].as_str().unwrap_or("");
    if let Some(want) = &opts.uid
        && want != uid
    {
        return Err(ApiError::conflict_msg(
            rt,
            name,
            &format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}"),
        ));
    }
    let cur_rv = old["metadata"]["resourceVersion"].as_str().unwrap_or("");
    if let Some(want) = &opts.resource_version
        && want != cur_rv
    {
        return Err(ApiError::conflict_msg(
            rt,
            name,
            &format!(
                "Precondition failed: ResourceVersion in precondition: {want}, ResourceVersion in object meta: {cur_rv}"
            ),
        ));
    }
    Ok(())
}

fn pod_healthy(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && p["status"]["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}

fn resolve(v: &Value, total: i64) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: i64 = s.strip_suffix('%')?.parse().ok()?;
            Some((pct * total + 99) / 100)
        }
        _ => None,
    }
}

/// (desired healthy, disruptions allowed) for a PDB spec.
fn pdb_budget(spec: &Value, expected: i64, healthy: i64) -> (i64, i64) {
    if let Some(max) = resolve(&spec["maxUnavailable"], expected) {
        let desired = (expected - max).max(0);
        (desired, healthy - desired)
    } else if let Some(min) = resolve(&spec["minAvailable"], expected) {
        (min, healthy - min)
    } else {
        (0, healthy)
    }
}

/// Name and namespace of an object.
pub fn object_ref(obj: &Value) -> (String, String) {
    (ns_of(obj).to_string(), name_of(obj).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        let mut s = Store::new(100);
        s.create(
            &resources::NAMESPACES,
            "",
            json!({"metadata": {"name": "ns"}}),
        )
        .unwrap();
        s
    }

    #[test]
    fn create_get_conflict_and_no_op_updates() {
        let mut s = store();
        let c = s
            .create(
                &resources::CONFIGMAPS,
                "ns",
                json!({"metadata": {"name": "a"}, "data": {"k": "v"}}),
            )
            .unwrap();
        let rv1 = c["metadata"]["resourceVersion"]
            .as_str()
            .unwrap()
            .to_string();
        let e = s
            .create(
                &resources::CONFIGMAPS,
                "ns",
                json!({"metadata": {"name": "a"}}),
            )
            .unwrap_err();
        assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
        assert_eq!(e.message, "configmaps \"a\" already exists");
        // A no-op update does not bump the resourceVersion.
        let same = s
            .update(&resources::CONFIGMAPS, "ns", "a", c.clone(), None)
            .unwrap();
        assert_eq!(same["metadata"]["resourceVersion"], json!(rv1));
        let mut changed = c.clone();
        changed["data"]["k"] = json!("w");
        let u = s
            .update(&resources::CONFIGMAPS, "ns", "a", changed.clone(), None)
            .unwrap();
        assert_ne!(u["metadata"]["resourceVersion"], json!(rv1));
        // The same stale version again is a conflict.
        changed["data"]["k"] = json!("x");
        let e = s
            .update(&resources::CONFIGMAPS, "ns", "a", changed, None)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
    }

    #[test]
    fn namespace_must_exist() {
        let mut s = store();
        let e = s
            .create(
                &resources::SECRETS,
                "nope",
                json!({"metadata": {"name": "a"}}),
            )
            .unwrap_err();
        assert_eq!(e.message, "namespaces \"nope\" not found");
    }

    #[test]
    fn immutable_secret_rejects_data_changes_with_the_real_message() {
        let mut s = store();
        let sec = s
            .create(
                &resources::SECRETS,
                "ns",
                json!({"metadata": {"name": "k"}, "immutable": true, "stringData": {"slurm.key": "old"}}),
            )
            .unwrap();
        assert_eq!(sec["data"]["slurm.key"], json!(b64().encode("old")));
        assert!(sec.get("stringData").is_none());
        let mut upd = sec.clone();
        upd["data"]["slurm.key"] = json!(b64().encode("new"));
        let e = s
            .update(&resources::SECRETS, "ns", "k", upd, None)
            .unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
        assert_eq!(
            e.message,
            "Secret \"k\" is invalid: data: Forbidden: field is immutable when `immutable` is set"
        );
        // Labels may still change.
        let mut upd = sec.clone();
        upd["metadata"]["labels"] = json!({"a": "b"});
        s.update(&resources::SECRETS, "ns", "k", upd, None).unwrap();
    }

    #[test]
    fn ring_compaction_expires_old_versions() {
        let mut s = store();
        s.set_ring_capacity(2);
        let start = s.rv();
        for i in 0..4 {
            s.create(
                &resources::CONFIGMAPS,
                "ns",
                json!({"metadata": {"name": format!("c{i}")}}),
            )
            .unwrap();
        }
        let e = s.events_since(start).unwrap_err();
        assert_eq!((e.code, e.reason), (410, "Expired"));
        assert_eq!(s.events_since(s.rv() - 2).unwrap().len(), 2);
    }

    #[test]
    fn graceful_pod_deletion_and_final_confirm() {
        let mut s = store();
        let p = s
            .create(
                &resources::PODS,
                "ns",
                json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i"}]}}),
            )
            .unwrap();
        let uid = p["metadata"]["uid"].as_str().unwrap().to_string();
        let d = s
            .delete(&resources::PODS, "ns", "p", &DeleteOptions::default())
            .unwrap();
        assert!(!d.gone);
        assert!(d.object["metadata"]["deletionTimestamp"].is_string());
        assert_eq!(
            d.object["metadata"]["deletionGracePeriodSeconds"],
            json!(30)
        );
        let e = s
            .delete(
                &resources::PODS,
                "ns",
                "p",
                &DeleteOptions::confirm("other"),
            )
            .unwrap_err();
        assert_eq!(e.code, 409);
        let d = s
            .delete(&resources::PODS, "ns", "p", &DeleteOptions::confirm(&uid))
            .unwrap();
        assert!(d.gone);
        assert_eq!(s.get(&resources::PODS, "ns", "p").unwrap_err().code, 404);
    }

    /// A store with PDB `pdb` (`maxUnavailable: 0`) protecting pod `busy`
    /// (label `protect=true`) and not pod `free`, both running and Ready.
    fn pdb_store() -> Store {
        let mut s = store();
        s.create(
            &resources::PDBS,
            "ns",
            json!({"metadata": {"name": "pdb"}, "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"protect": "true"}}}}),
        )
        .unwrap();
        for (name, protect) in [("busy", "true"), ("free", "false")] {
            s.create(
                &resources::PODS,
                "ns",
                json!({"metadata": {"name": name, "labels": {"protect": protect}},
                       "spec": {"nodeName": "n1", "containers": []},
                       "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}),
            )
            .unwrap();
        }
        s
    }

    #[test]
    fn eviction_honours_pdb() {
        let mut s = pdb_store();
        let e = s
            .evict("ns", "busy", &DeleteOptions::default())
            .unwrap_err();
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        assert_eq!(
            e.details.unwrap()["causes"][0]["message"],
            json!("The disruption budget pdb needs 1 healthy pods and has 1 currently")
        );
        s.evict("ns", "free", &DeleteOptions::default()).unwrap();
        assert!(
            s.get(&resources::PODS, "ns", "free").unwrap()["metadata"]["deletionTimestamp"]
                .is_string()
        );
    }

    #[test]
    fn a_dry_run_eviction_is_refused_as_the_eviction_and_writes_nothing() {
        let mut s = pdb_store();
        let dry = |uid: Option<&str>| DeleteOptions {
            uid: uid.map(String::from),
            dry_run: true,
            ..DeleteOptions::default()
        };
        let rv = |s: &Store| s.get(&resources::PODS, "ns", "free").unwrap()["metadata"].clone();
        let e = s.evict("ns", "busy", &dry(None)).unwrap_err();
        assert_eq!((e.code, e.reason), (429, "TooManyRequests"));
        let before = rv(&s);
        s.evict("ns", "free", &dry(None)).unwrap();
        assert_eq!(rv(&s), before, "a dry run writes nothing");
        assert!(before["deletionTimestamp"].is_null());
        let e = s
            .evict("ns", "free", &dry(Some("another-uid")))
            .unwrap_err();
        assert_eq!(e.code, 409, "the UID precondition is checked");
    }
}
