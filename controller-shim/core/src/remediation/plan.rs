//! Selection: which NodeSet and workload pods qualify for remediation now,
//! within which budgets, and which are blocked (pinned immutable cache).
//! Pure.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::machine::{Attempt, EventReason, FailReason, Finding, Phase, attempt_id};
use super::workload::{WorkloadInfo, WorkloadKind, WorkloadRef};
use crate::verdict::{FrozenCause, StaleCause, State, SubjectKey};

/// Global remediation mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Nothing.
    #[default]
    Off,
    /// Everything but the writes: say what would be done.
    DryRun,
    /// Remediate.
    On,
}

/// Selection configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanConfig {
    /// Global mode.
    pub mode: Mode,
    /// A verdict must hold this long before it qualifies.
    pub delay: SignedDuration,
    /// Open attempts per NodeSet (also bounded by the NodeSet's own
    /// `maxUnavailable`).
    pub budget_per_nodeset: u32,
    /// Open attempts cluster-wide.
    pub budget_cluster: u32,
    /// Replace pinning pods together when every one is itself a remediable
    /// NodeSet pod.
    pub replace_pinning_pods: bool,
    /// The workload kinds whose opted-in pods may be remediated (none by
    /// default).
    pub workload_kinds: BTreeSet<WorkloadKind>,
    /// Open attempts on workload pods cluster-wide (apart from the NodeSet
    /// budget: an eviction is not a drain that can last for hours).
    pub budget_workloads: u32,
}

impl Default for PlanConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Off,
            delay: SignedDuration::from_mins(5),
            budget_per_nodeset: 1,
            budget_cluster: 3,
            replace_pinning_pods: false,
            workload_kinds: BTreeSet::new(),
            budget_workloads: 3,
        }
    }
}

/// A NodeSet as the planner needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeSetInfo {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// `mountguard.io/remediate: "true"`.
    pub opt_in: bool,
    /// `mountguard.io/remediate-on`, raw.
    pub remediate_on: Option<String>,
    /// The NodeSet's `maxUnavailable`, resolved to a pod count.
    pub max_unavailable: u32,
    /// Pods of the NodeSet unavailable for other reasons (not ready and not
    /// part of an open attempt).
    pub unavailable: u32,
}

/// One non-Fresh verdict of a candidate pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateFinding {
    /// Subject, e.g. `volume slurm-etc`.
    pub subject: SubjectKey,
    /// Verdict.
    pub state: State,
    /// Since when it holds.
    pub since: Timestamp,
    /// Fingerprint of the mounted content (display form).
    pub mounted: String,
    /// Fingerprint of the current content.
    pub current: String,
    /// Pods pinning an immutable cache entry (same namespace).
    pub pinned_by: Vec<String>,
}

/// A pod with its non-Fresh, non-Skipped verdicts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Candidate {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Kubernetes node.
    pub node: Option<String>,
    /// Controlling NodeSet.
    pub nodeset: Option<String>,
    /// The workload the pod belongs to (Deployment, ReplicaSet,
    /// StatefulSet, DaemonSet).
    pub workload: Option<WorkloadRef>,
    /// `nodeset.slinky.slurm.net/pod-hostname`.
    pub slurm_node: Option<String>,
    /// Succeeded/Failed phase.
    pub terminated: bool,
    /// Non-Fresh verdicts.
    pub findings: Vec<CandidateFinding>,
}

/// A message for a pod (Event + log + metric).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Namespace.
    pub namespace: String,
    /// Pod.
    pub pod: String,
    /// Pod UID (notices are emitted once per UID and message).
    pub uid: String,
    /// NodeSet (empty for a workload's pod).
    pub nodeset: String,
    /// The workload, for a workload's pod.
    pub workload: Option<WorkloadRef>,
    /// Event reason.
    pub reason: EventReason,
    /// Message.
    pub message: String,
    /// Pinning pods (KubeletCachePinned).
    pub pinned_by: Vec<String>,
}

