//! The in-memory cluster index the engine evaluates: pods, current source
//! content and node inventories, with the two reverse indexes incremental
//! evaluation needs (source -> referencing pods, node -> pods).
//!
//! A caller feeds it with `apply_*`/`delete_*` as watch events and agent
//! reports arrive, then asks which pods a change touches
//! ([`ClusterIndex::pods_referencing`], [`ClusterIndex::pods_on_node`]) and
//! re-evaluates only those.

use foldhash::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use crate::model::{Interner, ObservedNode, PodModel, SourceContent, SourceRef};
use crate::uid::PodUid;

/// Slot of a pod in the index; stable while the pod is in the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(u32);

/// Pods, sources and inventories, indexed.
#[derive(Debug, Default)]
pub struct ClusterIndex {
    /// Shared strings of every model in the index.
    pub interner: Interner,
    pods: Vec<Option<Arc<PodModel>>>,
    free: Vec<u32>,
    /// Slots by the UID of their pod model: a table of bare slots (4 bytes
    /// each) hashed and compared through the model's UID, so no key is
    /// stored beside them.
    by_uid: hashbrown::HashTable<u32>,
    uid_hasher: foldhash::fast::RandomState,
    by_source: HashMap<SourceRef, Vec<PodId>>,
    by_node: HashMap<Arc<str>, Vec<PodId>>,
    sources: HashMap<SourceRef, SourceContent>,
    nodes: HashMap<Arc<str>, ObservedNode>,
}

/// Appends `x` to `list`, growing it by an eighth of its length (at least
/// one) when it is full instead of doubling it: at most about an eighth of
/// its room is spare, where a doubling `Vec` keeps up to half spare (the
/// pod list of a ConfigMap every pod mounts is as long as the cluster).
/// Each push still costs amortized constant time (each value is moved
/// about eight times over the list's growth, not about once).
fn push_tight<T>(list: &mut Vec<T>, x: T) {
    if list.len() == list.capacity() {
        list.reserve_exact(list.len() / 8 + 1);
    }
    list.push(x);
}

/// After removals from `list`: gives back its room once more than a
/// quarter of its length is spare (keeping an eighth), so a list that
/// shrank does not keep its largest size; amortized constant time per
/// removal.
fn trim(list: &mut Vec<PodId>) {
    if list.capacity() - list.len() > list.len() / 4 + 1 {
        list.shrink_to(list.len() + list.len() / 8);
    }
}

/// The pod in `slot`, which `by_uid` lists: a listed slot always holds a
/// pod (slots are listed after their pod is stored and unlisted before it
/// is taken).
fn slot_pod(pods: &[Option<Arc<PodModel>>], slot: u32) -> &PodModel {
    pods[slot as usize]
        .as_deref()
        .expect("a slot listed by UID holds a pod")
}

impl ClusterIndex {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    fn uid_hash(&self, uid: &PodUid) -> u64 {
        self.uid_hasher.hash_one(uid)
    }

    /// Inserts or replaces a pod (by UID).
    pub fn apply_pod(&mut self, pod: PodModel) -> PodId {
        if let Some(old) = self.pod_id(&pod.uid) {
            self.unlink(old);
            self.link(old, &pod);
            self.pods[old.0 as usize] = Some(Arc::new(pod));
            return old;
        }
        let id = match self.free.pop() {
            Some(slot) => PodId(slot),
            None => {
                push_tight(&mut self.pods, None);
                PodId((self.pods.len() - 1) as u32)
            }
        };
        self.link(id, &pod);
        let hash = self.uid_hash(&pod.uid);
        self.pods[id.0 as usize] = Some(Arc::new(pod));
        let (pods, hasher) = (&self.pods, &self.uid_hasher);
        self.by_uid.insert_unique(hash, id.0, |slot| {
            hasher.hash_one(&slot_pod(pods, *slot).uid)
        });
        id
    }

    /// Removes a pod; returns it if it was present.
    pub fn delete_pod(&mut self, uid: &PodUid) -> Option<Arc<PodModel>> {
        let hash = self.uid_hash(uid);
        let pods = &self.pods;
        let entry = self
            .by_uid
            .find_entry(hash, |slot| slot_pod(pods, *slot).uid == *uid)
            .ok()?;
        let id = PodId(entry.remove().0);
        self.unlink(id);
        self.free.push(id.0);
        self.pods[id.0 as usize].take()
    }

