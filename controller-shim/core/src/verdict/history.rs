//! The engine's explicit history ([`EngineState`]): per source, pod,
//! subject and node, what the engine saw before. A caller owns it, may
//! persist it, or may rebuild it from scratch.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::subject::SubjectId;
use super::types::{PodVerdicts, State, Verdict};
use crate::index::ClusterIndex;
use crate::model::{PodModel, PodPlace, SourceRef, VolumeList};
use crate::table::{Keyed, KeyedTable};
use crate::uid::PodUid;

/// History of one source as the engine saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceHistory {
    /// Keyed fingerprint of the content last seen (`None`: absent). A
    /// fingerprint, not the digest, so persisted state reveals nothing.
    pub fingerprint: Option<String>,
    /// When the content last changed, if known.
    pub content_changed_at: Option<Timestamp>,
    /// `content_changed_at` is a change the engine saw (from content it had
    /// seen, or the object's vanishing), not the object's last write taken
    /// on first sight: the content before it is known to differ.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub change_seen: bool,
    /// Per key: keyed fingerprint of the value and when it last changed, so
    /// an env var fed by one key is not judged by another key's change.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub keys: BTreeMap<Arc<str>, KeyHistory>,
    /// While the object is absent: its content when last present, so a
    /// recreation with the same content is no change (`keys` keeps that
    /// content's keys meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before_absence: Option<PresentContent>,
}

/// The content of a source when it was last present.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PresentContent {
    /// Its keyed fingerprint.
    pub fingerprint: String,
    /// When it last changed, if known.
    pub changed_at: Option<Timestamp>,
    /// That change was seen (see [`SourceHistory::change_seen`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub change_seen: bool,
}

/// History of one key of a source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyHistory {
    /// Keyed fingerprint of the value (never the digest).
    pub fingerprint: String,
    /// When the value last changed, if known.
    pub changed_at: Option<Timestamp>,
    /// `changed_at` is a change the engine saw (the value differs from one
    /// it had seen, or the key appeared), not a first sight: the value
    /// before it is known to differ.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub change_seen: bool,
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

/// History of one pod: the pod as last evaluated and its verdicts then,
/// shared with the published [`PodVerdicts`] instead of copied, and the
/// node rule's counters.
///
/// Each subject's state (before the API rule) and `since` are read from
/// those verdicts; only those fields of them, and only the pod's UID and
/// node, count here (a history read back from its serialized form holds
/// nothing else). Serialized under its UID: `node`, the counters and
/// `subjects`, one [`SubjectHistory`] each.
#[derive(Debug, Clone)]
pub struct PodHistory {
    /// The pod as last evaluated and its verdicts then.
    pub last: PodVerdicts,
    /// Verifiable volume mounts of only mutable sources.
    pub mutable_mounts: u32,
    /// Of those, stale past grace (before the node rule).
    pub stale_mutable_mounts: u32,
}

/// Equal when what the history holds is: the UID, the node, the counters
/// and each subject's id, state and `since`.
impl PartialEq for PodHistory {
    fn eq(&self, other: &Self) -> bool {
        self.uid() == other.uid()
            && self.node() == other.node()
            && self.mutable_mounts == other.mutable_mounts
            && self.stale_mutable_mounts == other.stale_mutable_mounts
            && self.subjects().eq(other.subjects())
    }
}

impl Eq for PodHistory {}

impl Keyed for PodHistory {
    type Key = PodUid;

    fn key(&self) -> &PodUid {
        self.uid()
    }
}

impl PodHistory {
    /// The pod's UID.
    pub fn uid(&self) -> &PodUid {
        &self.last.pod.uid
    }

    /// The node the pod ran on when last evaluated.
    pub fn node(&self) -> Option<&Arc<str>> {
        self.last.pod.node()
    }

    /// Subject `id`'s state (before the API rule) and since when.
    pub fn subject(&self, id: SubjectId) -> Option<(State, Timestamp)> {
        self.last
            .verdicts
            .iter()
            .find(|v| v.id == id)
            .map(|v| (v.underlying, v.since.get()))
    }

    /// Every subject's history, in the order of the verdicts.
    pub fn subjects(&self) -> impl Iterator<Item = SubjectHistory> + '_ {
        self.last.verdicts.iter().map(|v| SubjectHistory {
            id: v.id,
            state: v.underlying,
            since: v.since.get(),
        })
    }
}

/// [`PodHistory`] as it is serialized.
#[derive(Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PodHistoryWire {
    node: Option<Arc<str>>,
    mutable_mounts: u32,
    stale_mutable_mounts: u32,
    subjects: Vec<SubjectHistory>,
}

impl PodHistory {
    /// A history read back: the pod is a model with only its UID and node
    /// (all the history uses of it), the verdicts only their id, state and
    /// `since`.
    fn from_wire(uid: PodUid, w: PodHistoryWire) -> Self {
        let pod = PodModel {
            uid,
            place: PodPlace::new(Arc::from(""), w.node),
            name: Box::default(),
            terminated: false,
            terminating: false,
            synced_at: None,
            ready: false,
            slinky: None,
            workload: None,
            volumes: VolumeList::default(),
            containers: Box::new([]),
            extra_refs: Default::default(),
        };
        Self {
            last: PodVerdicts {
                pod: Arc::new(pod),
                verdicts: w
                    .subjects
                    .into_iter()
                    .map(|s| Verdict {
                        id: s.id,
                        state: s.state,
                        underlying: s.state,
                        expected: None,
                        observed: None,
                        since: s.since.into(),
                        detail: None,
                    })
                    .collect(),
            },
            mutable_mounts: w.mutable_mounts,
            stale_mutable_mounts: w.stale_mutable_mounts,
        }
    }
}

