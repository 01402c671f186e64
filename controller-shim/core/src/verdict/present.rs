//! How a pod's verdicts are told outside the status documents: its state
//! counts and which verdicts keep a `mountguard_mount_state` series with
//! which labels (the controller's metrics), and the text of its Events
//! (with what Slurm shows of a stale worker's node); and [`PodCheck`], what
//! a pod's verdicts were computed against, which the Events and the status
//! API both tell. Pure: the controller registers the metrics and writes
//! the Events.

use super::types::{PodVerdicts, State, UnverifiableReason, Verdict};
use crate::fingerprint::Fingerprint;
use crate::model::{CompactTime, FingerprintList, PodModel, SourceRef};
use crate::remediation::slurm_view::{SlurmSide, with_side};

/// What one pod's verdicts were computed against: the node inventory's scan
/// time and the fingerprint of every source the pod references.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodCheck {
    /// Scan time of the node inventory (none: no inventory).
    /// (Compact: 16 bytes instead of 24 in every published pod.)
    pub scanned_at: Option<CompactTime>,
    /// Keyed fingerprint of each source the pod references, in the order
    /// of [`PodModel::references`] (`None`: absent). The references are
    /// the pod's own, so they are not stored again.
    /// (Interned: pods referencing the same sources share the list; one
    /// word, so a check is 24 bytes and a published pod 48, not 56.)
    pub fingerprints: FingerprintList,
}

impl PodCheck {
    /// The fingerprint recorded for `r`: `None` when `pod` does not
    /// reference `r`, `Some(None)` when `r` was absent.
    pub fn source(&self, pod: &PodModel, r: &SourceRef) -> Option<Option<Fingerprint>> {
        let i = pod.references().iter().position(|x| x == r)?;
        self.fingerprints.get(i).copied()
    }
}

/// Subjects per state name of one pod.
pub fn counts_of(pv: &PodVerdicts) -> Vec<(&'static str, i64)> {
    let mut counts: Vec<(&'static str, i64)> = Vec::new();
    for v in pv.verdicts.iter() {
        let name = v.state.name();
        match counts.iter_mut().find(|(s, _)| *s == name) {
            Some(c) => c.1 += 1,
            None => counts.push((name, 1)),
        }
    }
    counts
}

/// Whether a verdict gets a `mountguard_mount_state` series: every state
/// but Fresh and Skipped, except the node-level reasons `NoInventory` and
/// `InventoryTooOld` (every mount of the node would get one, e.g. 1.6
/// million series while a new leader waits for the first reports);
/// `mountguard_node_agent_reporting{node} == 0` says it once per node, and
/// `mountguard_mounts{state="Unverifiable"}` still counts them.
pub fn has_series(s: &State) -> bool {
    !matches!(
        s,
        State::Fresh
            | State::Skipped(_)
            | State::Unverifiable(UnverifiableReason::NoInventory)
            | State::Unverifiable(UnverifiableReason::InventoryTooOld)
    )
}

/// The `mountguard_mount_state` labels of a verdict, in label order
/// `namespace, pod, node, volume, source_kind, source_name, state, cause`.
pub fn mount_labels(pv: &PodVerdicts, v: &Verdict) -> [String; 8] {
    let pod = &pv.pod;
    let volume = pv.subject(v).metric_label();
    let sources = pv.sources(v);
    let (kind, name) = match sources.first() {
        Some(r) => (r.kind.as_str().to_string(), r.name.to_string()),
        None => (String::new(), String::new()),
    };
    [
        pod.namespace().to_string(),
        pod.name.to_string(),
        pod.node_name().unwrap_or("").to_string(),
        volume,
        kind,
        name,
        v.state.name().to_string(),
        v.state.cause().unwrap_or("").to_string(),
    ]
}

/// The Event note of a verdict: subject, sources, fingerprints (of the
/// projected content, and of each source's content the verdict was
/// computed against), the node scan it was verified from, pinning pods,
/// the engine's explanation, and the advice, followed by what Slurm shows
/// (`slurm`, when the verdict shows it).
pub fn event_message(
    pv: &PodVerdicts,
    v: &Verdict,
    check: &PodCheck,
    slurm: Option<&SlurmSide>,
) -> String {
    let view = v.view(pv);
    let mut m = format!("{} is {}", pv.subject(v).text(), v.state.tag());
    let sources: Vec<String> = view
        .sources
        .iter()
        .map(|s| format!("{} {}", s.kind, s.name))
        .collect();
    if !sources.is_empty() {
        m.push_str(&format!(" (source {})", sources.join(", ")));
    }
    if view.expected.is_some() || view.observed.is_some() {
        m.push_str(&format!(
            "; mounted {} vs current {}",
            view.observed.map_or("-".into(), |f| f.to_string()),
            view.expected.map_or("-".into(), |f| f.to_string())
        ));
    }
    let source_fps: Vec<String> = pv
        .sources(v)
        .iter()
        .filter_map(|r| check.source(&pv.pod, r).map(|fp| (r, fp)))
        .map(|(r, fp)| {
            format!(
                "{} {} {}",
                r.kind.as_str(),
                r.name,
                fp.map_or_else(|| "(absent)".to_string(), |f| f.to_string())
            )
        })
        .collect();
    if !source_fps.is_empty() {
        m.push_str(&format!("; source content {}", source_fps.join(", ")));
    }
    if let Some(t) = check.scanned_at {
        m.push_str(&format!("; node scanned at {}", t.get()));
    }
    if !view.pinned_by.is_empty() {
        m.push_str(&format!(
            "; kubelet cache pinned by pod(s) {}",
            view.pinned_by
                .iter()
                .map(|s| &**s)
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if let Some(msg) = view.message {
        m.push_str("; ");
        m.push_str(msg);
    }
    if let Some(a) = with_side(view.advice, slurm) {
        m.push_str(". ");
        m.push_str(&a);
    }
    m
}
