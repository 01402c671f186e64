//! What one report may cost: the counts an inventory may hold (enforced
//! per volume and pod, so one oversized volume does not blind its node),
//! the report API's settings and its listener's limits.

use std::time::Duration;

use mountguard_inventory::NodeInventory;

use crate::intake::auth::ServiceAccountRef;
use crate::runtime::limits::RateLimit;

/// Limits on what one inventory may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountLimits {
    /// Pods per inventory.
    pub pods: usize,
    /// Volumes (and subPath entries) per pod.
    pub volumes_per_pod: usize,
    /// Files per volume.
    pub files_per_volume: usize,
    /// Length of a path or name.
    pub path_len: usize,
}

impl Default for CountLimits {
    fn default() -> Self {
        Self {
            pods: 5_000,
            volumes_per_pod: 1_000,
            files_per_volume: 10_000,
            path_len: 4_096,
        }
    }
}

/// Configuration of the handler.
#[derive(Debug, Clone)]
pub struct ReportConfig {
    /// Token audience.
    pub audience: String,
    /// Agent ServiceAccount.
    pub agent_sa: ServiceAccountRef,
    /// Agent DaemonSet name.
    pub agent_daemonset: String,
    /// Largest body.
    pub max_bytes: u64,
    /// Per-node rate limit.
    pub rate: RateLimit,
    /// Count limits.
    pub limits: CountLimits,
    /// Longest time a body may take to arrive, plus one second per
    /// [`MIN_BODY_RATE`] bytes received (`--report-body-timeout`).
    pub body_timeout: Duration,
    /// Reports of one node handled at once at most (and connections one
    /// node holds, with the serve loop's [`mountguard_serve::Standing`]).
    pub node_in_flight: usize,
}

/// Default of [`ReportConfig::node_in_flight`]: an agent sends one report
/// at a time.
pub const NODE_IN_FLIGHT: usize = 4;

/// hyper's read buffer limit on the report port, which bounds a request
/// head: its minimum, 8 KiB, not the 16 KiB of the small ports. An agent's
/// request head is a projected service account token (about 1-2 KiB) and a
/// few fields. hyper's read buffer grows towards this limit while it reads
/// a large body (an inventory) and keeps what it grew to (hyper
/// `src/proto/h1/io.rs`, `Buffered::poll_read_from_io` and
/// `ReadStrategy::record`), and every agent
/// keeps its connection open between heartbeats, so the limit also bounds
/// what each idle agent connection holds after its last inventory.
pub const READ_BUFFER: usize = 8 * 1024;

/// The report port's serve limits: the header-read and idle timeouts and
/// the connection cap given, half of it for the connections of one source
/// address that no authorized report came on, [`READ_BUFFER`], and
/// [`NODE_IN_FLIGHT`] connections per node vouched for. Refused and
/// unproven connections are shed first (the serve loop's rule for every
/// listener).
pub fn limits(
    header_read_timeout: Duration,
    idle_timeout: Duration,
    max_connections: usize,
) -> mountguard_serve::Limits {
    mountguard_serve::Limits {
        header_read_timeout,
        idle_timeout,
        max_connections,
        // Agents' connections are vouched for and not counted: nodes
        // behind one address (SNAT) still get in.
        per_source: (max_connections / 2).max(1),
        max_buf_size: READ_BUFFER,
        per_identity: NODE_IN_FLIGHT,
        ..mountguard_serve::Limits::small()
    }
}

