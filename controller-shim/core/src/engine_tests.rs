//! Table-driven tests of the projection rules and of every verdict state and
//! cause.

use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use mountguard_inventory::{Plugin, ReadErrorKind, file_digest, volume_digest};

use crate::fingerprint::Fingerprinter;
use crate::index::ClusterIndex;
use crate::model::{ProjectedSource, SkipReason, SourceKind, VolumeSource};
use crate::projection::{ExpectedSubPath, project_env, project_sub_path, project_volume};
use crate::testkit::*;
use crate::verdict::{
    ApiHealth, Config, Engine, EngineState, Evaluation, FileState, FrozenCause, StaleCause, State,
    Subject, UnverifiableReason, Verdict,
};

type Values<'a> = Vec<(&'a str, &'a [u8])>;
type VolumeCase<'a> = (&'a str, &'a str, bool, &'a [u8], &'a [u8], State);

const KEY: &[u8] = b"test-installation-key-0123456789";
const SECRET: SourceKind = SourceKind::Secret;
const CM: SourceKind = SourceKind::ConfigMap;

fn engine() -> Engine {
    Engine::new(Config::default(), Fingerprinter::new(KEY).unwrap())
}

fn d(b: &[u8]) -> [u8; 32] {
    file_digest(b)
}

fn ns() -> Arc<str> {
    a("ns")
}

// ---------------------------------------------------------------- projection

/// (case, volume, sources, expected files (path, content, source index),
/// expected skipped paths, expected missing descriptions)
#[test]
fn projection_rules_table() {
    type Case<'a> = (
        &'a str,
        VolumeSource,
        Vec<(&'a str, &'a str, Vec<(&'a str, &'a [u8])>, bool)>,
        Vec<(&'a str, &'a [u8], u16)>,
        Vec<(&'a str, SkipReason)>,
        Vec<&'a str>,
    );
    let cases: Vec<Case> = vec![
        (
            "secret without items: every key is a file named after the key",
            VolumeSource::Object(obj(SECRET, "s", &[], false)),
            vec![("Secret", "s", vec![("a", b"1"), ("b.conf", b"2")], false)],
            vec![("a", b"1", 0), ("b.conf", b"2", 0)],
            vec![],
            vec![],
        ),
        (
            "items select keys and place them at nested paths",
            VolumeSource::Object(obj(SECRET, "s", &[("a", "x/y/z.key"), ("b", "top")], false)),
            vec![(
                "Secret",
                "s",
                vec![("a", b"1"), ("b", b"2"), ("c", b"3")],
                false,
            )],
            vec![("top", b"2", 0), ("x/y/z.key", b"1", 0)],
            vec![],
            vec![],
        ),
        (
            "optional missing secret gives an empty volume",
            VolumeSource::Object(obj(SECRET, "gone", &[], true)),
            vec![],
            vec![],
            vec![],
            vec![],
        ),
        (
            "non-optional missing secret: the kubelet refuses",
            VolumeSource::Object(obj(SECRET, "gone", &[], false)),
            vec![],
            vec![],
            vec![],
            vec!["Secret/ns/gone not found"],
        ),
        (
            "missing key in items, not optional: refused",
            VolumeSource::Object(obj(SECRET, "s", &[("nokey", "p")], false)),
            vec![("Secret", "s", vec![("a", b"1")], false)],
            vec![],
            vec![],
            vec!["key \"nokey\" missing in Secret/ns/s"],
        ),
        (
            "missing key in items, optional: skipped silently",
            VolumeSource::Object(obj(SECRET, "s", &[("nokey", "p"), ("a", "a")], true)),
            vec![("Secret", "s", vec![("a", b"1")], false)],
            vec![("a", b"1", 0)],
            vec![],
            vec![],
        ),
        (
            "configMap data and binaryData both become files",
            VolumeSource::Object(obj(CM, "c", &[], false)),
            vec![
                ("ConfigMap", "c", vec![("text", b"t")], false),
                (
                    "ConfigMap-binary",
                    "c",
                    vec![("blob", &[0, 159, 146, 150])],
                    false,
                ),
            ],
            vec![("blob", &[0, 159, 146, 150], 0), ("text", b"t", 0)],
            vec![],
            vec![],
        ),
        (
            "configMap items find binaryData keys",
            VolumeSource::Object(obj(CM, "c", &[("blob", "bin/blob")], false)),
            vec![
                ("ConfigMap", "c", vec![("text", b"t")], false),
                ("ConfigMap-binary", "c", vec![("blob", b"B")], false),
            ],
            vec![("bin/blob", b"B", 0)],
            vec![],
            vec![],
        ),
        (
            "projected sources overlap: the later source wins",
            VolumeSource::Projected(Box::new([
                ProjectedSource::Object(obj(SECRET, "first", &[], false)),
                ProjectedSource::Object(obj(CM, "second", &[], false)),
            ])),
            vec![
                (
                    "Secret",
                    "first",
                    vec![("shared", b"from-secret"), ("only1", b"1")],
                    false,
                ),
                ("ConfigMap", "second", vec![("shared", b"from-cm")], false),
            ],
            vec![("only1", b"1", 0), ("shared", b"from-cm", 1)],
            vec![],
            vec![],
        ),
        (
            "projected: optional missing source contributes nothing",
            VolumeSource::Projected(Box::new([
                ProjectedSource::Object(obj(SECRET, "gone", &[], true)),
                ProjectedSource::Object(obj(CM, "c", &[], false)),
            ])),
            vec![("ConfigMap", "c", vec![("k", b"v")], false)],
            vec![("k", b"v", 1)],
            vec![],
            vec![],
        ),
        (
            "projected: paths from outside the API are skipped; a later downwardAPI item overrides a key",
            VolumeSource::Projected(Box::new([
                ProjectedSource::Object(obj(SECRET, "s", &[], false)),
                not_from_api(SkipReason::ServiceAccountToken, &["token"]),
                not_from_api(SkipReason::DownwardApi, &["labels", "a"]),
                not_from_api(SkipReason::ClusterTrustBundle, &["bundle.pem"]),
                not_from_api(SkipReason::PodCertificate, &["cred.pem"]),
            ])),
            vec![("Secret", "s", vec![("a", b"1"), ("b", b"2")], false)],
            vec![("b", b"2", 0)],
            vec![
                ("a", SkipReason::DownwardApi),
                ("bundle.pem", SkipReason::ClusterTrustBundle),
                ("cred.pem", SkipReason::PodCertificate),
                ("labels", SkipReason::DownwardApi),
                ("token", SkipReason::ServiceAccountToken),
            ],
            vec![],
        ),
        (
            "kube-api-access: only ca.crt is verifiable",
            kube_api_access(),
            vec![(
                "ConfigMap",
                "kube-root-ca.crt",
                vec![("ca.crt", b"CA")],
                false,
            )],
            vec![("ca.crt", b"CA", 0)],
            vec![
                ("namespace", SkipReason::DownwardApi),
                ("token", SkipReason::ServiceAccountToken),
            ],
            vec![],
        ),
    ];
    for (name, vol, sources, files, skipped, missing) in cases {
        let mut ix = ClusterIndex::new();
        let mut cm_data: std::collections::BTreeMap<&str, (Values, Values)> = Default::default();
        for (kind, n, values, immutable) in &sources {
            match *kind {
                "Secret" => {
                    put_source(&mut ix, SECRET, "ns", n, values, *immutable, None);
                }
                "ConfigMap" => cm_data
                    .entry(n)
                    .or_default()
                    .0
                    .extend(values.iter().copied()),
                _ => cm_data
                    .entry(n)
                    .or_default()
                    .1
                    .extend(values.iter().copied()),
            }
        }
        for (n, (data, binary)) in cm_data {
            put_config_map(&mut ix, "ns", n, &data, &binary, None);
        }
        let ev = project_volume(&ns(), &vol, |r| ix.source(r));
        let got: Vec<(String, [u8; 32], u16)> = ev
            .files
            .iter()
            .map(|f| (f.path.to_string(), f.digest, f.source))
            .collect();
        let want: Vec<(String, [u8; 32], u16)> = files
            .iter()
            .map(|(p, c, s)| (p.to_string(), d(c), *s))
            .collect();
        assert_eq!(got, want, "{name}: files");
        let got_skipped: Vec<(String, SkipReason)> = ev
            .skipped
            .iter()
            .map(|(p, r)| (p.to_string(), *r))
            .collect();
        let want_skipped: Vec<(String, SkipReason)> =
            skipped.iter().map(|(p, r)| (p.to_string(), *r)).collect();
        assert_eq!(got_skipped, want_skipped, "{name}: skipped");
        let got_missing: Vec<String> = ev.missing.iter().map(ToString::to_string).collect();
        assert_eq!(got_missing, missing, "{name}: missing");
    }
}

