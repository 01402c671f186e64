//! The status API's read model and wire documents: what the evaluation
//! task publishes (verdicts, sources, unscheduled pods, deployments), what
//! remediation's executor publishes (attempts, the Slurm nodes of stale
//! workers) and what `GET /v1/verdicts` and `GET /v1/rollouts/..` answer
//! from it (the `status` command prints them: `query/status.rs`).
//!
//! The endpoint lists verdicts that need attention (not Fresh, not
//! Skipped) by default, every verdict with `?all=1`, filtered by
//! `namespace`, `node` and `state` (a state name like `Stale` or a tag like
//! `Stale/ImmutableCachePinned`). Fingerprints only, never digests or data.
//!
//! `GET /v1/rollouts/{secret|configmap|nodeset|deployment|replicaset|statefulset|daemonset|pod}/{namespace}/{name}`
//! returns the rollout gate's document ([`mountguard_core::rollout::RolloutDoc`]):
//! the source's current fingerprint and, per consumer, the source
//! fingerprints it was verified against on the node and the scan time.

use std::collections::BTreeMap;

use foldhash::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use mountguard_core::PodUid;
use mountguard_core::model::{PodModel, SourceRef};
use mountguard_core::remediation::slurm_view::{SlurmReads, SlurmSide, with_side};
use mountguard_core::remediation::workload::{WorkloadKind, WorkloadRef, workload_named};
use mountguard_core::rollout::{
    AttemptRef, ConsumerItem, RolloutDoc, SourceItem, Target, VerifiedSource,
};
use mountguard_core::table::{Keyed, KeyedTable};
use mountguard_core::verdict::present::PodCheck;
use mountguard_core::verdict::{PodVerdicts, State, Verdict};

/// The status API's read model, one handle: the evaluation and
/// remediation write it, the status API reads it. Cloned into each task
/// that needs it (`run.rs` makes one).
#[derive(Debug, Clone, Default)]
pub struct ReadModel(Arc<std::sync::RwLock<VerdictStore>>);

impl ReadModel {
    /// Locks the store for reading.
    pub fn read(&self) -> std::sync::LockResult<std::sync::RwLockReadGuard<'_, VerdictStore>> {
        self.0.read()
    }

    /// Locks the store for writing.
    pub fn write(&self) -> std::sync::LockResult<std::sync::RwLockWriteGuard<'_, VerdictStore>> {
        self.0.write()
    }
}

/// One evaluated pod as published: its verdicts and what they were
/// computed against, in one record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublishedPod {
    /// The pod's verdicts.
    pub pv: PodVerdicts,
    /// What they were computed against (`None`: not recorded).
    pub check: Option<PodCheck>,
}

impl Keyed for PublishedPod {
    type Key = PodUid;

    fn key(&self) -> &PodUid {
        &self.pv.pod.uid
    }
}

/// The published pods by UID: one dense table entry per pod (the verdicts,
/// the check and the UID in the pod model, which is the key: no second map
/// and no key stored beside the value).
#[derive(Debug, Default)]
pub struct PublishedPods(KeyedTable<PublishedPod>);

impl PublishedPods {
    /// The pod with this UID.
    pub fn get(&self, uid: &PodUid) -> Option<&PublishedPod> {
        self.0.get(uid)
    }

    /// Whether a pod with this UID is published.
    pub fn contains_key(&self, uid: &PodUid) -> bool {
        self.0.contains_key(uid)
    }

    /// Publishes `p`, replacing the pod with the same UID; returns that.
    pub fn insert(&mut self, p: PublishedPod) -> Option<PublishedPod> {
        self.0.insert(p)
    }

    /// Removes the pod with this UID; returns it.
    pub fn remove(&mut self, uid: &PodUid) -> Option<PublishedPod> {
        self.0.remove(uid)
    }

    /// Every published pod, in no order.
    pub fn values(&self) -> impl Iterator<Item = &PublishedPod> {
        self.0.iter()
    }

    /// The UIDs of every published pod, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &PodUid> {
        self.0.iter().map(|p| &p.pv.pod.uid)
    }

    /// Number of published pods.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none is published.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forgets every pod.
    pub fn clear(&mut self) {
        self.0.clear()
    }
}

/// By the UID's text.
impl std::ops::Index<&str> for PublishedPods {
    type Output = PublishedPod;
    fn index(&self, uid: &str) -> &PublishedPod {
        self.get(&PodUid::new(uid))
            .expect("no published pod with this UID")
    }
}

