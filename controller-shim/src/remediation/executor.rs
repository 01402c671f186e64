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
    IntOrString, NodeSetModel, candidates, cordon_of, group_old_gone, new_pod_check, nodeset_infos,
    slurmd_started_at,
};
use mountguard_core::remediation::machine::{
    Action, Attempt, AttemptsRecord, EventReason, EvictionResult, MachineConfig, NodeCordon,
    Observations, Phase, SlurmObservation, WriteResult, step,
};
use mountguard_core::remediation::plan::{Candidate, Mode, PlanConfig, plan, summarize};
use mountguard_core::remediation::recovery::{View, orphan_cordons, recover};
use mountguard_core::remediation::{
    ATTEMPTS_ANNOTATION, CORDON_ANNOTATION, HOLD_TAINT_KEY, REMEDIATE_ANNOTATION,
    REMEDIATE_ON_ANNOTATION,
};

use crate::Error;
use crate::edge::watch::nodeset_resource;
use crate::edge::workloads::{Workloads, workload_key};
use crate::eval::EvaluationSnapshot;
use crate::leader::LeaderConfig;
use crate::remediation::slurm::{
    JwtMinter, SecretToken, SharedSecret, SlurmClient, SlurmError, TokenSource,
};
use crate::runtime::shutdown::Shutdown;
use crate::state::Shared;
use mountguard_core::remediation::workload::{
    AnnotationNotices, AnnotationProblem, WorkloadKind, WorkloadRef,
};

/// How often open attempts are stepped without a new snapshot.
pub const TICK: Duration = Duration::from_secs(2);
/// How often the token Secret is re-read (and at once after a 401).
const TOKEN_REFRESH: SignedDuration = SignedDuration::from_secs(30);
/// Lifetime of minted tokens.
const MINTED_TTL: Duration = Duration::from_secs(300);
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

/// Remediation's settings (`--remediation dry-run` or `on`), checked from
/// the flags by the one conversion
/// ([`Settings::try_from`](crate::settings::Settings)).
#[derive(Debug, Clone, PartialEq)]
pub struct RemediationSettings {
    /// The mode.
    pub mode: Mode,
    /// The planner's configuration (delay, budgets).
    pub plan: PlanConfig,
    /// The state machine's configuration (timeouts, failure policy).
    pub machine: MachineConfig,
    /// slurmrestd, for NodeSets (`None`: workloads only; no NodeSet is
    /// remediated and no NodeSet record is read).
    pub slurm: Option<SlurmSettings>,
}

/// How remediation reaches slurmrestd.
#[derive(Debug, Clone, PartialEq)]
pub struct SlurmSettings {
    /// slurmrestd base URL.
    pub url: String,
    /// The CA bundle (PEM bytes, read from `--slurmrestd-ca-file`) trusted
    /// for slurmrestd; `None`: the system roots.
    pub ca: Option<Vec<u8>>,
    /// Where the slurmrestd credential is read from.
    pub credential: SlurmCredential,
    /// Slurm user of minted tokens.
    pub user: String,
}

/// `<namespace>/<name>` of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectName {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::str::FromStr for ObjectName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self {
                    namespace: ns.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(format!("{s:?} is not <namespace>/<name>")),
        }
    }
}

/// The Secret holding the slurmrestd credential.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SlurmCredential {
    /// A token, under this key.
    Token(ObjectName, String),
    /// `jwt.key`, to mint short-lived HS256 tokens.
    JwtKey(ObjectName),
}

/// What remediation starts with, built from its settings before the
/// controller binds a socket or calls the API: the settings and the
/// slurmrestd client (its URL and CA checked; no request is made).
pub struct Prepared {
    settings: RemediationSettings,
    secret_value: SharedSecret,
    slurm: Option<SlurmClient>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("mode", &self.settings.mode)
            .field("url", &self.settings.slurm.as_ref().map(|s| &s.url))
            .finish_non_exhaustive()
    }
}

impl Prepared {
    /// Builds the slurmrestd client of `settings`.
    pub fn new(settings: RemediationSettings) -> Result<Self, Error> {
        let secret_value = SharedSecret::default();
        let slurm = match &settings.slurm {
            None => None,
            Some(s) => {
                let token: Arc<dyn TokenSource> = match &s.credential {
                    SlurmCredential::Token(..) => Arc::new(SecretToken {
                        value: secret_value.clone(),
                    }),
                    SlurmCredential::JwtKey(_) => Arc::new(JwtMinter {
                        key: secret_value.clone(),
                        user: s.user.clone(),
                        ttl: MINTED_TTL,
                    }),
                };
                let client =
                    SlurmClient::new(&s.url, s.ca.as_deref(), token, Duration::from_secs(10))
                        .map_err(|e| Error::Config(e.to_string()))?;
                Some(client)
            }
        };
        Ok(Self {
            settings,
            secret_value,
            slurm,
        })
    }

    /// The settings it was built from.
    pub fn settings(&self) -> &RemediationSettings {
        &self.settings
    }
}