/// Applies the count limits to an inventory. Only the pod count (and an
/// overlong pod UID) refuses the whole inventory: a volume over the file
/// cap, or with an overlong path, loses its files and carries a
/// `tooLarge` error instead (so it is Unverifiable on its own), and a pod
/// over the volume cap loses its volumes and subPaths and carries a pod
/// error (all its subjects Unverifiable). The rest of the node stays
/// judged: one tenant's oversized ConfigMap cannot blind a node. Returns
/// how many volumes or pods were marked.
pub fn enforce_limits(inv: &mut NodeInventory, l: &CountLimits) -> Result<usize, String> {
    use mountguard_inventory::{ReadError, ReadErrorKind};
    if inv.pods.len() > l.pods {
        return Err(format!(
            "{} pods, at most {} allowed",
            inv.pods.len(),
            l.pods
        ));
    }
    let long = |s: &str| s.len() > l.path_len;
    let refused = |message: String| ReadError {
        path: String::new(),
        kind: ReadErrorKind::TooLarge,
        message,
    };
    let mut marked = 0;
    for p in &mut inv.pods {
        if long(&p.uid) {
            return Err("pod uid too long".into());
        }
        if p.errors.len() > l.volumes_per_pod || p.errors.iter().any(|e| long(&e.path)) {
            p.errors = vec![refused(format!(
                "more than {} pod errors or an error path over {} bytes; not judged",
                l.volumes_per_pod, l.path_len
            ))];
        }
        let too_many = p.volumes.len() > l.volumes_per_pod || p.sub_paths.len() > l.volumes_per_pod;
        let long_names = p.volumes.iter().any(|v| long(&v.name))
            || p.sub_paths
                .iter()
                .any(|s| long(&s.volume) || long(&s.container));
        if too_many || long_names {
            let message = format!(
                "the pod has {} volumes and {} subPaths (at most {} each) or a name over {} bytes; the controller refused them, the pod is not judged",
                p.volumes.len(),
                p.sub_paths.len(),
                l.volumes_per_pod,
                l.path_len
            );
            p.volumes.clear();
            p.sub_paths.clear();
            p.errors.push(refused(message));
            marked += 1;
            continue;
        }
        for v in &mut p.volumes {
            let over = v.files.len() > l.files_per_volume || v.errors.len() > l.files_per_volume;
            let long_path =
                v.files.keys().any(|k| long(k)) || v.errors.iter().any(|e| long(&e.path));
            if over || long_path {
                let message = format!(
                    "the volume has {} files and {} errors (at most {} each) or a path over {} bytes; the controller refused its content, the volume is not judged",
                    v.files.len(),
                    v.errors.len(),
                    l.files_per_volume,
                    l.path_len
                );
                v.files.clear();
                v.modes.clear();
                v.digest = None;
                v.errors = vec![refused(message)];
                marked += 1;
            }
        }
        for sp in &mut p.sub_paths {
            let over = sp.files.len() > l.files_per_volume || sp.errors.len() > l.files_per_volume;
            let long_path =
                sp.files.keys().any(|k| long(k)) || sp.errors.iter().any(|e| long(&e.path));
            if over || long_path {
                sp.files.clear();
                sp.errors = vec![refused(format!(
                    "the subPath target has more than {} files or errors, or a path over {} bytes; not judged",
                    l.files_per_volume, l.path_len
                ))];
                marked += 1;
            }
        }
    }
    Ok(marked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_or_pod_over_the_limits_is_marked_alone() {
        use mountguard_inventory::{PodInventory, ReadErrorKind, Sha256Hex, VolumeInventory};
        let vol = |name: &str, files: usize| VolumeInventory {
            plugin: mountguard_inventory::Plugin::Configmap,
            name: name.into(),
            data_dir: None,
            written_at: None,
            digest: None,
            files: (0..files)
                .map(|i| (format!("k{i}"), Sha256Hex([0; 32])))
                .collect(),
            modes: Default::default(),
            errors: vec![],
        };
        let l = CountLimits {
            pods: 3,
            volumes_per_pod: 2,
            files_per_volume: 4,
            path_len: 16,
        };
        let mut inv = NodeInventory::new("n", "t", jiff::Timestamp::now());
        inv.pods.push(PodInventory {
            uid: "a".into(),
            volumes: vec![vol("ok", 4), vol("huge", 5)],
            sub_paths: vec![],
            errors: vec![],
        });
        inv.pods.push(PodInventory {
            uid: "b".into(),
            volumes: vec![vol("x", 1), vol("y", 1), vol("z", 1)],
            sub_paths: vec![],
            errors: vec![],
        });
        inv.pods.push(PodInventory {
            uid: "c".into(),
            volumes: vec![vol("fine", 1), vol("a-name-longer-than-16", 1)],
            sub_paths: vec![],
            errors: vec![],
        });
        assert_eq!(enforce_limits(&mut inv, &l), Ok(3));
        let a = &inv.pods[0];
        assert_eq!(
            a.volumes[0].files.len(),
            4,
            "the volume at the limit is kept"
        );
        assert!(a.volumes[1].files.is_empty());
        assert_eq!(a.volumes[1].errors[0].kind, ReadErrorKind::TooLarge);
        assert!(inv.pods[1].volumes.is_empty());
        assert_eq!(inv.pods[1].errors[0].kind, ReadErrorKind::TooLarge);
        assert!(inv.pods[2].volumes.is_empty());
        inv.pods.push(inv.pods[0].clone());
        assert!(
            enforce_limits(&mut inv, &l).is_err(),
            "too many pods: refused whole"
        );
    }
}
