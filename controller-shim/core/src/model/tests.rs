//! Tests of the model: interning and its pruning, compact times, rare lists,
//! observed volumes and pods.

use super::*;

#[test]
fn pods_with_the_same_volumes_share_one_list_until_none_holds_it() {
    let mut ix = Interner::default();
    let vols = |ix: &mut Interner, name: &str| {
        let name = ix.intern(name);
        let source = ix.intern_volume_source(VolumeSource::Object(SourceProjection {
            kind: SourceKind::ConfigMap,
            name,
            items: None,
            optional: false,
        }));
        vec![VolumeModel {
            name: ix.intern("cfg"),
            source,
            read_at_start: false,
        }]
    };
    let v = vols(&mut ix, "a");
    let a = ix.intern_volumes(v);
    let v = vols(&mut ix, "a");
    let b = ix.intern_volumes(v);
    let v = vols(&mut ix, "b");
    let c = ix.intern_volumes(v);
    assert!(Arc::ptr_eq(&a, &b));
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(**a, *vols(&mut ix, "a"));
    drop((a, b, c));
    ix.prune();
    assert_eq!(ix.held(), 0, "nothing is held once no pod holds it");
}

#[test]
fn pods_of_one_namespace_on_one_node_share_their_place() {
    let mut it = Interner::default();
    let a = it.intern_place("slurm", Some("node-a"));
    let b = it.intern_place("slurm", Some("node-a"));
    let c = it.intern_place("slurm", Some("node-b"));
    let d = it.intern_place("slurm", None);
    assert!(Arc::ptr_eq(&a, &b) && !Arc::ptr_eq(&a, &c) && !Arc::ptr_eq(&a, &d));
    // The names inside are the interner's too.
    assert!(Arc::ptr_eq(&a.namespace, &c.namespace));
    assert!(Arc::ptr_eq(&a.namespace, &it.intern("slurm")));
    let mut pod = crate::testkit::PodB::new("slurm", "p", "uid-p", "node-a").build();
    pod.place = a.clone();
    assert_eq!(
        (&**pod.namespace(), pod.node_name()),
        ("slurm", Some("node-a"))
    );
    pod.set_node(None);
    assert_eq!((&**pod.namespace(), pod.node()), ("slurm", None));
    assert!(
        Arc::ptr_eq(&a, &b),
        "moving a pod leaves the shared place alone"
    );
    drop((a, b, c, d, pod));
    it.prune();
    assert_eq!(it.held(), 0, "nothing is held once no pod holds it");
}

#[test]
fn a_compact_time_gives_back_the_timestamp_it_was_made_of() {
    let lo: Timestamp = "1677-09-21T00:12:43.145224193Z".parse().unwrap();
    let hi: Timestamp = "2262-04-11T23:47:16.854775807Z".parse().unwrap();
    let exact: Vec<Timestamp> = vec![
        lo,
        Timestamp::new(-1, -1).unwrap(),
        "1969-12-31T23:59:59.5Z".parse().unwrap(),
        Timestamp::UNIX_EPOCH,
        Timestamp::new(0, 999_999_999).unwrap(),
        "2026-11-30T10:00:00.123456789Z".parse().unwrap(),
        hi,
    ];
    for &t in &exact {
        let c = CompactTime::from(t);
        assert_eq!(c.get(), t);
        assert!(!CompactTime::is_clamped(t), "{t}");
        assert_eq!(format!("{c:?}"), format!("{t:?}"));
    }
    // Ordered as the timestamps are.
    let held: Vec<CompactTime> = exact.iter().map(|&t| t.into()).collect();
    assert!(held.windows(2).all(|w| w[0] < w[1]));
    // Outside the range: held at the nearest end, flagged, and still
    // on the same side of every time in range.
    let before = lo - jiff::SignedDuration::from_nanos(1);
    let after = hi + jiff::SignedDuration::from_nanos(1);
    for (t, end) in [
        (Timestamp::MIN, lo),
        (before, lo),
        (Timestamp::MAX, hi),
        (after, hi),
    ] {
        assert!(CompactTime::is_clamped(t), "{t}");
        assert_eq!(CompactTime::from(t).get(), end, "{t}");
    }
    assert!(CompactTime::from(Timestamp::MAX) > CompactTime::from(exact[5]));
    assert!(CompactTime::from(Timestamp::MIN) < CompactTime::from(Timestamp::UNIX_EPOCH));
    assert_eq!(std::mem::size_of::<Option<CompactTime>>(), 8);
    // What that buys (with what the volume showed interned): an
    // observed volume (one per volume of every pod) is 16 bytes, not 40.
    assert_eq!(std::mem::size_of::<ObservedVolume>(), 16);
    // A pod model with its two owner boxes (NodeSet, apps/v1 controller)
    // in an `Arc` (two counters) stays in mimalloc's 160-byte class.
    assert!(std::mem::size_of::<PodModel>() + 16 <= 160);
    // Its volume list is one word, its image pull secrets and other
    // references share one pointer, and so do its namespace and node:
    // the model is 104 bytes, not 144.
    assert_eq!(std::mem::size_of::<PodModel>(), 104);
    // An observed pod is its volumes and one pointer for the rest.
    assert_eq!(std::mem::size_of::<ObservedPod>(), 24);
    // An observed pod's entry: its UID inline (16 bytes) and the pod.
    assert_eq!(
        std::mem::size_of::<(PodUid, ObservedPod)>(),
        16 + std::mem::size_of::<ObservedPod>()
    );
}

