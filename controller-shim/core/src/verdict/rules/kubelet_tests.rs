//! Table-driven tests of the rules the engine takes from the kubelet: which
//! references pin a cache entry, init and ephemeral containers as
//! consumers, terminating pods, env served from a pinned cache (Stale only
//! when known to differ), per-key env history, containers restarted in
//! place, env not from the API (`fileKeyRef`). Each case names the upstream
//! rule it checks (see the comments on `PodModel::references`,
//! `PodModel::registered` and `Ctx::env_verdict`).
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use mountguard_inventory::Plugin;

use crate::index::ClusterIndex;
use crate::model::{EnvRef, ProjectedSource, SkipReason, VolumeSource};
use crate::testkit::*;
use crate::verdict::test_support::{
    CM, NOW, SCAN, SECRET, START, engine, env, pinning_pods, verdict as find, vol,
};
use crate::verdict::{EngineState, Evaluation, FrozenCause, StaleCause, State, Subject};

/// The pods registered with the kubelet long before anything changed.
const SYNCED: &str = "2026-11-30T09:00:00Z";
/// The immutable Secret is deleted and recreated with new content.
const RECREATED: &str = "2026-11-30T10:30:00Z";

/// Immutable `slurm/auth` recreated at [`RECREATED`] with `new`; the worker
/// pod `victim` on node-a still shows `old` in its `slurm-etc` volume.
fn recreated_auth() -> ClusterIndex {
    let mut ix = ClusterIndex::new();
    put_auth(&mut ix, b"new", RECREATED);
    let auth = ProjectedSource::Object(obj(SECRET, "auth", &[], false));
    ix.apply_pod(
        PodB::new("slurm", "victim", "uid-v", "node-a")
            .synced_at(Some(ts(SYNCED)))
            .volume("slurm-etc", VolumeSource::Projected(Box::new([auth])))
            .container("slurmd", Some(ts(START)), &[], vec![])
            .build(),
    );
    victim_node().apply(&mut ix);
    ix
}

/// Node-a showing the victim's `slurm-etc` with the old key, written at
/// [`START`].
fn victim_node() -> NodeB {
    NodeB::new("node-a", ts(SCAN)).volume(
        "uid-v",
        Plugin::Projected,
        "slurm-etc",
        &[("slurm.key", b"old")],
        ts(START),
    )
}

/// [`recreated_auth`] with the victim's container `slurmd` also reading
/// `slurm.key` through a subPath of `slurm-etc` and as env `K`; `terminating`
/// marks the victim as deleted. The caller applies node-a.
fn victim_reading_the_key(terminating: bool) -> ClusterIndex {
    let mut ix = recreated_auth();
    let mut victim = ix
        .pod(ix.pod_id(&uid("uid-v")).unwrap())
        .unwrap()
        .as_ref()
        .clone();
    victim.terminating = terminating;
    victim.containers = Box::new([]);
    let victim = PodB { pod: victim }
        .container(
            "slurmd",
            Some(ts(START)),
            &[("slurm-etc", "slurm.key")],
            vec![env_key("K", SECRET, "auth", "slurm.key", false)],
        )
        .build();
    ix.apply_pod(victim);
    ix
}

fn other(name: &str) -> PodB {
    PodB::new("slurm", name, &format!("uid-{name}"), "node-a").synced_at(Some(ts(SYNCED)))
}

/// Immutable Secret `slurm/auth` holding `slurm.key` = `value`, created at
/// `at`.
fn put_auth(ix: &mut ClusterIndex, value: &[u8], at: &str) {
    let values: &[(&str, &[u8])] = &[("slurm.key", value)];
    put_source(ix, SECRET, "slurm", "auth", values, true, Some(ts(at)));
}

/// Mutable ConfigMap `slurm/{name}` whose one key `key` became `v2` at `at`.
fn put_cm(ix: &mut ClusterIndex, name: &str, key: &str, at: &str) {
    put_source(ix, CM, "slurm", name, &[(key, b"v2")], false, Some(ts(at)));
}

/// One evaluation of `ix` at [`NOW`], with no history.
fn evaluate(ix: &ClusterIndex) -> Evaluation {
    engine().evaluate_all(ix, &mut EngineState::default(), ts(NOW))
}

