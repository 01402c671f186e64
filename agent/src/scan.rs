//! The scanner: one pass over a kubelet root directory, producing a
//! [`NodeInventory`].
//!
//! Layout read (see `mountguard_inventory::layout`):
//! `<root>/pods/<uid>/volumes/kubernetes.io~{secret,configmap,projected}/<name>/`
//! and `<root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`.
//!
//! For each volume: read the `..data` symlink (it must name a single
//! component starting with `..`), hash the timestamped directory it names,
//! check every visible top-level entry is a link `name -> ..data/name`, then
//! read `..data` again. If it moved (the kubelet swapped the content while
//! it was hashed) or an entry vanished, start over, at most
//! [`ScanOptions::max_attempts`] times. A volume whose `..data` target, the
//! target's identity and the volume directory are unchanged since the last
//! scan is not re-hashed: a published timestamped directory is never modified
//! in place.
//!
//! This file holds the scanner, its cache and the scan from the `pods`
//! listing to the inventory. Beside it:
//! * `walk`: the read of one pod directory, its volumes and subPaths;
//! * `confirm`: the confirmation pass, which proves from metadata alone
//!   that a pod read before is unchanged;
//! * `checks`: the checks of a volume's structure and how their findings
//!   are classified.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CStr, CString, OsStr};
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use mountguard_inventory::layout::PODS_DIR;
use mountguard_inventory::{
    NodeInventory, Plugin, PodInventory, ReadError, ReadErrorKind, VolumeInventory, escape_name,
};
use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, fstat, fstatat};

use crate::Error;
use crate::safe_read::{
    Entry, Reader, entry_type, errno_error, error, list_dir, type_name, type_of_mode,
};

mod checks;
mod confirm;
mod walk;

/// Default per-file size cap: 16 MiB.
pub const DEFAULT_MAX_FILE_SIZE: u64 = 16 * 1024 * 1024;
/// Default number of attempts to read a volume whose `..data` keeps moving.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 5;

/// What to scan and how.
#[derive(Debug, Clone)]
pub struct ScanOptions {
    /// The kubelet root directory (`/var/lib/kubelet`).
    pub kubelet_root: PathBuf,
    /// The node name written into the inventory.
    pub node: String,
    /// Files larger than this are not hashed (a `tooLarge` error instead).
    pub max_file_size: u64,
    /// Attempts per volume when `..data` moves while it is hashed.
    pub max_attempts: u32,
    /// First generation; `None` means the current time in Unix milliseconds,
    /// so generations keep increasing across agent restarts.
    pub start_generation: Option<u64>,
}

impl ScanOptions {
    /// Options with the defaults for `kubelet_root` and `node`.
    pub fn new(kubelet_root: impl Into<PathBuf>, node: impl Into<String>) -> Self {
        Self {
            kubelet_root: kubelet_root.into(),
            node: node.into(),
            max_file_size: DEFAULT_MAX_FILE_SIZE,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            start_generation: None,
        }
    }
}

/// Figures about one scan, for metrics and logs.
#[derive(Debug, Clone, Default)]
pub struct ScanStats {
    /// Pods found.
    pub pods: u64,
    /// Volumes found.
    pub volumes: u64,
    /// subPath targets found.
    pub sub_paths: u64,
    /// Files hashed or reused (volumes and subPaths).
    pub files: u64,
    /// Volumes whose content was hashed in this scan.
    pub rehashed: u64,
    /// Volumes whose `..data` target was unchanged, so the previous result was reused.
    pub reused: u64,
    /// Plugin directory listings reused because the directory was unchanged.
    pub listings_reused: u64,
    /// Read errors in the inventory, by kind.
    pub errors: BTreeMap<ReadErrorKind, u64>,
    /// Directories worth watching for changes: the pods directory, each
    /// pod's `volumes` and plugin directories, and every volume directory.
    /// Empty when `watch_dirs_unchanged`.
    pub watch_dirs: Vec<PathBuf>,
    /// Nothing was read again, so the directories to watch are those of the
    /// previous scan (not listed again in `watch_dirs`).
    pub watch_dirs_unchanged: bool,
    /// Wall time of the scan.
    pub duration: Duration,
    /// `None` for a full scan; for [`Scanner::scan_pods`], the pod
    /// directories it rescanned (`watch_dirs` then lists only the
    /// directories below them).
    pub rescanned_pods: Option<Vec<PathBuf>>,
}