/// The published verdicts of every evaluated pod.
#[derive(Debug, Default)]
pub struct VerdictStore {
    /// Per pod UID: the verdicts and what they were computed against.
    pub pods: PublishedPods,
    /// Whether the controller evaluated at least once (acting and synced).
    pub evaluated: bool,
    /// Remediation attempts (open ones, then recent closed ones), as the
    /// executor last published them.
    pub attempts: Vec<AttemptItem>,
    /// Every source the controller sees, with its current fingerprint.
    pub sources: HashMap<SourceRef, SourceItem>,
    /// Per node with pods: whether its agent reports.
    pub reporting: HashMap<Arc<str>, bool>,
    /// Pods not scheduled yet (no node, so no verdicts), per UID.
    pub unscheduled: HashMap<PodUid, Arc<mountguard_core::PodModel>>,
    /// `(namespace, ReplicaSet)` -> the Deployment controlling it, from
    /// the watched ReplicaSets.
    pub deployments: HashMap<(String, String), String>,
    /// Whether ReplicaSets are watched (`--remediate-workloads` lists
    /// `deployment`): only then can a pod be told to be a Deployment's.
    pub replicasets_watched: bool,
    /// The last read of each Slurm node a stale worker's verdict shows, as
    /// remediation's executor keeps them (with slurmrestd configured).
    pub slurm: SlurmReads,
}

/// One remediation attempt as the status endpoint returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptItem {
    /// Attempt id (the end of the Slurm drain reason).
    pub id: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// NodeSet (empty for a workload's pod).
    pub nodeset: String,
    /// The workload, e.g. `Deployment web` (a workload's pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    /// The replacement pod, once found.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_pod: Option<String>,
    /// The node the replacement landed on (a workload's pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_pod_node: Option<String>,
    /// Kubernetes node.
    pub node: String,
    /// Slurm node.
    pub slurm_node: String,
    /// Current phase (`Failed` without its reason).
    pub phase: String,
    /// Phases gone through, in order.
    pub phases: Vec<String>,
    /// Still needs work or attention (not finished, or a drain kept or
    /// still to be released).
    pub open: bool,
    /// Failed and the Slurm node is kept drained on purpose.
    #[serde(default)]
    pub kept_drained: bool,
    /// Started at (RFC 3339).
    pub started_at: String,
    /// Current phase entered at (RFC 3339).
    pub since: String,
    /// Failure reason and detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
    /// Last transient error (retried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl AttemptItem {
    /// The item for one attempt.
    pub fn from_attempt(a: &mountguard_core::remediation::Attempt) -> Self {
        Self {
            id: a.id.clone(),
            namespace: a.namespace.clone(),
            pod: a.pod.clone(),
            nodeset: a.nodeset.clone(),
            workload: a.workload.as_ref().map(|w| w.to_string()),
            new_pod: a.new_pod_uid.as_ref().map(|_| a.new_pod().to_string()),
            new_pod_node: a.new_pod_node.clone(),
            node: a.node.clone(),
            slurm_node: a.slurm_node.clone(),
            phase: a.phase.name().to_string(),
            phases: a.phase_names().iter().map(|s| s.to_string()).collect(),
            open: a.is_open(),
            kept_drained: a.kept_drained,
            started_at: a.started_at.to_string(),
            since: a.phase_since.to_string(),
            failure: a.failure.clone(),
            last_error: a.retry.last_error.clone(),
        }
    }
}

/// One verdict as the status endpoint returns it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusItem {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Controlling NodeSet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodeset: Option<String>,
    /// `volume <name>`, `subPath <container>:<volume>/<subPath>` or
    /// `env <container>:<var>`.
    pub subject: String,
    /// State name.
    pub state: String,
    /// Cause or reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// `Kind/name` of each source.
    #[serde(default)]
    pub sources: Vec<String>,
    /// Fingerprint of the expected content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// Fingerprint of the mounted content.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<String>,
    /// Pods pinning an immutable cache entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_by: Vec<String>,
    /// Keyed fingerprint of each source's content the verdict was computed
    /// against (compare with the source's current one in
    /// `/v1/rollouts/...`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub source_content: Vec<VerifiedSource>,
    /// Scan time of the node inventory the verdict was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<String>,
    /// Paths that differ.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub differing_paths: Vec<String>,
    /// Since when in this state.
    pub since: String,
    /// Explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What to do, in one sentence (`mountguard_core::verdict::advice`),
    /// followed by `slurm.message` when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
    /// What Slurm shows of the worker's node, for a NodeSet pod whose
    /// verdict about its `slurm.key` is Stale or Frozen, with slurmrestd
    /// configured (`mountguard_core::remediation::slurm_view`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurm: Option<SlurmSide>,
}

