//! Descriptor-relative reading of what the kubelet wrote.
//!
//! Every open is `openat` relative to an already opened directory with
//! `O_NOFOLLOW | O_CLOEXEC`, so a symlink is never followed. A file is first
//! opened with `O_PATH` (which opens nothing: no device driver, no FIFO
//! end), its type is checked with `fstat` on that descriptor, and only a
//! regular file is then reopened for reading through `/proc/self/fd/N`, the
//! same inode: an entry renamed between the directory listing and the open
//! (a device or FIFO put in place of a file) is never opened for reading.
//! Directories are opened with `O_DIRECTORY | O_NOFOLLOW`. Only regular
//! files and directories are read. A problem becomes a [`ReadError`], never
//! a panic.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use mountguard_inventory::{FileDigest, ReadError, ReadErrorKind, escape_name};
use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{FileStat, Mode, SFlag, fstat, fstatat};
use sha2::{Digest, Sha256};

/// Flags for opening a directory below a volume.
pub(crate) fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK
}

/// Flags for the first, type-checking open of a file: `O_PATH` opens the
/// inode without opening the file itself.
fn path_flags() -> OFlag {
    OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

/// Flags for reopening a checked regular file to hash it (no `O_NOFOLLOW`:
/// `/proc/self/fd/N` is the kernel's link to the very inode checked).
fn reopen_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY
}

/// Flags for the fallback open when `/proc` is not mounted.
fn file_flags() -> OFlag {
    reopen_flags() | OFlag::O_NOFOLLOW
}

/// Deepest nesting walked below a data directory. The kubelet limits a path
/// to 4096 bytes; 64 levels is far beyond any real payload.
const MAX_DEPTH: usize = 64;

/// Size of the reusable read buffer.
const BUF_SIZE: usize = 256 * 1024;

/// The kind of error an errno from an open or read maps to.
pub(crate) fn classify(errno: Errno) -> ReadErrorKind {
    match errno {
        Errno::EACCES | Errno::EPERM => ReadErrorKind::Permission,
        Errno::ENOENT | Errno::ESTALE => ReadErrorKind::Vanished,
        Errno::ELOOP => ReadErrorKind::SymlinkEscape,
        Errno::ENXIO | Errno::ENODEV | Errno::ENOTDIR => ReadErrorKind::NotRegularFile,
        Errno::EFBIG | Errno::EOVERFLOW => ReadErrorKind::TooLarge,
        _ => ReadErrorKind::Io,
    }
}

/// A read error at `path` with kind from `errno`.
pub(crate) fn errno_error(path: &str, what: &str, errno: Errno) -> ReadError {
    ReadError {
        path: path.to_string(),
        kind: classify(errno),
        message: format!("{what}: {}", errno.desc()),
    }
}

pub(crate) fn error(path: &str, kind: ReadErrorKind, message: impl Into<String>) -> ReadError {
    ReadError {
        path: path.to_string(),
        kind,
        message: message.into(),
    }
}

/// One hashed file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HashedFile {
    pub digest: FileDigest,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
}

/// What a walk below a directory found.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    /// Relative path (escaped, nested as `a/b/c`) to file.
    pub files: BTreeMap<String, HashedFile>,
    pub errors: Vec<ReadError>,
    /// Some entry disappeared during the walk: the caller retries.
    pub vanished: bool,
}

impl Tree {
    fn push(&mut self, e: ReadError) {
        if e.kind == ReadErrorKind::Vanished {
            self.vanished = true;
        }
        self.errors.push(e);
    }
}

/// A directory entry: its name and, when the filesystem reports it, its type.
#[derive(Clone)]
pub(crate) struct Entry {
    pub name: CString,
    pub kind: Option<Type>,
}

impl Entry {
    pub fn bytes(&self) -> &[u8] {
        self.name.as_bytes()
    }
}