/// The planner's output.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Attempts to start (Pending).
    pub start: Vec<Attempt>,
    /// Dry-run: what would be started.
    pub dry_run: Vec<Notice>,
    /// Pods that qualify but cannot be helped by replacing them alone.
    pub blocked: Vec<Notice>,
    /// Pods with a qualifying verdict that wait (delay, budget, unsafe
    /// verdicts), with why.
    pub waiting: Vec<(String, String)>,
}

/// The default qualifying verdicts.
pub fn default_qualifying() -> Vec<State> {
    vec![
        State::Stale(StaleCause::ImmutableCache),
        State::Stale(StaleCause::Unknown),
        State::Frozen(FrozenCause::ReadAtStart),
    ]
}

/// Parses `mountguard.io/remediate-on`: comma separated `Stale`,
/// `Stale/ImmutableCache`, `Stale/Unknown`, `Frozen` (all three causes),
/// `Frozen/ReadAtStart`, `Frozen/SubPath`, `Frozen/Env`.
pub fn parse_remediate_on(s: &str) -> Result<Vec<State>, String> {
    let mut out = Vec::new();
    for t in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        match t {
            "Stale" => out.extend([
                State::Stale(StaleCause::ImmutableCache),
                State::Stale(StaleCause::Unknown),
            ]),
            "Frozen" => out.extend([
                State::Frozen(FrozenCause::ReadAtStart),
                State::Frozen(FrozenCause::SubPath),
                State::Frozen(FrozenCause::Env),
            ]),
            "Stale/ImmutableCache"
            | "Stale/Unknown"
            | "Frozen/ReadAtStart"
            | "Frozen/SubPath"
            | "Frozen/Env" => out.push(t.parse::<State>()?),
            other => {
                return Err(format!(
                    "{}: {other:?} cannot qualify; use Stale, Stale/ImmutableCache, Stale/Unknown, Frozen, Frozen/ReadAtStart, Frozen/SubPath or Frozen/Env",
                    super::REMEDIATE_ON_ANNOTATION
                ));
            }
        }
    }
    if out.is_empty() {
        return Err(format!("{} is empty", super::REMEDIATE_ON_ANNOTATION));
    }
    Ok(out)
}

/// Verdicts that make a pod unsafe to judge: never remediate while one holds.
fn unsafe_state(s: State) -> bool {
    matches!(
        s,
        State::Unverifiable(_)
            | State::Propagating
            | State::SourceMissing
            | State::Stale(StaleCause::KubeletNotSyncing)
    )
}

struct Ctx<'a> {
    nodesets: HashMap<(&'a str, &'a str), &'a NodeSetInfo>,
    workloads: HashMap<(&'a str, &'a WorkloadRef), &'a WorkloadInfo>,
    open_per_nodeset: HashMap<(String, String), u32>,
    open_per_workload: HashMap<(String, WorkloadRef), u32>,
    /// Open NodeSet attempts.
    open_total: u32,
    open_workloads: u32,
    /// Replacements that failed their verification (workload pods): never
    /// evicted again, with the attempt that says why.
    failed_replacements: HashMap<String, String>,
    busy_pods: HashSet<(String, String)>,
    seen_uids: HashSet<String>,
}

