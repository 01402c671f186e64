//! Authorization of agent reports (their tokens are authenticated by a
//! TokenReview, cached: `runtime/token_review.rs`).
//!
//! Authorization is a pure function ([`authorize`]): the token's user must
//! be the agent ServiceAccount; `user.extra` must name the pod (name and
//! UID) the token was issued for; that pod must exist (in the agent
//! namespace, with that UID), be owned by the agent DaemonSet and run on
//! the node in the request path; a `node-name` claim, when present, must
//! name that node too.
//!
//! The controller knows the agent pods from a watch on pods in the agent
//! namespace (owned by the agent DaemonSet; [`AgentPods`]); on a miss (a
//! brand-new agent pod not yet seen by the watch) it GETs the pod once
//! ([`PodFetcher`]), bounded by a timeout.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::HashMap;
use std::sync::RwLock;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;

use crate::runtime::metrics::Metrics;
use crate::runtime::token_review::{EXTRA_NODE_NAME, EXTRA_POD_NAME, EXTRA_POD_UID, ReviewedUser};

/// `<namespace>:<name>` of the agent's ServiceAccount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl ServiceAccountRef {
    /// The Kubernetes user name of a token of this ServiceAccount.
    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

impl std::str::FromStr for ServiceAccountRef {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once(':').or_else(|| s.split_once('/')) {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains(':') => {
                Ok(Self {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not <namespace>:<name>")),
        }
    }
}

/// An agent pod as the authorization needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentPod {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
    /// `spec.nodeName`.
    pub node: Option<String>,
    /// The controlling owner when it is a DaemonSet: (name, UID).
    pub controller: Option<(String, String)>,
}

impl AgentPod {
    /// From a Pod object; `None` without name or UID.
    pub fn from_pod(p: &Pod) -> Option<Self> {
        Some(Self {
            namespace: p.metadata.namespace.clone().unwrap_or_default(),
            name: p.metadata.name.clone()?,
            uid: p.metadata.uid.clone()?,
            node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
            // The controlling reference (at most one has `controller:
            // true`: apimachinery's metav1.GetControllerOf, in
            // staging/src/k8s.io/apimachinery/pkg/apis/meta/v1/controller_ref.go).
            controller: p
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|o| o.controller == Some(true))
                .filter(|o| o.kind == "DaemonSet" && o.api_version == "apps/v1")
                .map(|o| (o.name.clone(), o.uid.clone())),
        })
    }

    /// Whether the pod is controlled by a DaemonSet named `name`.
    pub fn controlled_by_name(&self, name: &str) -> bool {
        self.controller.as_ref().is_some_and(|(n, _)| n == name)
    }
}

/// The agent pods known from the watch, by name, and the UID of the live
/// agent DaemonSet.
#[derive(Debug, Default)]
pub struct AgentPods {
    pods: RwLock<HashMap<String, AgentPod>>,
    daemonset_uid: RwLock<Option<String>>,
}

impl AgentPods {
    /// Records the UID of the agent DaemonSet (`None`: it does not exist).
    pub fn set_daemonset_uid(&self, uid: Option<String>) {
        *self.daemonset_uid.write().unwrap() = uid;
    }

    /// The UID of the agent DaemonSet, if it exists.
    pub fn daemonset_uid(&self) -> Option<String> {
        self.daemonset_uid.read().unwrap().clone()
    }

    /// Inserts or replaces a pod.
    pub fn apply(&self, p: AgentPod) {
        self.pods.write().unwrap().insert(p.name.clone(), p);
    }

    /// Removes a pod.
    pub fn delete(&self, name: &str) {
        self.pods.write().unwrap().remove(name);
    }

    /// The pod named `name`.
    pub fn get(&self, name: &str) -> Option<AgentPod> {
        self.pods.read().unwrap().get(name).cloned()
    }

    /// Number of pods known.
    pub fn len(&self) -> usize {
        self.pods.read().unwrap().len()
    }

    /// Whether no pod is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// GETs an agent pod the watch has not delivered yet.
pub trait PodFetcher: Send + Sync + std::fmt::Debug {
    /// The pod `name` in the agent namespace, if it exists.
    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<AgentPod>>;
}

/// [`PodFetcher`] through the API (bounded by a 5 s timeout).
pub struct KubePodFetcher {
    api: Api<Pod>,
    metrics: Metrics,
}

impl std::fmt::Debug for KubePodFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KubePodFetcher")
    }
}

impl KubePodFetcher {
    /// A fetcher for pods in `namespace`.
    pub fn new(client: kube::Client, namespace: String, metrics: Metrics) -> Self {
        Self {
            api: Api::namespaced(client, &namespace),
            metrics,
        }
    }
}

impl PodFetcher for KubePodFetcher {
    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<AgentPod>> {
        Box::pin(async move {
            match tokio::time::timeout(Duration::from_secs(5), self.api.get_opt(name)).await {
                Ok(Ok(p)) => p.as_ref().and_then(AgentPod::from_pod),
                Ok(Err(e)) => {
                    self.metrics.api_error("get_agent_pod");
                    tracing::warn!(pod = name, error = %e, "could not get agent pod");
                    None
                }
                Err(_) => {
                    self.metrics.api_error("get_agent_pod");
                    None
                }
            }
        })
    }
}

