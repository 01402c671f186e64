//! Tests of the evaluation task: batches in, published verdicts, series,
//! Events, rollout documents and admission answers out.

use super::*;
use crate::runtime::metrics::Metrics;
use mountguard_core::model::{PodModel, SourceContent, SourceKind, VolumeSource};
use mountguard_core::testkit::*;
use mountguard_core::{Config, Fingerprinter};
use mountguard_inventory::Plugin;
use std::sync::atomic::Ordering;

struct Rig {
    task: EvalTask,
    events: mpsc::Receiver<EventRequest>,
    shared: Arc<Shared>,
    store: ReadModel,
}

fn rig() -> Rig {
    let shared = Arc::new(Shared::new(Metrics::new()));
    shared.acting.store(true, Ordering::SeqCst);
    shared.ready.store(true, Ordering::SeqCst);
    let (etx, events) = mpsc::channel(100);
    let (stx, _) = tokio_watch::channel(Arc::new(EvaluationSnapshot::default()));
    let engine = Engine::new(Config::default(), Fingerprinter::new(&[1u8; 32]).unwrap());
    let store = ReadModel::default();
    let metrics = EvalMetrics::register(&shared.metrics);
    Rig {
        task: EvalTask::new(engine, shared.clone(), metrics, store.clone(), etx, stx),
        events,
        shared,
        store,
    }
}

fn secret(ix: &mut Interner, value: &[u8], uid: &str) -> Input {
    let r = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
    let c = SourceContent::from_plain(
        ix,
        true,
        [("slurm.key", value, false)],
        Some(uid),
        Some(ts("2026-11-30T09:00:00Z")),
    );
    Input::Source(r, c)
}

fn pod(uid: &str, name: &str, node: &str) -> Input {
    Input::Pod(pod_model(uid, name, node))
}

/// Pod `name` in slurm on `node` with volume `etc` of Secret `auth`.
fn pod_model(uid: &str, name: &str, node: &str) -> Box<PodModel> {
    let p = PodB::new("slurm", name, uid, node)
        .volume(
            "etc",
            VolumeSource::Object(obj(SourceKind::Secret, "auth", &[], false)),
        )
        .build();
    Box::new(p)
}

/// A rig given immutable Secret `slurm/auth` (`key`, UID `s1`) and
/// `more` in one batch at 10:00, with its interner and that time.
fn started(key: &[u8], more: Vec<Input>) -> (Rig, Interner, Timestamp) {
    let mut r = rig();
    let mut ix = Interner::default();
    let t0 = ts("2026-11-30T10:00:00Z");
    let mut batch = vec![secret(&mut ix, key, "s1")];
    batch.extend(more);
    r.task.apply_batch(batch, t0);
    (r, ix, t0)
}

/// Pod `w-0` (UID `u1`) on n1, of [`pod`].
fn w0() -> Input {
    pod("u1", "w-0", "n1")
}

/// Node n1's inventory `generation` scanned at `at`, its pod u1 showing
/// `key`, applied at `now`.
fn n1_shows(r: &mut Rig, generation: u64, at: &str, key: &[u8], now: Timestamp) {
    let i = inv("n1", generation, at, &[("u1", key)]);
    r.task.apply_batch(vec![i], now);
}

/// `auth` recreated with `newer` (UID `s2`) at `now` while n1 keeps showing
/// `new` (inventory `generation` scanned at `at`): the one Event sent, a
/// StaleMount, its message.
fn stale_mount_after_rotation(
    r: &mut Rig,
    ix: &mut Interner,
    generation: u64,
    at: &str,
    now: Timestamp,
) -> String {
    r.task.apply_batch(vec![secret(ix, b"newer", "s2")], now);
    n1_shows(r, generation, at, b"new", now);
    let ev = drain(&mut r.events);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].reason.as_str(), "StaleMount");
    ev[0].message.clone()
}

