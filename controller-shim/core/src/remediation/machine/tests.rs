use jiff::SignedDuration;

use super::*;
use crate::remediation::test_support::{attempt, attempt_in, events, node, t0};

const OLD: &str = "uid-old";
const NEW: &str = "uid-new";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum W {
    Drain,
    Hold,
    Restore,
    Resume,
    Undrain,
    Evict,
    Cordon,
    Uncordon,
}

/// Every phase of a NodeSet attempt that succeeds, in order.
const EVERY_PHASE: [&str; 8] = [
    "Pending",
    "Draining",
    "Drained",
    "Evicting",
    "AwaitingReplacement",
    "Verifying",
    "Undraining",
    "Succeeded",
];

fn writes(actions: &[Action]) -> Vec<W> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::DrainNode { .. } => Some(W::Drain),
            Action::HoldNode { .. } => Some(W::Hold),
            Action::RestoreDrain { .. } => Some(W::Restore),
            Action::ResumeNode { .. } => Some(W::Resume),
            Action::UndrainNode { .. } => Some(W::Undrain),
            Action::Evict { .. } => Some(W::Evict),
            Action::CordonNode { .. } => Some(W::Cordon),
            Action::UncordonNode { .. } => Some(W::Uncordon),
            _ => None,
        })
        .collect()
}

fn ours(state: &[&str]) -> SlurmObservation {
    SlurmObservation::Node(node(state, &attempt().drain_reason))
}

fn plain(state: &[&str]) -> SlurmObservation {
    SlurmObservation::Node(node(state, ""))
}

fn foreign(state: &[&str]) -> SlurmObservation {
    SlurmObservation::Node(node(state, "admin: replace DIMM"))
}

fn transient() -> SlurmObservation {
    SlurmObservation::Error {
        transient: true,
        message: "connection refused".into(),
    }
}

/// `slurm` read and the pod `pod` under the attempt's name, whose slurmd
/// started at `t0()`.
fn obs(slurm: SlurmObservation, pod: Option<&str>) -> Observations {
    Observations {
        slurm,
        pod_uid: pod.map(String::from),
        replacement_started: pod.map(|_| t0()),
        ..Default::default()
    }
}

/// The default configuration, verifying on one read (the several reads
/// have tests of their own).
fn one_read() -> MachineConfig {
    MachineConfig {
        verify_reads: 1,
        ..MachineConfig::default()
    }
}

struct Case {
    name: &'static str,
    from: Phase,
    obs: Observations,
    after: SignedDuration,
    policy: FailurePolicy,
    to: Phase,
    writes: Vec<W>,
    events: Vec<EventReason>,
    kept_drained: bool,
}

fn case(name: &'static str, from: Phase, obs: Observations, to: Phase) -> Case {
    Case {
        name,
        from,
        obs,
        after: SignedDuration::from_secs(30),
        policy: FailurePolicy::Auto,
        to,
        writes: vec![],
        events: vec![],
        kept_drained: false,
    }
}

impl Case {
    fn writes(mut self, w: &[W]) -> Self {
        self.writes = w.to_vec();
        self
    }
    fn events(mut self, e: &[EventReason]) -> Self {
        self.events = e.to_vec();
        self
    }
    fn after(mut self, d: SignedDuration) -> Self {
        self.after = d;
        self
    }
    fn kept(mut self) -> Self {
        self.kept_drained = true;
        self
    }
    fn policy(mut self, p: FailurePolicy) -> Self {
        self.policy = p;
        self
    }
}

use EventReason as E;
use FailReason as F;