/// Which candidates start an attempt now. `attempts` are every known
/// attempt (open and recent closed ones) of every NodeSet and workload.
pub fn plan(
    candidates: &[Candidate],
    nodesets: &[NodeSetInfo],
    workloads: &[WorkloadInfo],
    attempts: &[Attempt],
    now: Timestamp,
    cfg: &PlanConfig,
) -> Plan {
    let mut out = Plan::default();
    if cfg.mode == Mode::Off {
        return out;
    }
    let mut ctx = Ctx {
        nodesets: nodesets
            .iter()
            .map(|n| ((n.namespace.as_str(), n.name.as_str()), n))
            .collect(),
        workloads: workloads
            .iter()
            .map(|w| ((w.namespace.as_str(), &w.workload), w))
            .collect(),
        open_per_nodeset: HashMap::new(),
        open_per_workload: HashMap::new(),
        open_total: 0,
        open_workloads: 0,
        failed_replacements: attempts
            .iter()
            .filter(|a| {
                a.workload.is_some()
                    && matches!(
                        a.phase,
                        Phase::Failed(
                            FailReason::ReplacementStale | FailReason::VerificationTimeout
                        )
                    )
            })
            .filter_map(|a| Some((a.new_pod_uid.clone()?, a.id.clone())))
            .collect(),
        busy_pods: HashSet::new(),
        seen_uids: attempts.iter().map(|a| a.pod_uid.clone()).collect(),
    };
    for a in attempts.iter().filter(|a| a.is_open()) {
        match &a.workload {
            Some(w) => {
                *ctx.open_per_workload
                    .entry((a.namespace.clone(), w.clone()))
                    .or_default() += 1;
                ctx.open_workloads += 1;
            }
            None => {
                *ctx.open_per_nodeset
                    .entry((a.namespace.clone(), a.nodeset.clone()))
                    .or_default() += 1;
                ctx.open_total += 1;
            }
        }
        ctx.busy_pods.insert((a.namespace.clone(), a.pod.clone()));
        if let Some(uid) = &a.new_pod_uid {
            ctx.busy_pods
                .insert((a.namespace.clone(), a.new_pod().to_string()));
            ctx.seen_uids.insert(uid.clone());
        }
    }
    // Whole-node staleness is a kubelet problem: alert, never remediate.
    let not_syncing: BTreeSet<&str> = candidates
        .iter()
        .filter(|c| {
            c.findings
                .iter()
                .any(|f| f.state == State::Stale(StaleCause::KubeletNotSyncing))
        })
        .filter_map(|c| c.node.as_deref())
        .collect();
    let by_name: BTreeMap<(&str, &str), &Candidate> = candidates
        .iter()
        .map(|c| ((c.namespace.as_str(), c.name.as_str()), c))
        .collect();

    // Oldest qualifying verdict first.
    let mut order: Vec<&Candidate> = candidates.iter().collect();
    order.sort_by_key(|c| {
        (
            c.findings.iter().map(|f| f.since).min(),
            c.namespace.clone(),
            c.name.clone(),
        )
    });
    let mut planned: HashSet<(String, String)> = HashSet::new();
    for c in order {
        if planned.contains(&(c.namespace.clone(), c.name.clone())) {
            continue;
        }
        let Some(sel) = select(c, &ctx, &not_syncing, now, cfg) else {
            continue;
        };
        let sel = match sel {
            Selected::Wait(why) => {
                out.waiting
                    .push((format!("{}/{}", c.namespace, c.name), why));
                continue;
            }
            Selected::Go(f) => vec![(c, f)],
            Selected::Pinned(pinned_by) => {
                // Only NodeSet pods are replaced together.
                let group = (cfg.replace_pinning_pods && c.workload.is_none())
                    .then(|| pinning_group(c, &pinned_by, &by_name, &ctx, &not_syncing, now, cfg))
                    .flatten();
                match group {
                    Some(g) => g,
                    None => {
                        out.blocked.push(pinned_notice(c, &pinned_by, cfg));
                        continue;
                    }
                }
            }
        };
        if let Some(w) = &c.workload {
            let findings = sel.into_iter().flat_map(|(_, f)| f).collect();
            start_workload_attempt(c, w, findings, &mut ctx, &mut out, now, cfg);
            continue;
        }
        // Budgets (a group needs a slot per member, in each NodeSet).
        let mut need: BTreeMap<(String, String), u32> = BTreeMap::new();
        for (m, _) in &sel {
            let ns = m.nodeset.clone().unwrap_or_default();
            *need.entry((m.namespace.clone(), ns)).or_default() += 1;
        }
        let total: u32 = need.values().sum();
        let mut why = None;
        if ctx.open_total + total > cfg.budget_cluster {
            why = Some(format!(
                "cluster budget: {} of {} attempts open",
                ctx.open_total, cfg.budget_cluster
            ));
        }
        for ((ns, set), n) in &need {
            let info = ctx.nodesets[&(ns.as_str(), set.as_str())];
            let limit = cfg.budget_per_nodeset.min(info.max_unavailable);
            let used = ctx
                .open_per_nodeset
                .get(&(ns.clone(), set.clone()))
                .copied()
                .unwrap_or(0)
                + info.unavailable;
            if used + n > limit {
                why = Some(format!(
                    "NodeSet {ns}/{set} budget: {used} unavailable or in remediation, limit {limit} (budget {}, maxUnavailable {})",
                    cfg.budget_per_nodeset, info.max_unavailable
                ));
            }
        }
        if let Some(why) = why {
            out.waiting
                .push((format!("{}/{}", c.namespace, c.name), why));
            continue;
        }
        for ((ns, set), n) in need {
            *ctx.open_per_nodeset.entry((ns, set)).or_default() += n;
        }
        ctx.open_total += total;
        let group = (sel.len() > 1).then(|| attempt_id(&c.uid, now));
        for (m, findings) in sel {
            planned.insert((m.namespace.clone(), m.name.clone()));
            ctx.busy_pods.insert((m.namespace.clone(), m.name.clone()));
            let nodeset = m.nodeset.clone().unwrap_or_default();
            let mut a = Attempt::new(
                attempt_id(&m.uid, now),
                &m.namespace,
                &nodeset,
                &m.name,
                &m.uid,
                m.node.as_deref().unwrap_or_default(),
                m.slurm_node.as_deref().unwrap_or_default(),
                findings,
                now,
            );
            a.group = group.clone();
            if cfg.mode == Mode::DryRun {
                let together = match &a.group {
                    Some(_) => " together with the pods pinning the cache".to_string(),
                    None => String::new(),
                };
                out.dry_run.push(Notice {
                    namespace: a.namespace.clone(),
                    pod: a.pod.clone(),
                    uid: a.pod_uid.clone(),
                    nodeset: a.nodeset.clone(),
                    workload: None,
                    reason: EventReason::RemediationDryRun,
                    message: format!(
                        "dry-run: would drain Slurm node {} with reason {:?}, wait for its jobs, evict {}/{}{together}, verify the replacement and undrain",
                        a.slurm_node, a.drain_reason, a.namespace, a.pod
                    ),
                    pinned_by: Vec::new(),
                });
            } else {
                out.start.push(a);
            }
        }
    }
    out
}