fn inv(node: &str, generation: u64, at: &str, pods: &[(&str, &[u8])]) -> Input {
    let mut b = NodeB::new(node, ts(at));
    for (uid, content) in pods {
        b = b.volume(
            uid,
            Plugin::Secret,
            "etc",
            &[("slurm.key", content)],
            ts("2026-11-30T09:00:00Z"),
        );
    }
    let mut i = b.inv;
    i.generation = generation;
    Input::Inventory(Box::new(i), None)
}

/// The rollout document of `target` as the endpoint would answer it.
fn rollout_doc(
    r: &Rig,
    target: &mountguard_core::rollout::Target,
) -> mountguard_core::rollout::RolloutDoc {
    r.store.read().unwrap().rollout(target, true, true)
}

fn drain(rx: &mut mpsc::Receiver<EventRequest>) -> Vec<EventRequest> {
    let mut v = Vec::new();
    while let Ok(e) = rx.try_recv() {
        v.push(e);
    }
    v
}

fn metrics(r: &Rig) -> String {
    String::from_utf8(r.shared.metrics.encode()).unwrap()
}

use mountguard_core::model::Interner;

fn ask(
    task: &mut EvalTask,
    r: &SourceRef,
    operation: mountguard_core::admission::Operation,
) -> (Vec<String>, bool) {
    let (reply, mut rx) = tokio::sync::oneshot::channel();
    task.receive(
        Input::Admission(crate::eval::AdmissionQuery {
            source: r.clone(),
            operation,
            reply,
        }),
        ts("2026-11-30T12:00:00Z"),
    );
    let v = rx.try_recv().expect("answered as it arrives");
    (
        v.holders
            .iter()
            .map(|h| format!("{}/{}", h.node, h.pod))
            .collect(),
        v.previous_immutable,
    )
}

/// The admission view: a delete sees every registered pod referencing
/// the name; after an immutable Secret goes away, a create sees it as
/// the previous immutable object held by the pods registered before
/// that (not by one registered later); once those are gone the name is
/// forgotten. A mutable object's deletion leaves nothing behind.
#[test]
fn the_admission_view_remembers_an_immutable_object_held_after_it_went_away() {
    use mountguard_core::admission::Operation::{Create, Delete};
    let (mut r, mut ix, _) = started(b"k", vec![w0()]);
    let auth = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
    assert_eq!(
        ask(&mut r.task, &auth, Delete),
        (vec!["n1/w-0".into()], true)
    );
    let t1 = ts("2026-11-30T10:10:00Z");
    r.task
        .apply_batch(vec![Input::SourceDeleted(auth.clone())], t1);
    // Registered after the Secret went away, on another node.
    let mut late = pod_model("u2", "w-1", "n2");
    late.synced_at = Some(ts("2026-11-30T10:20:00Z").into());
    r.task.apply_batch(vec![Input::Pod(late)], t1);
    assert_eq!(
        ask(&mut r.task, &auth, Create),
        (vec!["n1/w-0".into()], true)
    );
    // The holder goes: the name is forgotten.
    r.task
        .apply_batch(vec![Input::PodDeleted(PodUid::new("u1"))], t1);
    assert_eq!(ask(&mut r.task, &auth, Create), (vec![], false));
    // A mutable ConfigMap deleted while referenced: nothing held.
    let cm = SourceRef::new(
        SourceKind::ConfigMap,
        ix.intern("slurm"),
        ix.intern("hooks"),
    );
    let content = SourceContent::from_plain(
        &mut ix,
        false,
        [("hook.sh", &b"x"[..], false)],
        Some("c1"),
        None,
    );
    let user = PodB::new("slurm", "w-2", "u3", "n1")
        .volume(
            "hooks",
            VolumeSource::Object(obj(SourceKind::ConfigMap, "hooks", &[], false)),
        )
        .build();
    r.task.apply_batch(
        vec![
            Input::Source(cm.clone(), content),
            Input::Pod(Box::new(user)),
            Input::SourceDeleted(cm.clone()),
        ],
        t1,
    );
    assert_eq!(ask(&mut r.task, &cm, Create), (vec![], false));
    assert_eq!(
        ask(&mut r.task, &cm, Delete),
        (vec!["n1/w-2".into()], false)
    );
}