/// The result of [`Scanner::scan`].
#[derive(Debug, Clone)]
pub struct Scan {
    /// The inventory, with `generation` bumped if the content changed.
    pub inventory: Arc<NodeInventory>,
    /// Whether the content (anything but `scannedAt`) differs from the
    /// previous scan. The first scan counts as a change. When it did not
    /// change, `inventory` is the previous one, `scannedAt` included.
    pub changed: bool,
    /// When this scan finished.
    pub scanned_at: Timestamp,
    /// Figures about this scan.
    pub stats: ScanStats,
}

/// Where the scanner is when it calls the test hook: after hashing a volume
/// and before reading `..data` again.
#[derive(Debug)]
pub struct HookPoint<'a> {
    /// Pod UID (escaped).
    pub pod_uid: &'a str,
    /// Plugin of the volume.
    pub plugin: Plugin,
    /// Volume name (escaped).
    pub volume: &'a str,
    /// 1 for the first attempt.
    pub attempt: u32,
}

type Hook = Box<dyn FnMut(&HookPoint<'_>) + Send>;

#[derive(Clone, PartialEq, Eq, Hash)]
struct VolumeKey {
    pod: Vec<u8>,
    plugin: Plugin,
    name: Vec<u8>,
}

/// Identity of a directory: device, inode and modification time.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct Ident {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
}

#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
fn ident(st: &FileStat) -> Ident {
    Ident {
        dev: st.st_dev as u64,
        ino: st.st_ino as u64,
        mtime: st.st_mtime as i64,
        mtime_nsec: st.st_mtime_nsec as i64,
    }
}

#[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
fn is_dir(st: &FileStat) -> bool {
    (st.st_mode as u32 & nix::sys::stat::SFlag::S_IFMT.bits() as u32)
        == nix::sys::stat::SFlag::S_IFDIR.bits() as u32
}

/// A plugin directory listing is reused only if it was taken this long
/// after the directory's last modification (timestamps can be coarse).
const LISTING_SETTLE_SECS: i64 = 2;

/// A volume cache key: the volume directory's (device, inode).
type CacheKey = (u64, u64);
/// Unchanged volumes of a pod: (index in its volumes, cache key).
type Deferred = Vec<(usize, CacheKey)>;

/// Whether [`Scanner::pod_entry`] first tries to confirm the pod from
/// metadata, or reads it (already checked, and changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Confirm {
    Try,
    No,
}

/// One pod of a scan before the inventory is (maybe) rebuilt.
enum Draft<'a> {
    /// Read (in part from the cache): the volumes confirmed unchanged are
    /// placeholders at the indices `Deferred` names.
    Read(PodInventory, Deferred),
    /// Confirmed unchanged from metadata alone: the pod directory's name
    /// and its volumes' cache keys (a range of the scan's key list).
    Confirmed(&'a [u8], std::ops::Range<usize>),
}

struct Listing {
    ident: Ident,
    settled: bool,
    entries: Arc<Vec<Entry>>,
    /// For each entry of a plugin directory listing: the identity of the
    /// volume directory when it was last confirmed with a settled mtime
    /// (its cache entry then holds its inventory), so
    /// [`Scanner::pod_unchanged`] compares one stat with it, without a
    /// cache lookup.
    volumes: Vec<Option<Ident>>,
}

impl Listing {
    fn new(ident: Ident, now: Timestamp, entries: Arc<Vec<Entry>>) -> Self {
        Self {
            ident,
            settled: settled(&ident, now),
            volumes: vec![None; entries.len()],
            entries,
        }
    }
}

/// A volume placeholder without allocations, filled in from the cache at
/// the end of the scan only if the inventory is rebuilt.
fn placeholder(plugin: Plugin) -> VolumeInventory {
    VolumeInventory {
        plugin,
        name: String::new(),
        data_dir: None,
        written_at: None,
        digest: None,
        files: BTreeMap::new(),
        modes: BTreeMap::new(),
        errors: Vec::new(),
    }
}

/// What the last read of one pod directory found, so an unchanged pod is
/// confirmed by metadata alone ([`Scanner::pod_unchanged`]).
#[derive(Default)]
struct PodState {
    /// The pod directory's identity when it was last read.
    ident: Option<Ident>,
    /// Its mtime was settled then: an unchanged mtime now proves no entry
    /// (`volumes`, `volume-subpaths`) was created, removed or renamed since.
    settled: bool,
    /// The last read found no pod-level error and no `volume-subpaths`
    /// directory (whose targets are hashed on every scan).
    clean: bool,
    /// The plugin directory listings, by [`plugin_index`].
    listings: [Option<Listing>; 3],
    seen: u64,
}

