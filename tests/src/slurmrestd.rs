//! The slurmrestd double: the `v0.0.44` node endpoints the Slinky operator
//! and mountguard use, with Slurm's node-state semantics.
//!
//! - `GET /slurm/v0.0.44/nodes/`, `GET /slurm/v0.0.44/node/{name}`,
//!   `POST /slurm/v0.0.44/node/{name}` (`state`: DRAIN, UNDRAIN, RESUME,
//!   DOWN; `reason`), response envelopes with `meta`, `errors`, `warnings`
//!   as in the OpenAPI description (`v0.0.44_openapi_nodes_resp`,
//!   `v0.0.44_openapi_resp`).
//! - Base state IDLE / MIXED / ALLOCATED from running jobs, COMPLETING while
//!   an ended job's epilog runs, DOWN (admin or not responding); flags
//!   DRAIN and NOT_RESPONDING; `reason`, `reason_set_by_user`,
//!   `reason_changed_at`.
//! - A node whose slurmd loaded an auth key other than slurmctld's (or whose
//!   slurmd is not running) is `NOT_RESPONDING` and set DOWN (reason "Not
//!   responding" unless it has one: `set_node_down_ptr`). The DOWN stays
//!   once slurmd answers again unless `ReturnToService` returns it
//!   ([`ReturnToService`], slurm.conf(5); `_node_did_resp` and
//!   `validate_node_specs` in `src/slurmctld/node_mgr.c`, Slurm 25.11):
//!   0 never, 1 only a DOWN whose reason is exactly "Not responding", 2 any
//!   DOWN, the operator's preStop DOWN included. Returning keeps the flags
//!   (DRAIN, FAIL): only the base state changes.
//! - The FAIL flag (`state: ["FAIL"]`, a reason required): like DRAIN, no
//!   new job; setting DRAIN clears FAIL and setting FAIL clears DRAIN (one
//!   branch of `update_node` in `node_mgr.c`), UNDRAIN leaves it, RESUME
//!   clears DRAIN, FAIL and DOWN.
//! - `X-SLURM-USER-TOKEN` is required: a configured static token, or an HS256
//!   JWT (claims `sun`, `exp`) signed with the configured jwt key; otherwise
//!   401 with an error envelope.
//! - `GET /slurm/v0.0.44/jobs/`: every job, RUNNING or (in its epilog)
//!   COMPLETING, with `job_id`, `job_state`, `nodes`, `cpus`, `start_time`
//!   and an infinite `time_limit` (`v0.0.44_openapi_job_info_resp`); and
//!   `GET /slurm/v0.0.44/reservations/` and `.../reservation/{name}`: no
//!   reservation (`v0.0.44_openapi_reservation_resp`, `reservations: []`). The Slinky
//!   operator lists both (slurm-operator
//!   `internal/controller/nodeset/slurmcontrol/slurmcontrol.go`,
//!   `GetNodeDeadlines` and `CheckReservationForNodeSet`, through
//!   slurm-client's informer cache; types in slurm-client
//!   `api/v0044/slurm.gen.go`).
//! - Every write is recorded, accepted or not.
//! - A slurmd that stops (its pod deleted or evicted) while jobs run on its
//!   node kills them; the double lists them as killed.
//! - Fault on demand: after the next accepted write to a node, its next
//!   reads answer "Invalid node name specified" (error 2018, HTTP 500), as
//!   slurmctld does for a node it does not know at that moment (a dynamic
//!   node re-registering, a slurmctld restarting).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::http::{self, Body, Server};

/// The API version served.
pub const VERSION: &str = "v0.0.44";

/// Slurm release reported in `meta`.
pub const SLURM_RELEASE: (&str, &str, &str) = ("25", "11", "7");

/// One recorded write.
#[derive(Debug, Clone, PartialEq)]
pub struct WriteRecord {
    /// Node name from the path.
    pub node: String,
    /// Request body.
    pub body: Value,
    /// Authenticated user (None: rejected before authentication).
    pub user: Option<String>,
    /// HTTP status returned.
    pub status: u16,
    /// Position among every write and job start, in the order slurmctld
    /// handled them (see [`SlurmHandle::jobs_started`]).
    pub seq: u64,
}

#[derive(Debug, Clone)]
struct Job {
    node: String,
    cpus: u32,
    started_at: i64,
    ended_at: Option<Instant>,
}

