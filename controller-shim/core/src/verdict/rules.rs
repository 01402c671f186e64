//! The rules: how a verdict is decided. Read top to bottom:
//! 1. [`Ctx::compare`]: expected files against the files the agent read;
//! 2. [`Ctx::classify_mismatch`]: a difference is Propagating within grace,
//!    then Stale (with its cause: an immutable source's cache entry, pinned
//!    or not, or unknown);
//! 3. the verdict of a volume, a subPath mount and an environment
//!    reference (an object recreated with the same content changes
//!    nothing: the history keeps its change time, and without history
//!    [`Ctx::node_shows_current`] reads the node's cached copy off its
//!    volumes);
//! 4. the node rule (KubeletNotSyncing) and the API rule (ApiUnavailable),
//!    applied to a pod's verdicts once its node is done;
//! 5. a terminating pod, whose subjects are all Skipped.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use mountguard_inventory::layout::{SUBPATHS_DIR, VOLUMES_DIR};
use mountguard_inventory::volume_digest;

use super::cache::{CachedVolume, EvalCache, sub_path_scope};
use super::history::{EngineState, NodeHistory};
use super::subject::SubjectId;
use super::types::{
    ApiHealth, Config, FileState, FileVerdict, FrozenCause, StaleCause, State, UnverifiableReason,
    Verdict, VerdictDetail,
};
use super::view::{EngineView, NodeView, PodPrelim, Prelim};
use crate::fingerprint::{Fingerprint, Scope};
use crate::index::{ClusterIndex, PodId};
use crate::model::{CompactTime, Digest, ObservedError, PodModel, SkipReason, SourceRef};
use crate::projection::{ExpectedSubPath, ExpectedVolume, project_env, sub_path_skip};

/// What the node's volumes show of the kubelet's cache entry an env
/// reference reads ([`Ctx::node_shows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NodeShows {
    /// A volume fed by the entry shows the current values.
    Current,
    /// None does, and one shows other bytes: the entry's values differ.
    Older,
    /// No volume tells.
    Nothing,
}

pub(super) struct Ctx<'a> {
    pub(super) engine: EngineView<'a>,
    pub(super) index: &'a ClusterIndex,
    pub(super) state: &'a EngineState,
    pub(super) pod: &'a PodModel,
    pub(super) node: &'a Arc<str>,
    pub(super) now: Timestamp,
    pub(super) cache: &'a EvalCache,
}

/// Result of comparing expected and observed files.
pub(super) struct Comparison {
    pub(super) differing: Vec<Arc<str>>,
    pub(super) files: Vec<FileVerdict>,
    pub(super) unreadable: Vec<Arc<str>>,
    /// Sources (indexes into the volume's sources) involved in differences.
    pub(super) involved: Vec<u16>,
    pub(super) involved_all: bool,
    /// Digest of the compared observed files; `None` when they equal the
    /// expected ones.
    pub(super) observed_digest: Option<Digest>,
}

impl Comparison {
    /// Records expected file `e` (path, digest, source) found in `state`
    /// with `observed` content: `Differs` and `Missing` make it differ (its
    /// source is involved); its file verdict is listed when it is not
    /// `Fresh` or `list_files` asks for every file.
    fn expected_file(
        &mut self,
        scope: &Scope,
        e: &(Arc<str>, Digest, u16),
        state: FileState,
        observed: Option<&Digest>,
        list_files: bool,
    ) {
        if matches!(state, FileState::Differs | FileState::Missing) {
            self.differing.push(e.0.clone());
            self.involved.push(e.2);
        }
        if list_files || state != FileState::Fresh {
            self.files.push(FileVerdict {
                path: e.0.clone(),
                state,
                expected: Some(scope.fingerprint(&e.1)),
                observed: observed.map(|o| scope.fingerprint(o)),
            });
        }
    }
}

