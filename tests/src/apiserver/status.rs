//! `metav1.Status` errors with the reasons and messages the real API server uses.

use hyper::StatusCode;
use serde_json::{Value, json};

use super::resources::ResourceType;

/// An API error, rendered as a `metav1.Status` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `reason` (`NotFound`, `Conflict`, ...).
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `details`, if any.
    pub details: Option<Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn details(rt: &ResourceType, name: &str) -> Value {
    let mut d = json!({ "name": name, "kind": rt.resource });
    if !rt.group.is_empty() {
        d["group"] = json!(rt.group);
    }
    d
}

impl ApiError {
    /// The Status body.
    pub fn to_status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        v
    }

    /// The HTTP status.
    pub fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    /// 404 `<resource> "<name>" not found`.
    pub fn not_found(rt: &ResourceType, name: &str) -> Self {
        Self {
            code: 404,
            reason: "NotFound",
            message: format!("{} \"{}\" not found", rt.qualified(), name),
            details: Some(details(rt, name)),
        }
    }

    /// 409 `<resource> "<name>" already exists`.
    pub fn already_exists(rt: &ResourceType, name: &str) -> Self {
        Self {
            code: 409,
            reason: "AlreadyExists",
            message: format!("{} \"{}\" already exists", rt.qualified(), name),
            details: Some(details(rt, name)),
        }
    }

    /// 409 Conflict on a stale resourceVersion.
    pub fn conflict(rt: &ResourceType, name: &str) -> Self {
        Self::conflict_msg(
            rt,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 409 Conflict with a specific cause.
    pub fn conflict_msg(rt: &ResourceType, name: &str, why: &str) -> Self {
        Self {
            code: 409,
            reason: "Conflict",
            message: format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                rt.qualified(),
                name,
                why
            ),
            details: Some(details(rt, name)),
        }
    }

    /// 422 Invalid with field causes `(field, reason, message)`.
    pub fn invalid(rt: &ResourceType, name: &str, causes: &[(&str, &str, String)]) -> Self {
        let rendered: Vec<String> = causes
            .iter()
            .map(|(field, _, msg)| format!("{field}: {msg}"))
            .collect();
        let summary = if rendered.len() == 1 {
            rendered[0].clone()
        } else {
            format!("[{}]", rendered.join(", "))
        };
        let mut d = json!({ "name": name, "kind": rt.kind });
        if !rt.group.is_empty() {
            d["group"] = json!(rt.group);
        }
        d["causes"] = causes
            .iter()
            .map(|(field, reason, msg)| json!({"reason": reason, "message": msg, "field": field}))
            .collect();
        Self {
            code: 422,
            reason: "Invalid",
            message: format!("{} \"{}\" is invalid: {}", rt.kind, name, summary),
            details: Some(d),
        }
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            code: 400,
            reason: "BadRequest",
            message: message.into(),
            details: None,
        }
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(what: &str) -> Self {
        Self {
            code: 405,
            reason: "MethodNotAllowed",
            message: format!(
                "the server does not allow this method on the requested resource ({what})"
            ),
            details: None,
        }
    }

    /// 410 Expired: the requested resourceVersion was compacted.
    pub fn expired(requested: u64, oldest: u64) -> Self {
        Self {
            code: 410,
            reason: "Expired",
            message: format!("too old resource version: {requested} ({oldest})"),
            details: None,
        }
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self {
            code: 415,
            reason: "UnsupportedMediaType",
            message: message.into(),
            details: None,
        }
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            code: 500,
            reason: "InternalError",
            message: message.into(),
            details: None,
        }
    }

    /// 429 TooManyRequests.
    pub fn too_many_requests(message: impl Into<String>) -> Self {
        Self {
            code: 429,
            reason: "TooManyRequests",
            message: message.into(),
            details: Some(json!({ "retryAfterSeconds": 1 })),
        }
    }
}
