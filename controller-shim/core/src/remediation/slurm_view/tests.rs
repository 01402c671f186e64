use std::sync::Arc;

use super::*;
use crate::SourceKind;
use crate::model::{NodeSetMember, VolumeSource};
use crate::remediation::test_support::node;
use crate::testkit::{PodB, obj, ts};
use crate::verdict::{
    FileState, FileVerdict, FrozenCause, StaleCause, SubjectId, UnverifiableReason, VerdictDetail,
};

/// When the Secret was recreated with the new key.
fn rotated() -> Timestamp {
    ts("2026-11-30T10:00:00Z")
}

/// The NodeSet pod `slurm/worker-0` (Slurm node `worker-0` unless
/// `slurm_node` says otherwise) with the projected volume `slurm-etc` of
/// Secret `slurm-auth-slurm` and a container mounting its key by subPath.
fn worker(nodeset: bool, slurm_node: Option<&str>) -> Arc<crate::PodModel> {
    let mut p = PodB::new("slurm", "worker-0", "uid-w0", "node-a")
        .volume(
            "slurm-etc",
            VolumeSource::Object(obj(SourceKind::Secret, "slurm-auth-slurm", &[], false)),
        )
        .container(
            "slurmd",
            Some(ts("2026-11-30T09:00:00Z")),
            &[("slurm-etc", "slurm.key")],
            vec![],
        )
        .build();
    if nodeset {
        p.slinky = NodeSetMember::boxed("worker".into(), slurm_node.map(Arc::from));
    }
    Arc::new(p)
}

fn verdict(id: SubjectId, state: State, differing: &[&str], files: &[&str]) -> Verdict {
    Verdict {
        id,
        state,
        underlying: state,
        expected: None,
        observed: None,
        since: rotated().into(),
        detail: Some(Box::new(VerdictDetail {
            differing_paths: differing.iter().map(|p| Arc::from(*p)).collect(),
            files: files
                .iter()
                .map(|p| FileVerdict {
                    path: Arc::from(*p),
                    state: FileState::Fresh,
                    expected: None,
                    observed: None,
                })
                .collect(),
            ..Default::default()
        })),
    }
}

fn stale() -> State {
    State::Stale(StaleCause::ImmutableCache)
}

fn pv(pod: Arc<crate::PodModel>, verdicts: Vec<Verdict>) -> PodVerdicts {
    PodVerdicts {
        pod,
        verdicts: verdicts.into(),
    }
}

fn read(state: &[&str], start: Option<Timestamp>) -> SlurmRead {
    let mut n = node(state, "");
    n.slurmd_start_time = Some(start.map_or(0, |t| t.as_second()));
    SlurmRead {
        at: rotated() + SignedDuration::from_mins(5),
        outcome: ReadOutcome::Node(n),
    }
}

