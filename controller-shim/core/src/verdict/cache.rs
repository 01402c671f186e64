//! Memoization for one evaluation call: a volume's expected content,
//! subPath projections and fingerprints, shared by every pod with the same
//! volume spec in the same namespace.

use foldhash::HashMap;
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use mountguard_inventory::volume_digest;

use crate::fingerprint::{Fingerprint, Fingerprinter};
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
    pub(super) fps: RefCell<HashMap<Digest, Fingerprint>>,
}

impl EvalCache {
    pub(super) fn fp(&self, f: &Fingerprinter, d: &Digest) -> Fingerprint {
        *self
            .fps
            .borrow_mut()
            .entry(*d)
            .or_insert_with(|| f.fingerprint(d))
    }

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
        let fp = self.fp(f, &ev.digest());
        let c = Rc::new(CachedVolume { ev, triples, fp });
        self.volumes.borrow_mut().insert(key, c.clone());
        c
    }

    pub(super) fn sub_path(
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

pub(super) fn fp_opt(f: &Fingerprinter, d: Option<&Digest>) -> Option<Fingerprint> {
    d.map(|d| f.fingerprint(d))
}