/// The endpoint's document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDoc {
    /// Whether this replica acts (only the acting replica has verdicts).
    pub acting: bool,
    /// Whether the watches finished their initial lists.
    pub ready: bool,
    /// Count per `State` or `State/Cause` of every verdict in the
    /// `namespace` and on the `node` asked for (any state: `all` and
    /// `state` only select what is listed).
    pub by_state: BTreeMap<String, usize>,
    /// The selected verdicts.
    pub verdicts: Vec<StatusItem>,
    /// Remediation attempts (open first), filtered by `namespace` and
    /// `node`; empty when remediation is off.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptItem>,
}

/// Filters of the endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Query {
    /// Include Fresh and Skipped.
    pub all: bool,
    /// Namespace.
    pub namespace: Option<String>,
    /// Node.
    pub node: Option<String>,
    /// State name or tag.
    pub state: Option<String>,
}

impl Query {
    /// Parses a query string (`all=1&namespace=..&node=..&state=..`),
    /// `application/x-www-form-urlencoded` (percent escapes, `+` for a
    /// space; bytes that are not UTF-8 become U+FFFD).
    pub fn parse(q: Option<&str>) -> Self {
        let mut out = Self::default();
        for (k, v) in form_urlencoded::parse(q.unwrap_or("").as_bytes()) {
            let v = v.into_owned();
            match &*k {
                "all" => out.all = matches!(v.as_str(), "" | "1" | "true" | "yes"),
                "namespace" if !v.is_empty() => out.namespace = Some(v),
                "node" if !v.is_empty() => out.node = Some(v),
                "state" if !v.is_empty() => out.state = Some(v),
                _ => {}
            }
        }
        out
    }

    /// Whether the pod is in the namespace and on the node asked for:
    /// what `byState` counts (every state, so Fresh shows without
    /// `all=1`), and never more, since the reader may be authorized for
    /// that namespace only.
    fn in_scope(&self, pv: &PodVerdicts) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| **pv.pod.namespace() == *ns)
            && self
                .node
                .as_deref()
                .is_none_or(|n| pv.pod.node_name() == Some(n))
    }

    /// Whether a verdict of a pod [`Query::in_scope`] is listed.
    fn lists(&self, v: &Verdict) -> bool {
        if !self.all && self.state.is_none() && matches!(v.state, State::Fresh | State::Skipped(_))
        {
            return false;
        }
        if let Some(s) = &self.state
            && v.state.name() != s
            && v.state.tag() != *s
        {
            return false;
        }
        true
    }
}

/// The sources of verdict `v` with the fingerprints `check` recorded.
fn verified_sources(
    pv: &PodVerdicts,
    v: &Verdict,
    check: Option<&PodCheck>,
) -> Vec<VerifiedSource> {
    pv.sources(v)
        .iter()
        .map(|r| VerifiedSource {
            kind: r.kind.as_str().to_string(),
            name: r.name.to_string(),
            fingerprint: check
                .and_then(|c| c.source(&pv.pod, r))
                .flatten()
                .map(|fp| fp.to_string()),
        })
        .collect()
}

/// One verdict as a status item (`check`: what the pod's verdicts were
/// computed against, when known; `slurm`: what Slurm shows, when the
/// verdict shows it).
pub fn item(
    pv: &PodVerdicts,
    v: &Verdict,
    check: Option<&PodCheck>,
    slurm: Option<SlurmSide>,
) -> StatusItem {
    let view = v.view(pv);
    StatusItem {
        namespace: view.namespace.to_string(),
        pod: view.pod.to_string(),
        node: view.node.map(str::to_string),
        nodeset: view.nodeset.map(str::to_string),
        subject: pv.subject(v).text(),
        state: view.state.to_string(),
        cause: view.cause.map(str::to_string),
        sources: view
            .sources
            .iter()
            .map(|s| format!("{}/{}", s.kind, s.name))
            .collect(),
        expected: view.expected.map(|f| f.to_string()),
        observed: view.observed.map(|f| f.to_string()),
        pinned_by: view.pinned_by.iter().map(|s| s.to_string()).collect(),
        source_content: if check.is_some() {
            verified_sources(pv, v, check)
        } else {
            Vec::new()
        },
        verified_at: check
            .and_then(|c| c.scanned_at)
            .map(|t| t.get().to_string()),
        differing_paths: view.differing_paths.iter().map(|s| s.to_string()).collect(),
        since: view.since.to_string(),
        message: view.message.map(str::to_string),
        advice: with_side(view.advice, slurm.as_ref()),
        slurm,
    }
}

