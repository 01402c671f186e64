//! inotify hints. Events are not trusted for content: an event only names
//! the pod whose directories changed, and the scan loop rescans that pod
//! (debounced; see [`crate::scan::Scanner::scan_pods`]). An event that
//! names no pod (queue overflow, an error, the `pods` directory itself)
//! asks for a full rescan, and a periodic full rescan covers lost events,
//! lost watches and directories that could not be watched.
//!
//! Watched: `<root>/pods`, each pod's `volumes` directory and plugin
//! directories, and every volume directory (where the kubelet creates the
//! timestamped directory and renames `..data_tmp` over `..data`). inotify is
//! not recursive and the timestamped directories themselves never change,
//! so nothing below them is watched.

use std::collections::{BTreeSet, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::Notify;

use crate::Error;
use crate::metrics::Metrics;

/// Most pods one targeted rescan takes: when events name more before the
/// scan loop gets to them, one full rescan is cheaper.
pub const MAX_TARGETED_PODS: usize = 256;

/// What one inotify event asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hint {
    /// Nothing (the agent's own opens and closes).
    Ignore,
    /// A full rescan: the event names no pod, or events were lost.
    Full,
    /// A rescan of these pods (directory names below `pods/`).
    Pods(Vec<Vec<u8>>),
}

/// The meaning of one event from a watcher on directories below
/// `pods_dir`.
pub fn classify(pods_dir: &Path, event: &notify::Result<Event>) -> Hint {
    let ev = match event {
        Ok(ev) => ev,
        Err(_) => return Hint::Full,
    };
    // The agent's own reads open directories; opens and closes say
    // nothing about content.
    if matches!(ev.kind, EventKind::Access(_)) {
        return Hint::Ignore;
    }
    // IN_Q_OVERFLOW: events were dropped, any pod may have changed.
    if ev.need_rescan() || ev.paths.is_empty() {
        return Hint::Full;
    }
    let mut pods = Vec::with_capacity(ev.paths.len());
    for p in &ev.paths {
        match pod_of(pods_dir, p) {
            Some(uid) => pods.push(uid.as_bytes().to_vec()),
            // The pods directory itself, or a path outside it.
            None => return Hint::Full,
        }
    }
    Hint::Pods(pods)
}

/// What the events since the last scan ask for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Hints {
    /// A full rescan.
    pub full: bool,
    /// The pods to rescan (empty when `full`).
    pub pods: BTreeSet<Vec<u8>>,
}

/// Where the watcher leaves its hints for the scan loop: coalesced and
/// bounded ([`MAX_TARGETED_PODS`]), with a wake-up.
#[derive(Debug, Default)]
pub struct HintQueue {
    hints: Mutex<Hints>,
    wake: Notify,
}

impl HintQueue {
    /// Adds what one event asks for and wakes the scan loop.
    pub fn add(&self, hint: Hint) {
        {
            let Ok(mut h) = self.hints.lock() else {
                return;
            };
            match hint {
                Hint::Ignore => return,
                Hint::Full => {
                    h.full = true;
                    h.pods.clear();
                }
                Hint::Pods(pods) if !h.full => {
                    h.pods.extend(pods);
                    if h.pods.len() > MAX_TARGETED_PODS {
                        h.full = true;
                        h.pods.clear();
                    }
                }
                Hint::Pods(_) => {}
            }
        }
        self.wake.notify_one();
    }

    /// Takes everything asked for so far.
    pub fn take(&self) -> Hints {
        self.hints
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default()
    }

    /// Resolves once a hint was added since the last wake-up.
    pub async fn wait(&self) {
        self.wake.notified().await;
    }
}

/// Keeps one non-recursive watch on each directory of interest.
#[derive(Debug)]
pub struct DirWatcher {
    watcher: RecommendedWatcher,
    watched: BTreeSet<PathBuf>,
    metrics: Metrics,
}