fn cases() -> Vec<Case> {
    let h = SignedDuration::from_hours;
    let m = SignedDuration::from_mins;
    let fresh = |slurm| Observations {
        new_pod: NewPodCheck::Fresh,
        ..obs(slurm, Some(NEW))
    };
    let stale = |slurm| Observations {
        new_pod: NewPodCheck::StillStale {
            message: "volume slurm-etc Stale/ImmutableCachePinned".into(),
        },
        ..obs(slurm, Some(NEW))
    };
    vec![
        // Pending
        case(
            "pending drains an idle node",
            Phase::Pending,
            obs(plain(&["IDLE"]), Some(OLD)),
            Phase::Draining,
        )
        .writes(&[W::Drain])
        .events(&[E::RemediationStarted]),
        case(
            "pending drains a busy node too (drain waits for jobs)",
            Phase::Pending,
            obs(plain(&["MIXED"]), Some(OLD)),
            Phase::Draining,
        )
        .writes(&[W::Drain])
        .events(&[E::RemediationStarted]),
        case(
            "pending waits on a slurmrestd error",
            Phase::Pending,
            obs(transient(), Some(OLD)),
            Phase::Pending,
        ),
        case(
            "pending waits when slurm was not read",
            Phase::Pending,
            obs(SlurmObservation::NotRead, Some(OLD)),
            Phase::Pending,
        ),
        case(
            "pending takes a foreign drain over, to hand it back at the end",
            Phase::Pending,
            obs(foreign(&["IDLE", "DRAIN"]), Some(OLD)),
            Phase::Draining,
        )
        .writes(&[W::Drain])
        .events(&[E::RemediationStarted]),
        case(
            "pending leaves another mountguard attempt's drain alone",
            Phase::Pending,
            obs(
                SlurmObservation::Node(node(
                    &["IDLE", "DRAIN"],
                    "mountguard: slurm/worker-1 volume v stale attempt other1",
                )),
                Some(OLD),
            ),
            Phase::Failed(F::NodeDrainedByOthers),
        )
        .events(&[E::RemediationFailed]),
        case(
            "pending: one not-found is retried, not a failure",
            Phase::Pending,
            obs(SlurmObservation::NotFound, Some(OLD)),
            Phase::Pending,
        ),
        case(
            "draining: one not-found is retried, not a failure",
            Phase::Draining,
            obs(SlurmObservation::NotFound, Some(OLD)),
            Phase::Draining,
        ),
        case(
            "drained: one not-found is retried, not a failure",
            Phase::Drained,
            obs(SlurmObservation::NotFound, Some(OLD)),
            Phase::Drained,
        ),
        case(
            "undraining: one not-found is retried, not a failure",
            Phase::Undraining,
            obs(SlurmObservation::NotFound, Some(NEW)),
            Phase::Undraining,
        ),
        case(
            "pending: pod replaced meanwhile",
            Phase::Pending,
            obs(plain(&["IDLE"]), Some(NEW)),
            Phase::Failed(F::PodChanged),
        )
        .events(&[E::RemediationFailed]),
        // Draining
        case(
            "draining sees our drain",
            Phase::Draining,
            obs(ours(&["MIXED", "DRAIN"]), Some(OLD)),
            Phase::Drained,
        ),
        case(
            "draining re-issues a drain that did not show",
            Phase::Draining,
            obs(plain(&["IDLE"]), Some(OLD)),
            Phase::Draining,
        )
        .writes(&[W::Drain]),
        case(
            "draining waits on slurmrestd errors",
            Phase::Draining,
            obs(transient(), Some(OLD)),
            Phase::Draining,
        ),
        case(
            "draining: a foreign drain got there first: recorded, drained over later",
            Phase::Draining,
            obs(foreign(&["IDLE", "DRAIN"]), Some(OLD)),
            Phase::Draining,
        ),
        case(
            "draining: drain rejected",
            Phase::Draining,
            Observations {
                slurm_write: Some(WriteResult::Err {
                    transient: false,
                    message: "401 Unauthorized".into(),
                }),
                ..obs(plain(&["IDLE"]), Some(OLD))
            },
            Phase::Failed(F::DrainRejected),
        )
        .events(&[E::RemediationFailed]),
        case(
            "draining: the drain never shows",
            Phase::Draining,
            obs(plain(&["IDLE"]), Some(OLD)),
            Phase::Failed(F::DrainTimeout),
        )
        .after(h(25))
        .events(&[E::RemediationFailed]),
        // Drained
        case(
            "drained waits for jobs",
            Phase::Drained,
            obs(ours(&["MIXED", "DRAIN"]), Some(OLD)),
            Phase::Drained,
        ),
        case(
            "drained waits for completing jobs",
            Phase::Drained,
            obs(ours(&["IDLE", "DRAIN", "COMPLETING"]), Some(OLD)),
            Phase::Drained,
        ),
        case(
            "drained does not wait for a job only completing on a slurmd Slurm holds no registration of",
            Phase::Drained,
            obs(
                SlurmObservation::Node(SlurmNodeState {
                    alloc_cpus: 1,
                    slurmd_start_time: Some(0),
                    ..node(&["IDLE", "DRAIN", "COMPLETING"], &attempt().drain_reason)
                }),
                Some(OLD),
            ),
            Phase::Drained,
        )
        .writes(&[W::Hold]),
        case(
            "such a node under our FAIL hold is evicted",
            Phase::Drained,
            obs(
                SlurmObservation::Node(SlurmNodeState {
                    alloc_cpus: 1,
                    slurmd_start_time: Some(0),
                    ..node(
                        &["IDLE", "FAIL", "COMPLETING", "NOT_RESPONDING"],
                        &attempt().drain_reason,
                    )
                }),
                Some(OLD),
            ),
            Phase::Evicting,
        )
        .writes(&[W::Evict])
        .events(&[E::SlurmNodeDrained]),
        case(
            "drained still waits for a running job on a slurmd Slurm holds no registration of",
            Phase::Drained,
            obs(
                SlurmObservation::Node(SlurmNodeState {
                    alloc_cpus: 1,
                    slurmd_start_time: Some(0),
                    ..node(&["MIXED", "DRAIN", "COMPLETING"], &attempt().drain_reason)
                }),
                Some(OLD),
            ),
            Phase::Drained,
        ),
        case(
            "drained waits for a completing job on a registered slurmd",
            Phase::Drained,
            obs(
                SlurmObservation::Node(SlurmNodeState {
                    alloc_cpus: 1,
                    slurmd_start_time: Some(1_700_000_000),
                    ..node(&["IDLE", "DRAIN", "COMPLETING"], &attempt().drain_reason)
                }),
                Some(OLD),
            ),
            Phase::Drained,
        ),
        case(
            "drained without jobs sets the FAIL hold first",
            Phase::Drained,
            obs(ours(&["IDLE", "DRAIN"]), Some(OLD)),
            Phase::Drained,
        )
        .writes(&[W::Hold]),
        case(
            "drained with our FAIL hold evicts",
            Phase::Drained,
            obs(ours(&["IDLE", "FAIL"]), Some(OLD)),
            Phase::Evicting,
        )
        .writes(&[W::Evict])
        .events(&[E::SlurmNodeDrained]),
        case(
            "a DOWN stale node without jobs is evicted",
            Phase::Drained,
            obs(ours(&["DOWN", "FAIL", "NOT_RESPONDING"]), Some(OLD)),
            Phase::Evicting,
        )
        .writes(&[W::Evict])
        .events(&[E::SlurmNodeDrained]),
        case(
            "a DOWN node whose jobs Slurm still holds is not evicted",
            Phase::Drained,
            obs(
                SlurmObservation::Node(SlurmNodeState {
                    alloc_cpus: 2,
                    ..node(
                        &["DOWN", "DRAIN", "NOT_RESPONDING"],
                        &attempt().drain_reason,
                    )
                }),
                Some(OLD),
            ),
            Phase::Drained,
        ),
        case(
            "drained: slurmrestd errors are no progress",
            Phase::Drained,
            obs(transient(), Some(OLD)),
            Phase::Drained,
        ),
        case(
            "drained: drain timeout releases (pod untouched)",
            Phase::Drained,
            obs(ours(&["ALLOCATED", "DRAIN"]), Some(OLD)),
            Phase::Failed(F::DrainTimeout),
        )
        .after(h(24))
        .writes(&[W::Undrain])
        .events(&[E::RemediationFailed]),
        case(
            "drained: drain timeout with keep-drained keeps it",
            Phase::Drained,
            obs(ours(&["ALLOCATED", "DRAIN"]), Some(OLD)),
            Phase::Failed(F::DrainTimeout),
        )
        .after(h(24))
        .policy(FailurePolicy::KeepDrained)
        .events(&[E::RemediationFailed])
        .kept(),
        case(
            "drained: someone undrained before eviction",
            Phase::Drained,
            obs(plain(&["MIXED"]), Some(OLD)),
            Phase::Failed(F::DrainRemoved),
        )
        .events(&[E::RemediationFailed]),
        case(
            "drained: admin re-drain is taken as drained, never undrained",
            Phase::Drained,
            obs(foreign(&["IDLE", "DRAIN"]), Some(OLD)),
            Phase::Evicting,
        )
        .writes(&[W::Evict])
        .events(&[E::SlurmNodeDrained]),
        // Evicting
        case(
            "evicting: evicted",
            Phase::Evicting,
            Observations {
                eviction: Some(EvictionResult::Evicted),
                ..obs(ours(&["IDLE", "DRAIN"]), Some(OLD))
            },
            Phase::AwaitingReplacement,
        )
        .events(&[E::PodEvicted]),
        case(
            "evicting: pod gone",
            Phase::Evicting,
            obs(ours(&["IDLE", "DRAIN"]), None),
            Phase::AwaitingReplacement,
        )
        .events(&[E::PodEvicted]),
        case(
            "evicting: PDB 429 waits",
            Phase::Evicting,
            Observations {
                eviction: Some(EvictionResult::Refused {
                    retry_after: Some(SignedDuration::from_secs(60)),
                    message: "Cannot evict pod as it would violate the pod's disruption budget."
                        .into(),
                }),
                ..obs(ours(&["IDLE", "DRAIN"]), Some(OLD))
            },
            Phase::Evicting,
        ),
        case(
            "evicting: re-issues when due",
            Phase::Evicting,
            obs(ours(&["IDLE", "DRAIN"]), Some(OLD)),
            Phase::Evicting,
        )
        .writes(&[W::Evict]),
        case(
            "evicting: never evicts once the drain is gone",
            Phase::Evicting,
            obs(plain(&["IDLE"]), Some(OLD)),
            Phase::Failed(F::DrainRemoved),
        )
        .events(&[E::RemediationFailed]),
        case(
            "evicting: no eviction without reading slurm",
            Phase::Evicting,
            obs(transient(), Some(OLD)),
            Phase::Evicting,
        ),
        case(
            "evicting: timeout releases (pod untouched)",
            Phase::Evicting,
            obs(ours(&["IDLE", "DRAIN"]), Some(OLD)),
            Phase::Failed(F::EvictionTimeout),
        )
        .after(m(31))
        .writes(&[W::Undrain])
        .events(&[E::RemediationFailed]),
        // AwaitingReplacement
        case(
            "awaiting: new uid",
            Phase::AwaitingReplacement,
            obs(ours(&["DOWN", "DRAIN"]), Some(NEW)),
            Phase::Verifying,
        ),
        case(
            "awaiting: still absent",
            Phase::AwaitingReplacement,
            obs(ours(&["DOWN", "DRAIN"]), None),
            Phase::AwaitingReplacement,
        ),
        case(
            "awaiting: timeout keeps drained",
            Phase::AwaitingReplacement,
            obs(ours(&["DOWN", "DRAIN"]), None),
            Phase::Failed(F::ReplacementTimeout),
        )
        .after(m(16))
        .events(&[E::RemediationFailed])
        .kept(),
        case(
            "awaiting: timeout with --on-failure undrain releases",
            Phase::AwaitingReplacement,
            obs(ours(&["DOWN", "DRAIN"]), None),
            Phase::Failed(F::ReplacementTimeout),
        )
        .after(m(16))
        .policy(FailurePolicy::Undrain)
        .writes(&[W::Undrain])
        .events(&[E::RemediationFailed]),
        case(
            "awaiting: a timeout with a FAIL hold and --on-failure undrain drains before undraining",
            Phase::AwaitingReplacement,
            obs(ours(&["IDLE", "FAIL"]), None),
            Phase::Failed(F::ReplacementTimeout),
        )
        .after(m(16))
        .policy(FailurePolicy::Undrain)
        .writes(&[W::Drain])
        .events(&[E::RemediationFailed]),
        // Verifying
        case(
            "verifying: fresh, responding and DOWN from before (ReturnToService 0/1) resumes",
            Phase::Verifying,
            fresh(ours(&["DOWN", "FAIL"])),
            Phase::Undraining,
        )
        .writes(&[W::Resume])
        .events(&[E::RemediationVerified]),
        case(
            "verifying: fresh and responding undrains",
            Phase::Verifying,
            fresh(ours(&["IDLE", "DRAIN"])),
            Phase::Undraining,
        )
        .writes(&[W::Undrain])
        .events(&[E::RemediationVerified]),
        case(
            "verifying: fresh but slurm not responding waits",
            Phase::Verifying,
            fresh(ours(&["DOWN", "DRAIN", "NOT_RESPONDING"])),
            Phase::Verifying,
        ),
        case(
            "verifying: fresh but slurm unreadable waits",
            Phase::Verifying,
            fresh(transient()),
            Phase::Verifying,
        ),
        case(
            "verifying: no verdict yet waits",
            Phase::Verifying,
            obs(ours(&["IDLE", "DRAIN"]), Some(NEW)),
            Phase::Verifying,
        ),
        case(
            "verifying: still stale fails, kept drained",
            Phase::Verifying,
            stale(ours(&["DOWN", "DRAIN", "NOT_RESPONDING"])),
            Phase::Failed(F::ReplacementStale),
        )
        .events(&[E::RemediationFailed])
        .kept(),
        case(
            "verifying: timeout keeps drained",
            Phase::Verifying,
            fresh(ours(&["DOWN", "DRAIN", "NOT_RESPONDING"])),
            Phase::Failed(F::VerificationTimeout),
        )
        .after(m(11))
        .events(&[E::RemediationFailed])
        .kept(),
        case(
            "verifying: admin drain meanwhile -> succeeded without undrain",
            Phase::Verifying,
            fresh(foreign(&["IDLE", "DRAIN"])),
            Phase::Succeeded,
        )
        .events(&[E::RemediationVerified, E::RemediationSucceeded]),
        // Undraining
        case(
            "undraining: undrain ours",
            Phase::Undraining,
            obs(ours(&["IDLE", "DRAIN"]), Some(NEW)),
            Phase::Undraining,
        )
        .writes(&[W::Undrain]),
        case(
            "undraining: done",
            Phase::Undraining,
            obs(plain(&["IDLE"]), Some(NEW)),
            Phase::Succeeded,
        )
        .events(&[E::RemediationSucceeded]),
        case(
            "undraining: admin drain is left alone",
            Phase::Undraining,
            obs(foreign(&["IDLE", "DRAIN"]), Some(NEW)),
            Phase::Succeeded,
        )
        .events(&[E::RemediationSucceeded]),
        case(
            "undraining: slurmrestd errors retried",
            Phase::Undraining,
            obs(transient(), Some(NEW)),
            Phase::Undraining,
        ),
        case(
            "undraining: our FAIL hold is resumed",
            Phase::Undraining,
            obs(ours(&["IDLE", "FAIL"]), Some(NEW)),
            Phase::Undraining,
        )
        .writes(&[W::Resume]),
        case(
            "undraining: rejected keeps drained",
            Phase::Undraining,
            Observations {
                slurm_write: Some(WriteResult::Err {
                    transient: false,
                    message: "403 Forbidden".into(),
                }),
                ..obs(ours(&["IDLE", "DRAIN"]), Some(NEW))
            },
            Phase::Failed(F::UndrainRejected),
        )
        .events(&[E::RemediationFailed])
        .kept(),
    ]
}

