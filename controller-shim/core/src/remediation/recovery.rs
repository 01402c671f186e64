//! Crash recovery: on start (and after winning leadership), reconcile the
//! persisted attempts with every Slurm node drained with a `mountguard:`
//! reason. Pure.
//!
//! * Every open persisted attempt is resumed: [`super::step`] decides from
//!   what Slurm and the API show, so an attempt persisted just before a
//!   write that never happened simply re-issues it, and one whose write
//!   happened but whose next phase was never persisted observes it.
//! * Every drain whose reason starts with `mountguard:` but belongs to no
//!   open attempt (the record was lost, or the attempt closed before its
//!   undrain landed) is released, if the reason is still exactly the one
//!   read (the executor re-reads right before the undrain).
//!
//! * Every Kubernetes node cordoned for a group of attempts
//!   (`--replace-pinning-pods`) that no open attempt owns is uncordoned.
//!
//! Together: no node stays drained or cordoned by mountguard without a live
//! attempt.
//!
//! Only from a complete view: a drain whose attempt is not in the records
//! read is released only when every NodeSet was listed and every record
//! parsed ([`View::complete`]). An attempt in a NodeSet not listed yet (the
//! list failed, the API is slow) or in a record that did not parse is
//! unknown, not lost: its drain stays, and so does the record, since the
//! executor writes no record it has not read. The same rule holds for the
//! periodic sweep ([`recover`] on the attempts in memory).

use std::collections::HashSet;

use super::machine::{Attempt, AttemptsRecord, SlurmNodeState, reason_attempt_id};

/// A drain to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    /// Slurm node.
    pub node: String,
    /// The reason read (release only if it is still this).
    pub reason: String,
    /// The attempt id in the reason, if any.
    pub attempt: Option<String>,
}

/// What to do after a (re)start.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Recovery {
    /// Open attempts to keep stepping.
    pub resume: Vec<Attempt>,
    /// Orphan mountguard drains to release.
    pub release: Vec<Release>,
}

/// The persisted attempts as read from the NodeSets' annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct View {
    /// Every attempt of every record that parsed.
    pub attempts: Vec<Attempt>,
    /// NodeSets (`namespace/name`) whose record was read (parsed, or absent).
    pub read: Vec<String>,
    /// NodeSets whose record did not parse, with the error.
    pub unreadable: Vec<(String, String)>,
    /// Every NodeSet was listed (the NodeSet watches synced).
    pub listed: bool,
}

impl View {
    /// Reads the records of `nodesets` (`(namespace/name, annotation)`);
    /// `listed`: the list is known to be complete.
    pub fn read<'a>(
        nodesets: impl IntoIterator<Item = (String, Option<&'a str>)>,
        listed: bool,
    ) -> Self {
        let mut v = View {
            listed,
            ..Default::default()
        };
        for (key, value) in nodesets {
            match value.map(AttemptsRecord::parse) {
                None => v.read.push(key),
                Some(Ok(r)) => {
                    v.attempts.extend(r.attempts);
                    v.read.push(key);
                }
                Some(Err(e)) => v.unreadable.push((key, e.to_string())),
            }
        }
        v
    }

    /// Every attempt that exists is known: only then may a drain without a
    /// known attempt be taken for an orphan.
    pub fn complete(&self) -> bool {
        self.listed && self.unreadable.is_empty()
    }
}

