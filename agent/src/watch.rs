//! inotify hints. Events are not trusted for content: any event on a watched
//! directory only asks for a (debounced) rescan, and a periodic rescan
//! covers queue overflow, lost watches and directories that could not be
//! watched.
//!
//! Watched: `<root>/pods`, each pod's `volumes` directory and plugin
//! directories, and every volume directory (where the kubelet creates the
//! timestamped directory and renames `..data_tmp` over `..data`). inotify is
//! not recursive and the timestamped directories themselves never change,
//! so nothing below them is watched.

use std::collections::HashSet;
use std::path::PathBuf;

use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::Error;
use crate::metrics::Metrics;

/// Keeps one non-recursive watch on each directory of interest.
#[derive(Debug)]
pub struct DirWatcher {
    watcher: RecommendedWatcher,
    watched: HashSet<PathBuf>,
    metrics: Metrics,
}

impl DirWatcher {
    /// A watcher that sends a hint on `hints` for every relevant event.
    /// Hints coalesce: the channel holds at most one.
    pub fn new(hints: mpsc::Sender<()>, metrics: Metrics) -> Result<Self, Error> {
        let m = metrics.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            match res {
                // The agent's own reads open directories; opens and closes
                // say nothing about content.
                Ok(ev) if matches!(ev.kind, EventKind::Access(_)) => return,
                Ok(_) => m.watch_events.with_label_values(&["change"]).inc(),
                Err(_) => m.watch_events.with_label_values(&["error"]).inc(),
            }
            let _ = hints.try_send(());
        })?;
        Ok(Self {
            watcher,
            watched: HashSet::new(),
            metrics,
        })
    }

    /// Watches exactly `dirs`: adds new ones, drops those gone.
    pub fn sync(&mut self, dirs: &[PathBuf]) {
        let want: HashSet<&PathBuf> = dirs.iter().collect();
        let gone: Vec<PathBuf> = self
            .watched
            .iter()
            .filter(|p| !want.contains(p))
            .cloned()
            .collect();
        for p in gone {
            // The directory is usually deleted already, with its watch.
            let _ = self.watcher.unwatch(&p);
            self.watched.remove(&p);
        }
        let mut failed = 0u64;
        let mut first_error = None;
        for p in dirs {
            if self.watched.contains(p) {
                continue;
            }
            match self.watcher.watch(p, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(p.clone());
                }
                Err(e) => {
                    failed += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        if let Some(e) = first_error {
            self.metrics.watch_failures.inc_by(failed);
            tracing::warn!(
                failed,
                error = %e,
                "some directories could not be watched (fs.inotify.max_user_watches?); the periodic rescan covers them"
            );
        }
        self.metrics
            .watched_dirs
            .set(i64::try_from(self.watched.len()).unwrap_or(i64::MAX));
    }
}