/// Why an authenticated token may not report for a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The token is not the agent ServiceAccount's.
    #[error("user {0:?} is not the agent service account")]
    NotAgentServiceAccount(String),
    /// The token carries no pod name or UID claim.
    #[error("token has no pod-name/pod-uid claim (use a projected service-account token)")]
    NoPodClaim,
    /// The pod named in the token is unknown.
    #[error("pod {0:?} from the token does not exist in the agent namespace")]
    UnknownPod(String),
    /// The pod exists with another UID (the token is for a deleted pod).
    #[error("pod {0:?} has another UID than the token's")]
    PodUidMismatch(String),
    /// The pod is not controlled by the live agent DaemonSet.
    #[error(
        "pod {0:?} is not controlled by the agent DaemonSet (a controlling ownerReference with its name and UID)"
    )]
    NotAgentPod(String),
    /// The agent DaemonSet is not known (absent, or not listed yet).
    #[error(
        "the agent DaemonSet {0:?} is not known to the controller (does it exist in the agent namespace?)"
    )]
    NoAgentDaemonSet(String),
    /// The pod runs on another node.
    #[error("pod {pod:?} runs on {actual:?}, not on node {node:?}")]
    WrongNode {
        /// The pod.
        pod: String,
        /// The node in the path.
        node: String,
        /// Where the pod runs.
        actual: String,
    },
    /// The token's node claim names another node.
    #[error("token is bound to node {claim:?}, not {node:?}")]
    NodeClaimMismatch {
        /// The node in the path.
        node: String,
        /// The token's node claim.
        claim: String,
    },
}

impl Denied {
    /// Whether a fresh GET of the pod could change the answer.
    pub fn may_be_cache_miss(&self) -> bool {
        matches!(self, Denied::UnknownPod(_) | Denied::PodUidMismatch(_))
    }

    /// A short label for logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Denied::NotAgentServiceAccount(_) => "notAgentServiceAccount",
            Denied::NoPodClaim => "noPodClaim",
            Denied::UnknownPod(_) => "unknownPod",
            Denied::PodUidMismatch(_) => "podUidMismatch",
            Denied::NotAgentPod(_) => "notAgentPod",
            Denied::NoAgentDaemonSet(_) => "noAgentDaemonSet",
            Denied::WrongNode { .. } => "wrongNode",
            Denied::NodeClaimMismatch { .. } => "nodeClaimMismatch",
        }
    }
}

/// The agent DaemonSet as the authorization needs it: its name and, when
/// the controller knows it, the UID of the live object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentDaemonSet<'a> {
    /// `--agent-daemonset`.
    pub name: &'a str,
    /// The live DaemonSet's UID.
    pub uid: Option<&'a str>,
}

