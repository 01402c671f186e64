//! The rollout gate's decision: is the current content of one object (a
//! Secret or ConfigMap), or every mount of one NodeSet or pod, verified
//! Fresh on the nodes, and if not, what is missing.
//!
//! A workload target (`deployment`, `replicaset`, `statefulset`,
//! `daemonset`) selects the pods its controller owns as a NodeSet target
//! selects the NodeSet's: see [`Target::selects`].
//!
//! Pure and kube-free: [`decide`] reads a [`RolloutDoc`] (what
//! `GET /v1/rollouts/{kind}/{namespace}/{name}` returns) and returns a
//! [`Progress`]; `mountguard-controller wait` polls the endpoint and calls
//! it. Fingerprints only: the document never holds content or digests.
//!
//! The rules, top to bottom:
//! 1. The answering replica must act and have synced its watches;
//!    otherwise nothing it says counts.
//! 2. A Secret or ConfigMap target must exist as the controller sees it
//!    (during a delete-and-recreate rotation it is briefly absent), and when
//!    the caller names the new object's UID, the controller must see that
//!    UID (it may not have seen the recreation yet).
//! 3. A NodeSet, workload or pod target needs at least one consumer with
//!    verdicts.
//! 4. Every consumer (a volume, subPath or env reference of a running pod)
//!    counts, except Skipped ones. A consumer is verified when its verdict
//!    is Fresh, its node's agent reports, and the fingerprint of each
//!    source it was verified against equals that source's current
//!    fingerprint.
//! 5. An open remediation attempt on a consumer's pod (or on a pod of the
//!    target that has no verdicts, e.g. a replacement still pending) keeps
//!    the rollout incomplete.
//! 6. So does a pod of the target that is not scheduled yet (it has no
//!    node, so no verdicts, and will mount the object when it starts).

use serde::{Deserialize, Serialize};

use crate::SourceKind;
use crate::remediation::workload::{WorkloadKind, WorkloadRef};

/// What `wait` waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Every consumer of a Secret or ConfigMap.
    Source {
        /// Secret or ConfigMap.
        kind: SourceKind,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Every mount of every pod of a NodeSet.
    NodeSet {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Every mount of every pod of a Deployment, ReplicaSet, StatefulSet
    /// or DaemonSet.
    Workload {
        /// Its kind.
        kind: WorkloadKind,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Every mount of one pod.
    Pod {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl Target {
    /// The lower-case kind as used in the URL path and on the command line.
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Source {
                kind: SourceKind::Secret,
                ..
            } => "secret",
            Target::Source {
                kind: SourceKind::ConfigMap,
                ..
            } => "configmap",
            Target::NodeSet { .. } => "nodeset",
            Target::Workload { kind, .. } => kind.lower(),
            Target::Pod { .. } => "pod",
        }
    }

    /// Whether a pod of the target's namespace is one of the target's: a
    /// NodeSet's member, a workload's pod (`workload`: the workload it
    /// belongs to, a ReplicaSet's pods to the Deployment controlling that
    /// ReplicaSet), the pod itself. A Source target selects every pod (its
    /// consumers are those referencing the object). `workload` is asked
    /// only for a workload target.
    pub fn selects(
        &self,
        pod: &str,
        nodeset: Option<&str>,
        workload: impl FnOnce() -> Option<WorkloadRef>,
    ) -> bool {
        match self {
            Target::Source { .. } => true,
            Target::NodeSet { name, .. } => nodeset == Some(name.as_str()),
            Target::Workload { kind, name, .. } => {
                workload().is_some_and(|w| w.kind == *kind && w.name == *name)
            }
            Target::Pod { name, .. } => pod == name,
        }
    }

    /// Namespace and name.
    pub fn namespaced_name(&self) -> (&str, &str) {
        match self {
            Target::Source {
                namespace, name, ..
            }
            | Target::NodeSet { namespace, name }
            | Target::Workload {
                namespace, name, ..
            }
            | Target::Pod { namespace, name } => (namespace, name),
        }
    }

    /// The endpoint path of this target (names are DNS labels or
    /// subdomains, which need no escaping).
    pub fn path(&self) -> String {
        let (ns, name) = self.namespaced_name();
        format!("/v1/rollouts/{}/{ns}/{name}", self.kind())
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ns, name) = self.namespaced_name();
        write!(f, "{}/{ns}/{name}", self.kind())
    }
}

/// Whether `s` is a valid namespace or object name (a DNS subdomain: lower
/// case alphanumerics, `-` and `.`, at most 253 characters), so it can be
/// put in a URL path as it is.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

impl std::str::FromStr for Target {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!(
                "{s:?} is not KIND/NAMESPACE/NAME with KIND one of secret, configmap, nodeset, \
                 deployment, replicaset, statefulset, daemonset, pod (e.g. secret/slurm/slurm-auth-slurm)"
            )
        };
        let mut parts = s.split('/');
        let (Some(kind), Some(namespace), Some(name), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        for (what, v) in [("namespace", namespace), ("name", name)] {
            if !valid_name(v) {
                return Err(format!(
                    "{s:?}: {what} {v:?} is not a valid Kubernetes name (lower case letters, digits, '-', '.')"
                ));
            }
        }
        let (namespace, name) = (namespace.to_string(), name.to_string());
        Ok(match kind.to_ascii_lowercase().as_str() {
            "secret" | "secrets" => Target::Source {
                kind: SourceKind::Secret,
                namespace,
                name,
            },
            "configmap" | "configmaps" | "cm" => Target::Source {
                kind: SourceKind::ConfigMap,
                namespace,
                name,
            },
            "nodeset" | "nodesets" => Target::NodeSet { namespace, name },
            "pod" | "pods" | "po" => Target::Pod { namespace, name },
            // kubectl's names and short names of the apps/v1 kinds.
            k => {
                let kind = match k {
                    "deployment" | "deployments" | "deploy" => WorkloadKind::Deployment,
                    "replicaset" | "replicasets" | "rs" => WorkloadKind::ReplicaSet,
                    "statefulset" | "statefulsets" | "sts" => WorkloadKind::StatefulSet,
                    "daemonset" | "daemonsets" | "ds" => WorkloadKind::DaemonSet,
                    _ => return Err(bad()),
                };
                Target::Workload {
                    kind,
                    namespace,
                    name,
                }
            }
        })
    }
}

