//! The controller's Prometheus metrics: one registry, prefix `mountguard_`,
//! the names of the runtime contract (the chart's alerts use them). Here
//! are the registry and the families every task shares (API errors, watch
//! restarts, Events written, leadership, build, tokio tasks, connections);
//! each component registers its own families beside what it measures
//! ([`Metrics::register`]: `eval/metrics.rs`, `intake/metrics.rs`,
//! `api/metrics.rs`, `runtime/token_review/metrics.rs`,
//! `remediation/metrics.rs`, `admission/metrics.rs`, all registered by
//! `run.rs`), and [`Metrics::families`] lists them all.

use std::sync::{Arc, Mutex};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The registry and the families every task shares; each component
/// registers its own families beside what it measures
/// ([`Metrics::register`], called from `run.rs`).
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// The families a component registered beside what it measures
    /// ([`Metrics::register`]).
    added: Arc<Mutex<Vec<Family>>>,
    /// `mountguard_watch_restarts_total{resource}`.
    pub watch_restarts: IntCounterVec,
    /// `mountguard_api_errors_total{operation}`.
    pub api_errors: IntCounterVec,
    /// `mountguard_events_total{reason}`.
    pub events: IntCounterVec,
    /// `mountguard_leader`.
    pub leader: IntGauge,
    /// `mountguard_tokio_alive_tasks`, read at each scrape.
    pub tokio_alive_tasks: IntGauge,
    /// `mountguard_build_info{version}`.
    pub build_info: IntGaugeVec,
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
    /// A new registry with the shared families; the components' own
    /// families are registered on it by their constructors.
    pub fn new() -> Self {
        let r = Registry::new();
        let o = |n: &str, h: &str| Opts::new(format!("mountguard_{n}"), h);
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
            watch_restarts,
            api_errors,
            events,
            leader,
            tokio_alive_tasks,
            build_info,
            connections_open,
            connections_shed,
            connections_timed_out,
            connections_parked,
        }
    }

    /// Every metric family this controller registered, with its type and
    /// label names, whether or not it has a series yet (the reference in
    /// docs/reference/metrics.md is checked against this list, from
    /// `run.rs`, which registers every component's): the shared ones and
    /// those the components registered. The destructuring names every
    /// field, so a metric added to [`Metrics`] and left out here does not
    /// compile.
    pub fn families(&self) -> Vec<Family> {
        let Self {
            registry: _,
            added,
            watch_restarts,
            api_errors,
            events,
            leader,
            tokio_alive_tasks,
            build_info,
            connections_open,
            connections_shed,
            connections_timed_out,
            connections_parked,
        } = self;
        let mut out = Vec::new();
        family(&mut out, watch_restarts);
        family(&mut out, api_errors);
        family(&mut out, events);
        family(&mut out, leader);
        family(&mut out, tokio_alive_tasks);
        family(&mut out, build_info);
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

    /// Registers `c`, a family a component keeps beside what it measures;
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

    /// Counts an API error.
    pub fn api_error(&self, operation: &str) {
        self.api_errors.with_label_values(&[operation]).inc();
    }
}