#[test]
fn every_transition_and_failure_path() {
    let mut failures = Vec::new();
    for c in cases() {
        let a = attempt_in(c.from);
        let cfg = MachineConfig {
            on_failure: c.policy,
            // One step per case (several reads: their own tests below).
            verify_reads: 1,
            ..Default::default()
        };
        let (b, actions) = step(&a, &c.obs, t0() + c.after, &cfg);
        let got = (b.phase, writes(&actions), events(&actions), b.kept_drained);
        let want = (c.to, c.writes.clone(), c.events.clone(), c.kept_drained);
        if got != want {
            failures.push(format!("{}:\n  got  {got:?}\n  want {want:?}", c.name));
        }
        // Persist precedes every write, and comes with every transition.
        let first_write = actions.iter().position(|x| {
            matches!(
                x,
                Action::DrainNode { .. }
                    | Action::HoldNode { .. }
                    | Action::RestoreDrain { .. }
                    | Action::ResumeNode { .. }
                    | Action::UndrainNode { .. }
                    | Action::Evict { .. }
            )
        });
        let first_persist = actions.iter().position(|x| *x == Action::Persist);
        if b.phase != a.phase && first_persist.is_none() {
            failures.push(format!("{}: transition without Persist", c.name));
        }
        if let Some(w) = first_write
            && b.phase != a.phase
            && first_persist.is_none_or(|p| p > w)
        {
            failures.push(format!("{}: write before Persist: {actions:?}", c.name));
        }
        if b.phase != a.phase && b.history.last().map(|e| e.phase) != Some(b.phase) {
            failures.push(format!("{}: history not updated", c.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn undrain_carries_our_exact_reason_and_drain_carries_the_format() {
    let a = attempt();
    let (b, actions) = step(
        &a,
        &obs(plain(&["IDLE"]), Some(OLD)),
        t0(),
        &MachineConfig::default(),
    );
    let reason = actions
        .iter()
        .find_map(|x| match x {
            Action::DrainNode { node, reason } => Some((node.clone(), reason.clone())),
            _ => None,
        })
        .expect("drain");
    assert_eq!(
        reason,
        (
            "n1".to_string(),
            "mountguard: slurm/worker-0 volume slurm-etc stale (mounted 591b08c85fb0 vs current 6cc34aeed46b) attempt a1b2c3".to_string()
        )
    );
    assert!(b.drain_requested);
    let mut u = attempt_in(Phase::Undraining);
    u.drain_reason = reason.1.clone();
    let (_, actions) = step(
        &u,
        &obs(ours(&["IDLE", "DRAIN"]), Some(NEW)),
        t0(),
        &MachineConfig::default(),
    );
    assert!(actions.contains(&Action::UndrainNode {
        node: "n1".into(),
        owned_reason: reason.1
    }));
}

#[test]
fn ownership_needs_the_prefix_and_our_attempt_id() {
    let a = attempt();
    assert!(a.owns(&node(&["IDLE", "DRAIN"], &a.drain_reason)));
    assert!(!a.owns(&node(&["IDLE"], &a.drain_reason)), "no DRAIN flag");
    assert!(!a.owns(&node(
        &["IDLE", "DRAIN"],
        "mountguard: slurm/worker-0 volume x stale attempt other1"
    )));
    assert!(!a.owns(&node(&["IDLE", "DRAIN"], "admin: attempt a1b2c3")));
    assert_eq!(
        reason_attempt_id("mountguard: a/b volume v stale (mounted x vs current y) attempt 0f0f"),
        Some("0f0f")
    );
    assert_eq!(reason_attempt_id("slurm-operator: attempt 1"), None);
}

#[test]
fn the_whole_happy_path_with_a_running_job() {
    let cfg = one_read();
    let mut a = attempt();
    let mut now = t0();
    let mut phases = vec![];
    let mut all_writes = vec![];
    let script: Vec<Observations> = vec![
        obs(plain(&["MIXED"]), Some(OLD)),
        obs(ours(&["MIXED", "DRAIN"]), Some(OLD)),
        obs(ours(&["MIXED", "DRAIN"]), Some(OLD)),
        obs(ours(&["IDLE", "DRAIN", "COMPLETING"]), Some(OLD)),
        obs(ours(&["IDLE", "DRAIN"]), Some(OLD)),
        obs(ours(&["IDLE", "FAIL"]), Some(OLD)),
        Observations {
            eviction: Some(EvictionResult::Evicted),
            ..obs(ours(&["IDLE", "FAIL"]), Some(OLD))
        },
        obs(ours(&["DOWN", "FAIL", "NOT_RESPONDING"]), None),
        obs(ours(&["DOWN", "FAIL", "NOT_RESPONDING"]), Some(NEW)),
        Observations {
            new_pod: NewPodCheck::Fresh,
            ..obs(ours(&["DOWN", "FAIL", "NOT_RESPONDING"]), Some(NEW))
        },
        Observations {
            new_pod: NewPodCheck::Fresh,
            ..obs(ours(&["DOWN", "FAIL"]), Some(NEW))
        },
        Observations {
            slurm_write: Some(WriteResult::Ok),
            ..obs(plain(&["IDLE"]), Some(NEW))
        },
    ];
    for o in script {
        now += SignedDuration::from_secs(20);
        let (b, actions) = step(&a, &o, now, &cfg);
        all_writes.extend(writes(&actions));
        a = b;
        phases.push(a.phase);
    }
    assert_eq!(a.phase, Phase::Succeeded);
    assert_eq!(all_writes, vec![W::Drain, W::Hold, W::Evict, W::Resume]);
    assert_eq!(a.phase_names(), EVERY_PHASE);
    assert!(!a.is_open());
    assert_eq!(a.new_pod_uid.as_deref(), Some(NEW));
}

/// With `fail_first` the node is closed by our FAIL hold from the first
/// write: never a DRAIN (the only flag the Slinky operator's undrain
/// clears), no second hold before the eviction, the same phases; a hold
/// that does not show is asked for again, still as FAIL.
#[test]
fn fail_first_closes_the_node_with_the_hold_from_the_first_write() {
    let cfg = MachineConfig {
        fail_first: true,
        ..one_read()
    };
    let mut a = attempt();
    let mut now = t0();
    let mut all_writes = vec![];
    let script: Vec<Observations> = vec![
        obs(plain(&["MIXED"]), Some(OLD)),
        // Not showing yet (a lagging read): asked again once due.
        obs(plain(&["MIXED"]), Some(OLD)),
        obs(ours(&["MIXED", "FAIL"]), Some(OLD)),
        obs(ours(&["MIXED", "FAIL"]), Some(OLD)),
        obs(ours(&["IDLE", "FAIL"]), Some(OLD)),
        Observations {
            eviction: Some(EvictionResult::Evicted),
            ..obs(ours(&["IDLE", "FAIL"]), Some(OLD))
        },
        obs(ours(&["DOWN", "FAIL", "NOT_RESPONDING"]), None),
        obs(ours(&["DOWN", "FAIL", "NOT_RESPONDING"]), Some(NEW)),
        Observations {
            new_pod: NewPodCheck::Fresh,
            ..obs(ours(&["DOWN", "FAIL"]), Some(NEW))
        },
        Observations {
            slurm_write: Some(WriteResult::Ok),
            ..obs(plain(&["IDLE"]), Some(NEW))
        },
    ];
    for o in script {
        now += SignedDuration::from_secs(20);
        let (b, actions) = step(&a, &o, now, &cfg);
        all_writes.extend(writes(&actions));
        a = b;
    }
    assert_eq!(a.phase, Phase::Succeeded, "{a:?}");
    assert_eq!(
        all_writes,
        vec![W::Hold, W::Hold, W::Evict, W::Resume],
        "FAIL twice (the first did not show), never DRAIN"
    );
    assert_eq!(a.phase_names(), EVERY_PHASE);
    // The same script without it drains first.
    let (_, actions) = step(
        &attempt(),
        &obs(plain(&["MIXED"]), Some(OLD)),
        t0(),
        &MachineConfig::default(),
    );
    assert_eq!(writes(&actions), vec![W::Drain]);
}

#[test]
fn slurm_errors_back_off_and_are_never_progress() {
    let cfg = MachineConfig::default();
    let mut a = attempt_in(Phase::Draining);
    let mut now = t0();
    let mut delays = vec![];
    for _ in 0..8 {
        now += SignedDuration::from_secs(1);
        let (b, actions) = step(&a, &obs(transient(), Some(OLD)), now, &cfg);
        assert_eq!(b.phase, Phase::Draining);
        assert!(writes(&actions).is_empty());
        delays.push(b.retry.not_before.expect("backoff").duration_since(now));
        a = b;
    }
    assert_eq!(delays[0], SignedDuration::from_secs(5));
    assert_eq!(delays[1], SignedDuration::from_secs(10));
    assert!(delays.windows(2).all(|w| w[0] <= w[1]));
    assert_eq!(*delays.last().expect("some"), cfg.retry_max);
    // Not due: the re-issued drain waits for the backoff.
    let (b, actions) = step(&a, &obs(plain(&["IDLE"]), Some(OLD)), now, &cfg);
    assert!(writes(&actions).is_empty());
    let later = b.retry.not_before.expect("set");
    let (_, actions) = step(&b, &obs(plain(&["IDLE"]), Some(OLD)), later, &cfg);
    assert_eq!(writes(&actions), vec![W::Drain]);
}

#[test]
fn pdb_refusal_waits_for_retry_after_then_evicts_again() {
    let cfg = MachineConfig::default();
    let a = attempt_in(Phase::Evicting);
    let refused = Observations {
        eviction: Some(EvictionResult::Refused {
            retry_after: Some(SignedDuration::from_secs(90)),
            message: "violates PDB".into(),
        }),
        ..obs(ours(&["IDLE", "DRAIN"]), Some(OLD))
    };
    let now = t0() + SignedDuration::from_secs(10);
    let (b, actions) = step(&a, &refused, now, &cfg);
    assert!(writes(&actions).is_empty());
    assert_eq!(
        b.retry.not_before,
        Some(now + SignedDuration::from_secs(90))
    );
    let (_, actions) = step(
        &b,
        &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)),
        now + SignedDuration::from_secs(60),
        &cfg,
    );
    assert!(writes(&actions).is_empty(), "before Retry-After");
    let (_, actions) = step(
        &b,
        &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)),
        now + SignedDuration::from_secs(91),
        &cfg,
    );
    assert_eq!(writes(&actions), vec![W::Evict]);
}

#[test]
fn admin_drain_in_between_is_never_undrained() {
    let cfg = one_read();
    // Our drain was replaced by an admin's after the node drained.
    let mut a = attempt_in(Phase::Drained);
    let mut now = t0();
    let script = vec![
        obs(foreign(&["IDLE", "DRAIN"]), Some(OLD)),
        Observations {
            eviction: Some(EvictionResult::Evicted),
            ..obs(foreign(&["IDLE", "DRAIN"]), Some(OLD))
        },
        obs(foreign(&["IDLE", "DRAIN"]), Some(NEW)),
        Observations {
            new_pod: NewPodCheck::Fresh,
            ..obs(foreign(&["IDLE", "DRAIN"]), Some(NEW))
        },
    ];
    let mut ws = vec![];
    for o in script {
        now += SignedDuration::from_secs(20);
        let (b, actions) = step(&a, &o, now, &cfg);
        ws.extend(writes(&actions));
        a = b;
    }
    assert_eq!(a.phase, Phase::Succeeded);
    assert_eq!(ws, vec![W::Evict]);
    assert_eq!(a.foreign_drain.as_deref(), Some("admin: replace DIMM"));
    // And a failed attempt never releases a foreign drain either.
    let f = attempt_in(Phase::Failed(FailReason::ReplacementStale));
    let f = Attempt {
        release_pending: true,
        ..f
    };
    let (g, actions) = step(&f, &obs(foreign(&["IDLE", "DRAIN"]), Some(NEW)), now, &cfg);
    assert!(writes(&actions).is_empty());
    assert!(!g.is_open());
}

#[test]
fn a_kept_drain_released_by_an_operator_closes_the_attempt() {
    let cfg = MachineConfig::default();
    let a = Attempt {
        kept_drained: true,
        ..attempt_in(Phase::Failed(FailReason::ReplacementStale))
    };
    assert!(a.is_open());
    let (b, actions) = step(&a, &obs(ours(&["DOWN", "DRAIN"]), Some(NEW)), t0(), &cfg);
    assert!(b.kept_drained && writes(&actions).is_empty());
    let (c, actions) = step(&a, &obs(plain(&["IDLE"]), Some(NEW)), t0(), &cfg);
    assert!(!c.is_open());
    assert_eq!(actions, vec![Action::Persist]);
}

#[test]
fn a_pending_release_is_retried_until_the_drain_is_gone() {
    let cfg = MachineConfig::default();
    let a = Attempt {
        release_pending: true,
        ..attempt_in(Phase::Failed(FailReason::DrainTimeout))
    };
    let (b, actions) = step(&a, &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)), t0(), &cfg);
    assert_eq!(writes(&actions), vec![W::Undrain]);
    let failed = Observations {
        slurm_write: Some(WriteResult::Err {
            transient: true,
            message: "503".into(),
        }),
        ..obs(ours(&["IDLE", "DRAIN"]), Some(OLD))
    };
    let (c, _) = step(&b, &failed, t0() + SignedDuration::from_secs(11), &cfg);
    assert!(c.release_pending);
    let due = c.retry.not_before.expect("backoff");
    let (_, actions) = step(&c, &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)), due, &cfg);
    assert_eq!(writes(&actions), vec![W::Undrain]);
    let (d, _) = step(&c, &obs(plain(&["IDLE"]), Some(OLD)), due, &cfg);
    assert!(!d.is_open());
}