impl From<PodHistory> for PodHistoryWire {
    fn from(h: PodHistory) -> Self {
        Self {
            subjects: h.subjects().collect(),
            node: h.node().cloned(),
            mutable_mounts: h.mutable_mounts,
            stale_mutable_mounts: h.stale_mutable_mounts,
        }
    }
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
    /// By UID, written as its text (as every earlier version wrote it,
    /// and read back from it).
    pub(super) pods: HashMap<PodUid, PodHistoryWire>,
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
    /// Per pod UID: subjects' states and since when (a dense table: one
    /// entry per pod at this size costs half what a hash map's does).
    pub pods: KeyedTable<PodHistory>,
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
            pods: w
                .pods
                .into_iter()
                .map(|(uid, h)| PodHistory::from_wire(uid, h))
                .collect(),
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
            pods: s
                .pods
                .into_iter()
                .map(|h| (h.uid().clone(), h.into()))
                .collect(),
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
        // While the object is absent its keys are those of its last
        // content (kept to compare a recreation with): it changed when it
        // vanished.
        let present = self.sources.get(r).filter(|h| h.fingerprint.is_some());
        match present.and_then(|h| h.keys.get(key)) {
            Some(k) => k.changed_at,
            None => self.changed_at(index, r),
        }
    }

    /// Whether the engine saw the change [`Self::key_changed_at`] (with
    /// `key`) or [`Self::changed_at`] (without) gives: then what `r` (its
    /// key) held before that time is known to differ from what it holds
    /// now. False without history (a one-off `verify`, a restarted
    /// controller: the change time is then the object's last write, which a
    /// recreation with the same content moves too).
    pub(super) fn change_seen(&self, r: &SourceRef, key: Option<&str>) -> bool {
        let Some(h) = self.sources.get(r) else {
            return false;
        };
        let present = h.fingerprint.is_some();
        match key.and_then(|k| h.keys.get(k)).filter(|_| present) {
            Some(k) => k.change_seen,
            None => h.change_seen,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::StaleCause;

    /// A history as the versions that held pod UIDs as strings wrote it
    /// (`pods` keyed by the UID's text; the form is unchanged): it loads,
    /// UUIDs come back held as 16 bytes, other UIDs as their exact text,
    /// and it is written back as it was read.
    #[test]
    fn a_history_written_with_string_uids_loads_and_is_written_back_the_same() {
        let uuid = "0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3b";
        let upper = "0B6A2C1E-7F3D-4A59-9C1B-2E8F4D6A0C3B";
        let old = r#"{
            "sources": [],
            "pods": {
                "0b6a2c1e-7f3d-4a59-9c1b-2e8f4d6a0c3b": {
                    "node": "node-a", "mutableMounts": 2, "staleMutableMounts": 1,
                    "subjects": [
                        {"id": {"volume": 0}, "state": "Stale/Unknown", "since": "2026-11-30T10:00:00Z"},
                        {"id": {"subPath": [0, 1]}, "state": "Fresh", "since": "2026-11-30T09:00:00Z"}
                    ]
                },
                "uid-p": {"node": null, "mutableMounts": 0, "staleMutableMounts": 0, "subjects": []},
                "0B6A2C1E-7F3D-4A59-9C1B-2E8F4D6A0C3B": {
                    "node": "node-b", "mutableMounts": 1, "staleMutableMounts": 0,
                    "subjects": [{"id": {"volume": 1}, "state": "Fresh", "since": "2026-11-30T08:00:00Z"}]
                }
            },
            "nodes": {"node-a": {"mutableMounts": 2, "staleMutableMounts": 1, "notSyncing": false}}
        }"#;
        let state: EngineState = serde_json::from_str(old).unwrap();
        assert_eq!(state.pods.len(), 3);

        let h = state.pods.get(&PodUid::new(uuid)).unwrap();
        assert!(h.uid().is_compact());
        assert_eq!(h.uid().to_string(), uuid);
        assert_eq!(h.node().map(|n| &**n), Some("node-a"));
        assert_eq!((h.mutable_mounts, h.stale_mutable_mounts), (2, 1));
        assert_eq!(
            h.subject(SubjectId::Volume(0)),
            Some((
                State::Stale(StaleCause::Unknown),
                "2026-11-30T10:00:00Z".parse().unwrap()
            ))
        );
        assert_eq!(
            h.subject(SubjectId::SubPath(0, 1)).map(|(s, _)| s),
            Some(State::Fresh)
        );
        for text in ["uid-p", upper] {
            let h = state.pods.get(&PodUid::new(text)).unwrap();
            assert!(!h.uid().is_compact(), "{text}");
            assert_eq!(h.uid().to_string(), text);
        }
        assert!(
            state
                .pods
                .get(&PodUid::new(upper))
                .unwrap()
                .node()
                .is_some()
        );
        assert_eq!(
            state.nodes[&Arc::<str>::from("node-a")].stale_mutable_mounts,
            1
        );

        // Written back: the same document, UIDs as the same strings.
        let written: serde_json::Value = serde_json::to_value(&state).unwrap();
        let read: serde_json::Value = serde_json::from_str(old).unwrap();
        assert_eq!(written, read);
        let again: EngineState = serde_json::from_value(written).unwrap();
        assert_eq!(again, state);
    }
}
