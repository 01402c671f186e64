//! The admission decision: what to tell a caller who deletes or creates a
//! Secret or ConfigMap under a name that a node's kubelet may keep serving
//! from its cache, before the call is done.
//!
//! The kubelet rule this mirrors (the Watch strategy,
//! `pkg/kubelet/util/manager/watch_based_manager.go`): one cache item per
//! namespace/name, reference-counted by the pods registered on the node
//! (`objectCache.AddReference` / `DeleteReference`), dropped only when no
//! registered pod references the name; once `objectCache.Get` sees the
//! object is immutable it stops the item's reflector and
//! `objectCacheItem.restartReflectorIfNeeded` never restarts it. So:
//!
//! * deleting an **immutable** object while registered pods reference it
//!   leaves each of their nodes serving the deleted content, to new pods
//!   too, whatever is created under the name next;
//! * creating an object under a name whose previous object was immutable,
//!   while a pod registered before that object went away still references
//!   it, does not reach the pods of that pod's node: they keep getting the
//!   previous content. The new object's own `immutable` field does not
//!   matter: the item that is not watched is the old one.
//!
//! The caller of [`decide`] gives the call and what the controller's view
//! says of the name ([`NameView`], built by [`holders`] from the index);
//! the answer names nodes and pods only to a verified caller (the API
//! server, by its client certificate): anyone else who reaches the webhook
//! could ask about any name, so it gets counts and a pointer to the
//! authorized status API. The answer is a list of short warnings (each under the API server's
//! 256-rune truncation limit, `staging/src/k8s.io/apiserver/pkg/endpoints/
//! filters/warning.go`, `truncateItemRunes`), a denial, or nothing.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::sync::Arc;

use jiff::Timestamp;

use crate::index::ClusterIndex;
use crate::model::SourceRef;

/// What the webhook does with a call that creates a pin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Answer every call with "allowed" and no warning.
    Off,
    /// Allow, with warnings (the default).
    #[default]
    Warn,
    /// Refuse a create under a pinned name; a delete is still only warned
    /// about (deleting is also how a user cleans up).
    Deny,
}

/// The call under review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// `CREATE`.
    Create,
    /// `DELETE`.
    Delete,
}

impl Operation {
    /// Label value (`create`, `delete`).
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Create => "create",
            Operation::Delete => "delete",
        }
    }
}

/// One registered pod that keeps its node's cache item of a name alive.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Holder {
    /// The node.
    pub node: Arc<str>,
    /// The pod's name (same namespace as the object).
    pub pod: Arc<str>,
}

/// What the controller's view knows of a name at the moment of the call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameView {
    /// The registered pods referencing the name, sorted by node and pod
    /// (for a create: only those registered before the previous immutable
    /// object went away, see [`holders`]).
    pub holders: Vec<Holder>,
    /// The previous object under the name was immutable (it is still in
    /// the view, or the view saw an immutable object under the name go
    /// away while pods held it).
    pub previous_immutable: bool,
}

/// One call: its operation, the object, and whether the object in the
/// request is immutable (for a delete: the object being deleted).
#[derive(Debug, Clone, Copy)]
pub struct Call<'a> {
    /// Operation.
    pub operation: Operation,
    /// The object's kind, namespace and name.
    pub source: &'a SourceRef,
    /// `immutable: true` on the object in the request.
    pub immutable: bool,
    /// Remediation is enabled on this controller (the advice may say it
    /// will replace affected pods).
    pub remediation: bool,
    /// The caller proved to be the API server (a client certificate of the
    /// configured CA): warnings name nodes and pods. Otherwise they give
    /// counts only and point to `kubectl mountguard status`, whose API
    /// checks who asks.
    pub verified_caller: bool,
}

/// The webhook's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Allowed, nothing to say.
    Allow,
    /// Allowed, with warnings.
    Warn(Vec<String>),
    /// Refused.
    Deny {
        /// HTTP-style status code (the API server passes it on:
        /// `apiserver/pkg/admission/plugin/webhook/errors/statuserror.go`,
        /// `ToStatusErr`, keeps any code of 400 and above).
        code: u16,
        /// Machine-readable reason (`metav1.StatusReason`).
        reason: &'static str,
        /// The message the caller sees after "admission webhook ... denied
        /// the request: ".
        message: String,
    },
}

