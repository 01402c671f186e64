//! Builders for tests and the benchmark: pods, sources and inventories from
//! plain values, without the Kubernetes JSON round trip.

#![allow(missing_docs)]

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use mountguard_inventory::{
    NodeInventory, Plugin, PodInventory, ReadError, ReadErrorKind, Sha256Hex, SubPathInventory,
    VolumeInventory, file_digest, volume_digest,
};

use crate::index::ClusterIndex;
use crate::model::{
    ContainerKind, ContainerModel, EnvRef, ExtraRefs, KeyToPath, MountModel, ObservedNode,
    PodModel, PodPlace, ProjectedSource, SkipReason, SourceContent, SourceKind, SourceProjection,
    SourceRef, VolumeList, VolumeModel, VolumeSource,
};

/// Parses an RFC 3339 time (panics on bad input: tests only).
pub fn ts(s: &str) -> Timestamp {
    s.parse().expect("valid test timestamp")
}

pub fn a(s: &str) -> Arc<str> {
    Arc::from(s)
}

/// A pod UID from its text.
pub fn uid(s: &str) -> crate::uid::PodUid {
    crate::uid::PodUid::new(s)
}

/// Adds a Secret or ConfigMap with plaintext values (hashed on the way in).
pub fn put_source(
    ix: &mut ClusterIndex,
    kind: SourceKind,
    ns: &str,
    name: &str,
    values: &[(&str, &[u8])],
    immutable: bool,
    last_write: Option<Timestamp>,
) -> SourceRef {
    let r = SourceRef::new(kind, ix.interner.intern(ns), ix.interner.intern(name));
    let c = SourceContent::from_plain(
        &mut ix.interner,
        immutable,
        values.iter().map(|(k, v)| (*k, *v, false)),
        None,
        last_write,
    );
    ix.apply_source(r.clone(), c);
    r
}

/// Adds a ConfigMap with `data` and `binaryData`.
pub fn put_config_map(
    ix: &mut ClusterIndex,
    ns: &str,
    name: &str,
    data: &[(&str, &[u8])],
    binary: &[(&str, &[u8])],
    last_write: Option<Timestamp>,
) -> SourceRef {
    let r = SourceRef::new(
        SourceKind::ConfigMap,
        ix.interner.intern(ns),
        ix.interner.intern(name),
    );
    let c = SourceContent::from_plain(
        &mut ix.interner,
        false,
        data.iter()
            .map(|(k, v)| (*k, *v, false))
            .chain(binary.iter().map(|(k, v)| (*k, *v, true))),
        None,
        last_write,
    );
    ix.apply_source(r.clone(), c);
    r
}

pub fn obj(
    kind: SourceKind,
    name: &str,
    items: &[(&str, &str)],
    optional: bool,
) -> SourceProjection {
    SourceProjection {
        kind,
        name: a(name),
        items: (!items.is_empty()).then(|| {
            items
                .iter()
                .map(|(k, p)| KeyToPath {
                    key: a(k),
                    path: a(p),
                })
                .collect()
        }),
        optional,
    }
}

pub fn not_from_api(reason: SkipReason, paths: &[&str]) -> ProjectedSource {
    ProjectedSource::NotFromApi {
        reason,
        paths: paths.iter().map(|p| a(p)).collect(),
    }
}

/// The projected volume the API server injects as `kube-api-access-*`.
pub fn kube_api_access() -> VolumeSource {
    VolumeSource::Projected(Box::new([
        not_from_api(SkipReason::ServiceAccountToken, &["token"]),
        ProjectedSource::Object(obj(
            SourceKind::ConfigMap,
            "kube-root-ca.crt",
            &[("ca.crt", "ca.crt")],
            false,
        )),
        not_from_api(SkipReason::DownwardApi, &["namespace"]),
    ]))
}

/// A pod under construction.
#[derive(Debug, Clone)]
pub struct PodB {
    pub pod: PodModel,
}