// ------------------------------------------------ 1. what pins a cache entry

/// `pkg/api/v1/pod/util.go` `VisitPodSecretNames`: every kind of reference
/// registers the pod; `PodModel::registered`: only pods the kubelet synced
/// and has not unregistered (`SyncTerminatedPod`) hold the entry.
#[test]
fn every_reference_the_kubelet_counts_pins_and_nothing_else_does() {
    let key = || vec![env_key("K", SECRET, "auth", "slurm.key", false)];
    let cases: Vec<(&str, PodB, bool)> = vec![
        (
            "imagePullSecrets",
            other("o").image_pull_secret("auth"),
            true,
        ),
        (
            "env of a regular container",
            other("o").container("c", Some(ts(START)), &[], key()),
            true,
        ),
        (
            "env of a regular container that is not running",
            other("o").container("c", None, &[], key()),
            true,
        ),
        (
            "env of a finished init container",
            other("o").init_container("copy-key", Some(ts(START)), true, &[], key()),
            true,
        ),
        (
            "env of an init container not started yet",
            other("o").init_container("wait", None, false, &[], key()),
            true,
        ),
        (
            "envFrom of an ephemeral container",
            other("o").ephemeral_container(
                "debug",
                Some(ts(START)),
                vec![env_from(SECRET, "auth", "", false)],
            ),
            true,
        ),
        (
            "secret volume",
            other("o").volume("v", VolumeSource::Object(obj(SECRET, "auth", &[], false))),
            true,
        ),
        (
            "projected source",
            other("o").volume(
                "v",
                VolumeSource::Projected(Box::new([ProjectedSource::Object(obj(
                    SECRET,
                    "auth",
                    &[],
                    true,
                ))])),
            ),
            true,
        ),
        (
            "CSI nodePublishSecretRef (no verdict of its own)",
            other("o").other_ref(SECRET, "auth"),
            true,
        ),
        (
            "terminating pod: registered until it is gone",
            other("o").image_pull_secret("auth").terminating(),
            true,
        ),
        (
            "a ConfigMap of the same name is another cache",
            other("o").volume("v", VolumeSource::Object(obj(CM, "auth", &[], false))),
            false,
        ),
        (
            "not synced by the kubelet yet",
            other("o").image_pull_secret("auth").synced_at(None),
            false,
        ),
        (
            "terminated (Succeeded/Failed): unregistered",
            other("o").image_pull_secret("auth").terminated(),
            false,
        ),
        (
            "deleted and terminal (SyncTerminatingPod reported the phase): registered until it is gone",
            other("o")
                .image_pull_secret("auth")
                .terminated()
                .terminating(),
            true,
        ),
        (
            "unscheduled",
            other("o").image_pull_secret("auth").unscheduled(),
            false,
        ),
        (
            "another namespace",
            PodB::new("elsewhere", "o", "uid-o", "node-a").image_pull_secret("auth"),
            false,
        ),
        (
            "another node",
            PodB::new("slurm", "o", "uid-o", "node-b").image_pull_secret("auth"),
            false,
        ),
    ];
    for (case, pod, pins) in cases {
        let mut ix = recreated_auth();
        ix.apply_pod(pod.build());
        let eval = evaluate(&ix);
        let v = find(&eval, "victim", vol("slurm-etc"));
        if pins {
            assert_eq!(
                v.state,
                State::Stale(StaleCause::ImmutableCachePinned),
                "{case}"
            );
            assert_eq!(pinning_pods(v), ["o"], "{case}");
        } else {
            assert_eq!(v.state, State::Stale(StaleCause::ImmutableCache), "{case}");
            assert!(v.pinned_by().is_empty(), "{case}");
        }
    }
}

// ------------------------------------------- 2. init and ephemeral consumers