fn plugin_index(p: Plugin) -> usize {
    match p {
        Plugin::Secret => 0,
        Plugin::Configmap => 1,
        Plugin::Projected => 2,
    }
}

struct Cached {
    key: VolumeKey,
    data_dir: Vec<u8>,
    data_ident: Ident,
    volume_ident: Ident,
    /// The volume directory's mtime was settled when `..data` was last
    /// read: an unchanged mtime now proves `..data` did not move.
    volume_settled: bool,
    inventory: VolumeInventory,
    seen: u64,
}

/// Scans a kubelet root directory; keeps a cache between scans so unchanged
/// volumes are not re-hashed.
pub struct Scanner {
    opts: ScanOptions,
    reader: Reader,
    /// Keyed by the volume directory's (device, inode).
    cache: HashMap<(u64, u64), Cached>,
    pods_listing: Option<Listing>,
    /// Something in this scan may differ from the last inventory.
    dirty: bool,
    /// (index in the pod's volumes, cache key) of unchanged volumes of the
    /// pod being scanned.
    pending: Deferred,
    /// By pod directory name.
    pods: HashMap<Vec<u8>, PodState>,
    /// A reusable buffer for relative paths (no allocation per stat).
    path: Vec<u8>,
    /// A targeted scan ran since the last full one: the next full scan
    /// drops what it does not see, even if nothing changed.
    retain_pending: bool,
    /// Keep what the next scan reuses; off for [`Scanner::scan_once`].
    caching: bool,
    hook: Option<Hook>,
    scans: u64,
    generation: u64,
    last: Option<Arc<NodeInventory>>,
}

impl fmt::Debug for Scanner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scanner")
            .field("opts", &self.opts)
            .field("cached_volumes", &self.cache.len())
            .field("scans", &self.scans)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

fn timestamp(id: &Ident) -> Option<Timestamp> {
    i32::try_from(id.mtime_nsec)
        .ok()
        .and_then(|ns| Timestamp::new(id.mtime, ns).ok())
}

/// Whether a directory with identity `id`, looked at `now`, was last
/// modified long enough ago that any later change must move its mtime.
fn settled(id: &Ident, now: Timestamp) -> bool {
    timestamp(id).is_some_and(|m| {
        now.duration_since(m) > jiff::SignedDuration::from_secs(LISTING_SETTLE_SECS)
    })
}

fn cstr(s: &str) -> CString {
    // Only called with constant names without NUL bytes.
    CString::new(s).unwrap_or_default()
}

impl Scanner {
    /// A scanner with an empty cache.
    pub fn new(opts: ScanOptions) -> Self {
        let generation = opts
            .start_generation
            .unwrap_or_else(|| u64::try_from(Timestamp::now().as_millisecond()).unwrap_or(0));
        Self {
            reader: Reader::new(opts.max_file_size),
            opts,
            cache: HashMap::new(),
            pods: HashMap::new(),
            path: Vec::with_capacity(256),
            retain_pending: false,
            caching: true,
            pods_listing: None,
            dirty: true,
            pending: Vec::new(),
            hook: None,
            scans: 0,
            generation,
            last: None,
        }
    }

    /// One scan, keeping nothing for a next one: without the cache's copy
    /// of every volume's inventory, about half the memory of
    /// [`scan`](Self::scan) (what `mountguard-agent scan` uses).
    pub fn scan_once(opts: ScanOptions) -> Result<Scan, Error> {
        let mut s = Self::new(opts);
        s.caching = false;
        s.scan()
    }

    /// The options.
    pub fn options(&self) -> &ScanOptions {
        &self.opts
    }

    /// The last inventory produced, if any.
    pub fn last(&self) -> Option<&Arc<NodeInventory>> {
        self.last.as_ref()
    }

