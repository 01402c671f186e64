//! The compact, kube-free model the engine works on.
//!
//! Strings that repeat across hundreds of thousands of pods (namespaces,
//! source names, volume names, file paths) are interned as `Arc<str>`;
//! digests are raw `[u8; 32]`. Secret and ConfigMap content only ever exists
//! here as SHA-256 digests: the conversion at the edge hashes every value and
//! drops the plaintext.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::BTreeMap;

use foldhash::HashSet;
use std::fmt;
use std::sync::Arc;

use jiff::Timestamp;
use mountguard_inventory::{NodeInventory, Plugin, ReadErrorKind, file_digest, volume_digest};
use serde::{Deserialize, Serialize, Serializer};

use crate::uid::PodUid;

/// A raw SHA-256 digest.
pub type Digest = [u8; 32];

/// A sorted list of (path, digest) pairs, shared between equal lists. The
/// slice is boxed inside the `Arc` so the list is one word (a thin pointer)
/// in every observed volume and subPath that holds it, not two: lists are
/// interned, so the extra box is paid once per distinct list.
pub type FileList = Arc<Box<[(Arc<str>, Digest)]>>;

/// A pod's verified volumes, shared between pods with the same list (the
/// pods of one workload); boxed inside the `Arc` like a [`FileList`], so it
/// is one word in every pod model.
pub type VolumeList = Arc<Box<[VolumeModel]>>;

/// A list of source fingerprints (what a published pod's verdicts were
/// computed against), shared between equal lists; boxed inside the `Arc`
/// like a [`FileList`], so it is one word in every published pod.
pub type FingerprintList = Arc<Box<[Option<Fingerprint>]>>;

/// A short keyed fingerprint of a digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; Fingerprint::LEN]);

impl Fingerprint {
    /// Bytes kept from the HMAC (12 hex characters).
    pub const LEN: usize = 6;
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Fingerprint({self})")
    }
}

impl Serialize for Fingerprint {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Interns strings, volume sources and observed file lists, so equal values
/// (the same ConfigMap mounted by thousands of pods) share one allocation.
///
/// Values nobody else holds any more (deleted pods, rotated objects) are
/// dropped by [`Interner::prune`], which runs by itself whenever the held
/// values doubled since the last prune: the interner stays within about
/// twice what is alive, at an amortized constant cost per insertion.
#[derive(Debug, Default)]
pub struct Interner {
    set: HashSet<Arc<str>>,
    volume_sources: HashSet<Arc<VolumeSource>>,
    volumes_seen: HashSet<Arc<VolumeSeen>>,
    volumes: HashSet<VolumeList>,
    mounts: HashSet<Arc<[MountModel]>>,
    envs: HashSet<Arc<[EnvRef]>>,
    file_lists: HashSet<FileList>,
    fingerprint_lists: HashSet<FingerprintList>,
    places: HashSet<Arc<PodPlace>>,
    /// Prune once this many values are held (0: [`Self::MIN_PRUNE`]).
    prune_at: usize,
}

/// The copy of `v` that `set` holds, inserted if there is none; and
/// whether it was inserted.
fn shared_slice<T: Eq + std::hash::Hash>(
    set: &mut HashSet<Arc<[T]>>,
    v: Vec<T>,
) -> (Arc<[T]>, bool) {
    if let Some(a) = set.get(v.as_slice()) {
        return (a.clone(), false);
    }
    let a: Arc<[T]> = v.into();
    set.insert(a.clone());
    (a, true)
}

/// The set's copy of `v`, inserted when absent; whether it was.
fn shared_value<T: Eq + std::hash::Hash>(set: &mut HashSet<Arc<T>>, v: T) -> (Arc<T>, bool) {
    if let Some(a) = set.get(&v) {
        return (a.clone(), false);
    }
    let a = Arc::new(v);
    set.insert(a.clone());
    (a, true)
}

impl Interner {
    /// Below this many held values the interner never prunes by itself.
    pub const MIN_PRUNE: usize = 4096;

    /// Drops every value only the interner still holds; returns how many.
    pub fn prune(&mut self) -> usize {
        let before = self.held();
        // Composite values first: they hold strings and sources.
        self.places.retain(|a| Arc::strong_count(a) > 1);
        self.volumes_seen.retain(|a| Arc::strong_count(a) > 1);
        self.file_lists.retain(|a| Arc::strong_count(a) > 1);
        self.fingerprint_lists.retain(|a| Arc::strong_count(a) > 1);
        self.volumes.retain(|a| Arc::strong_count(a) > 1);
        self.mounts.retain(|a| Arc::strong_count(a) > 1);
        self.envs.retain(|a| Arc::strong_count(a) > 1);
        self.volume_sources.retain(|a| Arc::strong_count(a) > 1);
        self.set.retain(|a| Arc::strong_count(a) > 1);
        before - self.held()
    }

    /// Values held, of every kind.
    pub fn held(&self) -> usize {
        self.set.len()
            + self.volume_sources.len()
            + self.volumes_seen.len()
            + self.volumes.len()
            + self.mounts.len()
            + self.envs.len()
            + self.file_lists.len()
            + self.fingerprint_lists.len()
            + self.places.len()
    }

    fn inserted(&mut self) {
        if self.held() >= self.prune_at.max(Self::MIN_PRUNE) {
            self.prune();
            self.prune_at = self.held().saturating_mul(2);
        }
    }

    /// The shared copy of `s`.
    pub fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(a) = self.set.get(s) {
            return a.clone();
        }
        let a: Arc<str> = Arc::from(s);
        self.set.insert(a.clone());
        self.inserted();
        a
    }

