//! What Slurm sees of a worker whose `slurm.key` the agent finds stale:
//! the other side of the boundary, shown beside the verdict (its advice,
//! the status API's `slurm` field, the Event) so an operator sees both.
//!
//! The live controller reads, with slurmrestd configured, the Slurm node
//! of every NodeSet pod that has a verdict about its auth key that is not
//! Fresh ([`wanted`]), at most once per [`REFRESH`] per node ([`due`]),
//! and keeps the last read of each ([`SlurmReads`]). Which verdicts show
//! it ([`shown`]) and what they say ([`side`]) is decided here; a read
//! never changes a verdict.
//!
//! What Slurm 26.05 shows of a slurmd on a key slurmctld does not hold
//! (measured, see `docs/testing.md`, "Real Slurm"):
//! - the node is never set DOWN: slurmctld counts the slurmd's
//!   authentication-error replies as responses (`node_not_resp` in
//!   `src/slurmctld/node_mgr.c` advances `last_response`, so `ping_nodes`
//!   in `src/slurmctld/ping_nodes.c` never downs it); it flaps between
//!   `IDLE` and `IDLE+NOT_RESPONDING` with an empty reason. Its state
//!   proves nothing either way, so no finding here depends on it;
//! - `slurmd_start_time` moves only when a registration authenticates
//!   (`validate_jobs_on_node` in `src/slurmctld/job_mgr.c`, from
//!   `_slurm_rpc_node_registration` in `src/slurmctld/proc_req.c`), and a
//!   restarted slurmctld restores none (`_node_record_pack` in
//!   `src/common/node_conf.c` saves none): 0 until one does
//!   ([`SlurmNodeState::registered_since`]);
//! - a dynamic node (Slinky runs `slurmd -Z`: slurm-operator v1.2.1
//!   `internal/builder/workerbuilder/worker_app.go`, `slurmdArgs`) whose
//!   slurmd cannot authenticate never registers, so after a slurmctld
//!   restart slurmrestd may not know the node at all.

use std::collections::{BTreeSet, HashMap};

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use crate::model::SourceRef;
use crate::remediation::machine::SlurmNodeState;
use crate::verdict::{PodVerdicts, State, Subject, Verdict};

/// The file names of Slurm's auth/slurm key in a worker's volumes: the
/// key, and the key set that takes precedence over it
/// (`src/plugins/auth/slurm/internal.c`, Slurm 26.05). Slinky mounts
/// `slurm.key` in the projected volume `slurm-etc` (slurm-operator v1.2.1
/// `internal/builder/workerbuilder/worker_app.go`).
pub const KEY_FILES: [&str; 2] = ["slurm.key", "slurm.jwks"];

/// How long a read of a Slurm node is used before it is read again.
pub const REFRESH: SignedDuration = SignedDuration::from_secs(30);

/// What one read of a Slurm node answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadOutcome {
    /// The node as slurmrestd reported it.
    Node(SlurmNodeState),
    /// slurmrestd does not know the node.
    NotFound,
    /// The read failed (what failed; no token).
    Failed(String),
}

/// The last read of one Slurm node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmRead {
    /// When it was read.
    pub at: Timestamp,
    /// What it answered.
    pub outcome: ReadOutcome,
}

/// The reads the live controller keeps, by Slurm node name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlurmReads {
    /// slurmrestd is configured (otherwise no verdict shows a Slurm side).
    pub enabled: bool,
    /// The last read of each node some verdict wants.
    pub nodes: HashMap<String, SlurmRead>,
}

impl SlurmReads {
    /// What verdict `v` of `pv` shows of Slurm (`None`: nothing, see
    /// [`shown`]); `changed_at` is when a source's current content
    /// appeared (the engine's change time of each source).
    pub fn side(
        &self,
        pv: &PodVerdicts,
        v: &Verdict,
        changed_at: impl Fn(&SourceRef) -> Option<Timestamp>,
    ) -> Option<SlurmSide> {
        if !self.enabled {
            return None;
        }
        let node = shown(pv, v)?;
        let t = pv.sources(v).iter().filter_map(changed_at).max();
        Some(side(node, self.nodes.get(node), t))
    }
}