/// Whether `user` may report for `node` (pure; `lookup` finds agent pods by
/// name in the agent namespace). Returns the agent pod on success.
pub fn authorize(
    user: &ReviewedUser,
    node: &str,
    sa: &ServiceAccountRef,
    daemonset: &AgentDaemonSet<'_>,
    lookup: impl Fn(&str) -> Option<AgentPod>,
) -> Result<AgentPod, Denied> {
    if user.username != sa.username() {
        return Err(Denied::NotAgentServiceAccount(user.username.clone()));
    }
    let (Some(pod_name), Some(pod_uid)) = (
        user.extra_one(EXTRA_POD_NAME),
        user.extra_one(EXTRA_POD_UID),
    ) else {
        return Err(Denied::NoPodClaim);
    };
    if let Some(claim) = user.extra_one(EXTRA_NODE_NAME)
        && claim != node
    {
        return Err(Denied::NodeClaimMismatch {
            node: node.to_string(),
            claim: claim.to_string(),
        });
    }
    let pod = lookup(pod_name).ok_or_else(|| Denied::UnknownPod(pod_name.to_string()))?;
    if pod.namespace != sa.namespace {
        return Err(Denied::UnknownPod(pod_name.to_string()));
    }
    if pod.uid != pod_uid {
        return Err(Denied::PodUidMismatch(pod_name.to_string()));
    }
    let Some(ds_uid) = daemonset.uid else {
        return Err(Denied::NoAgentDaemonSet(daemonset.name.to_string()));
    };
    match &pod.controller {
        Some((n, u)) if n == daemonset.name && u == ds_uid => {}
        _ => return Err(Denied::NotAgentPod(pod_name.to_string())),
    }
    match pod.node.as_deref() {
        Some(n) if n == node => Ok(pod),
        other => Err(Denied::WrongNode {
            pod: pod_name.to_string(),
            node: node.to_string(),
            actual: other.unwrap_or("<unscheduled>").to_string(),
        }),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    pub(crate) use crate::runtime::token_review::tests::{FakeReviewer, agent_user};

    pub(crate) fn agent_pod(name: &str, uid: &str, node: &str) -> AgentPod {
        AgentPod {
            namespace: "mg".into(),
            name: name.into(),
            uid: uid.into(),
            node: Some(node.into()),
            controller: Some(("agent".into(), DS_UID.into())),
        }
    }

    /// The UID of the live agent DaemonSet in these tests.
    pub(crate) const DS_UID: &str = "ds-uid";

    fn sa() -> ServiceAccountRef {
        "mg:agent".parse().unwrap()
    }

    fn ds() -> AgentDaemonSet<'static> {
        AgentDaemonSet {
            name: "agent",
            uid: Some(DS_UID),
        }
    }

    #[test]
    fn authorization_rules() {
        let pods = [
            agent_pod("agent-a", "ua", "node-a"),
            agent_pod("agent-b", "ub", "node-b"),
            AgentPod {
                controller: Some(("other".into(), DS_UID.into())),
                ..agent_pod("imposter", "ui", "node-a")
            },
            // Names the agent DaemonSet, with another UID.
            AgentPod {
                controller: Some(("agent".into(), "forged-uid".into())),
                ..agent_pod("lookalike", "ul", "node-a")
            },
            // Owned, but not controlled (controller: false).
            AgentPod {
                controller: None,
                ..agent_pod("adopted", "ud", "node-a")
            },
            AgentPod {
                namespace: "elsewhere".into(),
                ..agent_pod("stray", "us", "node-a")
            },
        ];
        let lookup = |n: &str| pods.iter().find(|p| p.name == n).cloned();
        let ok = authorize(
            &agent_user("agent-a", "ua", Some("node-a")),
            "node-a",
            &sa(),
            &ds(),
            lookup,
        );
        assert_eq!(ok.unwrap().name, "agent-a");
        // Node B's agent reporting for node A.
        assert!(matches!(
            authorize(
                &agent_user("agent-b", "ub", None),
                "node-a",
                &sa(),
                &ds(),
                lookup
            ),
            Err(Denied::WrongNode { .. })
        ));
        assert!(matches!(
            authorize(
                &agent_user("agent-a", "ua", Some("node-b")),
                "node-a",
                &sa(),
                &ds(),
                lookup
            ),
            Err(Denied::NodeClaimMismatch { .. })
        ));
        assert_eq!(
            authorize(
                &agent_user("agent-a", "old", None),
                "node-a",
                &sa(),
                &ds(),
                lookup
            ),
            Err(Denied::PodUidMismatch("agent-a".into()))
        );
        assert_eq!(
            authorize(
                &agent_user("gone", "ug", None),
                "node-a",
                &sa(),
                &ds(),
                lookup
            ),
            Err(Denied::UnknownPod("gone".into()))
        );
        assert_eq!(
            authorize(
                &agent_user("imposter", "ui", None),
                "node-a",
                &sa(),
                &ds(),
                lookup
            ),
            Err(Denied::NotAgentPod("imposter".into()))
        );
        assert_eq!(
            authorize(
                &agent_user("stray", "us", None),
                "node-a",
                &sa(),
                &ds(),
                lookup
            ),
            Err(Denied::UnknownPod("stray".into()))
        );
        for name in ["lookalike", "adopted"] {
            let uid = pods.iter().find(|p| p.name == name).unwrap().uid.clone();
            assert_eq!(
                authorize(
                    &agent_user(name, &uid, None),
                    "node-a",
                    &sa(),
                    &ds(),
                    lookup
                ),
                Err(Denied::NotAgentPod(name.into())),
                "{name}"
            );
        }
        // The DaemonSet is not known: nobody is an agent.
        let unknown = AgentDaemonSet {
            name: "agent",
            uid: None,
        };
        assert_eq!(
            authorize(
                &agent_user("agent-a", "ua", None),
                "node-a",
                &sa(),
                &unknown,
                lookup
            ),
            Err(Denied::NoAgentDaemonSet("agent".into()))
        );
        let mut other_sa = agent_user("agent-a", "ua", None);
        other_sa.username = "system:serviceaccount:mg:default".into();
        assert!(matches!(
            authorize(&other_sa, "node-a", &sa(), &ds(), lookup),
            Err(Denied::NotAgentServiceAccount(_))
        ));
        let mut no_claim = agent_user("agent-a", "ua", None);
        no_claim.extra.clear();
        assert_eq!(
            authorize(&no_claim, "node-a", &sa(), &ds(), lookup),
            Err(Denied::NoPodClaim)
        );
    }

    #[test]
    fn only_the_controlling_daemonset_reference_counts() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "mg", "uid": "u", "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "x", "controller": false},
            ]},
            "spec": {"nodeName": "n", "containers": []},
        }))
        .unwrap();
        assert_eq!(AgentPod::from_pod(&pod).unwrap().controller, None);
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "mg", "uid": "u", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Foo", "name": "agent", "uid": "y"},
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "agent", "uid": "z", "controller": true},
            ]},
            "spec": {"nodeName": "n", "containers": []},
        }))
        .unwrap();
        assert_eq!(
            AgentPod::from_pod(&pod).unwrap().controller,
            Some(("agent".into(), "z".into()))
        );
    }
}
