//! `GET /v1/verdicts` (on the metrics port) and the
//! `mountguard-controller status` command that prints it.
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
use std::io::Write;
use std::sync::Arc;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};

use crate::Error;
use mountguard_core::model::{CompactTime, FingerprintList, PodModel, SourceRef};
use mountguard_core::remediation::workload::{WorkloadKind, WorkloadRef, workload_named};
use mountguard_core::rollout::{
    AttemptRef, ConsumerItem, RolloutDoc, SourceItem, Target, VerifiedSource,
};
use mountguard_core::table::{Keyed, KeyedTable};
use mountguard_core::verdict::{PodVerdicts, State, Verdict};
use mountguard_core::{Fingerprint, PodUid};
use mountguard_inventory::table::write_aligned;

/// What one pod's verdicts were computed against: the node inventory's scan
/// time and the fingerprint of every source the pod references.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCheck {
    /// Scan time of the node inventory (none: no inventory).
    /// (Compact: 16 bytes instead of 24 in every published pod.)
    pub scanned_at: Option<CompactTime>,
    /// Keyed fingerprint of each source the pod references, in the order
    /// of [`PodModel::references`] (`None`: absent). The references are
    /// the pod's own, so they are not stored again.
    /// (Interned: pods referencing the same sources share the list; one
    /// word, so a check is 24 bytes and a published pod 48, not 56.)
    pub fingerprints: FingerprintList,
}

