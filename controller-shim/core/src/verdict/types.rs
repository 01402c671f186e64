//! The verdict types: configuration, states and their causes, verdicts of a
//! pod and an evaluation's result (their output form: `output.rs`).

use std::sync::Arc;

use jiff::SignedDuration;
use serde::{Deserialize, Serialize};

use super::subject::{Subject, SubjectId, subject_of};
use crate::fingerprint::Fingerprint;
use crate::model::{CompactTime, PodModel, SkipReason, SourceRef};
use crate::uid::PodUid;

/// Engine configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// A mismatch whose source changed less than this before the node was
    /// scanned is `Propagating`, not `Stale`.
    pub grace: SignedDuration,
    /// An inventory scanned longer ago than this is too old to judge by.
    pub inventory_max_age: SignedDuration,
    /// `KubeletNotSyncing` needs at least this many verifiable mutable
    /// volume mounts on the node...
    pub not_syncing_min_mounts: u32,
    /// ...and more than half of them stale past grace.
    /// List every file of Fresh volumes in verdicts (otherwise only files of
    /// non-Fresh volumes are listed).
    pub list_fresh_files: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            grace: SignedDuration::from_secs(180),
            inventory_max_age: SignedDuration::from_secs(300),
            not_syncing_min_mounts: 3,
            list_fresh_files: false,
        }
    }
}

/// Whether the Secrets and ConfigMaps the engine sees are current: an input
/// of the engine, like the time. The caller knows (its watches of them
/// fail or not); see the API rule in `rules.rs`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ApiHealth {
    /// The source watches are healthy.
    #[default]
    Available,
    /// A Secret or ConfigMap watch is failing: what the engine holds may
    /// be old.
    Unavailable,
}

/// Why content is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StaleCause {
    /// Immutable source recreated with new content; nothing else on the node
    /// references it, so replacing this pod gets fresh content.
    ImmutableCache,
    /// The same, but other pods on the node keep the kubelet's cache entry
    /// alive (see [`Verdict::pinned_by`]); replacing this pod alone cannot
    /// help.
    ImmutableCachePinned,
    /// Most mutable mounts on the node are stale past grace: the node's
    /// kubelet, not the pod, is the problem.
    KubeletNotSyncing,
    /// None of the above.
    Unknown,
}

/// Why a correct source still leaves the process on old content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum FrozenCause {
    /// A subPath mount (never updated while the container runs).
    SubPath,
    /// An environment variable (fixed at container start).
    Env,
    /// A volume declared read-at-start was refreshed after the container
    /// started.
    ReadAtStart,
}

/// Why a subject cannot be judged now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnverifiableReason {
    /// No inventory for the pod's node.
    NoInventory,
    /// The node's inventory is older than the configured limit.
    InventoryTooOld,
    /// The agent could not read a relevant path.
    ReadError,
    /// The volume or subPath target is not (yet) on the node.
    NotOnDisk,
    /// The container is not running (env and subPath need a start time).
    ContainerNotRunning,
    /// The controller's view of the sources is not current (watch not
    /// synced or failing): the expected content is unknown. Set by the live
    /// controller, never by the engine itself.
    ApiUnavailable,
}

/// The verdict state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Mounted content equals the current source content.
    Fresh,
    /// Differs, but the source changed less than the grace period before the
    /// node was scanned.
    Propagating,
    /// Differs past grace.
    Stale(StaleCause),
    /// Only a container restart helps.
    Frozen(FrozenCause),
    /// A non-optional object or key does not exist; the kubelet keeps what it
    /// had (and refuses to start new pods).
    SourceMissing,
    /// Cannot be judged now.
    Unverifiable(UnverifiableReason),
    /// Not verifiable from the API.
    Skipped(SkipReason),
}

