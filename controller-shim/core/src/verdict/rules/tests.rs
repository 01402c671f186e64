//! Table-driven tests of the rules: every verdict state and cause of
//! volumes, subPath mounts and env references, and the node rule.

use std::sync::Arc;

use mountguard_inventory::{Plugin, ReadErrorKind, volume_digest};

use crate::index::ClusterIndex;
use crate::model::{ProjectedSource, SkipReason, VolumeSource};
use crate::testkit::*;
use crate::verdict::{
    EngineState, FileState, FrozenCause, StaleCause, State, Subject, UnverifiableReason,
};

use crate::verdict::test_support::*;

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
        let f = volume_scope(&eval, "p", "v");
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
    assert_eq!(sp.since.get(), ts("2026-11-30T10:30:00Z"));

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
            assert_eq!(v.since.get(), ts(written));
            assert!(v.message().unwrap().contains("slurmd"));
            // Not Fresh: its (current) files are listed, which says the
            // containers read Slurm's key from it.
            let files: Vec<(&str, FileState)> =
                v.files().iter().map(|f| (&*f.path, f.state)).collect();
            assert_eq!(files, [("slurm.key", FileState::Fresh)]);
            assert!(v.files()[0].expected.is_some());
            assert_eq!(v.files()[0].expected, v.files()[0].observed);
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
                volume_scope(&eval, "p", "kube-api-access-x7k2p")
                    .fingerprint(&volume_digest([("ca.crt", &d(ca))]))
            )
        );
    }
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
    let gone = ix.delete_pod(&uid("uid-q")).unwrap();
    let affected: Vec<crate::PodUid> = ix
        .affected_by_pod(&gone)
        .iter()
        .map(|id| ix.pod(*id).unwrap().uid.clone())
        .collect();
    assert_eq!(affected, [uid("uid-p")]);
    let mut uids: Vec<&crate::PodUid> = affected.iter().collect();
    let q = uid("uid-q");
    uids.push(&q);
    let inc = e.evaluate_pods(&ix, &mut state, &uids, now);
    let v = verdict(&inc, "p", vol("v"));
    assert_eq!(v.state, State::Stale(StaleCause::ImmutableCache));
    assert!(v.pinned_by().is_empty());
    assert_eq!(inc.removed, vec![uid("uid-q")]);
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
    p2.set_namespace(a("other"));
    p2.name = "p2".into();
    p2.uid = uid("uid-2");
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
    // The same bytes on disk in two namespaces: fingerprints keyed to each
    // pod's volume, so one tenant cannot match another's content.
    assert_ne!(v2.observed, verdict(&eval, "p1", vol("v")).observed);
    assert_eq!(
        v2.observed,
        Some(volume_scope(&eval, "p2", "v").fingerprint(&volume_digest([("k", &d(b"in-ns"))])))
    );
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