/// Volumes that showed the same (plugin, name, files, read problems)
/// share one [`VolumeSeen`], each keeping its own `written_at`; a
/// volume that showed something else has its own, and nothing is held
/// once no inventory holds it.
#[test]
fn observed_volumes_that_showed_the_same_share_what_they_showed() {
    use crate::testkit::NodeB;
    let t = |s: &str| -> Timestamp { s.parse().unwrap() };
    let (t1, t2) = (t("2026-11-30T09:00:00Z"), t("2026-11-30T09:00:01.5Z"));
    let cm = Plugin::Configmap;
    let inv = NodeB::new("node-a", t("2026-11-30T10:00:00Z"))
        .volume("p1", cm, "cfg", &[("k", b"1")], t1)
        .volume("p2", cm, "cfg", &[("k", b"1")], t2)
        .volume("p3", cm, "cfg", &[("k", b"2")], t1)
        .volume("p4", cm, "other", &[("k", b"1")], t1)
        .volume("p5", cm, "cfg", &[("k", b"1"), ("j", b"3")], t1)
        .volume_error("p5", "j", ReadErrorKind::TooLarge)
        .inv;
    let mut it = Interner::default();
    let node = ObservedNode::from_inventory(&inv, &mut it);
    let vol = |uid: &str| node.pods.get(&PodUid::new(uid)).unwrap().volumes[0].clone();
    let (v1, v2, v3, v4, v5) = (vol("p1"), vol("p2"), vol("p3"), vol("p4"), vol("p5"));
    assert!(Arc::ptr_eq(&v1.seen, &v2.seen));
    assert_eq!(v1.written_at.map(CompactTime::get), Some(t1));
    assert_eq!(v2.written_at.map(CompactTime::get), Some(t2));
    assert_ne!(v1, v2, "the times differ");
    for other in [&v3, &v4, &v5] {
        assert!(!Arc::ptr_eq(&v1.seen, &other.seen));
    }
    assert_eq!((v1.plugin(), &**v1.name()), (cm, "cfg"));
    assert_eq!(&**v4.name(), "other");
    assert_eq!(v1.file("k"), Some(&file_digest(b"1")));
    assert_eq!(v3.file("k"), Some(&file_digest(b"2")));
    assert!(v1.file("j").is_none() && v1.errors().is_empty());
    assert_eq!(v5.files().len(), 1);
    assert_eq!(v5.errors().len(), 1);
    assert_eq!(&*v5.errors()[0].path, "j");
    // The same inventory converted again shares what the first holds.
    let again = ObservedNode::from_inventory(&inv, &mut it);
    assert_eq!(again, node);
    let v = &again.pods.get(&PodUid::new("p5")).unwrap().volumes[0];
    assert!(Arc::ptr_eq(&v.seen, &v5.seen));
    drop((node, again, v1, v2, v3, v4, v5));
    it.prune();
    assert_eq!(it.held(), 0, "{it:?}");
}

#[test]
fn observed_pods_are_found_by_uid_and_the_later_of_two_with_one_uid_stays() {
    let pod = |errors: usize| {
        let errors = (0..errors)
            .map(|_| ObservedError {
                path: "".into(),
                kind: ReadErrorKind::TooLarge,
            })
            .collect();
        ObservedPod::new(Box::default(), Vec::new(), errors)
    };
    let u = PodUid::new;
    // UUIDs (held as bytes) and other text sort together by text.
    let uuid = "7c9e6679-7425-40de-944b-e07fc1f90ae7";
    let pods: ObservedPods = [("c", 0), ("a", 1), (uuid, 3), ("b", 0), ("a", 2)]
        .into_iter()
        .map(|(uid, n)| (u(uid), pod(n)))
        .collect();
    assert_eq!(pods.len(), 4);
    assert_eq!(pods.get(&u("a")).map(|p| p.errors().len()), Some(2));
    assert_eq!(pods.get(&u("b")).map(|p| p.errors().len()), Some(0));
    assert_eq!(pods.get(&u(uuid)).map(|p| p.errors().len()), Some(3));
    assert!(pods.get(&u("d")).is_none() && !pods.contains_key(&u("0")));
    let keys: Vec<String> = pods.keys().map(PodUid::to_string).collect();
    assert_eq!(keys, [uuid, "a", "b", "c"]);
}

#[test]
fn a_rare_list_reads_as_the_slice_it_was_built_from() {
    let empty: RareList<u32> = Vec::new().into();
    assert!(empty.is_empty());
    assert_eq!(empty, RareList::default());
    assert_eq!(format!("{empty:?}"), "[]");
    let some: RareList<u32> = [1, 2, 3].into_iter().collect();
    assert_eq!(&*some, &[1, 2, 3]);
    assert_eq!(format!("{some:?}"), "[1, 2, 3]");
    assert_ne!(some, empty);
    assert_eq!(
        std::mem::size_of::<RareList<u32>>(),
        std::mem::size_of::<usize>()
    );
}

#[test]
fn the_interner_forgets_what_nobody_holds_and_stays_bounded() {
    let mut it = Interner::default();
    let kept = it.intern("slurm-auth-slurm");
    let kept_files = it.intern_files([("slurm.key", &[7u8; 32])]);
    // A long-running controller: objects come and go.
    let mut peak = 0;
    for i in 0..50_000 {
        let name = it.intern(&format!("pod-{i}"));
        let files = it.intern_files([(format!("f-{i}").as_str(), &[1u8; 32])]);
        drop((name, files));
        peak = peak.max(it.held());
    }
    assert!(peak <= 4 * Interner::MIN_PRUNE, "peak {peak}");
    // What is still held elsewhere survives, shared as before.
    it.prune();
    assert!(Arc::ptr_eq(&kept, &it.intern("slurm-auth-slurm")));
    assert!(Arc::ptr_eq(
        &kept_files,
        &it.intern_files([("slurm.key", &[7u8; 32])])
    ));
    // Only the kept values remain (the list's path string included).
    assert_eq!(it.held(), 3, "{it:?}");
}
