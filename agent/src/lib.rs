//! mountguard node agent: reads, hashes and watches the Secret, ConfigMap and
//! projected volume content (and subPath targets) the kubelet serves to the
//! pods of one node, and keeps a [`mountguard_inventory::NodeInventory`] of it.
//!
//! * [`scan::Scanner`] - one pass over a kubelet root, with a cache so
//!   unchanged volumes are not re-hashed.
//! * [`daemon::Daemon`] - the long-running agent: inotify hints, debounced
//!   and periodic rescans, HTTP endpoints, metrics, clean shutdown on the
//!   one [`shutdown::Shutdown`] signal.
//! * [`report::InventorySink`] - where each new inventory goes;
//!   [`report::HttpSink`] reports it to the controller.

pub mod cli;
pub mod daemon;
pub mod metrics;
pub mod output;
pub mod report;
pub mod sandbox;
pub mod scan;
pub mod server;
pub mod shutdown;
pub mod watch;

mod safe_read;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use daemon::{Daemon, DaemonConfig};
pub use report::{Backoff, HttpSink, HttpSinkConfig, InventorySink, LogSink};

pub use scan::{Scan, ScanOptions, ScanStats, Scanner};

/// Errors of the agent library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The kubelet root (or its `pods` directory) cannot be read at all.
    #[error("kubelet root {}: {reason}; check --kubelet-root and that the agent can read it", path.display())]
    KubeletRoot {
        /// The configured kubelet root.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// The HTTP address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// The configured address.
        addr: SocketAddr,
        /// The bind error.
        source: std::io::Error,
    },
    /// inotify could not be set up.
    #[error("inotify: {0}")]
    Watch(#[from] notify::Error),
    /// A metric could not be registered.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// An I/O error outside the scan (output, signals, runtime).
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Publishing the inventory failed.
    #[error("publishing the inventory: {0}")]
    Publish(String),
    /// The report client is misconfigured (URL, CA file).
    #[error("report client: {0}")]
    ReportConfig(String),
}