    /// The shared place of the pods in `namespace` on `node` (see
    /// [`PodPlace`]), its names interned too.
    pub fn intern_place(&mut self, namespace: &str, node: Option<&str>) -> Arc<PodPlace> {
        let place = PodPlace {
            namespace: self.intern(namespace),
            node: node.map(|n| self.intern(n)),
        };
        let (a, new) = shared_value(&mut self.places, place);
        if new {
            self.inserted();
        }
        a
    }

    /// The shared copy of a list of source fingerprints (what a published
    /// pod's verdicts were computed against: the pods of one workload
    /// reference the same sources, so they share one list).
    pub fn intern_fingerprints(&mut self, v: Vec<Option<Fingerprint>>) -> FingerprintList {
        let (a, new) = shared_value(&mut self.fingerprint_lists, v.into_boxed_slice());
        if new {
            self.inserted();
        }
        a
    }

    /// The shared copy of what one observed volume showed: its plugin
    /// directory and name, its files (interned by [`Self::intern_files`])
    /// and its read problems.
    pub fn intern_volume_seen(
        &mut self,
        plugin: Plugin,
        name: &str,
        files: FileList,
        errors: RareList<ObservedError>,
    ) -> Arc<VolumeSeen> {
        let seen = VolumeSeen {
            plugin,
            name: self.intern(name),
            files,
            errors,
        };
        let (a, new) = shared_value(&mut self.volumes_seen, seen);
        if new {
            self.inserted();
        }
        a
    }

    /// The shared copy of a volume source.
    pub fn intern_volume_source(&mut self, v: VolumeSource) -> Arc<VolumeSource> {
        let (a, new) = shared_value(&mut self.volume_sources, v);
        if new {
            self.inserted();
        }
        a
    }

    /// The shared copy of a pod's verified volumes.
    pub fn intern_volumes(&mut self, v: Vec<VolumeModel>) -> VolumeList {
        let (a, new) = shared_value(&mut self.volumes, v.into_boxed_slice());
        if new {
            self.inserted();
        }
        a
    }

    /// The shared copy of a container's relevant mounts.
    pub fn intern_mounts(&mut self, v: Vec<MountModel>) -> Arc<[MountModel]> {
        let (a, new) = shared_slice(&mut self.mounts, v);
        if new {
            self.inserted();
        }
        a
    }

    /// The shared copy of a container's environment references.
    pub fn intern_env(&mut self, v: Vec<EnvRef>) -> Arc<[EnvRef]> {
        let (a, new) = shared_slice(&mut self.envs, v);
        if new {
            self.inserted();
        }
        a
    }

    /// The shared copy of a file list (sorted by path).
    pub fn intern_files<'a, I>(&mut self, files: I) -> FileList
    where
        I: IntoIterator<Item = (&'a str, &'a Digest)>,
    {
        let mut list: Vec<(Arc<str>, Digest)> = files
            .into_iter()
            .map(|(p, d)| (self.intern(p), *d))
            .collect();
        list.sort_by(|a, b| a.0.cmp(&b.0));
        let (a, new) = shared_value(&mut self.file_lists, list.into_boxed_slice());
        if new {
            self.inserted();
        }
        a
    }

    /// Number of distinct strings held.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether no string is held.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

/// Kind of a source object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SourceKind {
    /// A core/v1 Secret.
    Secret,
    /// A core/v1 ConfigMap.
    ConfigMap,
}

impl SourceKind {
    /// The API kind name.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Secret => "Secret",
            SourceKind::ConfigMap => "ConfigMap",
        }
    }
}

/// A namespaced reference to a Secret or ConfigMap.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SourceRef {
    /// Secret or ConfigMap.
    pub kind: SourceKind,
    /// Namespace (always the pod's namespace for references from a pod).
    pub namespace: Arc<str>,
    /// Object name.
    pub name: Arc<str>,
}

impl SourceRef {
    /// A new reference.
    pub fn new(kind: SourceKind, namespace: Arc<str>, name: Arc<str>) -> Self {
        Self {
            kind,
            namespace,
            name,
        }
    }
}

impl fmt::Debug for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for SourceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// One key of a source object, hashed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct KeyDigest {
    /// SHA-256 of the value's bytes (Secret values decoded from base64).
    pub digest: Digest,
    /// The key came from a ConfigMap's `binaryData` (such keys never reach
    /// environment variables).
    pub binary: bool,
}

impl fmt::Debug for KeyDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "KeyDigest({}..{})",
            hex::encode(&self.digest[..4]),
            if self.binary { ", binary" } else { "" }
        )
    }
}

/// The current content of a Secret or ConfigMap, as digests only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceContent {
    /// `immutable: true` on the object.
    pub immutable: bool,
    /// Every key (ConfigMap `data` and `binaryData`, Secret `data`), hashed.
    pub keys: BTreeMap<Arc<str>, KeyDigest>,
    /// Digest over the whole key set ([`volume_digest`] of the keys); changes
    /// exactly when some key's content, or the set of keys, changes.
    pub content_digest: Digest,
    /// The object's UID, when known (a recreated object has a new one).
    pub uid: Option<Arc<str>>,
    /// Best guess of when the content last changed when the engine has no
    /// history: the newest `metadata.managedFields[].time`, else
    /// `metadata.creationTimestamp`.
    pub last_write: Option<Timestamp>,
}