impl PodB {
    pub fn new(ns: &str, name: &str, uid: &str, node: &str) -> Self {
        Self {
            pod: PodModel {
                uid: self::uid(uid),
                place: PodPlace::new(a(ns), Some(a(node))),
                name: name.into(),
                terminated: false,
                terminating: false,
                synced_at: Some(ts("2026-01-01T00:00:00Z").into()),
                ready: true,
                slinky: None,
                workload: None,
                volumes: VolumeList::default(),
                containers: Box::new([]),
                extra_refs: Default::default(),
            },
        }
    }

    pub fn volume(mut self, name: &str, source: VolumeSource) -> Self {
        let mut v = self.pod.volumes.to_vec();
        v.push(VolumeModel {
            name: a(name),
            source: Arc::new(source),
            read_at_start: false,
        });
        self.pod.volumes = Arc::new(v.into_boxed_slice());
        self
    }

    pub fn read_at_start(mut self, volume: &str) -> Self {
        let mut vols = self.pod.volumes.to_vec();
        for v in vols.iter_mut() {
            if &*v.name == volume {
                v.read_at_start = true;
            }
        }
        self.pod.volumes = Arc::new(vols.into_boxed_slice());
        self
    }

    /// Adds a container; `mounts` are (volume name, subPath or "").
    pub fn container(
        self,
        name: &str,
        started_at: Option<Timestamp>,
        mounts: &[(&str, &str)],
        env: Vec<EnvRef>,
    ) -> Self {
        self.container_of(ContainerKind::Regular, false, name, started_at, mounts, env)
    }

    /// Adds an init container; `finished`: it ran to completion at
    /// `started_at` (not a sidecar).
    pub fn init_container(
        self,
        name: &str,
        started_at: Option<Timestamp>,
        finished: bool,
        mounts: &[(&str, &str)],
        env: Vec<EnvRef>,
    ) -> Self {
        self.container_of(ContainerKind::Init, finished, name, started_at, mounts, env)
    }

    /// Adds a (running) ephemeral container.
    pub fn ephemeral_container(
        self,
        name: &str,
        started_at: Option<Timestamp>,
        env: Vec<EnvRef>,
    ) -> Self {
        self.container_of(ContainerKind::Ephemeral, false, name, started_at, &[], env)
    }

    fn container_of(
        mut self,
        kind: ContainerKind,
        finished: bool,
        name: &str,
        started_at: Option<Timestamp>,
        mounts: &[(&str, &str)],
        env: Vec<EnvRef>,
    ) -> Self {
        let mounts = mounts
            .iter()
            .enumerate()
            .map(|(i, (vol, sp))| MountModel {
                index: i as u32,
                volume: self
                    .pod
                    .volumes
                    .iter()
                    .position(|v| &*v.name == *vol)
                    .expect("mount of a declared volume") as u16,
                sub_path: (!sp.is_empty()).then(|| a(sp)),
                sub_path_expr: false,
            })
            .collect();
        let mut c = self.pod.containers.into_vec();
        c.push(ContainerModel {
            name: a(name),
            kind,
            started: started_at.map(Into::into),
            finished,
            mounts,
            env: env.into(),
        });
        self.pod.containers = c.into();
        self
    }

    /// `imagePullSecrets`.
    pub fn image_pull_secret(mut self, name: &str) -> Self {
        let refs = &self.pod.extra_refs;
        let mut v = refs.image_pull_secrets().to_vec();
        v.push(a(name));
        self.pod.extra_refs = ExtraRefs::new(v, refs.other_refs().to_vec());
        self
    }

    /// A reference with no verdict of its own (e.g. a CSI
    /// `nodePublishSecretRef`).
    pub fn other_ref(mut self, kind: SourceKind, name: &str) -> Self {
        let refs = &self.pod.extra_refs;
        let mut v = refs.other_refs().to_vec();
        v.push((kind, a(name)));
        self.pod.extra_refs = ExtraRefs::new(refs.image_pull_secrets().to_vec(), v);
        self
    }