impl VerdictStore {
    /// When `r`'s current content appeared, as the evaluation published it
    /// (the engine's change time).
    fn changed_at(&self, r: &SourceRef) -> Option<jiff::Timestamp> {
        self.sources.get(r)?.changed_at.as_deref()?.parse().ok()
    }

    /// The document for `q`.
    pub fn document(&self, q: &Query, acting: bool, ready: bool) -> StatusDoc {
        let mut by_state = BTreeMap::new();
        let mut verdicts = Vec::new();
        for p in self.pods.values().filter(|p| q.in_scope(&p.pv)) {
            let pv = &p.pv;
            for v in pv.verdicts.iter() {
                *by_state.entry(v.state.tag()).or_insert(0) += 1;
                if q.lists(v) {
                    let slurm = self.slurm.side(pv, v, |r| self.changed_at(r));
                    verdicts.push(item(pv, v, p.check.as_ref(), slurm));
                }
            }
        }
        verdicts.sort_by(|a, b| {
            (&a.namespace, &a.pod, &a.subject).cmp(&(&b.namespace, &b.pod, &b.subject))
        });
        let mut attempts: Vec<AttemptItem> = self
            .attempts
            .iter()
            .filter(|a| q.namespace.as_deref().is_none_or(|n| n == a.namespace))
            .filter(|a| q.node.as_deref().is_none_or(|n| n == a.node))
            .cloned()
            .collect();
        attempts.sort_by(|a, b| (!a.open, &b.started_at).cmp(&(!b.open, &a.started_at)));
        StatusDoc {
            acting,
            ready,
            by_state,
            verdicts,
            attempts,
        }
    }
}

impl VerdictStore {
    /// Why `target` cannot be answered by this controller, if it cannot.
    pub fn unanswerable(&self, target: &Target) -> Option<String> {
        match target {
            Target::Workload {
                kind: WorkloadKind::Deployment,
                ..
            } if !self.replicasets_watched => Some(format!(
                "{target}: this controller does not watch ReplicaSets, so it cannot tell a \
                 Deployment's pods: run it with --remediate-workloads including deployment \
                 (chart: remediation.workloads.kinds; with --remediation dry-run nothing is \
                 written), or wait for the Deployment's current ReplicaSet \
                 (replicaset/NAMESPACE/NAME)\n"
            )),
            _ => None,
        }
    }

    /// The workload `pod` names: its StatefulSet, DaemonSet or
    /// ReplicaSet, or the Deployment controlling that ReplicaSet, by names
    /// (this view may run without the workload watches).
    fn workload_of(&self, pod: &PodModel) -> Option<WorkloadRef> {
        let c = pod.controller()?;
        Some(workload_named(c, |rs| {
            self.deployments
                .get(&(pod.namespace().to_string(), rs.to_string()))
                .cloned()
        }))
    }