#[test]
fn sub_path_projection_file_directory_and_skipped() {
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("a", b"1"), ("b", b"2")],
        false,
        None,
    );
    let vol = VolumeSource::Projected(Box::new([
        ProjectedSource::Object(obj(
            SECRET,
            "s",
            &[("a", "etc/a.conf"), ("b", "etc/sub/b")],
            false,
        )),
        not_from_api(SkipReason::ServiceAccountToken, &["token"]),
    ]));
    let ev = project_volume(&ns(), &vol, |r| ix.source(r));
    assert_eq!(
        project_sub_path(&ev, "etc/a.conf"),
        ExpectedSubPath::Files(vec![(a(""), d(b"1"), 0)])
    );
    assert_eq!(
        project_sub_path(&ev, "./etc/"),
        ExpectedSubPath::Files(vec![(a("a.conf"), d(b"1"), 0), (a("sub/b"), d(b"2"), 0)])
    );
    assert_eq!(
        project_sub_path(&ev, "token"),
        ExpectedSubPath::Skipped(SkipReason::ServiceAccountToken)
    );
    assert_eq!(
        project_sub_path(&ev, "nothing"),
        ExpectedSubPath::Files(vec![])
    );
}

#[test]
fn env_projection_rules() {
    let mut ix = ClusterIndex::new();
    put_config_map(
        &mut ix,
        "ns",
        "c",
        &[("K", b"v"), ("L", b"w")],
        &[("BIN", b"b")],
        None,
    );
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("pw", b"hunter2")],
        false,
        None,
    );
    let look = |r: &crate::model::SourceRef| ix.source(r);

    let e = project_env(&ns(), &env_key("X", SECRET, "s", "pw", false), look);
    assert_eq!(e.digest, Some(d(b"hunter2")));
    assert_eq!(e.missing, None);

    // configMapKeyRef reads `data` only: a binaryData key is missing.
    let e = project_env(&ns(), &env_key("X", CM, "c", "BIN", false), look);
    assert_eq!(e.digest, None);
    assert_eq!(
        e.missing.unwrap().to_string(),
        "key \"BIN\" missing in ConfigMap/ns/c"
    );
    let e = project_env(&ns(), &env_key("X", CM, "c", "BIN", true), look);
    assert_eq!((e.digest, e.missing), (None, None));

    // envFrom: data keys with the prefix, binaryData left out.
    let e = project_env(&ns(), &env_from(CM, "c", "P_", false), look);
    let want = volume_digest([("P_K", &d(b"v")), ("P_L", &d(b"w"))]);
    assert_eq!(e.digest, Some(want));
    let other_prefix = project_env(&ns(), &env_from(CM, "c", "", false), look);
    assert_ne!(
        other_prefix.digest,
        Some(want),
        "the prefix is part of the variable set"
    );

    let e = project_env(&ns(), &env_from(SECRET, "gone", "", true), look);
    assert_eq!((e.digest, e.missing), (None, None));
    let e = project_env(&ns(), &env_from(SECRET, "gone", "", false), look);
    assert_eq!(e.missing.unwrap().to_string(), "Secret/ns/gone not found");
}

// ------------------------------------------------------------------ verdicts

const START: &str = "2026-11-30T10:00:00Z";
const SCAN: &str = "2026-11-30T11:00:00Z";
const NOW: &str = "2026-11-30T11:00:30Z";

fn verdict<'a>(eval: &'a Evaluation, pod: &str, want: impl Fn(&Subject) -> bool) -> &'a Verdict {
    eval.iter()
        .find(|(p, v)| &*p.pod.name == pod && want(&p.subject(v)))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no verdict for {pod}: {eval:#?}"))
}

fn vol(name: &'static str) -> impl Fn(&Subject) -> bool {
    move |s| matches!(s, Subject::Volume { volume } if &**volume == name)
}

