//! The report protocol between agent and controller.
//!
//! * `PUT /v1/nodes/{node}/inventory`, body a [`crate::NodeInventory`]: the
//!   whole node inventory, sent on every change (debounced).
//! * `PUT /v1/nodes/{node}/heartbeat`, body a [`Heartbeat`]: sent
//!   periodically; tells the controller the agent is alive, rescanned at
//!   `scannedAt` and still holds `generation`. When the controller does not
//!   hold that generation (it restarted, or a new leader took over) it
//!   answers [`ReportStatus::Resend`] and the agent sends its inventory at
//!   once.
//!
//! Both carry `Authorization: Bearer <projected service-account token>`.
//! Success is `200` with a [`ReportResponse`]; failures are 4xx/5xx with an
//! [`ErrorBody`]: 400 malformed, 401 unauthenticated, 403 forbidden (token
//! not allowed to report for that node), 409 older generation than the one
//! held, 413 body too large, 429 rate limited (with `Retry-After`).

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Schema tag of a heartbeat.
pub const HEARTBEAT_SCHEMA: &str = "mountguard.io/node-heartbeat/v1";

/// Path of the inventory endpoint for `node`.
pub fn inventory_path(node: &str) -> String {
    format!("/v1/nodes/{node}/inventory")
}

/// Path of the heartbeat endpoint for `node`.
pub fn heartbeat_path(node: &str) -> String {
    format!("/v1/nodes/{node}/heartbeat")
}

/// A periodic sign of life.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Heartbeat {
    /// Always [`HEARTBEAT_SCHEMA`].
    pub schema: String,
    /// The node name.
    pub node: String,
    /// The generation of the agent's current inventory.
    pub generation: u64,
    /// When the agent last rescanned (and found that generation current).
    pub scanned_at: Timestamp,
}

impl Heartbeat {
    /// A heartbeat for `node`.
    pub fn new(node: impl Into<String>, generation: u64, scanned_at: Timestamp) -> Self {
        Self {
            schema: HEARTBEAT_SCHEMA.to_string(),
            node: node.into(),
            generation,
            scanned_at,
        }
    }
}

/// What the controller did with a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ReportStatus {
    /// The inventory was stored.
    Accepted,
    /// The controller already held this generation (or the heartbeat matched).
    Unchanged,
    /// The controller does not hold this generation: send the inventory.
    Resend,
}

/// The body of a successful report response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportResponse {
    /// What happened.
    pub status: ReportStatus,
    /// The generation the controller now holds for the node, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
}

/// The body of an error response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    /// A stable machine-readable code (`badRequest`, `unauthenticated`,
    /// `forbidden`, `staleGeneration`, `tooLarge`, `rateLimited`, ...).
    pub error: String,
    /// What went wrong and what to do, for humans.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_and_responses_use_camel_case() {
        let hb = Heartbeat::new("node-a", 7, "2026-11-30T08:00:00Z".parse().unwrap());
        let json = serde_json::to_string(&hb).unwrap();
        assert_eq!(
            json,
            r#"{"schema":"mountguard.io/node-heartbeat/v1","node":"node-a","generation":7,"scannedAt":"2026-11-30T08:00:00Z"}"#
        );
        let r: ReportResponse = serde_json::from_str(r#"{"status":"resend"}"#).unwrap();
        assert_eq!(r.status, ReportStatus::Resend);
        assert_eq!(inventory_path("n1"), "/v1/nodes/n1/inventory");
        assert_eq!(heartbeat_path("n1"), "/v1/nodes/n1/heartbeat");
        assert!(serde_json::from_str::<Heartbeat>(r#"{"schema":"x","node":"n","generation":1,"scannedAt":"2026-11-30T08:00:00Z","extra":1}"#).is_err());
    }
}