impl SourceContent {
    /// Builds the content from hashed keys.
    pub fn new(
        immutable: bool,
        keys: BTreeMap<Arc<str>, KeyDigest>,
        uid: Option<Arc<str>>,
        last_write: Option<Timestamp>,
    ) -> Self {
        let content_digest = volume_digest(keys.iter().map(|(k, v)| (&**k, &v.digest)));
        Self {
            immutable,
            keys,
            content_digest,
            uid,
            last_write,
        }
    }

    /// Builds the content by hashing plaintext values; the caller drops the
    /// plaintext afterwards. `binary` marks ConfigMap `binaryData` keys.
    pub fn from_plain<'a, I>(
        interner: &mut Interner,
        immutable: bool,
        values: I,
        uid: Option<&str>,
        last_write: Option<Timestamp>,
    ) -> Self
    where
        I: IntoIterator<Item = (&'a str, &'a [u8], bool)>,
    {
        let keys = values
            .into_iter()
            .map(|(k, v, binary)| {
                (
                    interner.intern(k),
                    KeyDigest {
                        digest: file_digest(v),
                        binary,
                    },
                )
            })
            .collect();
        Self::new(immutable, keys, uid.map(|u| interner.intern(u)), last_write)
    }
}

/// A `key` -> `path` mapping (`items` of a Secret/ConfigMap volume or
/// projection).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct KeyToPath {
    /// The key in the source object.
    pub key: Arc<str>,
    /// Relative path of the file in the volume (may be nested, `a/b/c`).
    pub path: Arc<str>,
}

/// A Secret or ConfigMap reference inside a volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SourceProjection {
    /// Secret or ConfigMap.
    pub kind: SourceKind,
    /// Object name (same namespace as the pod).
    pub name: Arc<str>,
    /// `items`, or `None` for "every key, named after the key".
    pub items: Option<Box<[KeyToPath]>>,
    /// `optional: true`: a missing object or key is not an error.
    pub optional: bool,
}

/// Why a path in a volume is not verifiable from the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SkipReason {
    /// A downwardAPI item (pod metadata or resources).
    DownwardApi,
    /// A service-account token (rotated by the kubelet).
    ServiceAccountToken,
    /// A clusterTrustBundle projection.
    ClusterTrustBundle,
    /// A podCertificate projection.
    PodCertificate,
    /// A projected source this version does not know.
    UnknownSource,
    /// A subPathExpr mount (expanded by the kubelet from the environment).
    SubPathExpr,
    /// The pod is terminating (`deletionTimestamp` set): the kubelet no
    /// longer syncs it (`pkg/kubelet/pod_workers.go`: a pod whose
    /// termination was requested gets `SyncTerminatingPod`, never
    /// `SyncPod` again, and `pkg/kubelet/volumemanager` stops adding its
    /// volumes), so its mounts stay as they are until it is gone. It still
    /// pins the kubelet's cache.
    PodTerminating,
    /// An env `valueFrom.fileKeyRef`: a value the kubelet reads at
    /// container start from a file in an emptyDir volume of the pod
    /// (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables`, gate
    /// `EnvFiles`, on from 1.35), with no Secret or ConfigMap behind it.
    FileKeyRef,
}

impl SkipReason {
    /// Stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::DownwardApi => "downwardAPI",
            SkipReason::ServiceAccountToken => "serviceAccountToken",
            SkipReason::ClusterTrustBundle => "clusterTrustBundle",
            SkipReason::PodCertificate => "podCertificate",
            SkipReason::UnknownSource => "unknownSource",
            SkipReason::SubPathExpr => "subPathExpr",
            SkipReason::PodTerminating => "podTerminating",
            SkipReason::FileKeyRef => "fileKeyRef",
        }
    }
}

/// One source of a projected volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ProjectedSource {
    /// A Secret or ConfigMap projection.
    Object(SourceProjection),
    /// Paths whose content does not come from a Secret or ConfigMap.
    NotFromApi {
        /// What writes them.
        reason: SkipReason,
        /// The paths (files) it writes; empty when unknown.
        paths: Box<[Arc<str>]>,
    },
}

/// The volume types the engine verifies.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VolumeSource {
    /// A `secret` or `configMap` volume.
    Object(SourceProjection),
    /// A `projected` volume, sources in order.
    Projected(Box<[ProjectedSource]>),
}

impl VolumeSource {
    /// The Secrets/ConfigMaps this volume projects, in spec order.
    pub fn refs(&self, namespace: &Arc<str>) -> Vec<SourceRef> {
        let r = |p: &SourceProjection| SourceRef::new(p.kind, namespace.clone(), p.name.clone());
        match self {
            VolumeSource::Object(p) => vec![r(p)],
            VolumeSource::Projected(s) => s
                .iter()
                .filter_map(|s| match s {
                    ProjectedSource::Object(p) => Some(r(p)),
                    ProjectedSource::NotFromApi { .. } => None,
                })
                .collect(),
        }
    }

    /// The inventory plugin directory this volume lives in.
    pub fn plugin(&self) -> Plugin {
        match self {
            VolumeSource::Object(p) if p.kind == SourceKind::Secret => Plugin::Secret,
            VolumeSource::Object(_) => Plugin::Configmap,
            VolumeSource::Projected(_) => Plugin::Projected,
        }
    }
}

/// A volume of the pod spec that the engine verifies.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VolumeModel {
    /// Volume name.
    pub name: Arc<str>,
    /// What it projects (shared between pods with the same spec).
    pub source: Arc<VolumeSource>,
    /// Listed in the read-at-start annotation.
    pub read_at_start: bool,
}