#[test]
fn not_found_counts_only_after_the_bound_and_a_read_resets_it() {
    let cfg = MachineConfig::default();
    let nf = || obs(SlurmObservation::NotFound, Some(OLD));
    let a = attempt_in(Phase::Draining);
    // First answer: retried with backoff, remembered since when.
    let (b, actions) = step(&a, &nf(), t0(), &cfg);
    assert_eq!(b.phase, Phase::Draining);
    assert_eq!(b.not_found_since, Some(t0()));
    assert!(writes(&actions).is_empty());
    assert!(
        b.retry
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("does not know")),
        "{b:?}"
    );
    // Still within the bound: still retried.
    let (c, _) = step(
        &b,
        &nf(),
        t0() + cfg.not_found_grace - SignedDuration::from_secs(1),
        &cfg,
    );
    assert_eq!(c.phase, Phase::Draining);
    // A read that finds the node clears it: the bound starts over.
    let (d, _) = step(
        &c,
        &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)),
        t0() + SignedDuration::from_secs(60),
        &cfg,
    );
    assert_eq!(d.phase, Phase::Drained);
    assert_eq!(d.not_found_since, None);
    let (e, _) = step(
        &d,
        &nf(),
        t0() + cfg.not_found_grace + SignedDuration::from_secs(60),
        &cfg,
    );
    assert_eq!(
        e.phase,
        Phase::Drained,
        "a new not-found starts a new bound"
    );
    // Not found for the whole bound: the node is gone.
    let (f, actions) = step(&b, &nf(), t0() + cfg.not_found_grace, &cfg);
    assert_eq!(f.phase, Phase::Failed(FailReason::SlurmNodeNotFound));
    assert_eq!(events(&actions), vec![EventReason::RemediationFailed]);
    assert!(
        !f.is_open(),
        "nothing of ours can remain on a node that is gone: {f:?}"
    );
}