impl Ctx<'_> {
    pub(super) fn simple(&self, id: SubjectId, state: State, message: Option<String>) -> Prelim {
        Prelim {
            verdict: Verdict {
                id,
                state,
                underlying: state,
                expected: None,
                observed: None,
                since: self.now.into(),
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
    /// `skip` says whether an observed path is exempt; `scope` keys the
    /// files' fingerprints (their volume's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn compare(
        &self,
        scope: &Scope,
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
                    let state = if e.1 == o.1 {
                        FileState::Fresh
                    } else {
                        FileState::Differs
                    };
                    c.expected_file(scope, e, state, Some(&o.1), list_files);
                    i += 1;
                    j += 1;
                }
                std::cmp::Ordering::Less => {
                    let e = e.unwrap();
                    let state = if err_at(&e.0) {
                        FileState::Unreadable
                    } else {
                        FileState::Missing
                    };
                    c.expected_file(scope, e, state, None, list_files);
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
                            observed: Some(scope.fingerprint(&o.1)),
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
    pub(super) fn classify_mismatch(
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
    pub(super) fn pinning_pods(&self, sources: &[&SourceRef]) -> Vec<Arc<str>> {
        let mut pinned: Vec<Arc<str>> = self
            .index
            .pods_on_node(self.node)
            .iter()
            .filter_map(|id| self.index.pod(*id))
            .filter(|other| other.uid != self.pod.uid && sources.iter().any(|r| other.pins(r)))
            .map(|other| Arc::from(&*other.name))
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
    pub(super) fn cache_predates(&self, r: &SourceRef, changed: Timestamp) -> bool {
        self.index
            .pods_on_node(self.node)
            .iter()
            .filter_map(|id| self.index.pod(*id))
            .any(|p| p.pins(r) && p.synced_at.is_some_and(|t| t.get() < changed))
    }

    /// Whether this node's volumes show that the kubelet's cache entry of
    /// `r` holds the current value of what `env` reads: a volume of a pod
    /// on this node that projects the key (for `envFrom`: every key, the
    /// whole object without `items`, and nothing else) shows the current
    /// bytes there. Volumes and environment variables are filled from the
    /// same entry, one per namespace/name on a node
    /// (`pkg/kubelet/util/manager/watch_based_manager.go`;
    /// `pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables` reads
    /// through `secretManager.GetSecret`), and the AtomicWriter writes what
    /// the entry holds (`pkg/volume/util/atomic_writer.go` `Write`). This
    /// is how an object recreated with the same content is told from one
    /// recreated with new content when the engine has no history of it (a
    /// one-off `verify`, a restarted controller): the cached copy of the
    /// old object shows the current values. `written_by`: only volumes the
    /// kubelet last wrote at or before that time count (what the entry
    /// held then).
    ///
    /// The same volumes are the evidence that the entry holds other values
    /// ([`NodeShows::Older`]): a file of the key (`envFrom`: of any key the
    /// kubelet turns into a variable, or of a key the object no longer has)
    /// with other bytes than the current ones.
    pub(super) fn node_shows(
        &self,
        r: &SourceRef,
        env: &crate::model::EnvRef,
        written_by: Option<Timestamp>,
    ) -> NodeShows {
        use crate::model::{EnvRef, ProjectedSource, SourceKind, VolumeSource};
        let Some(content) = self.index.source(r) else {
            return NodeShows::Nothing;
        };
        let Some(node) = self.index.inventory(self.node) else {
            return NodeShows::Nothing;
        };
        if self.now.duration_since(node.scanned_at) > self.engine.config.inventory_max_age {
            return NodeShows::Nothing;
        }
        let mut older = false;
        let pods = self
            .index
            .pods_on_node(self.node)
            .iter()
            .filter_map(|id| self.index.pod(*id))
            .filter(|p| !p.terminated && *p.namespace() == r.namespace);
        for pod in pods {
            let Some(op) = node.pods.get(&pod.uid) else {
                continue;
            };
            for vol in pod.volumes.iter() {
                let projections: Vec<&crate::model::SourceProjection> = match &*vol.source {
                    VolumeSource::Object(p) => vec![p],
                    VolumeSource::Projected(s) => s
                        .iter()
                        .filter_map(|s| match s {
                            ProjectedSource::Object(p) => Some(p),
                            ProjectedSource::NotFromApi { .. } => None,
                        })
                        .collect(),
                };
                let projections: Vec<_> = projections
                    .into_iter()
                    .filter(|p| p.kind == r.kind && p.name == r.name)
                    .collect();
                if projections.is_empty() {
                    continue;
                }
                let Some(ov) = op.volume(vol.source.plugin(), &vol.name) else {
                    continue;
                };
                if !ov.errors().is_empty()
                    || written_by.is_some_and(|t| ov.written_at.is_none_or(|w| w.get() > t))
                {
                    continue;
                }
                let cv = self.cache.volume(
                    self.engine.fingerprinter,
                    self.index,
                    pod.namespace(),
                    &vol.source,
                );
                let ev = &cv.ev;
                if !ev.missing.is_empty() {
                    continue;
                }
                // The file at `path` comes from `r` (no later projected
                // source overwrites it) and shows the current bytes.
                let current_at = |path: &str| {
                    ev.file(path).is_some_and(|f| {
                        ev.sources[f.source as usize] == *r && ov.file(path) == Some(&f.digest)
                    })
                };
                // The file at `path` comes from `r` and shows other bytes.
                let other_at = |path: &str| {
                    ev.file(path).is_some_and(|f| {
                        ev.sources[f.source as usize] == *r
                            && ov.file(path).is_some_and(|d| *d != f.digest)
                    })
                };
                older |= match env {
                    EnvRef::Key { key, .. } => projections.iter().any(|p| match &p.items {
                        None => other_at(key),
                        Some(items) => items.iter().any(|i| i.key == *key && other_at(&i.path)),
                    }),
                    EnvRef::From { .. } => {
                        projections.iter().any(|p| p.items.is_none())
                            && (content
                                .keys
                                .iter()
                                .filter(|(_, v)| r.kind == SourceKind::Secret || !v.binary)
                                .any(|(k, _)| other_at(k))
                                || ov.files().iter().any(|(path, _)| {
                                    ev.file(path).is_none() && ev.skip_reason(path).is_none()
                                }))
                    }
                    EnvRef::NotFromApi { .. } => false,
                };
                let shows = match env {
                    EnvRef::Key { key, .. } => projections.iter().any(|p| match &p.items {
                        None => current_at(key),
                        Some(items) => items.iter().any(|i| i.key == *key && current_at(&i.path)),
                    }),
                    // Every variable: every key the kubelet turns into one
                    // (a ConfigMap's `data` only), and no file of a key the
                    // current object lacks.
                    EnvRef::From { .. } => {
                        projections.iter().any(|p| p.items.is_none())
                            && content
                                .keys
                                .iter()
                                .filter(|(_, v)| r.kind == SourceKind::Secret || !v.binary)
                                .all(|(k, _)| current_at(k))
                            && ov.files().iter().all(|(path, _)| {
                                ev.file(path).is_some() || ev.skip_reason(path).is_some()
                            })
                    }
                    EnvRef::NotFromApi { .. } => false,
                };
                if shows {
                    return NodeShows::Current;
                }
            }
        }
        if older {
            NodeShows::Older
        } else {
            NodeShows::Nothing
        }
    }

    pub(super) fn unverifiable_for(&self, view: &NodeView<'_>) -> Option<State> {
        match view {
            NodeView::NoInventory => Some(State::Unverifiable(UnverifiableReason::NoInventory)),
            NodeView::TooOld => Some(State::Unverifiable(UnverifiableReason::InventoryTooOld)),
            NodeView::Usable(_) => None,
        }
    }

    /// What a volume's sources decide before anything is compared: a
    /// source the engine cannot follow skips the subject; a missing one
    /// makes it SourceMissing (`consequence`: what the kubelet does then).
    fn source_verdict(
        &self,
        id: SubjectId,
        ev: &ExpectedVolume,
        consequence: Option<&str>,
    ) -> Option<Prelim> {
        if ev.is_unverifiable() {
            let reason = ev
                .skipped
                .first()
                .map_or(SkipReason::UnknownSource, |(_, r)| *r);
            return Some(self.simple(id, State::Skipped(reason), None));
        }
        if !ev.missing.is_empty() {
            let msg = ev
                .missing
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ");
            let msg = match consequence {
                Some(c) => format!("{msg}: {c}"),
                None => msg,
            };
            return Some(self.simple(id, State::SourceMissing, Some(msg)));
        }
        None
    }

    /// A verdict without an observation, with the expected fingerprint.
    fn unobserved(
        &self,
        id: SubjectId,
        state: State,
        message: Option<String>,
        expected: Option<Fingerprint>,
    ) -> Prelim {
        let mut p = self.simple(id, state, message);
        p.verdict.expected = expected;
        p
    }

    /// The subject is absent from the pod's inventory: not on disk, or
    /// unreadable when the agent reported errors above it.
    fn not_observed(
        &self,
        id: SubjectId,
        pod_errors: &[String],
        expected: Option<Fingerprint>,
    ) -> Prelim {
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
        self.unobserved(id, state, msg, expected)
    }

    /// The fingerprint of what the agent saw: the expected one when the
    /// comparison found the same files.
    fn observed_fp(
        scope: &Scope,
        cmp: &Comparison,
        expected: Option<Fingerprint>,
    ) -> Option<Fingerprint> {
        match &cmp.observed_digest {
            Some(d) => Some(scope.fingerprint(d)),
            None => expected,
        }
    }

    /// A comparison the agent could not complete (a file or the volume
    /// unreadable): Unverifiable/ReadError now, its detail saying what.
    fn unreadable(
        &self,
        id: SubjectId,
        fps: (Option<Fingerprint>, Option<Fingerprint>),
        detail: VerdictDetail,
    ) -> Prelim {
        let state = State::Unverifiable(UnverifiableReason::ReadError);
        self.compared(id, state, self.now, fps, detail)
    }

    /// A verdict after a comparison.
    fn compared(
        &self,
        id: SubjectId,
        state: State,
        estimate: Timestamp,
        fps: (Option<Fingerprint>, Option<Fingerprint>),
        detail: VerdictDetail,
    ) -> Prelim {
        let empty = detail == VerdictDetail::default();
        Prelim {
            verdict: Verdict {
                id,
                state,
                underlying: state,
                expected: fps.0,
                observed: fps.1,
                since: self.now.into(),
                detail: (!empty).then(|| Box::new(detail)),
            },
            estimate,
            mutable_mount: false,
        }
    }

    /// The sources a comparison's differences involve (every source when an
    /// unexpected file belongs to none).
    fn involved(ev: &ExpectedVolume, cmp: &Comparison) -> Vec<SourceRef> {
        if cmp.involved_all {
            return ev.sources.clone();
        }
        let mut idx = cmp.involved.clone();
        idx.sort_unstable();
        idx.dedup();
        idx.iter()
            .map(|i| ev.sources[*i as usize].clone())
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn volume_verdict(
        &self,
        id: SubjectId,
        vol: &crate::model::VolumeModel,
        cv: &CachedVolume,
        view: &NodeView<'_>,
        observed_pod: Option<&crate::model::ObservedPod>,
        prev: Option<(bool, Timestamp)>,
    ) -> Prelim {
        let ev = &cv.ev;
        let refused = "the kubelet refuses to set up this volume (a running pod keeps its old content, a new pod does not start)";
        if let Some(p) = self.source_verdict(id, ev, Some(refused)) {
            return p;
        }
        let expected_fp = Some(cv.fp);
        if let Some(state) = self.unverifiable_for(view) {
            return self.unobserved(id, state, None, expected_fp);
        }
        let NodeView::Usable(node) = view else {
            unreachable!("handled above")
        };
        let plugin = vol.source.plugin();
        let pod_errors =
            relevant_pod_errors(observed_pod, &[VOLUMES_DIR, plugin.dir_name(), &vol.name]);
        let Some(ov) = observed_pod.and_then(|p| p.volume(plugin, &vol.name)) else {
            return self.not_observed(id, &pod_errors, expected_fp);
        };
        let mut cmp = self.compare(
            &cv.scope,
            &cv.triples,
            ov.files(),
            ov.errors(),
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
        let fps = (expected_fp, Self::observed_fp(&cv.scope, &cmp, expected_fp));
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
            return self.unreadable(id, fps, detail);
        }
        let written_at = ov.written_at.map_or(node.scanned_at, CompactTime::get);
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
                        c.started_at().is_some_and(|s| {
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
                    // Not Fresh, so its files are listed (all current):
                    // they say what the containers read at start.
                    if detail.files.is_empty() {
                        detail.files = cv
                            .triples
                            .iter()
                            .map(|(path, digest, _)| {
                                let fp = Some(cv.scope.fingerprint(digest));
                                FileVerdict {
                                    path: path.clone(),
                                    state: FileState::Fresh,
                                    expected: fp,
                                    observed: fp,
                                }
                            })
                            .collect();
                    }
                    let frozen = State::Frozen(FrozenCause::ReadAtStart);
                    return self.compared(id, frozen, written_at, fps, detail);
                }
            }
            return self.compared(id, State::Fresh, written_at, fps, detail);
        }
        let involved = Self::involved(ev, &cmp);
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
        self.compared(id, state, start, fps, detail)
    }

    /// What refreshes the content these containers read: a restart, unless
    /// one of them is an init container that never runs again.
    pub(super) fn refresh_advice(&self, containers: &[Arc<str>]) -> String {
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
    pub(super) fn sub_path_verdict(
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
        if let Some(p) = self.source_verdict(id, ev, None) {
            return p;
        }
        let csp = self
            .cache
            .sub_path(self.pod.namespace(), &vol.source, cv, sp);
        let files = match &csp.files {
            ExpectedSubPath::Skipped(r) => {
                return self.simple(id, State::Skipped(*r), None);
            }
            ExpectedSubPath::Files(f) => f,
        };
        let expected_fp = csp.fp;
        if let Some(state) = self.unverifiable_for(view) {
            return self.unobserved(id, state, None, expected_fp);
        }
        let NodeView::Usable(node) = view else {
            unreachable!("handled above")
        };
        let Some(started_at) = c.started_at() else {
            let state = State::Unverifiable(UnverifiableReason::ContainerNotRunning);
            return self.unobserved(id, state, None, expected_fp);
        };
        let index = m.index.to_string();
        let pod_errors =
            relevant_pod_errors(observed_pod, &[SUBPATHS_DIR, &vol.name, &c.name, &index]);
        let Some(os) = observed_pod.and_then(|p| p.sub_path(&vol.name, &c.name, m.index)) else {
            return self.not_observed(id, &pod_errors, expected_fp);
        };
        let mut cmp = self.compare(
            &cv.scope,
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
        let fps = (
            expected_fp,
            Self::observed_fp(&sub_path_scope(cv, sp), &cmp, expected_fp),
        );
        let involved = Self::involved(ev, &cmp);
        let mut detail = VerdictDetail {
            files: cmp.files,
            ..Default::default()
        };
        if !cmp.unreadable.is_empty() {
            detail.message = Some("the agent could not read the subPath target".to_string());
            return self.unreadable(id, fps, detail);
        }
        if cmp.differing.is_empty() {
            return self.compared(id, State::Fresh, started_at, fps, detail);
        }
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
                self.compared(id, state, start, fps, detail)
            }
            _ => {
                detail.message = Some(format!(
                    "subPath mounts never update; container {} started at {started_at}, before the current content: {}",
                    c.name,
                    c.refresh_advice()
                ));
                self.compared(
                    id,
                    State::Frozen(FrozenCause::SubPath),
                    changed_at.unwrap_or(self.now),
                    fps,
                    detail,
                )
            }
        }
    }

    /// Env is filled from the same kubelet cache entry as volumes
    /// (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables` reads
    /// through `secretManager.GetSecret` / `configMapManager.GetConfigMap`)
    /// and fixed when the container starts. A `valueFrom` with no Secret or
    /// ConfigMap behind it (`fileKeyRef`, read from a file of an emptyDir
    /// volume at start) is Skipped: nothing of it is in the API, so it is
    /// never Stale and never remediated.
    pub(super) fn env_verdict(
        &self,
        id: SubjectId,
        c: &crate::model::ContainerModel,
        e: &crate::model::EnvRef,
    ) -> Prelim {
        use crate::model::EnvRef;
        if let EnvRef::NotFromApi { reason, .. } = e {
            return self.env_not_checked(id, *reason);
        }
        let Some(ee) = project_env(self.pod.namespace(), e, |r| self.index.source(r)) else {
            return self.env_not_checked(id, SkipReason::UnknownSource);
        };
        // Keyed to the referenced object: a `valueFrom` value as that key's
        // value, an `envFrom` set as a part of the object.
        let source = self.engine.fingerprinter.source(&ee.source);
        let scope = match e {
            EnvRef::Key { key, .. } => source.key(key),
            EnvRef::From { prefix, .. } => source.part("envFrom", prefix),
            // Returned above.
            EnvRef::NotFromApi { .. } => source,
        };
        let expected = ee.digest.as_ref().map(|d| scope.fingerprint(d));
        let mut p = if let Some(m) = &ee.missing {
            self.simple(
                id,
                State::SourceMissing,
                Some(format!("{m}: the kubelet refuses to start the container")),
            )
        } else if let Some(started_at) = c.started_at() {
            // A `valueFrom` key changes only when that key does; `envFrom`
            // with the object.
            let key = match e {
                EnvRef::Key { key, .. } => Some(&**key),
                _ => None,
            };
            let changed_at = match key {
                Some(key) => self.state.key_changed_at(self.index, &ee.source, key),
                None => self.state.changed_at(self.index, &ee.source),
            };
            let immutable = self.index.source(&ee.source).is_some_and(|s| s.immutable);
            let fresh = || {
                let mut p = self.simple(id, State::Fresh, None);
                p.estimate = started_at;
                p
            };
            match changed_at {
                // The node's cache entry predates the change: the old
                // object's values, unless its volumes show the entry holds
                // the current ones (recreated with the same content).
                // Stale only when they are known to differ: the engine saw
                // the content change, or a volume of the same entry shows
                // other bytes, or the container (re)started after the
                // change and was served the old object. A container that
                // started before the change holds what the object held
                // then, like any env: Frozen while nothing shows that it
                // differs.
                Some(t) if immutable && self.cache_predates(&ee.source, t) => {
                    let known_to_differ = match self.node_shows(&ee.source, e, None) {
                        NodeShows::Current => None,
                        NodeShows::Older => Some(true),
                        NodeShows::Nothing => {
                            Some(started_at > t || self.state.change_seen(&ee.source, key))
                        }
                    };
                    match known_to_differ {
                        None => fresh(),
                        Some(differ) => {
                            self.env_from_cached_copy(id, c, &ee.source, t, started_at, differ)
                        }
                    }
                }
                // Changed after the start, unless a volume the kubelet last
                // wrote before the start shows the current values: then
                // the container got them.
                Some(t)
                    if t > started_at
                        && self.node_shows(&ee.source, e, Some(started_at))
                            != NodeShows::Current =>
                {
                    let mut p = self.simple(id, State::Frozen(FrozenCause::Env),
                        Some(format!(
                            "environment is fixed at start; {} changed at {t}, after container {} started at {started_at}: {}",
                            ee.source, c.name, c.refresh_advice()
                        )),
                    );
                    p.estimate = t;
                    p
                }
                _ => fresh(),
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

    /// An env reference with no Secret or ConfigMap behind it: Skipped,
    /// saying so for `fileKeyRef`.
    fn env_not_checked(&self, id: SubjectId, reason: SkipReason) -> Prelim {
        let message = (reason == SkipReason::FileKeyRef).then(|| {
            "valueFrom.fileKeyRef: read by the kubelet at container start from a file in an emptyDir volume of the pod, not from a Secret or ConfigMap; mountguard does not check it".to_string()
        });
        self.simple(id, State::Skipped(reason), message)
    }

    /// An env reference to immutable `source` recreated at `changed`
    /// while the node's cache entry (held by this pod's registration, at
    /// least) keeps the older object; the container started at
    /// `started_at`.
    ///
    /// Nothing showing that the older values differ from the current ones
    /// (`known_to_differ` false): Frozen/Env, as any env the container read
    /// before a change. A restart reads the same cached copy, so the detail
    /// says so (`cached_env`, read by the advice) and names the other pods
    /// holding the entry.
    ///
    /// Known to differ: the container got (or, restarted, gets again) the
    /// old values. Like a volume mismatch: Propagating within grace, then
    /// Stale, pinned when other pods hold the entry.
    pub(super) fn env_from_cached_copy(
        &self,
        id: SubjectId,
        c: &crate::model::ContainerModel,
        source: &SourceRef,
        changed: Timestamp,
        started_at: Timestamp,
        known_to_differ: bool,
    ) -> Prelim {
        if known_to_differ && self.now.duration_since(changed) < self.engine.config.grace {
            let mut p = self.simple(id, State::Propagating, None);
            p.estimate = changed;
            return p;
        }
        let pinned = self.pinning_pods(&[source]);
        let pods = pinned.iter().map(|s| &**s).collect::<Vec<_>>().join(", ");
        let got = format!(
            "container {} got its environment from the kubelet's cached copy of immutable {source}, older than its recreation at {changed}",
            c.name
        );
        let (state, message, estimate) = if !known_to_differ {
            let held = if pinned.is_empty() {
                "this pod keeps that cache entry".to_string()
            } else {
                format!("this pod and pods {pods} keep that cache entry")
            };
            let message = format!(
                "environment is fixed at start; container {} started at {started_at}, before immutable {source} was recreated at {changed}: it holds the older object's values, which mountguard cannot compare (no history of that object, no volume of it on this node shows them), so they may equal the current ones; {held} alive, so a container restart reads the same values again",
                c.name
            );
            (State::Frozen(FrozenCause::Env), message, changed)
        } else if pinned.is_empty() {
            (
                State::Stale(StaleCause::ImmutableCache),
                format!("{got}; a container restart gets the same values: replace the pod"),
                changed.max(started_at),
            )
        } else {
            (
                State::Stale(StaleCause::ImmutableCachePinned),
                format!(
                    "{got}; pods {pods} on this node keep that cache entry alive, so neither a restart nor replacing this pod alone can help"
                ),
                changed.max(started_at),
            )
        };
        let mut p = self.simple(id, state, Some(message));
        if let Some(d) = p.verdict.detail.as_deref_mut() {
            d.pinned_by = pinned;
            d.cached_env = !known_to_differ;
        }
        p.estimate = estimate;
        p
    }
}

// ------------------------------------------------ the node and API rules

/// The KubeletNotSyncing rule: at least `not_syncing_min_mounts`
/// verifiable mutable volume mounts on the node, and more than half of
/// them stale past grace.
pub(super) fn not_syncing(config: &Config, n: &NodeHistory) -> bool {
    n.mutable_mounts >= config.not_syncing_min_mounts
        && n.stale_mutable_mounts * 2 > n.mutable_mounts
}

/// Whether a volume verdict counts among the node's mutable mounts for the
/// node rule: a mount of only mutable sources whose content was compared
/// (or is read at start).
pub(super) fn counts_for_node_rule(all_mutable: bool, state: State) -> bool {
    all_mutable
        && matches!(
            state,
            State::Fresh
                | State::Propagating
                | State::Stale(_)
                | State::Frozen(FrozenCause::ReadAtStart)
        )
}

/// The node rule on one verdict: on a node where the kubelet is not
/// syncing, a mutable mount stale for no known cause is stale because of
/// the node.
pub(super) fn node_rule(not_syncing: bool, mutable_mount: bool, state: State) -> State {
    if not_syncing && mutable_mount && state == State::Stale(StaleCause::Unknown) {
        State::Stale(StaleCause::KubeletNotSyncing)
    } else {
        state
    }
}

/// The API rule: while a Secret or ConfigMap watch fails, the engine's
/// sources may be old, so no verdict other than Fresh, Skipped and
/// Unverifiable is trusted: it reads `Unverifiable/ApiUnavailable`. API
/// trouble never turns a mount Stale.
pub(super) fn api_rule(api: ApiHealth, state: State) -> State {
    match api {
        ApiHealth::Available => state,
        ApiHealth::Unavailable => {
            if matches!(
                state,
                State::Fresh | State::Skipped(_) | State::Unverifiable(_)
            ) {
                state
            } else {
                State::Unverifiable(UnverifiableReason::ApiUnavailable)
            }
        }
    }
}

// ----------------------------------------------------- terminating pods

/// Every subject of a terminating pod, Skipped: the kubelet no longer
/// refreshes it (see [`SkipReason::PodTerminating`]).
pub(super) fn terminating_pod(id: PodId, pod: &PodModel, now: Timestamp) -> PodPrelim {
    let skipped = |sid: SubjectId| Prelim {
        verdict: Verdict {
            id: sid,
            state: State::Skipped(SkipReason::PodTerminating),
            underlying: State::Skipped(SkipReason::PodTerminating),
            expected: None,
            observed: None,
            since: now.into(),
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
pub(super) fn relevant_pod_errors(
    pod: Option<&crate::model::ObservedPod>,
    path: &[&str],
) -> Vec<String> {
    let Some(pod) = pod else {
        return Vec::new();
    };
    pod.errors()
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

pub(super) fn pod_volume_index(pod: &PodModel, name: &str) -> Option<u16> {
    pod.volumes
        .iter()
        .position(|v| *v.name == *name)
        .map(|i| i as u16)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod kubelet_tests;

#[cfg(test)]
mod same_content_tests;
