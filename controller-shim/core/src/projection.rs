//! The kubelet's projection rules: what a volume, a subPath mount or an
//! environment reference should contain, from the pod spec and the current
//! source objects (`pkg/volume/secret`, `configmap`, `projected` and the
//! kubelet's environment code).
//!
//! * Without `items` every key becomes a file named after the key; with
//!   `items` only the listed keys, at their `path` (nested paths allowed).
//! * A missing key is an error unless the reference is `optional`; a
//!   missing `optional` object gives an empty volume (or no contribution to
//!   a projected volume). On error the kubelet refuses to set the volume up
//!   (and so to start the pod) and a running pod keeps what it had.
//! * ConfigMap `items` look in `data`, then `binaryData`; without `items`
//!   both become files.
//! * Projected sources merge in order; a later source overwrites an earlier
//!   one at the same path.
//! * downwardAPI, serviceAccountToken, clusterTrustBundle and podCertificate
//!   paths are not verifiable from the API: they are skipped, not failed.
//! * Environment: `configMapKeyRef` and ConfigMap `envFrom` use `data`
//!   only; Secret references use `data`.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::BTreeMap;
use std::sync::Arc;

use mountguard_inventory::volume_digest;

use crate::model::{
    Digest, EnvRef, ProjectedSource, SkipReason, SourceContent, SourceKind, SourceProjection,
    SourceRef, VolumeSource,
};

/// A file the kubelet should have written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedFile {
    /// Relative path in the volume.
    pub path: Arc<str>,
    /// SHA-256 of its content.
    pub digest: Digest,
    /// Index into [`ExpectedVolume::sources`] of the object it comes from.
    pub source: u16,
}

/// A reference the kubelet cannot resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The object.
    pub source: SourceRef,
    /// The missing key; `None` when the whole object is missing.
    pub key: Option<Arc<str>>,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.key {
            Some(k) => write!(f, "key {k:?} missing in {}", self.source),
            None => write!(f, "{} not found", self.source),
        }
    }
}

/// What a volume should contain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExpectedVolume {
    /// Verifiable files, sorted by path.
    pub files: Vec<ExpectedFile>,
    /// Paths written from outside the API, sorted by path.
    pub skipped: Vec<(Arc<str>, SkipReason)>,
    /// Some source writes paths this version cannot name (an unknown
    /// projected source): files not otherwise expected are then ignored.
    pub unknown_paths: bool,
    /// The Secret/ConfigMap sources referenced, in spec order.
    pub sources: Vec<SourceRef>,
    /// Non-optional objects or keys that do not exist: the kubelet refuses
    /// to set this volume up. When non-empty, `files` is meaningless.
    pub missing: Vec<Missing>,
}

impl ExpectedVolume {
    /// The expected file at `path`.
    pub fn file(&self, path: &str) -> Option<&ExpectedFile> {
        self.files
            .binary_search_by(|f| (*f.path).cmp(path))
            .ok()
            .map(|i| &self.files[i])
    }

    /// Why `path` is skipped, if it is.
    pub fn skip_reason(&self, path: &str) -> Option<SkipReason> {
        self.skipped
            .binary_search_by(|(p, _)| (**p).cmp(path))
            .ok()
            .map(|i| self.skipped[i].1)
    }

    /// Whether nothing in the volume comes from a Secret or ConfigMap.
    pub fn is_unverifiable(&self) -> bool {
        self.sources.is_empty()
    }

    /// Combined digest over the verifiable files.
    pub fn digest(&self) -> Digest {
        volume_digest(self.files.iter().map(|f| (&*f.path, &f.digest)))
    }
}

enum Slot {
    File(Digest, u16),
    Skip(SkipReason),
}

/// Computes the expected content of a volume of a pod in `namespace`.
/// `lookup` returns the current content of a source, `None` when it does not
/// exist.
pub fn project_volume<'a, F>(
    namespace: &Arc<str>,
    volume: &VolumeSource,
    lookup: F,
) -> ExpectedVolume
where
    F: Fn(&SourceRef) -> Option<&'a SourceContent>,
{
    let mut out = ExpectedVolume::default();
    let mut slots: BTreeMap<Arc<str>, Slot> = BTreeMap::new();
    match volume {
        VolumeSource::Object(p) => {
            project_object(namespace, p, &lookup, &mut out, &mut slots);
        }
        VolumeSource::Projected(sources) => {
            for s in sources.iter() {
                match s {
                    ProjectedSource::Object(p) => {
                        project_object(namespace, p, &lookup, &mut out, &mut slots);
                    }
                    ProjectedSource::NotFromApi { reason, paths } => {
                        if paths.is_empty() {
                            out.unknown_paths = true;
                        }
                        for path in paths.iter() {
                            slots.insert(path.clone(), Slot::Skip(*reason));
                        }
                    }
                }
            }
        }
    }
    for (path, slot) in slots {
        match slot {
            Slot::File(digest, source) => out.files.push(ExpectedFile {
                path,
                digest,
                source,
            }),
            Slot::Skip(reason) => out.skipped.push((path, reason)),
        }
    }
    out
}

