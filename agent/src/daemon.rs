//! The long-running agent: rescans the pods inotify names (debounced) and
//! the whole kubelet root periodically (the backstop for lost events),
//! keeps the current inventory, serves HTTP, publishes to an
//! [`InventorySink`], and shuts down cleanly.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mountguard_inventory::NodeInventory;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Error;
use crate::metrics::Metrics;
use crate::report::InventorySink;
use crate::scan::{ScanOptions, Scanner};
use crate::server::{ServerState, serve};
use crate::shutdown::{Shutdown, Trigger};
use crate::watch::{DirWatcher, HintQueue};

/// Default period of the full rescan.
pub const DEFAULT_RESCAN_INTERVAL: Duration = Duration::from_secs(60);
/// Default quiet time after an inotify event before rescanning.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// What to scan.
    pub scan: ScanOptions,
    /// Address of the HTTP server; `None` runs without one.
    pub listen: Option<SocketAddr>,
    /// Period of the full rescan (the backstop for lost inotify events).
    pub rescan_interval: Duration,
    /// Period of the sink's heartbeat ([`InventorySink::heartbeat`]).
    pub heartbeat_interval: Duration,
    /// Quiet time after an inotify event before rescanning.
    pub debounce: Duration,
    /// Use inotify; without it only the periodic rescan runs.
    pub watch: bool,
}

impl DaemonConfig {
    /// Defaults for `scan`: HTTP off, 60 s rescan, 30 s heartbeat, 100 ms
    /// debounce, inotify on.
    pub fn new(scan: ScanOptions) -> Self {
        Self {
            scan,
            listen: None,
            rescan_interval: DEFAULT_RESCAN_INTERVAL,
            heartbeat_interval: crate::report::DEFAULT_HEARTBEAT_INTERVAL,
            debounce: DEFAULT_DEBOUNCE,
            watch: true,
        }
    }
}

/// A running daemon.
#[derive(Debug)]
pub struct Daemon {
    inventory: watch::Receiver<Option<Arc<NodeInventory>>>,
    stop: Trigger,
    tasks: Vec<JoinHandle<()>>,
    http_addr: Option<SocketAddr>,
    ready: Arc<AtomicBool>,
    metrics: Metrics,
}

impl Daemon {
    /// Starts the scan loop, the watcher, the publisher and (if configured)
    /// the HTTP server. Fails when the HTTP address cannot be bound or
    /// inotify cannot be initialised.
    pub async fn start<S: InventorySink>(cfg: DaemonConfig, sink: S) -> Result<Self, Error> {
        let metrics = Metrics::new()?;
        sink.register(metrics.registry())?;
        let ready = Arc::new(AtomicBool::new(false));
        let (stop, shutdown) = Shutdown::new();
        let (inv_tx, inventory) = watch::channel(None);
        let mut tasks = Vec::new();

        let mut http_addr = None;
        if let Some(addr) = cfg.listen {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(|source| Error::Listen { addr, source })?;
            http_addr = listener.local_addr().ok();
            let state = ServerState {
                metrics: metrics.clone(),
                ready: ready.clone(),
            };
            tasks.push(tokio::spawn(serve(listener, state, shutdown.clone())));
        }

        let hints = Arc::new(HintQueue::default());
        let watcher = if cfg.watch {
            let pods = cfg
                .scan
                .kubelet_root
                .join(mountguard_inventory::layout::PODS_DIR);
            Some(DirWatcher::new(pods, hints.clone(), metrics.clone())?)
        } else {
            None
        };
        let scanner = Scanner::new(cfg.scan.clone());
        tasks.push(tokio::spawn(scan_loop(ScanLoop {
            scanner,
            watcher,
            hints,
            rescan_interval: cfg.rescan_interval,
            debounce: cfg.debounce,
            inventory: inv_tx,
            metrics: metrics.clone(),
            ready: ready.clone(),
            shutdown: shutdown.clone(),
        })));
        tasks.push(tokio::spawn(publish_loop(
            sink,
            inventory.clone(),
            cfg.heartbeat_interval,
            metrics.clone(),
            shutdown,
        )));
        Ok(Self {
            inventory,
            stop,
            tasks,
            http_addr,
            ready,
            metrics,
        })
    }

    /// The current inventory (`None` before the first successful scan);
    /// changes with every new generation.
    pub fn inventory(&self) -> watch::Receiver<Option<Arc<NodeInventory>>> {
        self.inventory.clone()
    }

    /// The bound HTTP address, if the server runs.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Whether the first full scan completed.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Stops every task and waits for them (the HTTP server drains open
    /// connections for at most a few seconds; a scan in progress finishes).
    pub async fn shutdown(self) {
        self.stop.fire();
        for t in self.tasks {
            if let Err(e) = t.await {
                tracing::error!(error = %e, "agent task failed");
            }
        }
    }
}

struct ScanLoop {
    scanner: Scanner,
    watcher: Option<DirWatcher>,
    hints: Arc<HintQueue>,
    rescan_interval: Duration,
    debounce: Duration,
    inventory: watch::Sender<Option<Arc<NodeInventory>>>,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    shutdown: Shutdown,
}

