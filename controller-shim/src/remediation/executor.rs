//! The remediation executor: thin I/O around
//! [`plan`](mountguard_core::remediation::plan::plan) and
//! [`step`](mountguard_core::remediation::machine::step).
//!
//! After every evaluation snapshot (and on a timer) the acting replica,
//! once every NodeSet was listed (`nodesets_synced`) and while it holds the
//! Lease with a margin (checked before each write: a deposed leader stops
//! writing before another can take over):
//! 1. on first run (and after winning leadership) reconciles the attempts
//!    persisted in NodeSet annotations with every Slurm node drained with a
//!    `mountguard:` reason ([`mountguard_core::remediation::recovery`]); a NodeSet listed later has
//!    its record read (adopted) before anything is planned or persisted for
//!    it, and a record that does not parse is never overwritten;
//! 2. plans new attempts; dry-run and pinned notices become Events;
//! 3. steps every open attempt with fresh observations (Slurm node, pod
//!    UID, the replacement's verdicts, results of its last writes) and
//!    performs the actions in order: a failed Persist stops the step, so no
//!    external write happens without a record of it;
//! 4. every [`SWEEP`], releases `mountguard:` drains that no known open
//!    attempt owns (from a complete view only);
//! 5. updates the remediation metrics.
//!
//! Before its plan, every round also reads (never writes) the Slurm node of
//! each NodeSet pod whose `slurm.key` verdict is not Fresh, so that verdict
//! can say what Slurm shows (`executor/slurm_view.rs`).
//!
//! This file holds the executor's state, its task and the round above; the
//! round's parts add methods in `executor/`: `observe.rs` (the token
//! Secret, the Lease fence, Slurm nodes, holds, NodeSet models), `plan.rs`
//! (recovery, the round's plan and notices, the sweep), `step.rs` (each
//! open attempt's observations into `step`), `perform.rs` (the actions,
//! Persist first) and `slurm_view.rs` (the Slurm nodes of stale workers,
//! read for their verdicts). Its settings are `settings.rs`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Secret};
use kube::api::{Api, DynamicObject, Patch};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use tokio::sync::watch as tokio_watch;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use mountguard_core::PodUid;
use mountguard_core::remediation::inputs::{
    NodeSetModel, Workloads, candidates, cordon_of, group_drained, group_members, group_old_gone,
    new_pod_check, nodeset_infos, slurmd_started_at, workload_key,
};
use mountguard_core::remediation::machine::{
    Action, Attempt, AttemptsRecord, EventReason, EvictionResult, MachineConfig, NodeCordon,
    Observations, Phase, SlurmObservation, WriteResult, step,
};
use mountguard_core::remediation::plan::{Candidate, Mode, PlanConfig, plan, summarize};
use mountguard_core::remediation::recovery::{View, orphan_cordons, recover};
use mountguard_core::remediation::{ATTEMPTS_ANNOTATION, CORDON_ANNOTATION, HOLD_TAINT_KEY};

use crate::Error;
use crate::api::store::ReadModel;
use crate::edge::watch::nodeset_resource;
use crate::eval::EvaluationSnapshot;
use crate::leader::LeaderConfig;
use crate::remediation::metrics::RemediationMetrics;
use crate::remediation::settings::{Prepared, RemediationSettings, SlurmCredential};
use crate::remediation::slurm::{SharedSecret, SlurmClient, SlurmError};
use crate::runtime::shutdown::{Shutdown, ticker};
use crate::state::Shared;
use mountguard_core::remediation::workload::{
    AnnotationNotices, AnnotationProblem, WorkloadKind, WorkloadRef,
};

/// How often open attempts are stepped without a new snapshot.
pub const TICK: Duration = Duration::from_secs(2);
/// How often the token Secret is re-read (and at once after a 401).
const TOKEN_REFRESH: SignedDuration = SignedDuration::from_secs(30);
/// Closed attempts kept in memory.
const KEEP_CLOSED: usize = 100;
/// How often `mountguard:` drains without a known open attempt are looked
/// for (besides recovery): a drain whose release failed or was never
/// requested is released within this.
pub const SWEEP: SignedDuration = SignedDuration::from_secs(30);

