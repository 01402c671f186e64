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
//! - A node's slurmd, as Slurm 26.05 treats it (what real Slurm did, in
//!   `docs/testing.md`, "Slurm"):
//!   - on slurmctld's key: registered (`slurmd_start_time` is its start),
//!     responding;
//!   - running on another key: it answers pings with authentication
//!     errors, which slurmctld counts as responses (`node_not_resp` in
//!     `src/slurmctld/node_mgr.c` advances `last_response`), so the node is
//!     never set DOWN: it flaps between its base state and
//!     `+NOT_RESPONDING` (one phase per [`SlurmHandle::set_ping_interval`])
//!     with an empty reason, no job starts on it, and `slurmd_start_time`
//!     stays the last authenticated registration's (it moves only in
//!     `validate_jobs_on_node`, `src/slurmctld/job_mgr.c`, for a registration
//!     that authenticated);
//!   - stopped: `NOT_RESPONDING`, and DOWN once `SlurmdTimeout` has passed
//!     ([`SlurmHandle::set_slurmd_timeout`]; `ping_nodes` in
//!     `src/slurmctld/ping_nodes.c` calls `set_node_down_ptr(node, "Not
//!     responding")`), whose `set_node_reason` (`node_mgr.c`) sets the
//!     reason "Not responding", or appends `" : Not responding"` to a reason
//!     already there, and makes SlurmUser the reason's user, now its time.
//! - The DOWN stays once slurmd answers again (on any key) unless
//!   `ReturnToService` returns it ([`ReturnToService`], slurm.conf(5);
//!   `_node_did_resp` and `validate_node_specs` in `node_mgr.c`): 0 never,
//!   1 only a DOWN whose reason is exactly "Not responding", 2 any DOWN, the
//!   operator's preStop DOWN included. Returning keeps the flags (DRAIN,
//!   FAIL): only the base state changes, and the reason of a node neither
//!   DRAIN nor FAIL goes.
//! - slurmctld restarted on a new key ([`SlurmHandle::set_controller_key`]
//!   replacing another): a node whose slurmd is not on the new key shows
//!   `slurmd_start_time` 0 (the saved node state holds none:
//!   `_node_record_pack` in `src/common/node_conf.c`) and the base state
//!   UNKNOWN until its slurmd answers (`_node_did_resp` in `node_mgr.c`),
//!   or until it is set DOWN when its slurmd is stopped.
//! - UNDRAIN and RESUME: the node shows `NOT_RESPONDING` for a moment after
//!   either ([`SlurmHandle::set_resume_settle`]; 0.5-2 s on Slurm 26.05).
//! - The FAIL flag (`state: ["FAIL"]`, a reason required): like DRAIN, no
//!   new job; setting DRAIN clears FAIL and setting FAIL clears DRAIN (one
//!   branch of `update_node` in `node_mgr.c`), UNDRAIN leaves it, RESUME
//!   clears DRAIN, FAIL and DOWN.
//! - `X-SLURM-USER-TOKEN` is required: a configured static token, or an HS256
//!   JWT (claims `sun`, `exp`) signed with the configured jwt key. Without
//!   one: 401 with a text/plain body; with one slurmrestd cannot verify (bad
//!   signature, expired, unknown): 511 with error 1007
//!   (`SLURM_PROTOCOL_AUTHENTICATION_ERROR`, mapped to 511 in
//!   `src/common/http.c`). Any user may read; a write by a user who is not
//!   a Slurm administrator (SlurmUser `slurm`, `root`, or one given with
//!   [`SlurmHandle::add_admin`]) is 422 with error 2010
//!   (`ESLURM_USER_ID_MISSING`, `_slurm_rpc_update_node` in
//!   `src/slurmctld/proc_req.c`).
//! - Error shapes of Slurm 26.05: a read of a node slurmctld does not know is
//!   HTTP 200 with no `nodes` and one error "Failure to query node <name>",
//!   error number 0 (`_dump_nodes` in
//!   `src/slurmrestd/plugins/openapi/slurmctld/nodes.c`); a write to one is
//!   422 with error 2018 (`ESLURM_INVALID_NODE_NAME`); an unknown state is
//!   500 with errors 9207 and 2180; a RESUME of a node neither DOWN, DRAIN
//!   nor FAIL is 422 with error 2180
//!   (`ESLURM_INVALID_NODE_STATE_TRANSITION`, `update_node` in
//!   `node_mgr.c`); a `state` given as one string is taken as a one-element
//!   array; a DRAIN, DOWN or FAIL without a reason is accepted (and
//!   `reason_changed_at` is then `{"set":true,"number":0}`);
//!   `GET nodes/?update_time=T` with nothing changed since T is 304.
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
//!   reads answer as for a node slurmctld does not know at that moment (a
//!   dynamic node re-registering, a slurmctld restarting): HTTP 200, no
//!   `nodes`, error 0 "Failure to query node <name>".

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
pub const SLURM_RELEASE: (&str, &str, &str) = ("26", "05", "3");

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
    /// The key the running slurmd loaded (`None`: not running).
    slurmd_key_digest: Option<String>,
    /// When the running (or last) slurmd process started (UNIX seconds).
    slurmd_start_time: i64,
    /// When that slurmd started, for its flapping phase.
    slurmd_started: Instant,
    /// `slurmd_start_time` as slurmctld shows it: the start time of the
    /// last slurmd whose registration authenticated.
    registered_start: Option<i64>,
    /// When the slurmd stopped (`None`: running, or never started).
    stopped_at: Option<Instant>,
    /// Shows `NOT_RESPONDING` until then (after an UNDRAIN or RESUME).
    settling_until: Option<Instant>,
    /// Base state `UNKNOWN` until then: after slurmctld restarted, until
    /// the node's slurmd answers.
    unknown_until: Option<Instant>,
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
    /// slurm.conf `SlurmdTimeout`: a stopped slurmd's node is set DOWN this
    /// long after it stopped.
    slurmd_timeout: Duration,
    /// How long each phase of a stale slurmd's flapping lasts.
    ping_interval: Duration,
    /// How long a node shows `NOT_RESPONDING` after an UNDRAIN or RESUME.
    resume_settle: Duration,
    /// Users whose writes slurmctld accepts.
    admins: BTreeSet<String>,
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
    /// `slurmd_start_time`: the start of the last slurmd whose
    /// registration authenticated (`None`: none has).
    pub slurmd_start_time: Option<i64>,
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