/// Starts (or, in dry-run, describes) the attempt on a workload's pod
/// `c`, within the workload's budgets and only while the workload is fully
/// available (unless its annotation allows otherwise).
fn start_workload_attempt(
    c: &Candidate,
    w: &WorkloadRef,
    findings: Vec<Finding>,
    ctx: &mut Ctx<'_>,
    out: &mut Plan,
    now: Timestamp,
    cfg: &PlanConfig,
) {
    let label = format!("{}/{}", c.namespace, c.name);
    let Some(info) = ctx.workloads.get(&(c.namespace.as_str(), w)).copied() else {
        return;
    };
    let limit = match &info.max_in_flight {
        Ok(n) => *n,
        Err(e) => {
            out.waiting.push((label, e.clone()));
            return;
        }
    };
    let key = (c.namespace.clone(), w.clone());
    let used = ctx.open_per_workload.get(&key).copied().unwrap_or(0);
    let why = if ctx.open_workloads + 1 > cfg.budget_workloads {
        Some(format!(
            "workload budget: {} of {} attempts open",
            ctx.open_workloads, cfg.budget_workloads
        ))
    } else if used + 1 > limit {
        Some(format!(
            "{w} budget: {used} attempts open, limit {limit} ({})",
            super::workload::MAX_IN_FLIGHT_ANNOTATION
        ))
    } else if let (Some(na), false) = (&info.not_available, info.when_unavailable) {
        Some(format!(
            "{w} is not fully available ({na}); {}: \"true\" allows remediation anyway",
            super::workload::WHEN_UNAVAILABLE_ANNOTATION
        ))
    } else {
        None
    };
    if let Some(why) = why {
        out.waiting.push((label, why));
        return;
    }
    *ctx.open_per_workload.entry(key).or_default() += 1;
    ctx.open_workloads += 1;
    ctx.busy_pods.insert((c.namespace.clone(), c.name.clone()));
    let a = Attempt::for_workload(
        attempt_id(&c.uid, now),
        &c.namespace,
        w.clone(),
        &c.name,
        &c.uid,
        c.node.as_deref().unwrap_or_default(),
        findings,
        now,
    );
    if cfg.mode == Mode::DryRun {
        out.dry_run.push(Notice {
            namespace: a.namespace.clone(),
            pod: a.pod.clone(),
            uid: a.pod_uid.clone(),
            nodeset: String::new(),
            workload: Some(w.clone()),
            reason: EventReason::RemediationDryRun,
            message: format!(
                "dry-run: would evict {label} ({w}) through the Eviction API, wait for its replacement and verify it fresh on the node it lands on"
            ),
            pinned_by: Vec::new(),
        });
    } else {
        out.start.push(a);
    }
}