/// A source as the controller currently sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceItem {
    /// `Secret` or `ConfigMap`.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Whether the object exists.
    pub present: bool,
    /// Keyed fingerprint of the current content (absent when the object
    /// does not exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
    /// The object's UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// When the content last changed as the controller saw it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_at: Option<String>,
}

/// The fingerprint of one source a consumer was verified against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifiedSource {
    /// `Secret` or `ConfigMap`.
    pub kind: String,
    /// Name (in the consumer's namespace).
    pub name: String,
    /// Keyed fingerprint of the source content the verdict was computed
    /// against (absent: the source did not exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

/// One consumer: a volume, subPath or env reference of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerItem {
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
    /// `State` or `State/Cause`, e.g. `Stale/ImmutableCachePinned`.
    pub state: String,
    /// The sources the verdict was computed against, with their
    /// fingerprints at that time.
    #[serde(default)]
    pub sources: Vec<VerifiedSource>,
    /// Scan time of the node inventory the verdict was computed from
    /// (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<String>,
    /// Whether the node's agent reports (an inventory younger than the
    /// controller's limit).
    pub node_reporting: bool,
    /// Pods pinning an immutable cache entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_by: Vec<String>,
    /// The engine's explanation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A remediation attempt concerning the target.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptRef {
    /// Attempt id.
    pub id: String,
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Kubernetes node.
    pub node: String,
    /// Current phase.
    pub phase: String,
    /// Still needs work or attention.
    pub open: bool,
    /// Failure reason and detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// The rollout endpoint's document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutDoc {
    /// Whether this replica acts.
    pub acting: bool,
    /// Whether the watches finished their initial lists and the controller
    /// evaluated.
    pub ready: bool,
    /// `kind/namespace/name` of the target.
    pub target: String,
    /// The target itself (Secret or ConfigMap targets), or every source
    /// the target's consumers reference (NodeSet and pod targets).
    pub sources: Vec<SourceItem>,
    /// Every consumer, Skipped ones included.
    pub consumers: Vec<ConsumerItem>,
    /// Remediation attempts of the consumers' pods, and of pods of the
    /// target's namespace that have no verdicts (e.g. a replacement still
    /// pending).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<AttemptRef>,
    /// Pods of the target (referencing the object, of the NodeSet, or the
    /// pod itself) that are not scheduled yet, `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unscheduled: Vec<String>,
}