    /// `status.startTime` (`None`: the kubelet has not synced the pod).
    pub fn synced_at(mut self, t: Option<Timestamp>) -> Self {
        self.pod.synced_at = t.map(Into::into);
        self
    }

    /// `metadata.deletionTimestamp` is set.
    pub fn terminating(mut self) -> Self {
        self.pod.terminating = true;
        self
    }

    /// No node (unscheduled).
    pub fn unscheduled(mut self) -> Self {
        self.pod.set_node(None);
        self
    }

    pub fn terminated(mut self) -> Self {
        self.pod.terminated = true;
        self
    }

    pub fn build(self) -> PodModel {
        self.pod
    }
}

pub fn env_key(var: &str, kind: SourceKind, name: &str, key: &str, optional: bool) -> EnvRef {
    EnvRef::Key {
        var: a(var),
        kind,
        name: a(name),
        key: a(key),
        optional,
    }
}

pub fn env_from(kind: SourceKind, name: &str, prefix: &str, optional: bool) -> EnvRef {
    EnvRef::From {
        kind,
        name: a(name),
        prefix: a(prefix),
        optional,
    }
}

/// An inventory under construction.
#[derive(Debug, Clone)]
pub struct NodeB {
    pub inv: NodeInventory,
}

fn files(content: &[(&str, &[u8])]) -> BTreeMap<String, Sha256Hex> {
    content
        .iter()
        .map(|(p, b)| (p.to_string(), Sha256Hex(file_digest(b))))
        .collect()
}

impl NodeB {
    pub fn new(node: &str, scanned_at: Timestamp) -> Self {
        Self {
            inv: NodeInventory::new(node, "test", scanned_at),
        }
    }

    fn pod_mut(&mut self, uid: &str) -> &mut PodInventory {
        if self.inv.pod(uid).is_none() {
            self.inv.pods.push(PodInventory {
                uid: uid.to_string(),
                volumes: vec![],
                sub_paths: vec![],
                errors: vec![],
            });
        }
        self.inv
            .pods
            .iter_mut()
            .find(|p| p.uid == uid)
            .expect("just added")
    }

    /// A volume with these files (plaintext, hashed here).
    pub fn volume(
        mut self,
        uid: &str,
        plugin: Plugin,
        name: &str,
        content: &[(&str, &[u8])],
        written_at: Timestamp,
    ) -> Self {
        let files = files(content);
        let digest = volume_digest(files.iter().map(|(k, v)| (k.as_str(), &v.0)));
        self.pod_mut(uid).volumes.push(VolumeInventory {
            plugin,
            name: name.to_string(),
            data_dir: Some("..2026_11_30_10_00_00.1".into()),
            written_at: Some(written_at),
            digest: Some(Sha256Hex(digest)),
            files,
            modes: BTreeMap::new(),
            errors: vec![],
        });
        self
    }

    /// Adds a read error to the last volume of `uid`.
    pub fn volume_error(mut self, uid: &str, path: &str, kind: ReadErrorKind) -> Self {
        let v = self
            .pod_mut(uid)
            .volumes
            .last_mut()
            .expect("volume_error after volume");
        v.digest = None;
        v.files.remove(path);
        v.errors.push(ReadError {
            path: path.to_string(),
            kind,
            message: "test".into(),
        });
        self
    }

    pub fn sub_path(
        mut self,
        uid: &str,
        volume: &str,
        container: &str,
        index: u32,
        content: &[(&str, &[u8])],
    ) -> Self {
        self.pod_mut(uid).sub_paths.push(SubPathInventory {
            volume: volume.to_string(),
            container: container.to_string(),
            index,
            files: files(content),
            errors: vec![],
        });
        self
    }

    /// Applies the inventory to the index.
    pub fn apply(self, ix: &mut ClusterIndex) {
        let obs = ObservedNode::from_inventory(&self.inv, &mut ix.interner);
        ix.apply_inventory(obs);
    }
}