#[test]
fn init_and_ephemeral_containers_get_env_verdicts_with_the_right_advice() {
    // A mutable ConfigMap whose key changed at 10:30.
    // (case, container, started, finished init container (None:
    // ephemeral), expected state, advice fragment)
    type Case<'a> = (
        &'a str,
        &'a str,
        Option<&'a str>,
        Option<bool>,
        State,
        Option<&'a str>,
    );
    let cases: Vec<Case> = vec![
        (
            "finished init container started before the change",
            "i",
            Some(START),
            Some(true),
            State::Frozen(FrozenCause::Env),
            Some("replace the pod"),
        ),
        (
            "finished init container started after the change",
            "i",
            Some("2026-11-30T10:45:00Z"),
            Some(true),
            State::Fresh,
            None,
        ),
        (
            "sidecar init container running since before the change",
            "i",
            Some(START),
            Some(false),
            State::Frozen(FrozenCause::Env),
            Some("restart container i"),
        ),
        (
            "init container not started yet",
            "i",
            None,
            Some(false),
            State::Unverifiable(crate::verdict::UnverifiableReason::ContainerNotRunning),
            None,
        ),
        (
            "running ephemeral container started before the change",
            "debug",
            Some(START),
            None,
            State::Frozen(FrozenCause::Env),
            Some("restart container debug"),
        ),
    ];
    for (case, container, started, finished, want, advice) in cases {
        let mut ix = ClusterIndex::new();
        put_cm(&mut ix, "hooks", "k", RECREATED);
        let hook = vec![env_key("HOOK", CM, "hooks", "k", false)];
        let started = started.map(ts);
        let pod = match finished {
            Some(done) => other("p").init_container(container, started, done, &[], hook),
            None => other("p").ephemeral_container(container, started, hook),
        };
        ix.apply_pod(pod.build());
        NodeB::new("node-a", ts(SCAN)).apply(&mut ix);
        let eval = evaluate(&ix);
        let v = find(&eval, "p", env(container, "HOOK"));
        assert_eq!(v.state, want, "{case}");
        match advice {
            Some(a) => assert!(v.message().unwrap().contains(a), "{case}: {v:?}"),
            None => assert!(v.message().is_none(), "{case}: {v:?}"),
        }
    }
}

/// The common pattern: an init container copies the key from a read-at-start
/// volume into an emptyDir; content refreshed after it ran is Frozen for
/// the pod, and only a new pod runs the init container again.
#[test]
fn an_init_container_that_read_a_read_at_start_volume_freezes_the_pod() {
    // (volume written at, expected, advice)
    let cases = [
        (
            "2026-11-30T10:40:00Z",
            State::Frozen(FrozenCause::ReadAtStart),
            Some("replace the pod"),
        ),
        ("2026-11-30T09:59:00Z", State::Fresh, None),
    ];
    for (written, want, advice) in cases {
        let mut ix = ClusterIndex::new();
        put_cm(&mut ix, "hooks", "10.sh", "2026-11-30T10:39:00Z");
        ix.apply_pod(
            hooks_pod()
                .read_at_start("hooks")
                .container("slurmd", Some(ts(START)), &[], vec![])
                .init_container(
                    "copy-hooks",
                    Some(ts(START)),
                    true,
                    &[("hooks", "")],
                    vec![],
                )
                .build(),
        );
        hooks_node(b"v2", written).apply(&mut ix);
        let eval = evaluate(&ix);
        let v = find(&eval, "w", vol("hooks"));
        assert_eq!(v.state, want, "written {written}");
        if let Some(a) = advice {
            let m = v.message().unwrap();
            assert!(m.contains("copy-hooks") && m.contains(a), "{m}");
        }
    }
}

// ------------------------------------------------------ 3. terminating pods

#[test]
fn a_terminating_pod_is_skipped_whole_and_still_pins() {
    // The victim itself is terminating: stale bytes, but no Stale verdict.
    let mut ix = victim_reading_the_key(true);
    // A fresh pod on the same node is pinned by the terminating one.
    ix.apply_pod(
        other("newcomer")
            .synced_at(Some(ts("2026-11-30T10:50:00Z")))
            .volume("v", VolumeSource::Object(obj(SECRET, "auth", &[], false)))
            .build(),
    );
    victim_node()
        .volume(
            "uid-newcomer",
            Plugin::Secret,
            "v",
            &[("slurm.key", b"old")],
            ts("2026-11-30T10:50:00Z"),
        )
        .apply(&mut ix);
    let mut state = EngineState::default();
    let eval = engine().evaluate_all(&ix, &mut state, ts(NOW));
    let victim: Vec<State> = eval
        .iter()
        .filter(|(p, _)| &*p.pod.name == "victim")
        .map(|(_, v)| v.state)
        .collect();
    assert_eq!(
        victim,
        [State::Skipped(SkipReason::PodTerminating); 3],
        "volume, subPath and env"
    );
    let n = state.nodes.get("node-a").unwrap();
    assert_eq!(n.mutable_mounts, 0, "a terminating pod counts for no rule");
    let v = find(&eval, "newcomer", vol("v"));
    assert_eq!(v.state, State::Stale(StaleCause::ImmutableCachePinned));
    assert_eq!(pinning_pods(v), ["victim"]);
}