/// One secret volume `v` of secret `s` mounted in pod `p` on `node-a`; the
/// secret changed at `changed`, the node shows `on_disk`.
fn single(
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

#[test]
fn volume_state_table() {
    // (case, source changed at, immutable, current, on disk, expected state)
    let cases: Vec<VolumeCase> = vec![
        (
            "equal content",
            "2026-11-30T09:00:00Z",
            false,
            b"new",
            b"new",
            State::Fresh,
        ),
        (
            "changed 60 s before the scan: propagating",
            "2026-11-30T10:59:00Z",
            false,
            b"new",
            b"old",
            State::Propagating,
        ),
        (
            "changed after the scan: propagating even past grace from now",
            "2026-11-30T11:00:10Z",
            false,
            b"new",
            b"old",
            State::Propagating,
        ),
        (
            "mutable, stale past grace, alone on the node: unknown",
            "2026-11-30T10:30:00Z",
            false,
            b"new",
            b"old",
            State::Stale(StaleCause::Unknown),
        ),
        (
            "immutable recreated, nobody else on the node: immutable cache",
            "2026-11-30T10:30:00Z",
            true,
            b"new",
            b"old",
            State::Stale(StaleCause::ImmutableCache),
        ),
        (
            "immutable but inside grace: propagating",
            "2026-11-30T10:59:00Z",
            true,
            b"new",
            b"old",
            State::Propagating,
        ),
    ];
    for (name, changed, immutable, current, on_disk, want) in cases {
        let (ix, now) = single(changed, immutable, current, on_disk);
        let eval = engine().evaluate_all(&ix, &mut EngineState::default(), now);
        let v = verdict(&eval, "p", vol("v"));
        assert_eq!(v.state, want, "{name}");
        let f = Fingerprinter::new(KEY).unwrap();
        assert_eq!(
            v.expected,
            Some(f.fingerprint(&volume_digest([("k", &d(current))]))),
            "{name}: expected fingerprint"
        );
        assert_eq!(
            v.observed,
            Some(f.fingerprint(&volume_digest([("k", &d(on_disk))]))),
            "{name}: observed fingerprint"
        );
        if want == State::Fresh {
            assert!(v.differing_paths().is_empty(), "{name}");
        } else {
            assert_eq!(
                v.differing_paths().iter().map(|p| &**p).collect::<Vec<_>>(),
                ["k"],
                "{name}"
            );
            assert_eq!(v.files()[0].state, FileState::Differs, "{name}");
        }
    }
}

#[test]
fn immutable_secret_recreated_while_another_pod_on_the_node_references_it_is_pinned() {
    let (mut ix, now) = single("2026-11-30T10:30:00Z", true, b"new", b"old");
    // Same node, referencing the secret through env only: still pins.
    ix.apply_pod(
        PodB::new("ns", "pinner", "uid-q", "node-a")
            .container(
                "c",
                Some(ts(START)),
                &[],
                vec![env_key("K", SECRET, "s", "k", false)],
            )
            .build(),
    );
    // Another node, and a terminated pod on this node: do not pin.
    ix.apply_pod(
        PodB::new("ns", "elsewhere", "uid-r", "node-b")
            .volume("v", VolumeSource::Object(obj(SECRET, "s", &[], false)))
            .build(),
    );
    ix.apply_pod(
        PodB::new("ns", "done", "uid-t", "node-a")
            .volume("v", VolumeSource::Object(obj(SECRET, "s", &[], false)))
            .terminated()
            .build(),
    );
    // Same name in another namespace does not pin either.
    ix.apply_pod(
        PodB::new("other", "stranger", "uid-o", "node-a")
            .volume("v", VolumeSource::Object(obj(SECRET, "s", &[], false)))
            .build(),
    );
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), now);
    let v = verdict(&eval, "p", vol("v"));
    assert_eq!(v.state, State::Stale(StaleCause::ImmutableCachePinned));
    assert_eq!(
        v.pinned_by().iter().map(|s| &**s).collect::<Vec<_>>(),
        ["pinner"]
    );
    assert!(v.message().unwrap().contains("pinner"));
    assert!(
        eval.iter().all(|(p, _)| &*p.pod.name != "done"),
        "terminated pods get no verdicts"
    );
}