    /// Installs a hook called after a volume is hashed and before `..data`
    /// is read again, so a test can swap the content at exactly that point.
    #[doc(hidden)]
    pub fn set_after_hash_hook(&mut self, hook: impl FnMut(&HookPoint<'_>) + Send + 'static) {
        self.hook = Some(Box::new(hook));
    }

    /// Opens the kubelet root and its `pods` directory.
    fn open_pods(&self) -> Result<OwnedFd, Error> {
        let root_path = &self.opts.kubelet_root;
        let root = nix::fcntl::open(
            root_path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.root_err("cannot open the kubelet root directory", e))?;
        nix::fcntl::openat(
            &root,
            PODS_DIR,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.root_err("cannot open its pods directory", e))
    }

    fn root_err(&self, what: &str, errno: Errno) -> Error {
        Error::KubeletRoot {
            path: self.opts.kubelet_root.clone(),
            reason: format!("{what}: {}", errno.desc()),
        }
    }

    /// Scans the whole kubelet root once. Fails only when the root or its
    /// `pods` directory cannot be read at all; every other problem is an
    /// error entry in the inventory.
    pub fn scan(&mut self) -> Result<Scan, Error> {
        let started = Instant::now();
        self.scans += 1;
        let pods_dir = self.open_pods()?;
        self.dirty = false;
        let pods_ident = fstat(&pods_dir)
            .map(|st| ident(&st))
            .map_err(|e| self.root_err("cannot stat its pods directory", e))?;
        let entries = match &mut self.pods_listing {
            Some(l) if l.ident == pods_ident && l.settled => l.entries.clone(),
            _ => {
                self.dirty = true;
                let now = Timestamp::now();
                let entries = Arc::new(
                    list_dir(&pods_dir).map_err(|e| self.root_err("cannot list pods", e))?,
                );
                self.pods_listing = Some(Listing::new(pods_ident, now, entries.clone()));
                entries
            }
        };

        let pods_path = self.opts.kubelet_root.join(PODS_DIR);
        let mut stats = ScanStats {
            watch_dirs: vec![pods_path.clone()],
            ..ScanStats::default()
        };
        // Volumes confirmed unchanged stay cache keys until the end: when
        // nothing at all was read again, the last inventory is reused as is.
        let mut drafts: Vec<Draft<'_>> = Vec::with_capacity(entries.len());
        let mut keys = Vec::with_capacity(self.cache.len());
        let confirmed = self.confirm_all(&pods_dir, &entries);
        for (i, entry) in entries.iter().enumerate() {
            let kind = entry_type(&pods_dir, entry);
            let pre = match &confirmed {
                Some(c) => match (&kind, &c.pods[i]) {
                    (Ok(Type::Directory), Some((range, reused, listings))) => {
                        let start = keys.len();
                        keys.extend_from_slice(&c.keys[range.clone()]);
                        if let Some(state) = self.pods.get_mut(entry.bytes()) {
                            state.seen = self.scans;
                        }
                        stats.reused += reused;
                        stats.listings_reused += listings;
                        drafts.push(Draft::Confirmed(entry.bytes(), start..keys.len()));
                        continue;
                    }
                    // Checked already: read it.
                    _ => Confirm::No,
                },
                None => Confirm::Try,
            };
            if let Some(d) =
                self.pod_entry(&pods_dir, &entry.name, kind, pre, &mut keys, &mut stats)
            {
                drafts.push(d);
            }
        }

        // Dropping what was not seen is only needed when something changed
        // since the last full scan; pods confirmed from metadata did not
        // mark their volumes seen, their keys name them.
        if self.dirty || self.retain_pending {
            self.retain_pending = false;
            let scans = self.scans;
            let read = drafts.iter().flat_map(|d| match d {
                Draft::Read(_, refs) => refs.as_slice(),
                Draft::Confirmed(..) => &[],
            });
            for key in read.map(|(_, k)| k).chain(&keys) {
                if let Some(c) = self.cache.get_mut(key) {
                    c.seen = scans;
                }
            }
            self.cache.retain(|_, c| c.seen == scans);
            self.pods.retain(|_, c| c.seen == scans);
        }

        let scanned_at = Timestamp::now();
        let (inventory, changed) = match &self.last {
            Some(last) if !self.dirty => {
                // Nothing was read again: the same directories as after
                // the last scan.
                stats.watch_dirs = Vec::new();
                stats.watch_dirs_unchanged = true;
                (last.clone(), false)
            }
            _ => {
                let mut dirs = std::mem::take(&mut stats.watch_dirs);
                for d in &drafts {
                    if let Draft::Confirmed(name, _) = d {
                        self.unchanged_watch_dirs(&pods_path, name, &mut dirs);
                    }
                }
                stats.watch_dirs = dirs;
                let pods = self.fill(drafts, &keys);
                self.next_inventory(pods, scanned_at, None)
            }
        };
        Ok(self.finish(started, inventory, changed, scanned_at, stats))
    }

    /// Rescans only the pod directories named (by their directory names,
    /// e.g. from inotify events), and keeps every other pod of the last
    /// inventory as it is. Cost: one stat per volume of the named pods, plus
    /// hashing only what changed. Without a previous inventory this is a
    /// full [`scan`](Self::scan). A named pod that is gone (or was never
    /// there) is dropped from the inventory; a name that is not one path
    /// component is ignored.
    ///
    /// What a lost event would hide (queue overflow, an unwatchable
    /// directory) is only found by the next full scan: the daemon keeps a
    /// periodic one as a backstop.
    pub fn scan_pods<N: AsRef<[u8]>>(&mut self, names: &[N]) -> Result<Scan, Error> {
        let Some(last) = self.last.clone() else {
            return self.scan();
        };
        let started = Instant::now();
        self.scans += 1;
        let pods_dir = self.open_pods()?;
        self.dirty = false;
        self.retain_pending = true;
        let pods_path = self.opts.kubelet_root.join(PODS_DIR);
        let mut stats = ScanStats::default();
        let mut uids = std::collections::BTreeSet::new();
        let mut pod_paths = Vec::new();
        let mut cnames = Vec::new();
        for name in names {
            let bytes = name.as_ref();
            if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
                continue;
            }
            let Ok(cname) = CString::new(bytes) else {
                continue;
            };
            if uids.insert(escape_name(bytes)) {
                pod_paths.push(pods_path.join(OsStr::from_bytes(bytes)));
                cnames.push(cname);
            }
        }
        let mut drafts = Vec::with_capacity(cnames.len());
        let mut keys = Vec::new();
        for cname in &cnames {
            let kind = fstatat(
                pods_dir.as_fd(),
                cname.as_c_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map(|st| type_of_mode(st.st_mode));
            if let Some(d) =
                self.pod_entry(&pods_dir, cname, kind, Confirm::Try, &mut keys, &mut stats)
            {
                if let Draft::Confirmed(name, _) = &d {
                    let mut dirs = std::mem::take(&mut stats.watch_dirs);
                    self.unchanged_watch_dirs(&pods_path, name, &mut dirs);
                    stats.watch_dirs = dirs;
                }
                drafts.push(d);
            }
        }
        let mut fresh = self.fill(drafts, &keys);
        fresh.sort_by(|a, b| a.uid.cmp(&b.uid));
        let old: Vec<&PodInventory> = last.pods.iter().filter(|p| uids.contains(&p.uid)).collect();
        let changed = old.len() != fresh.len() || old.iter().zip(&fresh).any(|(a, b)| *a != b);
        let scanned_at = Timestamp::now();
        let (inventory, changed) = if changed {
            let pods = last
                .pods
                .iter()
                .filter(|p| !uids.contains(&p.uid))
                .cloned()
                .chain(fresh)
                .collect();
            self.next_inventory(pods, scanned_at, Some(true))
        } else {
            (last, false)
        };
        stats.rescanned_pods = Some(pod_paths);
        Ok(self.finish(started, inventory, changed, scanned_at, stats))
    }

    /// One entry of the `pods` directory: `None` when it is gone (or was
    /// removed while it was read).
    fn pod_entry<'a>(
        &mut self,
        pods_dir: &OwnedFd,
        name: &'a CStr,
        kind: Result<Type, Errno>,
        confirm: Confirm,
        keys: &mut Vec<CacheKey>,
        stats: &mut ScanStats,
    ) -> Option<Draft<'a>> {
        match kind {
            Ok(Type::Directory) => {}
            // Gone between the listing and the stat: nothing to report.
            Err(Errno::ENOENT) => return None,
            // The kubelet only creates directories here: anything else
            // is reported, never followed (a symlink could point the
            // agent at any directory on the node).
            other => {
                let e = match other {
                    Ok(Type::Symlink) => error(
                        "",
                        ReadErrorKind::SymlinkEscape,
                        "the pod entry is a symlink; not followed",
                    ),
                    Ok(t) => error(
                        "",
                        ReadErrorKind::NotRegularFile,
                        format!(
                            "the pod entry is {}, not a directory; not read",
                            type_name(t)
                        ),
                    ),
                    Err(errno) => errno_error("", "stat of the pod entry", errno),
                };
                self.dirty = true;
                let pod = PodInventory {
                    uid: escape_name(name.to_bytes()),
                    volumes: Vec::new(),
                    sub_paths: Vec::new(),
                    errors: vec![e],
                };
                return Some(Draft::Read(pod, Vec::new()));
            }
        }
        let start = keys.len();
        if confirm == Confirm::Try && self.pod_unchanged(pods_dir, name, keys, stats).is_some() {
            return Some(Draft::Confirmed(name.to_bytes(), start..keys.len()));
        }
        keys.truncate(start);
        self.pending.clear();
        let pod_path = self
            .opts
            .kubelet_root
            .join(PODS_DIR)
            .join(OsStr::from_bytes(name.to_bytes()));
        let pod = self.scan_pod(pods_dir, name, &pod_path, stats)?;
        Some(Draft::Read(pod, std::mem::take(&mut self.pending)))
    }

    /// Replaces the placeholders of unchanged volumes with their cached
    /// inventories and puts each pod's volumes in order.
    fn fill(&self, drafts: Vec<Draft<'_>>, keys: &[CacheKey]) -> Vec<PodInventory> {
        let missing = |plugin| {
            let mut v = placeholder(plugin);
            v.errors.push(error(
                "",
                ReadErrorKind::Io,
                "internal: cached volume missing; read again next scan",
            ));
            v
        };
        let mut pods = Vec::with_capacity(drafts.len());
        for d in drafts {
            let mut pod = match d {
                Draft::Read(mut pod, refs) => {
                    for (i, key) in refs {
                        pod.volumes[i] = match self.cache.get(&key) {
                            Some(c) => c.inventory.clone(),
                            None => missing(pod.volumes[i].plugin),
                        };
                    }
                    pod
                }
                Draft::Confirmed(name, range) => PodInventory {
                    uid: escape_name(name),
                    volumes: keys[range]
                        .iter()
                        .map(|k| match self.cache.get(k) {
                            Some(c) => c.inventory.clone(),
                            None => missing(Plugin::Secret),
                        })
                        .collect(),
                    sub_paths: Vec::new(),
                    errors: Vec::new(),
                },
            };
            pod.volumes
                .sort_by(|a, b| (a.plugin, &a.name).cmp(&(b.plugin, &b.name)));
            pods.push(pod);
        }
        pods
    }

    /// The inventory of `pods`, with the generation bumped when it differs
    /// from the last one (`changed` when the caller already knows).
    fn next_inventory(
        &mut self,
        mut pods: Vec<PodInventory>,
        scanned_at: Timestamp,
        changed: Option<bool>,
    ) -> (Arc<NodeInventory>, bool) {
        pods.sort_by(|a, b| a.uid.cmp(&b.uid));
        let changed =
            changed.unwrap_or_else(|| self.last.as_ref().is_none_or(|last| last.pods != pods));
        if changed && self.last.is_some() {
            self.generation += 1;
        }
        let mut inv = NodeInventory::new(
            self.opts.node.clone(),
            env!("CARGO_PKG_VERSION"),
            scanned_at,
        );
        inv.generation = self.generation;
        inv.pods = pods;
        (Arc::new(inv), changed)
    }

    /// Keeps `inventory` as the last one and counts what it holds.
    fn finish(
        &mut self,
        started: Instant,
        inventory: Arc<NodeInventory>,
        changed: bool,
        scanned_at: Timestamp,
        mut stats: ScanStats,
    ) -> Scan {
        self.last = Some(inventory.clone());
        for pod in &inventory.pods {
            stats.pods += 1;
            let mut count = |e: &ReadError| *stats.errors.entry(e.kind).or_default() += 1;
            pod.errors.iter().for_each(&mut count);
            for v in &pod.volumes {
                v.errors.iter().for_each(&mut count);
            }
            for s in &pod.sub_paths {
                s.errors.iter().for_each(&mut count);
            }
            stats.volumes += pod.volumes.len() as u64;
            stats.sub_paths += pod.sub_paths.len() as u64;
            stats.files += pod
                .volumes
                .iter()
                .map(|v| v.files.len() as u64)
                .chain(pod.sub_paths.iter().map(|s| s.files.len() as u64))
                .sum::<u64>();
        }
        stats.duration = started.elapsed();
        Scan {
            inventory,
            changed,
            scanned_at,
            stats,
        }
    }
}

#[cfg(test)]
mod tests;
