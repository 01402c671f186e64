use super::*;
use mountguard_core::testkit::*;
use mountguard_core::{ClusterIndex, Fingerprint, SourceKind};

/// One published pod per pod: its check holds the fingerprint list as
/// one word (the list is interned) and its scan time in 8 bytes, so
/// the check is 16 bytes and the record (with the pod's verdicts, 16)
/// 32; pods with equal lists share one, which still reads back each
/// source's fingerprint.
#[test]
fn a_published_pod_is_32_bytes_and_equal_checks_share_one_list() {
    use mountguard_core::model::Interner;
    assert_eq!(std::mem::size_of::<PodCheck>(), 16);
    assert_eq!(std::mem::size_of::<PublishedPod>(), 32);
    let mut it = Interner::default();
    let fp = Some(Fingerprint([1, 2, 3, 4, 5, 6]));
    let a = it.intern_fingerprints(vec![fp, None]);
    let b = it.intern_fingerprints(vec![fp, None]);
    let c = it.intern_fingerprints(vec![None, fp]);
    assert!(Arc::ptr_eq(&a, &b) && !Arc::ptr_eq(&a, &c));
    let pod = PodB::new("ns", "p", "uid-p", "node-a")
        .image_pull_secret("s")
        .other_ref(SourceKind::ConfigMap, "m")
        .build();
    let check = PodCheck {
        scanned_at: None,
        fingerprints: a,
    };
    let refs = pod.references();
    assert_eq!(check.source(&pod, &refs[0]), Some(fp));
    assert_eq!(check.source(&pod, &refs[1]), Some(None));
    drop((b, c, check));
    it.prune();
    assert_eq!(it.held(), 0);
}

#[test]
fn query_strings_decode_and_no_byte_sequence_panics() {
    let q = Query::parse(Some(
        "all&namespace=slurm%2Dx&node=node+a&state=Stale%2FUnknown",
    ));
    assert_eq!(
        q,
        Query {
            all: true,
            namespace: Some("slurm-x".into()),
            node: Some("node a".into()),
            state: Some("Stale/Unknown".into()),
        }
    );
    // A bad escape is kept as written.
    assert_eq!(
        Query::parse(Some("node=a%zz")).node.as_deref(),
        Some("a%zz")
    );
    assert_eq!(Query::parse(Some("node=a%4")).node.as_deref(), Some("a%4"));
    // A multi-byte character right after `%` (a byte offset two past
    // the `%` falls inside it) and bytes that are not UTF-8.
    for q in ["node=%1\u{e9}", "node=%\u{e9}1"] {
        let want = q.strip_prefix("node=");
        assert_eq!(Query::parse(Some(q)).node.as_deref(), want, "{q}");
    }
    assert_eq!(
        Query::parse(Some("node=%C3")).node.as_deref(),
        Some("\u{fffd}")
    );
    assert_eq!(Query::parse(Some("&&=&node=")), Query::default());
}

