//! The controller's Prometheus metrics: one registry, prefix `mountguard_`,
//! the names of the runtime contract (the chart's alerts use them). Here
//! are the registry and the families every task shares; a feature
//! registers its own families beside what they measure
//! ([`Metrics::register`], e.g. `admission/metrics.rs`), and
//! [`Metrics::families`] lists them all.

use std::sync::{Arc, Mutex};

use foldhash::HashMap;
use mountguard_core::PodUid;

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

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

/// The registry and the families every task shares; each feature
/// registers its own families beside what it measures
/// ([`Metrics::register`], called from `run.rs`).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// The families a feature registered beside what it measures
    /// ([`Metrics::register`]).
    added: Arc<Mutex<Vec<Family>>>,
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
    /// `mountguard_report_requests_total{result}`.
    pub report_requests: IntCounterVec,
    /// `mountguard_status_requests_total{result}`.
    pub status_requests: IntCounterVec,
    /// `mountguard_tokenreview_duration_seconds`.
    pub tokenreview_duration: Histogram,
    /// `mountguard_evaluation_duration_seconds`.
    pub evaluation_duration: Histogram,
    /// `mountguard_watch_restarts_total{resource}`.
    pub watch_restarts: IntCounterVec,
    /// `mountguard_api_errors_total{operation}`.
    pub api_errors: IntCounterVec,
    /// `mountguard_events_total{reason}`.
    pub events: IntCounterVec,
    /// `mountguard_events_suppressed_total`.
    pub events_suppressed: IntCounter,
    /// `mountguard_leader`.
    pub leader: IntGauge,
    /// `mountguard_tokio_alive_tasks`, read at each scrape.
    pub tokio_alive_tasks: IntGauge,
    /// `mountguard_build_info{version}`.
    pub build_info: IntGaugeVec,
    /// `mountguard_remediation_attempts_total{phase,result}`.
    pub remediation_attempts: IntCounterVec,
    /// `mountguard_remediation_open_attempts`.
    pub remediation_open_attempts: IntGauge,
    /// `mountguard_remediation_oldest_open_attempt_age_seconds`.
    pub remediation_oldest_open_attempt_age: Gauge,
    /// `mountguard_slurm_nodes_drained`.
    pub slurm_nodes_drained: IntGauge,
    /// `mountguard_remediation_failed`.
    pub remediation_failed: IntGauge,
    /// `mountguard_remediation_failed_unresolved{owner_kind}`.
    pub remediation_failed_unresolved: IntGaugeVec,
    /// `mountguard_remediation_blocked{reason}`.
    pub remediation_blocked: IntGaugeVec,
    /// Report request latency by kind (`mountguard_report_duration_seconds{kind}`).
    pub report_duration: HistogramVec,
    /// `mountguard_report_clock_clamped_total`.
    pub report_clock_clamped: IntCounter,
    /// `mountguard_tokenreview_throttled_total{reason}`.
    pub tokenreview_throttled: IntCounterVec,
    /// `mountguard_connections_open{listener}`.
    pub connections_open: IntGaugeVec,
    /// `mountguard_connections_shed_total{listener}`.
    pub connections_shed: IntCounterVec,
    /// `mountguard_connections_timed_out_total{listener}`.
    pub connections_timed_out: IntCounterVec,
    /// `mountguard_connections_parked{listener}`.
    pub connections_parked: IntGaugeVec,
}

