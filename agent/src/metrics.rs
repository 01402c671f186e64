//! Prometheus metrics of the agent, all prefixed `mountguard_agent_`.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec,
    Opts, Registry, TextEncoder,
};

use crate::Error;
use crate::scan::Scan;
use mountguard_inventory::ReadErrorKind;

/// Every metric of the agent, registered in one registry.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// `mountguard_agent_scans_total{result="ok|error"}`
    pub scans: IntCounterVec,
    /// `mountguard_agent_targeted_scans_total`: successful scans of only the
    /// pods inotify named (also counted in `scans_total`).
    pub targeted_scans: IntCounter,
    /// `mountguard_agent_scan_duration_seconds`
    pub scan_duration: Histogram,
    /// `mountguard_agent_pods`
    pub pods: IntGauge,
    /// `mountguard_agent_volumes`
    pub volumes: IntGauge,
    /// `mountguard_agent_subpaths`
    pub sub_paths: IntGauge,
    /// `mountguard_agent_files`
    pub files: IntGauge,
    /// `mountguard_agent_read_errors{kind}`: error entries in the current inventory.
    pub read_errors: IntGaugeVec,
    /// `mountguard_agent_volume_reads_total{result="rehashed|reused"}`
    pub volume_reads: IntCounterVec,
    /// `mountguard_agent_inventory_generation`
    pub generation: IntGauge,
    /// `mountguard_agent_watch_events_total{kind="change|error"}`
    pub watch_events: IntCounterVec,
    /// `mountguard_agent_watched_directories`
    pub watched_dirs: IntGauge,
    /// `mountguard_agent_watch_failures_total`: directories that could not be watched.
    pub watch_failures: IntCounter,
    /// `mountguard_agent_last_successful_scan_timestamp_seconds`
    pub last_scan: Gauge,
    /// `mountguard_agent_publishes_total{result="ok|error"}`
    pub publishes: IntCounterVec,
}