// ---------------------------------------- 4. env served from a pinned cache

/// A pod `p` with env from immutable `auth` (recreated at [`RECREATED`]),
/// registered at `synced`, its container started at `started`; `others`
/// also on node-a.
fn env_case(synced: &str, started: &str, others: Vec<PodB>) -> Evaluation {
    evaluate(&env_index(RECREATED, synced, started, others))
}

/// The cluster of [`env_case`], with `auth` recreated at `recreated`.
fn env_index(recreated: &str, synced: &str, started: &str, others: Vec<PodB>) -> ClusterIndex {
    let mut ix = ClusterIndex::new();
    put_auth(&mut ix, b"new", recreated);
    let key = vec![env_key("KEY", SECRET, "auth", "slurm.key", false)];
    let p = other("p").synced_at(Some(ts(synced)));
    ix.apply_pod(p.container("c", Some(ts(started)), &[], key).build());
    for o in others {
        ix.apply_pod(o.build());
    }
    NodeB::new("node-a", ts(SCAN)).apply(&mut ix);
    ix
}

/// `pkg/kubelet/util/manager/watch_based_manager.go` (v1.37.2): the
/// entry of an immutable object is never refreshed and lives while a
/// registered pod references it; `pkg/kubelet/kubelet_pods.go`
/// `makeEnvironmentVariables` reads env from it at each container start.
/// Without history (one dump, as `verify` has) the change time is the new
/// object's creation, and nothing says the old object's values differ: a
/// container that started before the recreation is Frozen/Env (never
/// Stale), with advice that never says restart; one that (re)started after
/// it was served the pinned old object and is Stale.
#[test]
fn env_from_a_cache_entry_older_than_the_recreation() {
    let early = || other("early").image_pull_secret("auth");
    let late = || {
        other("late")
            .synced_at(Some(ts("2026-11-30T10:40:00Z")))
            .image_pull_secret("auth")
    };
    // (case, pod synced, container started, others, expected, pinned by)
    type Case<'a> = (&'a str, &'a str, &'a str, Vec<PodB>, State, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            "restarted after the recreation in a pod registered before it",
            SYNCED,
            "2026-11-30T10:45:00Z",
            vec![],
            State::Stale(StaleCause::ImmutableCache),
            vec![],
        ),
        (
            "started before the recreation, nothing shows the old values: not known to differ",
            SYNCED,
            START,
            vec![],
            State::Frozen(FrozenCause::Env),
            vec![],
        ),
        (
            "started before the recreation, another pod holds the entry too",
            SYNCED,
            START,
            vec![early()],
            State::Frozen(FrozenCause::Env),
            vec!["early"],
        ),
        (
            "a new pod while an older pod holds the entry",
            "2026-11-30T10:40:00Z",
            "2026-11-30T10:41:00Z",
            vec![early()],
            State::Stale(StaleCause::ImmutableCachePinned),
            vec!["early"],
        ),
        (
            "a new pod, and the other holder registered after the recreation too",
            "2026-11-30T10:40:00Z",
            "2026-11-30T10:41:00Z",
            vec![late()],
            State::Fresh,
            vec![],
        ),
        (
            "a new pod alone on the node",
            "2026-11-30T10:40:00Z",
            "2026-11-30T10:41:00Z",
            vec![],
            State::Fresh,
            vec![],
        ),
    ];
    for (case, synced, started, others, want, pinned) in cases {
        let eval = env_case(synced, started, others);
        let v = find(&eval, "p", env("c", "KEY"));
        assert_eq!(v.state, want, "{case}");
        assert_eq!(pinning_pods(v), pinned, "{case}");
        if let State::Stale(_) = want {
            let m = v.message().unwrap();
            assert!(!m.contains("restart container"), "{case}: {m}");
            assert!(
                m.contains("restart gets the same") || m.contains("neither a restart"),
                "{case}: {m}"
            );
        }
        if let State::Frozen(_) = want {
            let m = v.message().unwrap();
            assert!(m.contains("may equal the current ones"), "{case}: {m}");
            assert!(m.contains("restart reads the same values"), "{case}: {m}");
            let p = eval.pods.iter().find(|p| &*p.pod.name == "p").unwrap();
            let advice = v.advice(p).unwrap();
            assert!(!advice.contains("Restart "), "{case}: {advice}");
            assert!(
                advice.contains("reads the same older values"),
                "{case}: {advice}"
            );
        }
    }
    // Within grace of a recreation after the start, with nothing showing
    // the old values: Frozen at once, as a mutable object's env is.
    let eval = evaluate(&env_index("2026-11-30T11:00:00Z", SYNCED, START, vec![]));
    assert_eq!(
        find(&eval, "p", env("c", "KEY")).state,
        State::Frozen(FrozenCause::Env)
    );
}