/// A `volumeMount` of a verified volume that uses `subPath`/`subPathExpr`,
/// or any mount of a read-at-start volume.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MountModel {
    /// Position in the container's `volumeMounts` (the kubelet's subPath
    /// index).
    pub index: u32,
    /// Index into [`PodModel::volumes`].
    pub volume: u16,
    /// `subPath`, if any.
    pub sub_path: Option<Arc<str>>,
    /// `subPathExpr` is set (not verifiable).
    pub sub_path_expr: bool,
}

/// An environment reference: to a Secret or ConfigMap, or a `valueFrom`
/// the kubelet fills from something else that the engine lists as not
/// checked.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum EnvRef {
    /// `env[].valueFrom.secretKeyRef` / `configMapKeyRef`.
    Key {
        /// The variable name.
        var: Arc<str>,
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Object name.
        name: Arc<str>,
        /// The key.
        key: Arc<str>,
        /// `optional: true`.
        optional: bool,
    },
    /// `envFrom[].secretRef` / `configMapRef`.
    From {
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Object name.
        name: Arc<str>,
        /// `prefix`, empty if none.
        prefix: Arc<str>,
        /// `optional: true`.
        optional: bool,
    },
    /// `env[].valueFrom` of a source with no Secret or ConfigMap behind it
    /// (`fileKeyRef`): no cache registration, nothing to compare; its
    /// verdict is Skipped with `reason`.
    NotFromApi {
        /// The variable name.
        var: Arc<str>,
        /// Why it is not checked.
        reason: SkipReason,
    },
}

impl EnvRef {
    /// The referenced object kind and name; `None` for a source that is no
    /// Secret or ConfigMap.
    pub fn target(&self) -> Option<(SourceKind, &Arc<str>)> {
        match self {
            EnvRef::Key { kind, name, .. } | EnvRef::From { kind, name, .. } => Some((*kind, name)),
            EnvRef::NotFromApi { .. } => None,
        }
    }
}

/// Which list of the pod spec a container comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ContainerKind {
    /// `spec.containers`.
    Regular,
    /// `spec.initContainers` (sidecars included).
    Init,
    /// `spec.ephemeralContainers`.
    Ephemeral,
}

/// A container with what the engine needs of it: every regular container,
/// every init container (finished ones too: their env and what they read
/// at start shaped the pod), and every ephemeral container that has not
/// exited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerModel {
    /// Container name.
    pub name: Arc<str>,
    /// Where the container is declared.
    pub kind: ContainerKind,
    /// When the container's current process started:
    /// `state.running.startedAt`, or for a finished init container
    /// `state.terminated.startedAt`; `None` when it has not started (or, for
    /// a regular container, is not running now). Compact (12 bytes, not
    /// 24: a container model is 64 bytes, not 80); read it with
    /// [`ContainerModel::started_at`].
    pub started: Option<CompactTime>,
    /// An init container that ran to completion and never runs again in
    /// this pod (not a sidecar): a restart cannot refresh what it read.
    pub finished: bool,
    /// Relevant volume mounts (shared between pods with the same spec).
    pub mounts: Arc<[MountModel]>,
    /// Environment references (shared between pods with the same spec).
    pub env: Arc<[EnvRef]>,
}

impl ContainerModel {
    /// When the container's current process started (see `started`).
    pub fn started_at(&self) -> Option<Timestamp> {
        self.started.map(CompactTime::get)
    }

    /// What to do so this container reads current content again, in the
    /// words of a verdict's advice.
    pub fn refresh_advice(&self) -> String {
        if self.finished {
            format!(
                "init container {} ran once and never runs again in this pod: replace the pod",
                self.name
            )
        } else {
            format!("restart container {}", self.name)
        }
    }
}

/// The compact view of a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodModel {
    /// `metadata.uid` (16 bytes inline for a UUID).
    pub uid: PodUid,
    /// Namespace and node (see [`PodModel::namespace`] and
    /// [`PodModel::node`]), interned together: the pods of one namespace on
    /// one node share one, so a pod holds one pointer, not two 16-byte
    /// strings.
    pub place: Arc<PodPlace>,
    /// Name.
    pub name: Box<str>,
    /// Phase is Succeeded or Failed: the kubelet has unregistered it.
    pub terminated: bool,
    /// `metadata.deletionTimestamp` is set: the kubelet no longer refreshes
    /// the pod's volumes, but keeps its cache registrations until the pod is
    /// gone.
    pub terminating: bool,
    /// `status.startTime`: set by the kubelet's status manager in the first
    /// `SyncPod` of the pod, right before it registers the pod's Secret and
    /// ConfigMap references (see [`PodModel::registered`]). `None`: the
    /// kubelet has not synced the pod yet.
    pub synced_at: Option<CompactTime>,
    /// The `Ready` condition is `True` (counts towards a NodeSet's
    /// availability when budgeting remediation).
    pub ready: bool,
    /// The controlling NodeSet and the Slurm node name, for a NodeSet pod
    /// (boxed: one pointer, null in every other pod; read through
    /// [`PodModel::nodeset`] and [`PodModel::slurm_node`]).
    pub slinky: Option<Box<NodeSetMember>>,
    /// The controlling ReplicaSet, StatefulSet or DaemonSet (its
    /// `controller: true` owner reference), for a pod of one (boxed like
    /// `slinky`; read through [`PodModel::controller`]).
    pub workload: Option<Box<ControllerRef>>,
    /// Verified volumes (secret, configMap, projected).
    /// (Shared between pods with the same volumes: the pods of one
    /// workload have the same list; one word, see [`VolumeList`].)
    pub volumes: VolumeList,
    /// Containers.
    pub containers: Box<[ContainerModel]>,
    /// The references the kubelet registers beside volumes and env: the
    /// image pull secrets and the others (see [`ExtraRefs`]). One pointer,
    /// null for most pods.
    pub extra_refs: ExtraRefs,
}