/// An immutable Secret replaced while the watch was away (a re-list
/// shows the object with a new UID) counts as gone at that moment.
#[test]
fn the_admission_view_sees_a_replacement_found_by_a_relist() {
    use mountguard_core::admission::Operation::Create;
    let (mut r, mut ix, t0) = started(b"k", vec![w0()]);
    r.task.apply_batch(vec![secret(&mut ix, b"k2", "s2")], t0);
    let auth = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
    assert_eq!(r.task.gone_immutable.get(&auth), Some(&t0));
    // The same object again (same UID): nothing went away.
    let (mut r, mut ix, t0) = started(b"k", vec![w0()]);
    r.task.apply_batch(vec![secret(&mut ix, b"k", "s1")], t0);
    assert!(r.task.gone_immutable.is_empty());
    assert_eq!(
        ask(&mut r.task, &auth, Create),
        (vec!["n1/w-0".into()], true)
    );
}

/// An inventory's in-flight permit goes back as soon as the task has
/// the inventory, not when the coalescing window closes: report
/// handlers waiting for a permit are not held up by the window (with
/// at most 32 in flight, catch-up after a restart ran in batches of 32
/// nodes, each waiting out the window). The inventory is still
/// evaluated when the window closes.
#[tokio::test(start_paused = true)]
async fn an_inventory_frees_its_permit_before_the_window_closes() {
    let (r, _, _) = started(b"k", vec![w0()]);
    let store = r.store.clone();
    let (tx, rx) = mpsc::channel(8);
    let (_trigger, shutdown) = Shutdown::new();
    tokio::spawn(run(r.task, rx, shutdown));
    let sem = Arc::new(tokio::sync::Semaphore::new(1));
    let permit = sem.clone().acquire_owned().await.unwrap();
    let now = Timestamp::now().to_string();
    let Input::Inventory(i, _) = inv("n1", 1, &now, &[("u1", b"k")]) else {
        unreachable!()
    };
    tx.send(Input::Inventory(i, Some(permit))).await.unwrap();
    tokio::time::sleep(COALESCE / 10).await;
    assert_eq!(
        sem.available_permits(),
        1,
        "the permit is back while the window is still open"
    );
    let state = |s: &ReadModel| {
        s.read()
            .unwrap()
            .pods
            .get(&PodUid::new("u1"))
            .map(|p| p.pv.verdicts[0].state.tag())
    };
    assert_eq!(
        state(&store).as_deref(),
        Some("Unverifiable/NoInventory"),
        "evaluated only when the window closes"
    );
    tokio::time::sleep(COALESCE * 2).await;
    assert_eq!(state(&store).as_deref(), Some("Fresh"));
}