/// slurm.conf `ReturnToService`: when a DOWN node whose slurmd answers
/// again is returned to service (slurm.conf(5); `_node_did_resp` and
/// `validate_node_specs` in `src/slurmctld/node_mgr.c`, Slurm 25.11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReturnToService {
    /// 0 (Slurm's default): a DOWN node stays DOWN until an administrator
    /// resumes it, even once slurmd registers again.
    Never,
    /// 1 (the cluster in a box's default): only a node whose reason is
    /// exactly "Not responding" returns when slurmd answers.
    #[default]
    NotResponding,
    /// 2: any DOWN node returns when slurmd answers, whatever the reason.
    Always,
}

#[derive(Debug, Clone)]
struct Node {
    cpus: u32,
    /// Base state DOWN (set by a request, or for not responding).
    down: bool,
    drain: bool,
    fail: bool,
    reason: Option<String>,
    reason_set_by: Option<String>,
    reason_changed_at: i64,
    slurmd_key_digest: Option<String>,
    slurmd_start_time: i64,
    /// The node's `comment` (`update_node_msg.comment`, kept as sent).
    comment: String,
}

#[derive(Debug)]
struct State {
    nodes: BTreeMap<String, Node>,
    jobs: BTreeMap<u32, Job>,
    next_job: u32,
    controller_key_digest: Option<String>,
    tokens: HashMap<String, String>,
    jwt_key: Option<Vec<u8>>,
    epilog: Duration,
    writes: Vec<WriteRecord>,
    /// `(seq, node, job)` of every job started.
    started: Vec<(u64, String, u32)>,
    seq: u64,
    killed: Vec<u32>,
    last_update: i64,
    cluster: String,
    return_to_service: ReturnToService,
    /// Node -> reads to answer "not found" after its next accepted write.
    not_found_after_write: HashMap<String, u32>,
    /// Node -> reads still to answer "not found".
    not_found: HashMap<String, u32>,
    not_found_served: u32,
    /// `METHOD path` of every request no route of the double serves.
    unserved: Vec<String>,
}

/// A snapshot of one node's Slurm state, for tests.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// `state` array, e.g. `["MIXED","DRAIN"]`.
    pub state: Vec<String>,
    /// `reason`.
    pub reason: String,
    /// `reason_set_by_user`.
    pub reason_set_by_user: String,
}

impl NodeView {
    /// Drained in the operator's sense: DRAIN and none of ALLOCATED,
    /// MIXED, COMPLETING.
    pub fn is_drained(&self) -> bool {
        self.state.iter().any(|s| s == "DRAIN")
            && !self
                .state
                .iter()
                .any(|s| matches!(s.as_str(), "ALLOCATED" | "MIXED" | "COMPLETING"))
    }
}

/// The reason slurmctld gives a node it set DOWN for not answering.
pub const NOT_RESPONDING: &str = "Not responding";

fn node_responding(n: &Node, controller: Option<&str>) -> bool {
    match (&n.slurmd_key_digest, controller) {
        (Some(k), Some(c)) => k == c,
        (Some(_), None) => true,
        (None, _) => false,
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// SHA-256 hex of an auth key, as the double compares keys.
pub fn key_digest(key: &[u8]) -> String {
    hex::encode(Sha256::digest(key))
}

/// Mints an HS256 JWT like `scontrol token` (claims `sun`, `iat`, `exp`).
pub fn mint_token(jwt_key: &[u8], user: &str, ttl: Duration) -> String {
    let enc = |v: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(v).unwrap_or_default())
    };
    let now = crate::util::unix_now();
    let head = enc(&json!({"alg": "HS256", "typ": "JWT"}));
    let body = enc(&json!({"sun": user, "iat": now, "exp": now + ttl.as_secs() as i64}));
    let signing = format!("{head}.{body}");
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(jwt_key).expect("HMAC accepts any key length");
    mac.update(signing.as_bytes());
    let sig = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
    format!("{signing}.{sig}")
}

fn verify_jwt(jwt_key: &[u8], token: &str) -> Option<String> {
    let (signing, sig) = token.rsplit_once('.')?;
    let (head, body) = signing.split_once('.')?;
    let dec = |s: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(s)
            .ok()
    };
    let header: Value = serde_json::from_slice(&dec(head)?).ok()?;
    if header["alg"] != "HS256" {
        return None;
    }
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(jwt_key).ok()?;
    mac.update(signing.as_bytes());
    mac.verify_slice(&dec(sig)?).ok()?;
    let claims: Value = serde_json::from_slice(&dec(body)?).ok()?;
    if claims["exp"].as_i64()? <= crate::util::unix_now() {
        return None;
    }
    claims["sun"].as_str().map(String::from)
}