/// Starts the executor task (remediation `dry-run` or `on`); writes are
/// fenced by the Lease of `leader` when leader election is on.
pub async fn spawn(
    prepared: Prepared,
    kubeconfig: Option<&std::path::Path>,
    leader: &LeaderConfig,
    client: kube::Client,
    shared: Arc<Shared>,
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
    let ex = Executor {
        client,
        evict_client,
        shared,
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
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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

fn slurm_obs(r: &Result<crate::remediation::slurm::SlurmNode, SlurmError>) -> SlurmObservation {
    match r {
        Ok(n) => SlurmObservation::Node(n.to_state()),
        Err(SlurmError::NotFound { .. }) => SlurmObservation::NotFound,
        Err(e) => SlurmObservation::Error {
            transient: e.is_transient(),
            message: e.to_string(),
        },
    }
}

impl Executor {
    async fn refresh_secret(&mut self, now: Timestamp, force: bool) {
        let due = force
            || self
                .secret_read_at
                .is_none_or(|t| now.duration_since(t) >= TOKEN_REFRESH);
        if !due {
            return;
        }
        let (obj, key) = match &self.secret {
            None => return,
            Some(SlurmCredential::Token(o, k)) => (o, k.as_str()),
            Some(SlurmCredential::JwtKey(o)) => (o, "jwt.key"),
        };
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &obj.namespace);
        match api.get_opt(&obj.name).await {
            Ok(Some(s)) => {
                let v = s
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .map(|b| b.0.clone());
                if v.is_none() {
                    warn!(secret = %format!("{}/{}", obj.namespace, obj.name), key, "the Slurm token Secret has no such key");
                }
                self.secret_value.set(v);
                self.secret_read_at = Some(now);
            }
            Ok(None) => {
                warn!(secret = %format!("{}/{}", obj.namespace, obj.name), "the Slurm token Secret does not exist");
                self.secret_value.set(None);
                self.secret_read_at = Some(now);
            }
            Err(e) => {
                self.shared.metrics.api_error("get_secret");
                warn!(error = %e, "reading the Slurm token Secret failed");
            }
        }
    }

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
        self.shared.verdicts.write().unwrap().attempts.clear();
    }

    /// Whether the Lease allows a write to start now (always, without
    /// leader election). Read again once the cached validity ran out.
    ///
    /// "Now" is the clock read here, never the round's time: a round's
    /// time was read before its reads of the API and slurmrestd, which can
    /// take long, and a process can be stopped between two steps (a
    /// frozen container, a starved node); the Lease may have been taken
    /// meanwhile by a replica that then acted on the same record.
    async fn fence_state(&mut self) -> FenceState {
        let acting = self.shared.is_acting();
        let Some(f) = self.fence.as_mut() else {
            return FenceState::Held;
        };
        if !acting {
            // The leader task saw the Lease lost already.
            f.valid_until = None;
            f.transitions = None;
            return FenceState::Lost;
        }
        let now = Timestamp::now();
        if f.valid_until.is_some_and(|t| now < t) {
            return FenceState::Held;
        }
        f.valid_until = None;
        let lease = match tokio::time::timeout(Duration::from_secs(5), f.api.get_opt(&f.name)).await
        {
            Ok(Ok(Some(l))) => l,
            Ok(Ok(None)) => return FenceState::Lost,
            Ok(Err(e)) => {
                self.shared.metrics.api_error("get_lease");
                debug!(error = %e, "reading the Lease failed; no remediation write until it is confirmed");
                return FenceState::Unsure;
            }
            Err(_) => {
                self.shared.metrics.api_error("get_lease");
                debug!("reading the Lease timed out; no remediation write until it is confirmed");
                return FenceState::Unsure;
            }
        };
        let spec = lease.spec.unwrap_or_default();
        let margin = SignedDuration::from_secs(crate::leader::LEASE_GRACE_SECS as i64);
        match crate::leader::lease_valid_until(&spec, &f.identity, margin) {
            None => {
                f.transitions = None;
                FenceState::Lost
            }
            Some(_) if f.transitions.is_some() && f.transitions != spec.lease_transitions => {
                // Lost and taken again since: another leader may have acted.
                f.transitions = None;
                FenceState::Lost
            }
            Some(t) if now < t => {
                f.valid_until = Some(t);
                f.transitions = spec.lease_transitions;
                FenceState::Held
            }
            Some(_) => {
                debug!("the Lease is not renewed or about to expire; no remediation write now");
                FenceState::Unsure
            }
        }
    }

    /// Checks the fence before a write: false means do not write (and, when
    /// the Lease is lost, the round stops and everything is forgotten).
    async fn may_write(&mut self) -> bool {
        match self.fence_state().await {
            FenceState::Held => true,
            FenceState::Unsure => false,
            FenceState::Lost => {
                self.lost = true;
                false
            }
        }
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
            .filter_map(|ns| Some((nodeset_key(ns)?, attempts_annotation(ns))));
        let workloads = snap
            .workloads
            .iter()
            .filter_map(|w| Some((w.key()?, w.attempts.as_deref())));
        nodesets.chain(workloads).collect::<Vec<_>>().into_iter()
    }

    /// Releases `mountguard:` drains that no known open attempt owns.
    async fn sweep(&mut self, now: Timestamp) {
        self.last_sweep = Some(now);
        if !self.unreadable.is_empty() {
            debug!("orphan sweep skipped: some attempt records are unreadable");
            return;
        }
        let Some(slurm) = self.slurm.clone() else {
            return;
        };
        let nodes = match slurm.nodes().await {
            Ok(n) => n,
            Err(e) => {
                self.shared.metrics.api_error("slurm_list_nodes");
                debug!(error = %e, "orphan sweep: cannot list Slurm nodes");
                return;
            }
        };
        let states: Vec<(String, mountguard_core::remediation::SlurmNodeState)> = nodes
            .iter()
            .map(|n| (n.name.clone(), n.to_state()))
            .collect();
        let known: Vec<Attempt> = self.attempts.values().cloned().collect();
        for rel in recover(&known, &states, true).release {
            if self.mode != Mode::On {
                info!(node = %rel.node, reason = %rel.reason, "dry-run: would release a mountguard drain without a live attempt");
                continue;
            }
            if !self.may_write().await {
                return;
            }
            match slurm.release_if_reason(&rel.node, &rel.reason).await {
                Ok(true) => {
                    info!(node = %rel.node, reason = %rel.reason, "released a mountguard drain without a live attempt")
                }
                Ok(false) => {}
                Err(e) => {
                    self.shared.metrics.api_error("slurm_undrain");
                    warn!(node = %rel.node, error = %e, "releasing an orphan mountguard drain failed; retrying at the next sweep");
                }
            }
        }
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
        if !self.recovered && !self.recover(snap, now).await {
            if self.lost {
                self.pause("the Lease was lost during recovery");
            }
            return;
        }
        self.adopt(snap);
        // Plan (only for NodeSets whose record was read: a new attempt is
        // persisted into that record).
        let attempts: Vec<Attempt> = self.attempts.values().cloned().collect();
        let workloads = Workloads::new(&snap.workloads);
        let cands: Vec<Candidate> = candidates(&snap.verdicts, |p| workloads.of_pod(p))
            .into_iter()
            .filter(|c| self.read.contains(&candidate_owner_key(c)))
            .collect();
        let nodesets = match self.slurm {
            Some(_) => nodeset_infos(&nodeset_models(snap), &snap.nodeset_pods, &self.attempts),
            None => Vec::new(),
        };
        let infos = workloads.infos();
        for bad in self
            .annotation_notices
            .news(&infos, &self.plan_cfg.workload_kinds)
        {
            warn!(namespace = %bad.namespace, workload = %bad.workload, message = %bad.message, "workload annotation not understood; its pods are not remediated");
            if !self.workload_event(snap, &bad).await {
                self.annotation_notices.untold(&bad);
            }
        }
        let p = plan(&cands, &nodesets, &infos, &attempts, now, &self.plan_cfg);
        for (pod, why) in &p.waiting {
            debug!(pod, why, "remediation waits");
        }
        self.shared
            .metrics
            .remediation_blocked
            .with_label_values(&["pinned"])
            .set(p.blocked.len() as i64);
        for n in p.dry_run.iter().chain(p.blocked.iter()) {
            if !self.notified.insert((n.uid.clone(), n.reason.as_str())) {
                continue;
            }
            info!(pod = %format!("{}/{}", n.namespace, n.pod), reason = n.reason.as_str(), message = %n.message, "remediation notice");
            if n.reason == EventReason::RemediationDryRun {
                self.shared
                    .metrics
                    .remediation_attempts
                    .with_label_values(&["Pending", "dry_run"])
                    .inc();
            }
            let owner = match &n.workload {
                Some(w) => Owner::Workload(w),
                None => Owner::NodeSet(&n.nodeset),
            };
            let published = self
                .event(
                    snap,
                    &n.namespace,
                    &n.pod,
                    &n.uid,
                    owner,
                    n.reason,
                    &n.message,
                )
                .await;
            if !published {
                // Told nobody: try again next round.
                self.notified.remove(&(n.uid.clone(), n.reason.as_str()));
            }
        }
        for a in p.start {
            info!(attempt = %a.id, pod = %format!("{}/{}", a.namespace, a.pod), owner = %owner_key(&a), slurm_node = %a.slurm_node, "remediation attempt selected");
            self.attempts.insert(a.id.clone(), a);
        }
        // Step.
        let mut nodes: HashMap<String, Result<crate::remediation::slurm::SlurmNode, SlurmError>> =
            HashMap::new();
        let mut cordons: HashMap<String, Option<Node>> = HashMap::new();
        let open: Vec<String> = self
            .attempts
            .values()
            .filter(|a| a.is_open())
            .map(|a| a.id.clone())
            .collect();
        for id in open {
            let Some(a) = self.attempts.get(&id).cloned() else {
                continue;
            };
            // The pods of the attempt's owner: the pod under the attempt's
            // name, and the replacement's verdicts.
            let pods = match a.workload {
                Some(_) => &snap.workload_pods,
                None => &snap.nodeset_pods,
            };
            let pod_now = pods
                .iter()
                .find(|p| **p.namespace() == *a.namespace && *p.name == *a.pod);
            let pod_uid = pod_now.map(|p| p.uid.to_string());
            let replacement_started = pod_now.and_then(|p| slurmd_started_at(p));
            let new_pod = new_pod_check(
                &snap.verdicts,
                pods,
                snap.at,
                |node| snap.scanned_at.get(node).copied(),
                &a,
                &mut self.fresh_since,
            );
            if let Some(w) = &a.workload {
                // A ReplicaSet's or DaemonSet's pod is evicted only while
                // new pods are held off its node (the attempt is the
                // hold's owner).
                let cordon = match (w.kind, a.hold_owner()) {
                    (WorkloadKind::StatefulSet, _) | (_, None) => NodeCordon::NotRead,
                    (_, Some(owner)) => self.cordon(&mut cordons, &a.node, owner).await,
                };
                let obs = Observations {
                    pod_uid,
                    cordon,
                    new_pod,
                    eviction: self.last_eviction.remove(&id),
                    eviction_check: self.last_eviction_check.remove(&id),
                    workload: workloads.observe(&a.namespace, w, &snap.workload_pods),
                    ..Default::default()
                };
                let (next, actions) = step(&a, &obs, now, &self.machine_cfg);
                self.perform(snap, &a, next, actions).await;
                // Read the node's hold again next time it is needed.
                cordons.remove(&a.node);
                if self.lost {
                    self.pause("the Lease was lost");
                    return;
                }
                continue;
            }
            let slurm = self.node(&mut nodes, &a.slurm_node).await;
            if matches!(
                slurm,
                SlurmObservation::Error {
                    transient: false,
                    ..
                }
            ) {
                self.refresh_secret(now, true).await;
            }
            let group_drained = match &a.group {
                Some(g) => {
                    let members: Vec<String> = self
                        .attempts
                        .values()
                        .filter(|m| m.group.as_deref() == Some(g) && m.is_open())
                        .map(|m| m.slurm_node.clone())
                        .collect();
                    let mut all = true;
                    for m in members {
                        let o = self.node(&mut nodes, &m).await;
                        all &= matches!(o, SlurmObservation::Node(n) if n.drained());
                    }
                    all
                }
                None => false,
            };
            let (cordon, group_old_gone) = match &a.group {
                Some(g) => {
                    let cordon = self.cordon(&mut cordons, &a.node, g).await;
                    let live: HashSet<&PodUid> = snap.nodeset_pods.iter().map(|p| &p.uid).collect();
                    (cordon, group_old_gone(self.attempts.values(), g, &live))
                }
                None => (NodeCordon::NotRead, false),
            };
            let obs = Observations {
                slurm,
                pod_uid,
                new_pod,
                slurm_write: self.last_write.remove(&id),
                eviction: self.last_eviction.remove(&id),
                eviction_check: self.last_eviction_check.remove(&id),
                group_drained,
                cordon,
                group_old_gone,
                workload: None,
                replacement_started,
            };
            let (next, actions) = step(&a, &obs, now, &self.machine_cfg);
            if self.perform(snap, &a, next, actions).await {
                // Read the nodes again next time they are needed this round.
                nodes.remove(&a.slurm_node);
                cordons.remove(&a.node);
            }
            if self.lost {
                self.pause("the Lease was lost");
                return;
            }
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
        self.shared.verdicts.write().unwrap().attempts = all
            .iter()
            .map(crate::api::store::AttemptItem::from_attempt)
            .collect();
        let s = summarize(&all, now);
        let m = &self.shared.metrics;
        m.remediation_open_attempts.set(s.open as i64);
        m.remediation_oldest_open_attempt_age
            .set(s.oldest_open_age_seconds);
        m.slurm_nodes_drained.set(s.nodes_drained as i64);
        m.remediation_failed.set(s.failed_kept_drained as i64);
    }

    async fn node(
        &self,
        cache: &mut HashMap<String, Result<crate::remediation::slurm::SlurmNode, SlurmError>>,
        name: &str,
    ) -> SlurmObservation {
        let Some(slurm) = &self.slurm else {
            return SlurmObservation::NotRead;
        };
        if !cache.contains_key(name) {
            let r = slurm.get_node(name).await;
            if let Err(e) = &r {
                self.shared.metrics.api_error("slurm_get_node");
                debug!(node = name, error = %e, "reading the Slurm node failed");
            }
            cache.insert(name.to_string(), r);
        }
        slurm_obs(&cache[name])
    }

    /// The cordon of Kubernetes node `name` as seen by group `group` (read
    /// once per round).
    async fn cordon(
        &self,
        cache: &mut HashMap<String, Option<Node>>,
        name: &str,
        group: &str,
    ) -> NodeCordon {
        if !cache.contains_key(name) {
            let api: Api<Node> = Api::all(self.client.clone());
            let n = match api.get(name).await {
                Ok(n) => Some(n),
                Err(e) => {
                    self.shared.metrics.api_error("get_node");
                    debug!(node = name, error = %e, "reading the node failed");
                    None
                }
            };
            cache.insert(name.to_string(), n);
        }
        match &cache[name] {
            None => NodeCordon::NotRead,
            Some(n) => node_cordon(n, group),
        }
    }

    /// Holds new pods off `node` for group `owner`: adds the `NoSchedule`
    /// taint [`HOLD_TAINT_KEY`] (value `owner`) and the annotation naming
    /// `owner`, unless a taint with that key is there already; with
    /// `cordon == false`, removes both only if the taint still names
    /// `owner`. Never touches `spec.unschedulable` (see [`HOLD_TAINT_KEY`]).
    /// The patch carries the resourceVersion read, so a concurrent change
    /// of the taints wins (a merge patch replaces the whole list).
    async fn set_cordon(&self, node: &str, owner: &str, cordon: bool) -> Result<(), kube::Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let n = api.get(node).await?;
        let taints: Vec<serde_json::Value> = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .map(|t| {
                t.iter()
                    .filter_map(|t| serde_json::to_value(t).ok())
                    .collect()
            })
            .unwrap_or_default();
        let held_by = hold_owner(&n);
        let patch = match (cordon, held_by.as_deref()) {
            (true, None) => {
                let mut taints = taints;
                taints.push(serde_json::json!({
                    "key": HOLD_TAINT_KEY, "value": owner, "effect": "NoSchedule",
                }));
                serde_json::json!({
                    "metadata": {
                        "resourceVersion": n.metadata.resource_version,
                        "annotations": {CORDON_ANNOTATION: owner},
                    },
                    "spec": {"taints": taints},
                })
            }
            (false, Some(o)) if o == owner => {
                let taints: Vec<serde_json::Value> = taints
                    .into_iter()
                    .filter(|t| t["key"] != HOLD_TAINT_KEY)
                    .collect();
                serde_json::json!({
                    "metadata": {
                        "resourceVersion": n.metadata.resource_version,
                        "annotations": {CORDON_ANNOTATION: null},
                    },
                    "spec": {"taints": if taints.is_empty() { serde_json::Value::Null } else { serde_json::Value::from(taints) }},
                })
            }
            _ => return Ok(()),
        };
        api.patch(
            node,
            &crate::runtime::kube::patch_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
    }

    async fn cordon_action(&self, attempt: &str, node: &str, owner: &str, cordon: bool) {
        if self.mode != Mode::On {
            return;
        }
        match self.set_cordon(node, owner, cordon).await {
            Ok(()) => info!(attempt, node, cordon, "node cordon set"),
            Err(e) => {
                self.shared.metrics.api_error("patch_node");
                warn!(attempt, node, cordon, error = %e, "changing the node's cordon failed; retrying");
            }
        }
    }

    /// Reconciles persisted attempts and `mountguard:` drains. False: try
    /// again next round (Slurm unreadable, or the Lease not confirmed).
    async fn recover(&mut self, snap: &EvaluationSnapshot, now: Timestamp) -> bool {
        let nodes = match &self.slurm {
            None => Vec::new(),
            Some(slurm) => match slurm.nodes().await {
                Ok(n) => n,
                Err(e) => {
                    self.shared.metrics.api_error("slurm_list_nodes");
                    warn!(error = %e, "remediation recovery: cannot list Slurm nodes; retrying");
                    return false;
                }
            },
        };
        let view = View::read(
            self.records(snap),
            snap.nodesets_synced && snap.workloads_synced,
        );
        for (nodeset, e) in &view.unreadable {
            warn!(owner = %nodeset, error = %e, "unreadable remediation attempts: nothing is written to this object and no orphan drain is released until the annotation is fixed or removed");
        }
        let complete = view.complete();
        let persisted = view.attempts.clone();
        let states: Vec<(String, mountguard_core::remediation::SlurmNodeState)> = nodes
            .iter()
            .map(|n| (n.name.clone(), n.to_state()))
            .collect();
        let r = recover(&persisted, &states, complete);
        // Orphan drains (none without slurmrestd: no Slurm node was read).
        for rel in &r.release {
            let Some(slurm) = self.slurm.clone() else {
                break;
            };
            if self.mode != Mode::On {
                info!(node = %rel.node, reason = %rel.reason, "dry-run: would release a mountguard drain without a live attempt");
                continue;
            }
            if !self.may_write().await {
                return false;
            }
            match slurm.release_if_reason(&rel.node, &rel.reason).await {
                Ok(true) => {
                    info!(node = %rel.node, reason = %rel.reason, "released a mountguard drain without a live attempt")
                }
                Ok(false) => {}
                Err(e) => {
                    warn!(node = %rel.node, error = %e, "releasing an orphan mountguard drain failed; retrying");
                    return false;
                }
            }
        }
        let cordoned: Vec<(String, String)> = match Api::<Node>::all(self.client.clone())
            .list(&Default::default())
            .await
        {
            // A hold whose attempt is not in the records read is unknown,
            // not orphaned, while the view is incomplete; without
            // slurmrestd no NodeSet record is read, so only while there
            // is no NodeSet at all.
            Ok(_) if !complete || (self.slurm.is_none() && !snap.nodesets.is_empty()) => Vec::new(),
            Ok(l) => l
                .items
                .iter()
                .filter_map(|n| Some((n.metadata.name.clone()?, hold_owner(n)?)))
                .collect(),
            Err(e) => {
                self.shared.metrics.api_error("list_nodes");
                warn!(error = %e, "remediation recovery: cannot list nodes; retrying");
                return false;
            }
        };
        for (node, owner) in orphan_cordons(&persisted, &cordoned) {
            if self.mode != Mode::On {
                info!(
                    node,
                    owner,
                    "dry-run: would uncordon a node mountguard cordoned without a live attempt"
                );
                continue;
            }
            if !self.may_write().await {
                return false;
            }
            if let Err(e) = self.set_cordon(&node, &owner, false).await {
                self.shared.metrics.api_error("patch_node");
                warn!(node, error = %e, "releasing an orphan mountguard cordon failed; retrying");
                return false;
            }
            info!(
                node,
                owner, "released a mountguard cordon without a live attempt"
            );
        }
        self.attempts.clear();
        for a in persisted {
            self.attempts.insert(a.id.clone(), a);
        }
        self.read = view.read.into_iter().collect();
        self.unreadable = view.unreadable.into_iter().collect();
        self.last_sweep = Some(now);
        info!(
            resumed = r.resume.len(),
            released = r.release.len(),
            complete,
            "remediation recovery done"
        );
        self.recovered = true;
        true
    }

    /// Performs `actions`; returns whether a Slurm write happened.
    async fn perform(
        &mut self,
        snap: &EvaluationSnapshot,
        old: &Attempt,
        next: Attempt,
        actions: Vec<Action>,
    ) -> bool {
        let mut wrote = false;
        for act in actions {
            let writes = matches!(act, Action::Persist) || act.is_external_write();
            if writes && !self.may_write().await {
                // Not confirmed as the Lease holder: nothing more of this
                // step happens; it is taken again from the old state.
                debug!(attempt = %next.id, "not writing: the Lease is not confirmed");
                return wrote;
            }
            match act {
                Action::Persist => {
                    if let Err(e) = self.persist(&next).await {
                        self.shared.metrics.api_error("patch_nodeset");
                        warn!(attempt = %next.id, error = %e, "persisting the remediation attempt failed; not acting before it is recorded");
                        // Keep the old state (and its retry pacing).
                        return wrote;
                    }
                    crate::runtime::failpoint::after_persist(next.phase.name(), &next.id);
                }
                Action::DrainNode { node, reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.drain(&node, &reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_drain");
                    }
                    info!(attempt = %next.id, node, ok = r.is_ok(), "drain requested");
                    self.last_write.insert(next.id.clone(), write_result(r));
                }
                Action::HoldNode { node, reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.hold(&node, &reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_drain");
                    }
                    info!(attempt = %next.id, node, ok = r.is_ok(), "FAIL hold requested");
                    self.last_write.insert(next.id.clone(), write_result(r));
                }
                Action::RestoreDrain {
                    node,
                    owned_reason,
                    prior,
                } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm
                        .restore_if_reason(&node, &owned_reason, &prior.state, &prior.reason)
                        .await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_undrain");
                    }
                    info!(attempt = %next.id, node, state = %prior.state, reason = %prior.reason, set_by = ?prior.set_by, result = ?r, "previous drain handed back");
                    self.last_write
                        .insert(next.id.clone(), write_result(r.map(|_| ())));
                }
                Action::UndrainNode { node, owned_reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.undrain_if_reason(&node, &owned_reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_undrain");
                    }
                    info!(attempt = %next.id, node, result = ?r, "undrain requested");
                    self.last_write
                        .insert(next.id.clone(), write_result(r.map(|_| ())));
                }
                Action::ResumeNode { node, owned_reason } => {
                    let (Mode::On, Some(slurm)) = (self.mode, self.slurm.clone()) else {
                        continue;
                    };
                    wrote = true;
                    let r = slurm.resume_if_reason(&node, &owned_reason).await;
                    if r.is_err() {
                        self.shared.metrics.api_error("slurm_undrain");
                    }
                    info!(attempt = %next.id, node, result = ?r, "resume requested");
                    self.last_write
                        .insert(next.id.clone(), write_result(r.map(|_| ())));
                }
                Action::Evict {
                    namespace,
                    pod,
                    uid,
                } => {
                    if self.mode != Mode::On {
                        continue;
                    }
                    let r = self.evict(&namespace, &pod, &uid, false).await;
                    info!(attempt = %next.id, pod = %format!("{namespace}/{pod}"), result = ?r, "eviction requested");
                    self.last_eviction.insert(next.id.clone(), r);
                }
                Action::CheckEviction {
                    namespace,
                    pod,
                    uid,
                } => {
                    if self.mode != Mode::On {
                        continue;
                    }
                    let r = self.evict(&namespace, &pod, &uid, true).await;
                    debug!(attempt = %next.id, pod = %format!("{namespace}/{pod}"), result = ?r, "eviction asked as a dry run");
                    self.last_eviction_check.insert(next.id.clone(), r);
                }
                Action::CordonNode { node, owner } => {
                    self.cordon_action(&next.id, &node, &owner, true).await;
                }
                Action::UncordonNode { node, owner } => {
                    self.cordon_action(&next.id, &node, &owner, false).await;
                }
                Action::Event { reason, message } => {
                    // Logged too: Events expire (an hour by default).
                    info!(attempt = %next.id, reason = ?reason, message = %message, "remediation event");
                    // On the replacement once there is one (its own name
                    // for a ReplicaSet's or DaemonSet's).
                    let (pod, uid) = match &next.new_pod_uid {
                        Some(u) => (next.new_pod(), u.as_str()),
                        None => (next.pod.as_str(), old.pod_uid.as_str()),
                    };
                    let owner = match &next.workload {
                        Some(w) => Owner::Workload(w),
                        None => Owner::NodeSet(&next.nodeset),
                    };
                    self.event(snap, &next.namespace, pod, uid, owner, reason, &message)
                        .await;
                }
                Action::Transition { from, to } => {
                    let result = match to {
                        Phase::Failed(r) => r.as_str(),
                        Phase::Succeeded => "succeeded",
                        _ => "entered",
                    };
                    self.shared
                        .metrics
                        .remediation_attempts
                        .with_label_values(&[to.name(), result])
                        .inc();
                    info!(attempt = %next.id, pod = %format!("{}/{}", next.namespace, next.pod), from = from.name(), to = to.name(), result, "remediation phase");
                }
            }
        }
        self.attempts.insert(next.id.clone(), next);
        wrote
    }

    /// The Eviction API (a dry run with `dry_run`), see [`crate::remediation::eviction`].
    async fn evict(&self, namespace: &str, pod: &str, uid: &str, dry_run: bool) -> EvictionResult {
        crate::remediation::eviction::evict(
            &self.evict_client,
            &self.client,
            &self.shared.metrics,
            namespace,
            pod,
            uid,
            dry_run,
        )
        .await
    }

    async fn persist(&self, next: &Attempt) -> Result<(), String> {
        let key = owner_key(next);
        if !self.read.contains(&key) {
            // Never overwrite a record that was not read.
            return Err(format!(
                "the attempts record of {key} was not read (unreadable, or not listed yet)"
            ));
        }
        let mine = self
            .attempts
            .values()
            .filter(|a| a.id != next.id && owner_key(a) == key)
            .chain(std::iter::once(next));
        let record = AttemptsRecord::from_attempts(mine);
        if let Some(w) = &next.workload {
            return crate::edge::workloads::persist(
                &self.client,
                &next.namespace,
                w,
                &record.to_json(),
            )
            .await
            .map_err(|e| e.to_string());
        }
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &next.namespace, &nodeset_resource());
        let patch = serde_json::json!({
            "metadata": {"annotations": {ATTEMPTS_ANNOTATION: record.to_json()}}
        });
        api.patch(
            &next.nodeset,
            &crate::runtime::kube::patch_params(),
            &Patch::Merge(&patch),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    #[allow(clippy::too_many_arguments)]
    async fn event(
        &self,
        snap: &EvaluationSnapshot,
        namespace: &str,
        pod: &str,
        uid: &str,
        owner: Owner<'_>,
        reason: EventReason,
        message: &str,
    ) -> bool {
        let note = crate::runtime::events::event_note(message);
        let ev = Event {
            type_: if reason.warning() {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.as_str().into(),
            note: Some(note),
            action: "Remediate".into(),
            secondary: None,
        };
        let mut refs = vec![ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.into()),
            name: Some(pod.into()),
            uid: Some(uid.into()),
            ..Default::default()
        }];
        match owner {
            Owner::NodeSet(nodeset) => {
                if let Some(ns) = snap.nodesets.iter().find(|n| {
                    n.metadata.namespace.as_deref() == Some(namespace)
                        && n.metadata.name.as_deref() == Some(nodeset)
                }) {
                    refs.push(ObjectReference {
                        api_version: Some("slinky.slurm.net/v1beta1".into()),
                        kind: Some("NodeSet".into()),
                        namespace: Some(namespace.into()),
                        name: Some(nodeset.into()),
                        uid: ns.metadata.uid.clone(),
                        ..Default::default()
                    });
                }
            }
            Owner::Workload(w) => {
                if let Some(o) = Workloads::new(&snap.workloads).get(namespace, w) {
                    refs.push(ObjectReference {
                        api_version: Some("apps/v1".into()),
                        kind: Some(w.kind.as_str().into()),
                        namespace: Some(namespace.into()),
                        name: Some(w.name.clone()),
                        uid: o.uid.clone(),
                        ..Default::default()
                    });
                }
            }
        }
        self.publish(&ev, refs, reason).await
    }

    /// One Warning Event on the workload of `bad` (not on its pods: the
    /// annotation is the workload's), saying what is wrong and what is
    /// accepted. False when it was not published.
    async fn workload_event(&self, snap: &EvaluationSnapshot, bad: &AnnotationProblem) -> bool {
        let reason = EventReason::InvalidRemediationAnnotation;
        let Some(o) = Workloads::new(&snap.workloads).get(&bad.namespace, &bad.workload) else {
            return true;
        };
        let ev = Event {
            type_: EventType::Warning,
            reason: reason.as_str().into(),
            note: Some(crate::runtime::events::event_note(&format!(
                "{}; nothing is remediated for this workload until the annotation is fixed",
                bad.message
            ))),
            action: "Remediate".into(),
            secondary: None,
        };
        let r = ObjectReference {
            api_version: Some("apps/v1".into()),
            kind: Some(bad.workload.kind.as_str().into()),
            namespace: Some(bad.namespace.clone()),
            name: Some(bad.workload.name.clone()),
            uid: o.uid.clone(),
            ..Default::default()
        };
        self.publish(&ev, vec![r], reason).await
    }

    /// Publishes `ev` on each of `refs`; false when any failed.
    async fn publish(&self, ev: &Event, refs: Vec<ObjectReference>, reason: EventReason) -> bool {
        let mut ok = true;
        for r in refs {
            match tokio::time::timeout(Duration::from_secs(10), self.recorder.publish(ev, &r)).await
            {
                Ok(Ok(())) => {
                    self.shared
                        .metrics
                        .events
                        .with_label_values(&[reason.as_str()])
                        .inc();
                }
                _ => {
                    ok = false;
                    self.shared.metrics.api_error("create_event");
                    warn!(reason = reason.as_str(), object = ?r.name, "publishing a remediation event failed");
                }
            }
        }
        ok
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

fn write_result(r: Result<(), SlurmError>) -> WriteResult {
    match r {
        Ok(()) => WriteResult::Ok,
        Err(e) => WriteResult::Err {
            // A node slurmctld does not know right now: the reads decide,
            // within the machine's not-found bound.
            transient: e.is_transient() || matches!(e, SlurmError::NotFound { .. }),
            message: e.to_string(),
        },
    }
}

/// The group named by node `n`'s [`HOLD_TAINT_KEY`] taint, if any.
fn hold_owner(n: &Node) -> Option<String> {
    n.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == HOLD_TAINT_KEY)
        .map(|t| t.value.clone().unwrap_or_default())
}