/// What a pod references beside its volumes and env, held in one pointer
/// (null when there is neither) instead of one per list.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtraRefs(RarePair<Arc<str>, (SourceKind, Arc<str>)>);

impl ExtraRefs {
    /// `image_pull_secrets` and `other_refs` (see their accessors).
    pub fn new(image_pull_secrets: Vec<Arc<str>>, other_refs: Vec<(SourceKind, Arc<str>)>) -> Self {
        Self(RarePair::new(image_pull_secrets, other_refs))
    }

    /// `spec.imagePullSecrets` names (the kubelet registers these too).
    pub fn image_pull_secrets(&self) -> &[Arc<str>] {
        self.0.first()
    }

    /// References the kubelet registers that get no verdict of their own:
    /// the Secrets named by volumes of other types (CSI
    /// `nodePublishSecretRef`, azureFile, cephfs, cinder, flexVolume, iscsi,
    /// rbd, scaleIO, storageOS) and the env references of ephemeral
    /// containers that have exited (they never run again).
    pub fn other_refs(&self) -> &[(SourceKind, Arc<str>)] {
        self.0.second()
    }
}

/// Where a pod is: its namespace and node. Interned
/// ([`Interner::intern_place`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodPlace {
    /// Namespace.
    pub namespace: Arc<str>,
    /// `spec.nodeName`; `None` when not scheduled.
    pub node: Option<Arc<str>>,
}

impl PodPlace {
    /// A place of its own (not interned: for tests and one-off models).
    pub fn new(namespace: Arc<str>, node: Option<Arc<str>>) -> Arc<Self> {
        Arc::new(Self { namespace, node })
    }
}

/// What a Slinky NodeSet pod carries besides what every pod does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSetMember {
    /// Name of the controlling NodeSet.
    pub nodeset: Arc<str>,
    /// Slurm node name (label `nodeset.slinky.slurm.net/pod-hostname`).
    pub slurm_node: Option<Arc<str>>,
}

/// The kinds of controller that own pods directly and recreate them
/// (`apps/v1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ControllerKind {
    /// `ReplicaSet` (a Deployment's pods belong to one).
    ReplicaSet,
    /// `StatefulSet`.
    StatefulSet,
    /// `DaemonSet`.
    DaemonSet,
}

impl ControllerKind {
    /// The kind of an `apps/v1` owner reference, if it is one of these.
    pub fn of_owner(api_version: &str, kind: &str) -> Option<Self> {
        if api_version != "apps/v1" {
            return None;
        }
        match kind {
            "ReplicaSet" => Some(Self::ReplicaSet),
            "StatefulSet" => Some(Self::StatefulSet),
            "DaemonSet" => Some(Self::DaemonSet),
            _ => None,
        }
    }
}

/// A pod's controlling `apps/v1` owner: its owner reference with
/// `controller: true` (k8s.io/apimachinery/pkg/apis/meta/v1,
/// `GetControllerOf`). The UID is what names the owner: a name is only a
/// claim, which anyone who may create pods can make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerRef {
    /// Its kind.
    pub kind: ControllerKind,
    /// Its name (same namespace as the pod).
    pub name: Arc<str>,
    /// Its UID, as the reference gives it (held as a pod's UID is).
    pub uid: PodUid,
}

impl ControllerRef {
    /// A controller of kind `kind` named `name` with UID `uid`, as a pod
    /// model holds it.
    pub fn boxed(kind: ControllerKind, name: Arc<str>, uid: &str) -> Option<Box<Self>> {
        Some(Box::new(Self {
            kind,
            name,
            uid: PodUid::new(uid),
        }))
    }
}

impl NodeSetMember {
    /// A member of NodeSet `nodeset`, as a pod model holds it.
    pub fn boxed(nodeset: Arc<str>, slurm_node: Option<Arc<str>>) -> Option<Box<Self>> {
        Some(Box::new(Self {
            nodeset,
            slurm_node,
        }))
    }
}

impl PodModel {
    /// Namespace.
    pub fn namespace(&self) -> &Arc<str> {
        &self.place.namespace
    }

    /// `spec.nodeName`; `None` when not scheduled.
    pub fn node(&self) -> Option<&Arc<str>> {
        self.place.node.as_ref()
    }

    /// [`PodModel::node`] as a string slice.
    pub fn node_name(&self) -> Option<&str> {
        self.place.node.as_deref()
    }

    /// Moves the pod to `node` (a place of its own, not interned).
    pub fn set_node(&mut self, node: Option<Arc<str>>) {
        self.place = PodPlace::new(self.place.namespace.clone(), node);
    }

    /// Moves the pod to `namespace` (a place of its own, not interned).
    pub fn set_namespace(&mut self, namespace: Arc<str>) {
        self.place = PodPlace::new(namespace, self.place.node.clone());
    }

    /// Name of the controlling NodeSet, if any.
    pub fn nodeset(&self) -> Option<&str> {
        self.slinky.as_deref().map(|m| &*m.nodeset)
    }

    /// The controlling ReplicaSet, StatefulSet or DaemonSet, if any.
    pub fn controller(&self) -> Option<&ControllerRef> {
        self.workload.as_deref()
    }