enum Selected {
    Wait(String),
    Go(Vec<Finding>),
    Pinned(Vec<String>),
}

fn finding(f: &CandidateFinding) -> Finding {
    Finding {
        subject: f.subject.clone(),
        state: f.state.tag(),
        mounted: f.mounted.clone(),
        current: f.current.clone(),
    }
}

/// Decides for one pod; `None` = not a candidate at all (silently).
fn select(
    c: &Candidate,
    ctx: &Ctx<'_>,
    not_syncing: &BTreeSet<&str>,
    now: Timestamp,
    cfg: &PlanConfig,
) -> Option<Selected> {
    let remediate_on = match (&c.workload, c.nodeset.as_deref()) {
        (Some(w), _) => {
            if !cfg.workload_kinds.contains(&w.kind) {
                return None;
            }
            let info = ctx.workloads.get(&(c.namespace.as_str(), w))?;
            match &info.opt_in {
                Ok(true) => {}
                Ok(false) => return None,
                Err(e) => return Some(Selected::Wait(e.clone())),
            }
            info.remediate_on.as_deref()
        }
        (None, Some(set)) => {
            let info = ctx.nodesets.get(&(c.namespace.as_str(), set))?;
            if !info.opt_in {
                return None;
            }
            info.remediate_on.as_deref()
        }
        (None, None) => return None,
    };
    if c.terminated {
        return None;
    }
    if ctx
        .busy_pods
        .contains(&(c.namespace.clone(), c.name.clone()))
        || ctx.seen_uids.contains(&c.uid)
    {
        return None;
    }
    let qualifying = match remediate_on {
        None => default_qualifying(),
        Some(s) => match parse_remediate_on(s) {
            Ok(q) => q,
            Err(e) => return Some(Selected::Wait(e)),
        },
    };
    let held = |f: &CandidateFinding| now.duration_since(f.since) >= cfg.delay;
    let pinned: Vec<&CandidateFinding> = c
        .findings
        .iter()
        .filter(|f| f.state == State::Stale(StaleCause::ImmutableCachePinned))
        .collect();
    let go: Vec<Finding> = c
        .findings
        .iter()
        .filter(|f| qualifying.contains(&f.state) && held(f))
        .map(finding)
        .collect();
    if go.is_empty() && !pinned.iter().any(|f| held(f)) {
        return None;
    }
    let Some(node) = c.node.as_deref() else {
        return Some(Selected::Wait("not scheduled".into()));
    };
    if let Some(id) = ctx.failed_replacements.get(&c.uid) {
        return Some(Selected::Wait(format!(
            "the replacement of failed attempt {id} is not evicted again: see that attempt's failure"
        )));
    }
    if c.workload.is_none() && c.slurm_node.is_none() {
        return Some(Selected::Wait(format!(
            "no {} label",
            super::POD_HOSTNAME_LABEL
        )));
    }
    if not_syncing.contains(node) {
        return Some(Selected::Wait(format!(
            "the kubelet on node {node} is not syncing: alert, no remediation"
        )));
    }
    if let Some(f) = c.findings.iter().find(|f| unsafe_state(f.state)) {
        return Some(Selected::Wait(format!(
            "{} is {}: not judged safely now",
            f.subject,
            f.state.tag()
        )));
    }
    if let Some(f) = pinned.iter().find(|f| held(f)) {
        return Some(Selected::Pinned(f.pinned_by.clone()));
    }
    if !pinned.is_empty() {
        return Some(Selected::Wait("pinned verdict within the delay".into()));
    }
    Some(Selected::Go(go))
}