/// Reconciles `persisted` (every attempt of every NodeSet) with the Slurm
/// nodes as read (`(name, state)`). `complete`: `persisted` holds every
/// attempt that exists ([`View::complete`]); otherwise nothing is released.
pub fn recover(
    persisted: &[Attempt],
    slurm_nodes: &[(String, SlurmNodeState)],
    complete: bool,
) -> Recovery {
    let resume: Vec<Attempt> = persisted.iter().filter(|a| a.is_open()).cloned().collect();
    if !complete {
        return Recovery {
            resume,
            release: Vec::new(),
        };
    }
    let live: HashSet<(&str, &str)> = resume
        .iter()
        .filter(|a| a.drain_requested)
        .map(|a| (a.slurm_node.as_str(), a.id.as_str()))
        .collect();
    let release = slurm_nodes
        .iter()
        .filter(|(_, n)| n.held() && n.reason_is_mountguard())
        .filter(|(name, n)| {
            reason_attempt_id(&n.reason).is_none_or(|id| !live.contains(&(name.as_str(), id)))
        })
        .map(|(name, n)| Release {
            node: name.clone(),
            reason: n.reason.clone(),
            attempt: reason_attempt_id(&n.reason).map(String::from),
        })
        .collect();
    Recovery { resume, release }
}