/// A workload target selects the pods its controller owns: a
/// StatefulSet's by their owner, a Deployment's through the watched
/// ReplicaSet that names it as controller (and no longer once that
/// ReplicaSet is gone); never another workload's or a bare pod.
#[test]
fn workload_rollouts_select_the_pods_of_their_owner() {
    use mountguard_core::model::{ControllerKind, ControllerRef};
    use mountguard_core::rollout::{Target, decide};
    let mut r = rig();
    r.store.write().unwrap().replicasets_watched = true;
    let mut ix = Interner::default();
    let t0 = ts("2026-11-30T10:00:00Z");
    let owned = |uid: &str, name: &str, node: &str, kind, owner: &str| {
        let mut p = pod_model(uid, name, node);
        p.workload = ControllerRef::boxed(kind, owner.into(), &format!("uid-{owner}"));
        Input::Pod(p)
    };
    r.task.apply_batch(
        vec![
            secret(&mut ix, b"new", "s1"),
            owned(
                "u1",
                "web-5d4f8-a",
                "n1",
                ControllerKind::ReplicaSet,
                "web-5d4f8",
            ),
            owned(
                "u2",
                "web-5d4f8-b",
                "n2",
                ControllerKind::ReplicaSet,
                "web-5d4f8",
            ),
            owned("u3", "pg-0", "n1", ControllerKind::StatefulSet, "pg"),
            owned("u5", "web-0", "n1", ControllerKind::StatefulSet, "web"),
            pod("u4", "bare", "n2"),
        ],
        t0,
    );
    r.task.apply_batch(
        vec![
            inv(
                "n1",
                1,
                "2026-11-30T10:00:00Z",
                &[("u1", b"new"), ("u3", b"new"), ("u5", b"new")],
            ),
            inv(
                "n2",
                1,
                "2026-11-30T10:00:00Z",
                &[("u2", b"old"), ("u4", b"new")],
            ),
        ],
        t0,
    );
    let pods = |r: &Rig, t: &str| -> (Vec<String>, bool) {
        let target: Target = t.parse().unwrap();
        let d = rollout_doc(r, &target);
        let mut pods: Vec<String> = d.consumers.iter().map(|c| c.pod.clone()).collect();
        pods.dedup();
        (pods, decide(&d, &target, None).complete())
    };
    let none: Vec<String> = vec![];
    // The ReplicaSet not seen yet: nothing is the Deployment's.
    assert_eq!(pods(&r, "deployment/slurm/web"), (none.clone(), false));
    assert_eq!(
        pods(&r, "rs/slurm/web-5d4f8"),
        (vec!["web-5d4f8-a".into(), "web-5d4f8-b".into()], false)
    );
    assert_eq!(pods(&r, "sts/slurm/pg"), (vec!["pg-0".into()], true));
    assert_eq!(
        pods(&r, "statefulset/slurm/web"),
        (vec!["web-0".into()], true)
    );
    assert_eq!(pods(&r, "daemonset/slurm/pg"), (none.clone(), false));
    let rs: k8s_openapi::api::apps::v1::ReplicaSet = serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": "slurm", "name": "web-5d4f8", "uid": "rs1",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment",
                "name": "web", "uid": "d1", "controller": true}]},
        "spec": {"selector": {}},
    }))
    .unwrap();
    let o = Arc::new(crate::edge::workloads::from_replicaset(&rs).unwrap());
    let key = o.key().unwrap();
    r.task
        .apply_batch(vec![Input::Workload(key.clone(), o)], t0);
    // u2 is served the old bytes: the Deployment is not rolled out.
    assert_eq!(
        pods(&r, "deployment/slurm/web"),
        (vec!["web-5d4f8-a".into(), "web-5d4f8-b".into()], false)
    );
    assert_eq!(pods(&r, "deployment/slurm/pg"), (none.clone(), false));
    r.task.apply_batch(
        vec![inv(
            "n2",
            2,
            "2026-11-30T10:00:05Z",
            &[("u2", b"new"), ("u4", b"new")],
        )],
        t0,
    );
    assert!(pods(&r, "deployment/slurm/web").1);
    r.task.apply_batch(vec![Input::WorkloadDeleted(key)], t0);
    assert_eq!(pods(&r, "deployment/slurm/web"), (none, false));
}