/// The pod and its pinning pods, when every pinning pod is a remediable
/// NodeSet pod (opted-in, qualifying or pinned itself, nothing unsafe).
fn pinning_group<'a>(
    c: &'a Candidate,
    pinned_by: &[String],
    by_name: &BTreeMap<(&str, &str), &'a Candidate>,
    ctx: &Ctx<'_>,
    not_syncing: &BTreeSet<&str>,
    now: Timestamp,
    cfg: &PlanConfig,
) -> Option<Vec<(&'a Candidate, Vec<Finding>)>> {
    let own = pinned_findings(c);
    let mut out = vec![(c, own)];
    for p in pinned_by {
        let m = by_name.get(&(c.namespace.as_str(), p.as_str()))?;
        if m.node != c.node || m.workload.is_some() {
            return None;
        }
        match select(m, ctx, not_syncing, now, cfg)? {
            Selected::Go(f) => out.push((m, f)),
            Selected::Pinned(_) => out.push((m, pinned_findings(m))),
            Selected::Wait(_) => return None,
        }
    }
    Some(out)
}

fn pinned_findings(c: &Candidate) -> Vec<Finding> {
    c.findings
        .iter()
        .filter(|f| {
            matches!(
                f.state,
                State::Stale(StaleCause::ImmutableCachePinned | StaleCause::ImmutableCache)
            )
        })
        .map(finding)
        .collect()
}

fn pinned_notice(c: &Candidate, pinned_by: &[String], cfg: &PlanConfig) -> Notice {
    let f = c
        .findings
        .iter()
        .find(|f| f.state == State::Stale(StaleCause::ImmutableCachePinned));
    let what = f.map_or(String::new(), |f| {
        format!(
            " {} (mounted {} vs current {})",
            f.subject, f.mounted, f.current
        )
    });
    let optional = if cfg.replace_pinning_pods || c.workload.is_some() {
        ""
    } else {
        "; or enable --replace-pinning-pods when the pinning pods are remediable NodeSet pods"
    };
    Notice {
        namespace: c.namespace.clone(),
        pod: c.name.clone(),
        uid: c.uid.clone(),
        nodeset: c.nodeset.clone().unwrap_or_default(),
        workload: c.workload.clone(),
        reason: EventReason::KubeletCachePinned,
        message: format!(
            "{}/{}{what}: the kubelet on node {} keeps serving its cached copy while pods {} reference the same immutable object; replacing this pod alone cannot help, so mountguard does not. Fix: recreate the object under a new name, replace the pinning pods, or restart the kubelet on that node{optional}",
            c.namespace,
            c.name,
            c.node.as_deref().unwrap_or("?"),
            pinned_by.join(", ")
        ),
        pinned_by: pinned_by.to_vec(),
    }
}