/// Lists a directory (without `.` and `..`), sorted by name.
pub(crate) fn list_dir(fd: &impl AsFd) -> Result<Vec<Entry>, Errno> {
    let dup = fd.as_fd().try_clone_to_owned().map_err(io_errno)?;
    let mut dir = Dir::from_fd(dup)?;
    let mut out = Vec::new();
    for entry in dir.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        out.push(Entry {
            name: name.to_owned(),
            kind: entry.file_type(),
        });
    }
    out.sort_unstable_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn io_errno(e: std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// The type of an entry, from the directory entry or `fstatat` without
/// following symlinks.
pub(crate) fn entry_type(dir: &impl AsFd, entry: &Entry) -> Result<Type, Errno> {
    if let Some(t) = entry.kind {
        return Ok(t);
    }
    let st = fstatat(
        dir.as_fd(),
        entry.name.as_c_str(),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    Ok(type_of_mode(st.st_mode))
}

#[allow(clippy::useless_conversion)]
pub(crate) fn type_of_mode(mode: u32) -> Type {
    let fmt = SFlag::from_bits_truncate((mode & SFlag::S_IFMT.bits()).into());
    if fmt == SFlag::S_IFREG {
        Type::File
    } else if fmt == SFlag::S_IFDIR {
        Type::Directory
    } else if fmt == SFlag::S_IFLNK {
        Type::Symlink
    } else if fmt == SFlag::S_IFIFO {
        Type::Fifo
    } else if fmt == SFlag::S_IFSOCK {
        Type::Socket
    } else if fmt == SFlag::S_IFCHR {
        Type::CharacterDevice
    } else {
        Type::BlockDevice
    }
}

pub(crate) fn type_name(t: Type) -> &'static str {
    match t {
        Type::Fifo => "a FIFO",
        Type::CharacterDevice => "a character device",
        Type::Directory => "a directory",
        Type::BlockDevice => "a block device",
        Type::File => "a regular file",
        Type::Symlink => "a symlink",
        Type::Socket => "a socket",
    }
}

/// Opens a directory entry as a directory, never following a symlink.
pub(crate) fn open_dir_at(dir: &impl AsFd, name: &CStr) -> Result<OwnedFd, Errno> {
    openat(dir.as_fd(), name, dir_flags(), Mode::empty())
}

/// Joins a relative prefix and an escaped name.
fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}/{name}")
    }
}

/// Reads and hashes files with one reusable buffer.
#[derive(Debug)]
pub(crate) struct Reader {
    buf: Vec<u8>,
    max_file_size: u64,
}

impl Reader {
    pub fn new(max_file_size: u64) -> Self {
        Self {
            buf: vec![0; BUF_SIZE],
            max_file_size,
        }
    }

    /// Walks the directory `dir` recursively, hashing every regular file into
    /// `tree` under `prefix`.
    pub fn walk(&mut self, dir: &OwnedFd, prefix: &str, depth: usize, tree: &mut Tree) {
        let entries = match list_dir(dir) {
            Ok(e) => e,
            Err(errno) => {
                tree.push(errno_error(prefix, "listing directory", errno));
                return;
            }
        };
        for entry in entries {
            let name = escape_name(entry.bytes());
            let path = join(prefix, &name);
            if std::str::from_utf8(entry.bytes()).is_err() {
                tree.push(error(
                    &path,
                    ReadErrorKind::InvalidName,
                    "file name is not valid UTF-8 (shown escaped as \\xNN)",
                ));
            }
            let kind = match entry_type(dir, &entry) {
                Ok(k) => k,
                Err(errno) => {
                    tree.push(errno_error(&path, "stat", errno));
                    continue;
                }
            };
            match kind {
                Type::File => match self.hash_at(dir, &entry.name, &path) {
                    Ok(h) => {
                        tree.files.insert(path, h);
                    }
                    Err(e) => tree.push(e),
                },
                Type::Directory => {
                    if depth >= MAX_DEPTH {
                        tree.push(error(
                            &path,
                            ReadErrorKind::Io,
                            format!("nested deeper than {MAX_DEPTH} directories; not read"),
                        ));
                        continue;
                    }
                    match open_dir_at(dir, &entry.name) {
                        Ok(sub) => self.walk(&sub, &path, depth + 1, tree),
                        Err(errno) => tree.push(errno_error(&path, "opening directory", errno)),
                    }
                }
                Type::Symlink => tree.push(error(
                    &path,
                    ReadErrorKind::SymlinkEscape,
                    "symlink inside the data directory; the kubelet never writes one there, not followed",
                )),
                other => tree.push(error(
                    &path,
                    ReadErrorKind::NotRegularFile,
                    format!("{} is not read", type_name(other)),
                )),
            }
        }
    }

    /// Opens `name` in `dir` without following symlinks and hashes it:
    /// `O_PATH` first, the type checked on that descriptor, and only a
    /// regular file reopened for reading (see the module documentation).
    pub fn hash_at(
        &mut self,
        dir: &impl AsFd,
        name: &CStr,
        path: &str,
    ) -> Result<HashedFile, ReadError> {
        let fd = open_checked(dir, name, path)?;
        self.hash_fd(fd, path)
    }