/// Kubernetes nodes held by a group or a workload attempt (`(node, owner)`
/// from the [`super::HOLD_TAINT_KEY`] taint) that no open attempt owns
/// ([`Attempt::hold_owner`]): to release, if the taint still names that
/// owner.
pub fn orphan_cordons(
    persisted: &[Attempt],
    cordoned: &[(String, String)],
) -> Vec<(String, String)> {
    let live: HashSet<&str> = persisted
        .iter()
        .filter(|a| a.is_open())
        .filter_map(|a| a.hold_owner())
        .collect();
    cordoned
        .iter()
        .filter(|(_, group)| !live.contains(group.as_str()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use jiff::{SignedDuration, Timestamp};

    use super::*;
    use crate::remediation::machine::{
        Action, FailReason, MachineConfig, NewPodCheck, Observations, Phase, SlurmObservation, step,
    };
    use crate::remediation::test_support::{attempt_in, node, t0};

    fn run(a: &Attempt, obs: Observations, now: Timestamp) -> (Attempt, Vec<Action>) {
        step(a, &obs, now, &MachineConfig::default())
    }

    fn writes(actions: &[Action]) -> Vec<&Action> {
        actions
            .iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::DrainNode { .. } | Action::UndrainNode { .. } | Action::Evict { .. }
                )
            })
            .collect()
    }

    #[test]
    fn crash_after_persisting_draining_before_the_drain_reissues_it() {
        let a = attempt_in(Phase::Draining);
        let r = recover(
            std::slice::from_ref(&a),
            &[("n1".into(), node(&["IDLE"], ""))],
            true,
        );
        assert_eq!(r.resume.len(), 1);
        assert!(r.release.is_empty());
        let obs = Observations {
            slurm: SlurmObservation::Node(node(&["IDLE"], "")),
            pod_uid: Some("uid-old".into()),
            ..Default::default()
        };
        let (_, actions) = run(&r.resume[0], obs, t0() + SignedDuration::from_secs(60));
        assert!(matches!(writes(&actions)[..], [Action::DrainNode { .. }]));
    }

    #[test]
    fn crash_after_the_drain_before_persisting_drained_observes_it() {
        let a = attempt_in(Phase::Draining);
        let drained = node(&["IDLE", "DRAIN"], &a.drain_reason);
        let r = recover(
            std::slice::from_ref(&a),
            &[("n1".into(), drained.clone())],
            true,
        );
        assert!(r.release.is_empty(), "a live attempt owns the drain");
        let obs = Observations {
            slurm: SlurmObservation::Node(drained),
            pod_uid: Some("uid-old".into()),
            ..Default::default()
        };
        let (b, actions) = run(&r.resume[0], obs, t0() + SignedDuration::from_secs(60));
        assert_eq!(b.phase, Phase::Drained);
        assert!(writes(&actions).is_empty());
    }

    #[test]
    fn crash_in_evicting_before_the_eviction_reissues_it_with_the_uid() {
        let a = attempt_in(Phase::Evicting);
        let drained = node(&["IDLE", "DRAIN"], &a.drain_reason);
        let r = recover(
            std::slice::from_ref(&a),
            &[("n1".into(), drained.clone())],
            true,
        );
        let obs = Observations {
            slurm: SlurmObservation::Node(drained),
            pod_uid: Some("uid-old".into()),
            ..Default::default()
        };
        let (_, actions) = run(&r.resume[0], obs, t0() + SignedDuration::from_secs(60));
        assert_eq!(
            writes(&actions),
            vec![&Action::Evict {
                namespace: "slurm".into(),
                pod: "worker-0".into(),
                uid: "uid-old".into()
            }]
        );
    }

    #[test]
    fn crash_after_the_eviction_moves_on_without_evicting_again() {
        let a = attempt_in(Phase::Evicting);
        let drained = node(&["IDLE", "DRAIN"], &a.drain_reason);
        let obs = Observations {
            slurm: SlurmObservation::Node(drained),
            pod_uid: None,
            ..Default::default()
        };
        let (b, actions) = run(&a, obs, t0() + SignedDuration::from_secs(60));
        assert_eq!(b.phase, Phase::AwaitingReplacement);
        assert!(writes(&actions).is_empty());
    }

    #[test]
    fn crash_in_undraining_after_the_undrain_succeeds_without_writing() {
        let a = attempt_in(Phase::Undraining);
        let r = recover(
            std::slice::from_ref(&a),
            &[("n1".into(), node(&["IDLE"], ""))],
            true,
        );
        let obs = Observations {
            slurm: SlurmObservation::Node(node(&["IDLE"], "")),
            pod_uid: Some("uid-new".into()),
            ..Default::default()
        };
        let (b, actions) = run(&r.resume[0], obs, t0() + SignedDuration::from_secs(60));
        assert_eq!(b.phase, Phase::Succeeded);
        assert!(writes(&actions).is_empty());
    }

    #[test]
    fn crash_in_undraining_before_the_undrain_reissues_it() {
        let a = attempt_in(Phase::Undraining);
        let drained = node(&["IDLE", "DRAIN"], &a.drain_reason);
        let obs = Observations {
            slurm: SlurmObservation::Node(drained),
            pod_uid: Some("uid-new".into()),
            new_pod: NewPodCheck::Fresh,
            ..Default::default()
        };
        let (_, actions) = run(&a, obs, t0() + SignedDuration::from_secs(60));
        assert!(matches!(writes(&actions)[..], [Action::UndrainNode { .. }]));
    }

    #[test]
    fn a_drain_whose_record_was_lost_is_released() {
        let a = attempt_in(Phase::Drained);
        let r = recover(
            &[],
            &[("n1".into(), node(&["IDLE", "DRAIN"], &a.drain_reason))],
            true,
        );
        assert!(r.resume.is_empty());
        assert_eq!(
            r.release,
            vec![Release {
                node: "n1".into(),
                reason: a.drain_reason.clone(),
                attempt: Some(a.id.clone())
            }]
        );
    }

    #[test]
    fn a_drain_of_a_closed_attempt_is_released_a_kept_one_is_not() {
        let mut done = attempt_in(Phase::Succeeded);
        done.kept_drained = false;
        let mut kept = attempt_in(Phase::Failed(FailReason::ReplacementStale));
        kept.id = "kept1".into();
        kept.slurm_node = "n2".into();
        kept.drain_reason =
            crate::remediation::machine::drain_reason("slurm", "worker-1", &kept.findings, "kept1");
        kept.kept_drained = true;
        let nodes = vec![
            ("n1".into(), node(&["IDLE", "DRAIN"], &done.drain_reason)),
            ("n2".into(), node(&["DOWN", "DRAIN"], &kept.drain_reason)),
        ];
        let r = recover(&[done, kept.clone()], &nodes, true);
        assert_eq!(r.resume, vec![kept]);
        assert_eq!(r.release.len(), 1);
        assert_eq!(r.release[0].node, "n1");
    }

    #[test]
    fn foreign_and_operator_drains_are_never_released() {
        let nodes = vec![
            ("n1".into(), node(&["IDLE", "DRAIN"], "hardware check")),
            (
                "n2".into(),
                node(&["IDLE", "DRAIN"], "slurm-operator: pod deleted"),
            ),
            ("n3".into(), node(&["IDLE"], "mountguard: x attempt abc")),
        ];
        let r = recover(&[], &nodes, true);
        assert!(r.release.is_empty(), "{:?}", r.release);
    }

    #[test]
    fn a_mountguard_drain_without_an_attempt_id_is_released() {
        let nodes = vec![("n1".into(), node(&["IDLE", "DRAIN"], "mountguard: manual"))];
        let r = recover(&[], &nodes, true);
        assert_eq!(r.release.len(), 1);
        assert_eq!(r.release[0].attempt, None);
    }

    #[test]
    fn nothing_is_released_from_an_incomplete_view() {
        // A kept drain (failed replacement) and a live attempt, both in a
        // record that is not in the view: the NodeSet list failed.
        let mut kept = attempt_in(Phase::Failed(FailReason::ReplacementStale));
        kept.kept_drained = true;
        let nodes = vec![("n1".into(), node(&["DOWN", "DRAIN"], &kept.drain_reason))];
        let r = recover(&[], &nodes, false);
        assert!(r.release.is_empty(), "{:?}", r.release);
        // The same with the list complete: an orphan, released.
        assert_eq!(recover(&[], &nodes, true).release.len(), 1);
        // And with the record read, kept.
        assert!(recover(&[kept], &nodes, true).release.is_empty());
    }

    #[test]
    fn a_view_is_complete_only_when_listed_and_every_record_parsed() {
        let a = attempt_in(Phase::Drained);
        let record = AttemptsRecord::from_attempts([&a]).to_json();
        let v = View::read(
            [
                ("slurm/worker".to_string(), Some(record.as_str())),
                ("slurm/other".to_string(), None),
            ],
            true,
        );
        assert!(v.complete());
        assert_eq!(v.attempts, vec![a.clone()]);
        assert_eq!(v.read, vec!["slurm/worker", "slurm/other"]);
        // Not listed yet: incomplete, whatever was read.
        let v = View::read([("slurm/worker".to_string(), Some(record.as_str()))], false);
        assert!(!v.complete());
        // A record that does not parse: its attempts are unknown, not absent.
        let v = View::read(
            [
                ("slurm/worker".to_string(), Some("{not json")),
                ("slurm/other".to_string(), Some(record.as_str())),
            ],
            true,
        );
        assert!(!v.complete());
        assert_eq!(v.read, vec!["slurm/other"]);
        assert_eq!(v.unreadable.len(), 1);
        assert_eq!(v.unreadable[0].0, "slurm/worker");
        assert!(
            v.unreadable[0].1.contains("fix or remove"),
            "{:?}",
            v.unreadable
        );
    }

    #[test]
    fn cordons_without_an_open_attempt_of_their_group_are_released() {
        let live = Attempt {
            group: Some("g-live".into()),
            ..attempt_in(Phase::AwaitingReplacement)
        };
        let mut closed = Attempt {
            group: Some("g-done".into()),
            ..attempt_in(Phase::Succeeded)
        };
        closed.id = "other".into();
        let cordoned = vec![
            ("node-a".to_string(), "g-live".to_string()),
            ("node-b".to_string(), "g-done".to_string()),
            ("node-c".to_string(), "g-unknown".to_string()),
        ];
        let out = orphan_cordons(&[live.clone(), closed], &cordoned);
        assert_eq!(
            out,
            vec![
                ("node-b".to_string(), "g-done".to_string()),
                ("node-c".to_string(), "g-unknown".to_string())
            ]
        );
        // A failed attempt still holding its cordon keeps it.
        let failing = Attempt {
            cordon_requested: true,
            ..Attempt {
                group: Some("g-done".into()),
                ..attempt_in(Phase::Failed(FailReason::ReplacementStale))
            }
        };
        assert_eq!(orphan_cordons(&[failing], &cordoned[1..2]), vec![]);
    }
}
