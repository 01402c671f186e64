//! The engine's explicit history ([`EngineState`]): per source, pod,
//! subject and node, what the engine saw before. A caller owns it, may
//! persist it, or may rebuild it from scratch.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::subject::SubjectId;
use super::types::State;
use crate::index::ClusterIndex;
use crate::model::SourceRef;

/// History of one source as the engine saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceHistory {
    /// Keyed fingerprint of the content last seen (`None`: absent). A
    /// fingerprint, not the digest, so persisted state reveals nothing.
    pub fingerprint: Option<String>,
    /// When the content last changed, if known.
    pub content_changed_at: Option<Timestamp>,
    /// Per key: keyed fingerprint of the value and when it last changed, so
    /// an env var fed by one key is not judged by another key's change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<Arc<str>, KeyHistory>,
}

/// History of one key of a source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyHistory {
    /// Keyed fingerprint of the value (never the digest).
    pub fingerprint: String,
    /// When the value last changed, if known.
    pub changed_at: Option<Timestamp>,
}

/// History of one subject.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubjectHistory {
    /// The subject.
    pub id: SubjectId,
    /// State and cause, serialized as e.g. `Stale/Unknown`.
    pub state: State,
    /// Since when.
    pub since: Timestamp,
}

/// History of one pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodHistory {
    /// The node the pod ran on when last evaluated.
    pub node: Option<Arc<str>>,
    /// Verifiable volume mounts of only mutable sources.
    pub mutable_mounts: u32,
    /// Of those, stale past grace (before the node rule).
    pub stale_mutable_mounts: u32,
    /// Subjects (a boxed slice: its length is fixed once built, and it
    /// saves a capacity word per pod).
    pub subjects: Box<[SubjectHistory]>,
}

/// Per-node counters for the KubeletNotSyncing rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeHistory {
    /// Verifiable mutable volume mounts on the node.
    pub mutable_mounts: u32,
    /// Of those, stale past grace.
    pub stale_mutable_mounts: u32,
    /// The rule fired at the last evaluation.
    pub not_syncing: bool,
}

#[derive(Serialize, Deserialize)]
pub(super) struct SourceEntry {
    #[serde(flatten)]
    pub(super) source: SourceRef,
    #[serde(flatten)]
    pub(super) history: SourceHistory,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StateWire {
    pub(super) sources: Vec<SourceEntry>,
    pub(super) pods: HashMap<Arc<str>, PodHistory>,
    pub(super) nodes: HashMap<Arc<str>, NodeHistory>,
}

/// The engine's history, passed in and out of every evaluation so a caller
/// can persist it or rebuild it (an empty state is always valid: the engine
/// then falls back to `managedFields` times and its own observations).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StateWire", into = "StateWire")]
pub struct EngineState {
    /// Per source: content fingerprint and when it last changed.
    pub sources: HashMap<SourceRef, SourceHistory>,
    /// Per pod UID: subjects' states and since when.
    pub pods: HashMap<Arc<str>, PodHistory>,
    /// Per node: counters of the KubeletNotSyncing rule.
    pub nodes: HashMap<Arc<str>, NodeHistory>,
}

impl From<StateWire> for EngineState {
    fn from(w: StateWire) -> Self {
        Self {
            sources: w
                .sources
                .into_iter()
                .map(|e| (e.source, e.history))
                .collect(),
            pods: w.pods,
            nodes: w.nodes,
        }
    }
}

impl From<EngineState> for StateWire {
    fn from(s: EngineState) -> Self {
        let mut sources: Vec<SourceEntry> = s
            .sources
            .into_iter()
            .map(|(source, history)| SourceEntry { source, history })
            .collect();
        sources.sort_by(|a, b| a.source.cmp(&b.source));
        Self {
            sources,
            pods: s.pods,
            nodes: s.nodes,
        }
    }
}

impl EngineState {
    /// When `r`'s content last changed, from history, else from the
    /// object's last write.
    pub(super) fn changed_at(&self, index: &ClusterIndex, r: &SourceRef) -> Option<Timestamp> {
        match self.sources.get(r) {
            Some(h) => h.content_changed_at,
            None => index.source(r).and_then(|c| c.last_write),
        }
    }

    /// When key `key` of `r` last changed, from the per-key history; else
    /// when the object changed (one dump, or a key the history has not
    /// seen: every key is taken to have changed with the object).
    pub(super) fn key_changed_at(
        &self,
        index: &ClusterIndex,
        r: &SourceRef,
        key: &str,
    ) -> Option<Timestamp> {
        match self.sources.get(r).and_then(|h| h.keys.get(key)) {
            Some(k) => k.changed_at,
            None => self.changed_at(index, r),
        }
    }
}
