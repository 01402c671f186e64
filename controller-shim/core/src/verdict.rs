//! Evaluation: expected versus observed content, verdicts, and the explicit
//! history ([`EngineState`]) the engine needs between evaluations.
//!
//! Pure: no clock reads (`now` is an argument), no I/O. The only mutable
//! input is the `&mut EngineState` a caller owns, may persist, or may
//! rebuild from scratch.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use mountguard_inventory::layout::{SUBPATHS_DIR, VOLUMES_DIR};
use mountguard_inventory::volume_digest;
use serde::{Deserialize, Serialize};

use crate::fingerprint::{Fingerprint, Fingerprinter};
use crate::index::{ClusterIndex, PodId};
use crate::model::{Digest, ObservedError, ObservedNode, PodModel, SkipReason, SourceRef};
use crate::projection::{
    ExpectedSubPath, ExpectedVolume, project_env, project_sub_path, project_volume, sub_path_skip,
};

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

/// What a verdict is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A Secret, ConfigMap or projected volume of the pod.
    Volume {
        /// Volume name.
        volume: Arc<str>,
    },
    /// A subPath mount of a container.
    SubPath {
        /// Container name.
        container: Arc<str>,
        /// Volume name.
        volume: Arc<str>,
        /// Position in the container's `volumeMounts`.
        index: u32,
        /// The subPath.
        sub_path: Arc<str>,
    },
    /// An environment reference of a container.
    Env {
        /// Container name.
        container: Arc<str>,
        /// Variable name (`valueFrom`), or `envFrom` plus the prefix if any.
        var: Arc<str>,
    },
}

/// Stable identity of a subject within a pod (pod specs are immutable in
/// the fields that matter, so indexes are stable for a pod UID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SubjectId {
    /// Volume index.
    Volume(u16),
    /// (container index, mount index).
    SubPath(u16, u16),
    /// (container index, env reference index).
    Env(u16, u16),
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
    /// Fingerprint of the expected content.
    pub expected: Option<Fingerprint>,
    /// Fingerprint of the observed content.
    pub observed: Option<Fingerprint>,
    /// Since when this state (with this cause) holds.
    pub since: Timestamp,
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

/// Verdicts of one pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodVerdicts {
    /// The pod as evaluated (shared with the index, not copied).
    pub pod: Arc<PodModel>,
    /// One verdict per volume, subPath mount and env reference.
    pub verdicts: Vec<Verdict>,
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
                .map(|vol| vol.source.refs(&pod.namespace))
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
                .map(|e| {
                    let (kind, name) = e.target();
                    vec![SourceRef::new(kind, pod.namespace.clone(), name.clone())]
                })
                .unwrap_or_default(),
        }
    }
}