/// The registered pods referencing `r` ([`crate::PodModel::pins`]), sorted
/// by node and pod. With `registered_before`, only pods the kubelet
/// registered before that time (`status.startTime`, the first `SyncPod`):
/// a pod registered after the previous object went away, on a node where
/// no earlier pod held the name, started a new cache item of its own.
pub fn holders(
    index: &ClusterIndex,
    r: &SourceRef,
    registered_before: Option<Timestamp>,
) -> Vec<Holder> {
    let mut out: Vec<Holder> = holding_pods(index, r, registered_before)
        .filter_map(|p| {
            Some(Holder {
                node: p.node().cloned()?,
                pod: Arc::from(&*p.name),
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether any pod [`holders`] would list holds `r` (without building the
/// list).
pub fn is_held(index: &ClusterIndex, r: &SourceRef, registered_before: Option<Timestamp>) -> bool {
    holding_pods(index, r, registered_before).next().is_some()
}

fn holding_pods<'a>(
    index: &'a ClusterIndex,
    r: &'a SourceRef,
    registered_before: Option<Timestamp>,
) -> impl Iterator<Item = &'a crate::model::PodModel> + 'a {
    index
        .pods_referencing(r)
        .iter()
        .filter_map(|id| index.pod(*id).map(|p| &**p))
        .filter(move |p| p.pins(r) && p.node().is_some())
        .filter(move |p| registered_before.is_none_or(|t| p.synced_at.is_some_and(|s| s.get() < t)))
}

/// Nodes named in a warning.
const NAMED_NODES: usize = 3;
/// Pods named per node in a warning.
const NAMED_PODS: usize = 2;
/// The API server's per-warning limit.
const WARNING_RUNES: usize = 256;
/// Longest name shown whole (longer ones are cut, so that every warning
/// stays under the API server's 256-rune limit).
const NAME_CHARS: usize = 32;

/// Decides the answer to `call` given the view of its name.
pub fn decide(mode: Mode, call: &Call<'_>, view: &NameView) -> Answer {
    if mode == Mode::Off || view.holders.is_empty() {
        return Answer::Allow;
    }
    let r = call.source;
    let kind = r.kind.as_str();
    let object = format!("{kind} \"{}/{}\"", short(&r.namespace), short(&r.name));
    let (pods, nodes) = (view.holders.len(), by_node(&view.holders).len());
    match call.operation {
        // Only the object being deleted decides: a mutable object's item is
        // watched, so the kubelet follows its deletion and any re-creation.
        Operation::Delete if call.immutable => {
            let instead = if call.remediation {
                "instead: create the new content under a new name and point the workloads at it, \
                 or let mountguard's remediation replace the affected pods afterwards"
            } else {
                "instead: create the new content under a new name and point the workloads at it"
            };
            let head = format!(
                "immutable {object} is referenced by {} on {}",
                plural(pods, "pod"),
                plural(nodes, "node"),
            );
            Answer::Warn(vec![
                if call.verified_caller {
                    within_limit(head + ": ", |budget| node_list(&view.holders, budget))
                } else {
                    head + &status_pointer(r)
                },
                format!(
                    "the kubelet of each of those nodes keeps serving the deleted content, also to \
                     pods that start there after a new {kind} is created under this name, until \
                     no pod there references the name"
                ),
                instead.to_string(),
            ])
        }
        Operation::Delete => Answer::Allow,
        Operation::Create if view.previous_immutable => {
            let head = format!(
                "the previous immutable {object} is still cached on {}, held by {}",
                plural(nodes, "node"),
                plural(pods, "pod"),
            );
            let warnings = vec![
                if call.verified_caller {
                    within_limit(head + ": ", |budget| pod_list(&view.holders, budget))
                } else {
                    head + &status_pointer(r)
                },
                format!(
                    "pods on those nodes get the previous content under this name, not this \
                     object's, until every holding pod there is gone"
                ),
                format!(
                    "instead: create the new content under a new name and point the workloads at \
                     it, or delete the holding pods before creating this {kind}"
                ),
            ];
            match mode {
                Mode::Deny => Answer::Deny {
                    code: 409,
                    reason: "Conflict",
                    message: warnings.join("; "),
                },
                _ => Answer::Warn(warnings),
            }
        }
        Operation::Create => Answer::Allow,
    }
}

/// Where a caller the webhook could not verify finds the names it leaves
/// out: the status API answers only users who may read verdicts of the
/// namespace.
fn status_pointer(r: &SourceRef) -> String {
    format!(
        " (`kubectl mountguard status --namespace {} --all` lists them)",
        short(&r.namespace)
    )
}

/// `head` followed by the list `tail` renders within what is left of the
/// 256-rune limit.
fn within_limit(head: String, tail: impl FnOnce(usize) -> String) -> String {
    let budget = WARNING_RUNES.saturating_sub(head.chars().count());
    format!("{head}{}", tail(budget))
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `name`, cut to [`NAME_CHARS`] characters with `...` when longer.
fn short(name: &str) -> String {
    if name.chars().count() <= NAME_CHARS {
        return name.to_string();
    }
    let cut: String = name.chars().take(NAME_CHARS - 3).collect();
    format!("{cut}...")
}

/// Groups `holders` (sorted by node) by node.
fn by_node(holders: &[Holder]) -> Vec<(&str, Vec<&str>)> {
    let mut out: Vec<(&str, Vec<&str>)> = Vec::new();
    for h in holders {
        match out.last_mut() {
            Some((n, pods)) if *n == &*h.node => pods.push(&h.pod),
            _ => out.push((&h.node, vec![&h.pod])),
        }
    }
    out
}

/// `node-a, node-b, node-c and 2 more`, in at most `budget` runes.
fn node_list(holders: &[Holder], budget: usize) -> String {
    let nodes = by_node(holders);
    let candidates = (1..=NAMED_NODES.min(nodes.len())).rev().map(|named| {
        let mut s: Vec<String> = nodes.iter().take(named).map(|(n, _)| short(n)).collect();
        if nodes.len() > named {
            s.push(format!("and {} more", nodes.len() - named));
        }
        s.join(", ")
    });
    fitting(candidates, budget)
}

/// `node-a (pod-1, pod-2, 1 more); node-b (pod-3) and 2 more nodes`, in at
/// most `budget` runes: fewer nodes and pods are named when the names are
/// long.
fn pod_list(holders: &[Holder], budget: usize) -> String {
    let nodes = by_node(holders);
    let render = |named_nodes: usize, named_pods: usize| {
        let parts: Vec<String> = nodes
            .iter()
            .take(named_nodes)
            .map(|(n, pods)| {
                let mut p: Vec<String> = pods.iter().take(named_pods).map(|p| short(p)).collect();
                if pods.len() > named_pods {
                    p.push(format!("{} more", pods.len() - named_pods));
                }
                format!("{} ({})", short(n), p.join(", "))
            })
            .collect();
        let mut s = parts.join("; ");
        if nodes.len() > named_nodes {
            let more = nodes.len() - named_nodes;
            s.push_str(&format!(" and {}", plural(more, "more node")));
        }
        s
    };
    let most = NAMED_NODES.min(nodes.len());
    let candidates = (1..=most)
        .rev()
        .flat_map(|n| (1..=NAMED_PODS).rev().map(move |p| (n, p)))
        .map(|(n, p)| render(n, p));
    fitting(candidates, budget)
}

/// The first of `candidates` (longest first) within `budget` runes, else
/// the last one cut to the budget.
fn fitting(candidates: impl Iterator<Item = String>, budget: usize) -> String {
    let mut last = String::new();
    for c in candidates {
        if c.chars().count() <= budget {
            return c;
        }
        last = c;
    }
    last.chars().take(budget).collect()
}

#[cfg(test)]
mod tests;
