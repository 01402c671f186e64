//! The confirmation pass: a pod read before is confirmed unchanged from
//! metadata alone (a few `fstatat` calls compared with the identities its
//! last read saw, all settled), on several threads when there are many
//! pods; only a pod that cannot be confirmed is read again ([`super::walk`]).

use std::ffi::{CStr, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use mountguard_inventory::Plugin;
use mountguard_inventory::layout::VOLUMES_DIR;
use nix::errno::Errno;
use nix::fcntl::AtFlags;
use nix::sys::stat::fstatat;

use crate::safe_read::Entry;

use super::{CacheKey, PodState, ScanStats, Scanner, ident, is_dir, plugin_index};

/// Above this many pod directories a full scan confirms unchanged pods
/// on several threads ([`Scanner::confirm_all`]): each confirmation is
/// a handful of `fstatat` calls, the wall-time floor of a full rescan.
pub(super) const PARALLEL_CONFIRM_MIN_PODS: usize = 256;

/// At most this many threads confirm pods (fewer when the process may use
/// fewer CPUs: `available_parallelism` follows the cgroup CPU quota).
pub(super) const CONFIRM_THREADS: usize = 4;

/// What [`Scanner::confirm_all`] found: per `pods` entry, `None` or the
/// range of its volumes' cache keys in `keys`, the volumes reused and the
/// plugin listings reused.
#[derive(Default)]
pub(super) struct Confirmations {
    pub(super) keys: Vec<CacheKey>,
    pub(super) pods: Vec<Option<(std::ops::Range<usize>, u64, u64)>>,
}

/// Confirms from metadata alone that pod directory `name`, read before as
/// `state`, is unchanged: one stat of the pod directory (its entries), one
/// of each plugin directory (its volumes) and one of each volume directory
/// (`..data` renames), each compared with what the last read saw, all
/// settled. Nothing is opened and nothing is written but `path` (a
/// scratch buffer) and `keys`. The stats name paths below `pods/`, so a
/// component swapped for a symlink meanwhile could be followed: only an
/// identity equal to the cached one (the very directory read safely
/// before) is accepted, anything else falls back to the read of
/// [`Scanner::scan_pod`]. On success the cache keys of the pod's volumes
/// are pushed to `keys` (on failure some may be: the caller truncates) and
/// the counts of reused volumes and listings are returned.
pub(super) fn confirm_pod(
    pods_dir: &OwnedFd,
    name: &CStr,
    state: &PodState,
    path: &mut Vec<u8>,
    keys: &mut Vec<CacheKey>,
) -> Option<(u64, u64)> {
    let st = fstatat(pods_dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
    if !is_dir(&st) || state.ident != Some(ident(&st)) || !state.settled || !state.clean {
        return None;
    }
    let pod_name = name.to_bytes();
    let (mut reused, mut listings) = (0, 0);
    for plugin in Plugin::ALL {
        let listing = &state.listings[plugin_index(plugin)];
        path.clear();
        path.extend_from_slice(pod_name);
        path.push(b'/');
        path.extend_from_slice(VOLUMES_DIR.as_bytes());
        path.push(b'/');
        path.extend_from_slice(plugin.dir_name().as_bytes());
        let plugin_len = path.len();
        path.push(0);
        let c = CStr::from_bytes_with_nul(path).ok()?;
        let l = match (
            fstatat(pods_dir.as_fd(), c, AtFlags::AT_SYMLINK_NOFOLLOW),
            listing,
        ) {
            (Err(Errno::ENOENT), None) => continue,
            (Ok(st), Some(l)) if is_dir(&st) && ident(&st) == l.ident && l.settled => l,
            _ => return None,
        };
        listings += 1;
        for (entry, confirmed) in l.entries.iter().zip(&l.volumes) {
            let Some(want) = confirmed else {
                return None;
            };
            path.truncate(plugin_len);
            path.push(b'/');
            path.extend_from_slice(entry.bytes());
            path.push(0);
            let c = CStr::from_bytes_with_nul(path).ok()?;
            let st = fstatat(pods_dir.as_fd(), c, AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
            let id = ident(&st);
            if !is_dir(&st) || id != *want {
                return None;
            }
            keys.push((id.dev, id.ino));
            reused += 1;
        }
    }
    Some((reused, listings))
}

impl Scanner {
    /// Confirms from metadata alone that a pod read before is unchanged
    /// ([`confirm_pod`]); on success marks it seen and counts what was
    /// reused.
    pub(super) fn pod_unchanged(
        &mut self,
        pods_dir: &OwnedFd,
        name: &CStr,
        keys: &mut Vec<CacheKey>,
        stats: &mut ScanStats,
    ) -> Option<()> {
        // A pod never read (the first scan) costs no stat here.
        let state = self.pods.get_mut(name.to_bytes())?;
        let (reused, listings) = confirm_pod(pods_dir, name, state, &mut self.path, keys)?;
        state.seen = self.scans;
        stats.reused += reused;
        stats.listings_reused += listings;
        Some(())
    }

    /// [`confirm_pod`] for every entry of the `pods` listing, on up to
    /// [`CONFIRM_THREADS`] threads when there are at least
    /// [`PARALLEL_CONFIRM_MIN_PODS`] entries (read-only: the cache is not
    /// touched); `None` when it is not worth it. Entry `i`'s result, if it
    /// was confirmed, is the range of its volumes' keys in the returned
    /// key list and the counts of what was reused.
    pub(super) fn confirm_all(
        &self,
        pods_dir: &OwnedFd,
        entries: &[Entry],
    ) -> Option<Confirmations> {
        let threads = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .min(CONFIRM_THREADS);
        if threads < 2 || entries.len() < PARALLEL_CONFIRM_MIN_PODS || self.pods.is_empty() {
            return None;
        }
        let chunk = entries.len().div_ceil(threads);
        let pods = &self.pods;
        let parts: Vec<Confirmations> = std::thread::scope(|scope| {
            let handles: Vec<_> = entries
                .chunks(chunk)
                .map(|part| {
                    scope.spawn(move || {
                        let mut out = Confirmations::default();
                        let mut path = Vec::with_capacity(256);
                        for entry in part {
                            let start = out.keys.len();
                            let r = pods.get(entry.bytes()).and_then(|state| {
                                confirm_pod(pods_dir, &entry.name, state, &mut path, &mut out.keys)
                            });
                            if r.is_none() {
                                out.keys.truncate(start);
                            }
                            out.pods.push(r.map(|(v, l)| (start..out.keys.len(), v, l)));
                        }
                        out
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join())
                .collect::<Result<_, _>>()
        })
        .ok()?;
        let mut all = Confirmations::default();
        for part in parts {
            let base = all.keys.len();
            all.keys.extend_from_slice(&part.keys);
            all.pods.extend(
                part.pods
                    .into_iter()
                    .map(|r| r.map(|(keys, v, l)| (keys.start + base..keys.end + base, v, l))),
            );
        }
        Some(all)
    }

    /// The directories to watch of a pod confirmed by
    /// [`pod_unchanged`](Self::pod_unchanged), from its cached listings:
    /// the same ones its last read listed.
    pub(super) fn unchanged_watch_dirs(
        &self,
        pods_path: &Path,
        name: &[u8],
        out: &mut Vec<PathBuf>,
    ) {
        let Some(state) = self.pods.get(name) else {
            return;
        };
        let volumes_path = pods_path.join(OsStr::from_bytes(name)).join(VOLUMES_DIR);
        let mut any = false;
        for plugin in Plugin::ALL {
            let Some(l) = &state.listings[plugin_index(plugin)] else {
                continue;
            };
            any = true;
            let plugin_path = volumes_path.join(plugin.dir_name());
            out.extend(
                l.entries
                    .iter()
                    .map(|e| plugin_path.join(OsStr::from_bytes(e.bytes()))),
            );
            out.push(plugin_path);
        }
        if any {
            out.push(volumes_path);
        }
    }
}