/// The subject a [`SubjectId`] names in `pod`.
pub fn subject_of(pod: &PodModel, id: SubjectId) -> Subject {
    let unknown = || Subject::Volume {
        volume: Arc::from("?"),
    };
    match id {
        SubjectId::Volume(vi) => {
            pod.volumes
                .get(vi as usize)
                .map_or_else(unknown, |v| Subject::Volume {
                    volume: v.name.clone(),
                })
        }
        SubjectId::SubPath(ci, mi) => {
            let Some(c) = pod.containers.get(ci as usize) else {
                return unknown();
            };
            let Some(m) = c.mounts.get(mi as usize) else {
                return unknown();
            };
            Subject::SubPath {
                container: c.name.clone(),
                volume: pod
                    .volumes
                    .get(m.volume as usize)
                    .map_or_else(|| Arc::from("?"), |v| v.name.clone()),
                index: m.index,
                sub_path: m
                    .sub_path
                    .clone()
                    .unwrap_or_else(|| Arc::from("$(subPathExpr)")),
            }
        }
        SubjectId::Env(ci, ei) => {
            let Some(c) = pod.containers.get(ci as usize) else {
                return unknown();
            };
            let var: Arc<str> = match c.env.get(ei as usize) {
                Some(crate::model::EnvRef::Key { var, .. }) => var.clone(),
                Some(crate::model::EnvRef::From { prefix, .. }) if prefix.is_empty() => {
                    Arc::from("envFrom")
                }
                Some(crate::model::EnvRef::From { prefix, .. }) => {
                    Arc::from(format!("envFrom:{prefix}"))
                }
                None => Arc::from("?"),
            };
            Subject::Env {
                container: c.name.clone(),
                var,
            }
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
    pub removed: Vec<Arc<str>>,
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
    /// Subjects.
    pub subjects: Vec<SubjectHistory>,
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
struct SourceEntry {
    #[serde(flatten)]
    source: SourceRef,
    #[serde(flatten)]
    history: SourceHistory,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateWire {
    sources: Vec<SourceEntry>,
    pods: HashMap<Arc<str>, PodHistory>,
    nodes: HashMap<Arc<str>, NodeHistory>,
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
    fn changed_at(&self, index: &ClusterIndex, r: &SourceRef) -> Option<Timestamp> {
        match self.sources.get(r) {
            Some(h) => h.content_changed_at,
            None => index.source(r).and_then(|c| c.last_write),
        }
    }

    /// When key `key` of `r` last changed, from the per-key history; else
    /// when the object changed (one dump, or a key the history has not
    /// seen: every key is taken to have changed with the object).
    fn key_changed_at(&self, index: &ClusterIndex, r: &SourceRef, key: &str) -> Option<Timestamp> {
        match self.sources.get(r).and_then(|h| h.keys.get(key)) {
            Some(k) => k.changed_at,
            None => self.changed_at(index, r),
        }
    }
}

/// The verdict engine: configuration and the fingerprint key.
#[derive(Debug, Clone)]
pub struct Engine {
    config: Config,
    fingerprinter: Fingerprinter,
}

/// How a node's inventory can be used.
enum NodeView<'a> {
    NoInventory,
    TooOld,
    Usable(&'a ObservedNode),
}

/// A verdict before the node rule and history are applied.
struct Prelim {
    verdict: Verdict,
    /// First-sight estimate of `since`.
    estimate: Timestamp,
    /// Counts as a verifiable volume mount of only mutable sources.
    mutable_mount: bool,
}

struct PodPrelim {
    id: PodId,
    verdicts: Vec<Prelim>,
    mutable: u32,
    stale: u32,
}

/// An `Arc` compared and hashed by address: the index's interned parts are
/// shared, so equal pointers mean equal values (while the index is
/// borrowed, nothing is freed, so addresses are not reused).
struct ByPtr<T: ?Sized>(Arc<T>);

impl<T: ?Sized> PartialEq for ByPtr<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T: ?Sized> Eq for ByPtr<T> {}

impl<T: ?Sized> std::hash::Hash for ByPtr<T> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        (Arc::as_ptr(&self.0) as *const () as usize).hash(h);
    }
}

/// A volume's expected content, computed once per evaluation for every pod
/// sharing the same volume spec in the same namespace.
struct CachedVolume {
    ev: ExpectedVolume,
    triples: Vec<(Arc<str>, Digest, u16)>,
    fp: Fingerprint,
}

struct CachedSubPath {
    files: ExpectedSubPath,
    fp: Option<Fingerprint>,
}

type VolumeKey = (ByPtr<crate::model::VolumeSource>, ByPtr<str>);
type SubPathKey = (VolumeKey, ByPtr<str>);

/// Memoization for one evaluation call (the sources cannot change during
/// it): projections, subPath projections and fingerprints.
#[derive(Default)]
struct EvalCache {
    volumes: RefCell<HashMap<VolumeKey, Rc<CachedVolume>>>,
    sub_paths: RefCell<HashMap<SubPathKey, Rc<CachedSubPath>>>,
    fps: RefCell<HashMap<Digest, Fingerprint>>,
}

impl EvalCache {
    fn fp(&self, f: &Fingerprinter, d: &Digest) -> Fingerprint {
        *self
            .fps
            .borrow_mut()
            .entry(*d)
            .or_insert_with(|| f.fingerprint(d))
    }

    fn volume(
        &self,
        f: &Fingerprinter,
        index: &ClusterIndex,
        namespace: &Arc<str>,
        source: &Arc<crate::model::VolumeSource>,
    ) -> Rc<CachedVolume> {
        let key = (ByPtr(source.clone()), ByPtr(namespace.clone()));
        if let Some(c) = self.volumes.borrow().get(&key) {
            return c.clone();
        }
        let ev = project_volume(namespace, source, |r| index.source(r));
        let triples = ev
            .files
            .iter()
            .map(|f| (f.path.clone(), f.digest, f.source))
            .collect();
        let fp = self.fp(f, &ev.digest());
        let c = Rc::new(CachedVolume { ev, triples, fp });
        self.volumes.borrow_mut().insert(key, c.clone());
        c
    }

    fn sub_path(
        &self,
        f: &Fingerprinter,
        namespace: &Arc<str>,
        source: &Arc<crate::model::VolumeSource>,
        cv: &CachedVolume,
        sub_path: &Arc<str>,
    ) -> Rc<CachedSubPath> {
        let key = (
            (ByPtr(source.clone()), ByPtr(namespace.clone())),
            ByPtr(sub_path.clone()),
        );
        if let Some(c) = self.sub_paths.borrow().get(&key) {
            return c.clone();
        }
        let files = project_sub_path(&cv.ev, sub_path);
        let fp = match &files {
            ExpectedSubPath::Files(files) => {
                Some(self.fp(f, &volume_digest(files.iter().map(|(p, d, _)| (&**p, d)))))
            }
            ExpectedSubPath::Skipped(_) => None,
        };
        let c = Rc::new(CachedSubPath { files, fp });
        self.sub_paths.borrow_mut().insert(key, c.clone());
        c
    }
}

fn fp_opt(f: &Fingerprinter, d: Option<&Digest>) -> Option<Fingerprint> {
    d.map(|d| f.fingerprint(d))
}

impl Engine {
    /// An engine with `config` and the installation's fingerprinter.
    pub fn new(config: Config, fingerprinter: Fingerprinter) -> Self {
        Self {
            config,
            fingerprinter,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The fingerprinter.
    pub fn fingerprinter(&self) -> &Fingerprinter {
        &self.fingerprinter
    }

    /// Records the current content of `r` in the history: a changed (or
    /// vanished, or reappeared) content sets `content_changed_at = now`; a
    /// source seen for the first time takes its last write time.
    pub fn observe_source(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        r: &SourceRef,
        now: Timestamp,
    ) {
        let content = index.source(r);
        let fp = content.map(|c| {
            self.fingerprinter
                .fingerprint(&c.content_digest)
                .to_string()
        });
        let key_fps = |c: &crate::model::SourceContent| -> Vec<(Arc<str>, String)> {
            c.keys
                .iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        self.fingerprinter.fingerprint(&v.digest).to_string(),
                    )
                })
                .collect()
        };
        match state.sources.get_mut(r) {
            Some(h) => {
                if h.fingerprint != fp {
                    h.fingerprint = fp;
                    h.content_changed_at = Some(now);
                    // Only the keys whose value changed (or that appeared)
                    // take `now`; vanished keys are forgotten.
                    let mut keys = BTreeMap::new();
                    for (k, kfp) in content.map(key_fps).unwrap_or_default() {
                        let changed_at = match h.keys.get(&k) {
                            Some(old) if old.fingerprint == kfp => old.changed_at,
                            _ => Some(now),
                        };
                        keys.insert(
                            k,
                            KeyHistory {
                                fingerprint: kfp,
                                changed_at,
                            },
                        );
                    }
                    h.keys = keys;
                }
            }
            None => {
                if let Some(c) = content {
                    let first = c.last_write.map(|t| t.min(now));
                    state.sources.insert(
                        r.clone(),
                        SourceHistory {
                            fingerprint: fp,
                            content_changed_at: first,
                            keys: key_fps(c)
                                .into_iter()
                                .map(|(k, fingerprint)| {
                                    (
                                        k,
                                        KeyHistory {
                                            fingerprint,
                                            changed_at: first,
                                        },
                                    )
                                })
                                .collect(),
                        },
                    );
                }
            }
        }
    }

    /// Evaluates every pod in the index, rebuilding the per-node counters
    /// and dropping history of pods and sources that are gone.
    pub fn evaluate_all(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        now: Timestamp,
    ) -> Evaluation {
        self.observe_all_sources(index, state, now);
        let mut out = Evaluation::default();
        self.evaluate_nodes(index, state, now, |p| out.pods.push(p));
        out
    }

    /// Like [`Engine::evaluate_all`], but hands each pod's verdicts to
    /// `sink` as soon as its node is done instead of collecting them, so a
    /// caller that keeps only what it needs (counts, non-Fresh verdicts)
    /// never holds every verdict at once.
    pub fn evaluate_all_each<F>(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        now: Timestamp,
        sink: F,
    ) where
        F: FnMut(PodVerdicts),
    {
        self.observe_all_sources(index, state, now);
        self.evaluate_nodes(index, state, now, sink);
    }

    fn observe_all_sources(&self, index: &ClusterIndex, state: &mut EngineState, now: Timestamp) {
        // Source history: every present source, and absent ones still
        // referenced; forget absent, unreferenced ones.
        let present: Vec<SourceRef> = index.sources().map(|(r, _)| r.clone()).collect();
        for r in &present {
            self.observe_source(index, state, r, now);
        }
        let known: Vec<SourceRef> = state.sources.keys().cloned().collect();
        for r in known {
            if index.source(&r).is_none() {
                if index.pods_referencing(&r).is_empty() {
                    state.sources.remove(&r);
                } else {
                    self.observe_source(index, state, &r, now);
                }
            }
        }
    }

    /// Evaluates node by node (the node rule needs only the node's pods),
    /// rebuilding pod history and node counters from scratch.
    fn evaluate_nodes<F>(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        now: Timestamp,
        mut sink: F,
    ) where
        F: FnMut(PodVerdicts),
    {
        let cache = EvalCache::default();
        let mut old_pods = std::mem::take(&mut state.pods);
        state.pods.reserve(index.pod_count());
        state.nodes.clear();
        let mut nodes: Vec<&Arc<str>> = index.nodes_with_pods().collect();
        nodes.sort();
        for node in nodes {
            let prelims: Vec<PodPrelim> = index
                .pods_on_node(node)
                .iter()
                .filter_map(|id| {
                    let prev = index.pod(*id).and_then(|p| old_pods.get(&p.uid));
                    self.prelim_pod(index, state, *id, now, prev, &cache)
                })
                .collect();
            let mut n = NodeHistory::default();
            for p in &prelims {
                n.mutable_mounts += p.mutable;
                n.stale_mutable_mounts += p.stale;
            }
            n.not_syncing = self.not_syncing(&n);
            state.nodes.insert(node.clone(), n);
            for p in prelims {
                let pod = index.pod(p.id).expect("prelim pods exist in the index");
                let prev = old_pods.remove(&pod.uid);
                sink(self.finalize(pod, p, prev, state, now));
            }
        }
    }

    /// Re-evaluates only the pods with these UIDs (plus, when a node's
    /// KubeletNotSyncing verdict flips, every pod on that node). UIDs no
    /// longer in the index have their history dropped and are listed in
    /// [`Evaluation::removed`]. Sources referenced by the evaluated pods are
    /// observed first.
    pub fn evaluate_pods(
        &self,
        index: &ClusterIndex,
        state: &mut EngineState,
        uids: &[&str],
        now: Timestamp,
    ) -> Evaluation {
        let mut out = Evaluation::default();
        let mut queue: Vec<PodId> = Vec::new();
        let mut seen: HashSet<PodId> = HashSet::new();
        let mut touched_nodes: HashSet<Arc<str>> = HashSet::new();
        for uid in uids {
            match index.pod_id(uid) {
                Some(id) => {
                    if seen.insert(id) {
                        queue.push(id);
                    }
                }
                None => {
                    if let Some((k, h)) = state.pods.remove_entry(*uid) {
                        if let Some(node) = &h.node {
                            self.sub_counts(state, node, &h);
                            touched_nodes.insert(node.clone());
                        }
                        out.removed.push(k);
                    }
                }
            }
        }
        let mut observed: HashSet<SourceRef> = HashSet::new();
        for id in &queue {
            if let Some(pod) = index.pod(*id) {
                for r in pod.references() {
                    if !observed.contains(&r) {
                        self.observe_source(index, state, &r, now);
                        observed.insert(r);
                    }
                }
            }
        }

        let cache = EvalCache::default();
        let mut prelims: Vec<PodPrelim> = Vec::with_capacity(queue.len());
        let mut i = 0;
        loop {
            while i < queue.len() {
                let id = queue[i];
                i += 1;
                let prev = index.pod(id).and_then(|p| state.pods.get(&p.uid));
                let Some(p) = self.prelim_pod(index, state, id, now, prev, &cache) else {
                    continue;
                };
                let pod = index.pod(id).expect("queued pods exist");
                if let Some(h) = state.pods.get(&pod.uid).cloned()
                    && let Some(node) = &h.node
                {
                    self.sub_counts(state, node, &h);
                    touched_nodes.insert(node.clone());
                }
                if let Some(node) = &pod.node {
                    let n = state.nodes.entry(node.clone()).or_default();
                    n.mutable_mounts += p.mutable;
                    n.stale_mutable_mounts += p.stale;
                    touched_nodes.insert(node.clone());
                }
                // Record the counts now so a second pass over the same pod
                // (node flip) subtracts exactly what was added.
                let h = state
                    .pods
                    .entry(pod.uid.clone())
                    .or_insert_with(|| PodHistory {
                        node: None,
                        mutable_mounts: 0,
                        stale_mutable_mounts: 0,
                        subjects: Vec::new(),
                    });
                h.node = pod.node.clone();
                h.mutable_mounts = p.mutable;
                h.stale_mutable_mounts = p.stale;
                prelims.push(p);
            }
            // Node rule flips pull in the node's other pods.
            let mut flipped = false;
            for node in touched_nodes.drain() {
                let Some(n) = state.nodes.get_mut(&node) else {
                    continue;
                };
                let now_flag = self.not_syncing(n);
                if now_flag != n.not_syncing {
                    n.not_syncing = now_flag;
                    for id in index.pods_on_node(&node) {
                        if seen.insert(*id) {
                            queue.push(*id);
                            flipped = true;
                        }
                    }
                }
            }
            if !flipped {
                break;
            }
        }

        for p in prelims {
            let pod = index.pod(p.id).expect("prelim pods exist");
            let prev = state.pods.remove(&pod.uid);
            out.pods.push(self.finalize(pod, p, prev, state, now));
        }
        out
    }

    fn sub_counts(&self, state: &mut EngineState, node: &Arc<str>, h: &PodHistory) {
        if let Some(n) = state.nodes.get_mut(node) {
            n.mutable_mounts = n.mutable_mounts.saturating_sub(h.mutable_mounts);
            n.stale_mutable_mounts = n
                .stale_mutable_mounts
                .saturating_sub(h.stale_mutable_mounts);
        }
    }

    /// The KubeletNotSyncing rule: at least `not_syncing_min_mounts`
    /// verifiable mutable volume mounts on the node, and more than half of
    /// them stale past grace.
    fn not_syncing(&self, n: &NodeHistory) -> bool {
        n.mutable_mounts >= self.config.not_syncing_min_mounts
            && n.stale_mutable_mounts * 2 > n.mutable_mounts
    }

    fn node_view<'a>(&self, index: &'a ClusterIndex, node: &str, now: Timestamp) -> NodeView<'a> {
        match index.inventory(node) {
            None => NodeView::NoInventory,
            Some(n) if now.duration_since(n.scanned_at) > self.config.inventory_max_age => {
                NodeView::TooOld
            }
            Some(n) => NodeView::Usable(n),
        }
    }

    fn finalize(
        &self,
        pod: &Arc<PodModel>,
        p: PodPrelim,
        prev: Option<PodHistory>,
        state: &mut EngineState,
        now: Timestamp,
    ) -> PodVerdicts {
        let not_syncing = pod
            .node
            .as_ref()
            .and_then(|n| state.nodes.get(n))
            .is_some_and(|n| n.not_syncing);
        let mut subjects = Vec::with_capacity(p.verdicts.len());
        let mut verdicts = Vec::with_capacity(p.verdicts.len());
        for pre in p.verdicts {
            let mut v = pre.verdict;
            if not_syncing && pre.mutable_mount && v.state == State::Stale(StaleCause::Unknown) {
                v.state = State::Stale(StaleCause::KubeletNotSyncing);
            }
            let tag = v.state;
            let since = prev
                .as_ref()
                .and_then(|h| h.subjects.iter().find(|s| s.id == v.id))
                .filter(|s| s.state == tag)
                .map(|s| s.since)
                .unwrap_or(pre.estimate.min(now));
            v.since = since;
            subjects.push(SubjectHistory {
                id: v.id,
                state: tag,
                since,
            });
            verdicts.push(v);
        }
        state.pods.insert(
            pod.uid.clone(),
            PodHistory {
                node: pod.node.clone(),
                mutable_mounts: p.mutable,
                stale_mutable_mounts: p.stale,
                subjects,
            },
        );
        PodVerdicts {
            pod: pod.clone(),
            verdicts,
        }
    }

    /// Verdicts of one pod before the node rule; `None` for pods that are
    /// not scheduled or have terminated.
    fn prelim_pod(
        &self,
        index: &ClusterIndex,
        state: &EngineState,
        id: PodId,
        now: Timestamp,
        prev: Option<&PodHistory>,
        cache: &EvalCache,
    ) -> Option<PodPrelim> {
        let pod = index.pod(id)?;
        let node = pod.node.as_ref()?;
        if pod.terminated {
            return None;
        }
        if pod.terminating {
            return Some(terminating_pod(id, pod, now));
        }
        let view = self.node_view(index, node, now);
        let observed_pod = match &view {
            NodeView::Usable(n) => n.pods.get(&pod.uid),
            _ => None,
        };
        let prev_since = |sid: SubjectId| -> Option<(bool, Timestamp)> {
            prev.and_then(|h| h.subjects.iter().find(|s| s.id == sid))
                .map(|s| {
                    (
                        matches!(s.state, State::Propagating | State::Stale(_)),
                        s.since,
                    )
                })
        };
        let ctx = Ctx {
            engine: self,
            index,
            state,
            pod,
            node,
            now,
            cache,
        };

        let mut out = PodPrelim {
            id,
            verdicts: Vec::new(),
            mutable: 0,
            stale: 0,
        };
        let expected: Vec<Rc<CachedVolume>> = pod
            .volumes
            .iter()
            .map(|v| cache.volume(&self.fingerprinter, index, &pod.namespace, &v.source))
            .collect();

        for (vi, (vol, cv)) in pod.volumes.iter().zip(&expected).enumerate() {
            let ev = &cv.ev;
            let sid = SubjectId::Volume(vi as u16);
            let mut pre = ctx.volume_verdict(sid, vol, cv, &view, observed_pod, prev_since(sid));
            let all_mutable = !ev.sources.is_empty()
                && ev
                    .sources
                    .iter()
                    .all(|r| index.source(r).is_some_and(|c| !c.immutable));
            pre.mutable_mount = all_mutable
                && matches!(
                    pre.verdict.state,
                    State::Fresh
                        | State::Propagating
                        | State::Stale(_)
                        | State::Frozen(FrozenCause::ReadAtStart)
                );
            if pre.mutable_mount {
                out.mutable += 1;
                if pre.verdict.state == State::Stale(StaleCause::Unknown) {
                    out.stale += 1;
                }
            }
            out.verdicts.push(pre);
        }

        for (ci, c) in pod.containers.iter().enumerate() {
            for (mi, m) in c.mounts.iter().enumerate() {
                let Some(sp) = &m.sub_path else {
                    if !m.sub_path_expr {
                        continue;
                    }
                    out.verdicts.push(ctx.simple(
                        SubjectId::SubPath(ci as u16, mi as u16),
                        State::Skipped(SkipReason::SubPathExpr),
                        None,
                    ));
                    continue;
                };
                let sid = SubjectId::SubPath(ci as u16, mi as u16);
                // Volume verdicts come first, in volume order.
                let volume_state = out.verdicts[m.volume as usize].verdict.state;
                out.verdicts.push(ctx.sub_path_verdict(
                    sid,
                    c,
                    m,
                    sp,
                    &expected[m.volume as usize],
                    volume_state,
                    &view,
                    observed_pod,
                    prev_since(sid),
                ));
            }
            for (ei, e) in c.env.iter().enumerate() {
                let sid = SubjectId::Env(ci as u16, ei as u16);
                out.verdicts.push(ctx.env_verdict(sid, c, e));
            }
        }
        Some(out)
    }
}