/// `n` pods on node-a, each with one ConfigMap volume; `stale` of them show
/// old content long after the change.
fn node_with(n: usize, stale: usize) -> (ClusterIndex, Timestamp) {
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

#[test]
fn kubelet_not_syncing_rule_table() {
    // (pods, stale, expected cause of the stale ones)
    let cases = [
        (4, 4, StaleCause::KubeletNotSyncing),
        (4, 3, StaleCause::KubeletNotSyncing),
        (4, 2, StaleCause::Unknown), // exactly half: not more than half
        (2, 2, StaleCause::Unknown), // fewer than 3 mutable mounts
        (3, 2, StaleCause::KubeletNotSyncing),
    ];
    for (n, stale, want) in cases {
        let (ix, now) = node_with(n, stale);
        let mut state = EngineState::default();
        let eval = engine().evaluate_all(&ix, &mut state, now);
        for i in 0..n {
            let v = verdict(&eval, &format!("p{i}"), vol("v"));
            if i < stale {
                assert_eq!(
                    v.state,
                    State::Stale(want),
                    "{n} pods, {stale} stale, pod {i}"
                );
            } else {
                assert_eq!(v.state, State::Fresh);
            }
        }
        let node = &state.nodes[&a("node-a")];
        assert_eq!(
            (node.mutable_mounts, node.stale_mutable_mounts),
            (n as u32, stale as u32)
        );
    }
}

#[test]
fn sub_path_of_a_key_that_changed_after_start_is_frozen() {
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        CM,
        "ns",
        "sshd",
        &[("sshd_config", b"new")],
        false,
        Some(ts("2026-11-30T10:30:00Z")),
    );
    ix.apply_pod(
        PodB::new("ns", "p", "uid-p", "node-a")
            .volume("sshd", VolumeSource::Object(obj(CM, "sshd", &[], false)))
            .container(
                "slurmd",
                Some(ts(START)),
                &[("sshd", "sshd_config")],
                vec![],
            )
            .build(),
    );
    NodeB::new("node-a", ts(SCAN))
        .volume(
            "uid-p",
            Plugin::Configmap,
            "sshd",
            &[("sshd_config", b"new")],
            ts("2026-11-30T10:31:00Z"),
        )
        .sub_path("uid-p", "sshd", "slurmd", 0, &[("", b"old")])
        .apply(&mut ix);
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
    assert_eq!(verdict(&eval, "p", vol("sshd")).state, State::Fresh);
    let sp = verdict(&eval, "p", |s| matches!(s, Subject::SubPath { .. }));
    assert_eq!(sp.state, State::Frozen(FrozenCause::SubPath));
    assert_eq!(
        sp.differing_paths()
            .iter()
            .map(|p| &**p)
            .collect::<Vec<_>>(),
        [""]
    );
    assert_eq!(sp.since, ts("2026-11-30T10:30:00Z"));

    // Unchanged subPath: fresh. A subPath target not on disk: NotOnDisk.
    let mut ix2 = ClusterIndex::new();
    put_source(
        &mut ix2,
        CM,
        "ns",
        "sshd",
        &[("sshd_config", b"same")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    ix2.apply_pod(
        PodB::new("ns", "p", "uid-p", "node-a")
            .volume("sshd", VolumeSource::Object(obj(CM, "sshd", &[], false)))
            .container(
                "slurmd",
                Some(ts(START)),
                &[("sshd", "sshd_config"), ("sshd", "other")],
                vec![],
            )
            .build(),
    );
    NodeB::new("node-a", ts(SCAN))
        .volume(
            "uid-p",
            Plugin::Configmap,
            "sshd",
            &[("sshd_config", b"same")],
            ts(START),
        )
        .sub_path("uid-p", "sshd", "slurmd", 0, &[("", b"same")])
        .apply(&mut ix2);
    let eval = engine().evaluate_all(&ix2, &mut EngineState::default(), ts(NOW));
    let states: Vec<State> = eval
        .iter()
        .filter(|(p, v)| matches!(p.subject(v), Subject::SubPath { .. }))
        .map(|(_, v)| v.state)
        .collect();
    assert_eq!(
        states,
        [
            State::Fresh,
            State::Unverifiable(UnverifiableReason::NotOnDisk)
        ]
    );
}

#[test]
fn env_from_config_map_changed_after_start_is_frozen_and_before_is_fresh() {
    for (changed, want) in [
        ("2026-11-30T10:20:00Z", State::Frozen(FrozenCause::Env)),
        ("2026-11-30T09:20:00Z", State::Fresh),
    ] {
        let mut ix = ClusterIndex::new();
        put_source(
            &mut ix,
            CM,
            "ns",
            "cfg",
            &[("A", b"1")],
            false,
            Some(ts(changed)),
        );
        ix.apply_pod(
            PodB::new("ns", "p", "uid-p", "node-a")
                .container(
                    "c",
                    Some(ts(START)),
                    &[],
                    vec![env_from(CM, "cfg", "", false)],
                )
                .build(),
        );
        // Env verdicts need no inventory.
        let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
        let v = verdict(&eval, "p", |s| matches!(s, Subject::Env { .. }));
        assert_eq!(v.state, want, "changed at {changed}");
        assert!(v.expected.is_some() && v.observed.is_none());
    }
}

#[test]
fn read_at_start_volume_refreshed_after_start_is_frozen() {
    // (written at, read-at-start declared, expected)
    let cases = [
        (
            "2026-11-30T10:40:00Z",
            true,
            State::Frozen(FrozenCause::ReadAtStart),
        ),
        ("2026-11-30T10:40:00Z", false, State::Fresh),
        ("2026-11-30T09:59:59Z", true, State::Fresh),
        // Same second as startedAt (second precision): not certainly later.
        ("2026-11-30T10:00:00.5Z", true, State::Fresh),
    ];
    for (written, declared, want) in cases {
        let mut ix = ClusterIndex::new();
        put_source(
            &mut ix,
            SECRET,
            "slurm",
            "auth",
            &[("slurm.key", b"k2")],
            true,
            Some(ts("2026-11-30T10:39:00Z")),
        );
        let mut b = PodB::new("slurm", "worker-0", "uid-w", "node-a").volume(
            "slurm-etc",
            VolumeSource::Projected(Box::new([ProjectedSource::Object(obj(
                SECRET,
                "auth",
                &[],
                false,
            ))])),
        );
        if declared {
            b = b.read_at_start("slurm-etc");
        }
        let pod = b
            .container("slurmd", Some(ts(START)), &[("slurm-etc", "")], vec![])
            .build();
        ix.apply_pod(pod);
        NodeB::new("node-a", ts(SCAN))
            .volume(
                "uid-w",
                Plugin::Projected,
                "slurm-etc",
                &[("slurm.key", b"k2")],
                ts(written),
            )
            .apply(&mut ix);
        let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
        let v = verdict(&eval, "worker-0", vol("slurm-etc"));
        assert_eq!(v.state, want, "written {written}, declared {declared}");
        if want == State::Frozen(FrozenCause::ReadAtStart) {
            assert_eq!(v.since, ts(written));
            assert!(v.message().unwrap().contains("slurmd"));
        }
    }
}

#[test]
fn kube_api_access_verifies_only_ca_crt() {
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        CM,
        "ns",
        "kube-root-ca.crt",
        &[("ca.crt", b"CA")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    ix.apply_pod(
        PodB::new("ns", "p", "uid-p", "node-a")
            .volume("kube-api-access-x7k2p", kube_api_access())
            .build(),
    );
    for (ca, want) in [
        (b"CA" as &[u8], State::Fresh),
        (b"OLD-CA", State::Stale(StaleCause::Unknown)),
    ] {
        let mut ix = ix_clone(&ix);
        NodeB::new("node-a", ts(SCAN))
            .volume(
                "uid-p",
                Plugin::Projected,
                "kube-api-access-x7k2p",
                &[
                    ("ca.crt", ca),
                    ("token", b"rotating-token"),
                    ("namespace", b"ns"),
                ],
                ts(START),
            )
            .apply(&mut ix);
        let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
        let v = verdict(&eval, "p", vol("kube-api-access-x7k2p"));
        assert_eq!(v.state, want);
        assert!(v.differing_paths().iter().all(|p| &**p == "ca.crt"));
        assert_eq!(
            v.observed,
            Some(
                Fingerprinter::new(KEY)
                    .unwrap()
                    .fingerprint(&volume_digest([("ca.crt", &d(ca))]))
            )
        );
    }
}

fn ix_clone(ix: &ClusterIndex) -> ClusterIndex {
    let mut out = ClusterIndex::new();
    for (r, c) in ix.sources() {
        out.apply_source(r.clone(), c.clone());
    }
    for id in ix.pod_ids() {
        out.apply_pod((**ix.pod(id).unwrap()).clone());
    }
    out
}

#[test]
fn source_missing_unverifiable_and_skipped_table() {
    let base = || {
        let mut ix = ClusterIndex::new();
        put_source(
            &mut ix,
            SECRET,
            "ns",
            "s",
            &[("k", b"v")],
            false,
            Some(ts("2026-11-30T09:00:00Z")),
        );
        ix
    };
    let pod = |src: VolumeSource| {
        PodB::new("ns", "p", "uid-p", "node-a")
            .volume("v", src)
            .build()
    };
    let secret_vol = || VolumeSource::Object(obj(SECRET, "s", &[], false));
    type Setup = Box<dyn Fn(&mut ClusterIndex)>;
    let cases: Vec<(&str, Setup, State)> = vec![
        (
            "missing key, not optional",
            Box::new(move |ix| {
                ix.apply_pod(pod(VolumeSource::Object(obj(
                    SECRET,
                    "s",
                    &[("nope", "x")],
                    false,
                ))));
            }),
            State::SourceMissing,
        ),
        (
            "no inventory for the node",
            Box::new(move |ix| {
                ix.apply_pod(pod(secret_vol()));
            }),
            State::Unverifiable(UnverifiableReason::NoInventory),
        ),
        (
            "inventory too old",
            Box::new(move |ix| {
                ix.apply_pod(pod(secret_vol()));
                NodeB::new("node-a", ts("2026-11-30T10:50:00Z"))
                    .volume("uid-p", Plugin::Secret, "v", &[("k", b"v")], ts(START))
                    .apply(ix);
            }),
            State::Unverifiable(UnverifiableReason::InventoryTooOld),
        ),
        (
            "volume not on disk yet",
            Box::new(move |ix| {
                ix.apply_pod(pod(secret_vol()));
                NodeB::new("node-a", ts(SCAN)).apply(ix);
            }),
            State::Unverifiable(UnverifiableReason::NotOnDisk),
        ),
        (
            "unreadable expected file: never stale",
            Box::new(move |ix| {
                ix.apply_pod(pod(secret_vol()));
                NodeB::new("node-a", ts(SCAN))
                    .volume("uid-p", Plugin::Secret, "v", &[("k", b"OLD")], ts(START))
                    .volume_error("uid-p", "k", ReadErrorKind::Permission)
                    .apply(ix);
            }),
            State::Unverifiable(UnverifiableReason::ReadError),
        ),
        (
            "mount propagation problem on the volume: never stale",
            Box::new(move |ix| {
                ix.apply_pod(pod(secret_vol()));
                NodeB::new("node-a", ts(SCAN))
                    .volume("uid-p", Plugin::Secret, "v", &[], ts(START))
                    .volume_error("uid-p", "", ReadErrorKind::MountPropagation)
                    .apply(ix);
            }),
            State::Unverifiable(UnverifiableReason::ReadError),
        ),
        (
            "projected volume of a token only: skipped",
            Box::new(move |ix| {
                ix.apply_pod(pod(VolumeSource::Projected(Box::new([not_from_api(
                    SkipReason::ServiceAccountToken,
                    &["token"],
                )]))));
            }),
            State::Skipped(SkipReason::ServiceAccountToken),
        ),
        (
            "read error on a skipped path does not matter",
            Box::new(move |ix| {
                ix.apply_pod(pod(VolumeSource::Projected(Box::new([
                    ProjectedSource::Object(obj(SECRET, "s", &[], false)),
                    not_from_api(SkipReason::ServiceAccountToken, &["token"]),
                ]))));
                NodeB::new("node-a", ts(SCAN))
                    .volume(
                        "uid-p",
                        Plugin::Projected,
                        "v",
                        &[("k", b"v"), ("token", b"t")],
                        ts(START),
                    )
                    .volume_error("uid-p", "token", ReadErrorKind::Vanished)
                    .apply(ix);
            }),
            State::Fresh,
        ),
        (
            "optional missing secret and an empty volume: fresh",
            Box::new(move |ix| {
                ix.apply_pod(pod(VolumeSource::Object(obj(SECRET, "gone", &[], true))));
                NodeB::new("node-a", ts(SCAN))
                    .volume("uid-p", Plugin::Secret, "v", &[], ts(START))
                    .apply(ix);
            }),
            State::Fresh,
        ),
    ];
    for (name, setup, want) in cases {
        let mut ix = base();
        setup(&mut ix);
        let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
        let v = verdict(&eval, "p", vol("v"));
        assert_eq!(v.state, want, "{name}");
        if want == State::SourceMissing {
            assert!(
                v.message()
                    .unwrap()
                    .contains("key \"nope\" missing in Secret/ns/s"),
                "{name}"
            );
        }
    }
}

#[test]
fn unexpected_extra_file_is_a_difference() {
    let (mut ix, now) = single("2026-11-30T09:00:00Z", false, b"v", b"v");
    NodeB::new("node-a", ts(SCAN))
        .volume(
            "uid-p",
            Plugin::Secret,
            "v",
            &[("k", b"v"), ("removed-key", b"x")],
            ts(START),
        )
        .apply(&mut ix);
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), now);
    let v = verdict(&eval, "p", vol("v"));
    assert_eq!(v.state, State::Stale(StaleCause::Unknown));
    assert_eq!(v.files()[0].state, FileState::Unexpected);
    assert_eq!(&*v.differing_paths()[0], "removed-key");
}

#[test]
fn history_keeps_since_and_unknown_change_times_wait_for_grace() {
    // A source without any write time: the engine must observe the mismatch
    // for the grace period itself before calling it stale.
    let mut ix = ClusterIndex::new();
    put_source(&mut ix, SECRET, "ns", "s", &[("k", b"new")], false, None);
    ix.apply_pod(
        PodB::new("ns", "p", "uid-p", "node-a")
            .volume("v", VolumeSource::Object(obj(SECRET, "s", &[], false)))
            .build(),
    );
    let e = engine();
    let mut state = EngineState::default();
    let t1 = ts("2026-11-30T11:00:00Z");
    let scan = |ix: &mut ClusterIndex, t: Timestamp| {
        NodeB::new("node-a", t)
            .volume("uid-p", Plugin::Secret, "v", &[("k", b"old")], ts(START))
            .apply(ix);
    };
    scan(&mut ix, t1);
    let v1 = e.evaluate_all(&ix, &mut state, t1);
    assert_eq!(verdict(&v1, "p", vol("v")).state, State::Propagating);
    assert_eq!(verdict(&v1, "p", vol("v")).since, t1);

    let t2 = t1 + SignedDuration::from_secs(120);
    scan(&mut ix, t2);
    let v2 = e.evaluate_all(&ix, &mut state, t2);
    assert_eq!(verdict(&v2, "p", vol("v")).state, State::Propagating);
    assert_eq!(verdict(&v2, "p", vol("v")).since, t1, "since is kept");

    let t3 = t1 + SignedDuration::from_secs(200);
    scan(&mut ix, t3);
    let v3 = e.evaluate_all(&ix, &mut state, t3);
    let v = verdict(&v3, "p", vol("v"));
    assert_eq!(v.state, State::Stale(StaleCause::Unknown));
    assert_eq!(
        v.since, t1,
        "the stale state dates from when the mismatch began"
    );

    // The state survives a JSON round trip and gives the same result.
    let json = serde_json::to_string(&state).unwrap();
    let mut back: EngineState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);
    let v4 = e.evaluate_all(&ix, &mut back, t3);
    assert_eq!(v4, v3);
}

