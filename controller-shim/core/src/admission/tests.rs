//! Tests of the admission decision over the pin/reference table.

use super::*;
use crate::model::SourceKind;
use crate::testkit::*;

fn secret(ns: &str, name: &str) -> SourceRef {
    SourceRef::new(SourceKind::Secret, a(ns), a(name))
}

fn h(node: &str, pod: &str) -> Holder {
    Holder {
        node: a(node),
        pod: a(pod),
    }
}

fn view(holders: &[(&str, &str)], previous_immutable: bool) -> NameView {
    let mut holders: Vec<Holder> = holders.iter().map(|(n, p)| h(n, p)).collect();
    holders.sort();
    NameView {
        holders,
        previous_immutable,
    }
}

fn call(operation: Operation, r: &SourceRef, immutable: bool) -> Call<'_> {
    Call {
        operation,
        source: r,
        immutable,
        remediation: false,
        verified_caller: true,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Allow,
    Warn,
    Deny,
}

fn kind_of(a: &Answer) -> Expect {
    match a {
        Answer::Allow => Expect::Allow,
        Answer::Warn(_) => Expect::Warn,
        Answer::Deny { .. } => Expect::Deny,
    }
}

/// The whole table: mode x operation x the object's immutability x the
/// previous object's immutability x holders.
#[test]
fn the_table_of_modes_operations_and_pins() {
    use Expect::*;
    use Operation::*;
    let r = secret("slurm", "slurm-key");
    let held = [("node-0", "slurmd-0"), ("node-1", "slurmd-1")];
    // (mode, op, object immutable, previous immutable, held, expected)
    let rows: &[(Mode, Operation, bool, bool, bool, Expect)] = &[
        // Deleting an immutable object while pods hold the name: warned in
        // both modes (deny never refuses a delete).
        (Mode::Warn, Delete, true, true, true, Warn),
        (Mode::Deny, Delete, true, true, true, Warn),
        (Mode::Off, Delete, true, true, true, Allow),
        // Nobody holds it: nothing to say.
        (Mode::Warn, Delete, true, true, false, Allow),
        (Mode::Deny, Delete, true, true, false, Allow),
        // A mutable object is watched: its deletion reaches every node.
        (Mode::Warn, Delete, false, false, true, Allow),
        (Mode::Deny, Delete, false, false, true, Allow),
        // Creating under a name whose previous object was immutable and is
        // still held: warned, refused in deny mode, whatever the new
        // object's own immutability.
        (Mode::Warn, Create, true, true, true, Warn),
        (Mode::Warn, Create, false, true, true, Warn),
        (Mode::Deny, Create, true, true, true, Deny),
        (Mode::Deny, Create, false, true, true, Deny),
        (Mode::Off, Create, true, true, true, Allow),
        // The previous object was mutable, or nobody holds the name.
        (Mode::Warn, Create, true, false, true, Allow),
        (Mode::Deny, Create, true, false, true, Allow),
        (Mode::Warn, Create, true, true, false, Allow),
        (Mode::Deny, Create, true, true, false, Allow),
    ];
    for (i, (mode, op, immutable, previous, held_now, expected)) in rows.iter().enumerate() {
        let v = view(if *held_now { &held } else { &[] }, *previous);
        let got = decide(*mode, &call(*op, &r, *immutable), &v);
        assert_eq!(kind_of(&got), *expected, "row {i}: {got:?}");
    }
}

#[test]
fn a_delete_warning_says_how_many_pods_on_how_many_nodes_and_what_to_do_instead() {
    let r = secret("slurm", "slurm-key");
    let v = view(
        &[
            ("node-0", "slurmd-0"),
            ("node-0", "login-0"),
            ("node-1", "slurmd-1"),
        ],
        true,
    );
    let Answer::Warn(w) = decide(Mode::Warn, &call(Operation::Delete, &r, true), &v) else {
        panic!("a warning");
    };
    assert_eq!(
        w[0],
        "immutable Secret \"slurm/slurm-key\" is referenced by 3 pods on 2 nodes: node-0, node-1"
    );
    assert!(w[1].contains("keeps serving the deleted content"), "{w:?}");
    assert!(w[2].contains("under a new name"), "{w:?}");
    assert!(!w[2].contains("remediation"), "{w:?}");
    let with_remediation = Call {
        remediation: true,
        ..call(Operation::Delete, &r, true)
    };
    let Answer::Warn(w) = decide(Mode::Warn, &with_remediation, &v) else {
        panic!("a warning");
    };
    assert!(
        w[2].contains("remediation replace the affected pods"),
        "{w:?}"
    );
}