/// What Slurm shows of a worker the agent finds stale, one row per
/// case: the finding never depends on the node's state (a slurmd on a
/// stale key flaps IDLE / IDLE+NOT_RESPONDING and is never DOWN), only on
/// `slurmd_start_time` against the change; a failed read says so and
/// nothing else.
#[test]
fn what_slurm_shows_of_a_stale_worker() {
    use SlurmFinding as F;
    let before = rotated() - SignedDuration::from_hours(20);
    let after = rotated() + SignedDuration::from_mins(2);
    let failed = SlurmRead {
        at: rotated(),
        outcome: ReadOutcome::Failed("cannot reach slurmrestd: connection refused".into()),
    };
    let unknown = SlurmRead {
        at: rotated(),
        outcome: ReadOutcome::NotFound,
    };
    // (case, read, change time, finding, message has, message has not)
    type Row<'a> = (
        &'a str,
        Option<SlurmRead>,
        Option<Timestamp>,
        SlurmFinding,
        &'a [&'a str],
        &'a [&'a str],
    );
    let table: Vec<Row<'_>> = vec![
        (
            "slurmctld restarted on the new key: no registration at all",
            Some(read(&["IDLE", "NOT_RESPONDING"], None)),
            Some(rotated()),
            F::NotRegistered,
            &[
                "node worker-0 has not registered since the content changed at 2026-11-30T10:00:00Z",
                "slurmd_start_time 0",
                "IDLE+NOT_RESPONDING with no reason",
            ],
            &["registered a slurmd"],
        ),
        (
            "the flap's other phase says the same",
            Some(read(&["IDLE"], None)),
            Some(rotated()),
            F::NotRegistered,
            &["has not registered since", "shows it IDLE with no reason"],
            &["NOT_RESPONDING with"],
        ),
        (
            "last registration of a slurmd started before the rotation",
            Some(read(&["IDLE"], Some(before))),
            Some(rotated()),
            F::NotRegistered,
            &[
                "has not registered since",
                "a slurmd started at 2026-11-29T14:00:00Z",
            ],
            &["slurmd_start_time 0"],
        ),
        (
            "same flap, not responding at this read",
            Some(read(&["IDLE", "NOT_RESPONDING"], Some(before))),
            Some(rotated()),
            F::NotRegistered,
            &["has not registered since", "IDLE+NOT_RESPONDING"],
            &[],
        ),
        (
            "registered after the rotation: slurmctld takes the worker's key",
            Some(read(&["IDLE"], Some(after))),
            Some(rotated()),
            F::Registered,
            &[
                "registered a slurmd started at 2026-11-30T10:02:00Z, after the content changed",
                "may not have loaded the new key",
            ],
            &["has not registered"],
        ),
        (
            "registered in the second of the change (whole seconds)",
            Some(read(&["IDLE"], Some(rotated()))),
            Some(rotated() + SignedDuration::from_millis(400)),
            F::Registered,
            &["registered a slurmd"],
            &[],
        ),
        (
            "registered and not responding now: still registered",
            Some(read(&["IDLE", "NOT_RESPONDING"], Some(after))),
            Some(rotated()),
            F::Registered,
            &["registered a slurmd"],
            &[],
        ),
        (
            "change time unknown, no registration",
            Some(read(&["IDLE"], None)),
            None,
            F::NotRegistered,
            &["has not registered since slurmctld started"],
            &[],
        ),
        (
            "change time unknown, a registration",
            Some(read(&["IDLE"], Some(before))),
            None,
            F::Registered,
            &["when the content changed is not known"],
            &[],
        ),
        (
            "slurmrestd does not know the node",
            Some(unknown),
            Some(rotated()),
            F::UnknownNode,
            &["Slurm does not know node worker-0", "never registers"],
            &[],
        ),
        (
            "the read failed",
            Some(failed),
            Some(rotated()),
            F::NotRead,
            &["Slurm not read: cannot reach slurmrestd: connection refused."],
            &["registered"],
        ),
        (
            "not read yet",
            None,
            Some(rotated()),
            F::NotRead,
            &["Slurm not read yet (node worker-0)."],
            &[],
        ),
    ];
    for (case, r, t, finding, has, not) in table {
        let s = side("worker-0", r.as_ref(), t);
        assert_eq!(s.finding, finding, "{case}: {}", s.message);
        assert_eq!(s.content_changed_at, t, "{case}");
        assert_eq!(s.read_at, r.as_ref().map(|r| r.at), "{case}");
        // One sentence.
        assert!(
            s.message.ends_with('.') && !s.message.trim_end_matches('.').contains(". "),
            "{case}: {}",
            s.message
        );
        for h in has {
            assert!(s.message.contains(h), "{case}: {h:?} in {}", s.message);
        }
        for n in not {
            assert!(!s.message.contains(n), "{case}: not {n:?} in {}", s.message);
        }
    }
    // The facts read are kept as read; no start time is shown for 0.
    let s = side("worker-0", Some(&read(&["IDLE"], Some(before))), None);
    assert_eq!(
        (s.states.as_slice(), s.slurmd_start_time),
        (&["IDLE".to_string()][..], Some(before))
    );
    assert_eq!(
        side("worker-0", Some(&read(&["IDLE"], None)), None).slurmd_start_time,
        None
    );
}

