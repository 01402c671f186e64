//! Landlock: the agent process restricts itself to reading.
//!
//! `readOnly: true` on the kubelet hostPath does not cover the tmpfs mounts
//! (Secret and projected volumes) that the kubelet mounts below it later
//! and that propagate into the agent's view; and the agent runs with the
//! capability to read files it does not own. Landlock closes this from the
//! inside: before any thread starts, the agent handles every filesystem
//! access right the kernel knows and grants only read rights (read file,
//! read directory) beneath the paths it reads: the kubelet root, its token
//! and CA files, `/proc` (its own descriptors, `/proc/self/fd` reopens) and
//! `/etc` (name resolution). No write, create, remove, rename, truncate or
//! device ioctl is possible anywhere, including on mounts that appear later
//! below the kubelet root (a Landlock rule is on the directory hierarchy,
//! whatever is mounted in it). Network access is not restricted (the agent
//! serves its port and connects to the controller).
//!
//! Where the kernel lacks Landlock (before 5.13, or the LSM not enabled)
//! the restriction is not enforced: the agent says so in a warning and in
//! `mountguard_agent_landlock_enforced` (0).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};

use landlock::{
    ABI, Access, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    path_beneath_rules,
};

/// The newest Landlock ABI this agent knows; the crate downgrades to what
/// the kernel supports (best effort).
const ABI_WANTED: ABI = ABI::V6;

/// -1: not tried; 0: not enforced; 1: partially; 2: fully.
static STATE: AtomicI64 = AtomicI64::new(-1);

/// What the restriction achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforced {
    /// Every requested restriction is in force.
    Fully,
    /// The kernel's Landlock is older: the rights it knows are restricted.
    Partially,
    /// The kernel has no Landlock: nothing is restricted.
    Not,
}

impl Enforced {
    /// For logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Enforced::Fully => "fully",
            Enforced::Partially => "partially",
            Enforced::Not => "not",
        }
    }
}

/// Whether the process is restricted (for the metric): 1 when Landlock is
/// enforced (fully or partially), else 0.
pub fn enforced_metric() -> i64 {
    i64::from(STATE.load(Ordering::Relaxed) > 0)
}

/// The paths the agent reads: the kubelet root and the given files (their
/// parent directories, so a rotated token written by rename stays
/// readable), `/proc` and `/etc`. Paths that do not exist are skipped.
pub fn read_paths(kubelet_root: &Path, files: &[&Path]) -> Vec<PathBuf> {
    let mut out = vec![kubelet_root.to_path_buf()];
    for f in files {
        if let Some(parent) = f.parent().filter(|p| !p.as_os_str().is_empty()) {
            out.push(parent.to_path_buf());
        }
    }
    out.push(PathBuf::from("/proc"));
    out.push(PathBuf::from("/etc"));
    out.retain(|p| p.exists());
    out
}

/// Restricts the calling thread (and every thread and process it starts
/// later) to reading beneath `paths`. Call it before starting any thread.
pub fn restrict_to_reading(paths: &[PathBuf]) -> Result<Enforced, landlock::RulesetError> {
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_WANTED))?
        .create()?
        .add_rules(path_beneath_rules(paths, AccessFs::from_read(ABI_WANTED)))?
        .restrict_self()?;
    let e = match status.ruleset {
        RulesetStatus::FullyEnforced => Enforced::Fully,
        RulesetStatus::PartiallyEnforced => Enforced::Partially,
        RulesetStatus::NotEnforced => Enforced::Not,
    };
    STATE.store(
        match e {
            Enforced::Fully => 2,
            Enforced::Partially => 1,
            Enforced::Not => 0,
        },
        Ordering::Relaxed,
    );
    Ok(e)
}

/// [`restrict_to_reading`] with the outcome logged; never fails the agent.
pub fn restrict_or_warn(paths: &[PathBuf]) -> Enforced {
    match restrict_to_reading(paths) {
        Ok(Enforced::Not) => {
            tracing::warn!(
                "Landlock is not available in this kernel: the agent is NOT restricted to reading \
                 (mountguard_agent_landlock_enforced 0); use Linux 5.13 or later with the landlock LSM enabled"
            );
            Enforced::Not
        }
        Ok(e) => {
            tracing::info!(landlock = e.as_str(), paths = ?paths, "filesystem access restricted to reading");
            e
        }
        Err(err) => {
            STATE.store(0, Ordering::Relaxed);
            tracing::warn!(error = %err, "could not apply the Landlock restriction: the agent is NOT restricted to reading");
            Enforced::Not
        }
    }
}