/// What Slurm shows, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SlurmFinding {
    /// slurmctld holds no registration of a slurmd started since the
    /// content changed (none at all, or one of an older slurmd).
    NotRegistered,
    /// slurmctld accepted a registration of a slurmd started since the
    /// content changed (or when it changed is not known).
    Registered,
    /// slurmrestd does not know the node.
    UnknownNode,
    /// Not read (yet, or the read failed).
    NotRead,
}

/// Whether a verdict still in alarm is told again (an Event with the same
/// reason and the new text) because what Slurm shows of its node changed
/// since its last Event said `told`: the first Event of a stale worker is
/// often written before its node was read ("not read yet"), and a later
/// read (the node has not registered since the change, or it has) is what
/// an operator needs beside the verdict. A read that failed or has not
/// happened is no news.
pub fn retell(told: Option<SlurmFinding>, now: Option<SlurmFinding>) -> bool {
    match (told, now) {
        (Some(t), Some(n)) => n != t && n != SlurmFinding::NotRead,
        _ => false,
    }
}

/// What a verdict shows of its worker's Slurm node (the status API's
/// `slurm` field).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SlurmSide {
    /// The Slurm node (the pod's hostname label).
    pub node: String,
    /// What Slurm shows, in one word.
    pub finding: SlurmFinding,
    /// When the node was read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_at: Option<Timestamp>,
    /// Its `state` array as read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<String>,
    /// Its `reason` as read.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The start time of the slurmd whose registration slurmctld last
    /// accepted (none: no accepted registration, `slurmd_start_time` 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slurmd_start_time: Option<Timestamp>,
    /// When the verdict's content changed, what the registration is
    /// compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_changed_at: Option<Timestamp>,
    /// One sentence saying all of the above.
    pub message: String,
}

/// Whether verdict `v` is about Slurm's auth key: a path it names (a file
/// that differs or is listed, or its subPath) is one of [`KEY_FILES`].
pub fn about_key(pv: &PodVerdicts, v: &Verdict) -> bool {
    let is_key = |p: &str| KEY_FILES.contains(&p.rsplit('/').next().unwrap_or(p));
    if v.differing_paths().iter().any(|p| is_key(p)) || v.files().iter().any(|f| is_key(&f.path)) {
        return true;
    }
    matches!(pv.subject(v), Subject::SubPath { sub_path, .. } if is_key(&sub_path))
}

/// The Slurm node verdict `v` shows: a NodeSet pod's (by its hostname
/// label, as remediation maps it) when `v` is Stale or Frozen and about
/// the key.
pub fn shown<'a>(pv: &'a PodVerdicts, v: &Verdict) -> Option<&'a str> {
    if !matches!(v.state, State::Stale(_) | State::Frozen(_)) {
        return None;
    }
    wanted_by(pv, v)
}

fn wanted_by<'a>(pv: &'a PodVerdicts, v: &Verdict) -> Option<&'a str> {
    pv.pod.nodeset()?;
    let node = pv.pod.slurm_node()?;
    about_key(pv, v).then_some(node)
}

/// The Slurm nodes to keep read: those of NodeSet pods with a verdict
/// about the key that is Propagating (read before it turns Stale, so its
/// Event can say what Slurm shows), Stale or Frozen.
pub fn wanted<'a>(pods: impl IntoIterator<Item = &'a PodVerdicts>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for pv in pods {
        for v in pv.verdicts.iter() {
            if matches!(
                v.state,
                State::Propagating | State::Stale(_) | State::Frozen(_)
            ) && let Some(n) = wanted_by(pv, v)
            {
                out.insert(n.to_string());
            }
        }
    }
    out
}

/// Which of `wanted` to read at `now`: never read, or last read
/// ([`SlurmReads::nodes`]) [`REFRESH`] ago or more.
pub fn due(wanted: &BTreeSet<String>, reads: &SlurmReads, now: Timestamp) -> Vec<String> {
    wanted
        .iter()
        .filter(|n| {
            reads
                .nodes
                .get(*n)
                .is_none_or(|r| now.duration_since(r.at) >= REFRESH)
        })
        .cloned()
        .collect()
}

