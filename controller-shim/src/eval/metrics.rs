//! The evaluation task's metric families, registered beside what they
//! measure (on the shared registry, by `run.rs`): the mounts' states
//! (`mountguard_mount_state`, `mountguard_mounts`, kept pod by pod by
//! [`MountSeries`]), the nodes' reporting, the batch time and the Events
//! the rate limit held back.

use foldhash::HashMap;
use mountguard_core::PodUid;
use prometheus::{GaugeVec, Histogram, HistogramOpts, IntCounter, IntGaugeVec, Opts};

use crate::runtime::metrics::Metrics;

/// Labels of one `mountguard_mount_state` series, in label order
/// `namespace, pod, node, volume, source_kind, source_name, state, cause`.
pub type MountLabels = [String; 8];

/// Label names of `mountguard_mount_state`.
pub const MOUNT_STATE_LABELS: [&str; 8] = [
    "namespace",
    "pod",
    "node",
    "volume",
    "source_kind",
    "source_name",
    "state",
    "cause",
];

/// The evaluation's families.
#[derive(Debug, Clone)]
pub struct EvalMetrics {
    /// `mountguard_mount_state`.
    pub mount_state: GaugeVec,
    /// `mountguard_mounts{state}`.
    pub mounts: IntGaugeVec,
    /// `mountguard_node_inventory_timestamp_seconds{node}`.
    pub node_inventory_timestamp: GaugeVec,
    /// `mountguard_node_agent_reporting{node}`.
    pub node_agent_reporting: IntGaugeVec,
    /// `mountguard_nodes{reporting}`.
    pub nodes: IntGaugeVec,
    /// `mountguard_evaluation_duration_seconds`.
    pub evaluation_duration: Histogram,
    /// `mountguard_events_suppressed_total`.
    pub events_suppressed: IntCounter,
}

impl EvalMetrics {
    /// Registers the evaluation's families on `m`.
    pub fn register(m: &Metrics) -> Self {
        let mount_state = m.register(
            GaugeVec::new(
                Opts::new(
                    "mountguard_mount_state",
                    "1 for the current state of each mount that is not Fresh or Skipped",
                ),
                &MOUNT_STATE_LABELS,
            )
            .unwrap(),
        );
        let mounts = m.register(
            IntGaugeVec::new(
                Opts::new("mountguard_mounts", "Verified subjects by state"),
                &["state"],
            )
            .unwrap(),
        );
        let node_inventory_timestamp = m.register(
            GaugeVec::new(
                Opts::new(
                    "mountguard_node_inventory_timestamp_seconds",
                    "When the agent of the node last scanned (from its latest report)",
                ),
                &["node"],
            )
            .unwrap(),
        );
        let node_agent_reporting = m.register(
            IntGaugeVec::new(
                Opts::new(
                    "mountguard_node_agent_reporting",
                    "1 when the node's agent reports within the inventory max age, for every node with pods",
                ),
                &["node"],
            )
            .unwrap(),
        );
        let nodes = m.register(
            IntGaugeVec::new(
                Opts::new(
                    "mountguard_nodes",
                    "Nodes with pods, by whether their agent reports",
                ),
                &["reporting"],
            )
            .unwrap(),
        );
        for s in ["true", "false"] {
            nodes.with_label_values(&[s]).set(0);
        }
        let evaluation_duration = m.register(
            Histogram::with_opts(
                HistogramOpts::new(
                    "mountguard_evaluation_duration_seconds",
                    "Time of one incremental evaluation batch",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                ]),
            )
            .unwrap(),
        );
        let events_suppressed = m.register(
            IntCounter::with_opts(Opts::new(
                "mountguard_events_suppressed_total",
                "Events not emitted because of the rate limit",
            ))
            .unwrap(),
        );
        Self {
            mount_state,
            mounts,
            node_inventory_timestamp,
            node_agent_reporting,
            nodes,
            evaluation_duration,
            events_suppressed,
        }
    }
}

/// Per-state counts of one pod's subjects.
pub type StateCounts = Vec<(&'static str, i64)>;

/// The `mountguard_mount_state` series of every pod (kept only for pods
/// that have some) and the `mountguard_mounts` totals, replaced pod by pod
/// on each evaluation. The caller passes a pod's previous counts (it keeps
/// the previous verdicts anyway), so fully Fresh pods cost nothing here.
#[derive(Debug, Default)]
pub struct MountSeries {
    by_pod: HashMap<PodUid, Vec<MountLabels>>,
    counts: HashMap<&'static str, i64>,
    /// States whose total changed since the last flush.
    unflushed: Vec<&'static str>,
}

impl MountSeries {
    /// Replaces pod `uid`'s series with `labels` and its contribution to
    /// the per-state totals from `old_counts` to `new_counts`.
    pub fn replace(
        &mut self,
        m: &EvalMetrics,
        uid: &PodUid,
        labels: Vec<MountLabels>,
        old_counts: &[(&'static str, i64)],
        new_counts: &[(&'static str, i64)],
    ) {
        self.update(m, uid, labels, old_counts, new_counts);
        self.flush(m);
    }

    /// Like [`Self::replace`], but the per-state totals
    /// (`mountguard_mounts`) are only set by the next [`Self::flush`]: an
    /// evaluation batch updates them once, so a scrape never sees half a
    /// batch.
    pub fn update(
        &mut self,
        m: &EvalMetrics,
        uid: &PodUid,
        labels: Vec<MountLabels>,
        old_counts: &[(&'static str, i64)],
        new_counts: &[(&'static str, i64)],
    ) {
        let old = self.by_pod.remove(uid).unwrap_or_default();
        for l in &old {
            if !labels.contains(l) {
                let refs: Vec<&str> = l.iter().map(String::as_str).collect();
                let _ = m.mount_state.remove_label_values(&refs);
            }
        }
        for l in &labels {
            let refs: Vec<&str> = l.iter().map(String::as_str).collect();
            m.mount_state.with_label_values(&refs).set(1.0);
        }
        for (s, n) in old_counts {
            *self.counts.entry(s).or_default() -= n;
        }
        for (s, n) in new_counts {
            *self.counts.entry(s).or_default() += n;
        }
        for (s, _) in old_counts.iter().chain(new_counts.iter()) {
            if !self.unflushed.contains(s) {
                self.unflushed.push(s);
            }
        }
        if !labels.is_empty() {
            self.by_pod.insert(uid.clone(), labels);
        }
    }

    /// Sets the per-state totals changed since the last flush.
    pub fn flush(&mut self, m: &EvalMetrics) {
        for s in self.unflushed.drain(..) {
            m.mounts
                .with_label_values(&[s])
                .set(self.counts.get(s).copied().unwrap_or(0));
        }
    }

    /// Removes pod `uid`'s series and counts.
    pub fn remove(&mut self, m: &EvalMetrics, uid: &PodUid, old_counts: &[(&'static str, i64)]) {
        self.replace(m, uid, Vec::new(), old_counts, &[]);
    }

    /// Removes every series and zeroes the totals (new leader, step-down).
    pub fn clear(&mut self, m: &EvalMetrics) {
        for (_, labels) in self.by_pod.drain() {
            for l in labels {
                let refs: Vec<&str> = l.iter().map(String::as_str).collect();
                let _ = m.mount_state.remove_label_values(&refs);
            }
        }
        for (s, n) in self.counts.iter_mut() {
            *n = 0;
            m.mounts.with_label_values(&[s]).set(0);
        }
        self.unflushed.clear();
    }

    /// Number of pods with series.
    pub fn pods(&self) -> usize {
        self.by_pod.len()
    }
}

#[cfg(test)]
mod tests;
