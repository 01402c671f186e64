//! Helpers shared by the engine's tests: an engine, a verdict finder and
//! small cluster layouts.

use std::sync::Arc;

use jiff::Timestamp;
use mountguard_inventory::{Plugin, file_digest};

use crate::fingerprint::{Fingerprinter, Scope};
use crate::index::ClusterIndex;
use crate::model::{SourceKind, VolumeSource};
use crate::testkit::*;
use crate::verdict::{Config, Engine, Evaluation, State, Subject, Verdict};

pub(crate) type Values<'a> = Vec<(&'a str, &'a [u8])>;

pub(crate) type VolumeCase<'a> = (&'a str, &'a str, bool, &'a [u8], &'a [u8], State);

pub(crate) const KEY: &[u8] = b"test-installation-key-0123456789";

pub(crate) const SECRET: SourceKind = SourceKind::Secret;

pub(crate) const CM: SourceKind = SourceKind::ConfigMap;

pub(crate) fn engine() -> Engine {
    Engine::new(Config::default(), Fingerprinter::new(KEY).unwrap())
}

pub(crate) fn d(b: &[u8]) -> [u8; 32] {
    file_digest(b)
}

pub(crate) fn ns() -> Arc<str> {
    a("ns")
}

pub(crate) const START: &str = "2026-11-30T10:00:00Z";

pub(crate) const SCAN: &str = "2026-11-30T11:00:00Z";

pub(crate) const NOW: &str = "2026-11-30T11:00:30Z";

pub(crate) fn verdict<'a>(
    eval: &'a Evaluation,
    pod: &str,
    want: impl Fn(&Subject) -> bool,
) -> &'a Verdict {
    eval.iter()
        .find(|(p, v)| &*p.pod.name == pod && want(&p.subject(v)))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no verdict for {pod}: {eval:#?}"))
}

/// The fingerprint scope of `pod`'s volume `volume` under [`KEY`], as the
/// fingerprinter defines it (the pod's namespace and the volume's sources).
pub(crate) fn volume_scope(eval: &Evaluation, pod: &str, volume: &str) -> Scope {
    let (p, _) = eval
        .iter()
        .find(|(p, _)| &*p.pod.name == pod)
        .unwrap_or_else(|| panic!("no pod {pod}"));
    let v = p
        .pod
        .volumes
        .iter()
        .find(|v| &*v.name == volume)
        .unwrap_or_else(|| panic!("no volume {volume} in {pod}"));
    Fingerprinter::new(KEY)
        .unwrap()
        .volume(p.pod.namespace(), &v.source)
}

pub(crate) fn vol(name: &'static str) -> impl Fn(&Subject) -> bool {
    move |s| matches!(s, Subject::Volume { volume } if &**volume == name)
}

/// Whether a subject is `container`'s environment variable `var`.
pub(crate) fn env(container: &'static str, var: &'static str) -> impl Fn(&Subject) -> bool {
    move |s| matches!(s, Subject::Env { container: c, var: v } if &**c == container && &**v == var)
}

/// The pods pinning the cache entry `v` is about.
pub(crate) fn pinning_pods(v: &Verdict) -> Vec<&str> {
    v.pinned_by().iter().map(|s| &**s).collect()
}

/// One secret volume `v` of secret `s` mounted in pod `p` on `node-a`; the
/// secret changed at `changed`, the node shows `on_disk`.
pub(crate) fn single(
    changed: &str,
    immutable: bool,
    current: &[u8],
    on_disk: &[u8],
) -> (ClusterIndex, Timestamp) {
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("k", current)],
        immutable,
        Some(ts(changed)),
    );
    ix.apply_pod(
        PodB::new("ns", "p", "uid-p", "node-a")
            .volume("v", VolumeSource::Object(obj(SECRET, "s", &[], false)))
            .container("c", Some(ts(START)), &[], vec![])
            .build(),
    );
    NodeB::new("node-a", ts(SCAN))
        .volume("uid-p", Plugin::Secret, "v", &[("k", on_disk)], ts(START))
        .apply(&mut ix);
    (ix, ts(NOW))
}

/// `n` pods on node-a, each with one ConfigMap volume; `stale` of them show
/// old content long after the change.
pub(crate) fn node_with(n: usize, stale: usize) -> (ClusterIndex, Timestamp) {
    let mut ix = ClusterIndex::new();
    let mut node = NodeB::new("node-a", ts(SCAN));
    for i in 0..n {
        let cm = format!("cm-{i}");
        put_source(
            &mut ix,
            CM,
            "ns",
            &cm,
            &[("f", b"new")],
            false,
            Some(ts("2026-11-30T10:30:00Z")),
        );
        let uid = format!("uid-{i}");
        ix.apply_pod(
            PodB::new("ns", &format!("p{i}"), &uid, "node-a")
                .volume("v", VolumeSource::Object(obj(CM, &cm, &[], false)))
                .build(),
        );
        let content: &[u8] = if i < stale { b"old" } else { b"new" };
        node = node.volume(&uid, Plugin::Configmap, "v", &[("f", content)], ts(START));
    }
    node.apply(&mut ix);
    (ix, ts(NOW))
}

pub(crate) fn ix_clone(ix: &ClusterIndex) -> ClusterIndex {
    let mut out = ClusterIndex::new();
    for (r, c) in ix.sources() {
        out.apply_source(r.clone(), c.clone());
    }
    for id in ix.pod_ids() {
        out.apply_pod((**ix.pod(id).unwrap()).clone());
    }
    out
}