impl State {
    /// The state name.
    pub fn name(&self) -> &'static str {
        match self {
            State::Fresh => "Fresh",
            State::Propagating => "Propagating",
            State::Stale(_) => "Stale",
            State::Frozen(_) => "Frozen",
            State::SourceMissing => "SourceMissing",
            State::Unverifiable(_) => "Unverifiable",
            State::Skipped(_) => "Skipped",
        }
    }

    /// The cause or reason name, if the state has one.
    pub fn cause(&self) -> Option<&'static str> {
        Some(match self {
            State::Stale(StaleCause::ImmutableCache) => "ImmutableCache",
            State::Stale(StaleCause::ImmutableCachePinned) => "ImmutableCachePinned",
            State::Stale(StaleCause::KubeletNotSyncing) => "KubeletNotSyncing",
            State::Stale(StaleCause::Unknown) => "Unknown",
            State::Frozen(FrozenCause::SubPath) => "SubPath",
            State::Frozen(FrozenCause::Env) => "Env",
            State::Frozen(FrozenCause::ReadAtStart) => "ReadAtStart",
            State::Unverifiable(UnverifiableReason::NoInventory) => "NoInventory",
            State::Unverifiable(UnverifiableReason::InventoryTooOld) => "InventoryTooOld",
            State::Unverifiable(UnverifiableReason::ReadError) => "ReadError",
            State::Unverifiable(UnverifiableReason::NotOnDisk) => "NotOnDisk",
            State::Unverifiable(UnverifiableReason::ContainerNotRunning) => "ContainerNotRunning",
            State::Unverifiable(UnverifiableReason::ApiUnavailable) => "ApiUnavailable",
            State::Skipped(r) => r.as_str(),
            _ => return None,
        })
    }

    /// `State` or `State/Cause`, e.g. `Stale/ImmutableCachePinned`.
    pub fn tag(&self) -> String {
        match self.cause() {
            Some(c) => format!("{}/{c}", self.name()),
            None => self.name().to_string(),
        }
    }

    /// Every state, for parsing and documentation.
    pub fn all() -> Vec<State> {
        use FrozenCause as F;
        use StaleCause as S;
        use UnverifiableReason as U;
        let mut v = vec![
            State::Fresh,
            State::Propagating,
            State::Stale(S::ImmutableCache),
            State::Stale(S::ImmutableCachePinned),
            State::Stale(S::KubeletNotSyncing),
            State::Stale(S::Unknown),
            State::Frozen(F::SubPath),
            State::Frozen(F::Env),
            State::Frozen(F::ReadAtStart),
            State::SourceMissing,
            State::Unverifiable(U::NoInventory),
            State::Unverifiable(U::InventoryTooOld),
            State::Unverifiable(U::ReadError),
            State::Unverifiable(U::NotOnDisk),
            State::Unverifiable(U::ContainerNotRunning),
            State::Unverifiable(U::ApiUnavailable),
        ];
        for r in [
            SkipReason::DownwardApi,
            SkipReason::ServiceAccountToken,
            SkipReason::ClusterTrustBundle,
            SkipReason::PodCertificate,
            SkipReason::UnknownSource,
            SkipReason::SubPathExpr,
            SkipReason::PodTerminating,
            SkipReason::FileKeyRef,
        ] {
            v.push(State::Skipped(r));
        }
        v
    }
}

impl std::str::FromStr for State {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        State::all()
            .into_iter()
            .find(|st| st.tag() == s)
            .ok_or_else(|| format!("unknown verdict state {s:?}"))
    }
}

impl Serialize for State {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.tag())
    }
}

impl<'de> Deserialize<'de> for State {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The state of one file of a volume or subPath target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum FileState {
    /// Matches.
    Fresh,
    /// Present with other content.
    Differs,
    /// Expected but not on disk.
    Missing,
    /// On disk but not expected.
    Unexpected,
    /// Not verifiable from the API.
    Skipped,
    /// The agent could not read it.
    Unreadable,
}

/// One file's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FileVerdict {
    /// Relative path.
    pub path: Arc<str>,
    /// State of the file.
    pub state: FileState,
    /// Fingerprint of the expected content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<Fingerprint>,
    /// Fingerprint of the observed content.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<Fingerprint>,
}

/// Details most verdicts do not need (kept out of line to keep Fresh
/// verdicts small).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerdictDetail {
    /// Paths whose content differs, is missing or is unexpected.
    pub differing_paths: Vec<Arc<str>>,
    /// Per-file verdicts.
    pub files: Vec<FileVerdict>,
    /// Pods (names, same namespace) keeping an immutable cache entry alive.
    pub pinned_by: Vec<Arc<str>>,
    /// Containers concerned (ReadAtStart).
    pub containers: Vec<Arc<str>>,
    /// An env verdict whose container read the kubelet's cache entry of an
    /// immutable object older than the current one, which its pod keeps
    /// registered: a container restart reads the same values again.
    pub cached_env: bool,
    /// Human-readable explanation (never content).
    pub message: Option<String>,
}

/// The verdict on one subject of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What is judged (see [`PodVerdicts::subject`]).
    pub id: SubjectId,
    /// The verdict.
    pub state: State,
    /// The verdict before the API rule: what the engine's history keeps
    /// (see [`super::PodHistory`]), so the state underneath keeps its
    /// `since` while the Secret and ConfigMap watches are unavailable.
    /// Equal to `state` while they are healthy. (It fits in what would
    /// otherwise be padding: a verdict stays 40 bytes.)
    pub underlying: State,
    /// Fingerprint of the expected content.
    pub expected: Option<Fingerprint>,
    /// Fingerprint of the observed content.
    pub observed: Option<Fingerprint>,
    /// Since when this state (with this cause) holds (8 bytes, exact for
    /// every clock reading: see [`CompactTime`]).
    pub since: CompactTime,
    /// Details, present when there is something to say.
    pub detail: Option<Box<VerdictDetail>>,
}