/// One consumer that is not verified, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Missing {
    /// Pod namespace.
    pub namespace: String,
    /// Pod name.
    pub pod: String,
    /// Node (`-` when unknown).
    pub node: String,
    /// Subject text.
    pub subject: String,
    /// `State` or `State/Cause`.
    pub state: String,
    /// Why it does not count as verified.
    pub why: String,
    /// Pods pinning an immutable cache entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pinned_by: Vec<String>,
    /// The pod's remediation attempt, `id phase`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt: Option<String>,
}

/// The gate's answer for one document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Consumers that count (every one but Skipped).
    pub total: usize,
    /// Of those, verified for the current content.
    pub verified: usize,
    /// Consumers not verified.
    pub missing: Vec<Missing>,
    /// Reasons beyond single consumers (controller not acting, object
    /// absent, open remediation attempts on pods without verdicts).
    pub blockers: Vec<String>,
}

impl Progress {
    /// Whether the rollout is complete.
    pub fn complete(&self) -> bool {
        self.missing.is_empty() && self.blockers.is_empty()
    }
}

fn attempt_text(a: &AttemptRef) -> String {
    match &a.failure {
        Some(f) => format!("{} {} ({f})", a.id, a.phase),
        None => format!("{} {}", a.id, a.phase),
    }
}