    /// Hashes an opened descriptor after checking it is a regular file under
    /// the size cap.
    pub fn hash_fd(&mut self, fd: OwnedFd, path: &str) -> Result<HashedFile, ReadError> {
        let mut file = File::from(fd);
        let meta = file.metadata().map_err(|e| io_error(path, "stat", &e))?;
        if !meta.file_type().is_file() {
            return Err(error(
                path,
                ReadErrorKind::NotRegularFile,
                format!(
                    "{} is not read",
                    type_name(type_of_mode(meta.mode() & SFlag::S_IFMT.bits()))
                ),
            ));
        }
        if meta.len() > self.max_file_size {
            return Err(self.too_large(path, meta.len()));
        }
        let mut hasher = Sha256::new();
        let mut total: u64 = 0;
        loop {
            let n = match file.read(&mut self.buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_error(path, "reading", &e)),
            };
            total += n as u64;
            if total > self.max_file_size {
                return Err(self.too_large(path, total));
            }
            hasher.update(&self.buf[..n]);
        }
        Ok(HashedFile {
            digest: hasher.finalize().into(),
            mode: meta.mode() & 0o7777,
        })
    }

    fn too_large(&self, path: &str, size: u64) -> ReadError {
        error(
            path,
            ReadErrorKind::TooLarge,
            format!(
                "file has at least {size} bytes, over the cap of {} bytes (--max-file-size)",
                self.max_file_size
            ),
        )
    }
}

/// Opens `name` in `dir` for reading only if it is a regular file, never
/// opening anything else, even when the entry is replaced concurrently.
fn open_checked(dir: &impl AsFd, name: &CStr, path: &str) -> Result<OwnedFd, ReadError> {
    let pfd = openat(dir.as_fd(), name, path_flags(), Mode::empty())
        .map_err(|errno| errno_error(path, "opening file", errno))?;
    let st = fstat(&pfd).map_err(|errno| errno_error(path, "stat", errno))?;
    match type_of_mode(st.st_mode) {
        Type::File => {}
        Type::Symlink => {
            return Err(error(
                path,
                ReadErrorKind::SymlinkEscape,
                "the entry is a symlink; not followed",
            ));
        }
        other => {
            return Err(error(
                path,
                ReadErrorKind::NotRegularFile,
                format!("{} is not read", type_name(other)),
            ));
        }
    }
    let via_proc = format!("/proc/self/fd/{}", pfd.as_raw_fd());
    match nix::fcntl::open(via_proc.as_str(), reopen_flags(), Mode::empty()) {
        Ok(fd) => {
            // The magic link resolves to the checked inode; compare anyway.
            same_inode(fd, &st, path)
        }
        Err(Errno::ENOENT) if !proc_fd_available() => {
            // No /proc: open by name again and keep it only if it is the
            // inode checked (a window remains in which a replacement could
            // be opened, then rejected by the caller's fstat).
            let fd = openat(dir.as_fd(), name, file_flags(), Mode::empty())
                .map_err(|errno| errno_error(path, "opening file", errno))?;
            same_inode(fd, &st, path)
        }
        Err(errno) => Err(errno_error(path, "reopening file", errno)),
    }
}

/// `fd` if it is still the inode `st` describes; a replacement is
/// `Vanished`.
fn same_inode(fd: OwnedFd, st: &FileStat, path: &str) -> Result<OwnedFd, ReadError> {
    match fstat(&fd) {
        Ok(again) if again.st_dev == st.st_dev && again.st_ino == st.st_ino => Ok(fd),
        Ok(_) => Err(error(
            path,
            ReadErrorKind::Vanished,
            "replaced while opened",
        )),
        Err(errno) => Err(errno_error(path, "stat", errno)),
    }
}

/// Whether `/proc/self/fd` exists (checked once).
fn proc_fd_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| std::path::Path::new("/proc/self/fd").is_dir())
}

pub(crate) fn io_error(path: &str, what: &str, e: &std::io::Error) -> ReadError {
    errno_error(path, what, io_errno_ref(e))
}