/// SlurmUser, who slurmctld's own reasons are set by.
pub const SLURM_USER: &str = "slurm";

/// A slurmd's standing with slurmctld.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slurmd {
    /// Not running.
    Stopped,
    /// Running on a key other than slurmctld's: answers, never registers.
    Stale,
    /// Running on slurmctld's key (or slurmctld has none configured).
    Current,
}

fn slurmd_of(n: &Node, controller: Option<&str>) -> Slurmd {
    match (&n.slurmd_key_digest, controller) {
        (None, _) => Slurmd::Stopped,
        (Some(k), Some(c)) if k != c => Slurmd::Stale,
        (Some(_), _) => Slurmd::Current,
    }
}

/// `set_node_reason` (`src/slurmctld/node_mgr.c`, Slurm 26.05) for a
/// message of slurmctld's own: the reason becomes `message`, or gets
/// `" : <message>"` appended when it has one without it; SlurmUser becomes
/// its user and `now` its time.
fn set_node_reason(n: &mut Node, message: &str, now: i64) {
    n.reason = Some(match n.reason.take() {
        Some(r) if r.contains(&format!(" : {message}")) => r,
        Some(r) if !r.is_empty() => format!("{r} : {message}"),
        _ => message.to_string(),
    });
    n.reason_set_by = Some(SLURM_USER.to_string());
    n.reason_changed_at = now;
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
        let timeout = self.slurmd_timeout;
        let controller = self.controller_key_digest.clone();
        for n in self.nodes.values_mut() {
            let slurmd = slurmd_of(n, controller.as_deref());
            // A slurmd that never ran is past any timeout.
            let timed_out = n.stopped_at.is_none_or(|t| now >= t + timeout);
            if slurmd == Slurmd::Stopped && timed_out && !n.down {
                // ping_nodes.c: set_node_down_ptr(node, "Not responding").
                n.down = true;
                n.unknown_until = None;
                set_node_reason(n, NOT_RESPONDING, now_unix);
                self.last_update = now_unix;
            } else if slurmd != Slurmd::Stopped && n.down {
                let back = match rts {
                    ReturnToService::Never => false,
                    ReturnToService::NotResponding => n.reason.as_deref() == Some(NOT_RESPONDING),
                    ReturnToService::Always => true,
                };
                if back {
                    n.down = false;
                    // `_node_did_resp` (node_mgr.c): a node returned to
                    // service that is neither DRAIN nor FAIL goes through
                    // `clusteracct_storage_g_node_up`, which frees its
                    // reason, whatever it was.
                    if !n.drain && !n.fail {
                        n.reason = None;
                        n.reason_set_by = None;
                    }
                    self.last_update = now_unix;
                }
            }
        }
    }

    fn slurmd(&self, n: &Node) -> Slurmd {
        slurmd_of(n, self.controller_key_digest.as_deref())
    }

    /// Whether `n` shows `NOT_RESPONDING` now.
    fn not_responding(&self, n: &Node) -> bool {
        let now = Instant::now();
        let settling = n.settling_until.is_some_and(|t| now < t);
        settling
            || match self.slurmd(n) {
                Slurmd::Stopped => true,
                Slurmd::Current => false,
                Slurmd::Stale => {
                    let phase = self.ping_interval.as_millis().max(1);
                    (now.duration_since(n.slurmd_started).as_millis() / phase) % 2 == 1
                }
            }
    }

    fn view(&self, name: &str) -> Option<(NodeView, Value)> {
        let n = self.nodes.get(name)?;
        let jobs: Vec<&Job> = self.jobs.values().filter(|j| j.node == name).collect();
        let alloc: u32 = jobs.iter().map(|j| j.cpus).sum::<u32>().min(n.cpus);
        let completing = jobs.iter().any(|j| j.ended_at.is_some());
        let answering = self.slurmd(n) != Slurmd::Stopped;
        let not_responding = self.not_responding(n);
        let mut state = Vec::new();
        if n.down {
            state.push("DOWN");
        } else if n
            .unknown_until
            .is_some_and(|t| Instant::now() < t || !answering)
        {
            state.push("UNKNOWN");
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
        if completing && answering {
            state.push("COMPLETING");
        }
        if not_responding {
            state.push("NOT_RESPONDING");
        }
        let (reason, by, at) = match &n.reason {
            Some(r) => (
                r.clone(),
                n.reason_set_by.clone().unwrap_or_default(),
                n.reason_changed_at,
            ),
            None => (String::new(), String::new(), 0),
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
            // Set, 0 when the node has no reason (as Slurm 26.05 shows it).
            "reason_changed_at": no_val(true, at),
            "reason_set_by_user": by,
            "resume_after": no_val(true, 0),
            "reservation": "",
            "alloc_memory": 0,
            "alloc_cpus": alloc,
            "alloc_idle_cpus": n.cpus - alloc,
            "tres_used": if alloc > 0 { format!("cpu={alloc}") } else { String::new() },
            "tres_weighted": 0.0,
            "slurmd_start_time": no_val(n.registered_start.is_some(), n.registered_start.unwrap_or(0)),
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
            slurmd_start_time: n.registered_start,
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
            slurmd_started: Instant::now(),
            registered_start: None,
            unknown_until: None,
            stopped_at: None,
            settling_until: None,
            comment: String::new(),
        });
        s.last_update = crate::util::unix_now();
    }

    /// Sets the auth key slurmctld uses. A running slurmd on that key
    /// registers (slurmctld asks every node to register from time to time:
    /// `ping_nodes` in `src/slurmctld/ping_nodes.c`).
    ///
    /// A new key replacing another is slurmctld restarted on it (it reads
    /// its key at start, `init_internal` in
    /// `src/plugins/auth/slurm/internal.c`). The restarted slurmctld
    /// restores each node's state and flags but not `slurmd_start_time`
    /// (`_node_record_pack` in `src/common/node_conf.c` saves none), so a
    /// node whose slurmd is not on the new key shows `slurmd_start_time`
    /// 0 and, unless DOWN, the base state `UNKNOWN` until its slurmd
    /// answers at all (`_node_did_resp` in `src/slurmctld/node_mgr.c` makes
    /// an UNKNOWN node that answers IDLE; here: two ping intervals).
    pub fn set_controller_key(&self, key: &[u8]) {
        let mut s = lock(&self.state);
        let digest = key_digest(key);
        let restarted = s
            .controller_key_digest
            .as_deref()
            .is_some_and(|old| old != digest);
        let unknown_until = Instant::now() + s.ping_interval * 2;
        for n in s.nodes.values_mut() {
            if n.slurmd_key_digest.as_deref() == Some(digest.as_str()) {
                n.registered_start = Some(n.slurmd_start_time);
            } else if restarted {
                n.registered_start = Some(0);
                n.unknown_until = Some(unknown_until);
            }
        }
        s.controller_key_digest = Some(digest);
        s.last_update = crate::util::unix_now();
    }

    /// Reports that a node's slurmd started with `key` loaded: it registers
    /// if `key` is slurmctld's.
    pub fn slurmd_started(&self, node: &str, key: &[u8]) {
        let mut s = lock(&self.state);
        let controller = s.controller_key_digest.clone();
        if let Some(n) = s.nodes.get_mut(node) {
            n.slurmd_key_digest = Some(key_digest(key));
            n.slurmd_start_time = crate::util::unix_now();
            n.slurmd_started = Instant::now();
            n.stopped_at = None;
            if slurmd_of(n, controller.as_deref()) == Slurmd::Current {
                n.registered_start = Some(n.slurmd_start_time);
                n.unknown_until = None;
            }
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
            n.stopped_at = Some(Instant::now());
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
        // A node whose slurmd is not registered on slurmctld's key takes no
        // job (it would queue forever), whatever a read shows.
        let registered = s
            .nodes
            .get(node)
            .is_some_and(|n| s.slurmd(n) == Slurmd::Current);
        let (v, b) = s.view(node)?;
        let free = registered && b["alloc_idle_cpus"].as_u64().unwrap_or(0) >= u64::from(cpus);
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

    /// Sets slurm.conf `SlurmdTimeout`: how long after its slurmd stopped a
    /// node is set DOWN (default 0: at once).
    pub fn set_slurmd_timeout(&self, d: Duration) {
        let mut s = lock(&self.state);
        s.slurmd_timeout = d;
        s.settle();
    }

    /// Sets how long each phase of a stale slurmd's `NOT_RESPONDING`
    /// flapping lasts (default 1 s).
    pub fn set_ping_interval(&self, d: Duration) {
        lock(&self.state).ping_interval = d;
    }

    /// Sets how long a node shows `NOT_RESPONDING` after an UNDRAIN or
    /// RESUME (default 1 s).
    pub fn set_resume_settle(&self, d: Duration) {
        lock(&self.state).resume_settle = d;
    }

    /// Makes `user` a Slurm administrator (AdminLevel=Admin): its writes
    /// are accepted. SlurmUser `slurm` and `root` are from the start.
    pub fn add_admin(&self, user: &str) {
        lock(&self.state).admins.insert(user.to_string());
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
                slurmd_timeout: Duration::ZERO,
                ping_interval: Duration::from_secs(1),
                resume_settle: Duration::from_secs(1),
                admins: [SLURM_USER, "root"].into_iter().map(String::from).collect(),
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
    let req_query = req.uri().query().map(String::from);
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
    let update_time: Option<i64> = req_query.as_deref().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("update_time="))
            .and_then(|v| v.parse().ok())
    });
    let mut s = lock(&h.state);
    s.settle();
    let user = token.as_deref().and_then(|t| {
        s.tokens
            .get(t)
            .cloned()
            .or_else(|| s.jwt_key.as_ref().and_then(|k| verify_jwt(k, t)))
    });
    let Some(user) = user else {
        // No token: 401 with a text/plain body; a token slurmrestd cannot
        // verify (signature, expiry, unknown): 511 with error 1007
        // (`SLURM_PROTOCOL_AUTHENTICATION_ERROR`, `src/common/http.c`).
        let status = if token.is_some() {
            StatusCode::NETWORK_AUTHENTICATION_REQUIRED
        } else {
            StatusCode::UNAUTHORIZED
        };
        if is_write {
            let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let seq = s.next_seq();
            s.writes.push(WriteRecord {
                node: node_name.clone().unwrap_or_default(),
                body,
                user: None,
                status: status.as_u16(),
                seq,
            });
        }
        if token.is_none() {
            return Response::builder()
                .status(status)
                .header("content-type", "text/plain")
                .body(http::full("Authentication failure\n"))
                .unwrap_or_else(|_| Response::new(http::full(hyper::body::Bytes::new())));
        }
        let env = envelope(
            &s,
            "",
            vec![error(
                "Protocol authentication error",
                1007,
                "rest_authenticate_http_request",
            )],
        );
        return http::json(status, &env);
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
            // Nothing changed since `update_time`: 304 (`_dump_nodes`,
            // SLURM_NO_CHANGE_IN_DATA).
            if let Some(t) = update_time
                && t >= s.last_update
            {
                return Response::builder()
                    .status(StatusCode::NOT_MODIFIED)
                    .body(http::full(hyper::body::Bytes::new()))
                    .unwrap_or_else(|_| Response::new(http::full(hyper::body::Bytes::new())));
            }
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
                // `_dump_nodes`: the single-node load found no record; the
                // error carries errno, 0 since the load itself worked.
                None => {
                    let env = envelope(
                        &s,
                        &user,
                        vec![error(
                            &format!("Failure to query node {name}"),
                            0,
                            "_dump_nodes",
                        )],
                    );
                    http::json(StatusCode::OK, &env)
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
                // `_slurm_rpc_update_node`: only an administrator may.
                Ok(_) if !s.admins.contains(&user) => (
                    StatusCode::UNPROCESSABLE_ENTITY,
                    vec![error(
                        "User ID missing from credential",
                        2010,
                        "_slurm_rpc_update_node",
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
    if !s.nodes.contains_key(name) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            vec![error("Invalid node name specified", 2018, "update_node")],
        );
    }
    // A state given as one string is taken as a one-element array (the
    // data parser's list parsing). Another JSON type is refused before
    // slurmctld sees it (not measured against Slurm: 400 here).
    let states: Option<BTreeSet<String>> = match &msg["state"] {
        Value::Null => Some(BTreeSet::new()),
        Value::String(one) => Some([one.clone()].into()),
        Value::Array(a) => a.iter().map(|v| v.as_str().map(String::from)).collect(),
        _ => None,
    };
    let Some(states) = states else {
        return (
            StatusCode::BAD_REQUEST,
            vec![error("state must be an array of strings", 9202, "parse")],
        );
    };
    // An unknown state name: the data parser's error (9207), then
    // slurmctld's refusal of the transition (2180), HTTP 500.
    if let Some(other) = states.iter().find(|st| {
        !matches!(
            st.as_str(),
            "DRAIN" | "DOWN" | "FAIL" | "UNDRAIN" | "RESUME"
        )
    }) {
        return (
            StatusCode::INTERNAL_SERVER_ERROR,
            vec![
                error(&format!("Unknown node state {other}"), 9207, "parse"),
                error(
                    "Invalid node state transition requested",
                    2180,
                    "update_node",
                ),
            ],
        );
    }
    let reason = msg["reason"]
        .as_str()
        .filter(|r| !r.is_empty())
        .map(String::from);
    let now = crate::util::unix_now();
    let settle = s.resume_settle;
    let n = s.nodes.get_mut(name).expect("checked above");
    // RESUME of a node that is neither DOWN, DRAIN nor FAIL
    // (`_valid_node_state_change` in `update_node`, node_mgr.c): refused.
    if states.contains("RESUME") && !(n.down || n.drain || n.fail) {
        return (
            StatusCode::UNPROCESSABLE_ENTITY,
            vec![error(
                "Invalid node state transition requested",
                2180,
                "update_node",
            )],
        );
    }
    // `comment` replaces the node's comment, whatever the states say
    // (Slurm `src/slurmctld/node_mgr.c`, `update_node`: `comment` is
    // applied before the state change). The Slinky operator keeps its pod
    // info there (slurm-operator `slurmcontrol.go`, `UpdateNodeWithPodInfo`).
    if let Some(c) = msg["comment"].as_str() {
        n.comment = c.to_string();
    }
    for st in &states {
        match st.as_str() {
            // A reason is not required (slurmrestd 26.05 accepted a DRAIN
            // without one: the node keeps the reason it had, if any).
            "DRAIN" | "DOWN" | "FAIL" => {
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
                if let Some(r) = &reason {
                    n.reason = Some(r.clone());
                    n.reason_set_by = Some(user.to_string());
                    n.reason_changed_at = now;
                }
            }
            // UNDRAIN also clears FAIL; both pass through NOT_RESPONDING
            // for a moment (measured on Slurm 26.05: 0.5-2 s).
            "UNDRAIN" => {
                n.drain = false;
                n.fail = false;
                n.settling_until = Some(Instant::now() + settle);
                if !n.down {
                    n.reason = None;
                    n.reason_set_by = None;
                }
            }
            _ => {
                n.drain = false;
                n.fail = false;
                n.down = false;
                n.settling_until = Some(Instant::now() + settle);
                n.reason = None;
                n.reason_set_by = None;
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

/// One HTTP/1.1 request with an optional `X-SLURM-USER-TOKEN`.
pub async fn call(
    url: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> (u16, Value) {
    use http_body_util::BodyExt as _;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<hyper::body::Bytes>>();
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("{url}{path}"));
    if let Some(t) = token {
        req = req.header("X-SLURM-USER-TOKEN", t);
    }
    let body = body
        .map(|b| serde_json::to_vec(b).unwrap_or_default())
        .unwrap_or_default();
    let Ok(req) = req
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
    else {
        return (0, Value::Null);
    };
    match client.request(req).await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            (
                status,
                serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            )
        }
        Err(_) => (0, Value::Null),
    }
}
