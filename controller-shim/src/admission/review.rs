//! The admission webhook's wire format: an `admission.k8s.io/v1`
//! `AdmissionReview` in, one out (`staging/src/k8s.io/api/admission/v1/
//! types.go`: `AdmissionReview`, `AdmissionRequest`, `AdmissionResponse`;
//! the answer's `response.uid` must be the request's `uid`).
//!
//! A review is read into small typed structs that keep only what the
//! decision needs: the request's `uid`, `kind`, `operation`, `namespace`
//! and `name`, and of the object under review its `metadata.name` and
//! `immutable`. Everything else (the object's `data`, `managedFields`,
//! `userInfo`, `options`) is skipped by the parser without being built
//! (serde's derive skips an unknown field with `IgnoredAny`): a review costs
//! its body and a few hundred bytes, whatever its object holds
//! (`benches/admission.rs` measures it; `tests/admission_heap.rs` bounds
//! it).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use mountguard_core::admission::Operation;
use mountguard_core::model::{SourceKind, SourceRef};
use serde::{Deserialize, Serialize};

/// The only review version the chart registers (`admissionReviewVersions:
/// [v1]`): the API server sends it and expects it back.
pub const API_VERSION: &str = "admission.k8s.io/v1";
/// The kind of a review and of its answer.
pub const KIND: &str = "AdmissionReview";

/// A review as read: the uid to echo and, when it is about something the
/// webhook judges, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    /// `request.uid`, echoed in the answer.
    pub uid: String,
    /// `None`: not a create or delete of a namespaced Secret or ConfigMap
    /// (the chart's rules send only those; anything else is allowed).
    pub subject: Option<Reviewed>,
}

/// What a review is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewed {
    /// Create or delete.
    pub operation: Operation,
    /// The object's kind, namespace and name.
    pub source: SourceRef,
    /// The object in the request (for a delete: the one deleted) says
    /// `immutable: true`.
    pub immutable: bool,
}

/// `AdmissionReview`: `apiVersion`, `kind` and `request` are read;
/// `response` and anything else skipped.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireReview<'a> {
    #[serde(borrow, default)]
    api_version: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default)]
    kind: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    request: Option<WireRequest>,
}

/// `AdmissionRequest`: `uid` and `kind` are required by types.go; `name`
/// and `namespace` are `omitempty`; `object` and `oldObject` are
/// `RawExtension`s, absent or `null` when the API server has none.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireRequest {
    uid: String,
    kind: WireKind,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    operation: Option<String>,
    #[serde(default)]
    object: Option<WireObject>,
    #[serde(default)]
    old_object: Option<WireObject>,
}

/// `metav1.GroupVersionKind` (the version does not matter: `matchPolicy:
/// Equivalent` sends the registered v1).
#[derive(Deserialize)]
struct WireKind {
    #[serde(default)]
    group: String,
    #[serde(default)]
    kind: String,
}

/// A Secret or ConfigMap: its name and `immutable` (`*bool`, `omitempty`
/// in `core/v1`); `data`, `stringData`, `binaryData` and the rest of the
/// metadata are skipped unread.
#[derive(Deserialize)]
struct WireObject {
    #[serde(default)]
    metadata: Option<WireMeta>,
    #[serde(default)]
    immutable: Option<bool>,
}

#[derive(Deserialize)]
struct WireMeta {
    #[serde(default)]
    name: Option<String>,
}

/// Reads a review from `body`; the error is the message of a 400 answer.
pub fn parse(body: &[u8]) -> Result<Review, String> {
    let wire: WireReview<'_> =
        serde_json::from_slice(body).map_err(|e| format!("not an {API_VERSION} {KIND}: {e}"))?;
    let (api_version, kind) = (
        wire.api_version.as_deref().unwrap_or(""),
        wire.kind.as_deref().unwrap_or(""),
    );
    if (api_version, kind) != (API_VERSION, KIND) {
        return Err(format!(
            "not an {API_VERSION} {KIND}: apiVersion {api_version:?}, kind {kind:?} (the webhook \
             is registered with admissionReviewVersions [v1])"
        ));
    }
    let request = wire
        .request
        .ok_or_else(|| format!("an {KIND} without a request"))?;
    let subject = subject(&request);
    Ok(Review {
        uid: request.uid,
        subject,
    })
}

fn subject(req: &WireRequest) -> Option<Reviewed> {
    let kind = match (req.kind.group.as_str(), req.kind.kind.as_str()) {
        ("", "Secret") => SourceKind::Secret,
        ("", "ConfigMap") => SourceKind::ConfigMap,
        _ => return None,
    };
    let (operation, object) = match req.operation.as_deref() {
        Some("CREATE") => (Operation::Create, req.object.as_ref()),
        Some("DELETE") => (Operation::Delete, req.old_object.as_ref()),
        _ => return None,
    };
    let namespace = req.namespace.as_deref().filter(|n| !n.is_empty())?;
    // A create with `generateName` has no name in the request, only in
    // the object; a new generated name cannot be held by anyone.
    let name = match req.name.as_deref().filter(|n| !n.is_empty()) {
        Some(n) => n,
        None => object?.metadata.as_ref()?.name.as_deref()?,
    };
    // Immutable only when the object says so. The API server sends the
    // object being deleted as a delete's `oldObject`
    // (`staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/request/
    // admissionreview.go`, `CreateV1AdmissionReview`: `OldObject:
    // versionedAttributes.VersionedOldObject`); a review without one did
    // not come from it and tells nothing about the object.
    let immutable = object.and_then(|o| o.immutable) == Some(true);
    Some(Reviewed {
        operation,
        source: SourceRef::new(kind, namespace.into(), name.into()),
        immutable,
    })
}

/// The answer to a review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Allowed, with these warnings (none: nothing to say).
    Allow(Vec<String>),
    /// Refused with this status code, reason and message.
    Deny {
        /// HTTP-style code.
        code: u16,
        /// `metav1.StatusReason`.
        reason: &'static str,
        /// What the caller sees.
        message: String,
    },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireAnswer<'a> {
    api_version: &'static str,
    kind: &'static str,
    response: WireResponse<'a>,
}

#[derive(Serialize)]
struct WireResponse<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<WireStatus<'a>>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    warnings: &'a [String],
}

/// `metav1.Status` of a refusal.
#[derive(Serialize)]
struct WireStatus<'a> {
    status: &'static str,
    message: &'a str,
    reason: &'static str,
    code: u16,
}

/// The `AdmissionReview` answering the review `uid`.
pub fn answer<'a>(uid: &'a str, verdict: &'a Verdict) -> impl Serialize + 'a {
    let response = match verdict {
        Verdict::Allow(warnings) => WireResponse {
            uid,
            allowed: true,
            status: None,
            warnings,
        },
        Verdict::Deny {
            code,
            reason,
            message,
        } => WireResponse {
            uid,
            allowed: false,
            status: Some(WireStatus {
                status: "Failure",
                message,
                reason,
                code: *code,
            }),
            warnings: &[],
        },
    };
    WireAnswer {
        api_version: API_VERSION,
        kind: KIND,
        response,
    }
}