#[test]
fn a_pending_release_survives_a_not_found_until_a_read_shows_the_drain_gone() {
    let cfg = MachineConfig::default();
    let a = Attempt {
        release_pending: true,
        ..attempt_in(Phase::Failed(FailReason::DrainTimeout))
    };
    let (b, actions) = step(&a, &obs(SlurmObservation::NotFound, Some(OLD)), t0(), &cfg);
    assert!(b.release_pending && b.is_open(), "{b:?}");
    assert!(writes(&actions).is_empty());
    // The node reads again with our drain: released.
    let due = b.retry.not_before.expect("backoff");
    let (c, actions) = step(&b, &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)), due, &cfg);
    assert_eq!(writes(&actions), vec![W::Undrain]);
    assert!(c.release_pending);
    let (d, _) = step(
        &c,
        &obs(plain(&["IDLE"]), Some(OLD)),
        due + cfg.write_settle,
        &cfg,
    );
    assert!(!d.is_open());
    // A kept drain is kept through a not-found too.
    let kept = Attempt {
        kept_drained: true,
        ..attempt_in(Phase::Failed(FailReason::ReplacementStale))
    };
    let (k, _) = step(
        &kept,
        &obs(SlurmObservation::NotFound, Some(NEW)),
        t0(),
        &cfg,
    );
    assert!(k.kept_drained && k.is_open(), "{k:?}");
    let (k, _) = step(
        &k,
        &obs(SlurmObservation::NotFound, Some(NEW)),
        t0() + cfg.not_found_grace,
        &cfg,
    );
    assert!(!k.is_open(), "gone for the whole bound: {k:?}");
}