impl State {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn settle(&mut self) {
        let now = Instant::now();
        let epilog = self.epilog;
        let before = self.jobs.len();
        self.jobs
            .retain(|_, j| j.ended_at.is_none_or(|t| now < t + epilog));
        if self.jobs.len() != before {
            self.last_update = crate::util::unix_now();
        }
        let now_unix = crate::util::unix_now();
        let rts = self.return_to_service;
        let controller = self.controller_key_digest.clone();
        for n in self.nodes.values_mut() {
            let responding = node_responding(n, controller.as_deref());
            if !responding && !n.down {
                // ping_nodes.c / set_node_down_ptr: DOWN, and "Not
                // responding" only when the node has no reason yet.
                n.down = true;
                if n.reason.is_none() {
                    n.reason = Some(NOT_RESPONDING.to_string());
                    n.reason_set_by = Some("slurm".to_string());
                    n.reason_changed_at = n.slurmd_start_time;
                }
                self.last_update = now_unix;
            } else if responding && n.down {
                let back = match rts {
                    ReturnToService::Never => false,
                    ReturnToService::NotResponding => n.reason.as_deref() == Some(NOT_RESPONDING),
                    ReturnToService::Always => true,
                };
                if back {
                    n.down = false;
                    if n.reason.as_deref() == Some(NOT_RESPONDING) && !n.drain && !n.fail {
                        n.reason = None;
                        n.reason_set_by = None;
                    }
                    self.last_update = now_unix;
                }
            }
        }
    }

    fn responding(&self, n: &Node) -> bool {
        node_responding(n, self.controller_key_digest.as_deref())
    }

    fn view(&self, name: &str) -> Option<(NodeView, Value)> {
        let n = self.nodes.get(name)?;
        let jobs: Vec<&Job> = self.jobs.values().filter(|j| j.node == name).collect();
        let alloc: u32 = jobs.iter().map(|j| j.cpus).sum::<u32>().min(n.cpus);
        let completing = jobs.iter().any(|j| j.ended_at.is_some());
        let responding = self.responding(n);
        let mut state = Vec::new();
        if n.down || !responding {
            state.push("DOWN");
        } else if alloc == 0 {
            state.push("IDLE");
        } else if alloc >= n.cpus {
            state.push("ALLOCATED");
        } else {
            state.push("MIXED");
        }
        if n.drain {
            state.push("DRAIN");
        }
        if n.fail {
            state.push("FAIL");
        }
        if completing && responding {
            state.push("COMPLETING");
        }
        if !responding {
            state.push("NOT_RESPONDING");
        }
        let (reason, by, at) = match (&n.reason, responding) {
            (Some(r), _) => (
                r.clone(),
                n.reason_set_by.clone().unwrap_or_default(),
                n.reason_changed_at,
            ),
            (None, false) => (
                NOT_RESPONDING.to_string(),
                "slurm".to_string(),
                n.slurmd_start_time,
            ),
            (None, true) => (String::new(), String::new(), 0),
        };
        let no_val =
            |set: bool, number: i64| json!({"set": set, "infinite": false, "number": number});
        let now = crate::util::unix_now();
        let body = json!({
            "architecture": std::env::consts::ARCH,
            "burstbuffer_network_address": "",
            "boards": 1,
            "boot_time": no_val(true, n.slurmd_start_time),
            "cert_flags": [],
            "cluster_name": self.cluster,
            "cores": n.cpus,
            "specialized_cores": 0,
            "cpu_binding": 0,
            "cpu_load": 0,
            "free_mem": no_val(true, 4096),
            "cpus": n.cpus,
            "effective_cpus": n.cpus,
            "specialized_cpus": "",
            "external_sensors": {},
            "extra": "",
            "power": {},
            "features": [],
            "active_features": [],
            "gpu_spec": "",
            "gres": "",
            "gres_drained": "N/A",
            "gres_used": "",
            "instance_id": "",
            "instance_type": "",
            "last_busy": no_val(true, now),
            "mcs_label": "",
            "specialized_memory": 0,
            "name": name,
            "next_state_after_reboot": ["INVALID"],
            "address": name,
            "hostname": name,
            "state": state,
            "operating_system": "Linux",
            "owner": "",
            "partitions": ["slinky"],
            "port": 6818,
            "real_memory": 8192,
            "res_cores_per_gpu": 0,
            "comment": n.comment,
            "reason": reason,
            "reason_changed_at": no_val(at != 0, at),
            "reason_set_by_user": by,
            "resume_after": no_val(false, 0),
            "reservation": "",
            "alloc_memory": 0,
            "alloc_cpus": alloc,
            "alloc_idle_cpus": n.cpus - alloc,
            "tres_used": if alloc > 0 { format!("cpu={alloc}") } else { String::new() },
            "tres_weighted": 0.0,
            "slurmd_start_time": no_val(n.slurmd_key_digest.is_some(), n.slurmd_start_time),
            "sockets": 1,
            "threads": 1,
            "temporary_disk": 0,
            "weight": 1,
            "topology": "",
            "tres": format!("cpu={},mem=8G,billing={}", n.cpus, n.cpus),
            "version": format!("{}.{}.{}", SLURM_RELEASE.0, SLURM_RELEASE.1, SLURM_RELEASE.2),
        });
        let view = NodeView {
            state: state.iter().map(|s| s.to_string()).collect(),
            reason,
            reason_set_by_user: by,
        };
        Some((view, body))
    }

