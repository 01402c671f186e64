//! Table-driven tests of a Secret or ConfigMap deleted and recreated under
//! the same name with the same content (`kubectl replace --force`, a
//! re-applied manifest), rule by rule: env, volumes, subPath,
//! read-at-start, pins and the rollout gate. Nothing that cannot differ is
//! Stale; a recreation with new content keeps its verdicts (the control
//! rows).
//!
//! Two ways the engine learns that nothing changed: its history (the
//! fingerprint of the content before the object vanished, in the object's
//! scope, equals the recreated one's: `Engine::observe_source`), and,
//! without history (a one-off `verify`, a restarted controller), the
//! node's volumes showing that the kubelet's cached copy holds the current
//! values (`Ctx::node_shows_current`).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::sync::Arc;

use mountguard_inventory::Plugin;

use crate::index::ClusterIndex;
use crate::model::{EnvRef, SourceContent, SourceKind, SourceRef, VolumeSource};
use crate::rollout::{ConsumerItem, RolloutDoc, SourceItem, Target, VerifiedSource, decide};
use crate::testkit::*;
use crate::verdict::test_support::{
    CM, NOW, SCAN, SECRET, START, engine, env, pinning_pods, verdict as find, vol,
};
use crate::verdict::{EngineState, Evaluation, FrozenCause, StaleCause, State, Subject};

/// The object's first version is written.
const CREATED: &str = "2026-11-30T09:00:00Z";
/// The pods register with the kubelet (`status.startTime`).
const SYNCED: &str = "2026-11-30T09:30:00Z";
/// The object is deleted and recreated.
const RECREATED: &str = "2026-11-30T10:30:00Z";
/// A recreation within grace of the scan.
const LATE_RECREATED: &str = "2026-11-30T10:59:00Z";

const NEW: &[u8] = b"k2";
const OLD: &[u8] = b"k1";

fn sub_path() -> impl Fn(&Subject) -> bool {
    |s| matches!(s, Subject::SubPath { .. })
}

fn pod(name: &str) -> PodB {
    PodB::new("slurm", name, &format!("uid-{name}"), "node-a").synced_at(Some(ts(SYNCED)))
}

/// Secret (or ConfigMap) `slurm/auth` with key `key` = `value` (and
/// `other` = `o`), written at `at`, with UID `uid`.
fn put_auth(
    ix: &mut ClusterIndex,
    kind: SourceKind,
    immutable: bool,
    value: &[u8],
    at: &str,
    uid: &str,
) -> SourceRef {
    let r = SourceRef::new(
        kind,
        ix.interner.intern("slurm"),
        ix.interner.intern("auth"),
    );
    let c = SourceContent::from_plain(
        &mut ix.interner,
        immutable,
        [("key", value, false), ("other", &b"o"[..], false)],
        Some(uid),
        Some(ts(at)),
    );
    ix.apply_source(r.clone(), c);
    r
}

/// How the engine meets the recreation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// It saw the first version (at [`CREATED`], evaluated at
    /// `before`), the deletion and the recreation (at `recreated`):
    /// the live controller.
    Live { before: &'static str },
    /// It sees only the recreated object (one dump, empty history).
    Once,
}

/// One case's cluster: `pods` on node-a and their node inventory; the
/// source starts as `OLD` and is recreated at `recreated` with `content`.
struct Case {
    kind: SourceKind,
    immutable: bool,
    pods: Vec<PodB>,
    node: NodeB,
    recreated: &'static str,
    content: &'static [u8],
    seen: Seen,
}

impl Case {
    fn new(immutable: bool, pods: Vec<PodB>, node: NodeB, content: &'static [u8]) -> Self {
        Self {
            kind: SECRET,
            immutable,
            pods,
            node,
            recreated: RECREATED,
            content,
            seen: Seen::Live {
                before: "2026-11-30T10:20:00Z",
            },
        }
    }

    fn once(mut self) -> Self {
        self.seen = Seen::Once;
        self
    }

    fn kind(mut self, kind: SourceKind) -> Self {
        self.kind = kind;
        self
    }

    fn recreated(mut self, at: &'static str) -> Self {
        self.recreated = at;
        self
    }