#[test]
fn the_operators_prestop_reason_after_the_eviction_is_drained_over_and_resumed_at_the_end() {
    use crate::remediation::OPERATOR_PRESTOP_REASON;
    let cfg = one_read();
    let op = |state: &[&str], reason: &str| SlurmObservation::Node(node(state, reason));
    // The hook replaced our reason (DOWN, DRAIN kept) while the pod went.
    let a = attempt_in(Phase::AwaitingReplacement);
    let (b, actions) = step(
        &a,
        &obs(op(&["DOWN", "DRAIN"], OPERATOR_PRESTOP_REASON), None),
        t0(),
        &cfg,
    );
    assert!(b.prestop_down, "{b:?}");
    assert_eq!(writes(&actions), vec![W::Hold], "our hold again");
    assert_eq!(actions.first(), Some(&Action::Persist), "{actions:?}");
    // The operator undrained the replacement before our drain landed:
    // drained again, never verified in that state.
    let mut v = Attempt {
        prestop_down: true,
        ..attempt_in(Phase::Verifying)
    };
    v.retry = Retry::default();
    let fresh = |slurm| Observations {
        new_pod: NewPodCheck::Fresh,
        ..obs(slurm, Some(NEW))
    };
    let undrained = op(&["DOWN"], OPERATOR_PRESTOP_REASON);
    let (c, actions) = step(&v, &fresh(undrained), t0(), &cfg);
    assert_eq!(c.phase, Phase::Verifying);
    assert_eq!(writes(&actions), vec![W::Hold]);
    let uncordoned = op(&["IDLE"], "");
    let (c, actions) = step(&v, &fresh(uncordoned), t0(), &cfg);
    assert_eq!(
        c.phase,
        Phase::Verifying,
        "an open node is held again, not verified"
    );
    assert_eq!(writes(&actions), vec![W::Hold]);
    // Ours again, DOWN from the hook but slurmd answering: verified, and
    // released with a RESUME (which clears the hook's DOWN too).
    let held = SlurmObservation::Node(node(&["DOWN", "DRAIN"], &v.drain_reason));
    let (d, actions) = step(&v, &fresh(held.clone()), t0(), &cfg);
    assert_eq!(d.phase, Phase::Undraining, "{d:?}");
    assert!(
        actions.iter().any(|x| matches!(x, Action::ResumeNode { owned_reason, .. } if *owned_reason == v.drain_reason)),
        "{actions:?}"
    );
    assert_eq!(writes(&actions), vec![W::Resume], "no UNDRAIN: {actions:?}");
    // Not answering: no verification, DOWN or not.
    let dead = SlurmObservation::Node(node(&["DOWN", "DRAIN", "NOT_RESPONDING"], &v.drain_reason));
    let (e, _) = step(&v, &fresh(dead), t0(), &cfg);
    assert_eq!(e.phase, Phase::Verifying);
    // Without the hook, a DOWN that ReturnToService 0/1 keeps once slurmd
    // answers again passes too, and is resumed: the hold is ours.
    let plain_v = attempt_in(Phase::Verifying);
    let (f, actions) = step(&plain_v, &fresh(held), t0(), &cfg);
    assert_eq!(f.phase, Phase::Undraining);
    assert_eq!(writes(&actions), vec![W::Resume]);
    // Someone else's FAIL is not ours to verify through.
    let their_fail = SlurmObservation::Node(node(&["IDLE", "FAIL"], "admin: flaky NIC"));
    let (f, _) = step(&plain_v, &fresh(their_fail), t0(), &cfg);
    assert_ne!(f.phase, Phase::Undraining);
    // An administrator's reason after the eviction is theirs: left alone.
    let (g, actions) = step(
        &a,
        &obs(op(&["IDLE", "DRAIN"], "admin: replace DIMM"), None),
        t0(),
        &cfg,
    );
    assert!(
        !g.prestop_down && writes(&actions).is_empty(),
        "{actions:?}"
    );
}