    fn meta(&self, user: &str) -> Value {
        json!({
            "plugin": {"type": "openapi/slurmctld", "name": "Slurm OpenAPI slurmctld", "data_parser": format!("data_parser/{VERSION}"), "accounting_storage": ""},
            "client": {"source": "[127.0.0.1]", "user": user, "group": user},
            "command": [],
            "slurm": {"version": {"major": SLURM_RELEASE.0, "micro": SLURM_RELEASE.2, "minor": SLURM_RELEASE.1},
                      "release": format!("{}.{}.{}", SLURM_RELEASE.0, SLURM_RELEASE.1, SLURM_RELEASE.2), "cluster": self.cluster},
        })
    }
}

/// Handle on the slurmrestd double's state (cloneable).
#[derive(Debug, Clone)]
pub struct SlurmHandle {
    state: Arc<Mutex<State>>,
}

impl SlurmHandle {
    /// Adds a node (slurmd not started yet: DOWN, NOT_RESPONDING).
    pub fn add_node(&self, name: &str, cpus: u32) {
        let mut s = lock(&self.state);
        s.nodes.entry(name.to_string()).or_insert(Node {
            cpus: cpus.max(1),
            down: false,
            drain: false,
            fail: false,
            reason: None,
            reason_set_by: None,
            reason_changed_at: 0,
            slurmd_key_digest: None,
            slurmd_start_time: 0,
            comment: String::new(),
        });
        s.last_update = crate::util::unix_now();
    }

    /// Sets the auth key slurmctld uses.
    pub fn set_controller_key(&self, key: &[u8]) {
        let mut s = lock(&self.state);
        s.controller_key_digest = Some(key_digest(key));
        s.last_update = crate::util::unix_now();
    }

    /// Reports that a node's slurmd started with `key` loaded.
    pub fn slurmd_started(&self, node: &str, key: &[u8]) {
        let mut s = lock(&self.state);
        if let Some(n) = s.nodes.get_mut(node) {
            n.slurmd_key_digest = Some(key_digest(key));
            n.slurmd_start_time = crate::util::unix_now();
        }
        s.last_update = crate::util::unix_now();
    }