/// The same container (started before the recreation of immutable `auth`,
/// its pod registered before it), with evidence that the old object's
/// values differ: Stale. Evidence is the engine's history of the key (it
/// saw the value change: `Engine::observe_source`) or a volume of the same
/// cache entry on the node showing other bytes for the key
/// (`pkg/volume/util/atomic_writer.go` `Write` writes what the entry
/// holds). Within grace, as a volume: Propagating.
#[test]
fn env_of_a_container_older_than_the_recreation_is_stale_only_when_known_to_differ() {
    let key = || vec![env_key("KEY", SECRET, "auth", "slurm.key", false)];
    let pod = |with_volume: bool| {
        let p = other("p");
        let p = if with_volume {
            p.volume("v", VolumeSource::Object(obj(SECRET, "auth", &[], false)))
        } else {
            p
        };
        p.container("c", Some(ts(START)), &[], key()).build()
    };
    // (case, volume on disk, history seen before, recreated with, want)
    type Case<'a> = (&'a str, Option<&'a [u8]>, Option<&'a [u8]>, &'a [u8], State);
    let stale = State::Stale(StaleCause::ImmutableCache);
    let frozen = State::Frozen(FrozenCause::Env);
    let cases: Vec<Case> = vec![
        ("no history, no volume", None, None, b"new", frozen),
        (
            "no history, the volume shows other bytes",
            Some(b"old"),
            None,
            b"new",
            stale,
        ),
        (
            "no history, the volume shows the current bytes",
            Some(b"new"),
            None,
            b"new",
            State::Fresh,
        ),
        (
            "history saw the value change",
            None,
            Some(b"old"),
            b"new",
            stale,
        ),
        (
            "history saw the same value come back",
            None,
            Some(b"new"),
            b"new",
            State::Fresh,
        ),
    ];
    for (case, on_disk, before, now_value, want) in cases {
        let e = engine();
        let mut ix = ClusterIndex::new();
        ix.apply_pod(pod(on_disk.is_some()));
        let mut node = NodeB::new("node-a", ts(SCAN));
        if let Some(bytes) = on_disk {
            node = node.volume(
                "uid-p",
                Plugin::Secret,
                "v",
                &[("slurm.key", bytes)],
                ts(START),
            );
        }
        node.apply(&mut ix);
        let mut state = EngineState::default();
        if let Some(old) = before {
            put_auth(&mut ix, old, SYNCED);
            e.evaluate_all(&ix, &mut state, ts("2026-11-30T10:20:00Z"));
            let r = crate::model::SourceRef::new(SECRET, "slurm".into(), "auth".into());
            ix.delete_source(&r);
            e.evaluate_all(&ix, &mut state, ts(RECREATED));
            put_auth(&mut ix, now_value, RECREATED);
            e.evaluate_all(&ix, &mut state, ts(RECREATED));
        }
        put_auth(&mut ix, now_value, RECREATED);
        let eval = e.evaluate_all(&ix, &mut state, ts(NOW));
        assert_eq!(find(&eval, "p", env("c", "KEY")).state, want, "{case}");
    }
}