    /// The evaluation at [`NOW`], with the history it leaves and the
    /// history's fingerprint of the source before the deletion.
    fn run(self) -> (Evaluation, EngineState, Option<String>, ClusterIndex) {
        let e = engine();
        let mut ix = ClusterIndex::new();
        for p in self.pods {
            ix.apply_pod(p.build());
        }
        self.node.apply(&mut ix);
        let mut state = EngineState::default();
        let mut before_fp = None;
        if let Seen::Live { before } = self.seen {
            let r = put_auth(&mut ix, self.kind, self.immutable, OLD, CREATED, "u1");
            e.evaluate_all(&ix, &mut state, ts(before));
            before_fp = state.sources[&r].fingerprint.clone();
            // The watch delivers the deletion, then the new object.
            ix.delete_source(&r);
            e.evaluate_all(&ix, &mut state, ts(self.recreated));
            put_auth(
                &mut ix,
                self.kind,
                self.immutable,
                self.content,
                self.recreated,
                "u2",
            );
            e.evaluate_all(&ix, &mut state, ts(self.recreated));
        } else {
            put_auth(
                &mut ix,
                self.kind,
                self.immutable,
                self.content,
                self.recreated,
                "u2",
            );
        }
        let eval = e.evaluate_all(&ix, &mut state, ts(NOW));
        (eval, state, before_fp, ix)
    }
}

fn key_env() -> EnvRef {
    env_key("KEY", SECRET, "auth", "key", false)
}

/// Pod `p` with one container `c` started at [`START`] reading `env`.
fn env_pod(env: Vec<EnvRef>) -> PodB {
    pod("p").container("c", Some(ts(START)), &[], env)
}

/// Pod `p` as [`env_pod`], also mounting `auth` as volume `v`.
fn env_and_volume_pod(env: Vec<EnvRef>, items: &[(&str, &str)]) -> PodB {
    pod("p")
        .volume("v", VolumeSource::Object(obj(SECRET, "auth", items, false)))
        .container("c", Some(ts(START)), &[("v", "")], env)
}

fn node() -> NodeB {
    NodeB::new("node-a", ts(SCAN))
}

/// Node-a with volume `v` of pod `uid` showing `files`, written at `at`.
fn node_with(uid: &str, files: &[(&str, &[u8])], at: &str) -> NodeB {
    node().volume(uid, Plugin::Secret, "v", files, ts(at))
}

// ------------------------------------------------------------------ env