impl Verdict {
    /// Pods pinning an immutable cache entry.
    pub fn pinned_by(&self) -> &[Arc<str>] {
        self.detail.as_deref().map_or(&[], |d| &d.pinned_by)
    }

    /// Differing paths.
    pub fn differing_paths(&self) -> &[Arc<str>] {
        self.detail.as_deref().map_or(&[], |d| &d.differing_paths)
    }

    /// Per-file verdicts (only listed for non-Fresh volumes unless
    /// configured otherwise).
    pub fn files(&self) -> &[FileVerdict] {
        self.detail.as_deref().map_or(&[], |d| &d.files)
    }

    /// Explanation, if any.
    pub fn message(&self) -> Option<&str> {
        self.detail.as_deref().and_then(|d| d.message.as_deref())
    }
}

/// A pod's verdicts, shared by the engine's history and the published
/// record: one pointer (the length is kept in the shared allocation, where
/// an `Arc<[Verdict]>` keeps it in every holder). Reads as a slice.
#[derive(Clone, PartialEq, Eq)]
pub struct VerdictList(triomphe::ThinArc<(), Verdict>);

impl VerdictList {
    /// Whether `a` and `b` are the same allocation.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        std::ptr::eq(a.0.ptr(), b.0.ptr())
    }
}

impl Default for VerdictList {
    fn default() -> Self {
        Self::from(Vec::new())
    }
}

impl std::ops::Deref for VerdictList {
    type Target = [Verdict];

    fn deref(&self) -> &[Verdict] {
        &self.0.slice
    }
}

impl From<Vec<Verdict>> for VerdictList {
    fn from(v: Vec<Verdict>) -> Self {
        Self(triomphe::ThinArc::from_header_and_iter((), v.into_iter()))
    }
}

impl FromIterator<Verdict> for VerdictList {
    fn from_iter<I: IntoIterator<Item = Verdict>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl std::fmt::Debug for VerdictList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Verdicts of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVerdicts {
    /// The pod as evaluated (shared with the index, not copied).
    pub pod: Arc<PodModel>,
    /// One verdict per volume, subPath mount and env reference. Shared
    /// (not copied) with the engine's history of the pod, which reads each
    /// subject's `underlying` state and `since` from it.
    pub verdicts: VerdictList,
}

impl PodVerdicts {
    /// What verdict `v` of this pod is about.
    pub fn subject(&self, v: &Verdict) -> Subject {
        subject_of(&self.pod, v.id)
    }

    /// The Secrets and ConfigMaps verdict `v` depends on.
    pub fn sources(&self, v: &Verdict) -> Vec<SourceRef> {
        let pod = &self.pod;
        let volume_sources = |vi: usize| -> Vec<SourceRef> {
            pod.volumes
                .get(vi)
                .map(|vol| vol.source.refs(pod.namespace()))
                .unwrap_or_default()
        };
        match v.id {
            SubjectId::Volume(vi) => volume_sources(vi as usize),
            SubjectId::SubPath(ci, mi) => pod
                .containers
                .get(ci as usize)
                .and_then(|c| c.mounts.get(mi as usize))
                .map(|m| volume_sources(m.volume as usize))
                .unwrap_or_default(),
            SubjectId::Env(ci, ei) => pod
                .containers
                .get(ci as usize)
                .and_then(|c| c.env.get(ei as usize))
                .and_then(|e| e.target())
                .map(|(kind, name)| {
                    vec![SourceRef::new(kind, pod.namespace().clone(), name.clone())]
                })
                .unwrap_or_default(),
        }
    }
}

/// Result of an evaluation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Evaluation {
    /// Verdicts per evaluated pod.
    pub pods: Vec<PodVerdicts>,
    /// UIDs asked for that are no longer in the index (their history was
    /// dropped).
    pub removed: Vec<PodUid>,
}

impl Evaluation {
    /// Every verdict with its pod.
    pub fn iter(&self) -> impl Iterator<Item = (&PodVerdicts, &Verdict)> {
        self.pods
            .iter()
            .flat_map(|p| p.verdicts.iter().map(move |v| (p, v)))
    }

    /// Number of verdicts.
    pub fn len(&self) -> usize {
        self.pods.iter().map(|p| p.verdicts.len()).sum()
    }

    /// Whether there is no verdict.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests;