#[test]
fn a_create_warning_names_the_holding_pods_and_a_denial_says_conflict() {
    let r = SourceRef::new(SourceKind::ConfigMap, a("slurm"), a("hooks"));
    let v = view(&[("node-0", "slurmd-0"), ("node-2", "slurmd-2")], true);
    let Answer::Warn(w) = decide(Mode::Warn, &call(Operation::Create, &r, true), &v) else {
        panic!("a warning");
    };
    assert_eq!(
        w[0],
        "the previous immutable ConfigMap \"slurm/hooks\" is still cached on 2 nodes, held by 2 \
         pods: node-0 (slurmd-0); node-2 (slurmd-2)"
    );
    match decide(Mode::Deny, &call(Operation::Create, &r, true), &v) {
        Answer::Deny {
            code,
            reason,
            message,
        } => {
            assert_eq!((code, reason), (409, "Conflict"));
            assert!(message.starts_with(&w[0]), "{message}");
            assert!(message.contains("under a new name"), "{message}");
        }
        other => panic!("a denial: {other:?}"),
    }
}

/// Anyone who reaches the webhook port can send a review of their own for
/// any name: unless the caller proved to be the API server, the answer
/// counts the holding pods and nodes and names none of them (warnings and
/// a denial alike), pointing to the status API instead.
#[test]
fn a_review_from_an_unverified_caller_names_no_node_and_no_pod() {
    let r = secret("slurm", "slurm-key");
    let v = view(&[("node-0", "slurmd-0"), ("node-1", "slurmd-1")], true);
    let unverified = |op| Call {
        verified_caller: false,
        ..call(op, &r, true)
    };
    let mut said = Vec::new();
    for mode in [Mode::Warn, Mode::Deny] {
        for op in [Operation::Delete, Operation::Create] {
            match decide(mode, &unverified(op), &v) {
                Answer::Warn(w) => said.extend(w),
                Answer::Deny { message, .. } => said.push(message),
                Answer::Allow => panic!("{mode:?} {op:?}: a warning or a denial"),
            }
        }
    }
    for s in &said {
        for name in ["node-0", "node-1", "slurmd-0", "slurmd-1"] {
            assert!(
                !s.contains(name),
                "{name} named to an unverified caller: {s}"
            );
        }
    }
    let Answer::Warn(w) = decide(Mode::Warn, &unverified(Operation::Delete), &v) else {
        panic!("a warning");
    };
    assert_eq!(
        w[0],
        "immutable Secret \"slurm/slurm-key\" is referenced by 2 pods on 2 nodes \
         (`kubectl mountguard status --namespace slurm --all` lists them)"
    );
    let Answer::Warn(w) = decide(Mode::Warn, &unverified(Operation::Create), &v) else {
        panic!("a warning");
    };
    assert_eq!(
        w[0],
        "the previous immutable Secret \"slurm/slurm-key\" is still cached on 2 nodes, held by \
         2 pods (`kubectl mountguard status --namespace slurm --all` lists them)"
    );
}

/// Every warning stays within the API server's per-warning limit of 256
/// runes, whatever the names and however many holders.
#[test]
fn every_warning_stays_under_256_runes() {
    let long = |c: char, n: usize| std::iter::repeat_n(c, n).collect::<String>();
    let r = SourceRef::new(SourceKind::ConfigMap, a(&long('n', 63)), a(&long('s', 253)));
    let mut holders = Vec::new();
    for node in 0..7 {
        for pod in 0..5 {
            holders.push(h(
                &format!("{}{node}", long('x', 250)),
                &format!("{}{pod}", long('p', 250)),
            ));
        }
    }
    holders.sort();
    for previous_immutable in [true, false] {
        let v = NameView {
            holders: holders.clone(),
            previous_immutable,
        };
        for op in [Operation::Create, Operation::Delete] {
            for (remediation, verified_caller) in
                [(true, true), (true, false), (false, true), (false, false)]
            {
                let c = Call {
                    remediation,
                    verified_caller,
                    ..call(op, &r, true)
                };
                if let Answer::Warn(w) = decide(Mode::Warn, &c, &v) {
                    for w in &w {
                        assert!(w.chars().count() <= 256, "{} runes: {w}", w.chars().count());
                    }
                }
            }
        }
    }
    let v = NameView {
        holders,
        previous_immutable: true,
    };
    let Answer::Warn(w) = decide(Mode::Warn, &call(Operation::Create, &r, true), &v) else {
        panic!("a warning");
    };
    assert!(w[0].contains("35 pods"), "{}", w[0]);
    assert!(w[0].contains("6 more nodes"), "{}", w[0]);
}

