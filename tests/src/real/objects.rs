//! [`Objects`] over a `kube::Client` of the real API server, so the NodeSet
//! double, the slurmd bridge, the operator double's rules and the scenario
//! steps run unchanged against the real control plane.
//!
//! Each call blocks its caller until the API server answered (30 s at
//! most): on a worker of a multi-threaded tokio runtime through
//! `block_in_place`, elsewhere (a `spawn_blocking` thread, a plain thread)
//! directly on the runtime's handle. It must not be called from a
//! current-thread runtime.

use std::future::Future;

use serde_json::{Value, json};

use super::raw;
use crate::apiserver::resources::ResourceType;
use crate::apiserver::{ApiError, DeleteOptions};
use crate::objects::Objects;

/// A client of the real API server as [`Objects`].
#[derive(Clone)]
pub struct RealObjects {
    client: kube::Client,
    runtime: tokio::runtime::Handle,
}

impl std::fmt::Debug for RealObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealObjects").finish_non_exhaustive()
    }
}

impl RealObjects {
    /// Wraps `client`; calls run on the current tokio runtime (the caller
    /// must be inside one).
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            runtime: tokio::runtime::Handle::current(),
        }
    }

    /// The client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// A list that says when it failed (where [`Objects::list_all`]
    /// answers empty).
    pub fn try_list(&self, rt: &ResourceType, ns: Option<&str>) -> Result<Vec<Value>, ApiError> {
        let l = self.call("GET", &collection(rt, ns), None)?;
        Ok(l["items"].as_array().cloned().unwrap_or_default())
    }

    fn block<T>(&self, f: impl Future<Output = T>) -> T {
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.runtime.block_on(f))
            }
            _ => self.runtime.block_on(f),
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        let (code, body) = self
            .block(raw(&self.client, method, path, body))
            .map_err(|e| ApiError {
                code: 503,
                reason: "ServiceUnavailable",
                message: format!("{method} {path}: {e}"),
                details: None,
            })?;
        if (200..300).contains(&code) {
            Ok(body)
        } else {
            Err(status_error(code, &body))
        }
    }
}

/// The `metav1.Status` of a refused request as an [`ApiError`].
fn status_error(code: u16, body: &Value) -> ApiError {
    let reason = match body["reason"].as_str().unwrap_or("") {
        "NotFound" => "NotFound",
        "AlreadyExists" => "AlreadyExists",
        "Conflict" => "Conflict",
        "Invalid" => "Invalid",
        "Forbidden" => "Forbidden",
        "Unauthorized" => "Unauthorized",
        "TooManyRequests" => "TooManyRequests",
        "BadRequest" => "BadRequest",
        "Gone" | "Expired" => "Expired",
        "UnsupportedMediaType" => "UnsupportedMediaType",
        _ => "InternalError",
    };
    ApiError {
        code,
        reason,
        message: body["message"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| body.to_string()),
        details: body.get("details").cloned(),
    }
}

/// `/api/v1` or `/apis/<group>/<version>`, then the namespace and the
/// resource.
pub fn collection(rt: &ResourceType, ns: Option<&str>) -> String {
    let base = if rt.group.is_empty() {
        format!("/api/{}", rt.version)
    } else {
        format!("/apis/{}/{}", rt.group, rt.version)
    };
    match ns {
        Some(ns) if rt.namespaced && !ns.is_empty() => {
            format!("{base}/namespaces/{ns}/{}", rt.resource)
        }
        _ => format!("{base}/{}", rt.resource),
    }
}

fn item(rt: &ResourceType, ns: &str, name: &str, sub: Option<&str>) -> String {
    let mut p = format!("{}/{name}", collection(rt, Some(ns)));
    if let Some(s) = sub {
        p.push('/');
        p.push_str(s);
    }
    p
}

impl Objects for RealObjects {
    fn get(&self, rt: &ResourceType, ns: &str, name: &str) -> Result<Value, ApiError> {
        self.call("GET", &item(rt, ns, name, None), None)
    }

    fn list_all(&self, rt: &ResourceType, ns: Option<&str>) -> Vec<Value> {
        self.call("GET", &collection(rt, ns), None)
            .ok()
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default()
    }

    fn create(&self, rt: &ResourceType, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
        if obj["apiVersion"].is_null() {
            obj["apiVersion"] = json!(rt.api_version());
        }
        if obj["kind"].is_null() {
            obj["kind"] = json!(rt.kind);
        }
        self.call("POST", &collection(rt, Some(ns)), Some(&obj))
    }

    fn merge_patch(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        patch: &Value,
        subresource: Option<&str>,
    ) -> Result<Value, ApiError> {
        self.call("PATCH", &item(rt, ns, name, subresource), Some(patch))
    }

    fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<(), ApiError> {
        let mut body = json!({"apiVersion": "v1", "kind": "DeleteOptions"});
        if let Some(g) = opts.grace_period_seconds {
            body["gracePeriodSeconds"] = json!(g);
        }
        if let Some(u) = &opts.uid {
            body["preconditions"]["uid"] = json!(u);
        }
        if let Some(rv) = &opts.resource_version {
            body["preconditions"]["resourceVersion"] = json!(rv);
        }
        self.call("DELETE", &item(rt, ns, name, None), Some(&body))
            .map(|_| ())
    }

    fn bind(&self, ns: &str, name: &str, node: &str) -> Result<Value, ApiError> {
        let body = json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": ns},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        });
        self.call(
            "POST",
            &item(
                &crate::apiserver::resources::PODS,
                ns,
                name,
                Some("binding"),
            ),
            Some(&body),
        )
    }

    fn evict(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        let body = json!({
            "apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": name, "namespace": ns},
        });
        self.call(
            "POST",
            &item(
                &crate::apiserver::resources::PODS,
                ns,
                name,
                Some("eviction"),
            ),
            Some(&body),
        )
        .map(|_| ())
    }
}