/// The Prometheus type of a metric, as its exposition says it.
pub trait Kind: prometheus::core::Collector {
    const KIND: &'static str;
}
macro_rules! kind {
    ($k:literal: $($t:ty),*) => { $(impl Kind for $t { const KIND: &'static str = $k; })* };
}
kind!("gauge": Gauge, IntGauge, GaugeVec, IntGaugeVec);
kind!("counter": IntCounter, IntCounterVec);
kind!("histogram": Histogram, HistogramVec);

/// Appends the families `c` describes.
fn family<C: Kind>(out: &mut Vec<Family>, c: &C) {
    out.extend(c.desc().into_iter().map(|d| Family {
        name: d.fq_name.clone(),
        kind: C::KIND,
        help: d.help.clone(),
        labels: d.variable_labels.clone(),
    }));
}

/// One registered metric family (see [`Metrics::families`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// Full name, e.g. `mountguard_mounts`.
    pub name: String,
    /// `gauge`, `counter` or `histogram`.
    pub kind: &'static str,
    /// The HELP text.
    pub help: String,
    /// Label names, in order.
    pub labels: Vec<String>,
}

/// Values of `mountguard_status_requests_total{result}`.
pub const STATUS_RESULTS: [&str; 5] = [
    "allowed",
    "unauthenticated",
    "forbidden",
    "unavailable",
    "rate_limited",
];

/// Values of `mountguard_report_requests_total{result}`.
pub const REPORT_RESULTS: [&str; 12] = [
    "accepted",
    "unchanged",
    "resend",
    "bad_request",
    "unauthenticated",
    "forbidden",
    "conflict",
    "too_large",
    "body_timeout",
    "rate_limited",
    "error",
    "not_leader",
];

/// The list behind `m` (a panic elsewhere while it was held leaves it whole:
/// pushes are its only writes).
fn lock(m: &Mutex<Vec<Family>>) -> std::sync::MutexGuard<'_, Vec<Family>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, c: T) -> T {
    r.register(Box::new(c.clone()))
        .expect("metric names are unique");
    c
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every metric in a new registry.
    pub fn new() -> Self {
        let r = Registry::new();
        let o = |n: &str, h: &str| Opts::new(format!("mountguard_{n}"), h);
        let mount_state = reg(
            &r,
            GaugeVec::new(
                o(
                    "mount_state",
                    "1 for the current state of each mount that is not Fresh or Skipped",
                ),
                &MOUNT_STATE_LABELS,
            )
            .unwrap(),
        );
        let mounts = reg(
            &r,
            IntGaugeVec::new(o("mounts", "Verified subjects by state"), &["state"]).unwrap(),
        );
        let node_inventory_timestamp = reg(
            &r,
            GaugeVec::new(
                o(
                    "node_inventory_timestamp_seconds",
                    "When the agent of the node last scanned (from its latest report)",
                ),
                &["node"],
            )
            .unwrap(),
        );
        let node_agent_reporting = reg(
            &r,
            IntGaugeVec::new(
                o(
                    "node_agent_reporting",
                    "1 when the node's agent reports within the inventory max age, for every node with pods",
                ),
                &["node"],
            )
            .unwrap(),
        );
        let nodes = reg(
            &r,
            IntGaugeVec::new(
                o("nodes", "Nodes with pods, by whether their agent reports"),
                &["reporting"],
            )
            .unwrap(),
        );
        let report_requests = reg(
            &r,
            IntCounterVec::new(
                o("report_requests_total", "Agent report requests by result"),
                &["result"],
            )
            .unwrap(),
        );
        let tokenreview_duration = reg(
            &r,
            Histogram::with_opts(
                HistogramOpts::new(
                    "mountguard_tokenreview_duration_seconds",
                    "TokenReview call latency (cache misses only)",
                )
                .buckets(vec![
                    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ]),
            )
            .unwrap(),
        );
        let evaluation_duration = reg(
            &r,
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
        let watch_restarts = reg(
            &r,
            IntCounterVec::new(
                o(
                    "watch_restarts_total",
                    "Watch (re-)lists after the first and watch errors, by resource",
                ),
                &["resource"],
            )
            .unwrap(),
        );
        let api_errors = reg(
            &r,
            IntCounterVec::new(
                o("api_errors_total", "Kubernetes API errors by operation"),
                &["operation"],
            )
            .unwrap(),
        );
        let events = reg(
            &r,
            IntCounterVec::new(o("events_total", "Events emitted by reason"), &["reason"]).unwrap(),
        );
        let events_suppressed = reg(
            &r,
            IntCounter::with_opts(o(
                "events_suppressed_total",
                "Events not emitted because of the rate limit",
            ))
            .unwrap(),
        );
        let leader = reg(
            &r,
            IntGauge::with_opts(o("leader", "1 on the acting replica")).unwrap(),
        );
        let tokio_alive_tasks = reg(
            &r,
            IntGauge::with_opts(o(
                "tokio_alive_tasks",
                "Tasks alive in the controller's tokio runtime (read at each scrape)",
            ))
            .unwrap(),
        );
        let build_info = reg(
            &r,
            IntGaugeVec::new(o("build_info", "Build information"), &["version"]).unwrap(),
        );
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        let remediation_attempts = reg(
            &r,
            IntCounterVec::new(
                o(
                    "remediation_attempts_total",
                    "Remediation attempt transitions by phase and result",
                ),
                &["phase", "result"],
            )
            .unwrap(),
        );
        let remediation_open_attempts = reg(
            &r,
            IntGauge::with_opts(o("remediation_open_attempts", "Open remediation attempts"))
                .unwrap(),
        );
        let remediation_oldest_open_attempt_age = reg(
            &r,
            Gauge::with_opts(o(
                "remediation_oldest_open_attempt_age_seconds",
                "Age of the oldest open remediation attempt",
            ))
            .unwrap(),
        );
        let slurm_nodes_drained = reg(
            &r,
            IntGauge::with_opts(o(
                "slurm_nodes_drained",
                "Slurm nodes currently drained by mountguard",
            ))
            .unwrap(),
        );
        let remediation_failed = reg(
            &r,
            IntGauge::with_opts(o(
                "remediation_failed",
                "Open failed remediation attempts with the node kept drained",
            ))
            .unwrap(),
        );
        let remediation_failed_unresolved = reg(
            &r,
            IntGaugeVec::new(
                o(
                    "remediation_failed_unresolved",
                    "Failed remediation attempts whose pod is still not fresh and is not tried again, by owner kind",
                ),
                &["owner_kind"],
            )
            .unwrap(),
        );
        for kind in mountguard_core::remediation::plan::OWNER_KINDS {
            remediation_failed_unresolved
                .with_label_values(&[kind])
                .set(0);
        }
        let remediation_blocked = reg(
            &r,
            IntGaugeVec::new(
                o("remediation_blocked", "Remediations blocked, by reason"),
                &["reason"],
            )
            .unwrap(),
        );
        remediation_blocked.with_label_values(&["pinned"]).set(0);
        let report_duration = reg(
            &r,
            HistogramVec::new(
                HistogramOpts::new(
                    "mountguard_report_duration_seconds",
                    "Report request handling time by kind",
                )
                .buckets(vec![
                    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                ]),
                &["kind"],
            )
            .unwrap(),
        );
        for r in REPORT_RESULTS {
            report_requests.with_label_values(&[r]);
        }
        let status_requests = reg(
            &r,
            IntCounterVec::new(
                o(
                    "status_requests_total",
                    "Status API requests (/v1/verdicts, /v1/rollouts) by authorization result",
                ),
                &["result"],
            )
            .unwrap(),
        );
        for s in STATUS_RESULTS {
            status_requests.with_label_values(&[s]);
        }
        for s in ["true", "false"] {
            nodes.with_label_values(&[s]).set(0);
        }
        let report_clock_clamped = reg(
            &r,
            IntCounter::with_opts(o(
                "report_clock_clamped_total",
                "Reports whose scan time was more than 5 s ahead of the controller's clock and was clamped to the receipt time (an agent node's clock is ahead)",
            ))
            .unwrap(),
        );
        let tokenreview_throttled = reg(
            &r,
            IntCounterVec::new(
                o(
                    "tokenreview_throttled_total",
                    "TokenReviews not made for unknown tokens: reason source (per-address limit) or in_flight (global limit)",
                ),
                &["reason"],
            )
            .unwrap(),
        );
        for reason in ["source", "in_flight"] {
            tokenreview_throttled.with_label_values(&[reason]);
        }
        let connections_open = reg(
            &r,
            IntGaugeVec::new(
                o(
                    "connections_open",
                    "Open connections by listener (report, metrics)",
                ),
                &["listener"],
            )
            .unwrap(),
        );
        let connections_shed = reg(
            &r,
            IntCounterVec::new(
                o(
                    "connections_shed_total",
                    "Connections closed at once because the listener's connection cap was reached",
                ),
                &["listener"],
            )
            .unwrap(),
        );
        let connections_timed_out = reg(
            &r,
            IntCounterVec::new(
                o(
                    "connections_timed_out_total",
                    "Connections closed by the header-read, idle or handshake timeout",
                ),
                &["listener"],
            )
            .unwrap(),
        );
        let connections_parked = reg(
            &r,
            IntGaugeVec::new(
                o(
                    "connections_parked",
                    "Open connections waiting for their next request with no HTTP buffers held (agents' kept-alive connections between heartbeats)",
                ),
                &["listener"],
            )
            .unwrap(),
        );
        Self {
            registry: r,
            added: Arc::default(),
            mount_state,
            mounts,
            node_inventory_timestamp,
            node_agent_reporting,
            nodes,
            report_requests,
            status_requests,
            tokenreview_duration,
            evaluation_duration,
            watch_restarts,
            api_errors,
            events,
            events_suppressed,
            leader,
            tokio_alive_tasks,
            build_info,
            remediation_attempts,
            remediation_open_attempts,
            remediation_oldest_open_attempt_age,
            slurm_nodes_drained,
            remediation_failed,
            remediation_failed_unresolved,
            remediation_blocked,
            report_duration,
            report_clock_clamped,
            tokenreview_throttled,
            connections_open,
            connections_shed,
            connections_timed_out,
            connections_parked,
        }
    }

    /// Every metric family this controller registers, with its type and
    /// label names, whether or not it has a series yet (the reference in
    /// docs/reference/metrics.md is checked against this list): the shared
    /// ones and those the features registered. The destructuring names
    /// every field, so a metric added to [`Metrics`] and left out here
    /// does not compile.
    pub fn families(&self) -> Vec<Family> {
        let Self {
            registry: _,
            added,
            mount_state,
            mounts,
            node_inventory_timestamp,
            node_agent_reporting,
            nodes,
            report_requests,
            status_requests,
            tokenreview_duration,
            evaluation_duration,
            watch_restarts,
            api_errors,
            events,
            events_suppressed,
            leader,
            tokio_alive_tasks,
            build_info,
            remediation_attempts,
            remediation_open_attempts,
            remediation_oldest_open_attempt_age,
            slurm_nodes_drained,
            remediation_failed,
            remediation_failed_unresolved,
            remediation_blocked,
            report_duration,
            report_clock_clamped,
            tokenreview_throttled,
            connections_open,
            connections_shed,
            connections_timed_out,
            connections_parked,
        } = self;
        let mut out = Vec::new();
        family(&mut out, mount_state);
        family(&mut out, mounts);
        family(&mut out, node_inventory_timestamp);
        family(&mut out, node_agent_reporting);
        family(&mut out, nodes);
        family(&mut out, report_requests);
        family(&mut out, status_requests);
        family(&mut out, tokenreview_duration);
        family(&mut out, evaluation_duration);
        family(&mut out, watch_restarts);
        family(&mut out, api_errors);
        family(&mut out, events);
        family(&mut out, events_suppressed);
        family(&mut out, leader);
        family(&mut out, tokio_alive_tasks);
        family(&mut out, build_info);
        family(&mut out, remediation_attempts);
        family(&mut out, remediation_open_attempts);
        family(&mut out, remediation_oldest_open_attempt_age);
        family(&mut out, slurm_nodes_drained);
        family(&mut out, remediation_failed);
        family(&mut out, remediation_failed_unresolved);
        family(&mut out, remediation_blocked);
        family(&mut out, report_duration);
        family(&mut out, report_clock_clamped);
        family(&mut out, tokenreview_throttled);
        family(&mut out, connections_open);
        family(&mut out, connections_shed);
        family(&mut out, connections_timed_out);
        family(&mut out, connections_parked);
        out.extend(lock(added).iter().cloned());
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The connection metrics of one listener.
    pub fn serve(&self, listener: &str) -> mountguard_serve::ServeMetrics {
        mountguard_serve::ServeMetrics {
            open: self.connections_open.with_label_values(&[listener]),
            shed: self.connections_shed.with_label_values(&[listener]),
            timed_out: self.connections_timed_out.with_label_values(&[listener]),
            parked: self.connections_parked.with_label_values(&[listener]),
        }
    }

    /// Registers `c`, a family a feature keeps beside what it measures;
    /// [`Self::families`] lists it from then on.
    pub fn register<C: Kind + Clone + 'static>(&self, c: C) -> C {
        let c = reg(&self.registry, c);
        family(&mut lock(&self.added), &c);
        c
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> Vec<u8> {
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let n = rt.metrics().num_alive_tasks();
            self.tokio_alive_tasks
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
        let mut buf = Vec::new();
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut buf);
        buf
    }

    /// Counts a report request result.
    pub fn report(&self, result: &str) {
        self.report_requests.with_label_values(&[result]).inc();
    }

    /// Records how far a report's scan time was ahead of the controller's
    /// clock (counted above 5 s).
    pub fn report_clock_skew(&self, _node: &str, ahead: std::time::Duration) {
        if ahead > std::time::Duration::from_secs(5) {
            self.report_clock_clamped.inc();
        }
    }

    /// Counts a TokenReview not made because of a limit.
    pub fn tokenreview_throttled(&self, reason: &str) {
        self.tokenreview_throttled
            .with_label_values(&[reason])
            .inc();
    }

    /// Counts an API error.
    pub fn api_error(&self, operation: &str) {
        self.api_errors.with_label_values(&[operation]).inc();
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
        m: &Metrics,
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
        m: &Metrics,
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
    pub fn flush(&mut self, m: &Metrics) {
        for s in self.unflushed.drain(..) {
            m.mounts
                .with_label_values(&[s])
                .set(self.counts.get(s).copied().unwrap_or(0));
        }
    }

    /// Removes pod `uid`'s series and counts.
    pub fn remove(&mut self, m: &Metrics, uid: &PodUid, old_counts: &[(&'static str, i64)]) {
        self.replace(m, uid, Vec::new(), old_counts, &[]);
    }

    /// Removes every series and zeroes the totals (new leader, step-down).
    pub fn clear(&mut self, m: &Metrics) {
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