    fn link(&mut self, id: PodId, pod: &PodModel) {
        for r in pod.references() {
            push_tight(self.by_source.entry(r).or_default(), id);
        }
        if let Some(node) = pod.node() {
            push_tight(self.by_node.entry(node.clone()).or_default(), id);
        }
    }

    fn unlink(&mut self, id: PodId) {
        let Some(pod) = self.pods[id.0 as usize].as_ref() else {
            return;
        };
        for r in pod.references() {
            if let Some(v) = self.by_source.get_mut(&r) {
                v.retain(|p| *p != id);
                trim(v);
                if v.is_empty() {
                    self.by_source.remove(&r);
                }
            }
        }
        if let Some(node) = pod.node()
            && let Some(v) = self.by_node.get_mut(node)
        {
            v.retain(|p| *p != id);
            trim(v);
            if v.is_empty() {
                self.by_node.remove(node);
            }
        }
    }

    /// Inserts or replaces a source's content. Returns whether its content
    /// (key set or any value) changed.
    pub fn apply_source(&mut self, r: SourceRef, content: SourceContent) -> bool {
        let changed = self
            .sources
            .get(&r)
            .is_none_or(|old| old.content_digest != content.content_digest);
        self.sources.insert(r, content);
        changed
    }

    /// Removes a source; returns whether it was present.
    pub fn delete_source(&mut self, r: &SourceRef) -> bool {
        self.sources.remove(r).is_some()
    }

    /// Inserts or replaces a node inventory.
    pub fn apply_inventory(&mut self, node: ObservedNode) {
        self.nodes.insert(node.node.clone(), node);
    }

    /// Removes a node inventory.
    pub fn delete_inventory(&mut self, node: &str) -> bool {
        self.nodes.remove(node).is_some()
    }

    /// The pod in slot `id`.
    pub fn pod(&self, id: PodId) -> Option<&Arc<PodModel>> {
        self.pods.get(id.0 as usize).and_then(Option::as_ref)
    }

    /// The slot of the pod with this UID.
    pub fn pod_id(&self, uid: &PodUid) -> Option<PodId> {
        self.by_uid
            .find(self.uid_hash(uid), |slot| {
                slot_pod(&self.pods, *slot).uid == *uid
            })
            .map(|slot| PodId(*slot))
    }