    /// Reports that a node's slurmd stopped (its pod went away). Jobs still
    /// running there are killed, as the slurmd preStop hook's DOWN does:
    /// they are gone and listed by [`Self::killed_jobs`].
    pub fn slurmd_stopped(&self, node: &str) {
        let mut s = lock(&self.state);
        if let Some(n) = s.nodes.get_mut(node) {
            n.slurmd_key_digest = None;
        }
        let running: Vec<u32> = s
            .jobs
            .iter()
            .filter(|(_, j)| j.node == node && j.ended_at.is_none())
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            s.jobs.remove(&id);
            s.killed.push(id);
        }
        s.last_update = crate::util::unix_now();
    }

    /// Jobs killed because their node's slurmd stopped under them.
    pub fn killed_jobs(&self) -> Vec<u32> {
        lock(&self.state).killed.clone()
    }

    /// Starts a job using `cpus` on `node`; returns its id.
    pub fn start_job(&self, node: &str, cpus: u32) -> u32 {
        insert_job(&mut lock(&self.state), node, cpus)
    }

    /// Slurm's scheduler for one job: starts it on `node` only if the node
    /// can take a job now (base state IDLE or MIXED with `cpus` free, and
    /// none of DRAIN, FAIL, DOWN, NOT_RESPONDING, COMPLETING), in one step
    /// with reading that state. Returns its id.
    pub fn start_job_if_open(&self, node: &str, cpus: u32) -> Option<u32> {
        let mut s = lock(&self.state);
        s.settle();
        let (v, b) = s.view(node)?;
        let free = b["alloc_idle_cpus"].as_u64().unwrap_or(0) >= u64::from(cpus);
        let open = matches!(v.state.first().map(String::as_str), Some("IDLE" | "MIXED"))
            && !v.state.iter().any(|f| {
                matches!(
                    f.as_str(),
                    "DRAIN" | "FAIL" | "DOWN" | "NOT_RESPONDING" | "COMPLETING"
                )
            });
        (open && free).then(|| insert_job(&mut s, node, cpus))
    }

    /// `(seq, node, job)` of every job started, `seq` ordering them with
    /// the writes ([`WriteRecord::seq`]).
    pub fn jobs_started(&self) -> Vec<(u64, String, u32)> {
        lock(&self.state).started.clone()
    }

    /// Ends a job: COMPLETING for the epilog duration, then gone.
    pub fn end_job(&self, id: u32) {
        let mut s = lock(&self.state);
        if let Some(j) = s.jobs.get_mut(&id) {
            j.ended_at = Some(Instant::now());
        }
        s.settle();
    }

    /// `METHOD path` of every authenticated request the double has no
    /// route for (a client asking for more than the double serves).
    pub fn unserved(&self) -> Vec<String> {
        lock(&self.state).unserved.clone()
    }

    /// Sets slurm.conf `ReturnToService` (default
    /// [`ReturnToService::NotResponding`]).
    pub fn set_return_to_service(&self, rts: ReturnToService) {
        let mut s = lock(&self.state);
        s.return_to_service = rts;
        s.settle();
    }

    /// Sets how long an ended job stays COMPLETING.
    pub fn set_epilog(&self, d: Duration) {
        lock(&self.state).epilog = d;
    }

    /// Accepts a static token for `user`.
    pub fn add_token(&self, token: &str, user: &str) {
        lock(&self.state)
            .tokens
            .insert(token.to_string(), user.to_string());
    }

    /// Accepts HS256 JWTs signed with `key`.
    pub fn set_jwt_key(&self, key: &[u8]) {
        lock(&self.state).jwt_key = Some(key.to_vec());
    }

    /// A node's state, for tests.
    pub fn node(&self, name: &str) -> Option<NodeView> {
        let mut s = lock(&self.state);
        s.settle();
        s.view(name).map(|(v, _)| v)
    }

    /// Sets a drain directly, as an admin with scontrol would.
    pub fn admin_drain(&self, node: &str, reason: &str, user: &str) {
        let mut s = lock(&self.state);
        if let Some(n) = s.nodes.get_mut(node) {
            n.drain = true;
            n.reason = Some(reason.to_string());
            n.reason_set_by = Some(user.to_string());
            n.reason_changed_at = crate::util::unix_now();
        }
    }

    /// Every write received.
    pub fn writes(&self) -> Vec<WriteRecord> {
        lock(&self.state).writes.clone()
    }

    /// Whether `node`'s slurmd loaded slurmctld's auth key (so `scontrol`
    /// run in its pod can authenticate).
    pub fn slurmd_key_matches(&self, node: &str) -> bool {
        let s = lock(&self.state);
        let Some(n) = s.nodes.get(node) else {
            return false;
        };
        n.slurmd_key_digest.is_some() && n.slurmd_key_digest == s.controller_key_digest
    }

    /// Whether `key` is slurmctld's auth key (what `scontrol` run with that
    /// key file can authenticate with).
    pub fn key_is_current(&self, key: &[u8]) -> bool {
        lock(&self.state).controller_key_digest.as_deref() == Some(key_digest(key).as_str())
    }

    /// An `scontrol update` run as `user` (not a REST call: not recorded
    /// in [`Self::writes`]). Returns whether slurmctld accepted it.
    pub fn scontrol_update(&self, node: &str, msg: &Value, user: &str) -> bool {
        let mut s = lock(&self.state);
        s.settle();
        update_node(&mut s, node, msg, user).0 == StatusCode::OK
    }

    /// A REST `POST /node/{node}` by another client (the operator), as
    /// `user`: applied and recorded like every write.
    pub fn rest_update(&self, node: &str, msg: &Value, user: &str) -> bool {
        let mut s = lock(&self.state);
        s.settle();
        let (status, _) = update_node(&mut s, node, msg, user);
        let seq = s.next_seq();
        s.writes.push(WriteRecord {
            node: node.to_string(),
            body: msg.clone(),
            user: Some(user.to_string()),
            status: status.as_u16(),
            seq,
        });
        status == StatusCode::OK
    }

    /// Fault: after the next accepted write to `node`, its next `reads`
    /// `GET /node/{node}` answer "not found" (the node is left as it is).
    pub fn not_found_after_write(&self, node: &str, reads: u32) {
        lock(&self.state)
            .not_found_after_write
            .insert(node.to_string(), reads);
    }

    /// How many reads were answered "not found" by the fault.
    pub fn not_found_served(&self) -> u32 {
        lock(&self.state).not_found_served
    }
}