    /// The rollout document of `target`.
    pub fn rollout(&self, target: &Target, acting: bool, ready: bool) -> RolloutDoc {
        let (ns, name) = target.namespaced_name();
        let wanted: Option<SourceRef> = match target {
            Target::Source { kind, .. } => {
                Some(SourceRef::new(*kind, Arc::from(ns), Arc::from(name)))
            }
            _ => None,
        };
        let mut consumers = Vec::new();
        let mut referenced: Vec<SourceRef> = wanted.iter().cloned().collect();
        let mut pods_in_ns: std::collections::HashSet<&str> = Default::default();
        let mut consumer_pods: std::collections::HashSet<&str> = Default::default();
        for p in self.pods.values() {
            let pv = &p.pv;
            let pod = &pv.pod;
            if **pod.namespace() != *ns {
                continue;
            }
            pods_in_ns.insert(&pod.name);
            if !target.selects(&pod.name, pod.nodeset(), || self.workload_of(pod)) {
                continue;
            }
            let check = p.check.as_ref();
            for v in pv.verdicts.iter() {
                let srcs = pv.sources(v);
                if let Some(w) = &wanted
                    && !srcs.contains(w)
                {
                    continue;
                }
                consumer_pods.insert(&pod.name);
                for r in &srcs {
                    if !referenced.contains(r) {
                        referenced.push(r.clone());
                    }
                }
                let sources = verified_sources(pv, v, check);
                consumers.push(ConsumerItem {
                    namespace: pod.namespace().to_string(),
                    pod: pod.name.to_string(),
                    node: pod.node_name().map(str::to_string),
                    nodeset: pod.nodeset().map(str::to_string),
                    subject: pv.subject(v).text(),
                    state: v.state.tag(),
                    sources,
                    verified_at: check
                        .and_then(|c| c.scanned_at)
                        .map(|t| t.get().to_string()),
                    node_reporting: pod
                        .node()
                        .as_ref()
                        .is_some_and(|n| self.reporting.get(&**n).copied().unwrap_or(false)),
                    pinned_by: v.pinned_by().iter().map(|s| s.to_string()).collect(),
                    message: v.message().map(str::to_string),
                });
            }
        }
        consumers.sort_by(|a, b| (&a.pod, &a.subject).cmp(&(&b.pod, &b.subject)));
        referenced.sort();
        let sources = referenced
            .iter()
            .map(|r| {
                self.sources.get(r).cloned().unwrap_or_else(|| SourceItem {
                    kind: r.kind.as_str().to_string(),
                    namespace: r.namespace.to_string(),
                    name: r.name.to_string(),
                    present: false,
                    fingerprint: None,
                    uid: None,
                    changed_at: None,
                })
            })
            .collect();
        // Attempts of the consumers' pods, and of the target's pods that
        // have no verdicts (a replacement not running yet). An attempt
        // names its workload as `WorkloadRef` displays it.
        let wanted_workload = match target {
            Target::Workload { kind, name, .. } => Some(
                WorkloadRef {
                    kind: *kind,
                    name: name.clone(),
                }
                .to_string(),
            ),
            _ => None,
        };
        let attempts = self
            .attempts
            .iter()
            .filter(|a| a.namespace == ns)
            .filter(|a| {
                consumer_pods.contains(a.pod.as_str())
                    || (!pods_in_ns.contains(a.pod.as_str())
                        && match target {
                            Target::Source { .. } => true,
                            Target::NodeSet { name, .. } => a.nodeset == *name,
                            Target::Workload { .. } => a.workload == wanted_workload,
                            Target::Pod { name, .. } => a.pod == *name,
                        })
            })
            .map(|a| AttemptRef {
                id: a.id.clone(),
                namespace: a.namespace.clone(),
                pod: a.pod.clone(),
                node: a.node.clone(),
                phase: a.phase.clone(),
                open: a.open,
                failure: a.failure.clone(),
            })
            .collect();
        let mut unscheduled: Vec<String> = self
            .unscheduled
            .values()
            .filter(|p| **p.namespace() == *ns)
            .filter(|p| match target {
                Target::Source { .. } => wanted.as_ref().is_some_and(|w| p.references_source(w)),
                _ => target.selects(&p.name, p.nodeset(), || self.workload_of(p)),
            })
            .map(|p| format!("{}/{}", p.namespace(), p.name))
            .collect();
        unscheduled.sort();
        RolloutDoc {
            acting,
            ready: ready && self.evaluated,
            target: target.to_string(),
            sources,
            consumers,
            attempts,
            unscheduled,
        }
    }
}

/// A store of every pod of `ix`, evaluated at 2026-11-30T10:00:01Z with the
/// default configuration (the tests of the store and of its printer).
#[cfg(test)]
impl VerdictStore {
    pub(crate) fn evaluated(ix: &mountguard_core::ClusterIndex) -> Self {
        use mountguard_core::{Config, Engine, EngineState, Fingerprinter};
        let engine = Engine::new(Config::default(), Fingerprinter::new(&[7u8; 32]).unwrap());
        let mut st = EngineState::default();
        let ev = engine.evaluate_all(
            ix,
            &mut st,
            mountguard_core::testkit::ts("2026-11-30T10:00:01Z"),
        );
        let mut store = VerdictStore::default();
        for pv in ev.pods {
            store.pods.insert(PublishedPod { pv, check: None });
        }
        store
    }
}

#[cfg(test)]
mod tests;