    /// Slurm node name of a NodeSet pod, if labelled.
    pub fn slurm_node(&self) -> Option<&str> {
        self.slinky.as_deref().and_then(|m| m.slurm_node.as_deref())
    }

    /// Every Secret/ConfigMap this pod references: the names the kubelet
    /// registers a cache reference for, as `pkg/api/v1/pod/util.go`
    /// `VisitPodSecretNames` / `VisitPodConfigmapNames` visit them:
    /// imagePullSecrets; env `valueFrom` and `envFrom` of regular, init and
    /// ephemeral containers whatever their state (a `fileKeyRef` names no
    /// object); secret, configMap and projected volume sources; the
    /// secretRefs of other volume types. Empty
    /// names are skipped (`skipEmptyNames`). Sorted, without duplicates.
    pub fn references(&self) -> Vec<SourceRef> {
        let mut out = Vec::new();
        let mut push = |kind, name: &Arc<str>| {
            out.push(SourceRef::new(kind, self.namespace().clone(), name.clone()));
        };
        for v in self.volumes.iter() {
            match &*v.source {
                VolumeSource::Object(p) => push(p.kind, &p.name),
                VolumeSource::Projected(sources) => {
                    for s in sources.iter() {
                        if let ProjectedSource::Object(p) = s {
                            push(p.kind, &p.name);
                        }
                    }
                }
            }
        }
        for c in self.containers.iter() {
            for (kind, name) in c.env.iter().filter_map(EnvRef::target) {
                push(kind, name);
            }
        }
        for s in self.extra_refs.image_pull_secrets() {
            push(SourceKind::Secret, s);
        }
        for (kind, name) in self.extra_refs.other_refs() {
            push(*kind, name);
        }
        out.sort();
        out.dedup();
        out
    }

    /// Whether the pod references `r` at all (see [`PodModel::references`]).
    pub fn references_source(&self, r: &SourceRef) -> bool {
        if *r.namespace != **self.namespace() {
            return false;
        }
        let hit = |kind: SourceKind, name: &Arc<str>| kind == r.kind && **name == *r.name;
        self.volumes.iter().any(|v| match &*v.source {
            VolumeSource::Object(p) => hit(p.kind, &p.name),
            VolumeSource::Projected(s) => s
                .iter()
                .any(|s| matches!(s, ProjectedSource::Object(p) if hit(p.kind, &p.name))),
        }) || self.containers.iter().any(|c| {
            c.env
                .iter()
                .filter_map(EnvRef::target)
                .any(|(k, n)| hit(k, n))
        }) || (r.kind == SourceKind::Secret
            && self
                .extra_refs
                .image_pull_secrets()
                .iter()
                .any(|s| **s == *r.name))
            || self.extra_refs.other_refs().iter().any(|(k, n)| hit(*k, n))
    }

    /// Whether the kubelet on the pod's node holds a cache registration for
    /// the pod now. `pkg/kubelet/kubelet.go` `SyncPod` registers the pod
    /// with the Secret and ConfigMap managers right after its first
    /// `statusManager.SetPodStatus` (which stamps `status.startTime`, see
    /// `pkg/kubelet/status/status_manager.go` `updateStatusInternal`), and
    /// only `SyncTerminatedPod` unregisters it: a pod that is terminating but
    /// not gone still holds its registrations, a Succeeded/Failed one does
    /// not, and one the kubelet has not synced yet holds none.
    ///
    /// A pod being deleted holds them until it is gone, whatever its phase:
    /// the kubelet reports the terminal phase of a deleted pod from
    /// `SyncTerminatingPod` once its containers stopped, and unregisters
    /// it only later, in `SyncTerminatedPod` after its volumes are
    /// unmounted (`kl.secretManager.UnregisterPod` before
    /// `kl.statusManager.TerminatePod`), and the API object goes only
    /// after that (`pkg/kubelet/status/status_manager.go`, `syncPod`:
    /// `canBeDeleted`). A replacement registered on the node in between
    /// is served the pinned entry.
    pub fn registered(&self) -> bool {
        self.node().is_some() && (!self.terminated || self.terminating) && self.synced_at.is_some()
    }

    /// Whether this pod keeps the kubelet's cache entry of `r` alive: it is
    /// [registered](Self::registered) and names `r` in any reference the
    /// kubelet counts ([`Self::references`]).
    pub fn pins(&self, r: &SourceRef) -> bool {
        self.registered() && self.references_source(r)
    }
}

/// A [`Timestamp`] in 8 bytes with a niche, so that an optional one takes
/// 8 bytes where an `Option<Timestamp>` takes 24: for the times held per
/// pod, per observed volume, per verdict and per published pod.
///
/// It holds the nanoseconds since the Unix epoch in an `i64`, exact for
/// every time from 1677-09-21T00:12:43.145224193Z to
/// 2262-04-11T23:47:16.854775807Z (every clock reading and every time the
/// API server or an agent writes from one). A time outside that range is
/// held at the nearest end of it ([`CompactTime::from`] saturates): it
/// still compares the same way against every time in range, which is all
/// the engine does with these times (grace periods, "written after the
/// change"), and [`CompactTime::is_clamped`] says it was clamped.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CompactTime {
    /// Nanoseconds since the epoch with the sign bit flipped, so that the
    /// one value left out of the range, `i64::MIN` nanoseconds, is the
    /// zero that gives `Option<CompactTime>` its niche. (Flipping the sign
    /// bit keeps the order of the signed value in the unsigned one.)
    biased: std::num::NonZeroU64,
}

