//! Memoization for one evaluation call: a volume's expected content,
//! subPath projections, fingerprint scope and fingerprints, shared by every
//! pod with the same volume spec in the same namespace.

use foldhash::HashMap;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use mountguard_inventory::volume_digest;

use crate::fingerprint::{Fingerprint, Fingerprinter, Scope};
use crate::index::ClusterIndex;
use crate::model::Digest;
use crate::projection::{ExpectedSubPath, ExpectedVolume, project_sub_path, project_volume};

/// An `Arc` compared and hashed by address: the index's interned parts are
/// shared, so equal pointers mean equal values (while the index is
/// borrowed, nothing is freed, so addresses are not reused).
pub(super) struct ByPtr<T: ?Sized>(Arc<T>);

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
pub(super) struct CachedVolume {
    pub(super) ev: ExpectedVolume,
    pub(super) triples: Vec<(Arc<str>, Digest, u16)>,
    /// What this volume's fingerprints (volume, files, subPaths) are
    /// keyed to: the pod's namespace and the volume's sources.
    pub(super) scope: Scope,
    pub(super) fp: Fingerprint,
}

pub(super) struct CachedSubPath {
    pub(super) files: ExpectedSubPath,
    pub(super) fp: Option<Fingerprint>,
}

pub(super) type VolumeKey = (ByPtr<crate::model::VolumeSource>, ByPtr<str>);
pub(super) type SubPathKey = (VolumeKey, ByPtr<str>);

/// Memoization for one evaluation call (the sources cannot change during
/// it): projections, subPath projections and fingerprints.
#[derive(Default)]
pub(super) struct EvalCache {
    pub(super) volumes: RefCell<HashMap<VolumeKey, Rc<CachedVolume>>>,
    pub(super) sub_paths: RefCell<HashMap<SubPathKey, Rc<CachedSubPath>>>,
}

impl EvalCache {
    pub(super) fn volume(
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
        let scope = f.volume(namespace, source);
        let fp = scope.fingerprint(&ev.digest());
        let c = Rc::new(CachedVolume {
            ev,
            triples,
            scope,
            fp,
        });
        self.volumes.borrow_mut().insert(key, c.clone());
        c
    }

    pub(super) fn sub_path(
        &self,
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
            ExpectedSubPath::Files(files) => Some(
                sub_path_scope(cv, sub_path)
                    .fingerprint(&volume_digest(files.iter().map(|(p, d, _)| (&**p, d)))),
            ),
            ExpectedSubPath::Skipped(_) => None,
        };
        let c = Rc::new(CachedSubPath { files, fp });
        self.sub_paths.borrow_mut().insert(key, c.clone());
        c
    }
}

/// The scope of a subPath's combined content: a part of its volume's.
pub(super) fn sub_path_scope(cv: &CachedVolume, sub_path: &str) -> Scope {
    cv.scope.part("subPath", sub_path)
}