const ERROR_KINDS: [ReadErrorKind; 8] = [
    ReadErrorKind::Permission,
    ReadErrorKind::SymlinkEscape,
    ReadErrorKind::NotRegularFile,
    ReadErrorKind::TooLarge,
    ReadErrorKind::Vanished,
    ReadErrorKind::InvalidName,
    ReadErrorKind::MountPropagation,
    ReadErrorKind::Io,
];

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, Error> {
        let registry = Registry::new();
        let p = |name: &str, help: &str| Opts::new(format!("mountguard_agent_{name}"), help);
        let scans = IntCounterVec::new(
            p("scans_total", "Scans of the kubelet root, by result."),
            &["result"],
        )?;
        let targeted_scans = IntCounter::with_opts(p(
            "targeted_scans_total",
            "Successful scans of only the pods inotify events named (also counted in scans_total); the others are full scans.",
        ))?;
        let scan_duration = Histogram::with_opts(
            HistogramOpts::new(
                "mountguard_agent_scan_duration_seconds",
                "Wall time of one scan of the kubelet root.",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
        )?;
        let pods = IntGauge::with_opts(p("pods", "Pod directories in the current inventory."))?;
        let volumes = IntGauge::with_opts(p(
            "volumes",
            "Secret, ConfigMap and projected volumes in the current inventory.",
        ))?;
        let sub_paths =
            IntGauge::with_opts(p("subpaths", "subPath targets in the current inventory."))?;
        let files = IntGauge::with_opts(p("files", "Files hashed in the current inventory."))?;
        let read_errors = IntGaugeVec::new(
            p(
                "read_errors",
                "Read error entries in the current inventory, by kind.",
            ),
            &["kind"],
        )?;
        let volume_reads = IntCounterVec::new(
            p(
                "volume_reads_total",
                "Volumes read by scans: rehashed (content hashed) or reused (..data unchanged).",
            ),
            &["result"],
        )?;
        let generation = IntGauge::with_opts(p(
            "inventory_generation",
            "Generation of the current inventory.",
        ))?;
        let watch_events = IntCounterVec::new(
            p("watch_events_total", "inotify events received, by kind."),
            &["kind"],
        )?;
        let watched_dirs = IntGauge::with_opts(p(
            "watched_directories",
            "Directories watched with inotify.",
        ))?;
        let watch_failures = IntCounter::with_opts(p(
            "watch_failures_total",
            "Directories that could not be watched (the periodic rescan still covers them).",
        ))?;
        let last_scan = Gauge::with_opts(p(
            "last_successful_scan_timestamp_seconds",
            "Unix time of the last successful scan.",
        ))?;
        let publishes = IntCounterVec::new(
            p(
                "publishes_total",
                "Inventories handed to the sink, by result.",
            ),
            &["result"],
        )?;
        let landlock = IntGauge::with_opts(p(
            "landlock_enforced",
            "1 when the agent runs restricted to reading by Landlock, 0 when the kernel lacks it.",
        ))?;
        landlock.set(crate::sandbox::enforced_metric());
        let info = IntGaugeVec::new(p("info", "Static facts about the agent."), &["version"])?;
        info.with_label_values(&[env!("CARGO_PKG_VERSION")]).set(1);
        for c in [
            Box::new(scans.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(targeted_scans.clone()),
            Box::new(scan_duration.clone()),
            Box::new(pods.clone()),
            Box::new(volumes.clone()),
            Box::new(sub_paths.clone()),
            Box::new(files.clone()),
            Box::new(read_errors.clone()),
            Box::new(volume_reads.clone()),
            Box::new(generation.clone()),
            Box::new(watch_events.clone()),
            Box::new(watched_dirs.clone()),
            Box::new(watch_failures.clone()),
            Box::new(last_scan.clone()),
            Box::new(publishes.clone()),
            Box::new(info),
            Box::new(landlock),
        ] {
            registry.register(c)?;
        }
        // Every series users alert on exists from the start, at 0 (an
        // absent series makes `rate()` and `increase()` alerts silent).
        for r in ["ok", "error"] {
            scans.with_label_values(&[r]);
            publishes.with_label_values(&[r]);
        }
        for k in ["change", "error"] {
            watch_events.with_label_values(&[k]);
        }
        for r in ["rehashed", "reused"] {
            volume_reads.with_label_values(&[r]);
        }
        for k in ERROR_KINDS {
            read_errors.with_label_values(&[k.as_str()]);
        }
        Ok(Self {
            registry,
            scans,
            targeted_scans,
            scan_duration,
            pods,
            volumes,
            sub_paths,
            files,
            read_errors,
            volume_reads,
            generation,
            watch_events,
            watched_dirs,
            watch_failures,
            last_scan,
            publishes,
        })
    }

    /// Records a successful scan.
    pub fn observe_scan(&self, scan: &Scan) {
        let s = &scan.stats;
        self.scans.with_label_values(&["ok"]).inc();
        if s.rescanned_pods.is_some() {
            self.targeted_scans.inc();
        }
        self.scan_duration.observe(s.duration.as_secs_f64());
        self.pods.set(clamp(s.pods));
        self.volumes.set(clamp(s.volumes));
        self.sub_paths.set(clamp(s.sub_paths));
        self.files.set(clamp(s.files));
        for k in ERROR_KINDS {
            let n = s.errors.get(&k).copied().unwrap_or(0);
            self.read_errors
                .with_label_values(&[k.as_str()])
                .set(clamp(n));
        }
        self.volume_reads
            .with_label_values(&["rehashed"])
            .inc_by(s.rehashed);
        self.volume_reads
            .with_label_values(&["reused"])
            .inc_by(s.reused);
        self.generation.set(clamp(scan.inventory.generation));
        self.last_scan
            .set(scan.scanned_at.as_millisecond() as f64 / 1000.0);
    }

    /// The registry (a sink registers its own metrics here).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Encoding into a Vec cannot fail for well-formed metrics; on the
        // impossible error, serve what was written.
        let _ = TextEncoder::new().encode(&self.registry.gather(), &mut out);
        out
    }
}

fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    /// issue 31 §4: every labelled series users alert on is exported at 0
    /// before its first event.
    #[test]
    fn series_exist_before_the_first_event() {
        let m = super::Metrics::new().unwrap();
        let text = String::from_utf8(m.encode()).unwrap();
        for series in [
            "mountguard_agent_watch_events_total{kind=\"change\"} 0",
            "mountguard_agent_watch_events_total{kind=\"error\"} 0",
            "mountguard_agent_scans_total{result=\"error\"} 0",
            "mountguard_agent_publishes_total{result=\"error\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing:\n{text}");
        }
    }
}