#[test]
fn grouped_attempts_wait_for_every_member_to_drain_and_cordon_first() {
    let cfg = MachineConfig::default();
    let a = Attempt {
        group: Some("g1".into()),
        ..attempt_in(Phase::Drained)
    };
    let (b, actions) = step(&a, &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)), t0(), &cfg);
    assert_eq!(b.phase, Phase::Drained);
    assert!(writes(&actions).is_empty());
    let drained = |cordon| Observations {
        group_drained: true,
        cordon,
        ..obs(ours(&["IDLE", "DRAIN"]), Some(OLD))
    };
    // Not read: wait.
    let (c, actions) = step(&a, &drained(NodeCordon::NotRead), t0(), &cfg);
    assert_eq!((c.phase, writes(&actions)), (Phase::Drained, vec![]));
    // Schedulable: persist the request, then cordon; no eviction yet.
    let (c, actions) = step(&a, &drained(NodeCordon::Free), t0(), &cfg);
    assert_eq!(c.phase, Phase::Drained);
    assert!(c.cordon_requested && c.is_open());
    assert_eq!(writes(&actions), vec![W::Cordon]);
    assert_eq!(
        actions.first(),
        Some(&Action::Persist),
        "persisted before the write"
    );
    // The cordon did not show (the write was lost): asked again once the
    // write settled, not before.
    let (c2, actions) = step(&c, &drained(NodeCordon::Free), t0(), &cfg);
    assert_eq!((c2.phase, writes(&actions)), (Phase::Drained, vec![]));
    let settled = c.retry.not_before.expect("write settle");
    let (_, actions) = step(&c, &drained(NodeCordon::Free), settled, &cfg);
    assert_eq!(writes(&actions), vec![W::Cordon]);
    // Our cordon shows: the FAIL hold, then evict.
    let (d, actions) = step(&c, &drained(NodeCordon::Ours), settled, &cfg);
    assert_eq!((d.phase, writes(&actions)), (Phase::Drained, vec![W::Hold]));
    let failed = |cordon| Observations {
        group_drained: true,
        cordon,
        ..obs(ours(&["IDLE", "FAIL"]), Some(OLD))
    };
    let (d, actions) = step(&c, &failed(NodeCordon::Ours), t0(), &cfg);
    assert_eq!(d.phase, Phase::Evicting);
    assert_eq!(writes(&actions), vec![W::Evict]);
    // Someone else's cordon holds replacements back as well, and is never ours.
    let (e, actions) = step(&a, &drained(NodeCordon::Foreign), t0(), &cfg);
    assert!(e.cordon_requested && e.cordon_released && !e.cordon_pending());
    assert!(writes(&actions).is_empty());
    let (f, actions) = step(&e, &failed(NodeCordon::Foreign), t0(), &cfg);
    assert_eq!(f.phase, Phase::Evicting);
    assert_eq!(writes(&actions), vec![W::Evict]);
}

#[test]
fn the_group_cordon_is_lifted_once_every_old_member_is_gone_or_on_failure() {
    let cfg = MachineConfig::default();
    let a = Attempt {
        group: Some("g1".into()),
        cordon_requested: true,
        evicted_at: Some(t0()),
        ..attempt_in(Phase::AwaitingReplacement)
    };
    let waiting = |cordon, gone| Observations {
        cordon,
        group_old_gone: gone,
        ..obs(ours(&["DOWN", "DRAIN"]), None)
    };
    // An old member is still there: keep the cordon.
    let (b, actions) = step(&a, &waiting(NodeCordon::Ours, false), t0(), &cfg);
    assert!(b.cordon_pending() && writes(&actions).is_empty());
    // All gone: uncordon (ours only), then notice it is gone.
    let (b, actions) = step(&a, &waiting(NodeCordon::Ours, true), t0(), &cfg);
    assert_eq!(writes(&actions), vec![W::Uncordon]);
    let (c, actions) = step(&b, &waiting(NodeCordon::Free, true), t0(), &cfg);
    assert!(!c.cordon_pending());
    assert_eq!(actions, vec![Action::Persist]);
    // Then the replacement is awaited as usual.
    let (d, _) = step(&c, &waiting(NodeCordon::Free, true), t0(), &cfg);
    assert_eq!(d.phase, Phase::AwaitingReplacement);
    let (d, _) = step(
        &c,
        &Observations {
            pod_uid: Some(NEW.into()),
            ..waiting(NodeCordon::Free, true)
        },
        t0(),
        &cfg,
    );
    assert_eq!(d.phase, Phase::Verifying);
    // A failure while our cordon holds releases it, and the attempt stays
    // open until it is gone.
    let (f, actions) = step(
        &a,
        &waiting(NodeCordon::Ours, false),
        t0() + SignedDuration::from_hours(1),
        &cfg,
    );
    assert_eq!(f.phase, Phase::Failed(FailReason::ReplacementTimeout));
    assert!(writes(&actions).contains(&W::Uncordon), "{actions:?}");
    assert!(f.is_open());
    let (g, _) = step(
        &f,
        &waiting(NodeCordon::Free, false),
        t0() + SignedDuration::from_hours(2),
        &cfg,
    );
    assert!(!g.cordon_pending());
    assert!(g.kept_drained, "the pod was evicted: the drain is kept");
}

#[test]
fn the_record_round_trips_and_keeps_open_attempts() {
    let mut all = vec![];
    for i in 0..8 {
        let mut a = attempt_in(Phase::Succeeded);
        a.id = format!("done{i}");
        a.phase_since = t0() + SignedDuration::from_mins(i);
        all.push(a);
    }
    let kept = Attempt {
        id: "kept".into(),
        kept_drained: true,
        ..attempt_in(Phase::Failed(FailReason::ReplacementStale))
    };
    all.push(kept.clone());
    all.push(attempt_in(Phase::Verifying));
    let r = AttemptsRecord::from_attempts(&all);
    assert_eq!(r.attempts.len(), 2 + AttemptsRecord::KEEP_CLOSED);
    assert_eq!(r.attempts[0], kept);
    assert_eq!(r.attempts[2].id, "done7", "newest closed first");
    let json = r.to_json();
    assert_eq!(AttemptsRecord::parse(&json).expect("parses"), r);
    assert!(json.contains("\"phase\":{\"Failed\":\"ReplacementStale\"}"));
    let err = AttemptsRecord::parse("{\"version\":2,\"attempts\":[]}").expect_err("version");
    assert!(err.to_string().contains("unsupported version 2"));
    let err = AttemptsRecord::parse("not json").expect_err("bad");
    assert!(err.to_string().contains("remove the annotation"));
}