/// Gauges derived from the attempts.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Summary {
    /// Open attempts.
    pub open: usize,
    /// Age of the oldest open attempt (0 when none).
    pub oldest_open_age_seconds: f64,
    /// Slurm nodes with a drain mountguard requested and still holds or
    /// keeps.
    pub nodes_drained: usize,
    /// Failed attempts whose node is kept drained.
    pub failed_kept_drained: usize,
    /// Failed attempts (of every kind) that left a pod not fresh: the
    /// replacement, or the pod itself when it was never evicted, still has
    /// a non-Fresh verdict and no later attempt took it on. mountguard does
    /// not try that pod again, so nothing repairs it until an operator
    /// acts. By owner kind (`NodeSet`, `Deployment`, `ReplicaSet`,
    /// `StatefulSet`, `DaemonSet`); every kind is present, 0 when none.
    pub failed_unresolved: BTreeMap<&'static str, usize>,
}

/// The owner kinds of [`Summary::failed_unresolved`].
pub const OWNER_KINDS: [&str; 5] = [
    "NodeSet",
    "Deployment",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
];

/// The pod a failed attempt leaves behind: its replacement when one was
/// seen, otherwise the pod itself unless it was evicted.
fn left_behind(a: &Attempt) -> Option<&str> {
    match (&a.new_pod_uid, a.evicted_at) {
        (Some(uid), _) => Some(uid),
        (None, None) => Some(&a.pod_uid),
        (None, Some(_)) => None,
    }
}

/// Summarizes `attempts` at `now`; `candidates` are the pods as the
/// planner sees them (a pod with findings is not fresh).
pub fn summarize(attempts: &[Attempt], candidates: &[Candidate], now: Timestamp) -> Summary {
    use super::machine::Phase;
    let not_fresh: HashSet<&str> = candidates
        .iter()
        .filter(|c| !c.terminated && !c.findings.is_empty())
        .map(|c| c.uid.as_str())
        .collect();
    let mut failed_unresolved: BTreeMap<&'static str, usize> =
        OWNER_KINDS.iter().map(|k| (*k, 0)).collect();
    for a in attempts {
        if !matches!(a.phase, Phase::Failed(_)) {
            continue;
        }
        let Some(uid) = left_behind(a) else {
            continue;
        };
        let taken_on = attempts
            .iter()
            .any(|b| b.id != a.id && b.pod_uid == uid && b.started_at >= a.started_at);
        if taken_on || !not_fresh.contains(uid) {
            continue;
        }
        let kind = a.workload.as_ref().map_or("NodeSet", |w| w.kind.as_str());
        *failed_unresolved.entry(kind).or_default() += 1;
    }
    let open: Vec<&Attempt> = attempts.iter().filter(|a| a.is_open()).collect();
    let nodes: BTreeSet<&str> = open
        .iter()
        .filter(|a| {
            a.drain_requested
                && (matches!(
                    a.phase,
                    Phase::Draining
                        | Phase::Drained
                        | Phase::Evicting
                        | Phase::AwaitingReplacement
                        | Phase::Verifying
                        | Phase::Undraining
                ) || a.kept_drained
                    || a.release_pending)
        })
        .map(|a| a.slurm_node.as_str())
        .collect();
    Summary {
        open: open.len(),
        oldest_open_age_seconds: open
            .iter()
            .map(|a| now.duration_since(a.started_at).as_secs_f64())
            .fold(0.0, f64::max),
        nodes_drained: nodes.len(),
        failed_kept_drained: open
            .iter()
            .filter(|a| matches!(a.phase, Phase::Failed(_)) && a.kept_drained)
            .count(),
        failed_unresolved,
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod workload_tests;