/// What Slurm node `node` shows, read as `read` (`None`: not yet), for
/// content that changed at `changed_at`.
pub fn side(node: &str, read: Option<&SlurmRead>, changed_at: Option<Timestamp>) -> SlurmSide {
    let mut s = SlurmSide {
        node: node.to_string(),
        finding: SlurmFinding::NotRead,
        read_at: read.map(|r| r.at),
        states: Vec::new(),
        reason: String::new(),
        slurmd_start_time: None,
        content_changed_at: changed_at,
        message: String::new(),
    };
    let Some(read) = read else {
        s.message = format!("Slurm not read yet (node {node}).");
        return s;
    };
    let n = match &read.outcome {
        ReadOutcome::Failed(e) => {
            s.message = format!("Slurm not read: {}.", e.trim_end_matches('.'));
            return s;
        }
        ReadOutcome::NotFound => {
            s.finding = SlurmFinding::UnknownNode;
            s.message = format!(
                "Slurm does not know node {node}: a dynamic slurmd (a Slinky worker) that cannot \
                 authenticate never registers, so after a slurmctld restart its node may not exist."
            );
            return s;
        }
        ReadOutcome::Node(n) => n,
    };
    s.states = n.state.clone();
    s.reason = n.reason.clone();
    s.slurmd_start_time = n
        .slurmd_start_time
        .filter(|t| *t > 0)
        .and_then(|t| Timestamp::from_second(t).ok());
    let shows = format!(
        "Slurm shows it {} {}",
        if s.states.is_empty() {
            "without a state".to_string()
        } else {
            s.states.join("+")
        },
        if s.reason.is_empty() {
            "with no reason".to_string()
        } else {
            format!("with reason {:?}", s.reason)
        }
    );
    let since = |t: Option<Timestamp>| match t {
        Some(t) => format!("since the content changed at {t}"),
        None => "since slurmctld started".to_string(),
    };
    let registered = match changed_at {
        Some(t) => n.registered_since(t),
        None => s.slurmd_start_time.is_some(),
    };
    s.message = match (registered, s.slurmd_start_time) {
        (true, Some(started)) => {
            s.finding = SlurmFinding::Registered;
            let when = match changed_at {
                Some(t) => format!("after the content changed at {t}"),
                None => "(when the content changed is not known)".to_string(),
            };
            format!(
                "Slurm: node {node} registered a slurmd started at {started}, {when}, so \
                 slurmctld accepts the key that slurmd loaded: slurmctld may not have loaded the \
                 new key yet, or slurmd reads its key from another file ({shows})."
            )
        }
        (_, None) => {
            s.finding = SlurmFinding::NotRegistered;
            format!(
                "Slurm: node {node} has not registered {} (slurmctld holds no registration of \
                 its slurmd, slurmd_start_time 0); {shows}, and a slurmd on a stale key is never \
                 set DOWN: it flaps between IDLE and IDLE+NOT_RESPONDING.",
                since(changed_at)
            )
        }
        (false, Some(started)) => {
            s.finding = SlurmFinding::NotRegistered;
            format!(
                "Slurm: node {node} has not registered {} (its last accepted registration is of \
                 a slurmd started at {started}); {shows}, and a slurmd on a stale key is never \
                 set DOWN: it flaps between IDLE and IDLE+NOT_RESPONDING.",
                since(changed_at)
            )
        }
    };
    s
}

/// `advice` followed by what Slurm shows, when the verdict shows it.
pub fn with_side(advice: Option<String>, side: Option<&SlurmSide>) -> Option<String> {
    match (advice, side) {
        (Some(a), Some(s)) => Some(format!("{a} {}", s.message)),
        (None, Some(s)) => Some(s.message.clone()),
        (a, None) => a,
    }
}

#[cfg(test)]
mod tests;