#[test]
fn a_drain_set_before_mountguard_acted_is_handed_back_exactly() {
    let cfg = MachineConfig::default();
    let theirs = node(&["IDLE", "DRAIN"], "admin: replace DIMM");
    let theirs = SlurmNodeState {
        reason_set_by_user: "root".into(),
        ..theirs
    };
    // Pending: recorded (persisted before our drain replaces its reason).
    let (b, actions) = step(
        &attempt(),
        &obs(SlurmObservation::Node(theirs.clone()), Some(OLD)),
        t0(),
        &cfg,
    );
    let prior = b.prior_drain.clone().expect("recorded");
    assert_eq!(
        (
            prior.reason.as_str(),
            prior.set_by.as_str(),
            prior.state.as_str(),
            prior.down
        ),
        ("admin: replace DIMM", "root", "DRAIN", false)
    );
    assert_eq!(writes(&actions), vec![W::Drain]);
    let persist = actions.iter().position(|x| *x == Action::Persist);
    let drain = actions
        .iter()
        .position(|x| matches!(x, Action::DrainNode { .. }));
    assert!(persist < drain, "{actions:?}");
    // Slurm's own "Not responding" and an empty reason are nobody's drain.
    for n in [
        node(&["DOWN", "NOT_RESPONDING"], SLURM_NOT_RESPONDING),
        node(&["IDLE"], ""),
    ] {
        let (c, _) = step(
            &attempt(),
            &obs(SlurmObservation::Node(n), Some(OLD)),
            t0(),
            &cfg,
        );
        assert_eq!(c.prior_drain, None);
    }
    // An administrator's DOWN comes back as a drain with their reason.
    let down = node(&["DOWN"], "admin: PSU");
    assert_eq!(
        PriorDrain::of(&down).map(|p| (p.state, p.down)),
        Some(("DRAIN".to_string(), true))
    );
    // At the release: their drain is written back instead of a RESUME or
    // an UNDRAIN, even over the preStop hook's DOWN.
    let u = Attempt {
        prior_drain: Some(prior.clone()),
        ..attempt_in(Phase::Undraining)
    };
    let (c, actions) = step(&u, &obs(ours(&["DOWN", "FAIL"]), Some(NEW)), t0(), &cfg);
    assert_eq!(c.phase, Phase::Undraining);
    assert_eq!(writes(&actions), vec![W::Restore]);
    assert!(actions.iter().any(|x| matches!(x,
        Action::RestoreDrain { owned_reason, prior: p, .. } if *owned_reason == u.drain_reason && *p == prior)));
    // A transient error restores nothing and releases nothing.
    let (c, actions) = step(&u, &obs(transient(), Some(NEW)), t0(), &cfg);
    assert_eq!((c.phase, writes(&actions)), (Phase::Undraining, vec![]));
    // Theirs again: done, handed back.
    let back = SlurmObservation::Node(node(&["DOWN", "DRAIN"], "admin: replace DIMM"));
    let (d, actions) = step(&u, &obs(back, Some(NEW)), t0(), &cfg);
    assert_eq!(d.phase, Phase::Succeeded);
    assert!(writes(&actions).is_empty());
    assert!(
        actions.iter().any(|x| matches!(x, Action::Event { reason: E::RemediationSucceeded, message } if message.contains("handed back"))),
        "{actions:?}"
    );
    // A failure hands it back too, whatever the policy: never an undrain.
    for policy in [
        FailurePolicy::Auto,
        FailurePolicy::KeepDrained,
        FailurePolicy::Undrain,
    ] {
        let cfg = MachineConfig {
            on_failure: policy,
            ..Default::default()
        };
        let w = Attempt {
            prior_drain: Some(prior.clone()),
            ..attempt_in(Phase::AwaitingReplacement)
        };
        let (f, actions) = step(
            &w,
            &obs(ours(&["DOWN", "FAIL"]), None),
            t0() + SignedDuration::from_mins(16),
            &cfg,
        );
        assert_eq!(f.phase, Phase::Failed(F::ReplacementTimeout), "{policy:?}");
        assert!(f.release_pending && !f.kept_drained, "{policy:?}");
        assert_eq!(writes(&actions), vec![W::Restore], "{policy:?}");
    }
}

#[test]
fn the_fail_hold_outlasts_the_operator_and_return_to_service_until_the_verification() {
    use crate::remediation::OPERATOR_PRESTOP_REASON;
    let cfg = one_read();
    // Drained, no jobs: the hold is requested (persisted first), once per
    // write settle, and only then is the pod evicted.
    let a = attempt_in(Phase::Drained);
    let (b, actions) = step(&a, &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)), t0(), &cfg);
    assert!(b.hold_requested);
    assert_eq!(actions.first(), Some(&Action::Persist));
    assert_eq!(writes(&actions), vec![W::Hold]);
    let (_, actions) = step(&b, &obs(ours(&["IDLE", "DRAIN"]), Some(OLD)), t0(), &cfg);
    assert!(
        writes(&actions).is_empty(),
        "not again before the write settles"
    );
    // Slurm unreadable: no hold, no eviction.
    let (c, actions) = step(
        &b,
        &obs(transient(), Some(OLD)),
        t0() + cfg.write_settle,
        &cfg,
    );
    assert_eq!((c.phase, writes(&actions)), (Phase::Drained, vec![]));
    // The hook replaced our reason and set DOWN; syncCordon's undrain does
    // nothing to a FAIL; a registration under ReturnToService=2 cleared the
    // DOWN: FAIL is still there, and mountguard puts its reason back.
    let w = attempt_in(Phase::AwaitingReplacement);
    for state in [&["DOWN", "FAIL"][..], &["IDLE", "FAIL"][..]] {
        let hooked = SlurmObservation::Node(node(state, OPERATOR_PRESTOP_REASON));
        let (d, actions) = step(&w, &obs(hooked, None), t0(), &cfg);
        assert_eq!(writes(&actions), vec![W::Hold], "{state:?}");
        assert!(
            actions
                .iter()
                .any(|x| matches!(x, Action::HoldNode { reason, .. } if *reason == w.drain_reason))
        );
        assert_eq!(d.prestop_down, state[0] == "DOWN");
    }
    // Verified only once the reason is ours again.
    let v = attempt_in(Phase::Verifying);
    let fresh = |slurm| Observations {
        new_pod: NewPodCheck::Fresh,
        ..obs(slurm, Some(NEW))
    };
    let hooked = SlurmObservation::Node(node(&["IDLE", "FAIL"], OPERATOR_PRESTOP_REASON));
    let (e, _) = step(&v, &fresh(hooked), t0(), &cfg);
    assert_eq!(e.phase, Phase::Verifying);
    let (e, actions) = step(&v, &fresh(ours(&["IDLE", "FAIL"])), t0(), &cfg);
    assert_eq!(e.phase, Phase::Undraining);
    assert_eq!(writes(&actions), vec![W::Resume]);
}

mod absent;
mod hold;
mod verification;
mod workload;
