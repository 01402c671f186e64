//! One edge per watched resource: its key, and each event converted into
//! an input of the evaluation (Secret and ConfigMap content hashed on
//! arrival, plaintext dropped).

use super::*;

/// Converts watch events of one resource into inputs.
pub(super) trait Edge<K>: Send + 'static {
    type Key: Hash + Eq + Clone + Send;
    fn key(&self, obj: &K) -> Option<Self::Key>;
    /// Converts and drops the object.
    fn apply(&mut self, obj: K) -> Option<Input>;
    fn delete(&mut self, key: Self::Key) -> Option<Input>;
    /// Sent in band after every object of a list of watch `name` (the
    /// evaluation marks its snapshots complete for the resource only from
    /// there on).
    fn listed(&self, _name: &str) -> Option<Input> {
        None
    }
}

pub(super) struct PodEdge {
    pub(super) interner: Interner,
}

impl Edge<Pod> for PodEdge {
    type Key = PodUid;
    fn key(&self, p: &Pod) -> Option<PodUid> {
        p.metadata.uid.as_deref().map(PodUid::new)
    }
    fn apply(&mut self, p: Pod) -> Option<Input> {
        let m = convert::pod(&mut self.interner, &p)?;
        Some(Input::Pod(Box::new(m)))
    }
    fn delete(&mut self, uid: PodUid) -> Option<Input> {
        Some(Input::PodDeleted(uid))
    }
}

/// How a Secret or ConfigMap becomes a source: its reference and its
/// hashed content (`convert::secret`, `convert::config_map`).
type ConvertSource<K> = fn(
    &mut Interner,
    &K,
) -> Option<(
    mountguard_core::SourceRef,
    mountguard_core::model::SourceContent,
)>;

/// Secrets and ConfigMaps: hashed on arrival into a source input.
pub(super) struct SourceEdge<K> {
    pub(super) interner: Interner,
    pub(super) kind: mountguard_core::SourceKind,
    pub(super) convert: ConvertSource<K>,
}

impl<K> SourceEdge<K> {
    pub(super) fn new(kind: mountguard_core::SourceKind, convert: ConvertSource<K>) -> Self {
        Self {
            interner: Interner::default(),
            kind,
            convert,
        }
    }
}

impl<K: kube::Resource + Send + 'static> Edge<K> for SourceEdge<K> {
    type Key = mountguard_core::SourceRef;
    fn key(&self, o: &K) -> Option<mountguard_core::SourceRef> {
        let meta = o.meta();
        Some(mountguard_core::SourceRef::new(
            self.kind,
            Arc::from(meta.namespace.as_deref()?),
            Arc::from(meta.name.as_deref()?),
        ))
    }
    fn apply(&mut self, o: K) -> Option<Input> {
        let (r, content) = (self.convert)(&mut self.interner, &o)?;
        drop(o);
        Some(Input::Source(r, content))
    }
    fn delete(&mut self, r: mountguard_core::SourceRef) -> Option<Input> {
        Some(Input::SourceDeleted(r))
    }
}

pub(super) struct NodeEdge;

impl Edge<Node> for NodeEdge {
    type Key = String;
    fn key(&self, n: &Node) -> Option<String> {
        n.metadata.name.clone()
    }
    fn apply(&mut self, _n: Node) -> Option<Input> {
        None
    }
    fn delete(&mut self, n: String) -> Option<Input> {
        Some(Input::NodeDeleted(n))
    }
}

/// NodeSets: kept as `NodeSetObject`s (the model remediation reads,
/// UID, attempts), the rest of the object dropped at once.
pub(super) struct NodeSetEdge;

impl Edge<DynamicObject> for NodeSetEdge {
    type Key = NodeSetKey;
    fn key(&self, o: &DynamicObject) -> Option<NodeSetKey> {
        convert::nodeset_key(o)
    }
    fn apply(&mut self, o: DynamicObject) -> Option<Input> {
        let k = self.key(&o)?;
        Some(Input::NodeSet(k, Arc::new(convert::nodeset(&o)?)))
    }
    fn delete(&mut self, k: NodeSetKey) -> Option<Input> {
        Some(Input::NodeSetDeleted(k))
    }
}

/// Deployments, ReplicaSets, StatefulSets, DaemonSets: kept as
/// [`WorkloadObject`]s (annotations read, status, owner), the rest of the
/// object dropped at once.
pub(super) struct WorkloadEdge<K> {
    pub(super) kind: WorkloadKind,
    pub(super) convert: fn(&K) -> Option<WorkloadObject>,
}

impl<K: kube::Resource + Send + 'static> Edge<K> for WorkloadEdge<K> {
    type Key = String;
    fn key(&self, o: &K) -> Option<String> {
        let meta = o.meta();
        Some(format!(
            "{}/{}/{}",
            self.kind.lower(),
            meta.namespace.as_deref()?,
            meta.name.as_deref()?
        ))
    }
    fn apply(&mut self, o: K) -> Option<Input> {
        let w = (self.convert)(&o)?;
        Some(Input::Workload(w.key()?, Arc::new(w)))
    }
    fn delete(&mut self, k: String) -> Option<Input> {
        Some(Input::WorkloadDeleted(k))
    }
    fn listed(&self, name: &str) -> Option<Input> {
        Some(Input::WorkloadsListed(name.to_string()))
    }
}

/// The agents' registry: the agent pods (`Edge<Pod>`) and the agent
/// DaemonSet (`Edge<DaemonSet>`), whose UID is what an agent pod's
/// controlling ownerReference must carry.
pub(super) struct AgentEdge {
    pub(super) agents: Arc<AgentPods>,
    pub(super) daemonset: String,
}

impl Edge<Pod> for AgentEdge {
    type Key = String;
    fn key(&self, p: &Pod) -> Option<String> {
        p.metadata.name.clone()
    }
    fn apply(&mut self, p: Pod) -> Option<Input> {
        match AgentPod::from_pod(&p) {
            Some(a) if a.controlled_by_name(&self.daemonset) => self.agents.apply(a),
            Some(a) => self.agents.delete(&a.name),
            None => {}
        }
        None
    }
    fn delete(&mut self, name: String) -> Option<Input> {
        self.agents.delete(&name);
        None
    }
}

impl Edge<DaemonSet> for AgentEdge {
    type Key = String;
    fn key(&self, d: &DaemonSet) -> Option<String> {
        d.metadata.name.clone()
    }
    fn apply(&mut self, d: DaemonSet) -> Option<Input> {
        if d.metadata.name.as_deref() == Some(self.daemonset.as_str()) {
            self.agents.set_daemonset_uid(d.metadata.uid.clone());
        }
        None
    }
    fn delete(&mut self, name: String) -> Option<Input> {
        if name == self.daemonset {
            self.agents.set_daemonset_uid(None);
        }
        None
    }
}