/// Decides whether the rollout `doc` describes is complete. `expect_uid`:
/// the UID the caller knows the target object has now (after a
/// delete-and-recreate), if any.
pub fn decide(doc: &RolloutDoc, target: &Target, expect_uid: Option<&str>) -> Progress {
    let mut p = Progress::default();
    if !doc.acting {
        p.blockers.push(
            "this controller replica does not act (ask the leader, label mountguard.io/leader=true)"
                .into(),
        );
        return p;
    }
    if !doc.ready {
        p.blockers
            .push("the controller is still loading the cluster state".into());
        return p;
    }
    let (ns, name) = target.namespaced_name();
    if let Target::Source { kind, .. } = target {
        let me = doc
            .sources
            .iter()
            .find(|s| s.kind == kind.as_str() && s.namespace == ns && s.name == name);
        match me {
            Some(s) if s.present => {
                if let Some(want) = expect_uid
                    && s.uid.as_deref() != Some(want)
                {
                    p.blockers.push(format!(
                        "the controller sees {} {ns}/{name} with UID {}, not {want} (it has not seen the new object yet)",
                        kind.as_str(),
                        s.uid.as_deref().unwrap_or("-")
                    ));
                }
            }
            _ => p.blockers.push(format!(
                "{} {ns}/{name} does not exist as the controller sees it",
                kind.as_str()
            )),
        }
    }
    let current = |kind: &str, name: &str, cns: &str| {
        doc.sources
            .iter()
            .find(|s| s.kind == kind && s.name == name && s.namespace == cns)
    };
    let attempt_of = |cns: &str, pod: &str| {
        doc.attempts
            .iter()
            .filter(|a| a.open && a.namespace == cns && a.pod == pod)
            .map(attempt_text)
            .next()
    };
    for c in &doc.consumers {
        if c.state.starts_with("Skipped") {
            continue;
        }
        p.total += 1;
        let mut why = Vec::new();
        if c.state != "Fresh" {
            why.push(match &c.message {
                Some(m) => format!("{}: {m}", c.state),
                None => c.state.clone(),
            });
        }
        if !c.node_reporting {
            // Fails closed, like `verify --fail-on`: no fresh inventory,
            // no verified consumer; say how old the last one is and what
            // decides "fresh".
            why.push(format!(
                "the agent on node {} does not report (last inventory {}; the controller \
                 judges only inventories younger than its --inventory-max-age)",
                c.node.as_deref().unwrap_or("-"),
                match &c.verified_at {
                    Some(t) => format!("scanned at {t}"),
                    None => "none".to_string(),
                }
            ));
        }
        for vs in &c.sources {
            match current(&vs.kind, &vs.name, &c.namespace) {
                Some(cur) if cur.fingerprint == vs.fingerprint => {}
                Some(cur) => why.push(format!(
                    "verified against {} {} content {}, current is {}",
                    vs.kind,
                    vs.name,
                    vs.fingerprint.as_deref().unwrap_or("(absent)"),
                    cur.fingerprint.as_deref().unwrap_or("(absent)")
                )),
                // A source outside the document is not the target's
                // concern (NodeSet and pod documents list every source).
                None => {}
            }
        }
        let attempt = attempt_of(&c.namespace, &c.pod);
        if let Some(a) = &attempt {
            why.push(format!("remediation attempt {a} is open"));
        }
        if why.is_empty() {
            p.verified += 1;
        } else {
            p.missing.push(Missing {
                namespace: c.namespace.clone(),
                pod: c.pod.clone(),
                node: c.node.clone().unwrap_or_else(|| "-".into()),
                subject: c.subject.clone(),
                state: c.state.clone(),
                why: why.join("; "),
                pinned_by: c.pinned_by.clone(),
                attempt,
            });
        }
    }
    // Open attempts on pods that have no consumer entry (deleted, a
    // replacement not yet running).
    for a in doc.attempts.iter().filter(|a| a.open) {
        if !doc
            .consumers
            .iter()
            .any(|c| c.namespace == a.namespace && c.pod == a.pod)
        {
            p.blockers.push(format!(
                "remediation attempt {} of pod {}/{} on node {} is open (the pod has no verdicts yet)",
                attempt_text(a),
                a.namespace,
                a.pod,
                a.node
            ));
        }
    }
    for u in &doc.unscheduled {
        p.blockers.push(format!(
            "pod {u} is not scheduled yet (it will mount the object when it starts)"
        ));
    }
    if p.total == 0 && doc.unscheduled.is_empty() && !matches!(target, Target::Source { .. }) {
        p.blockers.push(format!(
            "no running pod of {target} has verdicts (not scheduled, not started, or no such object)"
        ));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> Target {
        "secret/slurm/slurm-auth-slurm".parse().unwrap()
    }

    fn src(fp: Option<&str>, uid: &str) -> SourceItem {
        SourceItem {
            kind: "Secret".into(),
            namespace: "slurm".into(),
            name: "slurm-auth-slurm".into(),
            present: fp.is_some(),
            fingerprint: fp.map(str::to_string),
            uid: fp.map(|_| uid.to_string()),
            changed_at: None,
        }
    }

    fn consumer(pod: &str, state: &str, verified_fp: Option<&str>) -> ConsumerItem {
        ConsumerItem {
            namespace: "slurm".into(),
            pod: pod.into(),
            node: Some(format!("node-{pod}")),
            nodeset: Some("worker".into()),
            subject: "volume slurm-auth".into(),
            state: state.into(),
            sources: vec![VerifiedSource {
                kind: "Secret".into(),
                name: "slurm-auth-slurm".into(),
                fingerprint: verified_fp.map(str::to_string),
            }],
            verified_at: Some("2026-12-01T08:00:00Z".into()),
            node_reporting: true,
            pinned_by: vec![],
            message: None,
        }
    }

    fn doc(sources: Vec<SourceItem>, consumers: Vec<ConsumerItem>) -> RolloutDoc {
        RolloutDoc {
            acting: true,
            ready: true,
            target: "secret/slurm/slurm-auth-slurm".into(),
            sources,
            consumers,
            attempts: vec![],
            unscheduled: vec![],
        }
    }

    fn attempt(pod: &str, phase: &str, open: bool) -> AttemptRef {
        AttemptRef {
            id: "a1".into(),
            namespace: "slurm".into(),
            pod: pod.into(),
            node: format!("node-{pod}"),
            phase: phase.into(),
            open,
            failure: None,
        }
    }

    #[test]
    fn targets_parse_and_bad_input_is_refused() {
        assert_eq!(
            secret(),
            Target::Source {
                kind: SourceKind::Secret,
                namespace: "slurm".into(),
                name: "slurm-auth-slurm".into()
            }
        );
        assert_eq!(
            secret().path(),
            "/v1/rollouts/secret/slurm/slurm-auth-slurm"
        );
        for (s, kind) in [
            ("configmap/a/b", "configmap"),
            ("ConfigMap/a/b", "configmap"),
            ("cm/a/b", "configmap"),
            ("nodeset/slurm/worker", "nodeset"),
            ("pod/slurm/worker-0", "pod"),
            ("deployment/web/frontend", "deployment"),
            ("deploy/web/frontend", "deployment"),
            ("Deployments/web/frontend", "deployment"),
            ("rs/web/frontend-5d4f8", "replicaset"),
            ("replicaset/web/frontend-5d4f8", "replicaset"),
            ("sts/db/pg", "statefulset"),
            ("statefulset/db/pg", "statefulset"),
            ("ds/kube-system/agent", "daemonset"),
            ("daemonset/kube-system/agent", "daemonset"),
        ] {
            let t: Target = s.parse().unwrap();
            assert_eq!(t.kind(), kind, "{s}");
        }
        assert_eq!(
            "pod/slurm/worker-0".parse::<Target>().unwrap().to_string(),
            "pod/slurm/worker-0"
        );
        for bad in [
            "",
            "secret",
            "secret/ns",
            "secret/ns/a/b",
            "job/ns/x",
            "deployment/ns",
            "sts/ns/UPPER",
            "secret//x",
            "secret/ns/UPPER",
            "secret/ns/a?b",
            "secret/ns/-x",
        ] {
            assert!(bad.parse::<Target>().is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn each_target_selects_only_its_own_pods() {
        let w = |kind, name: &str| WorkloadRef {
            kind,
            name: name.into(),
        };
        let web = w(WorkloadKind::Deployment, "web");
        let web_rs = w(WorkloadKind::ReplicaSet, "web-5d4f8");
        let pg = w(WorkloadKind::StatefulSet, "pg");
        /// Target, pod, its NodeSet, its workload, selected.
        type Row<'a> = (
            &'a str,
            &'a str,
            Option<&'a str>,
            Option<&'a WorkloadRef>,
            bool,
        );
        let rows: Vec<Row> = vec![
            ("secret/a/s", "p", None, None, true),
            ("nodeset/a/worker", "worker-0", Some("worker"), None, true),
            ("nodeset/a/worker", "other-0", Some("other"), None, false),
            ("nodeset/a/worker", "worker-0", None, Some(&pg), false),
            ("deployment/a/web", "web-5d4f8-x", None, Some(&web), true),
            // A Deployment's pod is not its ReplicaSet's target, nor the
            // other way round: each names the workload it belongs to.
            (
                "replicaset/a/web-5d4f8",
                "web-5d4f8-x",
                None,
                Some(&web),
                false,
            ),
            (
                "deployment/a/web",
                "web-5d4f8-x",
                None,
                Some(&web_rs),
                false,
            ),
            (
                "replicaset/a/web-5d4f8",
                "web-5d4f8-x",
                None,
                Some(&web_rs),
                true,
            ),
            // Same name, another kind.
            ("daemonset/a/pg", "pg-0", None, Some(&pg), false),
            ("statefulset/a/pg", "pg-0", None, Some(&pg), true),
            ("statefulset/a/pg", "pg-0", None, None, false),
            ("statefulset/a/web", "web-0", None, Some(&web), false),
            ("pod/a/pg-0", "pg-0", None, Some(&pg), true),
            ("pod/a/pg-0", "pg-1", None, Some(&pg), false),
        ];
        for (t, pod, nodeset, workload, want) in rows {
            let target: Target = t.parse().unwrap();
            assert_eq!(
                target.selects(pod, nodeset, || workload.cloned()),
                want,
                "{t} selecting {pod} ({nodeset:?}, {workload:?})"
            );
        }
    }

    #[test]
    fn a_workload_target_needs_consumers_like_a_nodeset() {
        let t: Target = "deployment/web/frontend".parse().unwrap();
        assert_eq!(t.path(), "/v1/rollouts/deployment/web/frontend");
        assert_eq!(t.to_string(), "deployment/web/frontend");
        let mut d = doc(vec![], vec![]);
        d.target = t.to_string();
        let p = decide(&d, &t, None);
        assert!(
            !p.complete() && p.blockers[0].contains("no running pod of deployment/web/frontend"),
            "{p:?}"
        );
        let d = doc(
            vec![src(Some("aaaaaaaaaaaa"), "u2")],
            vec![consumer("w0", "Fresh", Some("aaaaaaaaaaaa"))],
        );
        assert!(decide(&d, &t, None).complete());
        let d2 = doc(
            vec![src(Some("aaaaaaaaaaaa"), "u2")],
            vec![consumer("w0", "Stale/ImmutableCache", Some("bbbbbbbbbbbb"))],
        );
        assert!(!decide(&d2, &t, None).complete());
    }

    /// A row: name, document, expected UID, then the expected verified,
    /// total, complete, and a phrase the reasons must contain.
    type Row = (
        &'static str,
        RolloutDoc,
        Option<&'static str>,
        usize,
        usize,
        bool,
        &'static str,
    );

    /// The table of the decision: each row a document and the expected
    /// (verified, total, complete, a phrase the reasons must contain).
    #[test]
    fn decision_table() {
        let new = Some("aaaaaaaaaaaa");
        let old = Some("bbbbbbbbbbbb");
        let mut not_acting = doc(vec![src(new, "u2")], vec![]);
        not_acting.acting = false;
        let mut not_ready = doc(vec![src(new, "u2")], vec![]);
        not_ready.ready = false;
        let mut silent = consumer("w0", "Fresh", new);
        silent.node_reporting = false;
        let mut pinned = consumer("w1", "Stale/ImmutableCachePinned", old);
        pinned.pinned_by = vec!["sidecar-0".into()];
        let skipped = consumer("w2", "Skipped/DownwardApi", None);
        let mut with_attempt = doc(
            vec![src(new, "u2")],
            vec![consumer("w0", "Stale/ImmutableCache", old)],
        );
        with_attempt.attempts = vec![attempt("w0", "Evicting", true)];
        let mut fresh_but_attempt_open =
            doc(vec![src(new, "u2")], vec![consumer("w0", "Fresh", new)]);
        fresh_but_attempt_open.attempts = vec![attempt("w0", "Verifying", true)];
        let mut pending_replacement = doc(vec![src(new, "u2")], vec![consumer("w0", "Fresh", new)]);
        pending_replacement.attempts = vec![
            attempt("w1", "Replacing", true),
            attempt("w0", "Succeeded", false),
        ];
        let mut unscheduled = doc(vec![src(new, "u2")], vec![consumer("w0", "Fresh", new)]);
        unscheduled.unscheduled = vec!["slurm/w1".into()];
        let mut closed_attempt = doc(vec![src(new, "u2")], vec![consumer("w0", "Fresh", new)]);
        closed_attempt.attempts = vec![attempt("w0", "Succeeded", false)];

        let s = secret();
        let rows: Vec<Row> = vec![
            (
                "all fresh for the current content",
                doc(
                    vec![src(new, "u2")],
                    vec![consumer("w0", "Fresh", new), consumer("w1", "Fresh", new)],
                ),
                None,
                2,
                2,
                true,
                "",
            ),
            (
                "fresh, but verified against the old content",
                doc(
                    vec![src(new, "u2")],
                    vec![consumer("w0", "Fresh", new), consumer("w1", "Fresh", old)],
                ),
                None,
                1,
                2,
                false,
                "verified against Secret slurm-auth-slurm content bbbbbbbbbbbb, current is aaaaaaaaaaaa",
            ),
            (
                "stale and pinned",
                doc(
                    vec![src(new, "u2")],
                    vec![consumer("w0", "Fresh", new), pinned],
                ),
                None,
                1,
                2,
                false,
                "Stale/ImmutableCachePinned",
            ),
            (
                "agent not reporting",
                doc(vec![src(new, "u2")], vec![silent]),
                None,
                0,
                1,
                false,
                "does not report (last inventory scanned at 2026-12-01T08:00:00Z; the controller \
                 judges only inventories younger than its --inventory-max-age)",
            ),
            (
                "skipped references do not count",
                doc(
                    vec![src(new, "u2")],
                    vec![consumer("w0", "Fresh", new), skipped],
                ),
                None,
                1,
                1,
                true,
                "",
            ),
            (
                "no consumers: nothing to roll out",
                doc(vec![src(new, "u2")], vec![]),
                None,
                0,
                0,
                true,
                "",
            ),
            (
                "source absent (between delete and recreate)",
                doc(
                    vec![src(None, "")],
                    vec![consumer("w0", "SourceMissing", None)],
                ),
                None,
                0,
                1,
                false,
                "does not exist",
            ),
            (
                "source not in the document at all",
                doc(vec![], vec![]),
                None,
                0,
                0,
                false,
                "does not exist",
            ),
            (
                "the controller has not seen the recreated object",
                doc(vec![src(old, "u1")], vec![consumer("w0", "Fresh", old)]),
                Some("u2"),
                1,
                1,
                false,
                "not u2",
            ),
            (
                "the controller sees the recreated object",
                doc(vec![src(new, "u2")], vec![consumer("w0", "Fresh", new)]),
                Some("u2"),
                1,
                1,
                true,
                "",
            ),
            ("not acting", not_acting, None, 0, 0, false, "does not act"),
            ("not ready", not_ready, None, 0, 0, false, "still loading"),
            (
                "stale with a remediation attempt",
                with_attempt,
                None,
                0,
                1,
                false,
                "a1 Evicting",
            ),
            (
                "fresh while the attempt still verifies",
                fresh_but_attempt_open,
                None,
                0,
                1,
                false,
                "a1 Verifying",
            ),
            (
                "replacement pod without verdicts",
                pending_replacement,
                None,
                1,
                1,
                false,
                "pod slurm/w1 on node node-w1 is open",
            ),
            (
                "closed attempts do not block",
                closed_attempt,
                None,
                1,
                1,
                true,
                "",
            ),
        ];
        for (name, d, uid, verified, total, complete, phrase) in rows {
            let p = decide(&d, &s, uid);
            assert_eq!(
                (p.verified, p.total, p.complete()),
                (verified, total, complete),
                "{name}: {p:?}"
            );
            let text = format!(
                "{} {}",
                p.blockers.join(" "),
                p.missing
                    .iter()
                    .map(|m| format!("{} {}", m.state, m.why))
                    .collect::<Vec<_>>()
                    .join(" ")
            );
            assert!(text.contains(phrase), "{name}: {text:?} lacks {phrase:?}");
            assert_eq!(p.verified + p.missing.len(), p.total, "{name}");
        }
    }

    #[test]
    fn missing_entries_name_node_pins_and_attempt() {
        let mut pinned = consumer("w1", "Stale/ImmutableCachePinned", Some("bbbbbbbbbbbb"));
        pinned.pinned_by = vec!["monitor-x".into()];
        pinned.message = Some("the kubelet keeps the old content".into());
        let mut d = doc(vec![src(Some("aaaaaaaaaaaa"), "u2")], vec![pinned]);
        d.attempts = vec![AttemptRef {
            failure: Some("ReplacementStale: still stale".into()),
            ..attempt("w1", "Failed", true)
        }];
        let p = decide(&d, &secret(), None);
        assert_eq!(p.missing.len(), 1);
        let m = &p.missing[0];
        assert_eq!(m.node, "node-w1");
        assert_eq!(m.pinned_by, ["monitor-x"]);
        assert_eq!(
            m.attempt.as_deref(),
            Some("a1 Failed (ReplacementStale: still stale)")
        );
        assert!(m.why.contains("the kubelet keeps the old content"), "{m:?}");
    }

    #[test]
    fn nodeset_and_pod_targets_need_consumers_and_check_every_source() {
        let ns: Target = "nodeset/slurm/worker".parse().unwrap();
        let mut d = doc(vec![], vec![]);
        d.target = ns.to_string();
        let p = decide(&d, &ns, None);
        assert!(
            !p.complete() && p.blockers[0].contains("no running pod"),
            "{p:?}"
        );
        // Every source of the NodeSet's mounts is listed; each must match.
        let mut cm = src(Some("cccccccccccc"), "u9");
        cm.kind = "ConfigMap".into();
        cm.name = "slurm-config".into();
        let mut c2 = consumer("w0", "Fresh", Some("cccccccccccc"));
        c2.subject = "volume slurm-config".into();
        c2.sources[0].kind = "ConfigMap".into();
        c2.sources[0].name = "slurm-config".into();
        let d = RolloutDoc {
            sources: vec![src(Some("aaaaaaaaaaaa"), "u2"), cm],
            consumers: vec![consumer("w0", "Fresh", Some("aaaaaaaaaaaa")), c2.clone()],
            ..d
        };
        assert!(decide(&d, &ns, None).complete());
        let mut d2 = d.clone();
        d2.consumers[1].sources[0].fingerprint = Some("dddddddddddd".into());
        let p = decide(&d2, &ns, None);
        assert_eq!((p.verified, p.total), (1, 2));
        // `expect_uid` concerns only Secret and ConfigMap targets.
        assert!(decide(&d, &ns, Some("whatever")).complete());
    }
}