#[test]
fn api_unavailable_masks_judgements_and_keeps_their_history() {
    // A stale volume (its Secret has no write time: the engine dates the
    // mismatch itself), a fresh one and an unverifiable one (no inventory
    // on node-b) while the source watches fail, then after they recover.
    let mut ix = ClusterIndex::new();
    put_source(&mut ix, SECRET, "ns", "s", &[("k", b"new")], false, None);
    put_source(&mut ix, SECRET, "ns", "f", &[("k", b"same")], false, None);
    for (pod, uid, node, vol, secret) in [
        ("p", "uid-p", "node-a", "v", "s"),
        ("q", "uid-q", "node-a", "w", "f"),
        ("r", "uid-r", "node-b", "w", "f"),
    ] {
        ix.apply_pod(
            PodB::new("ns", pod, uid, node)
                .volume(vol, VolumeSource::Object(obj(SECRET, secret, &[], false)))
                .build(),
        );
    }
    let scan = |ix: &mut ClusterIndex, t: Timestamp| {
        NodeB::new("node-a", t)
            .volume("uid-p", Plugin::Secret, "v", &[("k", b"old")], ts(START))
            .volume("uid-q", Plugin::Secret, "w", &[("k", b"same")], ts(START))
            .apply(ix);
    };
    let mut e = engine();
    let mut state = EngineState::default();
    let t1 = ts("2026-11-30T11:00:00Z");
    scan(&mut ix, t1);
    e.evaluate_all(&ix, &mut state, t1);
    let t2 = t1 + SignedDuration::from_secs(200);
    scan(&mut ix, t2);
    let before = e.evaluate_all(&ix, &mut state, t2);
    let stale = verdict(&before, "p", vol("v")).clone();
    assert_eq!(stale.state, State::Stale(StaleCause::Unknown));
    assert_eq!(stale.since, t1);

    e.set_api_health(ApiHealth::Unavailable);
    let t3 = t2 + SignedDuration::from_secs(60);
    scan(&mut ix, t3);
    let during = e.evaluate_all(&ix, &mut state, t3);
    assert_eq!(
        verdict(&during, "p", vol("v")).state,
        State::Unverifiable(UnverifiableReason::ApiUnavailable),
        "API trouble never shows a mount Stale"
    );
    assert_eq!(verdict(&during, "q", vol("w")).state, State::Fresh);
    assert_eq!(
        verdict(&during, "r", vol("w")).state,
        State::Unverifiable(UnverifiableReason::NoInventory)
    );
    let incremental = e.evaluate_pods(&ix, &mut state, &["uid-p"], t3);
    assert_eq!(
        verdict(&incremental, "p", vol("v")).state,
        State::Unverifiable(UnverifiableReason::ApiUnavailable)
    );

    e.set_api_health(ApiHealth::Available);
    let t4 = t3 + SignedDuration::from_secs(60);
    scan(&mut ix, t4);
    let after = e.evaluate_all(&ix, &mut state, t4);
    let v = verdict(&after, "p", vol("v"));
    assert_eq!(v.state, stale.state, "no new grace period after the outage");
    assert_eq!(v.since, t1, "the history kept the stale state's start");
}