/// A running slurmrestd double.
#[derive(Debug)]
pub struct SlurmrestdDouble {
    handle: SlurmHandle,
    server: Server,
}

impl SlurmrestdDouble {
    /// Starts on `127.0.0.1:0` for cluster `cluster`.
    pub async fn start(cluster: &str) -> std::io::Result<Self> {
        Self::start_on(cluster, std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await
    }

    /// [`Self::start`] on `addr` (slurmrestd's own port, 6820, on an
    /// address of the test's: a client that cannot be given a port).
    pub async fn start_on(cluster: &str, addr: std::net::SocketAddr) -> std::io::Result<Self> {
        let handle = SlurmHandle {
            state: Arc::new(Mutex::new(State {
                nodes: BTreeMap::new(),
                jobs: BTreeMap::new(),
                next_job: 0,
                controller_key_digest: None,
                tokens: HashMap::new(),
                jwt_key: None,
                epilog: Duration::ZERO,
                writes: Vec::new(),
                started: Vec::new(),
                seq: 0,
                killed: Vec::new(),
                last_update: crate::util::unix_now(),
                cluster: cluster.to_string(),
                return_to_service: ReturnToService::default(),
                not_found_after_write: HashMap::new(),
                not_found: HashMap::new(),
                not_found_served: 0,
                unserved: Vec::new(),
            })),
        };
        let h = handle.clone();
        let server = Server::start_on(addr, move |req| {
            let h = h.clone();
            async move { serve(h, req).await }
        })
        .await?;
        Ok(Self { handle, server })
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The bound address.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr()
    }

    /// The handle.
    pub fn handle(&self) -> SlurmHandle {
        self.handle.clone()
    }

    /// Stops the server.
    pub async fn shutdown(&mut self) {
        self.server.shutdown().await;
    }
}

fn envelope(s: &State, user: &str, errors: Vec<Value>) -> Value {
    json!({"meta": s.meta(user), "errors": errors, "warnings": []})
}

fn error(description: &str, number: i64, source: &str) -> Value {
    json!({"description": description, "error_number": number, "error": description, "source": source})
}

async fn serve(h: SlurmHandle, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let token = req
        .headers()
        .get("x-slurm-user-token")
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let body = match http::read_body(req).await {
        Ok((_, b)) => b,
        Err(e) => {
            return http::json(
                StatusCode::BAD_REQUEST,
                &json!({"errors": [error(&e, 9000, "http")]}),
            );
        }
    };
    let prefix = format!("/slurm/{VERSION}/");
    let rest = path.strip_prefix(&prefix);
    let node_name = rest
        .and_then(|r| r.strip_prefix("node/"))
        .map(|n| n.trim_end_matches('/').to_string());
    let is_write = method == Method::POST && node_name.is_some();
    let mut s = lock(&h.state);
    s.settle();
    let user = token.as_deref().and_then(|t| {
        s.tokens
            .get(t)
            .cloned()
            .or_else(|| s.jwt_key.as_ref().and_then(|k| verify_jwt(k, t)))
    });
    let Some(user) = user else {
        if is_write {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let seq = s.next_seq();
            s.writes.push(WriteRecord {
                node: node_name.clone().unwrap_or_default(),
                body,
                user: None,
                status: 401,
                seq,
            });
        }
        let env = envelope(
            &s,
            "",
            vec![error(
                "Authentication failure",
                1007,
                "rest_authenticate_http_request",
            )],
        );
        return http::json(StatusCode::UNAUTHORIZED, &env);
    };
    match (method, rest) {
        (Method::GET, Some("jobs/" | "jobs")) => {
            let jobs: Vec<Value> = s
                .jobs
                .iter()
                .map(|(id, j)| {
                    let state = if j.ended_at.is_some() {
                        "COMPLETING"
                    } else {
                        "RUNNING"
                    };
                    json!({
                        "job_id": id,
                        "job_state": [state],
                        "nodes": j.node,
                        "cpus": {"set": true, "infinite": false, "number": j.cpus},
                        "start_time": {"set": true, "infinite": false, "number": j.started_at},
                        "time_limit": {"set": false, "infinite": true, "number": 0},
                    })
                })
                .collect();
            let mut env = envelope(&s, &user, vec![]);
            env["jobs"] = Value::Array(jobs);
            env["last_backfill"] = json!({"set": false, "infinite": false, "number": 0});
            env["last_update"] = json!({"set": true, "infinite": false, "number": s.last_update});
            http::json(StatusCode::OK, &env)
        }
        (Method::GET, Some("reservations/" | "reservations")) => {
            let mut env = envelope(&s, &user, vec![]);
            env["reservations"] = json!([]);
            env["last_update"] = json!({"set": true, "infinite": false, "number": s.last_update});
            http::json(StatusCode::OK, &env)
        }
        // With no reservation at all, slurmctld's load succeeds with no
        // record and the handler reports it with the load's return code,
        // SLURM_SUCCESS: HTTP 200, no reservation, one error entry
        // (Slurm `src/plugins/openapi/slurmctld/reservations.c`,
        // `_op_handler_reservation`).
        (Method::GET, Some(r)) if r.starts_with("reservation/") => {
            let mut env = envelope(
                &s,
                &user,
                vec![error(
                    "Unable to query reservations",
                    0,
                    "slurm_load_reservations()",
                )],
            );
            env["reservations"] = json!([]);
            env["last_update"] = json!({"set": true, "infinite": false, "number": s.last_update});
            http::json(StatusCode::OK, &env)
        }
        (Method::GET, Some("nodes/" | "nodes")) => {
            let names: Vec<String> = s.nodes.keys().cloned().collect();
            let nodes: Vec<Value> = names
                .iter()
                .filter_map(|n| s.view(n).map(|(_, b)| b))
                .collect();
            let mut env = envelope(&s, &user, vec![]);
            env["nodes"] = Value::Array(nodes);
            env["last_update"] = json!({"set": true, "infinite": false, "number": s.last_update});
            http::json(StatusCode::OK, &env)
        }
        (Method::GET, Some(_)) if node_name.is_some() => {
            let name = node_name.unwrap_or_default();
            let hidden = match s.not_found.get_mut(&name) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            if hidden {
                s.not_found_served += 1;
            }
            match s.view(&name).filter(|_| !hidden) {
                Some((_, b)) => {
                    let mut env = envelope(&s, &user, vec![]);
                    env["nodes"] = json!([b]);
                    env["last_update"] =
                        json!({"set": true, "infinite": false, "number": s.last_update});
                    http::json(StatusCode::OK, &env)
                }
                None => {
                    let mut env = envelope(
                        &s,
                        &user,
                        vec![error("Invalid node name specified", 2018, "_dump_nodes")],
                    );
                    env["nodes"] = json!([]);
                    env["last_update"] =
                        json!({"set": true, "infinite": false, "number": s.last_update});
                    http::json(StatusCode::INTERNAL_SERVER_ERROR, &env)
                }
            }
        }
        (Method::POST, Some(_)) if node_name.is_some() => {
            let name = node_name.unwrap_or_default();
            let parsed: Result<Value, _> = serde_json::from_slice(&body);
            let (status, errors) = match &parsed {
                Err(e) => (
                    StatusCode::BAD_REQUEST,
                    vec![error(
                        &format!("Unable to parse request body: {e}"),
                        9001,
                        "parse",
                    )],
                ),
                Ok(msg) => update_node(&mut s, &name, msg, &user),
            };
            let env = envelope(&s, &user, errors);
            if status == StatusCode::OK
                && let Some(n) = s.not_found_after_write.remove(&name)
            {
                s.not_found.insert(name.clone(), n);
            }
            let seq = s.next_seq();
            s.writes.push(WriteRecord {
                node: name,
                body: parsed.unwrap_or(Value::Null),
                user: Some(user),
                status: status.as_u16(),
                seq,
            });
            http::json(status, &env)
        }
        (m, _) => {
            s.unserved.push(format!("{m} {path}"));
            let env = envelope(
                &s,
                &user,
                vec![error("Unable to find path", 9002, "openapi")],
            );
            http::json(StatusCode::NOT_FOUND, &env)
        }
    }
}

fn insert_job(s: &mut State, node: &str, cpus: u32) -> u32 {
    s.next_job += 1;
    let id = s.next_job;
    let seq = s.next_seq();
    s.started.push((seq, node.to_string(), id));
    s.jobs.insert(
        id,
        Job {
            node: node.to_string(),
            cpus,
            started_at: crate::util::unix_now(),
            ended_at: None,
        },
    );
    s.last_update = crate::util::unix_now();
    id
}

fn update_node(s: &mut State, name: &str, msg: &Value, user: &str) -> (StatusCode, Vec<Value>) {
    let bad = |d: &str| (StatusCode::BAD_REQUEST, vec![error(d, 2018, "update_node")]);
    if !s.nodes.contains_key(name) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            vec![error("Invalid node name specified", 2018, "update_node")],
        );
    }
    let states: BTreeSet<String> = match &msg["state"] {
        Value::Null => BTreeSet::new(),
        Value::Array(a) => match a
            .iter()
            .map(|v| v.as_str().map(String::from))
            .collect::<Option<_>>()
        {
            Some(s) => s,
            None => return bad("state must be an array of strings"),
        },
        _ => return bad("state must be an array of strings"),
    };
    let reason = msg["reason"]
        .as_str()
        .filter(|r| !r.is_empty())
        .map(String::from);
    let now = crate::util::unix_now();
    let n = s.nodes.get_mut(name).expect("checked above");
    // `comment` replaces the node's comment, whatever the states say
    // (Slurm `src/slurmctld/node_mgr.c`, `update_node`: `comment` is
    // applied before the state change). The Slinky operator keeps its pod
    // info there (slurm-operator `slurmcontrol.go`, `UpdateNodeWithPodInfo`).
    if let Some(c) = msg["comment"].as_str() {
        n.comment = c.to_string();
    }
    for st in &states {
        match st.as_str() {
            "DRAIN" | "DOWN" | "FAIL" => {
                let Some(r) = &reason else {
                    return (
                        StatusCode::BAD_REQUEST,
                        vec![error(
                            "You must specify a reason when DOWNING or DRAINING a node. Request denied",
                            2020,
                            "update_node",
                        )],
                    );
                };
                match st.as_str() {
                    "DRAIN" => {
                        n.fail = false;
                        n.drain = true;
                    }
                    "FAIL" => {
                        n.drain = false;
                        n.fail = true;
                    }
                    _ => n.down = true,
                }
                n.reason = Some(r.clone());
                n.reason_set_by = Some(user.to_string());
                n.reason_changed_at = now;
            }
            "UNDRAIN" => {
                n.drain = false;
                if !n.down && !n.fail {
                    n.reason = None;
                    n.reason_set_by = None;
                }
            }
            "RESUME" => {
                n.drain = false;
                n.fail = false;
                n.down = false;
                n.reason = None;
                n.reason_set_by = None;
            }
            other => {
                return bad(&format!("Invalid node state specified: {other}"));
            }
        }
    }
    if states.is_empty()
        && let Some(r) = reason
    {
        n.reason = Some(r);
        n.reason_set_by = Some(user.to_string());
        n.reason_changed_at = now;
    }
    // A node left neither DOWN, DRAIN nor FAIL keeps no reason: Slurm's
    // `update_node` (src/slurmctld/node_mgr.c) ends each node's update with
    // `clusteracct_storage_g_node_up` for such a node, which frees its
    // reason (src/interfaces/accounting_storage.c); so a reason without a
    // state on an idle node does not stay.
    if !n.down && !n.drain && !n.fail {
        n.reason = None;
        n.reason_set_by = None;
    }
    s.last_update = now;
    (StatusCode::OK, vec![])
}
