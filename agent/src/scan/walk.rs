//! The scanner's walk: the read of one pod directory, its plugin
//! directories (listings reused while settled), each volume (the `..data`
//! read, the hash of the timestamped directory, the re-check and the
//! bounded retries, or the cached inventory when nothing moved) and its
//! subPath targets.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use jiff::Timestamp;
use mountguard_inventory::layout::{DATA_LINK, SUBPATHS_DIR, VOLUMES_DIR};
use mountguard_inventory::{
    Plugin, PodInventory, ReadErrorKind, Sha256Hex, SubPathInventory, VolumeInventory, escape_name,
    volume_digest,
};
use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::{AtFlags, readlinkat};
use nix::sys::stat::{fstat, fstatat};

use crate::safe_read::{
    Entry, Tree, entry_type, errno_error, error, list_dir, open_dir_at, type_name, type_of_mode,
};

use super::checks::{check_links, no_data, valid_data_target};
use super::{
    Cached, HookPoint, Ident, Listing, ScanStats, Scanner, VolumeKey, cstr, ident, is_dir,
    placeholder, plugin_index, settled, timestamp,
};

impl Scanner {
    pub(super) fn scan_pod(
        &mut self,
        pods_dir: &OwnedFd,
        name: &CStr,
        pod_path: &Path,
        stats: &mut ScanStats,
    ) -> Option<PodInventory> {
        let uid = escape_name(name.to_bytes());
        let mut pod = PodInventory {
            uid,
            volumes: Vec::new(),
            sub_paths: Vec::new(),
            errors: Vec::new(),
        };
        let pod_fd = match open_dir_at(pods_dir, name) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return None,
            Err(errno) => {
                self.dirty = true;
                pod.errors
                    .push(errno_error("", "opening the pod directory", errno));
                return Some(pod);
            }
        };
        let read_at = Timestamp::now();
        let pod_ident = fstat(&pod_fd).ok().map(|st| ident(&st));

