//! The simulated cluster of the controller benchmarks (`reports`, `heap`):
//! `nodes` x `pods_per_node` pods, each mounting 3 volumes (a ConfigMap
//! shared by all pods, one of [`SECRETS`] Secrets, one of [`CONFIGS`]
//! ConfigMaps), all in namespace [`NS`], and the agents' inventories of
//! them (every mount Fresh).

use std::collections::BTreeMap;

use jiff::Timestamp;
use mountguard_core::model::{
    Interner, PodModel, SourceContent, SourceKind, SourceProjection, SourceRef, VolumeSource,
};
use mountguard_core::testkit::PodB;
use mountguard_inventory::{
    NodeInventory, Plugin, PodInventory, Sha256Hex, VolumeInventory, file_digest, volume_digest,
};

use crate::common::node_name;

/// Distinct Secrets (pod `i` mounts `secret-{i % SECRETS}`).
pub const SECRETS: usize = 1000;
/// Distinct per-app ConfigMaps (pod `i` mounts `app-{i % CONFIGS}`).
pub const CONFIGS: usize = 5000;
/// The one namespace.
pub const NS: &str = "bench";

/// The cluster's size.
#[derive(Debug, Clone, Copy)]
pub struct Cluster {
    /// Nodes.
    pub nodes: usize,
    /// Pods on each node.
    pub pods_per_node: usize,
}

/// The plaintext of source `name` at `version` (one key, `key`).
pub fn value(name: &str, version: u32) -> Vec<u8> {
    format!("{name}:v{version}").into_bytes()
}

fn plugin(kind: SourceKind) -> Plugin {
    match kind {
        SourceKind::Secret => Plugin::Secret,
        SourceKind::ConfigMap => Plugin::Configmap,
    }
}

/// Source `name` of `kind` in [`NS`] at `version`, hashed as the watch
/// edge hashes it.
pub fn source(
    ix: &mut Interner,
    kind: SourceKind,
    name: &str,
    version: u32,
) -> (SourceRef, SourceContent) {
    let r = SourceRef::new(kind, ix.intern(NS), ix.intern(name));
    let v = value(name, version);
    let c = SourceContent::from_plain(
        ix,
        false,
        [("key", v.as_slice(), false)],
        Some(name),
        Some("2026-11-30T08:00:00Z".parse().unwrap()),
    );
    (r, c)
}

/// Every source at version 1: the shared ConfigMap, the Secrets, the
/// per-app ConfigMaps.
pub fn sources(ix: &mut Interner) -> Vec<(SourceRef, SourceContent)> {
    let mut out = vec![source(ix, SourceKind::ConfigMap, "common", 1)];
    for i in 0..SECRETS {
        out.push(source(ix, SourceKind::Secret, &format!("secret-{i}"), 1));
    }
    for i in 0..CONFIGS {
        out.push(source(ix, SourceKind::ConfigMap, &format!("app-{i}"), 1));
    }
    out
}

impl Cluster {
    /// Pods in the cluster.
    pub fn pods(&self) -> usize {
        self.nodes * self.pods_per_node
    }

    /// UID of pod `j` of node `n`: shaped as the API server's (a
    /// 36-character UUID), so each pod's UID string costs what a real one
    /// does.
    pub fn pod_uid(&self, n: usize, j: usize) -> String {
        format!("{n:08x}-{j:04x}-4000-8000-000000000000")
    }

    /// The three sources of pod (n, j).
    pub fn sources_of(&self, n: usize, j: usize) -> [(SourceKind, String); 3] {
        let i = n * self.pods_per_node + j;
        [
            (SourceKind::ConfigMap, "common".to_string()),
            (SourceKind::Secret, format!("secret-{}", i % SECRETS)),
            (SourceKind::ConfigMap, format!("app-{}", i % CONFIGS)),
        ]
    }

    /// The pods of node `n`, built as the pod watch builds them
    /// (`convert::pod`): namespaces, node names, volume names and equal
    /// volume specs shared through `ix`; each pod's UID and name its own.
    pub fn node_pods(&self, ix: &mut Interner, n: usize) -> Vec<PodModel> {
        (0..self.pods_per_node)
            .map(|j| {
                let mut b = PodB::new(
                    NS,
                    &format!("p-{n}-{j}"),
                    &self.pod_uid(n, j),
                    &node_name(n),
                );
                for (vi, (kind, name)) in self.sources_of(n, j).into_iter().enumerate() {
                    b = b.volume(
                        &format!("v{vi}"),
                        VolumeSource::Object(SourceProjection {
                            kind,
                            name: ix.intern(&name),
                            items: None,
                            optional: false,
                        }),
                    );
                }
                let mut pod = b.build();
                let mut vols = pod.volumes.to_vec();
                for v in vols.iter_mut() {
                    v.source = ix.intern_volume_source((*v.source).clone());
                    v.name = ix.intern(&v.name);
                }
                pod.volumes = ix.intern_volumes(vols);
                pod.place = ix.intern_place(NS, Some(&node_name(n)));
                pod
            })
            .collect()
    }

    /// The agent's inventory of node `n` (every file at version 1).
    pub fn inventory(&self, n: usize, generation: u64, at: Timestamp) -> NodeInventory {
        let mut inv = NodeInventory::new(node_name(n), "bench", at);
        inv.generation = generation;
        for j in 0..self.pods_per_node {
            let mut volumes = Vec::new();
            for (vi, (kind, name)) in self.sources_of(n, j).into_iter().enumerate() {
                let mut files = BTreeMap::new();
                files.insert("key".to_string(), Sha256Hex(file_digest(&value(&name, 1))));
                let digest = volume_digest(files.iter().map(|(k, v)| (k.as_str(), &v.0)));
                volumes.push(VolumeInventory {
                    plugin: plugin(kind),
                    name: format!("v{vi}"),
                    data_dir: Some("..2026_11_30_10_00_00.1".into()),
                    written_at: Some("2026-11-30T09:00:00Z".parse().unwrap()),
                    digest: Some(Sha256Hex(digest)),
                    files,
                    modes: BTreeMap::new(),
                    errors: vec![],
                });
            }
            volumes.sort_by(|a, b| (a.plugin, &a.name).cmp(&(b.plugin, &b.name)));
            inv.pods.push(PodInventory {
                uid: self.pod_uid(n, j),
                volumes,
                sub_paths: vec![],
                errors: vec![],
            });
        }
        inv
    }
}
