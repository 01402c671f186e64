//! What the engine hands the rules and the rules hand back, below both
//! (`engine.rs` orders the rules, `rules.rs` decides): the
//! part of the engine the rules read, how a node's inventory can be used,
//! and the verdicts of a pod before the node rule and history.

use jiff::Timestamp;

use super::types::{Config, Verdict};
use crate::fingerprint::Fingerprinter;
use crate::index::PodId;
use crate::model::ObservedNode;

/// What the rules read of the engine: its configuration and the
/// installation's fingerprinter.
#[derive(Clone, Copy)]
pub(super) struct EngineView<'a> {
    pub(super) config: &'a Config,
    pub(super) fingerprinter: &'a Fingerprinter,
}

/// How a node's inventory can be used.
pub(super) enum NodeView<'a> {
    NoInventory,
    TooOld,
    Usable(&'a ObservedNode),
}

/// A verdict before the node rule and history are applied.
pub(super) struct Prelim {
    pub(super) verdict: Verdict,
    /// First-sight estimate of `since`.
    pub(super) estimate: Timestamp,
    /// Counts as a verifiable volume mount of only mutable sources.
    pub(super) mutable_mount: bool,
}

/// A pod's verdicts before the node rule and history, with its counts of
/// verifiable mutable volume mounts and of those stale for no known cause
/// (the node rule's inputs).
pub(super) struct PodPrelim {
    pub(super) id: PodId,
    pub(super) verdicts: Vec<Prelim>,
    pub(super) mutable: u32,
    pub(super) stale: u32,
}
