//! The node inventory: what the mountguard agent saw on a node, as it travels
//! to the controller, and the digest definitions both sides share.
//!
//! The wire format is JSON with `camelCase` field names and the schema tag
//! [`SCHEMA`]. See `docs/architecture.md` for the exact digest definition.

pub mod digest;
pub mod duration;
pub mod layout;
pub mod names;
pub mod report;
pub mod size;
pub mod table;
mod types;
#[cfg(feature = "writer")]
pub mod writer;

pub use digest::{FileDigest, file_digest, volume_digest};
pub use duration::{DurationError, parse_duration, split_duration_hint};
pub use size::{SizeError, parse_size};
pub use types::*;

/// Schema tag every inventory carries in its `schema` field.
pub const SCHEMA: &str = "mountguard.io/node-inventory/v1";

/// Errors of this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The JSON could not be parsed into an inventory.
    #[error("inventory is not valid JSON for {SCHEMA}: {0}")]
    Parse(#[from] serde_json::Error),
    /// The inventory parsed but says it is of another schema.
    #[error(
        "inventory has schema {found:?}, expected {SCHEMA:?}; upgrade the agent or the controller so both speak the same version"
    )]
    Schema {
        /// The schema tag found in the document.
        found: String,
    },
    /// A digest field is not 64 lowercase hex characters.
    #[error("{context}: digest {value:?} is not 64 lowercase hex characters")]
    BadDigest {
        /// Where the bad digest was found.
        context: String,
        /// The offending value (a digest, never content).
        value: String,
    },
}