fn io_errno_ref(e: &std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn open(path: &std::path::Path) -> OwnedFd {
        nix::fcntl::open(path, dir_flags(), Mode::empty()).unwrap()
    }

    #[test]
    fn walks_nested_files_with_modes() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("a/b")).unwrap();
        std::fs::write(tmp.path().join("a/b/c"), b"deep").unwrap();
        std::fs::write(tmp.path().join("top"), b"t").unwrap();
        std::fs::set_permissions(
            tmp.path().join("top"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let mut r = Reader::new(1024);
        let mut tree = Tree::default();
        r.walk(&open(tmp.path()), "", 0, &mut tree);
        assert!(tree.errors.is_empty(), "{:?}", tree.errors);
        assert_eq!(tree.files.keys().collect::<Vec<_>>(), vec!["a/b/c", "top"]);
        assert_eq!(
            tree.files["a/b/c"].digest,
            mountguard_inventory::file_digest(b"deep")
        );
        assert_eq!(tree.files["top"].mode, 0o600);
    }

    #[test]
    fn size_cap_is_inclusive_of_the_cap() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("exact"), vec![7u8; 100]).unwrap();
        std::fs::write(tmp.path().join("over"), vec![7u8; 101]).unwrap();
        let mut r = Reader::new(100);
        let mut tree = Tree::default();
        r.walk(&open(tmp.path()), "", 0, &mut tree);
        assert!(tree.files.contains_key("exact"));
        assert!(!tree.files.contains_key("over"));
        assert_eq!(tree.errors.len(), 1);
        assert_eq!(tree.errors[0].kind, ReadErrorKind::TooLarge);
        assert_eq!(tree.errors[0].path, "over");
    }

    #[test]
    fn large_file_hash_matches_one_shot_digest() {
        let tmp = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(3 * BUF_SIZE + 17)).map(|i| (i % 251) as u8).collect();
        std::fs::write(tmp.path().join("big"), &data).unwrap();
        let mut r = Reader::new(u64::MAX);
        let mut tree = Tree::default();
        r.walk(&open(tmp.path()), "", 0, &mut tree);
        assert_eq!(
            tree.files["big"].digest,
            mountguard_inventory::file_digest(&data)
        );
    }

    /// A regular file and a device (or FIFO where mknod is not allowed)
    /// swap names under a reader in a loop; an inotify watch on the device
    /// counts every real open of it. `O_PATH` opens are not reported by
    /// inotify (Linux >= 6.5), reads are: the reader must never open the
    /// device, whatever the interleaving.
    #[test]
    fn a_device_renamed_over_a_file_is_never_opened() {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        std::fs::write(dir.join("f"), b"regular").unwrap();
        let dev = dir.join("d");
        let made_device = nix::sys::stat::mknod(
            &dev,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .is_ok();
        if !made_device {
            nix::unistd::mkfifo(&dev, Mode::from_bits_truncate(0o600)).unwrap();
        }
        let watch = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
        watch.add_watch(&dev, AddWatchFlags::IN_OPEN).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let swapper = {
            let (stop, dir) = (stop.clone(), dir.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Swap "f" and "d" atomically, like a hostile rename.
                    nix::fcntl::renameat2(
                        nix::fcntl::AT_FDCWD,
                        &dir.join("f"),
                        nix::fcntl::AT_FDCWD,
                        &dir.join("d"),
                        nix::fcntl::RenameFlags::RENAME_EXCHANGE,
                    )
                    .unwrap();
                    n += 1;
                }
                n
            })
        };
        let fd = open(&dir);
        let mut r = Reader::new(1024);
        let (mut hashed, mut refused) = (0, 0);
        for _ in 0..10_000 {
            let mut tree = Tree::default();
            r.walk(&fd, "", 0, &mut tree);
            hashed += tree.files.len();
            refused += tree
                .errors
                .iter()
                .filter(|e| e.kind == ReadErrorKind::NotRegularFile)
                .count();
        }
        stop.store(true, Ordering::Relaxed);
        let swaps = swapper.join().unwrap();
        let mut opens = 0;
        while let Ok(events) = watch.read_events() {
            opens += events.len();
        }
        assert!(
            swaps > 0 && hashed > 0 && refused > 0,
            "{swaps} {hashed} {refused}"
        );
        assert_eq!(
            opens,
            0,
            "the {} was opened {opens} times ({swaps} swaps, {hashed} hashed, {refused} refused)",
            if made_device { "device" } else { "FIFO" }
        );
    }

    #[test]
    fn errno_classification() {
        assert_eq!(classify(Errno::EACCES), ReadErrorKind::Permission);
        assert_eq!(classify(Errno::ENOENT), ReadErrorKind::Vanished);
        assert_eq!(classify(Errno::ELOOP), ReadErrorKind::SymlinkEscape);
        assert_eq!(classify(Errno::EIO), ReadErrorKind::Io);
    }
}