/// Which verdicts show Slurm's side: a NodeSet pod's with a Slurm node,
/// Stale or Frozen, about the key (a differing or listed `slurm.key` or
/// `slurm.jwks`, or a subPath of one); and which nodes are read: the same
/// verdicts, and Propagating ones (read before they turn Stale).
#[test]
fn which_verdicts_show_slurm_and_which_nodes_are_read() {
    let vol = SubjectId::Volume(0);
    let sub = SubjectId::SubPath(0, 0);
    let frozen = State::Frozen(FrozenCause::ReadAtStart);
    let w = || worker(true, Some("worker-0"));
    // (case, pod, verdict, shown, read)
    let table: Vec<(&str, Arc<crate::PodModel>, Verdict, bool, bool)> = vec![
        (
            "stale key",
            w(),
            verdict(vol, stale(), &["slurm.key"], &[]),
            true,
            true,
        ),
        (
            "stale key set, nested",
            w(),
            verdict(vol, stale(), &["etc/slurm.jwks"], &[]),
            true,
            true,
        ),
        (
            "frozen read-at-start, the key listed",
            w(),
            verdict(vol, frozen, &[], &["slurm.conf", "slurm.key"]),
            true,
            true,
        ),
        (
            "frozen subPath of the key",
            w(),
            verdict(sub, State::Frozen(FrozenCause::SubPath), &[""], &[]),
            true,
            true,
        ),
        (
            "propagating key: read, not shown",
            w(),
            verdict(vol, State::Propagating, &["slurm.key"], &[]),
            false,
            true,
        ),
        (
            "stale, another file",
            w(),
            verdict(vol, stale(), &["enroot.conf"], &[]),
            false,
            false,
        ),
        (
            "a file merely named like it",
            w(),
            verdict(vol, stale(), &["old-slurm.key"], &[]),
            false,
            false,
        ),
        (
            "fresh",
            w(),
            verdict(vol, State::Fresh, &[], &[]),
            false,
            false,
        ),
        (
            "unverifiable",
            w(),
            verdict(
                vol,
                State::Unverifiable(UnverifiableReason::ReadError),
                &["slurm.key"],
                &[],
            ),
            false,
            false,
        ),
        (
            "not a NodeSet pod",
            worker(false, None),
            verdict(vol, stale(), &["slurm.key"], &[]),
            false,
            false,
        ),
        (
            "a NodeSet pod without its hostname label",
            worker(true, None),
            verdict(vol, stale(), &["slurm.key"], &[]),
            false,
            false,
        ),
    ];
    for (case, pod, v, want_shown, want_read) in table {
        let p = pv(pod, vec![v.clone()]);
        let v = &p.verdicts[0];
        assert_eq!(shown(&p, v).is_some(), want_shown, "{case}");
        let nodes = wanted([&p]);
        assert_eq!(!nodes.is_empty(), want_read, "{case}: {nodes:?}");
        if want_shown {
            assert_eq!(shown(&p, v), Some("worker-0"), "{case}");
        }
    }
}

/// A node is read when no read is kept or the last is [`REFRESH`] old;
/// the side takes the latest change of the verdict's sources and shows
/// nothing without slurmrestd.
#[test]
fn reads_are_refreshed_at_most_once_per_period_and_shown_only_with_slurmrestd() {
    let now = rotated() + SignedDuration::from_mins(10);
    let wanted: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let at = |ago: SignedDuration| SlurmRead {
        at: now - ago,
        outcome: ReadOutcome::NotFound,
    };
    let mut reads = SlurmReads {
        enabled: true,
        nodes: [
            ("a".to_string(), at(SignedDuration::from_secs(5))),
            ("b".to_string(), at(REFRESH)),
            ("gone".to_string(), at(REFRESH * 4)),
        ]
        .into(),
    };
    assert_eq!(due(&wanted, &reads, now), vec!["b", "c"]);

    let p = pv(
        worker(true, Some("worker-0")),
        vec![verdict(SubjectId::Volume(0), stale(), &["slurm.key"], &[])],
    );
    reads
        .nodes
        .insert("worker-0".into(), read(&["IDLE"], Some(rotated())));
    let changed = |r: &SourceRef| (&*r.name == "slurm-auth-slurm").then_some(rotated());
    let s = reads.side(&p, &p.verdicts[0], changed).expect("shown");
    assert_eq!(
        (s.finding, s.content_changed_at),
        (SlurmFinding::Registered, Some(rotated()))
    );
    reads.enabled = false;
    assert_eq!(reads.side(&p, &p.verdicts[0], changed), None);
}

#[test]
fn advice_is_followed_by_what_slurm_shows() {
    let s = side("w0", None, None);
    assert_eq!(
        with_side(Some("Replace the pod.".into()), Some(&s)).as_deref(),
        Some("Replace the pod. Slurm not read yet (node w0).")
    );
    assert_eq!(with_side(Some("A.".into()), None).as_deref(), Some("A."));
    assert_eq!(with_side(None, None), None);
}

#[test]
fn a_verdict_is_told_again_only_when_a_read_says_something_new() {
    use SlurmFinding::*;
    assert!(retell(Some(NotRead), Some(NotRegistered)));
    assert!(retell(Some(NotRead), Some(UnknownNode)));
    assert!(retell(Some(NotRegistered), Some(Registered)));
    assert!(!retell(Some(NotRegistered), Some(NotRegistered)));
    assert!(
        !retell(Some(NotRegistered), Some(NotRead)),
        "a failed read is no news"
    );
    assert!(
        !retell(None, Some(NotRegistered)),
        "never told: the first Event says it"
    );
    assert!(!retell(Some(NotRead), None), "no Slurm side shown any more");
}