/// How group `group` sees node `n`'s hold (its [`HOLD_TAINT_KEY`] taint).
fn node_cordon(n: &Node, group: &str) -> NodeCordon {
    cordon_of(hold_owner(n).as_deref(), group)
}

/// What remediation reads of a NodeSet object (none without a namespace
/// and name).
pub fn nodeset_model(ns: &DynamicObject) -> Option<NodeSetModel> {
    let spec = &ns.data["spec"];
    let max_unavailable = &spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"];
    let annotations = ns.metadata.annotations.as_ref();
    Some(NodeSetModel {
        namespace: ns.metadata.namespace.clone()?,
        name: ns.metadata.name.clone()?,
        annotations: [REMEDIATE_ANNOTATION, REMEDIATE_ON_ANNOTATION]
            .into_iter()
            .filter_map(|k| Some((k.to_string(), annotations?.get(k)?.clone())))
            .collect(),
        replicas: spec["replicas"].as_u64(),
        max_unavailable: match (max_unavailable.as_u64(), max_unavailable.as_str()) {
            (Some(n), _) => Some(IntOrString::Int(n)),
            (None, Some(s)) => Some(IntOrString::String(s.to_string())),
            (None, None) => None,
        },
    })
}

fn nodeset_models(snap: &EvaluationSnapshot) -> Vec<NodeSetModel> {
    snap.nodesets
        .iter()
        .filter_map(|n| nodeset_model(n))
        .collect()
}