#[test]
fn source_history_overrides_managed_fields_time() {
    let (mut ix, now) = single("2026-11-30T09:00:00Z", false, b"v1", b"v1");
    let e = engine();
    let mut state = EngineState::default();
    let first = e.evaluate_all(&ix, &mut state, ts("2026-11-30T10:00:00Z"));
    assert_eq!(verdict(&first, "p", vol("v")).state, State::Fresh);
    // The content changes at 11:00:00 as the engine sees it, but the object's
    // managedFields time is old (a stale fallback must not win).
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("k", b"v2")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    let t = ts("2026-11-30T10:59:00Z");
    let r = e.evaluate_pods(&ix, &mut state, &["uid-p"], t);
    let hist = state.sources.values().next().unwrap();
    assert_eq!(hist.content_changed_at, Some(t));
    assert_eq!(verdict(&r, "p", vol("v")).state, State::Propagating);
    assert!(now > t);
}

#[test]
fn incremental_evaluation_matches_full_and_follows_node_flips() {
    // Three stale pods on node-a out of four, one source per pod; then one
    // source changes so a fourth mount is stale too.
    let (mut ix, now) = node_with(4, 2);
    let e = engine();
    let mut state = EngineState::default();
    let full = e.evaluate_all(&ix, &mut state, now);
    assert_eq!(
        verdict(&full, "p0", vol("v")).state,
        State::Stale(StaleCause::Unknown)
    );

    // cm-2 gets new content; the node keeps showing the previous value.
    put_source(
        &mut ix,
        CM,
        "ns",
        "cm-2",
        &[("f", b"newer")],
        false,
        Some(ts("2026-11-30T10:30:00Z")),
    );
    let rescan = |ix: &mut ClusterIndex, t: Timestamp| {
        NodeB::new("node-a", t - SignedDuration::from_secs(10))
            .volume("uid-0", Plugin::Configmap, "v", &[("f", b"old")], ts(START))
            .volume("uid-1", Plugin::Configmap, "v", &[("f", b"old")], ts(START))
            .volume("uid-2", Plugin::Configmap, "v", &[("f", b"new")], ts(START))
            .volume("uid-3", Plugin::Configmap, "v", &[("f", b"new")], ts(START))
            .apply(ix);
    };
    let r = ix.pods_referencing(&crate::model::SourceRef::new(CM, a("ns"), a("cm-2")));
    let uids: Vec<String> = r
        .iter()
        .map(|id| ix.pod(*id).unwrap().uid.to_string())
        .collect();
    assert_eq!(uids, ["uid-2"]);
    let uid_refs: Vec<&str> = uids.iter().map(String::as_str).collect();

    // Seen changing now (history beats the old managedFields time):
    // propagating, and only p2 is evaluated.
    let t1 = now + SignedDuration::from_secs(60);
    rescan(&mut ix, t1);
    let inc = e.evaluate_pods(&ix, &mut state, &uid_refs, t1);
    assert_eq!(inc.pods.len(), 1);
    assert_eq!(verdict(&inc, "p2", vol("v")).state, State::Propagating);

    // Past grace: 3 of 4 mutable mounts stale, the node rule flips and the
    // node's other pods are re-evaluated with it.
    let later = t1 + SignedDuration::from_secs(300);
    rescan(&mut ix, later);
    let inc = e.evaluate_pods(&ix, &mut state, &uid_refs, later);
    let names: std::collections::BTreeSet<&str> = inc.pods.iter().map(|p| &*p.pod.name).collect();
    assert_eq!(
        names.into_iter().collect::<Vec<_>>(),
        ["p0", "p1", "p2", "p3"]
    );
    for p in ["p0", "p1", "p2"] {
        assert_eq!(
            verdict(&inc, p, vol("v")).state,
            State::Stale(StaleCause::KubeletNotSyncing),
            "{p}"
        );
    }
    assert_eq!(
        verdict(&inc, "p2", vol("v")).since,
        t1,
        "stale since the change was seen"
    );
    assert!(state.nodes[&a("node-a")].not_syncing);

    // The incremental result agrees with a full evaluation from the same
    // state.
    let mut state2 = state.clone();
    let full2 = e.evaluate_all(&ix, &mut state2, later);
    for (p, v) in inc.iter() {
        let f = verdict(&full2, &p.pod.name, |s| *s == p.subject(v));
        assert_eq!(f, v, "pod {}", p.pod.name);
    }
    assert_eq!(state2.nodes, state.nodes);

    // A deleted pod leaves the history and the node counters.
    ix.delete_pod("uid-3");
    let gone = e.evaluate_pods(&ix, &mut state, &["uid-3"], later);
    assert_eq!(gone.removed, vec![a("uid-3")]);
    assert!(!state.pods.contains_key("uid-3"));
    assert_eq!(state.nodes[&a("node-a")].mutable_mounts, 3);
}