/// The rollout document follows the source's current fingerprint and
/// what each consumer was verified against, and the gate's decision on
/// it follows a rotation (recreate under the same name) to the end.
#[test]
fn rollout_document_tracks_rotation_per_consumer() {
    use mountguard_core::rollout::{Target, decide};
    let (mut r, mut ix, t0) = started(b"old", vec![w0(), pod("u2", "w-1", "n2")]);
    let target: Target = "secret/slurm/auth".parse().unwrap();
    let doc = |r: &Rig| rollout_doc(r, &target);
    r.task.apply_batch(
        vec![
            inv("n1", 1, "2026-11-30T10:00:00Z", &[("u1", b"old")]),
            inv("n2", 1, "2026-11-30T10:00:00Z", &[("u2", b"old")]),
        ],
        t0,
    );
    let d = doc(&r);
    let old_fp = d.sources[0].fingerprint.clone().unwrap();
    assert_eq!(old_fp.len(), 12, "a keyed fingerprint");
    assert_eq!(d.sources[0].uid.as_deref(), Some("s1"));
    assert_eq!(d.consumers.len(), 2);
    for c in &d.consumers {
        assert_eq!(c.state, "Fresh");
        assert_eq!(c.sources[0].fingerprint.as_deref(), Some(old_fp.as_str()));
        assert_eq!(c.verified_at.as_deref(), Some("2026-11-30T10:00:00Z"));
        assert!(c.node_reporting);
    }
    assert!(decide(&d, &target, Some("s1")).complete());
    // Recreated with new content: the consumers are judged against it
    // and are not fresh until the nodes show the new bytes.
    let t1 = ts("2026-11-30T10:05:00Z");
    r.task.apply_batch(vec![secret(&mut ix, b"new", "s2")], t1);
    let d = doc(&r);
    let new_fp = d.sources[0].fingerprint.clone().unwrap();
    assert_ne!(new_fp, old_fp);
    assert!(
        d.consumers.iter().all(
            |c| c.sources[0].fingerprint.as_deref() == Some(new_fp.as_str()) && c.state != "Fresh"
        ),
        "{d:?}"
    );
    let p = decide(&d, &target, Some("s2"));
    assert_eq!((p.verified, p.total), (0, 2), "{p:?}");
    n1_shows(&mut r, 2, "2026-11-30T10:05:10Z", b"new", t1);
    let p = decide(&doc(&r), &target, Some("s2"));
    assert_eq!((p.verified, p.total), (1, 2), "{p:?}");
    assert_eq!(p.missing[0].pod, "w-1");
    assert_eq!(p.missing[0].node, "n2");
    r.task.apply_batch(
        vec![inv("n2", 2, "2026-11-30T10:05:20Z", &[("u2", b"new")])],
        t1,
    );
    let d = doc(&r);
    assert!(decide(&d, &target, Some("s2")).complete(), "{d:?}");
    let w1 = d.consumers.iter().find(|c| c.pod == "w-1").unwrap();
    assert_eq!(w1.verified_at.as_deref(), Some("2026-11-30T10:05:20Z"));
    // /v1/verdicts items carry the same.
    {
        let store = r.store.read().unwrap();
        let doc = store.document(&crate::api::store::Query::parse(Some("all=1")), true, true);
        let w1 = doc.verdicts.iter().find(|v| v.pod == "w-1").unwrap();
        assert_eq!(w1.source_content.len(), 1, "{w1:?}");
        assert_eq!(
            w1.source_content[0].fingerprint.as_deref(),
            Some(new_fp.as_str())
        );
        assert_eq!(w1.verified_at.as_deref(), Some("2026-11-30T10:05:20Z"));
    }
    // Event notes carry the source's fingerprint and the scan time.
    {
        let store = r.store.read().unwrap();
        let p = &store.pods["u2"];
        let pv = &p.pv;
        let m = event_message(pv, &pv.verdicts[0], p.check.as_ref().unwrap(), None);
        assert!(
            m.contains(&format!("source content Secret auth {new_fp}"))
                && m.contains("node scanned at 2026-11-30T10:05:20Z"),
            "{m}"
        );
    }
    // A new pod of the Secret not scheduled yet keeps the gate closed
    // until it runs on a node.
    let mut pending = pod_model("u3", "w-2", "n1");
    pending.set_node(None);
    r.task.apply_batch(vec![Input::Pod(pending)], t1);
    let d = doc(&r);
    assert_eq!(d.unscheduled, ["slurm/w-2"], "{d:?}");
    let p = decide(&d, &target, Some("s2"));
    assert!(
        !p.complete() && p.blockers[0].contains("slurm/w-2"),
        "{p:?}"
    );
    r.task
        .apply_batch(vec![Input::PodDeleted(PodUid::new("u3"))], t1);
    assert!(decide(&doc(&r), &target, Some("s2")).complete());
    // A node whose agent stops reporting: its consumer no longer counts.
    let late = ts("2026-11-30T10:20:00Z");
    n1_shows(&mut r, 3, "2026-11-30T10:19:50Z", b"new", late);
    let p = decide(&doc(&r), &target, None);
    assert_eq!((p.verified, p.total), (1, 2), "{p:?}");
    assert_eq!(p.missing[0].node, "n2");
    // Deleted: absent until recreated.
    r.task.apply_batch(
        vec![Input::SourceDeleted(SourceRef::new(
            SourceKind::Secret,
            ix.intern("slurm"),
            ix.intern("auth"),
        ))],
        late,
    );
    let d = doc(&r);
    assert!(!d.sources[0].present && d.sources[0].fingerprint.is_none());
    assert!(!decide(&d, &target, None).complete());
}