fn nodeset_key(ns: &DynamicObject) -> Option<String> {
    Some(format!(
        "{}/{}",
        ns.metadata.namespace.as_deref()?,
        ns.metadata.name.as_deref()?
    ))
}

fn attempts_annotation(ns: &DynamicObject) -> Option<&str> {
    ns.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ATTEMPTS_ANNOTATION))
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mountguard_core::remediation::inputs::max_unavailable;

    fn nodeset(spec: serde_json::Value) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"namespace": "slurm", "name": "worker"},
            "spec": spec,
        }))
        .expect("object")
    }

    #[test]
    fn max_unavailable_from_the_nodeset() {
        let t = [
            (serde_json::json!({"replicas": 8}), 2),
            (serde_json::json!({"replicas": 3}), 1),
            (
                serde_json::json!({"replicas": 10, "updateStrategy": {"rollingUpdate": {"maxUnavailable": 3}}}),
                3,
            ),
            (
                serde_json::json!({"replicas": 10, "updateStrategy": {"rollingUpdate": {"maxUnavailable": "50%"}}}),
                5,
            ),
            (
                serde_json::json!({"replicas": 10, "updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}}),
                0,
            ),
        ];
        for (spec, want) in t {
            let model = nodeset_model(&nodeset(spec.clone())).expect("named");
            assert_eq!(max_unavailable(&model), want, "{spec}");
        }
    }
}