/// The Lease that fences writes (leader election on).
struct Fence {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// Writes may start before this (cached from the last read).
    valid_until: Option<Timestamp>,
    /// `leaseTransitions` when the Lease was last seen ours.
    transitions: Option<i32>,
}

/// What the Lease says about writing now.
enum FenceState {
    /// Held with the margin left.
    Held,
    /// Not confirmed now (expiring, not renewed yet, unreadable): write
    /// nothing this time, keep the state.
    Unsure,
    /// Someone else holds it, or it changed hands since: forget everything
    /// and recover again once held.
    Lost,
}

/// The running executor's state.
pub struct Executor {
    client: kube::Client,
    evict_client: kube::Client,
    shared: Arc<Shared>,
    /// The executor's metric families.
    metrics: RemediationMetrics,
    /// The status API's store (attempts, the Slurm nodes of stale workers).
    store: ReadModel,
    mode: Mode,
    plan_cfg: PlanConfig,
    machine_cfg: MachineConfig,
    /// slurmrestd (`None`: workloads only).
    slurm: Option<SlurmClient>,
    secret: Option<SlurmCredential>,
    secret_value: SharedSecret,
    secret_read_at: Option<Timestamp>,
    recorder: Recorder,
    attempts: BTreeMap<String, Attempt>,
    last_write: HashMap<String, WriteResult>,
    last_eviction: HashMap<String, EvictionResult>,
    /// Dry-run evictions' answers, for the next step.
    last_eviction_check: HashMap<String, EvictionResult>,
    fresh_since: HashMap<String, Timestamp>,
    notified: HashSet<(String, &'static str)>,
    /// Bad workload annotations told (one Warning Event per value).
    annotation_notices: AnnotationNotices,
    recovered: bool,
    /// NodeSets (`namespace/name`) whose record was read: the only ones
    /// persisted to.
    read: HashSet<String>,
    /// NodeSets whose record did not parse (never overwritten; no orphan
    /// is released while any is listed here).
    unreadable: HashMap<String, String>,
    last_sweep: Option<Timestamp>,
    fence: Option<Fence>,
    /// The Lease was found lost during this round.
    lost: bool,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("mode", &self.mode)
            .field("attempts", &self.attempts.len())
            .finish()
    }
}

/// Starts the executor task (remediation `dry-run` or `on`); writes are
/// fenced by the Lease of `leader` when leader election is on.
#[allow(clippy::too_many_arguments)]
pub async fn spawn(
    prepared: Prepared,
    kubeconfig: Option<&std::path::Path>,
    leader: &LeaderConfig,
    client: kube::Client,
    shared: Arc<Shared>,
    metrics: RemediationMetrics,
    store: ReadModel,
    snapshots: tokio_watch::Receiver<Arc<EvaluationSnapshot>>,
    shutdown: Shutdown,
) -> Result<JoinHandle<()>, Error> {
    let Prepared {
        settings:
            RemediationSettings {
                mode,
                plan: plan_cfg,
                machine: machine_cfg,
                slurm: slurm_settings,
            },
        secret_value,
        slurm,
    } = prepared;
    let url = slurm_settings.as_ref().map(|s| s.url.clone());
    info!(?mode, slurmrestd = ?url, workloads = ?plan_cfg.workload_kinds, "remediation executor started");
    let evict_client = client_without_retry(kubeconfig).await?;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: crate::runtime::events::REPORTING_COMPONENT.into(),
            instance: leader.pod_name.clone(),
        },
    );
    let client_for_fence = client.clone();
    store.write().unwrap().slurm.enabled = slurm.is_some();
    let ex = Executor {
        client,
        evict_client,
        shared,
        metrics,
        store,
        mode,
        plan_cfg,
        machine_cfg,
        slurm,
        secret: slurm_settings.map(|s| s.credential),
        secret_value,
        secret_read_at: None,
        recorder,
        attempts: BTreeMap::new(),
        last_write: HashMap::new(),
        last_eviction: HashMap::new(),
        last_eviction_check: HashMap::new(),
        fresh_since: HashMap::new(),
        notified: HashSet::new(),
        annotation_notices: AnnotationNotices::default(),
        recovered: false,
        read: HashSet::new(),
        unreadable: HashMap::new(),
        last_sweep: None,
        lost: false,
        fence: match (&leader.pod_name, &leader.pod_namespace) {
            (Some(identity), Some(ns)) if leader.enabled => Some(Fence {
                api: Api::namespaced(client_for_fence, ns),
                name: leader.lease_name.clone(),
                identity: identity.clone(),
                valid_until: None,
                transitions: None,
            }),
            _ => None,
        },
    };
    Ok(tokio::spawn(run(ex, snapshots, shutdown)))
}