/// One pod's verdicts never give contradicting advice: with the volume of an
/// immutable object stale, neither its subPath nor an env var from it says
/// "restart".
#[test]
fn one_pods_verdicts_never_contradict_each_other() {
    let mut ix = victim_reading_the_key(false);
    victim_node()
        .sub_path("uid-v", "slurm-etc", "slurmd", 0, &[("", b"old")])
        .apply(&mut ix);
    let eval = evaluate(&ix);
    let states: Vec<State> = eval.iter().map(|(_, v)| v.state).collect();
    assert_eq!(
        states,
        [State::Stale(StaleCause::ImmutableCache); 3],
        "volume, subPath, env: {eval:#?}"
    );
    for (_, v) in eval.iter() {
        if let Some(m) = v.message() {
            assert!(!m.contains("restart container"), "{m}");
        }
    }

    // A mutable volume that is current: its subPath is Frozen and a
    // restart is the advice.
    let eval = evaluate(&hooks_sub_path(b"v2", "2026-11-30T10:31:00Z"));
    let sp = find(&eval, "w", |s| matches!(s, Subject::SubPath { .. }));
    assert_eq!(sp.state, State::Frozen(FrozenCause::SubPath));
    assert!(sp.message().unwrap().contains("restart container slurmd"));

    // The same, with the volume itself still behind (kubelet late): the
    // subPath follows the volume instead of advising a restart.
    let eval = evaluate(&hooks_sub_path(b"v1", START));
    let v = find(&eval, "w", vol("hooks"));
    let sp = find(&eval, "w", |s| matches!(s, Subject::SubPath { .. }));
    assert_eq!(v.state, State::Stale(StaleCause::Unknown));
    assert_eq!(sp.state, v.state);
}

/// Mutable ConfigMap `hooks` (now `v2`, changed at [`RECREATED`]) mounted by
/// pod `w` as a volume and through subPath `10.sh` bound at start (`v1`);
/// the volume on disk shows `on_disk`, written at `written`.
fn hooks_sub_path(on_disk: &[u8], written: &str) -> ClusterIndex {
    hooks_bound(START, vec![], on_disk, written, b"v1")
}

/// [`hooks_sub_path`] with container `slurmd` started at `started`, reading
/// `env`, and its subPath bind showing `bind`.
fn hooks_bound(
    started: &str,
    env: Vec<EnvRef>,
    on_disk: &[u8],
    written: &str,
    bind: &[u8],
) -> ClusterIndex {
    let mut ix = ClusterIndex::new();
    put_cm(&mut ix, "hooks", "10.sh", RECREATED);
    ix.apply_pod(
        hooks_pod()
            .container("slurmd", Some(ts(started)), &[("hooks", "10.sh")], env)
            .build(),
    );
    hooks_node(on_disk, written)
        .sub_path("uid-w", "hooks", "slurmd", 0, &[("", bind)])
        .apply(&mut ix);
    ix
}

/// Pod `w` with volume `hooks` of ConfigMap `hooks`.
fn hooks_pod() -> PodB {
    other("w").volume("hooks", VolumeSource::Object(obj(CM, "hooks", &[], false)))
}

/// Node-a showing `w`'s volume `hooks` with `10.sh` = `on_disk`, written at
/// `written`.
fn hooks_node(on_disk: &[u8], written: &str) -> NodeB {
    NodeB::new("node-a", ts(SCAN)).volume(
        "uid-w",
        Plugin::Configmap,
        "hooks",
        &[("10.sh", on_disk)],
        ts(written),
    )
}

// --------------------------------------------------- 5. env history per key