impl PodCheck {
    /// The fingerprint recorded for `r`: `None` when `pod` does not
    /// reference `r`, `Some(None)` when `r` was absent.
    pub fn source(&self, pod: &PodModel, r: &SourceRef) -> Option<Option<Fingerprint>> {
        let i = pod.references().iter().position(|x| x == r)?;
        self.fingerprints.get(i).copied()
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
    /// What to do, in one sentence (`mountguard_core::verdict::advice`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advice: Option<String>,
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
/// computed against, when known).
pub fn item(pv: &PodVerdicts, v: &Verdict, check: Option<&PodCheck>) -> StatusItem {
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
        advice: view.advice,
    }
}

impl VerdictStore {
    /// The document for `q`.
    pub fn document(&self, q: &Query, acting: bool, ready: bool) -> StatusDoc {
        let mut by_state = BTreeMap::new();
        let mut verdicts = Vec::new();
        for p in self.pods.values().filter(|p| q.in_scope(&p.pv)) {
            let pv = &p.pv;
            for v in pv.verdicts.iter() {
                *by_state.entry(v.state.tag()).or_insert(0) += 1;
                if q.lists(v) {
                    verdicts.push(item(pv, v, p.check.as_ref()));
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

/// Output formats of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// A table.
    Table,
    /// The endpoint's JSON.
    Json,
}

/// Filters and output of `status` (shared by `mountguard-controller status`
/// and `kubectl mountguard status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusQuery {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this node.
    pub node: Option<String>,
    /// Only this state (`Stale`) or tag (`Stale/ImmutableCachePinned`).
    pub state: Option<String>,
    /// Include Fresh and Skipped verdicts.
    pub all: bool,
    /// Output format.
    pub output: StatusOutput,
    /// The request, connect to last byte, must end within this.
    pub request_timeout: std::time::Duration,
    /// Largest answer accepted, in bytes.
    pub max_response_size: u64,
}

impl StatusQuery {
    /// The request path and query.
    pub fn path(&self) -> String {
        let mut q = Vec::new();
        if self.all {
            q.push("all=1".to_string());
        }
        for (k, v) in [
            ("namespace", &self.namespace),
            ("node", &self.node),
            ("state", &self.state),
        ] {
            if let Some(v) = v {
                q.push(format!("{k}={}", encode(v)));
            }
        }
        if q.is_empty() {
            "/v1/verdicts".into()
        } else {
            format!("/v1/verdicts?{}", q.join("&"))
        }
    }

    /// Fetches the document and prints it; returns the exit code (0 when
    /// no verdict needs attention, 1 otherwise).
    pub async fn run(
        self,
        endpoint: &super::client::Endpoint,
        out: &mut dyn Write,
    ) -> Result<u8, Error> {
        let limits = super::client::Limits::from_now(
            self.request_timeout,
            "--request-timeout",
            self.max_response_size,
        );
        let doc: StatusDoc = endpoint.get_json(&self.path(), &limits).await?;
        let io = |e: std::io::Error| Error::Io {
            file: "<stdout>".into(),
            source: e,
        };
        match self.output {
            StatusOutput::Json => {
                serde_json::to_writer_pretty(&mut *out, &doc).map_err(|e| io(e.into()))?;
                writeln!(out).map_err(io)?;
            }
            StatusOutput::Table => write_table(&doc, out).map_err(io)?,
        }
        let attention = doc
            .verdicts
            .iter()
            .any(|v| !matches!(v.state.as_str(), "Fresh" | "Skipped"))
            || doc.attempts.iter().any(|a| a.open);
        Ok(u8::from(attention))
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prints the document as a table: one row per verdict, notes, a summary.
pub fn write_table(doc: &StatusDoc, out: &mut dyn Write) -> std::io::Result<()> {
    if !doc.acting {
        writeln!(
            out,
            "note: this replica is not the acting controller; ask the leader (label mountguard.io/leader=true)"
        )?;
    } else if !doc.ready {
        writeln!(
            out,
            "note: the controller is still loading the cluster state"
        )?;
    }
    let mut rows: Vec<[String; 7]> = vec![[
        "STATE".into(),
        "CAUSE".into(),
        "POD".into(),
        "NODE".into(),
        "SUBJECT".into(),
        "SOURCE".into(),
        "MOUNTED/CURRENT".into(),
    ]];
    let mut notes = Vec::new();
    for v in &doc.verdicts {
        let mut cause = v.cause.clone().unwrap_or_default();
        if !v.pinned_by.is_empty() {
            cause.push_str(&format!(" (pinned by {})", v.pinned_by.join(",")));
        }
        rows.push([
            v.state.clone(),
            cause,
            format!("{}/{}", v.namespace, v.pod),
            v.node.clone().unwrap_or_else(|| "-".into()),
            v.subject.clone(),
            v.sources.join(","),
            format!(
                "{} vs {}",
                v.observed.as_deref().unwrap_or("-"),
                v.expected.as_deref().unwrap_or("-")
            ),
        ]);
        if let Some(m) = &v.message {
            notes.push(format!(
                "{}/{} {}: {m} (since {})",
                v.namespace, v.pod, v.subject, v.since
            ));
        }
        if let Some(a) = &v.advice {
            notes.push(format!("{}/{} {}: {a}", v.namespace, v.pod, v.subject));
        }
    }
    if rows.len() == 1 {
        writeln!(out, "no verdict needs attention")?;
    } else {
        write_aligned(&rows, out)?;
    }
    for n in notes {
        writeln!(out, "  {n}")?;
    }
    write_attempts(&doc.attempts, out)?;
    let summary: Vec<String> = doc
        .by_state
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    writeln!(
        out,
        "verdicts: {}",
        if summary.is_empty() {
            "none".into()
        } else {
            summary.join(" ")
        }
    )?;
    Ok(())
}

/// Prints the remediation attempts (nothing when there are none).
fn write_attempts(attempts: &[AttemptItem], out: &mut dyn Write) -> std::io::Result<()> {
    if attempts.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "remediation attempts:")?;
    let mut rows: Vec<[String; 7]> = vec![[
        "ATTEMPT".into(),
        "POD".into(),
        "OWNER".into(),
        "SLURM NODE".into(),
        "PHASE".into(),
        "SINCE".into(),
        "DETAIL".into(),
    ]];
    for a in attempts {
        let mut phase = a.phase.clone();
        if a.kept_drained {
            phase.push_str(" (kept drained)");
        } else if a.open && a.phase == "Failed" {
            phase.push_str(" (releasing drain)");
        }
        let detail = a
            .failure
            .clone()
            .or_else(|| a.last_error.clone().map(|e| format!("retrying: {e}")))
            .unwrap_or_else(|| a.phases.join(" > "));
        // A workload's attempt: its replacement and the node it landed on.
        let owner = match &a.workload {
            Some(w) => w.clone(),
            None => format!("NodeSet {}", a.nodeset),
        };
        let detail = match (&a.new_pod, &a.new_pod_node) {
            (Some(p), Some(n)) if a.workload.is_some() => {
                format!("{detail} (replacement {p} on {n})")
            }
            _ => detail,
        };
        rows.push([
            a.id.clone(),
            format!("{}/{}", a.namespace, a.pod),
            owner,
            if a.slurm_node.is_empty() {
                "-".into()
            } else {
                a.slurm_node.clone()
            },
            phase,
            a.since.clone(),
            detail,
        ]);
    }
    write_aligned(&rows, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mountguard_core::testkit::*;
    use mountguard_core::{ClusterIndex, Config, Engine, EngineState, Fingerprinter, SourceKind};

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
            mountguard_core::model::VolumeSource::Object(obj(
                SourceKind::ConfigMap,
                "cm",
                &[],
                false,
            ))
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
        let engine = Engine::new(Config::default(), Fingerprinter::new(&[7u8; 32]).unwrap());
        let mut st = EngineState::default();
        let ev = engine.evaluate_all(&ix, &mut st, ts("2026-11-30T10:00:01Z"));
        let mut store = VerdictStore::default();
        for pv in ev.pods {
            store.pods.insert(PublishedPod { pv, check: None });
        }
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

    #[test]
    fn query_filters_and_table() {
        let mut ix = ClusterIndex::new();
        put_config_map(
            &mut ix,
            "ns",
            "cm",
            &[("a", b"new")],
            &[],
            Some(ts("2026-11-30T09:00:00Z")),
        );
        let pod = PodB::new("ns", "p1", "u1", "n1")
            .volume(
                "cfg",
                mountguard_core::model::VolumeSource::Object(obj(
                    SourceKind::ConfigMap,
                    "cm",
                    &[],
                    false,
                )),
            )
            .build();
        ix.apply_pod(pod);
        let pod2 = PodB::new("other", "p2", "u2", "n2").build();
        ix.apply_pod(pod2);
        NodeB::new("n1", ts("2026-11-30T10:00:00Z"))
            .volume(
                "u1",
                inventory_plugin(),
                "cfg",
                &[("a", b"old")],
                ts("2026-11-30T09:59:00Z"),
            )
            .apply(&mut ix);
        let engine = Engine::new(Config::default(), Fingerprinter::new(&[7u8; 32]).unwrap());
        let mut st = EngineState::default();
        let ev = engine.evaluate_all(&ix, &mut st, ts("2026-11-30T10:00:01Z"));
        let mut store = VerdictStore::default();
        for pv in ev.pods {
            store.pods.insert(PublishedPod { pv, check: None });
        }
        let doc = store.document(&Query::parse(Some("")), true, true);
        assert_eq!(doc.verdicts.len(), 1, "{doc:?}");
        assert_eq!(doc.verdicts[0].state, "Stale");
        assert_eq!(doc.verdicts[0].subject, "volume cfg");
        assert_eq!(doc.verdicts[0].sources, vec!["ConfigMap/cm".to_string()]);
        let fp = doc.verdicts[0].expected.clone().unwrap();
        assert_eq!(fp.len(), 12, "fingerprints only");
        assert!(
            store
                .document(&Query::parse(Some("namespace=other")), true, true)
                .verdicts
                .is_empty()
        );
        assert!(
            store
                .document(&Query::parse(Some("node=n2")), true, true)
                .verdicts
                .is_empty()
        );
        assert_eq!(
            store
                .document(&Query::parse(Some("state=Stale%2FUnknown")), true, true)
                .verdicts
                .len(),
            1
        );
        assert!(
            store
                .document(&Query::parse(Some("state=Frozen")), true, true)
                .verdicts
                .is_empty()
        );
        let mut out = Vec::new();
        write_table(&doc, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Stale  Unknown"), "{text}");
        // The advice (issue 31 §2): in the item, the table and the Event.
        let advice = doc.verdicts[0].advice.clone().unwrap();
        assert!(advice.starts_with("Replace the pod"), "{advice}");
        assert!(
            text.contains(&format!("ns/p1 volume cfg: {advice}")),
            "{text}"
        );
        let p = &store.pods["u1"];
        let note =
            super::super::eval::event_message(&p.pv, &p.pv.verdicts[0], &PodCheck::default());
        assert!(note.ends_with(&advice), "{note}");
        assert!(text.contains("ns/p1"), "{text}");
        assert!(text.contains("verdicts: Stale/Unknown=1"), "{text}");
        // JSON round trip for the status command.
        let back: StatusDoc = serde_json::from_slice(&serde_json::to_vec(&doc).unwrap()).unwrap();
        assert_eq!(back, doc);
        let args = StatusQuery {
            namespace: Some("a b".into()),
            node: None,
            state: Some("Stale/ImmutableCache".into()),
            all: true,
            output: StatusOutput::Json,
            request_timeout: std::time::Duration::from_secs(1),
            max_response_size: 1,
        };
        assert_eq!(
            args.path(),
            "/v1/verdicts?all=1&namespace=a%20b&state=Stale%2FImmutableCache"
        );
        assert_eq!(
            Query::parse(Some("namespace=a%20b")).namespace.as_deref(),
            Some("a b")
        );
    }

    #[test]
    fn attempts_are_listed_open_first_filtered_and_printed() {
        use mountguard_core::remediation::{Attempt, Phase};
        let t0: jiff::Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let mk = |id: &str, ns: &str, pod: &str, node: &str, phase: Phase, min: i64| {
            let mut a = Attempt::new(
                id.into(),
                ns,
                "worker",
                pod,
                "uid",
                node,
                pod,
                vec![],
                t0 + jiff::SignedDuration::from_mins(min),
            );
            a.phase = phase;
            a
        };
        let done = mk("aaa", "slurm", "worker-0", "node-a", Phase::Succeeded, 0);
        let mut failed = mk(
            "bbb",
            "slurm",
            "worker-1",
            "node-b",
            Phase::Failed(mountguard_core::remediation::FailReason::ReplacementStale),
            1,
        );
        failed.kept_drained = true;
        failed.failure = Some("ReplacementStale: volume slurm-etc still stale".into());
        let mut running = mk("ccc", "slurm", "worker-2", "node-c", Phase::Evicting, 2);
        running.retry.last_error = Some("eviction refused: PDB".into());
        let other_ns = mk("ddd", "hpc", "gpu-0", "node-a", Phase::Drained, 3);
        let store = VerdictStore {
            attempts: [&done, &failed, &running, &other_ns]
                .iter()
                .map(|a| AttemptItem::from_attempt(a))
                .collect(),
            ..Default::default()
        };
        let doc = store.document(&Query::parse(Some("namespace=slurm")), true, true);
        let ids: Vec<&str> = doc.attempts.iter().map(|a| a.id.as_str()).collect();
        // Open first (newest first), then closed.
        assert_eq!(ids, ["ccc", "bbb", "aaa"]);
        assert!(doc.attempts[1].open && doc.attempts[1].kept_drained);
        assert!(!doc.attempts[2].open);
        let doc = store.document(&Query::parse(Some("node=node-a")), true, true);
        let ids: Vec<&str> = doc.attempts.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["ddd", "aaa"]);

        let doc = store.document(&Query::parse(Some("namespace=slurm")), true, true);
        let mut out = Vec::new();
        write_table(&doc, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("remediation attempts:"), "{text}");
        let line = |id: &str| {
            text.lines()
                .find(|l| l.starts_with(id))
                .unwrap_or("")
                .to_string()
        };
        assert!(
            line("ccc").contains("Evicting")
                && line("ccc").contains("retrying: eviction refused: PDB"),
            "{text}"
        );
        assert!(
            line("bbb").contains("Failed (kept drained)")
                && line("bbb").contains("ReplacementStale"),
            "{text}"
        );
        assert!(line("aaa").contains("Succeeded"), "{text}");
        assert!(line("aaa").contains("NodeSet worker"), "{text}");
        // A workload's attempt: its owner, no Slurm node, its replacement.
        let mut w = Attempt::for_workload(
            "eee".into(),
            "shop",
            mountguard_core::remediation::workload::WorkloadRef {
                kind: mountguard_core::remediation::workload::WorkloadKind::Deployment,
                name: "web".into(),
            },
            "web-7d9f-a",
            "uid",
            "node-a",
            vec![],
            t0,
        );
        w.phase = Phase::Verifying;
        w.new_pod_uid = Some("uid-2".into());
        w.new_pod_name = Some("web-7d9f-z".into());
        w.new_pod_node = Some("node-c".into());
        let item = AttemptItem::from_attempt(&w);
        assert_eq!(item.workload.as_deref(), Some("Deployment web"));
        assert_eq!(item.new_pod.as_deref(), Some("web-7d9f-z"));
        let store = VerdictStore {
            attempts: vec![item],
            ..Default::default()
        };
        let mut out = Vec::new();
        write_table(&store.document(&Query::default(), true, true), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let row = text.lines().find(|l| l.starts_with("eee")).unwrap_or("");
        assert!(
            row.contains("Deployment web")
                && row.contains(" - ")
                && row.contains("(replacement web-7d9f-z on node-c)"),
            "{text}"
        );
        // No attempts: no section, and the JSON omits the field.
        let empty = VerdictStore::default().document(&Query::default(), true, true);
        let mut out = Vec::new();
        write_table(&empty, &mut out).unwrap();
        assert!(!String::from_utf8(out).unwrap().contains("remediation"));
        assert!(
            serde_json::to_value(&empty)
                .unwrap()
                .get("attempts")
                .is_none()
        );
    }

    fn inventory_plugin() -> mountguard_inventory::Plugin {
        mountguard_inventory::Plugin::Configmap
    }
}
