//! Descriptor-relative reading of what the kubelet wrote.
//!
//! Every open is `openat` relative to an already opened directory with
//! `O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`, so a symlink is never followed, a
//! FIFO never blocks and a device is never opened: the entry type is checked
//! from the directory entry (or `fstatat` without following) before opening,
//! and again with `fstat` on the opened descriptor. Only regular files and
//! directories are read. A problem becomes a [`ReadError`], never a panic.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use mountguard_inventory::{FileDigest, ReadError, ReadErrorKind, escape_name};
use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::{Mode, SFlag, fstatat};
use sha2::{Digest, Sha256};

/// Flags for opening a directory below a volume.
pub(crate) fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK
}

/// Flags for opening a file to hash it.
fn file_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC | OFlag::O_NOCTTY
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

    /// Opens `name` in `dir` without following symlinks and hashes it.
    pub fn hash_at(
        &mut self,
        dir: &impl AsFd,
        name: &CStr,
        path: &str,
    ) -> Result<HashedFile, ReadError> {
        let fd = openat(dir.as_fd(), name, file_flags(), Mode::empty())
            .map_err(|errno| errno_error(path, "opening file", errno))?;
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

    #[test]
    fn errno_classification() {
        assert_eq!(classify(Errno::EACCES), ReadErrorKind::Permission);
        assert_eq!(classify(Errno::ENOENT), ReadErrorKind::Vanished);
        assert_eq!(classify(Errno::ELOOP), ReadErrorKind::SymlinkEscape);
        assert_eq!(classify(Errno::EIO), ReadErrorKind::Io);
    }
}