/// A `replace --force` of the immutable Secret (deleted, recreated
/// with the same content under a new UID) while a pod reads it as a
/// volume and as an env var: nothing turns Stale, no Event is sent, and
/// the rollout gate completes for the new UID.
#[test]
fn a_recreation_with_the_same_content_alarms_nothing_and_completes_the_rollout() {
    use mountguard_core::rollout::{Target, decide};
    let mut r = rig();
    let mut ix = Interner::default();
    let t0 = ts("2026-11-30T10:00:00Z");
    let target: Target = "secret/slurm/auth".parse().unwrap();
    let p = PodB {
        pod: *pod_model("u1", "w-0", "n1"),
    }
    .container(
        "slurmd",
        Some(ts("2026-11-30T09:30:00Z")),
        &[("etc", "")],
        vec![env_key(
            "KEY",
            SourceKind::Secret,
            "auth",
            "slurm.key",
            false,
        )],
    )
    .build();
    r.task.apply_batch(
        vec![secret(&mut ix, b"same", "s1"), Input::Pod(Box::new(p))],
        t0,
    );
    n1_shows(&mut r, 1, "2026-11-30T10:00:00Z", b"same", t0);
    let states = |r: &Rig| -> Vec<String> {
        let store = r.store.read().unwrap();
        store.pods["u1"]
            .pv
            .verdicts
            .iter()
            .map(|v| v.state.tag())
            .collect()
    };
    assert_eq!(states(&r), ["Fresh", "Fresh"]);
    let t1 = ts("2026-11-30T10:05:00Z");
    let auth = SourceRef::new(SourceKind::Secret, ix.intern("slurm"), ix.intern("auth"));
    r.task.apply_batch(vec![Input::SourceDeleted(auth)], t1);
    r.task.apply_batch(vec![secret(&mut ix, b"same", "s2")], t1);
    // Past the grace period, the node still showing the same bytes.
    let t2 = ts("2026-11-30T10:15:00Z");
    n1_shows(&mut r, 2, "2026-11-30T10:14:50Z", b"same", t2);
    assert_eq!(states(&r), ["Fresh", "Fresh"]);
    assert!(
        drain(&mut r.events)
            .iter()
            .all(|e| e.reason.as_str() != "StaleMount"),
        "an alarm for content that cannot differ"
    );
    let d = rollout_doc(&r, &target);
    let p = decide(&d, &target, Some("s2"));
    assert!(p.complete(), "{p:?}");
    assert_eq!((p.verified, p.total), (2, 2));
}

