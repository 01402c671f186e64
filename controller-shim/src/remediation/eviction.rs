//! The Eviction API at the executor's edge: the eviction of a pod with its
//! UID as precondition ([`Action::Evict`]), and the same request as a dry
//! run ([`Action::CheckEviction`]), each answered as an [`EvictionResult`]
//! for the next step of the machine.
//!
//! The request is built here, not with kube's `Api::evict`: kube-core 5.0
//! (`Request::evict`, src/subresource.rs) sends the options under the key
//! `delete_options`, which the API server does not read (the field of
//! `policy/v1` Eviction is `deleteOptions`), so neither the UID
//! precondition nor a dry run would reach it.
//!
//! [`Action::Evict`]: mountguard_core::remediation::Action::Evict
//! [`Action::CheckEviction`]: mountguard_core::remediation::Action::CheckEviction
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use mountguard_core::remediation::EvictionResult;
use serde_json::json;

use crate::runtime::metrics::Metrics;

/// Asks the Eviction API to evict `namespace/pod` if its UID is still
/// `uid`; with `dry_run`, only whether it would now (`dryRun=All`: the API
/// server runs every check, the PodDisruptionBudget's included, and writes
/// nothing: kubernetes pkg/registry/core/pod/storage/eviction.go,
/// `EvictionREST.Create`, `propagateDryRun`, `checkAndDecrement`).
/// `client` must not retry by itself (a 429 is an answer); `reader` reads
/// the pod after a 409.
pub async fn evict(
    client: &kube::Client,
    reader: &kube::Client,
    metrics: &Metrics,
    namespace: &str,
    pod: &str,
    uid: &str,
    dry_run: bool,
) -> EvictionResult {
    let what = if dry_run {
        "eviction (dry run)"
    } else {
        "eviction"
    };
    let req = match request(namespace, pod, uid, dry_run) {
        Ok(r) => r,
        Err(e) => {
            return EvictionResult::Error {
                message: format!("building the {what} request: {e}"),
            };
        }
    };
    let sent = client.request::<serde_json::Value>(req);
    match tokio::time::timeout(Duration::from_secs(20), sent).await {
        Ok(Ok(_)) => EvictionResult::Evicted,
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => EvictionResult::Gone,
        Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
            // 409 is not proof that the pod is gone: the Eviction API
            // answers Conflict both when the UID precondition fails
            // (another pod holds the name) and when its update of the
            // PodDisruptionBudget's status conflicts with another
            // eviction (kubernetes pkg/registry/core/pod/storage/
            // eviction.go, EvictionREST.Create and checkAndDecrement).
            // Read the pod and decide by its UID.
            pod_gone_after_conflict(reader, metrics, namespace, pod, uid, &s.message).await
        }
        Ok(Err(kube::Error::Api(s))) if s.code == 429 => EvictionResult::Refused {
            retry_after: None,
            message: s.message.clone(),
        },
        Ok(Err(e)) => {
            metrics.api_error("evict_pod");
            EvictionResult::Error {
                message: e.to_string(),
            }
        }
        Err(_) => EvictionResult::Error {
            message: format!("the {what} request timed out"),
        },
    }
}

/// `POST .../pods/{pod}/eviction` with `deleteOptions.preconditions.uid`;
/// a dry run says so in the query and in `deleteOptions.dryRun` (the API
/// server takes either, and refuses the two when they differ:
/// `propagateDryRun`).
fn request(
    namespace: &str,
    pod: &str,
    uid: &str,
    dry_run: bool,
) -> Result<http::Request<Vec<u8>>, String> {
    let mut options = json!({"preconditions": {"uid": uid}});
    let mut url = format!("/api/v1/namespaces/{namespace}/pods/{pod}/eviction");
    if dry_run {
        options["dryRun"] = json!(["All"]);
        url.push_str("?dryRun=All");
    }
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": namespace},
        "deleteOptions": options,
    });
    let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    http::Request::post(url)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(body)
        .map_err(|e| e.to_string())
}

/// After a 409 from the Eviction API: Gone only when a read shows no pod
/// of that name, or one with another UID.
async fn pod_gone_after_conflict(
    reader: &kube::Client,
    metrics: &Metrics,
    namespace: &str,
    pod: &str,
    uid: &str,
    message: &str,
) -> EvictionResult {
    let api: Api<Pod> = Api::namespaced(reader.clone(), namespace);
    match tokio::time::timeout(Duration::from_secs(10), api.get_opt(pod)).await {
        Ok(Ok(None)) => EvictionResult::Gone,
        Ok(Ok(Some(p))) if p.metadata.uid.as_deref() != Some(uid) => EvictionResult::Gone,
        Ok(Ok(Some(_))) => EvictionResult::Error {
            message: format!("eviction conflict (409), the pod is still there: {message}"),
        },
        Ok(Err(e)) => {
            metrics.api_error("get_pod");
            EvictionResult::Error {
                message: format!("eviction conflict (409), and reading the pod failed: {e}"),
            }
        }
        Err(_) => EvictionResult::Error {
            message: "eviction conflict (409), and reading the pod timed out".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_are_sent_under_the_field_the_api_server_reads() {
        let r = request("shop", "web-0", "uid-1", false).unwrap();
        assert_eq!(r.uri(), "/api/v1/namespaces/shop/pods/web-0/eviction");
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["kind"], "Eviction");
        assert_eq!(v["deleteOptions"]["preconditions"]["uid"], "uid-1");
        assert!(v["deleteOptions"]["dryRun"].is_null());
        assert!(v.get("delete_options").is_none());
        let r = request("shop", "web-0", "uid-1", true).unwrap();
        assert_eq!(
            r.uri(),
            "/api/v1/namespaces/shop/pods/web-0/eviction?dryRun=All"
        );
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["deleteOptions"]["dryRun"], json!(["All"]));
    }
}