/// `pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables` (v1.37.2):
/// the values come from the node's cache entry when the container starts;
/// an entry that predates a recreation with the same content holds the
/// current values. With neither history nor a volume of the object on the
/// node showing other bytes, the values of a container that started before
/// the recreation are not known to differ: Frozen, never Stale.
#[test]
fn env_from_an_object_recreated_with_the_same_content_is_fresh() {
    let stale = State::Stale(StaleCause::ImmutableCache);
    let frozen = State::Frozen(FrozenCause::Env);
    let whole = || vec![env_from(SECRET, "auth", "A_", false)];
    let cases: Vec<(&str, Case, State)> = vec![
        (
            "immutable, seen live: same content",
            Case::new(true, vec![env_pod(vec![key_env()])], node(), OLD),
            State::Fresh,
        ),
        (
            "immutable, seen live: new content (control)",
            Case::new(true, vec![env_pod(vec![key_env()])], node(), NEW),
            stale,
        ),
        (
            "immutable envFrom, seen live: same content",
            Case::new(true, vec![env_pod(whole())], node(), OLD),
            State::Fresh,
        ),
        (
            "mutable, seen live: same content",
            Case::new(false, vec![env_pod(vec![key_env()])], node(), OLD),
            State::Fresh,
        ),
        (
            "mutable, seen live: new content (control)",
            Case::new(false, vec![env_pod(vec![key_env()])], node(), NEW),
            frozen,
        ),
        (
            "immutable, one dump: the pod's volume shows the current bytes",
            Case::new(
                true,
                vec![env_and_volume_pod(vec![key_env()], &[])],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], START),
                OLD,
            )
            .once(),
            State::Fresh,
        ),
        (
            "immutable, one dump: a volume with items shows the key",
            Case::new(
                true,
                vec![env_and_volume_pod(vec![key_env()], &[("key", "a/b")])],
                node_with("uid-p", &[("a/b", OLD)], START),
                OLD,
            )
            .once(),
            State::Fresh,
        ),
        (
            "immutable, one dump: the volume shows old bytes (control)",
            Case::new(
                true,
                vec![env_and_volume_pod(vec![key_env()], &[])],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], START),
                NEW,
            )
            .once(),
            stale,
        ),
        (
            "immutable, one dump: the volume shows another key only: not known to differ",
            Case::new(
                true,
                vec![env_and_volume_pod(vec![key_env()], &[("other", "other")])],
                node_with("uid-p", &[("other", b"o")], START),
                OLD,
            )
            .once(),
            frozen,
        ),
        (
            "immutable, one dump, nothing on the node shows the entry: not known to differ",
            Case::new(true, vec![env_pod(vec![key_env()])], node(), OLD).once(),
            frozen,
        ),
        (
            "immutable envFrom, one dump: the whole object is current on disk",
            Case::new(
                true,
                vec![env_and_volume_pod(whole(), &[])],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], START),
                OLD,
            )
            .once(),
            State::Fresh,
        ),
        (
            "immutable envFrom, one dump: a key the object lost is still on disk",
            Case::new(
                true,
                vec![env_and_volume_pod(whole(), &[])],
                node_with(
                    "uid-p",
                    &[("gone", b"x"), ("key", OLD), ("other", b"o")],
                    START,
                ),
                OLD,
            )
            .once(),
            stale,
        ),
        (
            "immutable envFrom, one dump: only one key on disk: not known to differ",
            Case::new(
                true,
                vec![env_and_volume_pod(whole(), &[("key", "key")])],
                node_with("uid-p", &[("key", OLD)], START),
                OLD,
            )
            .once(),
            frozen,
        ),
        (
            "mutable, one dump: a volume written before the start shows the value",
            Case::new(
                false,
                vec![env_and_volume_pod(vec![key_env()], &[])],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], SYNCED),
                OLD,
            )
            .once(),
            State::Fresh,
        ),
        (
            "mutable, one dump: the volume was written after the start",
            Case::new(
                false,
                vec![env_and_volume_pod(vec![key_env()], &[])],
                node_with(
                    "uid-p",
                    &[("key", OLD), ("other", b"o")],
                    "2026-11-30T10:31:00Z",
                ),
                OLD,
            )
            .once(),
            frozen,
        ),
    ];
    let mut bad = Vec::new();
    for (case, c, want) in cases {
        let var = if matches!(c.pods[0].pod.containers[0].env[0], EnvRef::From { .. }) {
            "envFrom:A_"
        } else {
            "KEY"
        };
        let (eval, ..) = c.run();
        let v = find(&eval, "p", env("c", var));
        if v.state != want {
            bad.push(format!("{case}: {} (want {})", v.state.tag(), want.tag()));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Control: an optional reference to an object deleted after the start
/// (and not recreated) is Frozen (a restart leaves the variable unset),
/// though the history keeps the deleted object's keys.
#[test]
fn env_from_an_optional_object_deleted_after_the_start_is_frozen() {
    let e = engine();
    let mut ix = ClusterIndex::new();
    ix.apply_pod(env_pod(vec![env_key("KEY", SECRET, "auth", "key", true)]).build());
    node().apply(&mut ix);
    let mut state = EngineState::default();
    let r = put_auth(&mut ix, SECRET, false, OLD, CREATED, "u1");
    e.evaluate_all(&ix, &mut state, ts("2026-11-30T10:20:00Z"));
    ix.delete_source(&r);
    e.evaluate_all(&ix, &mut state, ts(RECREATED));
    let eval = e.evaluate_all(&ix, &mut state, ts(NOW));
    assert_eq!(
        find(&eval, "p", env("c", "KEY")).state,
        State::Frozen(FrozenCause::Env)
    );
}

// -------------------------------------------------------------- volumes

/// The volume rule compares files, so a recreation with the same content
/// leaves it Fresh; with the engine's history it also keeps the time of
/// the last real change, so a mismatch of another cause keeps its grace
/// and its `since`.
#[test]
fn volumes_across_a_recreation_with_the_same_content() {
    let p = || pod("p").volume("v", VolumeSource::Object(obj(SECRET, "auth", &[], false)));
    let cases: Vec<(&str, Case, State)> = vec![
        (
            "immutable, current on disk",
            Case::new(
                true,
                vec![p()],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], START),
                OLD,
            ),
            State::Fresh,
        ),
        (
            "immutable, current on disk, one dump",
            Case::new(
                true,
                vec![p()],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], START),
                OLD,
            )
            .once(),
            State::Fresh,
        ),
        (
            "mutable, stale for another reason long before: a recreation within grace \
             does not restart the grace",
            Case::new(
                false,
                vec![p()],
                node_with("uid-p", &[("key", b"k0"), ("other", b"o")], START),
                OLD,
            )
            .recreated(LATE_RECREATED),
            State::Stale(StaleCause::Unknown),
        ),
        (
            "mutable, recreated with new content within grace (control)",
            Case::new(
                false,
                vec![p()],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], START),
                NEW,
            )
            .recreated(LATE_RECREATED),
            State::Propagating,
        ),
        (
            "immutable, recreated with new content (control)",
            Case::new(
                true,
                vec![p()],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], START),
                NEW,
            ),
            State::Stale(StaleCause::ImmutableCache),
        ),
    ];
    let mut bad = Vec::new();
    for (case, c, want) in cases {
        let (eval, ..) = c.run();
        let v = find(&eval, "p", vol("v"));
        if v.state != want {
            bad.push(format!("{case}: {} (want {})", v.state.tag(), want.tag()));
        } else if want == State::Stale(StaleCause::Unknown) && v.since.get() != ts(CREATED) {
            bad.push(format!(
                "{case}: since {} (want the last real change)",
                v.since.get()
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

// -------------------------------------------------------------- subPath

/// subPath binds never update (kubernetes#50345): whether a difference is
/// Frozen (content changed after the start: a restart helps) or Stale
/// (content was current at the start) depends on when the content last
/// changed, which a recreation with the same content does not move.
#[test]
fn sub_paths_across_a_recreation_with_the_same_content() {
    let p = || {
        pod("p")
            .volume("v", VolumeSource::Object(obj(CM, "auth", &[], false)))
            .container("c", Some(ts(START)), &[("v", "key")], vec![])
    };
    let disk = |sub: &'static [u8]| {
        NodeB::new("node-a", ts(SCAN))
            .volume(
                "uid-p",
                Plugin::Configmap,
                "v",
                &[("key", OLD), ("other", b"o")],
                ts(SYNCED),
            )
            .sub_path("uid-p", "v", "c", 0, &[("", sub)])
    };
    let cases: Vec<(&str, Case, State)> = vec![
        (
            "current bytes bound",
            Case::new(false, vec![p()], disk(OLD), OLD).kind(CM),
            State::Fresh,
        ),
        (
            "bound from a volume that was behind at the start: still Stale, not Frozen",
            Case::new(false, vec![p()], disk(b"k0"), OLD).kind(CM),
            State::Stale(StaleCause::Unknown),
        ),
    ];
    for (case, c, want) in cases {
        let (eval, ..) = c.run();
        let v = find(&eval, "p", sub_path());
        assert_eq!(v.state, want, "{case}: {v:#?}");
    }
    // Control: new content after the start, the volume current: Frozen.
    let c = Case::new(
        false,
        vec![p()],
        NodeB::new("node-a", ts(SCAN))
            .volume(
                "uid-p",
                Plugin::Configmap,
                "v",
                &[("key", NEW), ("other", b"o")],
                ts("2026-11-30T10:31:00Z"),
            )
            .sub_path("uid-p", "v", "c", 0, &[("", OLD)]),
        NEW,
    )
    .kind(CM);
    let (eval, ..) = c.run();
    assert_eq!(
        find(&eval, "p", sub_path()).state,
        State::Frozen(FrozenCause::SubPath)
    );
}

// -------------------------------------------------------- read-at-start

/// `pkg/volume/util/atomic_writer.go` `Write`: a payload equal to what is
/// on disk is not written again, so a recreation with the same content
/// leaves a volume read only at start Fresh.
#[test]
fn read_at_start_across_a_recreation_with_the_same_content() {
    let p = || {
        pod("p")
            .volume("v", VolumeSource::Object(obj(SECRET, "auth", &[], false)))
            .read_at_start("v")
            .container("c", Some(ts(START)), &[("v", "")], vec![])
    };
    let cases: Vec<(&str, Case, State)> = vec![
        (
            "same content, not written again",
            Case::new(
                false,
                vec![p()],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], SYNCED),
                OLD,
            ),
            State::Fresh,
        ),
        (
            "same content, one dump",
            Case::new(
                true,
                vec![p()],
                node_with("uid-p", &[("key", OLD), ("other", b"o")], SYNCED),
                OLD,
            )
            .once(),
            State::Fresh,
        ),
        (
            "new content written after the start (control)",
            Case::new(
                false,
                vec![p()],
                node_with(
                    "uid-p",
                    &[("key", NEW), ("other", b"o")],
                    "2026-11-30T10:31:00Z",
                ),
                NEW,
            ),
            State::Frozen(FrozenCause::ReadAtStart),
        ),
    ];
    for (case, c, want) in cases {
        let (eval, ..) = c.run();
        assert_eq!(find(&eval, "p", vol("v")).state, want, "{case}");
    }
}

// ----------------------------------------------------------------- pins

/// `pkg/kubelet/util/manager/watch_based_manager.go`: another pod holding
/// the cache entry across the recreation pins the old object, which is
/// harmless when it has the same content: nobody is named as pinning.
#[test]
fn pins_across_a_recreation_with_the_same_content() {
    let holder = || pod("o").image_pull_secret("auth");
    let holder_with_volume =
        || pod("o").volume("v", VolumeSource::Object(obj(SECRET, "auth", &[], false)));
    // A pod registered after the recreation, its container started then.
    let late = || {
        PodB::new("slurm", "p", "uid-p", "node-a")
            .synced_at(Some(ts("2026-11-30T10:40:00Z")))
            .container("c", Some(ts("2026-11-30T10:41:00Z")), &[], vec![key_env()])
    };
    let cases: Vec<(&str, Case, State, Vec<&str>)> = vec![
        (
            "seen live, same content",
            Case::new(true, vec![late(), holder()], node(), OLD),
            State::Fresh,
            vec![],
        ),
        (
            "seen live, new content (control)",
            Case::new(true, vec![late(), holder()], node(), NEW),
            State::Stale(StaleCause::ImmutableCachePinned),
            vec!["o"],
        ),
        (
            "one dump, the holder's volume shows the current bytes",
            Case::new(
                true,
                vec![late(), holder_with_volume()],
                node_with("uid-o", &[("key", OLD), ("other", b"o")], SYNCED),
                OLD,
            )
            .once(),
            State::Fresh,
            vec![],
        ),
        (
            "one dump, the holder's volume shows old bytes (control)",
            Case::new(
                true,
                vec![late(), holder_with_volume()],
                node_with("uid-o", &[("key", OLD), ("other", b"o")], SYNCED),
                NEW,
            )
            .once(),
            State::Stale(StaleCause::ImmutableCachePinned),
            vec!["o"],
        ),
    ];
    let mut bad = Vec::new();
    for (case, c, want, by) in cases {
        let (eval, ..) = c.run();
        let v = find(&eval, "p", env("c", "KEY"));
        if (v.state, pinning_pods(v)) != (want, by.clone()) {
            bad.push(format!(
                "{case}: {} pinned by {:?} (want {} pinned by {by:?})",
                v.state.tag(),
                pinning_pods(v),
                want.tag()
            ));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

// ---------------------------------------------------------- rollout gate

/// The rollout document as the controller builds it from one evaluation:
/// the source's current fingerprint and UID, and each consumer verified
/// against `verified_fp`.
fn gate_doc(
    eval: &Evaluation,
    current_fp: Option<String>,
    verified_fp: Option<String>,
) -> RolloutDoc {
    RolloutDoc {
        acting: true,
        ready: true,
        target: "secret/slurm/auth".into(),
        sources: vec![SourceItem {
            kind: "Secret".into(),
            namespace: "slurm".into(),
            name: "auth".into(),
            present: true,
            fingerprint: current_fp,
            uid: Some("u2".into()),
            changed_at: None,
        }],
        consumers: eval
            .iter()
            .map(|(p, v)| ConsumerItem {
                namespace: "slurm".into(),
                pod: p.pod.name.to_string(),
                node: Some("node-a".into()),
                nodeset: None,
                subject: p.subject(v).text(),
                state: v.state.tag(),
                sources: vec![VerifiedSource {
                    kind: "Secret".into(),
                    name: "auth".into(),
                    fingerprint: verified_fp.clone(),
                }],
                verified_at: Some(SCAN.into()),
                node_reporting: true,
                pinned_by: v.pinned_by().iter().map(|s| s.to_string()).collect(),
                message: v.message().map(str::to_string),
            })
            .collect(),
        attempts: vec![],
        unscheduled: vec![],
    }
}

/// The gate counts a consumer verified against the object before its
/// recreation when the recreated object has the same content: the same
/// fingerprint (same object scope, same content), and its verdicts Fresh.
#[test]
fn the_rollout_gate_completes_across_a_recreation_with_the_same_content() {
    let pods = || {
        vec![
            env_and_volume_pod(vec![key_env()], &[]),
            pod("o").image_pull_secret("auth"),
        ]
    };
    let disk = || node_with("uid-p", &[("key", OLD), ("other", b"o")], SYNCED);
    let target: Target = "secret/slurm/auth".parse().unwrap();
    // (case, new content, complete)
    let cases: Vec<(&str, &'static [u8], bool)> = vec![
        ("same content", OLD, true),
        ("new content (control)", NEW, false),
    ];
    for (case, content, complete) in cases {
        let (eval, state, before, _) = Case::new(true, pods(), disk(), content).run();
        let r = SourceRef::new(SECRET, Arc::from("slurm"), Arc::from("auth"));
        let now_fp = state.sources[&r].fingerprint.clone();
        assert_eq!(now_fp == before, content == OLD, "{case}: fingerprints");
        let p = decide(&gate_doc(&eval, now_fp, before), &target, Some("u2"));
        assert_eq!(p.complete(), complete, "{case}: {p:#?}");
        assert_eq!(p.total, 2, "{case}: volume and env");
    }
}

// -------------------------------------------------------------- history

/// The history remembers the content before a deletion (as a keyed
/// fingerprint), so the recreation with the same content keeps the object's
/// and each key's change time, and survives a round trip through its
/// serialized form; new content is a change.
#[test]
fn history_keeps_change_times_across_a_deletion_and_a_same_content_recreation() {
    let e = engine();
    let mut ix = ClusterIndex::new();
    let mut state = EngineState::default();
    let r = put_auth(&mut ix, SECRET, true, OLD, CREATED, "u1");
    e.observe_source(&ix, &mut state, &r, ts("2026-11-30T10:00:00Z"));
    ix.delete_source(&r);
    e.observe_source(&ix, &mut state, &r, ts(RECREATED));
    assert_eq!(state.sources[&r].fingerprint, None);
    let json = serde_json::to_string(&state).unwrap();
    let raw = hex::encode(mountguard_inventory::file_digest(OLD));
    assert!(!json.contains(&raw[..12]), "{json}");
    let mut state: EngineState = serde_json::from_str(&json).unwrap();
    put_auth(&mut ix, SECRET, true, OLD, RECREATED, "u2");
    e.observe_source(&ix, &mut state, &r, ts(RECREATED));
    let h = &state.sources[&r];
    assert_eq!(h.content_changed_at, Some(ts(CREATED)));
    assert_eq!(h.keys["key"].changed_at, Some(ts(CREATED)));
    assert_eq!(h.before_absence, None);
    // Deleted again, recreated with a new value of one key: the object and
    // that key changed, the other key did not.
    ix.delete_source(&r);
    e.observe_source(&ix, &mut state, &r, ts(NOW));
    put_auth(&mut ix, SECRET, true, NEW, NOW, "u3");
    e.observe_source(&ix, &mut state, &r, ts(NOW));
    let h = &state.sources[&r];
    assert_eq!(h.content_changed_at, Some(ts(NOW)));
    assert_eq!(h.keys["key"].changed_at, Some(ts(NOW)));
    assert_eq!(h.keys["other"].changed_at, Some(ts(CREATED)));
}
