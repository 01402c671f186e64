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
mod tests {
    use std::os::unix::fs::{PermissionsExt, symlink};
    use std::path::Path;

    use mountguard_inventory::layout::{DATA_LINK, pod_dir, subpath_target, volume_dir};
    use mountguard_inventory::writer::{AtomicWriterDouble, Payload, PayloadFile};
    use mountguard_inventory::{Sha256Hex, file_digest, volume_digest};

    use super::confirm::PARALLEL_CONFIRM_MIN_PODS;
    use super::*;

    fn payload(items: &[(&str, &[u8])]) -> Payload {
        items
            .iter()
            .map(|(p, d)| (p.to_string(), PayloadFile::new(d.to_vec())))
            .collect()
    }

    fn expected(items: &[(&str, &[u8])]) -> BTreeMap<String, Sha256Hex> {
        items
            .iter()
            .map(|(p, d)| (p.to_string(), Sha256Hex(file_digest(d))))
            .collect()
    }

    fn digest_of(files: &BTreeMap<String, Sha256Hex>) -> Sha256Hex {
        Sha256Hex(volume_digest(files.iter().map(|(p, d)| (p.as_str(), &d.0))))
    }

    fn root() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(PODS_DIR)).unwrap();
        dir
    }

    fn writer(root: &Path, uid: &str, plugin: Plugin, name: &str) -> AtomicWriterDouble {
        AtomicWriterDouble::new(volume_dir(root, uid, plugin, name))
    }

    fn scanner(root: &Path) -> Scanner {
        let mut opts = ScanOptions::new(root, "node-a");
        opts.start_generation = Some(100);
        Scanner::new(opts)
    }

    fn volume<'a>(
        inv: &'a NodeInventory,
        uid: &str,
        plugin: Plugin,
        name: &str,
    ) -> &'a VolumeInventory {
        inv.pod(uid)
            .unwrap_or_else(|| panic!("pod {uid} missing"))
            .volumes
            .iter()
            .find(|v| v.plugin == plugin && v.name == name)
            .unwrap_or_else(|| panic!("volume {name} missing"))
    }

    fn kinds(errors: &[ReadError]) -> Vec<ReadErrorKind> {
        errors.iter().map(|e| e.kind).collect()
    }

    #[test]
    fn first_write_is_read_with_digest_modes_and_data_dir() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Secret, "auth");
        let mut p = payload(&[("slurm.key", b"key-1")]);
        p.insert(
            "jwt.key".into(),
            PayloadFile::with_mode(b"jwt".to_vec(), 0o600),
        );
        w.write(&p).unwrap();

        let scan = scanner(r.path()).scan().unwrap();
        assert!(scan.changed);
        assert_eq!(scan.inventory.generation, 100);
        assert_eq!(scan.inventory.node, "node-a");
        let v = volume(&scan.inventory, "u1", Plugin::Secret, "auth");
        let files = expected(&[("slurm.key", b"key-1"), ("jwt.key", b"jwt")]);
        assert_eq!(v.files, files);
        assert_eq!(v.digest, Some(digest_of(&files)));
        assert_eq!(v.modes["jwt.key"], "0600");
        assert_eq!(v.modes["slurm.key"], "0644");
        assert_eq!(v.data_dir, w.current_data_dir());
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        let ts_meta = std::fs::metadata(w.target().join(v.data_dir.as_ref().unwrap())).unwrap();
        let mtime = jiff::Timestamp::try_from(ts_meta.modified().unwrap()).unwrap();
        assert_eq!(v.written_at, Some(mtime));
        assert_eq!(scan.stats.rehashed, 1);
        assert_eq!(scan.stats.files, 2);
    }

    /// Every directory below `pods/` (and `pods/` itself) last modified an
    /// hour ago, as on a node whose pods started long before: listings and
    /// volume identities are then settled and reusable.
    fn age(root: &Path) {
        fn walk(d: &Path, old: std::time::SystemTime) {
            for e in std::fs::read_dir(d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path(), old);
                }
            }
            std::fs::File::open(d).unwrap().set_modified(old).unwrap();
        }
        walk(
            &root.join(PODS_DIR),
            std::time::SystemTime::now() - Duration::from_secs(3600),
        );
    }

    #[test]
    fn settled_pods_are_confirmed_by_metadata_and_any_change_is_still_read() {
        let r = root();
        let wa = writer(r.path(), "a", Plugin::Secret, "s");
        wa.write(&payload(&[("k", b"a1")])).unwrap();
        writer(r.path(), "a", Plugin::Projected, "p")
            .write(&payload(&[("t", b"tok")]))
            .unwrap();
        let wb = writer(r.path(), "b", Plugin::Configmap, "c");
        wb.write(&payload(&[("k", b"b1")])).unwrap();
        age(r.path());
        let mut s = scanner(r.path());
        let first = s.scan().unwrap();
        // The second scan confirms `..data` of each volume once more; from
        // the third on, a pod costs one stat per directory, nothing opened.
        s.scan().unwrap();
        let third = s.scan().unwrap();
        assert!(!third.changed);
        assert!(Arc::ptr_eq(&third.inventory, &first.inventory));
        assert!(third.stats.watch_dirs_unchanged);
        assert_eq!((third.stats.rehashed, third.stats.reused), (0, 3));
        assert_eq!(third.stats.listings_reused, 3);

        // A swap in a settled pod moves its volume directory's mtime.
        wa.write(&payload(&[("k", b"a2")])).unwrap();
        let swapped = s.scan().unwrap();
        assert!(swapped.changed);
        assert_eq!(swapped.stats.rehashed, 1);
        let v = volume(&swapped.inventory, "a", Plugin::Secret, "s");
        assert_eq!(v.files, expected(&[("k", b"a2")]));
        assert_eq!(
            volume(&swapped.inventory, "b", Plugin::Configmap, "c").files,
            expected(&[("k", b"b1")])
        );
        // The rebuilt inventory lists every directory to watch again.
        assert!(!swapped.stats.watch_dirs_unchanged);
        let vol_b = volume_dir(r.path(), "b", Plugin::Configmap, "c");
        assert!(swapped.stats.watch_dirs.contains(&vol_b));

        // A new volume directory in a settled plugin directory, and a new
        // subPaths directory in a settled pod.
        age(r.path());
        s.scan().unwrap();
        s.scan().unwrap();
        writer(r.path(), "b", Plugin::Configmap, "c2")
            .write(&payload(&[("k", b"new")]))
            .unwrap();
        let target = subpath_target(r.path(), "a", "s", "ctr", 0);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, b"a2").unwrap();
        let grown = s.scan().unwrap();
        assert!(grown.changed);
        assert_eq!(
            volume(&grown.inventory, "b", Plugin::Configmap, "c2").files,
            expected(&[("k", b"new")])
        );
        assert_eq!(grown.inventory.pod("a").unwrap().sub_paths.len(), 1);
    }

    #[test]
    fn with_many_pods_the_parallel_confirmation_still_reads_every_change() {
        // Enough pods for the full scan to confirm them on several threads
        // (when this machine lets the process use more than one CPU).
        let n = PARALLEL_CONFIRM_MIN_PODS + 44;
        let r = root();
        let uid = |i: usize| format!("pod-{i:04}");
        for i in 0..n {
            writer(r.path(), &uid(i), Plugin::Secret, "s")
                .write(&payload(&[("k", format!("v{i}").as_bytes())]))
                .unwrap();
        }
        age(r.path());
        let mut s = scanner(r.path());
        let first = s.scan().unwrap();
        s.scan().unwrap();
        let settled = s.scan().unwrap();
        assert!(!settled.changed);
        assert!(Arc::ptr_eq(&settled.inventory, &first.inventory));
        assert_eq!(
            (settled.stats.rehashed, settled.stats.reused),
            (0, n as u64)
        );
        assert_eq!(settled.stats.listings_reused, n as u64);

        // A swap in one pod of the first thread's share and one of the
        // last's, a new volume in a third, a removed pod: each read, the
        // rest confirmed.
        writer(r.path(), &uid(3), Plugin::Secret, "s")
            .write(&payload(&[("k", b"swapped-3")]))
            .unwrap();
        writer(r.path(), &uid(n - 2), Plugin::Secret, "s")
            .write(&payload(&[("k", b"swapped-last")]))
            .unwrap();
        writer(r.path(), &uid(n / 2), Plugin::Configmap, "c")
            .write(&payload(&[("k", b"new")]))
            .unwrap();
        std::fs::remove_dir_all(r.path().join(PODS_DIR).join(uid(7))).unwrap();
        let changed = s.scan().unwrap();
        assert!(changed.changed);
        assert_eq!(changed.stats.rehashed, 3, "{:?}", changed.stats);
        // All but the removed pod's and the two swapped volumes (the new
        // volume's pod keeps its other one).
        assert_eq!(changed.stats.reused, (n - 3) as u64);
        let inv = &changed.inventory;
        assert_eq!(
            volume(inv, &uid(3), Plugin::Secret, "s").files,
            expected(&[("k", b"swapped-3")])
        );
        assert_eq!(
            volume(inv, &uid(n - 2), Plugin::Secret, "s").files,
            expected(&[("k", b"swapped-last")])
        );
        assert_eq!(
            volume(inv, &uid(n / 2), Plugin::Configmap, "c").files,
            expected(&[("k", b"new")])
        );
        assert!(inv.pod(&uid(7)).is_none());
        assert_eq!(inv.pods.len(), n - 1);
        // Every other pod as before.
        for i in [100, n - 10] {
            assert_eq!(
                volume(inv, &uid(i), Plugin::Secret, "s").files,
                expected(&[("k", format!("v{i}").as_bytes())])
            );
        }
        // A pod entry replaced by a symlink is reported, never followed.
        let pods = r.path().join(PODS_DIR);
        std::fs::remove_dir_all(pods.join(uid(9))).unwrap();
        std::os::unix::fs::symlink(pods.join(uid(10)), pods.join(uid(9))).unwrap();
        let linked = s.scan().unwrap();
        let p9 = linked.inventory.pod(&uid(9)).unwrap();
        assert!(p9.volumes.is_empty(), "{p9:?}");
        assert_eq!(kinds(&p9.errors), [ReadErrorKind::SymlinkEscape]);
    }

    #[test]
    fn targeted_scan_reads_only_the_named_pods_and_the_full_scan_catches_the_rest() {
        let r = root();
        let wa = writer(r.path(), "a", Plugin::Secret, "s");
        wa.write(&payload(&[("k", b"a1")])).unwrap();
        let wb = writer(r.path(), "b", Plugin::Secret, "s");
        wb.write(&payload(&[("k", b"b1")])).unwrap();
        writer(r.path(), "c", Plugin::Configmap, "c")
            .write(&payload(&[("k", b"c1")]))
            .unwrap();
        age(r.path());
        let mut s = scanner(r.path());
        let first = s.scan().unwrap();
        s.scan().unwrap();

        // Changes everywhere; the events name only pod a.
        wa.write(&payload(&[("k", b"a2")])).unwrap();
        wb.write(&payload(&[("k", b"b2")])).unwrap();
        std::fs::remove_dir_all(pod_dir(r.path(), "c")).unwrap();
        writer(r.path(), "d", Plugin::Secret, "s")
            .write(&payload(&[("k", b"d1")]))
            .unwrap();
        let targeted = s.scan_pods(&[b"a".as_slice()]).unwrap();
        assert!(targeted.changed);
        assert_eq!(
            targeted.inventory.generation,
            first.inventory.generation + 1
        );
        assert_eq!(
            targeted.stats.rescanned_pods,
            Some(vec![pod_dir(r.path(), "a")])
        );
        assert_eq!((targeted.stats.rehashed, targeted.stats.reused), (1, 0));
        let inv = &targeted.inventory;
        assert_eq!(
            volume(inv, "a", Plugin::Secret, "s").files,
            expected(&[("k", b"a2")])
        );
        // Nothing else was looked at: b is as it was, c and d as they were.
        assert_eq!(
            volume(inv, "b", Plugin::Secret, "s").files,
            expected(&[("k", b"b1")])
        );
        assert!(inv.pod("c").is_some() && inv.pod("d").is_none());
        assert_eq!(targeted.stats.pods, 3);
        let vol_a = volume_dir(r.path(), "a", Plugin::Secret, "s");
        assert!(targeted.stats.watch_dirs.contains(&vol_a));
        assert!(
            targeted
                .stats
                .watch_dirs
                .iter()
                .all(|d| d.starts_with(pod_dir(r.path(), "a"))),
            "{:?}",
            targeted.stats.watch_dirs
        );

        // A named pod that is gone is dropped; naming it again changes nothing.
        let removed = s.scan_pods(&[b"c".as_slice()]).unwrap();
        assert!(removed.changed && removed.inventory.pod("c").is_none());
        let again = s.scan_pods(&[b"c".as_slice(), b"a".as_slice()]).unwrap();
        assert!(!again.changed);
        assert!(Arc::ptr_eq(&again.inventory, &removed.inventory));

        // The full scan (the daemon's periodic backstop) finds what no
        // event named: b's swap and the new pod d.
        let full = s.scan().unwrap();
        assert!(full.changed);
        assert!(full.stats.rescanned_pods.is_none());
        let inv = &full.inventory;
        assert_eq!(
            volume(inv, "b", Plugin::Secret, "s").files,
            expected(&[("k", b"b2")])
        );
        assert_eq!(
            volume(inv, "d", Plugin::Secret, "s").files,
            expected(&[("k", b"d1")])
        );
        assert_eq!(
            volume(inv, "a", Plugin::Secret, "s").files,
            expected(&[("k", b"a2")])
        );
        assert!(inv.pod("c").is_none());
        assert_eq!(full.stats.rehashed, 2, "b and d, not a again");
        // And it agrees with a scanner that never saw the targeted scans.
        assert_eq!(inv.pods, scanner(r.path()).scan().unwrap().inventory.pods);
    }

    #[test]
    fn scan_once_reads_the_same_inventory_and_keeps_no_cache() {
        let r = root();
        writer(r.path(), "a", Plugin::Secret, "s")
            .write(&payload(&[("k", b"1")]))
            .unwrap();
        writer(r.path(), "a", Plugin::Configmap, "c")
            .write(&payload(&[("k", b"2"), ("d/e", b"3")]))
            .unwrap();
        let mut opts = ScanOptions::new(r.path(), "node-a");
        opts.start_generation = Some(100);
        let once = Scanner::scan_once(opts).unwrap();
        let cached = scanner(r.path()).scan().unwrap();
        assert_eq!(once.inventory.pods, cached.inventory.pods);
        assert_eq!(once.stats.rehashed, 2);
    }

    #[test]
    fn targeted_scan_without_a_previous_inventory_is_a_full_scan() {
        let r = root();
        writer(r.path(), "a", Plugin::Secret, "s")
            .write(&payload(&[("k", b"1")]))
            .unwrap();
        writer(r.path(), "b", Plugin::Secret, "s")
            .write(&payload(&[("k", b"2")]))
            .unwrap();
        let scan = scanner(r.path()).scan_pods(&[b"a".as_slice()]).unwrap();
        assert!(scan.stats.rescanned_pods.is_none());
        assert_eq!(scan.inventory.pods.len(), 2);
    }

    #[test]
    fn update_bumps_generation_and_unchanged_volumes_are_not_rehashed() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Configmap, "cfg");
        w.write(&payload(&[("a", b"1")])).unwrap();
        writer(r.path(), "u1", Plugin::Secret, "steady")
            .write(&payload(&[("s", b"same")]))
            .unwrap();
        // Directories last modified long ago: their listings are reusable.
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        let volumes = pod_dir(r.path(), "u1").join("volumes");
        for d in [
            r.path().join(PODS_DIR),
            volumes.join(Plugin::Configmap.dir_name()),
            volumes.join(Plugin::Secret.dir_name()),
        ] {
            std::fs::File::open(d).unwrap().set_modified(old).unwrap();
        }
        let mut s = scanner(r.path());
        let first = s.scan().unwrap();
        let old_dir = volume(&first.inventory, "u1", Plugin::Configmap, "cfg")
            .data_dir
            .clone();

        let again = s.scan().unwrap();
        assert!(!again.changed);
        assert_eq!(again.inventory.generation, 100);
        assert_eq!((again.stats.rehashed, again.stats.reused), (0, 2));
        // Nothing was read again: the previous inventory is reused as is.
        assert!(Arc::ptr_eq(&again.inventory, &first.inventory));
        assert!(again.scanned_at >= first.scanned_at);

        w.write(&payload(&[("a", b"2")])).unwrap();
        let updated = s.scan().unwrap();
        assert!(updated.changed);
        assert_eq!(updated.inventory.generation, 101);
        assert_eq!(updated.stats.rehashed, 1);
        let v = volume(&updated.inventory, "u1", Plugin::Configmap, "cfg");
        assert_eq!(v.files, expected(&[("a", b"2")]));
        assert_ne!(v.data_dir, old_dir);
        assert_eq!(v.data_dir, w.current_data_dir());
        // The unchanged volume next to it is carried over in full.
        let steady = volume(&updated.inventory, "u1", Plugin::Secret, "steady");
        assert_eq!(steady.files, expected(&[("s", b"same")]));
        assert_eq!(
            steady,
            volume(&first.inventory, "u1", Plugin::Secret, "steady")
        );
        assert_eq!((updated.stats.rehashed, updated.stats.reused), (1, 1));
    }

    #[test]
    fn settled_plugin_listing_is_reused_until_the_directory_changes() {
        let r = root();
        writer(r.path(), "u1", Plugin::Secret, "a")
            .write(&payload(&[("k", b"1")]))
            .unwrap();
        let plugin_dir = pod_dir(r.path(), "u1")
            .join("volumes")
            .join(Plugin::Secret.dir_name());
        let age = |p: &Path| {
            let old = std::time::SystemTime::now() - Duration::from_secs(3600);
            std::fs::File::open(p).unwrap().set_modified(old).unwrap();
        };
        age(&plugin_dir);
        let mut s = scanner(r.path());
        assert_eq!(s.scan().unwrap().stats.listings_reused, 0);
        let again = s.scan().unwrap();
        assert_eq!(again.stats.listings_reused, 1);
        assert_eq!(again.stats.reused, 1);

        // A new volume changes the directory: it is listed again at once.
        writer(r.path(), "u1", Plugin::Secret, "b")
            .write(&payload(&[("k", b"2")]))
            .unwrap();
        let added = s.scan().unwrap();
        assert_eq!(added.stats.listings_reused, 0);
        let pod = added.inventory.pod("u1").unwrap();
        assert_eq!(
            pod.volumes
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>(),
            vec!["a", "b"]
        );

        // A listing taken right after a change is not trusted: a change in
        // the same (possibly coarse) timestamp tick would not move mtime.
        let unsettled = s.scan().unwrap();
        assert_eq!(unsettled.stats.listings_reused, 0);
        assert_eq!(unsettled.stats.reused, 2);
    }

    #[test]
    fn key_added_and_removed() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Secret, "s");
        let mut s = scanner(r.path());
        w.write(&payload(&[("a", b"1"), ("b", b"2")])).unwrap();
        s.scan().unwrap();
        w.write(&payload(&[("a", b"1"), ("b", b"2"), ("c", b"3")]))
            .unwrap();
        let added = s.scan().unwrap();
        let v = volume(&added.inventory, "u1", Plugin::Secret, "s");
        assert_eq!(v.files, expected(&[("a", b"1"), ("b", b"2"), ("c", b"3")]));
        w.write(&payload(&[("c", b"3")])).unwrap();
        let removed = s.scan().unwrap();
        let v = volume(&removed.inventory, "u1", Plugin::Secret, "s");
        assert_eq!(v.files, expected(&[("c", b"3")]));
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        assert_eq!(removed.inventory.generation, 102);
    }

    #[test]
    fn nested_paths_are_reported_relative_to_the_data_dir() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Configmap, "c");
        let items: &[(&str, &[u8])] =
            &[("etc/enroot/hooks.d/10-x.sh", b"#!/bin/sh"), ("top", b"t")];
        w.write(&payload(items)).unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Configmap, "c");
        assert_eq!(v.files, expected(items));
        assert!(v.errors.is_empty(), "{:?}", v.errors);
    }

    #[test]
    fn projected_volume_with_several_sources() {
        // A projected volume merges a Secret key, ConfigMap keys and a
        // nested path into one payload with per-item modes.
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Projected, "slurm-etc");
        let mut p = Payload::new();
        p.insert(
            "slurm.key".into(),
            PayloadFile::with_mode(b"secret".to_vec(), 0o600),
        );
        p.insert(
            "plugstack.conf".into(),
            PayloadFile::with_mode(b"cm1".to_vec(), 0o644),
        );
        p.insert(
            "plugstack.conf.d/pyxis.conf".into(),
            PayloadFile::with_mode(b"cm2".to_vec(), 0o444),
        );
        w.write(&p).unwrap();
        // A second, independent volume of another plugin in the same pod.
        writer(r.path(), "u1", Plugin::Secret, "other")
            .write(&payload(&[("x", b"y")]))
            .unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        let pod = scan.inventory.pod("u1").unwrap();
        assert_eq!(
            pod.volumes
                .iter()
                .map(|v| (v.plugin, v.name.as_str()))
                .collect::<Vec<_>>(),
            vec![(Plugin::Secret, "other"), (Plugin::Projected, "slurm-etc")]
        );
        let v = volume(&scan.inventory, "u1", Plugin::Projected, "slurm-etc");
        assert_eq!(
            v.files,
            expected(&[
                ("slurm.key", b"secret"),
                ("plugstack.conf", b"cm1"),
                ("plugstack.conf.d/pyxis.conf", b"cm2")
            ])
        );
        assert_eq!(v.modes["slurm.key"], "0600");
        assert_eq!(v.modes["plugstack.conf.d/pyxis.conf"], "0444");
        assert!(v.digest.is_some());
    }

    #[test]
    fn subpath_file_and_directory_targets() {
        let r = root();
        writer(r.path(), "u1", Plugin::Configmap, "sshd")
            .write(&payload(&[("sshd_config", b"cfg")]))
            .unwrap();
        let file_target = subpath_target(r.path(), "u1", "sshd", "slurmd", 0);
        std::fs::create_dir_all(file_target.parent().unwrap()).unwrap();
        std::fs::write(&file_target, b"cfg").unwrap();
        let dir_target = subpath_target(r.path(), "u1", "hooks", "slurmd", 3);
        std::fs::create_dir_all(dir_target.join("d")).unwrap();
        std::fs::write(dir_target.join("d/h.sh"), b"hook").unwrap();
        std::fs::write(dir_target.join("top"), b"t").unwrap();

        let scan = scanner(r.path()).scan().unwrap();
        let pod = scan.inventory.pod("u1").unwrap();
        assert_eq!(pod.sub_paths.len(), 2);
        let hooks = &pod.sub_paths[0];
        assert_eq!(
            (hooks.volume.as_str(), hooks.container.as_str(), hooks.index),
            ("hooks", "slurmd", 3)
        );
        assert_eq!(hooks.files, expected(&[("d/h.sh", b"hook"), ("top", b"t")]));
        let sshd = &pod.sub_paths[1];
        assert_eq!((sshd.volume.as_str(), sshd.index), ("sshd", 0));
        assert_eq!(sshd.files, expected(&[("", b"cfg")]));
        assert!(hooks.errors.is_empty() && sshd.errors.is_empty());
    }

    #[test]
    fn swap_racing_the_hash_is_retried_to_a_consistent_result() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Secret, "s");
        w.write(&payload(&[("k", b"old"), ("gone", b"x")])).unwrap();
        let mut s = scanner(r.path());
        let w2 = w.clone();
        let attempts = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = attempts.clone();
        s.set_after_hash_hook(move |h| {
            seen.lock().unwrap().push(h.attempt);
            if h.attempt == 1 {
                // The kubelet publishes new content while the old was hashed.
                w2.write(&payload(&[("k", b"new")])).unwrap();
            }
        });
        let scan = s.scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
        assert_eq!(v.files, expected(&[("k", b"new")]));
        assert_eq!(v.data_dir, w.current_data_dir());
        assert_eq!(v.digest, Some(digest_of(&expected(&[("k", b"new")]))));
        assert!(v.errors.is_empty(), "{:?}", v.errors);
        assert_eq!(*attempts.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn endless_swaps_end_as_vanished_after_bounded_attempts() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Secret, "s");
        w.write(&payload(&[("k", b"0")])).unwrap();
        let mut s = scanner(r.path());
        let w2 = w.clone();
        let count = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let c = count.clone();
        s.set_after_hash_hook(move |h| {
            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            w2.write(&payload(&[("k", h.attempt.to_string().as_bytes())]))
                .unwrap();
        });
        let scan = s.scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
        assert_eq!(
            count.load(std::sync::atomic::Ordering::SeqCst),
            DEFAULT_MAX_ATTEMPTS
        );
        assert_eq!(kinds(&v.errors), vec![ReadErrorKind::Vanished]);
        assert!(v.files.is_empty() && v.digest.is_none());
    }

    #[test]
    fn symlinks_out_of_the_volume_are_reported_and_never_followed() {
        let r = root();
        let outside = r.path().join("outside-secret");
        std::fs::write(&outside, b"host secret").unwrap();
        let w = writer(r.path(), "u1", Plugin::Secret, "s");
        w.write(&payload(&[("ok", b"fine")])).unwrap();
        let data = w.target().join(w.current_data_dir().unwrap());
        symlink(&outside, data.join("inner")).unwrap();
        symlink(&outside, w.target().join("evil")).unwrap();

        // ..data itself pointing out of the volume.
        let w2 = writer(r.path(), "u1", Plugin::Secret, "t");
        std::fs::create_dir_all(w2.target()).unwrap();
        symlink(r.path(), w2.target().join(DATA_LINK)).unwrap();
        let w3 = writer(r.path(), "u1", Plugin::Secret, "u");
        std::fs::create_dir_all(w3.target()).unwrap();
        symlink("..", w3.target().join(DATA_LINK)).unwrap();

        let scan = scanner(r.path()).scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
        assert_eq!(v.files, expected(&[("ok", b"fine")]));
        let mut errs: Vec<_> = v.errors.iter().map(|e| (e.path.as_str(), e.kind)).collect();
        errs.sort();
        assert_eq!(
            errs,
            vec![
                ("evil", ReadErrorKind::SymlinkEscape),
                ("inner", ReadErrorKind::SymlinkEscape)
            ]
        );
        assert!(
            v.digest.is_none(),
            "no digest when something could not be read"
        );
        for name in ["t", "u"] {
            let v = volume(&scan.inventory, "u1", Plugin::Secret, name);
            assert_eq!(
                kinds(&v.errors),
                vec![ReadErrorKind::SymlinkEscape],
                "{name}"
            );
            assert!(v.files.is_empty() && v.data_dir.is_none(), "{name}");
        }
        let digest = Sha256Hex(file_digest(b"host secret"));
        let json = serde_json::to_string(&*scan.inventory).unwrap();
        assert!(!json.contains(&mountguard_inventory::digest::to_hex(&digest.0)));
    }

    #[test]
    fn fifo_is_reported_without_blocking() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Configmap, "c");
        w.write(&payload(&[("a", b"1")])).unwrap();
        let data = w.target().join(w.current_data_dir().unwrap());
        nix::unistd::mkfifo(&data.join("pipe"), Mode::from_bits_truncate(0o644)).unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Configmap, "c");
        assert_eq!(v.files, expected(&[("a", b"1")]));
        assert_eq!(v.errors.len(), 1);
        assert_eq!(
            (v.errors[0].path.as_str(), v.errors[0].kind),
            ("pipe", ReadErrorKind::NotRegularFile)
        );
    }

    #[test]
    fn file_over_the_cap_is_too_large() {
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Secret, "s");
        w.write(&payload(&[
            ("small", b"0123456789"),
            ("big", b"0123456789A"),
        ]))
        .unwrap();
        let mut opts = ScanOptions::new(r.path(), "n");
        opts.max_file_size = 10;
        let scan = Scanner::new(opts).scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
        assert_eq!(v.files, expected(&[("small", b"0123456789")]));
        assert_eq!(kinds(&v.errors), vec![ReadErrorKind::TooLarge]);
        assert_eq!(v.errors[0].path, "big");
        assert_eq!(scan.stats.errors[&ReadErrorKind::TooLarge], 1);
    }

    #[test]
    fn pod_directory_removed_mid_scan_is_dropped() {
        let r = root();
        writer(r.path(), "a-gone", Plugin::Secret, "s")
            .write(&payload(&[("k", b"1")]))
            .unwrap();
        writer(r.path(), "a-gone", Plugin::Secret, "t")
            .write(&payload(&[("k", b"1")]))
            .unwrap();
        writer(r.path(), "b-stays", Plugin::Secret, "s")
            .write(&payload(&[("k", b"2")]))
            .unwrap();
        let mut s = scanner(r.path());
        let gone = pod_dir(r.path(), "a-gone");
        s.set_after_hash_hook(move |h| {
            if h.pod_uid == "a-gone" {
                let _ = std::fs::remove_dir_all(&gone);
            }
        });
        let scan = s.scan().unwrap();
        assert!(scan.inventory.pod("a-gone").is_none());
        let v = volume(&scan.inventory, "b-stays", Plugin::Secret, "s");
        assert_eq!(v.files, expected(&[("k", b"2")]));
        assert_eq!(scan.inventory.pods.len(), 1);
    }

    #[test]
    fn non_utf8_file_name_is_escaped_and_flagged() {
        use std::os::unix::ffi::OsStrExt;
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Configmap, "c");
        w.write(&payload(&[("a", b"1")])).unwrap();
        let data = w.target().join(w.current_data_dir().unwrap());
        std::fs::write(data.join(OsStr::from_bytes(b"bad\xffname")), b"odd").unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Configmap, "c");
        assert_eq!(v.files, expected(&[("a", b"1"), ("bad\\xffname", b"odd")]));
        assert_eq!(kinds(&v.errors), vec![ReadErrorKind::InvalidName]);
        assert_eq!(v.errors[0].path, "bad\\xffname");
    }

    #[test]
    fn empty_secret_volume_hints_at_mount_propagation_but_configmap_does_not() {
        let r = root();
        std::fs::create_dir_all(volume_dir(r.path(), "u1", Plugin::Secret, "s")).unwrap();
        std::fs::create_dir_all(volume_dir(r.path(), "u1", Plugin::Projected, "p")).unwrap();
        std::fs::create_dir_all(volume_dir(r.path(), "u1", Plugin::Configmap, "c")).unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        for (plugin, name, want) in [
            (Plugin::Secret, "s", vec![ReadErrorKind::MountPropagation]),
            (
                Plugin::Projected,
                "p",
                vec![ReadErrorKind::MountPropagation],
            ),
            (Plugin::Configmap, "c", vec![]),
        ] {
            let v = volume(&scan.inventory, "u1", plugin, name);
            assert_eq!(kinds(&v.errors), want, "{name}");
            assert!(v.data_dir.is_none() && v.files.is_empty() && v.digest.is_none());
        }
    }

    #[test]
    fn unusable_root_is_an_error_and_stray_entries_are_harmless() {
        let r = tempfile::tempdir().unwrap();
        let err = scanner(&r.path().join("missing")).scan().unwrap_err();
        assert!(
            err.to_string().contains("cannot open the kubelet root"),
            "{err}"
        );
        let err = scanner(r.path()).scan().unwrap_err();
        assert!(err.to_string().contains("pods directory"), "{err}");

        std::fs::create_dir(r.path().join(PODS_DIR)).unwrap();
        std::fs::write(r.path().join("pods/stray-file"), b"x").unwrap();
        let plugin_dir = pod_dir(r.path(), "u1").join("volumes/kubernetes.io~secret");
        std::fs::create_dir_all(&plugin_dir).unwrap();
        std::fs::write(plugin_dir.join("not-a-dir"), b"x").unwrap();
        std::fs::create_dir_all(pod_dir(r.path(), "u1").join("volume-subpaths/v/c/notanumber"))
            .unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        assert_eq!(scan.inventory.pods.len(), 2);
        let stray = scan.inventory.pod("stray-file").unwrap();
        assert_eq!(kinds(&stray.errors), vec![ReadErrorKind::NotRegularFile]);
        let pod = scan.inventory.pod("u1").unwrap();
        assert_eq!(
            kinds(&pod.volumes[0].errors),
            vec![ReadErrorKind::NotRegularFile]
        );
        assert_eq!(kinds(&pod.errors), vec![ReadErrorKind::InvalidName]);
    }

    #[test]
    fn symlinked_pod_entries_and_volumes_dirs_are_errors_not_followed() {
        let r = root();
        // Elsewhere on the node: a directory laid out like a pod, with a
        // readable Secret volume.
        let elsewhere = tempfile::tempdir().unwrap();
        let w = writer(elsewhere.path(), "victim", Plugin::Secret, "s");
        w.write(&payload(&[("k", b"secret")])).unwrap();
        let victim = pod_dir(elsewhere.path(), "victim");
        // pods/linked -> a pod directory elsewhere.
        symlink(&victim, r.path().join("pods/linked")).unwrap();
        // pods/u2/volumes -> the other pod's volumes directory.
        std::fs::create_dir_all(pod_dir(r.path(), "u2")).unwrap();
        symlink(
            victim.join("volumes"),
            pod_dir(r.path(), "u2").join("volumes"),
        )
        .unwrap();
        // pods/fifo: a FIFO.
        nix::unistd::mkfifo(&r.path().join("pods/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        let inv = &scan.inventory;
        let linked = inv.pod("linked").unwrap();
        assert_eq!(kinds(&linked.errors), vec![ReadErrorKind::SymlinkEscape]);
        assert!(
            linked.volumes.is_empty(),
            "followed pods/linked: {linked:?}"
        );
        let u2 = inv.pod("u2").unwrap();
        assert_eq!(kinds(&u2.errors), vec![ReadErrorKind::SymlinkEscape]);
        assert_eq!(u2.errors[0].path, "volumes");
        assert!(
            u2.volumes.is_empty(),
            "followed the volumes symlink: {u2:?}"
        );
        let fifo = inv.pod("fifo").unwrap();
        assert_eq!(kinds(&fifo.errors), vec![ReadErrorKind::NotRegularFile]);
        assert_eq!(inv.pods.len(), 3);
    }

    #[test]
    fn non_root_unreadable_file_is_a_permission_error() {
        // As root, permissions are bypassed: the integration test covers
        // this case by running the binary without privileges.
        if nix::unistd::geteuid().is_root() {
            eprintln!("skipped in-process: running as root; see agent/tests/it.rs");
            return;
        }
        let r = root();
        let w = writer(r.path(), "u1", Plugin::Secret, "s");
        w.write(&payload(&[("k", b"1")])).unwrap();
        let f = w.target().join(w.current_data_dir().unwrap()).join("k");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o000)).unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        let v = volume(&scan.inventory, "u1", Plugin::Secret, "s");
        assert_eq!(kinds(&v.errors), vec![ReadErrorKind::Permission]);
    }

    #[test]
    fn output_is_valid_inventory_json_and_table_shows_short_digests() {
        let r = root();
        writer(r.path(), "u1", Plugin::Secret, "s")
            .write(&payload(&[("k", b"v")]))
            .unwrap();
        let scan = scanner(r.path()).scan().unwrap();
        let json = serde_json::to_vec(&*scan.inventory).unwrap();
        assert_eq!(NodeInventory::from_json(&json).unwrap(), *scan.inventory);
        let full = mountguard_inventory::digest::to_hex(
            &volume(&scan.inventory, "u1", Plugin::Secret, "s")
                .digest
                .unwrap()
                .0,
        );
        let table = crate::output::table(&scan.inventory);
        assert!(table.contains(&full[..12]), "{table}");
        assert!(!table.contains(&full[..13]), "{table}");
        assert!(
            table
                .lines()
                .any(|l| l.starts_with("u1") && l.contains("secret") && l.contains(" s "))
        );
    }
}