impl CompactTime {
    const BIAS: u64 = 1 << 63;
    /// The earliest time held exactly.
    pub const MIN: i128 = i64::MIN as i128 + 1;
    /// The latest time held exactly.
    pub const MAX: i128 = i64::MAX as i128;

    /// The timestamp.
    pub fn get(self) -> Timestamp {
        let ns = (self.biased.get() ^ Self::BIAS) as i64;
        Timestamp::from_nanosecond(i128::from(ns))
            .expect("every i64 of nanoseconds is a valid Timestamp")
    }

    /// Whether `t` lies outside the range held exactly, so that
    /// [`CompactTime::from`] holds it at the nearest end.
    pub fn is_clamped(t: Timestamp) -> bool {
        !(Self::MIN..=Self::MAX).contains(&t.as_nanosecond())
    }
}

impl From<Timestamp> for CompactTime {
    fn from(t: Timestamp) -> Self {
        let ns = t.as_nanosecond().clamp(Self::MIN, Self::MAX) as i64;
        Self {
            biased: std::num::NonZeroU64::new(ns as u64 ^ Self::BIAS)
                .expect("i64::MIN is outside the clamped range"),
        }
    }
}

impl fmt::Debug for CompactTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

/// A list that is nearly always empty (read problems, subPath targets, a
/// pod's image pull secrets and other references): one pointer, null when
/// empty, instead of a 16-byte boxed slice in every observed volume and
/// pod. Reads as a slice.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RareList<T>(Option<Box<Box<[T]>>>);

impl<T> Default for RareList<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> std::ops::Deref for RareList<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        self.0.as_deref().map_or(&[], |b| b)
    }
}

impl<T> FromIterator<T> for RareList<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let items: Box<[T]> = iter.into_iter().collect();
        Self((!items.is_empty()).then(|| Box::new(items)))
    }
}

impl<T> From<Vec<T>> for RareList<T> {
    fn from(v: Vec<T>) -> Self {
        v.into_iter().collect()
    }
}

impl<T: fmt::Debug> fmt::Debug for RareList<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Two lists that are nearly always both empty, behind one pointer (null
/// when both are) instead of one each: see [`ExtraRefs`] and
/// [`ObservedPod`].
#[derive(Clone, PartialEq, Eq)]
pub struct RarePair<A, B>(Option<Box<Lists<A, B>>>);

/// The two lists of a [`RarePair`].
type Lists<A, B> = (Box<[A]>, Box<[B]>);

impl<A, B> RarePair<A, B> {
    /// The pair of `a` and `b`.
    pub fn new(a: Vec<A>, b: Vec<B>) -> Self {
        Self(
            (!a.is_empty() || !b.is_empty())
                .then(|| Box::new((a.into_boxed_slice(), b.into_boxed_slice()))),
        )
    }

    /// The first list.
    pub fn first(&self) -> &[A] {
        self.0.as_deref().map_or(&[], |(a, _)| a)
    }

    /// The second list.
    pub fn second(&self) -> &[B] {
        self.0.as_deref().map_or(&[], |(_, b)| b)
    }
}

impl<A, B> Default for RarePair<A, B> {
    fn default() -> Self {
        Self(None)
    }
}

impl<A: fmt::Debug, B: fmt::Debug> fmt::Debug for RarePair<A, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RarePair")
            .field(&self.first())
            .field(&self.second())
            .finish()
    }
}

/// One file the agent could not read, reduced to what the engine needs.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObservedError {
    /// Path relative to the volume; empty for the volume itself.
    pub path: Arc<str>,
    /// The kind of problem.
    pub kind: ReadErrorKind,
}

/// What one volume of a pod showed the agent, but for when it was
/// written: its plugin directory and name, its files and its read
/// problems. Interned: the pods of one workload mount the same objects
/// under the same volume names and see the same files, so they share one,
/// and an observed volume is a pointer to it and its own `written_at` (16
/// bytes, not 40).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VolumeSeen {
    /// Plugin directory.
    pub plugin: Plugin,
    /// Volume name.
    pub name: Arc<str>,
    /// Path -> digest, sorted by path.
    pub files: FileList,
    /// Read problems.
    pub errors: RareList<ObservedError>,
}

/// A volume as the agent saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedVolume {
    /// Plugin directory, volume name, files and read problems (shared).
    pub seen: Arc<VolumeSeen>,
    /// When the kubelet published the content now served (this pod's
    /// volume's own time).
    pub written_at: Option<CompactTime>,
}

impl ObservedVolume {
    /// Plugin directory.
    pub fn plugin(&self) -> Plugin {
        self.seen.plugin
    }

    /// Volume name.
    pub fn name(&self) -> &Arc<str> {
        &self.seen.name
    }

    /// Path -> digest, sorted by path.
    pub fn files(&self) -> &[(Arc<str>, Digest)] {
        &self.seen.files
    }

    /// Read problems.
    pub fn errors(&self) -> &[ObservedError] {
        &self.seen.errors
    }

    /// Digest of `path`, if the file was seen.
    pub fn file(&self, path: &str) -> Option<&Digest> {
        let files = self.files();
        files
            .binary_search_by(|(p, _)| (**p).cmp(path))
            .ok()
            .map(|i| &files[i].1)
    }
}

/// A subPath bind target as the agent saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedSubPath {
    /// Volume name.
    pub volume: Arc<str>,
    /// Container name.
    pub container: Arc<str>,
    /// Index of the mount in the container's `volumeMounts`.
    pub index: u32,
    /// Relative path ("" for a single file) -> digest, sorted.
    pub files: FileList,
    /// Read problems.
    pub errors: RareList<ObservedError>,
}