/// A client whose requests are never retried by kube itself: an eviction
/// refused with 429 is retried by the state machine, later.
async fn client_without_retry(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client, Error> {
    let mut config = crate::runtime::kube::kube_config(kubeconfig, None).await?;
    config.default_retry = false;
    crate::runtime::kube::kube_client(config)
}

async fn run(
    mut ex: Executor,
    mut snapshots: tokio_watch::Receiver<Arc<EvaluationSnapshot>>,
    mut shutdown: Shutdown,
) {
    let mut tick = ticker(TICK);
    loop {
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = tick.tick() => {}
            r = snapshots.changed() => if r.is_err() { return },
        }
        let snap = snapshots.borrow_and_update().clone();
        tokio::select! {
            _ = shutdown.wait() => return,
            _ = ex.round(&snap, Timestamp::now()) => {}
        }
    }
}

impl Executor {
    /// Forgets every attempt (not acting, or the Lease changed hands):
    /// recovery reads the records again once acting.
    fn pause(&mut self, why: &str) {
        if self.recovered {
            info!(why, "remediation paused");
        }
        self.recovered = false;
        self.attempts.clear();
        self.read.clear();
        self.unreadable.clear();
        self.last_write.clear();
        self.last_eviction.clear();
        self.last_eviction_check.clear();
        self.fresh_since.clear();
        let mut store = self.store.write().unwrap();
        store.attempts.clear();
        store.slurm.nodes.clear();
    }

    /// Reads the records of NodeSets listed since recovery (or whose
    /// record did not parse before), before anything is planned or
    /// persisted for them.
    fn adopt(&mut self, snap: &EvaluationSnapshot) {
        for (key, record) in self.records(snap) {
            if self.read.contains(&key) {
                continue;
            }
            let view = View::read([(key.clone(), record)], true);
            if let Some((_, e)) = view.unreadable.first() {
                if self.unreadable.insert(key.clone(), e.clone()).is_none() {
                    warn!(owner = %key, error = %e, "unreadable remediation attempts: nothing is written to this object and no orphan drain is released until the annotation is fixed or removed");
                }
                continue;
            }
            self.unreadable.remove(&key);
            for a in view.attempts {
                if !self.attempts.contains_key(&a.id) {
                    info!(owner = %key, attempt = %a.id, phase = a.phase.name(), "remediation attempt read from an object listed after recovery");
                    self.attempts.insert(a.id.clone(), a);
                }
            }
            self.read.insert(key);
        }
    }

