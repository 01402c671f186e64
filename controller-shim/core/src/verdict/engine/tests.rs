//! Tests of the engine loop and its history: `since` across evaluations,
//! the API rule across an outage, incremental evaluation against a full one.

use jiff::{SignedDuration, Timestamp};
use mountguard_inventory::Plugin;

use crate::index::ClusterIndex;
use crate::model::{SourceRef, VolumeSource};
use crate::testkit::*;
use crate::verdict::{ApiHealth, EngineState, StaleCause, State, UnverifiableReason};

use crate::verdict::test_support::*;

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
    assert_eq!(verdict(&v1, "p", vol("v")).since.get(), t1);

    let t2 = t1 + SignedDuration::from_secs(120);
    scan(&mut ix, t2);
    let v2 = e.evaluate_all(&ix, &mut state, t2);
    assert_eq!(verdict(&v2, "p", vol("v")).state, State::Propagating);
    assert_eq!(verdict(&v2, "p", vol("v")).since.get(), t1, "since is kept");

    let t3 = t1 + SignedDuration::from_secs(200);
    scan(&mut ix, t3);
    let v3 = e.evaluate_all(&ix, &mut state, t3);
    let v = verdict(&v3, "p", vol("v"));
    assert_eq!(v.state, State::Stale(StaleCause::Unknown));
    assert_eq!(
        v.since.get(),
        t1,
        "the stale state dates from when the mismatch began"
    );

    // The history holds the very verdicts handed out, not a copy.
    let p = v3.pods.iter().find(|p| &*p.pod.name == "p").unwrap();
    let h = state.pods.get(&p.pod.uid).unwrap();
    assert!(crate::verdict::VerdictList::ptr_eq(
        &h.last.verdicts,
        &p.verdicts
    ));
    assert_eq!(h.subject(v.id), Some((v.state, t1)));

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
    assert_eq!(stale.since.get(), t1);

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
    let incremental = e.evaluate_pods(&ix, &mut state, &[&uid("uid-p")], t3);
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
    assert_eq!(
        v.since.get(),
        t1,
        "the history kept the stale state's start"
    );
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
    let r = e.evaluate_pods(&ix, &mut state, &[&uid("uid-p")], t);
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
    let uids: Vec<crate::PodUid> = r
        .iter()
        .map(|id| ix.pod(*id).unwrap().uid.clone())
        .collect();
    assert_eq!(uids, [uid("uid-2")]);
    let uid_refs: Vec<&crate::PodUid> = uids.iter().collect();

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
        verdict(&inc, "p2", vol("v")).since.get(),
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
    ix.delete_pod(&uid("uid-3"));
    let gone = e.evaluate_pods(&ix, &mut state, &[&uid("uid-3")], later);
    assert_eq!(gone.removed, vec![uid("uid-3")]);
    assert!(!state.pods.contains_key(&uid("uid-3")));
    assert_eq!(state.nodes[&a("node-a")].mutable_mounts, 3);
}

/// The guess attack on the history (what the rollout gate and the status
/// API show per source): equal content in two objects must give unrelated
/// fingerprints, while one object's versions stay comparable.
#[test]
fn fingerprint_oracle_source_history_is_keyed_per_object() {
    let mut ix = ClusterIndex::new();
    let t0 = ts("2026-11-30T09:00:00Z");
    let [prod, tenant, other] =
        [("prod", "db"), ("tenant", "db"), ("tenant", "guess")].map(|(ns, name)| {
            put_source(
                &mut ix,
                SECRET,
                ns,
                name,
                &[("password", b"4711")],
                true,
                Some(t0),
            )
        });
    let e = engine();
    let mut state = EngineState::default();
    for r in [&prod, &tenant, &other] {
        e.observe_source(&ix, &mut state, r, t0);
    }
    let fp = |state: &EngineState, r: &SourceRef| state.sources[r].fingerprint.clone().unwrap();
    let key_fp =
        |state: &EngineState, r: &SourceRef| state.sources[r].keys["password"].fingerprint.clone();
    assert_ne!(fp(&state, &prod), fp(&state, &tenant));
    assert_ne!(fp(&state, &prod), fp(&state, &other));
    assert_ne!(fp(&state, &tenant), fp(&state, &other));
    assert_ne!(key_fp(&state, &prod), key_fp(&state, &tenant));
    assert_ne!(key_fp(&state, &prod), key_fp(&state, &other));
    assert_ne!(
        key_fp(&state, &prod),
        fp(&state, &prod),
        "a key's value is its own scope"
    );

    // Recreated with the same content: the same fingerprint, no change.
    let before = fp(&state, &prod);
    let t1 = ts("2026-11-30T10:00:00Z");
    put_source(
        &mut ix,
        SECRET,
        "prod",
        "db",
        &[("password", b"4711")],
        true,
        Some(t1),
    );
    e.observe_source(&ix, &mut state, &prod, t1);
    assert_eq!(fp(&state, &prod), before);
    assert_eq!(state.sources[&prod].content_changed_at, Some(t0));
    // A new value: a new fingerprint.
    put_source(
        &mut ix,
        SECRET,
        "prod",
        "db",
        &[("password", b"4710")],
        true,
        Some(t1),
    );
    e.observe_source(&ix, &mut state, &prod, t1);
    assert_ne!(fp(&state, &prod), before);
    assert_eq!(state.sources[&prod].content_changed_at, Some(t1));
}