struct Ctx<'a> {
    engine: &'a Engine,
    index: &'a ClusterIndex,
    state: &'a EngineState,
    pod: &'a PodModel,
    node: &'a Arc<str>,
    now: Timestamp,
    cache: &'a EvalCache,
}

/// Result of comparing expected and observed files.
struct Comparison {
    differing: Vec<Arc<str>>,
    files: Vec<FileVerdict>,
    unreadable: Vec<Arc<str>>,
    /// Sources (indexes into the volume's sources) involved in differences.
    involved: Vec<u16>,
    involved_all: bool,
    /// Digest of the compared observed files; `None` when they equal the
    /// expected ones.
    observed_digest: Option<Digest>,
}

impl Ctx<'_> {
    fn fp(&self, d: &Digest) -> Fingerprint {
        self.cache.fp(&self.engine.fingerprinter, d)
    }

    fn simple(&self, id: SubjectId, state: State, message: Option<String>) -> Prelim {
        Prelim {
            verdict: Verdict {
                id,
                state,
                expected: None,
                observed: None,
                since: self.now,
                detail: message.map(|m| {
                    Box::new(VerdictDetail {
                        message: Some(m),
                        ..Default::default()
                    })
                }),
            },
            estimate: self.now,
            mutable_mount: false,
        }
    }

    /// Compares expected files (path, digest, source) with observed ones.
    /// `skip` says whether an observed path is exempt.
    fn compare(
        &self,
        expected: &[(Arc<str>, Digest, u16)],
        observed: &[(Arc<str>, Digest)],
        errors: &[ObservedError],
        skip: &dyn Fn(&str) -> Option<SkipReason>,
        ignore_unknown: bool,
        list_files: bool,
    ) -> Comparison {
        let mut c = Comparison {
            differing: Vec::new(),
            files: Vec::new(),
            unreadable: Vec::new(),
            involved: Vec::new(),
            involved_all: false,
            observed_digest: None,
        };
        let err_at = |p: &str| errors.iter().any(|e| *e.path == *p);
        // A volume-level error (empty path) or an error on a path we do not
        // skip makes the comparison unreliable.
        for e in errors {
            if e.path.is_empty() || skip(&e.path).is_none() {
                c.unreadable.push(e.path.clone());
            }
        }
        let mut obs_kept: Vec<(&str, &Digest)> = Vec::with_capacity(observed.len());
        let (mut i, mut j) = (0, 0);
        while i < expected.len() || j < observed.len() {
            let e = expected.get(i);
            let o = observed.get(j);
            let ord = match (e, o) {
                (Some(e), Some(o)) => (*e.0).cmp(&*o.0),
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, _) => std::cmp::Ordering::Greater,
            };
            match ord {
                std::cmp::Ordering::Equal => {
                    let (e, o) = (e.unwrap(), o.unwrap());
                    obs_kept.push((&o.0, &o.1));
                    let same = e.1 == o.1;
                    if !same {
                        c.differing.push(e.0.clone());
                        c.involved.push(e.2);
                    }
                    if list_files || !same {
                        c.files.push(FileVerdict {
                            path: e.0.clone(),
                            state: if same {
                                FileState::Fresh
                            } else {
                                FileState::Differs
                            },
                            expected: Some(self.fp(&e.1)),
                            observed: Some(self.fp(&o.1)),
                        });
                    }
                    i += 1;
                    j += 1;
                }
                std::cmp::Ordering::Less => {
                    let e = e.unwrap();
                    let unreadable = err_at(&e.0);
                    if !unreadable {
                        c.differing.push(e.0.clone());
                        c.involved.push(e.2);
                    }
                    c.files.push(FileVerdict {
                        path: e.0.clone(),
                        state: if unreadable {
                            FileState::Unreadable
                        } else {
                            FileState::Missing
                        },
                        expected: Some(self.fp(&e.1)),
                        observed: None,
                    });
                    i += 1;
                }
                std::cmp::Ordering::Greater => {
                    let o = o.unwrap();
                    if let Some(_reason) = skip(&o.0) {
                        if list_files {
                            c.files.push(FileVerdict {
                                path: o.0.clone(),
                                state: FileState::Skipped,
                                expected: None,
                                observed: None,
                            });
                        }
                    } else if !ignore_unknown {
                        obs_kept.push((&o.0, &o.1));
                        c.differing.push(o.0.clone());
                        c.involved_all = true;
                        c.files.push(FileVerdict {
                            path: o.0.clone(),
                            state: FileState::Unexpected,
                            expected: None,
                            observed: Some(self.fp(&o.1)),
                        });
                    }
                    j += 1;
                }
            }
        }
        // Without differences the compared observed files are exactly the
        // expected ones: no need to hash them again.
        if !c.differing.is_empty() || !c.unreadable.is_empty() {
            c.observed_digest = Some(volume_digest(obs_kept));
        }
        c
    }

    /// Classifies a mismatch. `observed_at` is when the node was scanned;
    /// `prev` is (previous state was a mismatch, since).
    fn classify_mismatch(
        &self,
        involved: &[SourceRef],
        observed_at: Timestamp,
        prev: Option<(bool, Timestamp)>,
    ) -> (State, Timestamp, Vec<Arc<str>>) {
        let mut changed_at: Option<Timestamp> = None;
        let mut unknown = involved.is_empty();
        for r in involved {
            match self.state.changed_at(self.index, r) {
                Some(t) => changed_at = Some(changed_at.map_or(t, |c| c.max(t))),
                None => unknown = true,
            }
        }
        let grace = self.engine.config.grace;
        let start = if unknown {
            // No idea when the source changed: the mismatch must persist for
            // the grace period under our own observation.
            match prev {
                Some((true, since)) => since,
                _ => self.now,
            }
        } else {
            changed_at.expect("known when not unknown")
        };
        let reference = if unknown { self.now } else { observed_at };
        if reference.duration_since(start) < grace {
            return (State::Propagating, start, Vec::new());
        }
        let immutable: Vec<&SourceRef> = involved
            .iter()
            .filter(|r| self.index.source(r).is_some_and(|c| c.immutable))
            .collect();
        if !immutable.is_empty() {
            let pinned = self.pinning_pods(&immutable);
            if pinned.is_empty() {
                return (State::Stale(StaleCause::ImmutableCache), start, pinned);
            }
            return (
                State::Stale(StaleCause::ImmutableCachePinned),
                start,
                pinned,
            );
        }
        (State::Stale(StaleCause::Unknown), start, Vec::new())
    }

    /// The other pods on this node that keep the kubelet's cache entry of
    /// one of `sources` alive ([`PodModel::pins`]): while one does, a
    /// replacement of this pod is served the same cached copy
    /// (`pkg/kubelet/util/manager/watch_based_manager.go`: one item per
    /// namespace/name, dropped only when no registered pod references it).
    /// Names, sorted.
    fn pinning_pods(&self, sources: &[&SourceRef]) -> Vec<Arc<str>> {
        let mut pinned: Vec<Arc<str>> = self
            .index
            .pods_on_node(self.node)
            .iter()
            .filter_map(|id| self.index.pod(*id))
            .filter(|other| other.uid != self.pod.uid && sources.iter().any(|r| other.pins(r)))
            .map(|other| other.name.clone())
            .collect();
        pinned.sort();
        pinned.dedup();
        pinned
    }

    /// Whether the kubelet's cache entry of immutable `r` on this node holds
    /// the content from before its change at `changed`: a pod registered
    /// before the change (this one included) still holds the entry, so it
    /// was never dropped and, immutable, never refreshed
    /// (`watch_based_manager.go`: `Get` stops the item's reflector for an
    /// immutable object and `restartReflectorIfNeeded` never restarts it).
    /// A kubelet restart empties the cache; the engine cannot see one, so
    /// this can be conservative after one (a volume shows the truth).
    fn cache_predates(&self, r: &SourceRef, changed: Timestamp) -> bool {
        self.index
            .pods_on_node(self.node)
            .iter()
            .filter_map(|id| self.index.pod(*id))
            .any(|p| p.pins(r) && p.synced_at.is_some_and(|t| t < changed))
    }

    fn unverifiable_for(&self, view: &NodeView<'_>) -> Option<State> {
        match view {
            NodeView::NoInventory => Some(State::Unverifiable(UnverifiableReason::NoInventory)),
            NodeView::TooOld => Some(State::Unverifiable(UnverifiableReason::InventoryTooOld)),
            NodeView::Usable(_) => None,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn volume_verdict(
        &self,
        id: SubjectId,
        vol: &crate::model::VolumeModel,
        cv: &CachedVolume,
        view: &NodeView<'_>,
        observed_pod: Option<&crate::model::ObservedPod>,
        prev: Option<(bool, Timestamp)>,
    ) -> Prelim {
        let ev = &cv.ev;
        if ev.is_unverifiable() {
            let reason = ev
                .skipped
                .first()
                .map_or(SkipReason::UnknownSource, |(_, r)| *r);
            return self.simple(id, State::Skipped(reason), None);
        }
        if !ev.missing.is_empty() {
            let msg = ev
                .missing
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            return self.simple(id, State::SourceMissing,
                Some(format!(
                    "{msg}: the kubelet refuses to set up this volume (a running pod keeps its old content, a new pod does not start)"
                )),
            );
        }
        let expected_fp = Some(cv.fp);
        if let Some(state) = self.unverifiable_for(view) {
            let mut p = self.simple(id, state, None);
            p.verdict.expected = expected_fp;
            return p;
        }
        let NodeView::Usable(node) = view else {
            unreachable!("handled above")
        };
        let plugin = vol.source.plugin();
        let pod_errors =
            relevant_pod_errors(observed_pod, &[VOLUMES_DIR, plugin.dir_name(), &vol.name]);
        let Some(ov) = observed_pod.and_then(|p| p.volume(plugin, &vol.name)) else {
            let (state, msg) = if pod_errors.is_empty() {
                (State::Unverifiable(UnverifiableReason::NotOnDisk), None)
            } else {
                (
                    State::Unverifiable(UnverifiableReason::ReadError),
                    Some(format!(
                        "the agent could not read {}",
                        pod_errors.join(", ")
                    )),
                )
            };
            let mut p = self.simple(id, state, msg);
            p.verdict.expected = expected_fp;
            return p;
        };
        let mut cmp = self.compare(
            &cv.triples,
            &ov.files,
            &ov.errors,
            &|p| ev.skip_reason(p),
            ev.unknown_paths,
            self.engine.config.list_fresh_files,
        );
        for e in pod_errors {
            cmp.unreadable.push(Arc::from(e));
        }
        let mut detail = VerdictDetail {
            differing_paths: Vec::new(),
            files: std::mem::take(&mut cmp.files),
            ..Default::default()
        };
        let observed_fp = match &cmp.observed_digest {
            Some(d) => Some(self.fp(d)),
            None => expected_fp,
        };
        let mk = |state: State, estimate: Timestamp, detail: VerdictDetail| {
            let empty = detail == VerdictDetail::default();
            Prelim {
                verdict: Verdict {
                    id,
                    state,
                    expected: expected_fp,
                    observed: observed_fp,
                    since: self.now,
                    detail: (!empty).then(|| Box::new(detail)),
                },
                estimate,
                mutable_mount: false,
            }
        };
        if !cmp.unreadable.is_empty() {
            detail.message = Some(format!(
                "the agent could not read {}",
                cmp.unreadable
                    .iter()
                    .map(|p| if p.is_empty() {
                        "the volume".to_string()
                    } else {
                        format!("{p:?}")
                    })
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
            return mk(
                State::Unverifiable(UnverifiableReason::ReadError),
                self.now,
                detail,
            );
        }
        let written_at = ov.written_at.unwrap_or(node.scanned_at);
        if cmp.differing.is_empty() {
            if vol.read_at_start {
                let mut late: Vec<Arc<str>> = self
                    .pod
                    .containers
                    .iter()
                    .filter(|c| {
                        c.mounts.iter().any(|m| {
                            pod_volume_index(self.pod, &vol.name) == Some(m.volume)
                                && m.sub_path.is_none()
                        })
                    })
                    .filter(|c| {
                        c.started_at.is_some_and(|s| {
                            // startedAt has second precision: only a write at
                            // least one second after it is certainly later.
                            written_at >= s + SignedDuration::from_secs(1)
                        })
                    })
                    .map(|c| c.name.clone())
                    .collect();
                if !late.is_empty() {
                    late.sort();
                    let advice = self.refresh_advice(&late);
                    detail.message = Some(format!(
                        "the volume was refreshed at {written_at} after container(s) {} started, and the pod declares it is read only at start: {advice}",
                        late.iter().map(|s| &**s).collect::<Vec<_>>().join(", ")
                    ));
                    detail.containers = late;
                    return mk(State::Frozen(FrozenCause::ReadAtStart), written_at, detail);
                }
            }
            return mk(State::Fresh, written_at, detail);
        }
        let involved: Vec<SourceRef> = if cmp.involved_all {
            ev.sources.clone()
        } else {
            let mut idx = cmp.involved.clone();
            idx.sort_unstable();
            idx.dedup();
            idx.iter()
                .map(|i| ev.sources[*i as usize].clone())
                .collect()
        };
        let (state, start, pinned) = self.classify_mismatch(&involved, node.scanned_at, prev);
        detail.differing_paths = cmp.differing;
        detail.pinned_by = pinned;
        if state == State::Stale(StaleCause::ImmutableCachePinned) {
            detail.message = Some(format!(
                "immutable source recreated with new content; pods {} on this node keep the kubelet's cache entry alive, replacing this pod alone cannot help",
                detail
                    .pinned_by
                    .iter()
                    .map(|s| &**s)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        mk(state, start, detail)
    }

    /// What refreshes the content these containers read: a restart, unless
    /// one of them is an init container that never runs again.
    fn refresh_advice(&self, containers: &[Arc<str>]) -> String {
        let finished = self
            .pod
            .containers
            .iter()
            .find(|c| c.finished && containers.contains(&c.name));
        match finished {
            Some(c) => c.refresh_advice(),
            None => format!(
                "restart container(s) {}",
                containers
                    .iter()
                    .map(|s| &**s)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn sub_path_verdict(
        &self,
        id: SubjectId,
        c: &crate::model::ContainerModel,
        m: &crate::model::MountModel,
        sp: &Arc<str>,
        cv: &CachedVolume,
        volume_state: State,
        view: &NodeView<'_>,
        observed_pod: Option<&crate::model::ObservedPod>,
        prev: Option<(bool, Timestamp)>,
    ) -> Prelim {
        let vol = &self.pod.volumes[m.volume as usize];
        let ev = &cv.ev;
        if ev.is_unverifiable() {
            let reason = ev
                .skipped
                .first()
                .map_or(SkipReason::UnknownSource, |(_, r)| *r);
            return self.simple(id, State::Skipped(reason), None);
        }
        if !ev.missing.is_empty() {
            let msg = ev
                .missing
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            return self.simple(id, State::SourceMissing, Some(msg));
        }
        let csp = self.cache.sub_path(
            &self.engine.fingerprinter,
            &self.pod.namespace,
            &vol.source,
            cv,
            sp,
        );
        let files = match &csp.files {
            ExpectedSubPath::Skipped(r) => {
                return self.simple(id, State::Skipped(*r), None);
            }
            ExpectedSubPath::Files(f) => f,
        };
        let expected_fp = csp.fp;
        let with_fp = |mut p: Prelim| {
            p.verdict.expected = expected_fp;
            p
        };
        if let Some(state) = self.unverifiable_for(view) {
            return with_fp(self.simple(id, state, None));
        }
        let NodeView::Usable(node) = view else {
            unreachable!("handled above")
        };
        let Some(started_at) = c.started_at else {
            return with_fp(self.simple(
                id,
                State::Unverifiable(UnverifiableReason::ContainerNotRunning),
                None,
            ));
        };
        let index = m.index.to_string();
        let pod_errors =
            relevant_pod_errors(observed_pod, &[SUBPATHS_DIR, &vol.name, &c.name, &index]);
        let Some(os) = observed_pod.and_then(|p| p.sub_path(&vol.name, &c.name, m.index)) else {
            let (state, msg) = if pod_errors.is_empty() {
                (State::Unverifiable(UnverifiableReason::NotOnDisk), None)
            } else {
                (
                    State::Unverifiable(UnverifiableReason::ReadError),
                    Some(format!(
                        "the agent could not read {}",
                        pod_errors.join(", ")
                    )),
                )
            };
            return with_fp(self.simple(id, state, msg));
        };
        let mut cmp = self.compare(
            files,
            &os.files,
            &os.errors,
            &|rel| sub_path_skip(ev, sp, rel),
            ev.unknown_paths,
            self.engine.config.list_fresh_files,
        );
        for e in pod_errors {
            cmp.unreadable.push(Arc::from(e));
        }
        let observed_fp = match &cmp.observed_digest {
            Some(d) => Some(self.fp(d)),
            None => expected_fp,
        };
        let mut detail = VerdictDetail {
            files: cmp.files,
            ..Default::default()
        };
        let mk = |state: State, estimate: Timestamp, detail: VerdictDetail| {
            let empty = detail == VerdictDetail::default();
            Prelim {
                verdict: Verdict {
                    id,
                    state,
                    expected: expected_fp,
                    observed: observed_fp,
                    since: self.now,
                    detail: (!empty).then(|| Box::new(detail)),
                },
                estimate,
                mutable_mount: false,
            }
        };
        if !cmp.unreadable.is_empty() {
            detail.message = Some("the agent could not read the subPath target".to_string());
            return mk(
                State::Unverifiable(UnverifiableReason::ReadError),
                self.now,
                detail,
            );
        }
        if cmp.differing.is_empty() {
            return mk(State::Fresh, started_at, detail);
        }
        let involved: Vec<SourceRef> = if cmp.involved_all {
            ev.sources.clone()
        } else {
            let mut idx = cmp.involved.clone();
            idx.sort_unstable();
            idx.dedup();
            idx.iter()
                .map(|i| ev.sources[*i as usize].clone())
                .collect()
        };
        detail.differing_paths = cmp.differing;
        let changed_at = involved
            .iter()
            .map(|r| self.state.changed_at(self.index, r))
            .try_fold(None::<Timestamp>, |acc, t| {
                t.map(|t| Some(acc.map_or(t, |a| a.max(t))))
            })
            .flatten();
        // A restart binds the subPath again from the volume: it helps only
        // when the volume itself is current.
        let volume_behind = matches!(volume_state, State::Stale(_) | State::Propagating);
        match changed_at {
            // The content was current before the container started, yet the
            // bind shows something else: the volume itself was stale at
            // start; classify like a volume mismatch. The same when the
            // volume is behind now: a restart would bind the same old
            // content.
            Some(t) if t <= started_at || volume_behind => {
                let (state, start, pinned) =
                    self.classify_mismatch(&involved, node.scanned_at, prev);
                detail.pinned_by = pinned;
                mk(state, start, detail)
            }
            _ => {
                detail.message = Some(format!(
                    "subPath mounts never update; container {} started at {started_at}, before the current content: {}",
                    c.name,
                    c.refresh_advice()
                ));
                mk(
                    State::Frozen(FrozenCause::SubPath),
                    changed_at.unwrap_or(self.now),
                    detail,
                )
            }
        }
    }

    /// Env is filled from the same kubelet cache entry as volumes
    /// (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables` reads
    /// through `secretManager.GetSecret` / `configMapManager.GetConfigMap`)
    /// and fixed when the container starts.
    fn env_verdict(
        &self,
        id: SubjectId,
        c: &crate::model::ContainerModel,
        e: &crate::model::EnvRef,
    ) -> Prelim {
        let ee = project_env(&self.pod.namespace, e, |r| self.index.source(r));
        let expected = fp_opt(&self.engine.fingerprinter, ee.digest.as_ref());
        let mut p = if let Some(m) = &ee.missing {
            self.simple(
                id,
                State::SourceMissing,
                Some(format!("{m}: the kubelet refuses to start the container")),
            )
        } else if let Some(started_at) = c.started_at {
            // A `valueFrom` key changes only when that key does; `envFrom`
            // with the object.
            let changed_at = match e {
                crate::model::EnvRef::Key { key, .. } => {
                    self.state.key_changed_at(self.index, &ee.source, key)
                }
                crate::model::EnvRef::From { .. } => self.state.changed_at(self.index, &ee.source),
            };
            let immutable = self.index.source(&ee.source).is_some_and(|s| s.immutable);
            match changed_at {
                Some(t) if immutable && self.cache_predates(&ee.source, t) => {
                    self.env_from_old_cache(id, c, &ee.source, t, started_at)
                }
                Some(t) if t > started_at => {
                    let mut p = self.simple(id, State::Frozen(FrozenCause::Env),
                        Some(format!(
                            "environment is fixed at start; {} changed at {t}, after container {} started at {started_at}: {}",
                            ee.source, c.name, c.refresh_advice()
                        )),
                    );
                    p.estimate = t;
                    p
                }
                _ => {
                    let mut p = self.simple(id, State::Fresh, None);
                    p.estimate = started_at;
                    p
                }
            }
        } else {
            self.simple(
                id,
                State::Unverifiable(UnverifiableReason::ContainerNotRunning),
                None,
            )
        };
        p.verdict.expected = expected;
        p
    }

    /// An env reference to an immutable object changed at `changed` while
    /// the node's cache entry kept the old object: the container got (or,
    /// restarted, gets again) the old values. Like a volume mismatch:
    /// Propagating within grace, then Stale, pinned when other pods hold
    /// the entry.
    fn env_from_old_cache(
        &self,
        id: SubjectId,
        c: &crate::model::ContainerModel,
        source: &SourceRef,
        changed: Timestamp,
        started_at: Timestamp,
    ) -> Prelim {
        let since = changed.max(started_at);
        if self.now.duration_since(changed) < self.engine.config.grace {
            let mut p = self.simple(id, State::Propagating, None);
            p.estimate = changed;
            return p;
        }
        let pinned = self.pinning_pods(&[source]);
        let (state, message) = if pinned.is_empty() {
            (
                State::Stale(StaleCause::ImmutableCache),
                format!(
                    "container {} got its environment from the kubelet's cached copy of immutable {source}, older than its recreation at {changed}; a container restart gets the same values: replace the pod",
                    c.name
                ),
            )
        } else {
            (
                State::Stale(StaleCause::ImmutableCachePinned),
                format!(
                    "container {} got its environment from the kubelet's cached copy of immutable {source}, older than its recreation at {changed}; pods {} on this node keep that cache entry alive, so neither a restart nor replacing this pod alone can help",
                    c.name,
                    pinned.iter().map(|s| &**s).collect::<Vec<_>>().join(", ")
                ),
            )
        };
        let mut p = self.simple(id, state, Some(message));
        if let Some(d) = p.verdict.detail.as_deref_mut() {
            d.pinned_by = pinned;
        }
        p.estimate = since;
        p
    }
}

/// Every subject of a terminating pod, Skipped: the kubelet no longer
/// refreshes it (see [`SkipReason::PodTerminating`]).
fn terminating_pod(id: PodId, pod: &PodModel, now: Timestamp) -> PodPrelim {
    let skipped = |sid: SubjectId| Prelim {
        verdict: Verdict {
            id: sid,
            state: State::Skipped(SkipReason::PodTerminating),
            expected: None,
            observed: None,
            since: now,
            detail: None,
        },
        estimate: now,
        mutable_mount: false,
    };
    let mut verdicts: Vec<Prelim> = (0..pod.volumes.len())
        .map(|vi| skipped(SubjectId::Volume(vi as u16)))
        .collect();
    for (ci, c) in pod.containers.iter().enumerate() {
        for (mi, m) in c.mounts.iter().enumerate() {
            if m.sub_path.is_some() || m.sub_path_expr {
                verdicts.push(skipped(SubjectId::SubPath(ci as u16, mi as u16)));
            }
        }
        for ei in 0..c.env.len() {
            verdicts.push(skipped(SubjectId::Env(ci as u16, ei as u16)));
        }
    }
    PodPrelim {
        id,
        verdicts,
        mutable: 0,
        stale: 0,
    }
}

/// Pod-level read errors that concern the subject at `path` (components
/// under the pod directory): errors on the pod directory itself, on one of
/// the subject's parent directories, or below it.
fn relevant_pod_errors(pod: Option<&crate::model::ObservedPod>, path: &[&str]) -> Vec<String> {
    let Some(pod) = pod else {
        return Vec::new();
    };
    pod.errors
        .iter()
        .filter(|e| {
            e.path
                .split('/')
                .filter(|c| !c.is_empty())
                .zip(path.iter())
                .all(|(a, b)| a == *b)
        })
        .map(|e| {
            if e.path.is_empty() {
                "the pod directory".to_string()
            } else {
                e.path.to_string()
            }
        })
        .collect()
}

fn pod_volume_index(pod: &PodModel, name: &str) -> Option<u16> {
    pod.volumes
        .iter()
        .position(|v| *v.name == *name)
        .map(|i| i as u16)
}

/// A source as shown in output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceView {
    /// `Secret` or `ConfigMap`.
    pub kind: &'static str,
    /// Object name (in the pod's namespace).
    pub name: Arc<str>,
}

/// The output form of a verdict (JSON for the offline command and the
/// status endpoint): fingerprints only, never digests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerdictView<'a> {
    /// State name.
    pub state: &'static str,
    /// Cause or reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<&'static str>,
    /// Pod namespace.
    pub namespace: &'a str,
    /// Pod name.
    pub pod: &'a str,
    /// Pod UID.
    pub uid: &'a str,
    /// Node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<&'a str>,
    /// Controlling NodeSet.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodeset: Option<&'a str>,
    /// `volume`, `subPath` or `env`.
    pub subject: &'static str,
    /// Volume name (volume and subPath subjects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub volume: Option<Arc<str>>,
    /// Container (subPath and env subjects).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<Arc<str>>,
    /// subPath.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub_path: Option<Arc<str>>,
    /// Environment variable, or `envFrom[:prefix]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub env: Option<Arc<str>>,
    /// Source kind of the first source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_kind: Option<&'static str>,
    /// Source name of the first source.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_name: Option<Arc<str>>,
    /// Every source involved.
    pub sources: Vec<SourceView>,
    /// Expected content fingerprint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<Fingerprint>,
    /// Observed content fingerprint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed: Option<Fingerprint>,
    /// Paths that differ.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub differing_paths: &'a [Arc<str>],
    /// Per-file verdicts.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub files: &'a [FileVerdict],
    /// Pods pinning an immutable cache entry.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub pinned_by: &'a [Arc<str>],
    /// Since when the state holds.
    pub since: Timestamp,
    /// Explanation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<&'a str>,
}

impl Verdict {
    /// The output view of this verdict of `pod`.
    pub fn view<'a>(&'a self, pod: &'a PodVerdicts) -> VerdictView<'a> {
        let (subject, volume, container, sub_path, env) = match pod.subject(self) {
            Subject::Volume { volume } => ("volume", Some(volume), None, None, None),
            Subject::SubPath {
                container,
                volume,
                sub_path,
                ..
            } => (
                "subPath",
                Some(volume),
                Some(container),
                Some(sub_path),
                None,
            ),
            Subject::Env { container, var } => ("env", None, Some(container), None, Some(var)),
        };
        let sources = pod.sources(self);
        let first = sources.first();
        let p = &pod.pod;
        VerdictView {
            state: self.state.name(),
            cause: self.state.cause(),
            namespace: &p.namespace,
            pod: &p.name,
            uid: &p.uid,
            node: p.node.as_deref(),
            nodeset: p.nodeset.as_deref(),
            subject,
            volume,
            container,
            sub_path,
            env,
            source_kind: first.map(|r| r.kind.as_str()),
            source_name: first.map(|r| r.name.clone()),
            sources: sources
                .iter()
                .map(|r| SourceView {
                    kind: r.kind.as_str(),
                    name: r.name.clone(),
                })
                .collect(),
            expected: self.expected,
            observed: self.observed,
            differing_paths: self.differing_paths(),
            files: self.files(),
            pinned_by: self.pinned_by(),
            since: self.since,
            message: self.message(),
        }
    }
}