        // Plugin directories are looked at by metadata first; they are only
        // opened (one component at a time, without following symlinks) when
        // a listing or a volume must actually be read.
        let volumes_path = pod_path.join(VOLUMES_DIR);
        let mut any_plugin = false;
        // `volumes` itself is checked without following: the plugin stats
        // below name it as an intermediate component, which the kernel
        // follows whatever the flags.
        let volumes_ok = match fstatat(pod_fd.as_fd(), VOLUMES_DIR, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if is_dir(&st) => true,
            Ok(st) => {
                pod.errors.push(match type_of_mode(st.st_mode) {
                    Type::Symlink => error(
                        VOLUMES_DIR,
                        ReadErrorKind::SymlinkEscape,
                        "the volumes directory is a symlink; not followed",
                    ),
                    t => error(
                        VOLUMES_DIR,
                        ReadErrorKind::NotRegularFile,
                        format!(
                            "the volumes entry is {}, not a directory; not read",
                            type_name(t)
                        ),
                    ),
                });
                false
            }
            Err(Errno::ENOENT) => false,
            Err(errno) => {
                pod.errors.push(errno_error(
                    VOLUMES_DIR,
                    "stat of the volumes directory",
                    errno,
                ));
                false
            }
        };
        for plugin in Plugin::ALL {
            // The listing of a plugin directory no longer there is dropped.
            let forget = |s: &mut Self| {
                if let Some(state) = s.pods.get_mut(name.to_bytes()) {
                    state.listings[plugin_index(plugin)] = None;
                }
            };
            if !volumes_ok {
                forget(self);
                continue;
            }
            let rel = format!("{VOLUMES_DIR}/{}", plugin.dir_name());
            let st = match fstatat(pod_fd.as_fd(), rel.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => {
                    forget(self);
                    continue;
                }
                Err(errno) => {
                    forget(self);
                    pod.errors
                        .push(errno_error(&rel, "stat of the plugin directory", errno));
                    continue;
                }
            };
            if !is_dir(&st) {
                forget(self);
                pod.errors.push(error(
                    &rel,
                    ReadErrorKind::NotRegularFile,
                    "the plugin directory is not a directory; not read",
                ));
                continue;
            }
            any_plugin = true;
            let plugin_path = volumes_path.join(plugin.dir_name());
            self.scan_plugin(
                &mut pod,
                &pod_fd,
                name,
                plugin,
                ident(&st),
                &plugin_path,
                stats,
            );
            stats.watch_dirs.push(plugin_path);
        }
        if any_plugin {
            stats.watch_dirs.push(volumes_path);
        }
        let has_subpaths =
            fstatat(pod_fd.as_fd(), SUBPATHS_DIR, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
        if has_subpaths {
            match open_dir_at(&pod_fd, &cstr(SUBPATHS_DIR)) {
                Ok(sfd) => self.scan_subpaths(&mut pod, &sfd),
                Err(Errno::ENOENT) => {}
                Err(errno) => pod.errors.push(errno_error(
                    SUBPATHS_DIR,
                    "opening the subPaths directory",
                    errno,
                )),
            }
        }

        // A pod directory removed while it was read is gone from the node:
        // drop it rather than report the half it was read.
        let now = fstatat(pods_dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .ok()
            .map(|st| ident(&st));
        match (pod_ident, now) {
            (Some(a), Some(b)) if a.dev == b.dev && a.ino == b.ino => {}
            _ => {
                self.dirty = true;
                return None;
            }
        }
        if !pod.errors.is_empty() || !pod.sub_paths.is_empty() {
            self.dirty = true;
        }
        let state = self.pods.entry(name.to_bytes().to_vec()).or_default();
        state.ident = pod_ident;
        state.settled = pod_ident.is_some_and(|id| settled(&id, read_at));
        state.clean = pod.errors.is_empty() && !has_subpaths;
        state.seen = self.scans;
        pod.sub_paths.sort_by(|a, b| {
            (&a.volume, &a.container, a.index).cmp(&(&b.volume, &b.container, b.index))
        });
        Some(pod)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn scan_plugin(
        &mut self,
        pod: &mut PodInventory,
        pod_fd: &OwnedFd,
        pod_name: &CStr,
        plugin: Plugin,
        plugin_ident: Ident,
        plugin_path: &Path,
        stats: &mut ScanStats,
    ) {
        let rel = format!("{VOLUMES_DIR}/{}", plugin.dir_name());
        let mut opened: Option<OwnedFd> = None;
        let open = |opened: &mut Option<OwnedFd>| -> Result<OwnedFd, Errno> {
            if let Some(fd) = opened.as_ref() {
                return fd
                    .try_clone()
                    .map_err(|e| e.raw_os_error().map_or(Errno::EIO, Errno::from_raw));
            }
            let volumes = open_dir_at(pod_fd, &cstr(VOLUMES_DIR))?;
            let fd = open_dir_at(&volumes, &cstr(plugin.dir_name()))?;
            *opened = Some(
                fd.try_clone()
                    .map_err(|e| e.raw_os_error().map_or(Errno::EIO, Errno::from_raw))?,
            );
            Ok(fd)
        };
        let plugin_dev = Some(plugin_ident.dev);
        let entries = match self.listing(pod_name.to_bytes(), plugin, plugin_ident, || {
            open(&mut opened)
        }) {
            Ok((e, reused)) => {
                stats.listings_reused += u64::from(reused);
                e
            }
            Err(Errno::ENOENT) => return,
            Err(errno) => {
                pod.errors
                    .push(errno_error(&rel, "listing the plugin directory", errno));
                return;
            }
        };
        let before = pod.volumes.len();
        let mut from_cache = 0;
        let mut confirmed = vec![None; entries.len()];
        for (i, entry) in entries.iter().enumerate() {
            let name = escape_name(entry.bytes());
            let mut volume = VolumeInventory {
                name,
                ..placeholder(plugin)
            };
            let mut rel_vol = rel.as_bytes().to_vec();
            rel_vol.push(b'/');
            rel_vol.extend_from_slice(entry.bytes());
            let kind = match entry.kind {
                Some(k) => Ok(k),
                None => CString::new(rel_vol.clone())
                    .map_err(|_| Errno::EINVAL)
                    .and_then(|c| {
                        fstatat(pod_fd.as_fd(), c.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                    })
                    .map(|st| type_of_mode(st.st_mode)),
            };
            match kind {
                Ok(Type::Directory) => {}
                Ok(Type::Symlink) => {
                    volume.errors.push(error(
                        "",
                        ReadErrorKind::SymlinkEscape,
                        "the volume directory is a symlink; not followed",
                    ));
                    pod.volumes.push(volume);
                    continue;
                }
                Ok(other) => {
                    volume.errors.push(error(
                        "",
                        ReadErrorKind::NotRegularFile,
                        format!("the volume entry is {}, not a directory", type_name(other)),
                    ));
                    pod.volumes.push(volume);
                    continue;
                }
                Err(Errno::ENOENT) => continue,
                Err(errno) => {
                    volume
                        .errors
                        .push(errno_error("", "stat of the volume directory", errno));
                    pod.volumes.push(volume);
                    continue;
                }
            }
            let key = VolumeKey {
                pod: pod_name.to_bytes().to_vec(),
                plugin,
                name: entry.bytes().to_vec(),
            };
            let vol_path = plugin_path.join(OsStr::from_bytes(entry.bytes()));
            if let Some(cache_key) = self.unchanged(&key, pod_fd, rel_vol) {
                confirmed[i] = self
                    .cache
                    .get(&cache_key)
                    .filter(|c| c.volume_settled)
                    .map(|c| c.volume_ident);
                stats.reused += 1;
                from_cache += 1;
                stats.watch_dirs.push(vol_path);
                self.pending.push((pod.volumes.len(), cache_key));
                pod.volumes.push(placeholder(plugin));
                continue;
            }
            let pfd = match open(&mut opened) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => return,
                Err(errno) => {
                    pod.errors
                        .push(errno_error(&rel, "opening the plugin directory", errno));
                    return;
                }
            };
            let pfd = &pfd;
            let vfd = match open_dir_at(pfd, &entry.name) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(errno) => {
                    volume
                        .errors
                        .push(errno_error("", "opening the volume directory", errno));
                    pod.volumes.push(volume);
                    continue;
                }
            };
            stats.watch_dirs.push(vol_path);
            let volume = self.read_volume(&pod.uid, key, volume, &vfd, plugin_dev, stats);
            pod.volumes.push(volume);
        }
        // Anything not confirmed unchanged from the cache may differ.
        if pod.volumes.len() - before != from_cache {
            self.dirty = true;
        }
        if let Some(l) = self
            .pods
            .get_mut(pod_name.to_bytes())
            .and_then(|s| s.listings[plugin_index(plugin)].as_mut())
            && Arc::ptr_eq(&l.entries, &entries)
        {
            l.volumes = confirmed;
        }
    }

    /// The entries of a plugin directory. A listing is reused while the
    /// directory's identity and modification time are unchanged, and only
    /// when it was taken well after that modification time, so a change in
    /// the same timestamp tick as the listing is never missed.
    pub(super) fn listing(
        &mut self,
        pod_name: &[u8],
        plugin: Plugin,
        id: Ident,
        open: impl FnOnce() -> Result<OwnedFd, Errno>,
    ) -> Result<(Arc<Vec<Entry>>, bool), Errno> {
        let state = self.pods.entry(pod_name.to_vec()).or_default();
        let slot = &mut state.listings[plugin_index(plugin)];
        if let Some(c) = slot.as_ref()
            && c.ident == id
            && c.settled
        {
            return Ok((c.entries.clone(), true));
        }
        self.dirty = true;
        let now = Timestamp::now();
        let entries = Arc::new(list_dir(&open()?)?);
        // Looked up again: `open` may not borrow the scanner.
        self.pods.entry(pod_name.to_vec()).or_default().listings[plugin_index(plugin)] =
            Some(Listing::new(id, now, entries.clone()));
        Ok((entries, false))
    }

    /// The cached inventory of a volume if its directory, its `..data`
    /// target name and the target's identity are all unchanged. Metadata
    /// only (three path-relative calls that never open anything); any doubt
    /// falls back to the full read.
    pub(super) fn unchanged(
        &mut self,
        key: &VolumeKey,
        base: &OwnedFd,
        mut rel: Vec<u8>,
    ) -> Option<(u64, u64)> {
        let vol = CString::new(rel.clone()).ok()?;
        let st = fstatat(base.as_fd(), vol.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
        let id = ident(&st);
        let c = self.cache.get_mut(&(id.dev, id.ino))?;
        if !is_dir(&st) || id != c.volume_ident || c.key != *key {
            return None;
        }
        if !c.volume_settled {
            // Until the volume directory's mtime is settled, a rename of
            // `..data` in the same timestamp tick could leave it unchanged:
            // read the link and check the data directory too.
            rel.push(b'/');
            let mut link = rel.clone();
            link.extend_from_slice(DATA_LINK.as_bytes());
            let now = Timestamp::now();
            let target = readlinkat(base, CString::new(link).ok()?.as_c_str()).ok()?;
            if target.as_bytes() != c.data_dir.as_slice() {
                return None;
            }
            rel.extend_from_slice(&c.data_dir);
            let data = CString::new(rel).ok()?;
            let st = fstatat(base.as_fd(), data.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW).ok()?;
            if !is_dir(&st) || ident(&st) != c.data_ident {
                return None;
            }
            c.volume_settled = settled(&c.volume_ident, now);
        }
        c.seen = self.scans;
        Some((id.dev, id.ino))
    }

    /// Reads one volume directory, with the `..data` re-check and retries.
    pub(super) fn read_volume(
        &mut self,
        pod_uid: &str,
        key: VolumeKey,
        mut volume: VolumeInventory,
        vfd: &OwnedFd,
        plugin_dev: Option<u64>,
        stats: &mut ScanStats,
    ) -> VolumeInventory {
        let data_link = cstr(DATA_LINK);
        let max = self.opts.max_attempts.max(1);
        for attempt in 1..=max {
            let volume_ident = match fstat(vfd) {
                Ok(st) => ident(&st),
                Err(errno) => {
                    volume
                        .errors
                        .push(errno_error("", "stat of the volume directory", errno));
                    return volume;
                }
            };
            let target = match readlinkat(vfd, data_link.as_c_str()) {
                Ok(t) => t,
                Err(Errno::ENOENT) => return no_data(volume, volume_ident, plugin_dev),
                Err(Errno::EINVAL) => {
                    volume.errors.push(error(
                        DATA_LINK,
                        ReadErrorKind::SymlinkEscape,
                        "..data is not a symlink; not read",
                    ));
                    return volume;
                }
                Err(errno) => {
                    volume
                        .errors
                        .push(errno_error(DATA_LINK, "reading the ..data link", errno));
                    return volume;
                }
            };
            let target = target.as_bytes().to_vec();
            if !valid_data_target(&target) {
                volume.errors.push(error(
                    DATA_LINK,
                    ReadErrorKind::SymlinkEscape,
                    format!(
                        "..data points to {:?}, not a single component starting with '..'; not followed",
                        escape_name(&target)
                    ),
                ));
                return volume;
            }
            let Ok(target_c) = CString::new(target.clone()) else {
                return volume;
            };
            let data_ident = match fstatat(
                vfd.as_fd(),
                target_c.as_c_str(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(st) if is_dir(&st) => ident(&st),
                Ok(_) => {
                    volume.errors.push(error(
                        DATA_LINK,
                        ReadErrorKind::NotRegularFile,
                        "..data does not point to a directory; not read",
                    ));
                    return volume;
                }
                Err(Errno::ENOENT) => continue,
                Err(errno) => {
                    volume
                        .errors
                        .push(errno_error(DATA_LINK, "stat of the data directory", errno));
                    return volume;
                }
            };
            if let Some(c) = self.cache.get_mut(&(volume_ident.dev, volume_ident.ino))
                && c.key == key
                && c.data_dir == target
                && c.data_ident == data_ident
                && c.volume_ident == volume_ident
            {
                c.seen = self.scans;
                stats.reused += 1;
                return c.inventory.clone();
            }

            let dfd = match open_dir_at(vfd, &target_c) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(errno) => {
                    volume
                        .errors
                        .push(errno_error(DATA_LINK, "opening the data directory", errno));
                    return volume;
                }
            };
            match fstat(&dfd) {
                Ok(st) if ident(&st) == data_ident => {}
                _ => continue,
            }
            let mut tree = Tree::default();
            self.reader.walk(&dfd, "", 0, &mut tree);
            let link_errors = check_links(vfd);
            if let Some(hook) = self.hook.as_mut() {
                hook(&HookPoint {
                    pod_uid,
                    plugin: volume.plugin,
                    volume: &volume.name,
                    attempt,
                });
            }
            let again = readlinkat(vfd, data_link.as_c_str()).ok();
            if again.as_ref().map(|t| t.as_bytes()) != Some(target.as_slice()) || tree.vanished {
                continue;
            }

            stats.rehashed += 1;
            volume.data_dir = Some(escape_name(&target));
            volume.written_at = timestamp(&data_ident);
            volume.errors = tree.errors;
            volume.errors.extend(link_errors);
            for (path, f) in tree.files {
                volume.modes.insert(path.clone(), format!("{:04o}", f.mode));
                volume.files.insert(path, Sha256Hex(f.digest));
            }
            if volume.errors.is_empty() {
                volume.digest = Some(Sha256Hex(volume_digest(
                    volume.files.iter().map(|(p, d)| (p.as_str(), &d.0)),
                )));
            }
            self.dirty = true;
            if !self.caching {
                return volume;
            }
            self.cache.insert(
                (volume_ident.dev, volume_ident.ino),
                Cached {
                    key,
                    data_dir: target,
                    data_ident,
                    volume_ident,
                    volume_settled: false,
                    inventory: volume.clone(),
                    seen: self.scans,
                },
            );
            return volume;
        }
        volume.errors.push(error(
            "",
            ReadErrorKind::Vanished,
            format!("the content changed or disappeared during each of {max} attempts to read it"),
        ));
        volume
    }

    pub(super) fn scan_subpaths(&mut self, pod: &mut PodInventory, sfd: &OwnedFd) {
        let dirs = |fd: &OwnedFd, pod: &mut PodInventory, at: &str| -> Vec<(CString, OwnedFd)> {
            let entries = match list_dir(fd) {
                Ok(e) => e,
                Err(errno) => {
                    pod.errors.push(errno_error(at, "listing", errno));
                    return Vec::new();
                }
            };
            let mut out = Vec::new();
            for e in entries {
                match open_dir_at(fd, &e.name) {
                    Ok(sub) => out.push((e.name, sub)),
                    Err(Errno::ENOENT) => {}
                    Err(errno) => pod.errors.push(errno_error(
                        &format!("{at}/{}", escape_name(e.bytes())),
                        "opening",
                        errno,
                    )),
                }
            }
            out
        };
        for (vname, vfd) in dirs(sfd, pod, SUBPATHS_DIR) {
            let volume = escape_name(vname.to_bytes());
            let at = format!("{SUBPATHS_DIR}/{volume}");
            for (cname, cfd) in dirs(&vfd, pod, &at) {
                let container = escape_name(cname.to_bytes());
                let at = format!("{at}/{container}");
                let entries = match list_dir(&cfd) {
                    Ok(e) => e,
                    Err(errno) => {
                        pod.errors.push(errno_error(&at, "listing", errno));
                        continue;
                    }
                };
                for entry in entries {
                    let index = std::str::from_utf8(entry.bytes())
                        .ok()
                        .and_then(|s| s.parse::<u32>().ok());
                    let Some(index) = index else {
                        pod.errors.push(error(
                            &format!("{at}/{}", escape_name(entry.bytes())),
                            ReadErrorKind::InvalidName,
                            "a subPath entry whose name is not a volumeMount index; not read",
                        ));
                        continue;
                    };
                    let mut sp = SubPathInventory {
                        volume: volume.clone(),
                        container: container.clone(),
                        index,
                        files: BTreeMap::new(),
                        errors: Vec::new(),
                    };
                    match entry_type(&cfd, &entry) {
                        Ok(Type::File) => match self.reader.hash_at(&cfd, &entry.name, "") {
                            Ok(h) => {
                                sp.files.insert(String::new(), Sha256Hex(h.digest));
                            }
                            Err(e) => sp.errors.push(e),
                        },
                        Ok(Type::Directory) => match open_dir_at(&cfd, &entry.name) {
                            Ok(dfd) => {
                                let mut tree = Tree::default();
                                self.reader.walk(&dfd, "", 0, &mut tree);
                                sp.errors = tree.errors;
                                sp.files = tree
                                    .files
                                    .into_iter()
                                    .map(|(p, f)| (p, Sha256Hex(f.digest)))
                                    .collect();
                            }
                            Err(errno) => {
                                sp.errors.push(errno_error("", "opening the target", errno))
                            }
                        },
                        Ok(Type::Symlink) => sp.errors.push(error(
                            "",
                            ReadErrorKind::SymlinkEscape,
                            "the subPath target is a symlink; not followed",
                        )),
                        Ok(other) => sp.errors.push(error(
                            "",
                            ReadErrorKind::NotRegularFile,
                            format!("the subPath target is {}; not read", type_name(other)),
                        )),
                        Err(Errno::ENOENT) => continue,
                        Err(errno) => sp.errors.push(errno_error("", "stat of the target", errno)),
                    }
                    pod.sub_paths.push(sp);
                }
            }
        }
    }
}