#[test]
fn env_changes_are_tracked_per_key() {
    let mut ix = ClusterIndex::new();
    let creds = |ix: &mut ClusterIndex, password: &[u8], at: &str| {
        put_source(
            ix,
            SECRET,
            "slurm",
            "db",
            &[("user", b"slurm"), ("password", password)],
            false,
            Some(ts(at)),
        );
    };
    creds(&mut ix, b"p1", "2026-11-30T09:00:00Z");
    ix.apply_pod(
        other("p")
            .container(
                "c",
                Some(ts(START)),
                &[],
                vec![
                    env_key("USER", SECRET, "db", "user", false),
                    env_key("PASSWORD", SECRET, "db", "password", false),
                    env_from(SECRET, "db", "DB_", false),
                ],
            )
            .build(),
    );
    NodeB::new("node-a", ts(SCAN)).apply(&mut ix);
    let e = engine();
    let mut state = EngineState::default();
    let first = e.evaluate_all(&ix, &mut state, ts(SCAN));
    assert!(
        first.iter().all(|(_, v)| v.state == State::Fresh),
        "{first:#?}"
    );
    // The watch delivers a new password at NOW.
    creds(&mut ix, b"p2", "2026-11-30T11:00:20Z");
    let eval = e.evaluate_all(&ix, &mut state, ts(NOW));
    assert_eq!(find(&eval, "p", env("c", "USER")).state, State::Fresh);
    assert_eq!(
        find(&eval, "p", env("c", "PASSWORD")).state,
        State::Frozen(FrozenCause::Env)
    );
    assert_eq!(
        find(&eval, "p", env("c", "envFrom:DB_")).state,
        State::Frozen(FrozenCause::Env),
        "envFrom sees every key"
    );
    // The history keeps keyed fingerprints per key, never values or digests.
    let h = &state.sources[&crate::model::SourceRef::new(SECRET, a("slurm"), a("db"))];
    assert_eq!(
        h.keys.keys().map(|k| &**k).collect::<Vec<_>>(),
        ["password", "user"]
    );
    assert_eq!(h.keys["user"].changed_at, Some(ts("2026-11-30T09:00:00Z")));
    assert_eq!(h.keys["password"].changed_at, Some(ts(NOW)));
    let json = serde_json::to_string(&state).unwrap();
    let raw = hex::encode(mountguard_inventory::file_digest(b"p2"));
    assert!(!json.contains("p2") && !json.contains(&raw), "{json}");
    let back: EngineState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, state);

    // Without history (one dump), every key is taken to have changed with
    // the object: both are Frozen.
    let eval = e.evaluate_all(&ix, &mut EngineState::default(), ts(NOW));
    assert_eq!(
        find(&eval, "p", env("c", "USER")).state,
        State::Frozen(FrozenCause::Env)
    );
}

#[test]
fn history_written_before_per_key_tracking_still_loads() {
    let json = r#"{"sources":[{"kind":"Secret","namespace":"ns","name":"s","fingerprint":"ab","contentChangedAt":"2026-11-30T10:00:00Z"}],"pods":{},"nodes":{}}"#;
    let s: EngineState = serde_json::from_str(json).unwrap();
    let h = s.sources.values().next().unwrap();
    assert!(h.keys.is_empty());
}

// ------------------------------------------- 6. containers restarted in place

/// A container restarted in place (`ContainerRestartRules`, on from 1.35;
/// `RestartAllContainersOnContainerExits`, on from 1.36:
/// `pkg/features/kube_features.go`; the restart is decided by
/// `pkg/kubelet/kuberuntime/kuberuntime_manager.go` `computePodActions`,
/// v1.37.2) keeps its pod's UID and cache registration, and its new
/// process reads env and binds subPaths again
/// (`pkg/kubelet/kuberuntime/kuberuntime_container.go` `startContainer` ->
/// `generateContainerConfig` -> `pkg/kubelet/kubelet_pods.go`
/// `GenerateRunContainerOptions`: `makeEnvironmentVariables`, `makeMounts`
/// -> `pkg/volume/util/subpath/subpath_linux.go` `prepareSubpathTarget`,
/// which binds again when the target is not the file now at the path).
/// The rules judge env and subPath by the container's current start
/// (`state.running.startedAt`), never by the pod's registration
/// (`status.startTime`, long before): restarted after the change, both are
/// current; running since before it, both are Frozen. For an immutable
/// object the same registration keeps the old entry: a restart in place
/// after the recreation is served the old object (Stale, never Fresh).
#[test]
fn a_container_restarted_in_place_is_judged_from_its_current_start() {
    let refs = || vec![env_key("K", CM, "hooks", "10.sh", false)];
    // (case, container start, bind on disk, want env, want subPath)
    let frozen = |c| State::Frozen(c);
    let cases: Vec<(&str, &str, &[u8], State, State)> = vec![
        (
            "restarted in place after the change",
            "2026-11-30T10:45:00Z",
            b"v2",
            State::Fresh,
            State::Fresh,
        ),
        (
            "running since before the change",
            START,
            b"v1",
            frozen(FrozenCause::Env),
            frozen(FrozenCause::SubPath),
        ),
    ];
    for (case, started, bind, want_env, want_sub_path) in cases {
        let ix = hooks_bound(started, refs(), b"v2", "2026-11-30T10:31:00Z", bind);
        let eval = evaluate(&ix);
        assert_eq!(find(&eval, "w", vol("hooks")).state, State::Fresh, "{case}");
        assert_eq!(
            find(&eval, "w", env("slurmd", "K")).state,
            want_env,
            "{case}"
        );
        let sp = find(&eval, "w", |s| matches!(s, Subject::SubPath { .. }));
        assert_eq!(sp.state, want_sub_path, "{case}");
    }
    // Immutable, recreated while the pod is registered: the restart in
    // place reads the entry its own registration keeps.
    let eval = env_case(SYNCED, "2026-11-30T10:45:00Z", vec![]);
    assert_eq!(
        find(&eval, "p", env("c", "KEY")).state,
        State::Stale(StaleCause::ImmutableCache)
    );
}