/// A pod directory as the agent saw it: its volumes, and in one pointer,
/// null for nearly every pod, its subPath targets and the problems with
/// the pod directory itself (24 bytes, not 32 with a pointer each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedPod {
    /// Volumes, sorted by (plugin, name).
    pub volumes: Box<[ObservedVolume]>,
    rare: RarePair<ObservedSubPath, ObservedError>,
}

impl ObservedPod {
    /// A pod with these volumes, subPath targets and problems with the pod
    /// directory itself.
    pub fn new(
        volumes: Box<[ObservedVolume]>,
        sub_paths: Vec<ObservedSubPath>,
        errors: Vec<ObservedError>,
    ) -> Self {
        Self {
            volumes,
            rare: RarePair::new(sub_paths, errors),
        }
    }

    /// subPath targets.
    pub fn sub_paths(&self) -> &[ObservedSubPath] {
        self.rare.first()
    }

    /// Problems with the pod directory itself.
    pub fn errors(&self) -> &[ObservedError] {
        self.rare.second()
    }

    /// The volume `name` under `plugin`.
    pub fn volume(&self, plugin: Plugin, name: &str) -> Option<&ObservedVolume> {
        self.volumes
            .iter()
            .find(|v| v.plugin() == plugin && **v.name() == *name)
    }

    /// The subPath target for (volume, container, index).
    pub fn sub_path(&self, volume: &str, container: &str, index: u32) -> Option<&ObservedSubPath> {
        self.sub_paths()
            .iter()
            .find(|s| s.index == index && *s.container == *container && *s.volume == *volume)
    }
}

/// A node inventory in compact form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedNode {
    /// Node name.
    pub node: Arc<str>,
    /// When the agent's scan finished.
    pub scanned_at: Timestamp,
    /// Pods by UID.
    pub pods: ObservedPods,
}

/// A node's observed pods by UID: one slice sorted by UID (by the UIDs'
/// text, see [`PodUid`]), built once per inventory (an inventory is
/// replaced whole, never changed), so each pod costs its entry and nothing
/// more, where a hash map of a node's pods is between 44 % and 87 % full.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObservedPods(Box<[(PodUid, ObservedPod)]>);

impl ObservedPods {
    /// The pod with this UID.
    pub fn get(&self, uid: &PodUid) -> Option<&ObservedPod> {
        self.0
            .binary_search_by(|(k, _)| k.cmp(uid))
            .ok()
            .map(|i| &self.0[i].1)
    }

    /// Whether a pod with this UID was observed.
    pub fn contains_key(&self, uid: &PodUid) -> bool {
        self.get(uid).is_some()
    }

    /// The UIDs, sorted.
    pub fn keys(&self) -> impl Iterator<Item = &PodUid> {
        self.0.iter().map(|(k, _)| k)
    }

    /// Number of pods.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no pod was observed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// As a map would collect them: of two pods with one UID, the later one
/// stays.
impl FromIterator<(PodUid, ObservedPod)> for ObservedPods {
    fn from_iter<I: IntoIterator<Item = (PodUid, ObservedPod)>>(iter: I) -> Self {
        let mut pods: Vec<(PodUid, ObservedPod)> = iter.into_iter().collect();
        // Stable: equal UIDs keep their order, so the last is the later.
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out: Vec<(PodUid, ObservedPod)> = Vec::with_capacity(pods.len());
        for p in pods {
            match out.last_mut() {
                Some(last) if last.0 == p.0 => *last = p,
                _ => out.push(p),
            }
        }
        Self(out.into_boxed_slice())
    }
}

impl ObservedNode {
    /// Converts a wire inventory, interning names and paths.
    pub fn from_inventory(inv: &NodeInventory, interner: &mut Interner) -> Self {
        let errs = |errors: &[mountguard_inventory::ReadError], interner: &mut Interner| {
            errors
                .iter()
                .map(|e| ObservedError {
                    path: interner.intern(&e.path),
                    kind: e.kind,
                })
                .collect::<Vec<_>>()
        };
        let pods = inv
            .pods
            .iter()
            .map(|p| {
                let volumes = p
                    .volumes
                    .iter()
                    .map(|v| {
                        let files =
                            interner.intern_files(v.files.iter().map(|(k, d)| (k.as_str(), &d.0)));
                        let errors = errs(&v.errors, interner).into();
                        ObservedVolume {
                            seen: interner.intern_volume_seen(v.plugin, &v.name, files, errors),
                            written_at: v.written_at.map(CompactTime::from),
                        }
                    })
                    .collect();
                let sub_paths = p
                    .sub_paths
                    .iter()
                    .map(|s| ObservedSubPath {
                        volume: interner.intern(&s.volume),
                        container: interner.intern(&s.container),
                        index: s.index,
                        files: interner
                            .intern_files(s.files.iter().map(|(k, d)| (k.as_str(), &d.0))),
                        errors: errs(&s.errors, interner).into(),
                    })
                    .collect();
                (
                    // A UUID's 16 bytes, inline: nothing to share.
                    PodUid::new(&p.uid),
                    ObservedPod::new(volumes, sub_paths, errs(&p.errors, interner)),
                )
            })
            .collect();
        Self {
            node: interner.intern(&inv.node),
            scanned_at: inv.scanned_at,
            pods,
        }
    }
}

/// Parses the read-at-start annotation value: comma separated volume names,
/// blanks ignored.
pub fn parse_read_at_start(value: &str) -> impl Iterator<Item = &str> {
    value.split(',').map(str::trim).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests;