#[test]
fn baseline_without_events_then_rotation_alarms_and_recovery() {
    // Start: the mount is already stale (old key) when the controller
    // first hears of the node: that is the baseline, no Event.
    let (mut r, mut ix, t0) = started(b"new", vec![w0()]);
    n1_shows(&mut r, 1, "2026-11-30T10:00:00Z", b"old", t0);
    let m = metrics(&r);
    assert!(m.contains(r#"state="Stale""#), "{m}");
    assert!(
        m.contains(r#"mountguard_node_agent_reporting{node="n1"} 1"#),
        "{m}"
    );
    assert!(drain(&mut r.events).is_empty(), "no Event for the baseline");
    // The node catches up: recovery Event.
    n1_shows(&mut r, 2, "2026-11-30T10:01:00Z", b"new", t0);
    let ev = drain(&mut r.events);
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].reason, crate::runtime::events::Reason::MountRecovered);
    assert!(!metrics(&r).contains("mountguard_mount_state{"));
    // Rotation (recreated with new content) while the node keeps the old
    // bytes: a StaleMount Event naming fingerprints, not digests.
    let m = stale_mount_after_rotation(&mut r, &mut ix, 3, "2026-11-30T10:10:00Z", t0);
    assert!(m.contains("volume etc"), "{m}");
    assert!(m.contains("Secret auth"), "{m}");
    assert!(!m.contains(&mountguard_inventory::digest::to_hex(
        &mountguard_inventory::file_digest(b"newer")
    )));
    // Repeated heartbeats: deduplicated.
    for s in ["2026-11-30T10:10:30Z", "2026-11-30T10:11:00Z"] {
        r.task.apply_batch(
            vec![Input::Heartbeat {
                node: "n1".into(),
                generation: 3,
                scanned_at: ts(s),
            }],
            t0,
        );
    }
    assert!(drain(&mut r.events).is_empty());
    // The Secret watch fails: verdicts become Unverifiable/ApiUnavailable,
    // no Event, no Stale series.
    r.shared.health.register("secrets", true);
    r.task.apply_batch(vec![], t0);
    let m = metrics(&r);
    assert!(m.contains(r#"cause="ApiUnavailable""#), "{m}");
    assert!(
        !m.lines()
            .any(|l| l.starts_with("mountguard_mount_state{") && l.contains(r#"state="Stale""#)),
        "{m}"
    );
    assert!(drain(&mut r.events).is_empty());
    // Pod deleted: its series go away, and so do its alarm entry and
    // its Event bucket.
    assert_eq!(r.task.limiter.len(), 1, "u1 had Events");
    r.task
        .apply_batch(vec![Input::PodDeleted(PodUid::new("u1"))], t0);
    assert!(!metrics(&r).contains("mountguard_mount_state{"));
    assert!(r.store.read().unwrap().pods.is_empty());
    assert!(r.task.tracker.is_empty());
    assert!(
        r.task.limiter.is_empty(),
        "the deleted pod's Event bucket is kept"
    );
}

#[test]
fn reset_forgets_reports_and_stale_inventory_ages_out() {
    let inventory = inv("n1", 1, "2026-11-30T10:00:00Z", &[("u1", b"k")]);
    let (mut r, _, _) = started(b"k", vec![w0(), inventory]);
    assert!(
        r.store
            .read()
            .unwrap()
            .pods
            .contains_key(&PodUid::new("u1"))
    );
    // Ten minutes without a report: InventoryTooOld, node not reporting.
    r.task.apply_batch(vec![], ts("2026-11-30T10:10:00Z"));
    let m = metrics(&r);
    assert!(
        !m.contains("mountguard_mount_state{"),
        "node-level reasons have no series: {m}"
    );
    assert!(
        m.contains(r#"mountguard_mounts{state="Unverifiable"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"mountguard_node_agent_reporting{node="n1"} 0"#),
        "{m}"
    );
    assert!(
        m.contains(r#"mountguard_nodes{reporting="false"} 1"#),
        "{m}"
    );
    // A heartbeat with an unknown generation changes nothing.
    r.task.apply_batch(
        vec![Input::Heartbeat {
            node: "n1".into(),
            generation: 9,
            scanned_at: ts("2026-11-30T10:10:00Z"),
        }],
        ts("2026-11-30T10:10:00Z"),
    );
    let tag = |r: &Rig| {
        r.store.read().unwrap().pods["u1"].pv.verdicts[0]
            .state
            .tag()
    };
    assert_eq!(tag(&r), "Unverifiable/InventoryTooOld");
    r.task
        .apply_batch(vec![Input::Reset], ts("2026-11-30T10:10:00Z"));
    assert_eq!(tag(&r), "Unverifiable/NoInventory");
    assert!(r.task.index().inventory("n1").is_none());
    assert!(drain(&mut r.events).is_empty());
}

/// A read at `at` of a Slurm node that is IDLE and holds no registration
/// of its slurmd (`slurmd_start_time` 0: a slurmd on a stale key).
fn unregistered_at(at: &str) -> mountguard_core::remediation::slurm_view::SlurmRead {
    use mountguard_core::remediation::SlurmNodeState;
    use mountguard_core::remediation::slurm_view::{ReadOutcome, SlurmRead};
    SlurmRead {
        at: ts(at),
        outcome: ReadOutcome::Node(SlurmNodeState {
            state: vec!["IDLE".into()],
            reason: String::new(),
            reason_set_by_user: String::new(),
            alloc_cpus: 0,
            slurmd_start_time: Some(0),
        }),
    }
}

/// A NodeSet worker's StaleMount Event says what Slurm shows of its node
/// (kept by remediation's reads), compared with when the new key arrived.
#[test]
fn a_stale_workers_event_says_what_slurm_shows() {
    use mountguard_core::model::NodeSetMember;
    let mut worker = pod_model("u1", "w-0", "n1");
    worker.slinky = NodeSetMember::boxed("worker".into(), Some("w-0".into()));
    let (mut r, mut ix, t0) = started(b"new", vec![Input::Pod(worker)]);
    n1_shows(&mut r, 1, "2026-11-30T10:00:00Z", b"new", t0);
    assert!(drain(&mut r.events).is_empty(), "baseline");
    {
        let mut store = r.store.write().unwrap();
        store.slurm.enabled = true;
        store
            .slurm
            .nodes
            .insert("w-0".into(), unregistered_at("2026-11-30T10:06:00Z"));
    }
    // The key is recreated at 10:05; the node keeps serving the old one.
    let rotated = ts("2026-11-30T10:05:00Z");
    let m = stale_mount_after_rotation(&mut r, &mut ix, 2, "2026-11-30T10:10:00Z", rotated);
    assert!(
        m.contains(". Replace the pod")
            && m.ends_with(
                "Slurm: node w-0 has not registered since the content changed at \
                 2026-11-30T10:05:00Z (slurmctld holds no registration of its slurmd, \
                 slurmd_start_time 0); Slurm shows it IDLE with no reason, and a slurmd on a \
                 stale key is never set DOWN: it flaps between IDLE and IDLE+NOT_RESPONDING."
            ),
        "{m}"
    );
}

/// The first StaleMount Event of a worker whose node was not read yet says
/// so; once a read shows the node has not registered since the change, the
/// next evaluation of the pod (a newer scan) tells it again with Slurm's
/// side, once: the same read tells nothing more.
#[test]
fn a_stale_worker_is_told_again_once_slurm_is_read() {
    use mountguard_core::model::NodeSetMember;
    let mut worker = pod_model("u1", "w-0", "n1");
    worker.slinky = NodeSetMember::boxed("worker".into(), Some("w-0".into()));
    let (mut r, mut ix, t0) = started(b"new", vec![Input::Pod(worker)]);
    n1_shows(&mut r, 1, "2026-11-30T10:00:00Z", b"new", t0);
    assert!(drain(&mut r.events).is_empty(), "baseline");
    r.store.write().unwrap().slurm.enabled = true;
    let rotated = ts("2026-11-30T10:05:00Z");
    let first = stale_mount_after_rotation(&mut r, &mut ix, 2, "2026-11-30T10:10:00Z", rotated);
    assert!(first.ends_with("Slurm not read yet (node w-0)."), "{first}");
    r.store
        .write()
        .unwrap()
        .slurm
        .nodes
        .insert("w-0".into(), unregistered_at("2026-11-30T10:11:00Z"));
    n1_shows(
        &mut r,
        3,
        "2026-11-30T10:12:00Z",
        b"new",
        ts("2026-11-30T10:12:00Z"),
    );
    let ev = drain(&mut r.events);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].reason.as_str(), "StaleMount");
    assert!(
        ev[0]
            .message
            .contains("Slurm: node w-0 has not registered since the content changed"),
        "{}",
        ev[0].message
    );
    n1_shows(
        &mut r,
        4,
        "2026-11-30T10:13:00Z",
        b"new",
        ts("2026-11-30T10:13:00Z"),
    );
    assert!(drain(&mut r.events).is_empty(), "told once");
}