#[test]
fn verdict_output_never_contains_raw_digests() {
    let (ix, now) = single("2026-11-30T10:30:00Z", true, b"new-secret", b"old-secret");
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), now);
    let json =
        serde_json::to_string(&eval.iter().map(|(p, v)| v.view(p)).collect::<Vec<_>>()).unwrap();
    let mut state = EngineState::default();
    engine().evaluate_all(&ix, &mut state, now);
    let state_json = serde_json::to_string(&state).unwrap();
    for secret in [&b"new-secret"[..], b"old-secret"] {
        let fd = hex::encode(d(secret));
        let vd = hex::encode(volume_digest([("k", &d(secret))]));
        for text in [&json, &state_json] {
            assert!(!text.contains(&fd[..12]), "file digest prefix leaked");
            assert!(!text.contains(&vd[..12]), "volume digest prefix leaked");
            assert!(!text.contains("secret\""), "plaintext leaked");
        }
    }
    assert!(json.contains("\"state\":\"Stale\""));
    assert!(json.contains("\"cause\":\"ImmutableCache\""));
    assert!(json.contains("\"sourceKind\":\"Secret\""));
}

#[test]
fn pod_level_read_errors_only_affect_the_subjects_below_them() {
    use mountguard_inventory::ReadError;
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("k", b"v")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    put_source(
        &mut ix,
        CM,
        "ns",
        "c",
        &[("f", b"x")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    ix.apply_pod(
        PodB::new("ns", "p", "uid-p", "node-a")
            .volume("sec", VolumeSource::Object(obj(SECRET, "s", &[], false)))
            .volume("cm", VolumeSource::Object(obj(CM, "c", &[], false)))
            .container("c", Some(ts(START)), &[("cm", "f")], vec![])
            .build(),
    );
    let mut node = NodeB::new("node-a", ts(SCAN)).volume(
        "uid-p",
        Plugin::Configmap,
        "cm",
        &[("f", b"x")],
        ts(START),
    );
    node.inv.pods[0].errors.push(ReadError {
        path: "volumes/kubernetes.io~secret".into(),
        kind: ReadErrorKind::Permission,
        message: "denied".into(),
    });
    node.inv.pods[0].errors.push(ReadError {
        path: "volume-subpaths/cm".into(),
        kind: ReadErrorKind::Permission,
        message: "denied".into(),
    });
    node.apply(&mut ix);
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
    let sec = verdict(&eval, "p", vol("sec"));
    assert_eq!(
        sec.state,
        State::Unverifiable(UnverifiableReason::ReadError)
    );
    assert!(
        sec.message()
            .unwrap()
            .contains("volumes/kubernetes.io~secret")
    );
    assert_eq!(verdict(&eval, "p", vol("cm")).state, State::Fresh);
    let sp = verdict(&eval, "p", |s| matches!(s, Subject::SubPath { .. }));
    assert_eq!(sp.state, State::Unverifiable(UnverifiableReason::ReadError));
}

#[test]
fn deleting_the_pinning_pod_turns_pinned_into_plain_immutable_cache() {
    let (mut ix, now) = single("2026-11-30T10:30:00Z", true, b"new", b"old");
    ix.apply_pod(
        PodB::new("ns", "pinner", "uid-q", "node-a")
            .volume("v", VolumeSource::Object(obj(SECRET, "s", &[], false)))
            .build(),
    );
    let e = engine();
    let mut state = EngineState::default();
    let eval = e.evaluate_all(&ix, &mut state, now);
    assert_eq!(
        verdict(&eval, "p", vol("v")).state,
        State::Stale(StaleCause::ImmutableCachePinned)
    );
    let gone = ix.delete_pod("uid-q").unwrap();
    let affected: Vec<String> = ix
        .affected_by_pod(&gone)
        .iter()
        .map(|id| ix.pod(*id).unwrap().uid.to_string())
        .collect();
    assert_eq!(affected, ["uid-p"]);
    let mut uids: Vec<&str> = affected.iter().map(String::as_str).collect();
    uids.push("uid-q");
    let inc = e.evaluate_pods(&ix, &mut state, &uids, now);
    let v = verdict(&inc, "p", vol("v"));
    assert_eq!(v.state, State::Stale(StaleCause::ImmutableCache));
    assert!(v.pinned_by().is_empty());
    assert_eq!(inc.removed, vec![a("uid-q")]);
}

#[test]
fn pods_sharing_a_volume_spec_in_different_namespaces_get_their_own_projection() {
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        SECRET,
        "ns",
        "s",
        &[("k", b"in-ns")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    put_source(
        &mut ix,
        SECRET,
        "other",
        "s",
        &[("k", b"in-other")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    let p1 = PodB::new("ns", "p1", "uid-1", "node-a")
        .volume("v", VolumeSource::Object(obj(SECRET, "s", &[], false)))
        .build();
    // Same `Arc<VolumeSource>` (as interning gives pods of one template),
    // other namespace.
    let mut p2 = p1.clone();
    p2.namespace = a("other");
    p2.name = a("p2");
    p2.uid = a("uid-2");
    assert!(Arc::ptr_eq(&p1.volumes[0].source, &p2.volumes[0].source));
    ix.apply_pod(p1);
    ix.apply_pod(p2);
    NodeB::new("node-a", ts(SCAN))
        .volume("uid-1", Plugin::Secret, "v", &[("k", b"in-ns")], ts(START))
        .volume("uid-2", Plugin::Secret, "v", &[("k", b"in-ns")], ts(START))
        .apply(&mut ix);
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
    assert_eq!(verdict(&eval, "p1", vol("v")).state, State::Fresh);
    let v2 = verdict(&eval, "p2", vol("v"));
    assert_eq!(v2.state, State::Stale(StaleCause::Unknown));
    assert_ne!(v2.expected, verdict(&eval, "p1", vol("v")).expected);
    assert_eq!(v2.observed, verdict(&eval, "p1", vol("v")).observed);
}

#[test]
fn container_not_running_subpath_expr_and_env_source_missing() {
    let mut ix = ClusterIndex::new();
    put_source(
        &mut ix,
        CM,
        "ns",
        "c",
        &[("f", b"x")],
        false,
        Some(ts("2026-11-30T09:00:00Z")),
    );
    let mut pod = PodB::new("ns", "p", "uid-p", "node-a")
        .volume("cm", VolumeSource::Object(obj(CM, "c", &[], false)))
        .container(
            "waiting",
            None,
            &[("cm", "f")],
            vec![env_key("X", CM, "c", "f", false)],
        )
        .container(
            "running",
            Some(ts(START)),
            &[("cm", "")],
            vec![
                env_key("MISSING", CM, "c", "nokey", false),
                env_key("OPTIONAL", CM, "c", "nokey", true),
                env_from(SECRET, "absent", "", false),
            ],
        )
        .build();
    // The second container mounts with subPathExpr.
    let mut containers = pod.containers.to_vec();
    let mut mounts = containers[1].mounts.to_vec();
    mounts[0].sub_path_expr = true;
    containers[1].mounts = mounts.into();
    pod.containers = containers.into();
    ix.apply_pod(pod);
    NodeB::new("node-a", ts(SCAN))
        .volume("uid-p", Plugin::Configmap, "cm", &[("f", b"x")], ts(START))
        .apply(&mut ix);
    let eval = engine().evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
    let got: Vec<(String, State)> = eval
        .iter()
        .map(|(p, v)| {
            let name = match p.subject(v) {
                Subject::Volume { volume } => format!("volume {volume}"),
                Subject::SubPath {
                    container,
                    sub_path,
                    ..
                } => format!("subPath {container} {sub_path}"),
                Subject::Env { container, var } => format!("env {container} {var}"),
            };
            (name, v.state)
        })
        .collect();
    let want = vec![
        ("volume cm".to_string(), State::Fresh),
        (
            "subPath waiting f".into(),
            State::Unverifiable(UnverifiableReason::ContainerNotRunning),
        ),
        (
            "env waiting X".into(),
            State::Unverifiable(UnverifiableReason::ContainerNotRunning),
        ),
        (
            "subPath running $(subPathExpr)".into(),
            State::Skipped(SkipReason::SubPathExpr),
        ),
        ("env running MISSING".into(), State::SourceMissing),
        ("env running OPTIONAL".into(), State::Fresh),
        ("env running envFrom".into(), State::SourceMissing),
    ];
    assert_eq!(got, want);
    let missing = eval
        .iter()
        .find(|(p, v)| matches!(p.subject(v), Subject::Env { var, .. } if &*var == "MISSING"))
        .unwrap()
        .1;
    assert!(missing.message().unwrap().contains(
        "key \"nokey\" missing in ConfigMap/ns/c: the kubelet refuses to start the container"
    ));
}

#[test]
fn every_state_tag_round_trips() {
    let all = State::all();
    let tags: std::collections::BTreeSet<String> = all.iter().map(State::tag).collect();
    assert_eq!(tags.len(), all.len(), "every state has its own tag");
    assert!(tags.contains("Stale/ImmutableCachePinned") && tags.contains("Skipped/subPathExpr"));
    for s in all {
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<State>(&json).unwrap(), s, "{json}");
    }
    assert!(serde_json::from_str::<State>("\"Stale/Bogus\"").is_err());
}