// -------------------------------------------- 7. env not from the API

/// `env[].valueFrom.fileKeyRef` (gate `EnvFiles`, on from 1.35): the
/// kubelet reads the value at container start from a file of an emptyDir
/// volume (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables`,
/// v1.37.2). Nothing of it is in the API: its verdict is
/// `Skipped/fileKeyRef`, saying mountguard does not check it, whatever the
/// container's state or the objects around it; it names no source, gives
/// no advice, pins nothing, and no remediation setting can select it
/// (`parse_remediate_on` takes Stale and Frozen only). Its neighbours keep
/// their verdicts (subject indexes unchanged).
#[test]
fn a_file_key_ref_env_is_skipped_and_never_stale() {
    use crate::remediation::plan::{default_qualifying, parse_remediate_on};
    let file = || EnvRef::NotFromApi {
        var: "FROM_FILE".into(),
        reason: SkipReason::FileKeyRef,
    };
    // (case, container start)
    let cases: Vec<(&str, Option<&str>)> = vec![
        ("running", Some(START)),
        (
            "restarted after everything changed",
            Some("2026-11-30T10:59:00Z"),
        ),
        ("not running", None),
    ];
    for (case, started) in cases {
        let mut ix = ClusterIndex::new();
        put_cm(&mut ix, "cfg", "k", RECREATED);
        ix.apply_pod(
            other("p")
                .container(
                    "c",
                    started.map(ts),
                    &[],
                    vec![file(), env_key("K", CM, "cfg", "k", false)],
                )
                .build(),
        );
        NodeB::new("node-a", ts(SCAN)).apply(&mut ix);
        let eval = evaluate(&ix);
        let v = find(&eval, "p", env("c", "FROM_FILE"));
        assert_eq!(v.state, State::Skipped(SkipReason::FileKeyRef), "{case}");
        assert_eq!(v.state.tag(), "Skipped/fileKeyRef", "{case}");
        assert!(
            v.message()
                .unwrap()
                .contains("mountguard does not check it"),
            "{case}"
        );
        let p = eval.pods.iter().find(|p| &*p.pod.name == "p").unwrap();
        assert!(p.sources(v).is_empty(), "{case}");
        assert_eq!(v.advice(p), None, "{case}");
        let view = v.view(p);
        assert_eq!(
            (view.subject, view.env.as_deref()),
            ("env", Some("FROM_FILE"))
        );
        // The other variable of the container is judged as ever.
        let other = find(&eval, "p", env("c", "K")).state;
        assert!(!matches!(other, State::Skipped(_)), "{case}: {other:?}");
        assert_eq!(p.pod.references().len(), 1, "{case}: only ConfigMap cfg");
    }
    assert!(
        !default_qualifying()
            .iter()
            .any(|s| matches!(s, State::Skipped(_)))
    );
    assert!(parse_remediate_on("Skipped/fileKeyRef").is_err());
    assert!(parse_remediate_on("Skipped").is_err());
}