impl DirWatcher {
    /// A watcher that leaves a hint in `hints` for every relevant event
    /// below `pods_dir`.
    pub fn new(pods_dir: PathBuf, hints: Arc<HintQueue>, metrics: Metrics) -> Result<Self, Error> {
        let m = metrics.clone();
        let watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            let hint = classify(&pods_dir, &res);
            match (&res, &hint) {
                (_, Hint::Ignore) => return,
                (Ok(_), _) => m.watch_events.with_label_values(&["change"]).inc(),
                (Err(_), _) => m.watch_events.with_label_values(&["error"]).inc(),
            }
            hints.add(hint);
        })?;
        Ok(Self {
            watcher,
            watched: BTreeSet::new(),
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
        self.unwatch(gone);
        self.add(dirs);
    }

    /// After a rescan of the pod directories `pods` only: below them,
    /// watches exactly `dirs`; elsewhere nothing changes.
    pub fn sync_pods(&mut self, pods: &[PathBuf], dirs: &[PathBuf]) {
        let want: HashSet<&PathBuf> = dirs.iter().collect();
        let mut gone = Vec::new();
        for pod in pods {
            // Below a path in component order: one contiguous range.
            gone.extend(
                self.watched
                    .range::<Path, _>((
                        std::ops::Bound::Included(pod.as_path()),
                        std::ops::Bound::Unbounded,
                    ))
                    .take_while(|p| p.starts_with(pod))
                    .filter(|p| !want.contains(p))
                    .cloned(),
            );
        }
        self.unwatch(gone);
        self.add(dirs);
    }

    /// Whether `dir` is watched.
    pub fn is_watched(&self, dir: &Path) -> bool {
        self.watched.contains(dir)
    }

    fn unwatch(&mut self, gone: Vec<PathBuf>) {
        for p in gone {
            // The directory is usually deleted already, with its watch.
            let _ = self.watcher.unwatch(&p);
            self.watched.remove(&p);
        }
    }

    fn add(&mut self, dirs: &[PathBuf]) {
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

/// The pod directory name of `path` below `pods_dir`, if any.
pub fn pod_of<'a>(pods_dir: &Path, path: &'a Path) -> Option<&'a OsStr> {
    match path.strip_prefix(pods_dir).ok()?.components().next()? {
        Component::Normal(uid) => Some(uid),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use notify::event::{AccessKind, CreateKind, Flag, ModifyKind, RemoveKind};

    use super::*;

    fn ev(kind: EventKind, paths: &[&str]) -> notify::Result<Event> {
        let mut e = Event::new(kind);
        for p in paths {
            e = e.add_path(PathBuf::from(p));
        }
        Ok(e)
    }

    #[test]
    fn events_name_their_pod_and_anything_else_asks_for_a_full_rescan() {
        let pods = Path::new("/k/pods");
        let pod = |s: &str| Hint::Pods(vec![s.as_bytes().to_vec()]);
        // A ..data rename in a volume directory.
        assert_eq!(
            classify(
                pods,
                &ev(
                    EventKind::Modify(ModifyKind::Any),
                    &["/k/pods/u1/volumes/kubernetes.io~secret/s/..data"]
                )
            ),
            pod("u1")
        );
        // A new and a removed pod directory (events on pods/ itself).
        assert_eq!(
            classify(
                pods,
                &ev(EventKind::Create(CreateKind::Folder), &["/k/pods/u2"])
            ),
            pod("u2")
        );
        assert_eq!(
            classify(
                pods,
                &ev(EventKind::Remove(RemoveKind::Folder), &["/k/pods/u3"])
            ),
            pod("u3")
        );
        // A rename names both ends.
        assert_eq!(
            classify(
                pods,
                &ev(
                    EventKind::Modify(ModifyKind::Any),
                    &["/k/pods/a/x", "/k/pods/b/y"]
                )
            ),
            Hint::Pods(vec![b"a".to_vec(), b"b".to_vec()])
        );
        assert_eq!(
            classify(
                pods,
                &ev(EventKind::Access(AccessKind::Any), &["/k/pods/u1"])
            ),
            Hint::Ignore
        );
        // Queue overflow, errors, the pods directory itself, paths outside
        // it and events without a path: full rescan.
        let overflow = Event::new(EventKind::Other).set_flag(Flag::Rescan);
        assert_eq!(classify(pods, &Ok(overflow)), Hint::Full);
        assert_eq!(
            classify(pods, &Err(notify::Error::generic("boom"))),
            Hint::Full
        );
        assert_eq!(
            classify(pods, &ev(EventKind::Modify(ModifyKind::Any), &["/k/pods"])),
            Hint::Full
        );
        assert_eq!(
            classify(
                pods,
                &ev(EventKind::Modify(ModifyKind::Any), &["/elsewhere/u1"])
            ),
            Hint::Full
        );
        assert_eq!(classify(pods, &ev(EventKind::Any, &[])), Hint::Full);
    }

    #[test]
    fn hints_coalesce_and_too_many_pods_become_one_full_rescan() {
        let q = HintQueue::default();
        q.add(Hint::Ignore);
        assert_eq!(q.take(), Hints::default());
        q.add(Hint::Pods(vec![b"a".to_vec()]));
        q.add(Hint::Pods(vec![b"a".to_vec(), b"b".to_vec()]));
        let h = q.take();
        assert!(!h.full);
        assert_eq!(h.pods, BTreeSet::from([b"a".to_vec(), b"b".to_vec()]));
        assert_eq!(q.take(), Hints::default(), "taken");

        q.add(Hint::Pods(vec![b"a".to_vec()]));
        q.add(Hint::Full);
        q.add(Hint::Pods(vec![b"c".to_vec()]));
        assert_eq!(
            q.take(),
            Hints {
                full: true,
                pods: BTreeSet::new()
            }
        );

        for i in 0..=MAX_TARGETED_PODS {
            q.add(Hint::Pods(vec![format!("p{i}").into_bytes()]));
        }
        let h = q.take();
        assert!(h.full && h.pods.is_empty());
    }

    #[test]
    fn pod_of_names_the_first_component_below_pods() {
        let pods = Path::new("/k/pods");
        assert_eq!(
            pod_of(pods, Path::new("/k/pods/u1/volumes")),
            Some(OsStr::new("u1"))
        );
        assert_eq!(pod_of(pods, Path::new("/k/pods")), None);
        assert_eq!(pod_of(pods, Path::new("/k/other")), None);
    }
}