fn project_object<'a, F>(
    namespace: &Arc<str>,
    p: &SourceProjection,
    lookup: &F,
    out: &mut ExpectedVolume,
    slots: &mut BTreeMap<Arc<str>, Slot>,
) where
    F: Fn(&SourceRef) -> Option<&'a SourceContent>,
{
    let r = SourceRef::new(p.kind, namespace.clone(), p.name.clone());
    let idx = out.sources.len() as u16;
    out.sources.push(r.clone());
    let Some(content) = lookup(&r) else {
        if !p.optional {
            out.missing.push(Missing {
                source: r,
                key: None,
            });
        }
        return;
    };
    match &p.items {
        None => {
            for (k, v) in &content.keys {
                slots.insert(k.clone(), Slot::File(v.digest, idx));
            }
        }
        Some(items) => {
            for item in items.iter() {
                // ConfigMap: `data` first, then `binaryData`. Both live in
                // one map here (the API forbids a key in both).
                match content.keys.get(&item.key) {
                    Some(v) => {
                        slots.insert(item.path.clone(), Slot::File(v.digest, idx));
                    }
                    None if p.optional => {}
                    None => out.missing.push(Missing {
                        source: r.clone(),
                        key: Some(item.key.clone()),
                    }),
                }
            }
        }
    }
}

/// What a subPath mount should show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpectedSubPath {
    /// Relative path ("" when the subPath is a single file) -> expected file.
    Files(Vec<(Arc<str>, Digest, u16)>),
    /// The subPath names content not verifiable from the API.
    Skipped(SkipReason),
}

/// Normalizes a subPath the way it addresses volume paths: no leading `./`,
/// no trailing or repeated `/`.
pub fn normalize_sub_path(sub_path: &str) -> String {
    sub_path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect::<Vec<_>>()
        .join("/")
}

/// The expected content of `sub_path` of a volume.
pub fn project_sub_path(volume: &ExpectedVolume, sub_path: &str) -> ExpectedSubPath {
    let sp = normalize_sub_path(sub_path);
    if let Some(f) = volume.file(&sp) {
        return ExpectedSubPath::Files(vec![(Arc::from(""), f.digest, f.source)]);
    }
    if let Some(reason) = volume.skip_reason(&sp) {
        return ExpectedSubPath::Skipped(reason);
    }
    let prefix = if sp.is_empty() {
        String::new()
    } else {
        format!("{sp}/")
    };
    let files = volume
        .files
        .iter()
        .filter_map(|f| {
            f.path
                .strip_prefix(prefix.as_str())
                .map(|rel| (Arc::from(rel), f.digest, f.source))
        })
        .collect();
    ExpectedSubPath::Files(files)
}

/// Whether a path of a subPath target is skipped.
pub fn sub_path_skip(volume: &ExpectedVolume, sub_path: &str, rel: &str) -> Option<SkipReason> {
    let sp = normalize_sub_path(sub_path);
    let full = match (sp.is_empty(), rel.is_empty()) {
        (true, _) => rel.to_string(),
        (false, true) => sp,
        (false, false) => format!("{sp}/{rel}"),
    };
    volume.skip_reason(&full)
}

/// What an environment reference should have given the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpectedEnv {
    /// The object referenced.
    pub source: SourceRef,
    /// Digest of the value (`valueFrom`), or of the variable set (`envFrom`:
    /// [`volume_digest`] over `prefix + key` -> value digest); `None` when
    /// the optional object or key is absent (nothing is set).
    pub digest: Option<Digest>,
    /// The non-optional object or key that is missing: the kubelet refuses
    /// to start the container.
    pub missing: Option<Missing>,
}

/// Computes the expected content of an environment reference; `None` for
/// one with no Secret or ConfigMap behind it ([`EnvRef::NotFromApi`]).
pub fn project_env<'a, F>(namespace: &Arc<str>, env: &EnvRef, lookup: F) -> Option<ExpectedEnv>
where
    F: Fn(&SourceRef) -> Option<&'a SourceContent>,
{
    let (kind, name) = env.target()?;
    let source = SourceRef::new(kind, namespace.clone(), name.clone());
    let content = lookup(&source);
    Some(match env {
        EnvRef::NotFromApi { .. } => return None,
        EnvRef::Key { key, optional, .. } => {
            let value = content.and_then(|c| c.keys.get(key)).filter(|v| {
                // configMapKeyRef reads `data` only.
                kind == SourceKind::Secret || !v.binary
            });
            match value {
                Some(v) => ExpectedEnv {
                    source,
                    digest: Some(v.digest),
                    missing: None,
                },
                None => {
                    let missing = (!optional).then(|| Missing {
                        source: source.clone(),
                        key: content.map(|_| key.clone()),
                    });
                    ExpectedEnv {
                        source,
                        digest: None,
                        missing,
                    }
                }
            }
        }
        EnvRef::From {
            prefix, optional, ..
        } => match content {
            Some(c) => {
                let vars: Vec<(String, Digest)> = c
                    .keys
                    .iter()
                    .filter(|(_, v)| kind == SourceKind::Secret || !v.binary)
                    .map(|(k, v)| (format!("{prefix}{k}"), v.digest))
                    .collect();
                ExpectedEnv {
                    source,
                    digest: Some(volume_digest(vars.iter().map(|(k, d)| (k.as_str(), d)))),
                    missing: None,
                }
            }
            None => ExpectedEnv {
                missing: (!optional).then(|| Missing {
                    source: source.clone(),
                    key: None,
                }),
                source,
                digest: None,
            },
        },
    })
}

#[cfg(test)]
mod tests;
