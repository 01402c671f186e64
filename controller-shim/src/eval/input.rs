//! What the evaluation task takes in ([`Input`]: watch deltas, accepted
//! reports, the admission webhook's questions) and what it hands to
//! remediation after each batch ([`EvaluationSnapshot`]).

use foldhash::HashMap;
use std::sync::Arc;

use jiff::Timestamp;
use mountguard_core::PodUid;
use mountguard_core::admission::{NameView, Operation};
use mountguard_core::model::{PodModel, SourceContent, SourceRef};
use mountguard_core::verdict::PodVerdicts;
use mountguard_inventory::NodeInventory;
use tokio::sync::oneshot;

use mountguard_core::remediation::inputs::{NodeSetKey, NodeSetObject, WorkloadObject};

/// An input of the evaluation task.
#[derive(Debug)]
pub enum Input {
    /// A pod added or changed.
    Pod(Box<PodModel>),
    /// A pod deleted (UID).
    PodDeleted(PodUid),
    /// A Secret or ConfigMap added or changed (content already hashed).
    Source(SourceRef, SourceContent),
    /// A Secret or ConfigMap deleted.
    SourceDeleted(SourceRef),
    /// A Node deleted.
    NodeDeleted(String),
    /// A NodeSet added or changed.
    NodeSet(NodeSetKey, Arc<NodeSetObject>),
    /// A NodeSet deleted.
    NodeSetDeleted(NodeSetKey),
    /// NodeSet watch `name` finished a list: every NodeSet it lists was
    /// sent before this (or the CRD is absent).
    NodeSetsSynced(String),
    /// A Deployment, ReplicaSet, StatefulSet or DaemonSet added or changed
    /// (`<kind>/<namespace>/<name>`).
    Workload(String, Arc<WorkloadObject>),
    /// A workload deleted.
    WorkloadDeleted(String),
    /// Workload watch `name` finished a list: every object it lists was
    /// sent before this.
    WorkloadsListed(String),
    /// An accepted inventory, with the report handler's in-flight permit
    /// (released once the inventory is in the index: parsed inventories
    /// waiting for the evaluation are bounded).
    Inventory(
        Box<NodeInventory>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ),
    /// A heartbeat (or a resent inventory) for the held generation.
    Heartbeat {
        /// Node.
        node: String,
        /// Generation.
        generation: u64,
        /// Scan time.
        scanned_at: Timestamp,
    },
    /// Forget every report and history (leadership changed).
    Reset,
    /// The admission webhook asks what the view knows of a name; answered
    /// as it arrives, after the inputs before it were applied.
    Admission(AdmissionQuery),
}

/// What remediation sees after each evaluation batch of the acting
/// replica.
#[derive(Debug, Clone, Default)]
pub struct EvaluationSnapshot {
    /// When the batch was evaluated.
    pub at: Option<Timestamp>,
    /// Pods with at least one verdict other than Fresh and Skipped.
    pub verdicts: Vec<PodVerdicts>,
    /// Every pod controlled by a NodeSet.
    pub nodeset_pods: Vec<Arc<PodModel>>,
    /// Every pod controlled by a ReplicaSet, StatefulSet or DaemonSet
    /// (only while workload kinds are watched: empty without workloads).
    pub workload_pods: Vec<Arc<PodModel>>,
    /// The watched workloads (Deployments, ReplicaSets, StatefulSets,
    /// DaemonSets of the kinds enabled).
    pub workloads: Vec<Arc<WorkloadObject>>,
    /// Every workload watch finished its first list before this snapshot
    /// (true when none is watched): `workloads` is complete, as
    /// `nodesets_synced` says of `nodesets`.
    pub workloads_synced: bool,
    /// When the inventory (or the latest heartbeat) of each node running
    /// one of `nodeset_pods` or `workload_pods` was scanned.
    pub scanned_at: HashMap<Arc<str>, Timestamp>,
    /// Every NodeSet (`slinky.slurm.net/v1beta1`), empty when the CRD is
    /// absent.
    pub nodesets: Vec<Arc<NodeSetObject>>,
    /// Every NodeSet watch finished its first list before this snapshot:
    /// `nodesets` is complete. Until then remediation reads, plans and
    /// writes nothing (an attempt record not listed yet would be taken for
    /// lost).
    pub nodesets_synced: bool,
}

/// The admission webhook's question to the evaluation task: what does the
/// view know of this name for this operation.
#[derive(Debug)]
pub struct AdmissionQuery {
    /// The object.
    pub source: SourceRef,
    /// The operation.
    pub operation: Operation,
    /// Where the answer goes.
    pub reply: oneshot::Sender<NameView>,
}