/// What the scan loop does next.
enum Next {
    /// Everything (the first scan, the periodic backstop, or events that
    /// name no pod).
    Full(&'static str),
    /// Only the pods named by events.
    Pods(Vec<Vec<u8>>),
}

async fn scan_loop(mut l: ScanLoop) {
    let mut scanner = Some(l.scanner);
    let mut ticker = tokio::time::interval(l.rescan_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let watching = l.watcher.is_some();
    loop {
        // The first tick fires at once: the initial full scan.
        let next = tokio::select! {
            biased;
            () = l.shutdown.wait() => break,
            _ = ticker.tick() => {
                // The full scan covers whatever was asked for so far.
                l.hints.take();
                Next::Full("periodic")
            }
            () = l.hints.wait(), if watching => {
                // Debounce: let the kubelet finish its steps, then take
                // every hint that arrived meanwhile; one scan covers them.
                tokio::select! {
                    () = l.shutdown.wait() => break,
                    () = tokio::time::sleep(l.debounce) => {}
                }
                let hints = l.hints.take();
                if hints.full {
                    Next::Full("watch")
                } else if hints.pods.is_empty() {
                    continue;
                } else {
                    Next::Pods(hints.pods.into_iter().collect())
                }
            }
        };
        let Some(mut s) = scanner.take() else { break };
        let (reason, targeted) = match &next {
            Next::Full(reason) => (*reason, 0),
            Next::Pods(pods) => ("watch", pods.len()),
        };
        let joined = tokio::task::spawn_blocking(move || {
            let r = match next {
                Next::Full(_) => s.scan(),
                Next::Pods(pods) => s.scan_pods(&pods),
            };
            (s, r)
        })
        .await;
        let (s, result) = match joined {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "scan task failed");
                break;
            }
        };
        scanner = Some(s);
        match result {
            Ok(scan) => {
                l.metrics.observe_scan(&scan);
                if let Some(w) = l.watcher.as_mut() {
                    match &scan.stats.rescanned_pods {
                        Some(pods) => w.sync_pods(pods, &scan.stats.watch_dirs),
                        None if scan.stats.watch_dirs_unchanged => {}
                        None => w.sync(&scan.stats.watch_dirs),
                    }
                }
                tracing::debug!(
                    reason,
                    targeted_pods = targeted,
                    generation = scan.inventory.generation,
                    changed = scan.changed,
                    rehashed = scan.stats.rehashed,
                    reused = scan.stats.reused,
                    duration_ms = scan.stats.duration.as_secs_f64() * 1000.0,
                    "scan"
                );
                // Ready before the first inventory is visible, so whoever
                // sees an inventory also sees the agent ready.
                if !l.ready.swap(true, Ordering::AcqRel) {
                    tracing::info!(
                        pods = scan.stats.pods,
                        volumes = scan.stats.volumes,
                        "first full scan complete; ready"
                    );
                }
                if scan.changed {
                    l.inventory.send_replace(Some(scan.inventory));
                }
            }
            Err(e) => {
                l.metrics.scans.with_label_values(&["error"]).inc();
                tracing::warn!(error = %e, "scan failed");
            }
        }
    }
}

async fn publish_loop<S: InventorySink>(
    sink: S,
    mut inventory: watch::Receiver<Option<Arc<NodeInventory>>>,
    heartbeat: Duration,
    metrics: Metrics,
    mut shutdown: Shutdown,
) {
    let mut ticker = tokio::time::interval(heartbeat);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    let mut inventory_open = true;
    // A generation that arrived while the previous publish ran.
    let mut pending = false;
    loop {
        let is_heartbeat = if pending {
            pending = false;
            false
        } else {
            tokio::select! {
                biased;
                () = shutdown.wait() => break,
                changed = inventory.changed(), if inventory_open => {
                    if changed.is_err() {
                        inventory_open = false;
                        continue;
                    }
                    false
                }
                _ = ticker.tick() => true,
            }
        };
        let current = inventory.borrow_and_update().clone();
        let Some(inv) = current else { continue };
        let result = {
            let fut = async {
                if is_heartbeat {
                    let scanned_at = last_scan(&metrics).unwrap_or(inv.scanned_at);
                    sink.heartbeat(&inv, scanned_at).await
                } else {
                    sink.publish(&inv).await
                }
            };
            tokio::pin!(fut);
            loop {
                tokio::select! {
                    biased;
                    () = shutdown.wait() => return,
                    r = &mut fut => break r,
                    changed = inventory.changed(), if inventory_open && !pending => {
                        if changed.is_err() {
                            inventory_open = false;
                            continue;
                        }
                        pending = true;
                        if let Some(g) = inventory.borrow().as_ref().map(|i| i.generation) {
                            sink.superseded(g);
                        }
                    }
                }
            }
        };
        let label = if result.is_ok() { "ok" } else { "error" };
        metrics.publishes.with_label_values(&[label]).inc();
        if let Err(e) = result {
            tracing::warn!(error = %e, generation = inv.generation, heartbeat = is_heartbeat, "publishing the inventory failed");
        }
    }
}

/// The time of the last successful scan, from the metric the scan loop sets.
fn last_scan(metrics: &Metrics) -> Option<jiff::Timestamp> {
    let secs = metrics.last_scan.get();
    if secs <= 0.0 {
        return None;
    }
    jiff::Timestamp::from_millisecond((secs * 1000.0).round() as i64).ok()
}