    /// Every pod slot in use.
    pub fn pod_ids(&self) -> impl Iterator<Item = PodId> + '_ {
        self.pods
            .iter()
            .enumerate()
            .filter(|(_, p)| p.is_some())
            .map(|(i, _)| PodId(i as u32))
    }

    /// Number of pods.
    pub fn pod_count(&self) -> usize {
        self.by_uid.len()
    }

    /// Pods referencing `r` through a volume, env, envFrom or
    /// imagePullSecrets.
    pub fn pods_referencing(&self, r: &SourceRef) -> &[PodId] {
        self.by_source.get(r).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Pods scheduled on `node`.
    pub fn pods_on_node(&self, node: &str) -> &[PodId] {
        self.by_node.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Pods whose verdicts a change of `pod` (added, changed or deleted) can
    /// affect besides its own: pods on the same node referencing one of the
    /// same sources, whose immutable-cache pin it may create or release.
    /// Call it with the old model on delete.
    pub fn affected_by_pod(&self, pod: &PodModel) -> Vec<PodId> {
        let Some(node) = pod.node() else {
            return Vec::new();
        };
        let refs = pod.references();
        let mut out: Vec<PodId> = self
            .pods_on_node(node)
            .iter()
            .copied()
            .filter(|id| {
                self.pod(*id).is_some_and(|other| {
                    other.uid != pod.uid && refs.iter().any(|r| other.references_source(r))
                })
            })
            .collect();
        out.sort();
        out
    }

    /// Names of nodes with at least one pod.
    pub fn nodes_with_pods(&self) -> impl Iterator<Item = &Arc<str>> {
        self.by_node.keys()
    }

    /// Current content of a source.
    pub fn source(&self, r: &SourceRef) -> Option<&SourceContent> {
        self.sources.get(r)
    }

    /// Every source.
    pub fn sources(&self) -> impl Iterator<Item = (&SourceRef, &SourceContent)> {
        self.sources.iter()
    }

    /// The latest inventory of `node`.
    pub fn inventory(&self, node: &str) -> Option<&ObservedNode> {
        self.nodes.get(node)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{NodeB, PodB, ts};
    use mountguard_inventory::Plugin;

    /// Pods and their observed content are found by UID, whether the UID is
    /// a UUID (held as 16 bytes) or other text, and whichever of the pod
    /// and its inventory came first.
    #[test]
    fn pods_and_observed_pods_are_found_by_uid_in_either_form() {
        let mut ix = ClusterIndex::new();
        let at = ts("2026-11-30T10:00:00Z");
        let uuid = "3f1c2b9a-5d6e-4f70-8a91-b2c3d4e5f607";
        let inv = |uids: &[&str]| {
            uids.iter().fold(NodeB::new("n1", at), |n, uid| {
                n.volume(uid, Plugin::Secret, "etc", &[("k", b"v")], at)
            })
        };
        let id = ix.apply_pod(PodB::new("ns", "p1", uuid, "n1").build());
        inv(&[uuid, "u1", "u9"]).apply(&mut ix);
        let id1 = ix.apply_pod(PodB::new("ns", "p2", "u1", "n1").build());
        let u = PodUid::new;
        assert!(u(uuid).is_compact() && !u("u1").is_compact());
        assert_eq!(ix.pod_id(&u(uuid)), Some(id));
        assert_eq!(ix.pod_id(&u("u1")), Some(id1));
        assert_eq!(ix.pod_id(&u("u9")), None);
        let observed = &ix.inventory("n1").unwrap().pods;
        for uid in [uuid, "u1", "u9"] {
            assert!(observed.contains_key(&u(uid)), "{uid}");
        }
        // Not the same text: not the same pod.
        assert_eq!(ix.pod_id(&u(&uuid.to_uppercase())), None);
        assert_eq!(
            ix.delete_pod(&u(uuid)).map(|p| p.uid.clone()),
            Some(u(uuid))
        );
        assert_eq!(ix.pod_id(&u(uuid)), None);
        assert_eq!(ix.pod_count(), 1);
    }

    /// The per-source and per-node pod lists and the pod slots keep at most
    /// about an eighth of their room spare while pods come, and give room
    /// back as pods go.
    #[test]
    fn pod_lists_keep_little_spare_room() {
        let mut ix = ClusterIndex::new();
        let spare_ok = |len: usize, cap: usize| cap <= len + len / 8 + 1;
        let common = crate::testkit::obj(crate::SourceKind::ConfigMap, "common", &[], false);
        let n = 5_000;
        for i in 0..n {
            let node = format!("n{}", i % 7);
            let p = PodB::new("ns", &format!("p{i}"), &format!("u{i}"), &node)
                .volume("v", crate::model::VolumeSource::Object(common.clone()))
                .build();
            ix.apply_pod(p);
            for list in ix.by_source.values().chain(ix.by_node.values()) {
                assert!(
                    spare_ok(list.len(), list.capacity()),
                    "{} of {}",
                    list.len(),
                    list.capacity()
                );
            }
            assert!(spare_ok(ix.pods.len(), ix.pods.capacity()));
        }
        let r = crate::SourceRef::new(crate::SourceKind::ConfigMap, "ns".into(), "common".into());
        assert_eq!(ix.pods_referencing(&r).len(), n);
        assert_eq!(ix.pods_on_node("n0").len(), n.div_ceil(7));
        // Nine pods in ten go: the lists give their room back.
        for i in (0..n).filter(|i| i % 10 != 0) {
            assert!(ix.delete_pod(&PodUid::new(&format!("u{i}"))).is_some());
        }
        let list = &ix.by_source[&r];
        assert_eq!(list.len(), n / 10);
        assert!(
            list.capacity() <= list.len() + list.len() / 4 + 1,
            "{}",
            list.capacity()
        );
        for list in ix.by_node.values() {
            assert!(list.capacity() <= list.len() + list.len() / 4 + 1);
        }
        // The rest still found by source, node and UID.
        assert!(
            ix.pods_referencing(&r)
                .iter()
                .all(|id| ix.pod(*id).is_some())
        );
        assert_eq!(
            ix.pod_id(&PodUid::new("u10"))
                .and_then(|id| ix.pod(id))
                .map(|p| &*p.name),
            Some("p10")
        );
    }
}