/// Who holds a name: registered pods only (scheduled, synced, not
/// Succeeded/Failed; a terminating pod still holds its registrations),
/// of the object's namespace, through any reference the kubelet counts.
#[test]
fn holders_are_the_registered_pods_referencing_the_name_by_any_reference() {
    let mut ix = ClusterIndex::new();
    let r = put_source(
        &mut ix,
        SourceKind::Secret,
        "slurm",
        "auth",
        &[("slurm.key", b"k")],
        true,
        None,
    );
    let vol = |p: PodB| {
        p.volume(
            "auth",
            crate::model::VolumeSource::Object(obj(SourceKind::Secret, "auth", &[], false)),
        )
    };
    let pods = [
        vol(PodB::new("slurm", "vol", "u1", "node-1")).build(),
        PodB::new("slurm", "pull", "u2", "node-0")
            .image_pull_secret("auth")
            .build(),
        PodB::new("slurm", "csi", "u3", "node-0")
            .other_ref(SourceKind::Secret, "auth")
            .build(),
        vol(PodB::new("slurm", "terminating", "u4", "node-2"))
            .terminating()
            .build(),
        // Not holding: not synced, finished, unscheduled, other namespace,
        // a ConfigMap of the same name.
        vol(PodB::new("slurm", "unsynced", "u5", "node-3"))
            .synced_at(None)
            .build(),
        vol(PodB::new("slurm", "done", "u6", "node-3"))
            .terminated()
            .build(),
        vol(PodB::new("slurm", "pending", "u7", "node-3"))
            .unscheduled()
            .build(),
        vol(PodB::new("other", "elsewhere", "u8", "node-3")).build(),
        PodB::new("slurm", "configmap", "u9", "node-3")
            .volume(
                "auth",
                crate::model::VolumeSource::Object(obj(SourceKind::ConfigMap, "auth", &[], false)),
            )
            .build(),
    ];
    for p in pods {
        ix.apply_pod(p);
    }
    let got: Vec<(String, String)> = holders(&ix, &r, None)
        .into_iter()
        .map(|h| (h.node.to_string(), h.pod.to_string()))
        .collect();
    let want: Vec<(String, String)> = [
        ("node-0", "csi"),
        ("node-0", "pull"),
        ("node-1", "vol"),
        ("node-2", "terminating"),
    ]
    .iter()
    .map(|(n, p)| (n.to_string(), p.to_string()))
    .collect();
    assert_eq!(got, want);
}

/// For a create, only pods registered before the previous object went
/// away hold its cached copy.
#[test]
fn holders_before_a_time_leave_out_pods_registered_after_it() {
    let mut ix = ClusterIndex::new();
    let r = secret("slurm", "auth");
    for (name, uid, node, started) in [
        ("old", "u1", "node-0", "2026-01-01T00:00:00Z"),
        ("new", "u2", "node-1", "2026-01-01T00:10:00Z"),
    ] {
        ix.apply_pod(
            PodB::new("slurm", name, uid, node)
                .image_pull_secret("auth")
                .synced_at(Some(ts(started)))
                .build(),
        );
    }
    let names = |v: Vec<Holder>| v.into_iter().map(|h| h.pod.to_string()).collect::<Vec<_>>();
    assert_eq!(names(holders(&ix, &r, None)), ["old", "new"]);
    assert_eq!(
        names(holders(&ix, &r, Some(ts("2026-01-01T00:05:00Z")))),
        ["old"]
    );
}