/// A reader of one namespace sees the counts of that namespace only:
/// the whole cluster's `byState` would tell it of other tenants'
/// rotations and deletions.
#[test]
fn a_namespace_query_counts_only_that_namespaces_states() {
    let mut ix = ClusterIndex::new();
    for ns in ["team-a", "team-b"] {
        put_config_map(
            &mut ix,
            ns,
            "cm",
            &[("a", b"new")],
            &[],
            Some(ts("2026-11-30T09:00:00Z")),
        );
    }
    let cfg = || {
        mountguard_core::model::VolumeSource::Object(obj(SourceKind::ConfigMap, "cm", &[], false))
    };
    ix.apply_pod(
        PodB::new("team-a", "a1", "ua", "n1")
            .volume("cfg", cfg())
            .build(),
    );
    ix.apply_pod(
        PodB::new("team-b", "b1", "ub1", "n1")
            .volume("cfg", cfg())
            .build(),
    );
    ix.apply_pod(
        PodB::new("team-b", "b2", "ub2", "n2")
            .volume("cfg", cfg())
            .build(),
    );
    let at = ts("2026-11-30T09:59:00Z");
    NodeB::new("n1", ts("2026-11-30T10:00:00Z"))
        .volume("ua", inventory_plugin(), "cfg", &[("a", b"new")], at)
        .volume("ub1", inventory_plugin(), "cfg", &[("a", b"old")], at)
        .apply(&mut ix);
    NodeB::new("n2", ts("2026-11-30T10:00:00Z"))
        .volume("ub2", inventory_plugin(), "cfg", &[("a", b"old")], at)
        .apply(&mut ix);
    let store = VerdictStore::evaluated(&ix);
    let counts = |q: &str| {
        let doc = store.document(&Query::parse(Some(q)), true, true);
        doc.by_state
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(counts("all=1"), "Fresh=1 Stale/Unknown=2");
    assert_eq!(
        counts("namespace=team-a"),
        "Fresh=1",
        "team-b's stale pods are not team-a's to count"
    );
    assert_eq!(counts("namespace=team-b"), "Stale/Unknown=2");
    assert_eq!(counts("namespace=team-b&node=n2"), "Stale/Unknown=1");
    assert_eq!(counts("namespace=team-c"), "");
    // `all` and `state` choose what is listed, not what is counted.
    assert_eq!(counts("namespace=team-a&state=Stale"), "Fresh=1");
}

fn inventory_plugin() -> mountguard_inventory::Plugin {
    mountguard_inventory::Plugin::Configmap
}

/// A NodeSet worker whose `slurm.key` is stale, and another whose
/// `slurm.conf` is: only the first item says what Slurm shows (the
/// `slurm` field, and its sentence after the advice), compared with the
/// change time the evaluation published; without slurmrestd, or for a
/// node not read yet, it says so.
#[test]
fn a_stale_workers_key_verdict_says_what_slurm_shows() {
    use mountguard_core::model::{NodeSetMember, VolumeSource};
    use mountguard_core::remediation::SlurmNodeState;
    use mountguard_core::remediation::slurm_view::{ReadOutcome, SlurmFinding, SlurmRead};
    let mut ix = ClusterIndex::new();
    let changed = ts("2026-11-30T09:00:00Z");
    let key = put_source(
        &mut ix,
        SourceKind::Secret,
        "slurm",
        "auth",
        &[("slurm.key", b"new")],
        true,
        Some(changed),
    );
    put_source(
        &mut ix,
        SourceKind::ConfigMap,
        "slurm",
        "conf",
        &[("slurm.conf", b"new")],
        false,
        Some(changed),
    );
    let worker = |name: &str, uid: &str, source: (SourceKind, &str), volume: &str| {
        let mut p = PodB::new("slurm", name, uid, "n1")
            .volume(
                volume,
                VolumeSource::Object(obj(source.0, source.1, &[], false)),
            )
            .build();
        p.slinky = NodeSetMember::boxed("worker".into(), Some(name.into()));
        p
    };
    ix.apply_pod(worker(
        "w0",
        "u0",
        (SourceKind::Secret, "auth"),
        "slurm-etc",
    ));
    ix.apply_pod(worker("w1", "u1", (SourceKind::ConfigMap, "conf"), "conf"));
    let at = ts("2026-11-30T08:00:00Z");
    NodeB::new("n1", ts("2026-11-30T10:00:00Z"))
        .volume(
            "u0",
            mountguard_inventory::Plugin::Secret,
            "slurm-etc",
            &[("slurm.key", b"old")],
            at,
        )
        .volume(
            "u1",
            inventory_plugin(),
            "conf",
            &[("slurm.conf", b"old")],
            at,
        )
        .apply(&mut ix);
    let mut store = VerdictStore::evaluated(&ix);
    store.sources.insert(
        key,
        SourceItem {
            kind: "Secret".into(),
            namespace: "slurm".into(),
            name: "auth".into(),
            present: true,
            fingerprint: None,
            uid: None,
            changed_at: Some(changed.to_string()),
        },
    );
    let doc = |store: &VerdictStore| store.document(&Query::default(), true, true);
    let item =
        |doc: &StatusDoc, pod: &str| doc.verdicts.iter().find(|v| v.pod == pod).cloned().unwrap();
    // Without slurmrestd: nothing of Slurm.
    let d = doc(&store);
    assert!(item(&d, "w0").state == "Stale" && item(&d, "w0").slurm.is_none());
    // With it, not read yet.
    store.slurm.enabled = true;
    let w0 = item(&doc(&store), "w0");
    assert_eq!(w0.slurm.as_ref().unwrap().finding, SlurmFinding::NotRead);
    assert!(
        w0.advice
            .unwrap()
            .ends_with("Slurm not read yet (node w0).")
    );
    // Read: slurmctld restarted on the new key, no registration.
    let node = |start: i64| SlurmNodeState {
        state: vec!["IDLE".into(), "NOT_RESPONDING".into()],
        reason: String::new(),
        reason_set_by_user: String::new(),
        alloc_cpus: 0,
        slurmd_start_time: Some(start),
    };
    for name in ["w0", "w1"] {
        store.slurm.nodes.insert(
            name.into(),
            SlurmRead {
                at: ts("2026-11-30T10:00:01Z"),
                outcome: ReadOutcome::Node(node(0)),
            },
        );
    }
    let d = doc(&store);
    let w0 = item(&d, "w0");
    let side = w0.slurm.clone().unwrap();
    assert_eq!(
        (side.finding, side.content_changed_at, side.states.join("+")),
        (
            SlurmFinding::NotRegistered,
            Some(changed),
            "IDLE+NOT_RESPONDING".to_string()
        )
    );
    let advice = w0.advice.clone().unwrap();
    assert!(
        advice.starts_with("Replace the pod")
            && advice.ends_with(&side.message)
            && side.message.contains(
                "node w0 has not registered since the content changed at 2026-11-30T09:00:00Z"
            ),
        "{advice}"
    );
    // Not about the key: no Slurm side, the advice alone.
    let w1 = item(&d, "w1");
    assert!(w1.slurm.is_none() && !w1.advice.unwrap().contains("Slurm"));
    // The field round-trips for the status command.
    let back: StatusDoc = serde_json::from_slice(&serde_json::to_vec(&d).unwrap()).unwrap();
    assert_eq!(back, d);
    let json = serde_json::to_value(&w0).unwrap();
    assert_eq!(json["slurm"]["finding"], "NotRegistered");
    assert_eq!(json["slurm"]["contentChangedAt"], "2026-11-30T09:00:00Z");
    // A read that failed says so; the verdict stays Stale.
    store.slurm.nodes.insert(
        "w0".into(),
        SlurmRead {
            at: ts("2026-11-30T10:00:01Z"),
            outcome: ReadOutcome::Failed("cannot reach slurmrestd: refused".into()),
        },
    );
    let w0 = item(&doc(&store), "w0");
    assert_eq!(w0.state, "Stale");
    assert!(
        w0.advice
            .unwrap()
            .ends_with("Slurm not read: cannot reach slurmrestd: refused.")
    );
}