    /// The attempt records of the snapshot's owners: NodeSets
    /// (`namespace/name`, only with slurmrestd) and workloads
    /// (`kind/namespace/name`).
    fn records<'s>(
        &self,
        snap: &'s EvaluationSnapshot,
    ) -> impl Iterator<Item = (String, Option<&'s str>)> + use<'s> {
        let nodesets = snap
            .nodesets
            .iter()
            .filter(|_| self.slurm.is_some())
            .map(|ns| (ns.key().to_string(), ns.attempts.as_deref()));
        let workloads = snap
            .workloads
            .iter()
            .filter_map(|w| Some((w.key()?, w.attempts.as_deref())));
        nodesets.chain(workloads).collect::<Vec<_>>().into_iter()
    }

    async fn round(&mut self, snap: &EvaluationSnapshot, now: Timestamp) {
        if !self.shared.is_acting() {
            self.pause("not acting");
            return;
        }
        if !self.shared.is_ready() || snap.at.is_none() {
            return;
        }
        if !snap.nodesets_synced || !snap.workloads_synced {
            debug!("NodeSets or workloads not listed yet: remediation waits");
            return;
        }
        self.lost = false;
        match self.fence_state().await {
            FenceState::Held => {}
            FenceState::Unsure => return,
            FenceState::Lost => {
                self.pause("the Lease is held by another replica");
                return;
            }
        }
        self.refresh_secret(now, false).await;
        self.refresh_slurm_view(snap, now).await;
        if !self.recovered && !self.recover(snap, now).await {
            if self.lost {
                self.pause("the Lease was lost during recovery");
            }
            return;
        }
        self.adopt(snap);
        let workloads = Workloads::new(&snap.workloads);
        let cands = self.plan_round(snap, &workloads, now).await;
        if !self.step_open(snap, &workloads, now).await {
            return;
        }
        if self
            .last_sweep
            .is_none_or(|t| now.duration_since(t) >= SWEEP)
        {
            self.sweep(now).await;
            if self.lost {
                self.pause("the Lease was lost");
                return;
            }
        }
        self.prune();
        let all: Vec<Attempt> = self.attempts.values().cloned().collect();
        self.store.write().unwrap().attempts = all
            .iter()
            .map(crate::api::store::AttemptItem::from_attempt)
            .collect();
        let s = summarize(&all, &cands, now);
        let m = &self.metrics;
        m.remediation_open_attempts.set(s.open as i64);
        m.remediation_oldest_open_attempt_age
            .set(s.oldest_open_age_seconds);
        m.slurm_nodes_drained.set(s.nodes_drained as i64);
        m.remediation_failed.set(s.failed_kept_drained as i64);
        for (kind, n) in &s.failed_unresolved {
            m.remediation_failed_unresolved
                .with_label_values(&[kind])
                .set(*n as i64);
        }
    }

    fn prune(&mut self) {
        let mut closed: Vec<(Timestamp, String)> = self
            .attempts
            .values()
            .filter(|a| !a.is_open())
            .map(|a| (a.phase_since, a.id.clone()))
            .collect();
        if closed.len() <= KEEP_CLOSED {
            return;
        }
        closed.sort();
        for (_, id) in &closed[..closed.len() - KEEP_CLOSED] {
            self.attempts.remove(id);
            self.fresh_since.remove(id);
        }
    }
}

/// The object an attempt or notice belongs to, for its Events.
#[derive(Debug, Clone, Copy)]
enum Owner<'a> {
    /// A NodeSet (by name).
    NodeSet(&'a str),
    /// A workload.
    Workload(&'a WorkloadRef),
}

/// The key of the record attempt `a` is persisted in: `namespace/nodeset`
/// for a NodeSet pod's, `kind/namespace/name` for a workload pod's.
fn owner_key(a: &Attempt) -> String {
    match &a.workload {
        Some(w) => workload_key(&a.namespace, w),
        None => format!("{}/{}", a.namespace, a.nodeset),
    }
}

/// The key of the record a candidate's attempt would be persisted in.
fn candidate_owner_key(c: &Candidate) -> String {
    match (&c.workload, &c.nodeset) {
        (Some(w), _) => workload_key(&c.namespace, w),
        (None, Some(n)) => format!("{}/{n}", c.namespace),
        (None, None) => String::new(),
    }
}

mod observe;
mod perform;
mod plan;
mod slurm_view;
mod step;
