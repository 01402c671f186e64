//! `AtomicWriterDouble`: a test double of the kubelet's AtomicWriter
//! (`pkg/volume/util/atomic_writer.go`), used by the agent's tests, the
//! simulated kubelets and the demo. It writes a volume directory exactly the
//! way the kubelet does, step by step:
//!
//! 1. validate payload paths (relative, no `..` element, no leading `..`,
//!    at most 255 bytes per component and 4096 in total);
//! 2. read `..data`; when every payload file already has the same bytes and
//!    no file would be removed, write nothing (modes alone do not trigger a
//!    write, as in the kubelet);
//! 3. create `..YYYY_MM_DD_HH_MM_SS.<random>` (UTC) and write every file with
//!    its mode, nested paths as real directories;
//! 4. symlink `..data_tmp -> ..<timestamp>` and rename it over `..data`;
//! 5. create missing top-level links `<first component> -> ..data/<first component>`,
//!    remove top-level links no longer in the payload, delete the old
//!    timestamped directory.
//!
//! It is a double for tests: it is not used by the agent at run time.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::layout::{DATA_LINK, DATA_TMP_LINK, is_data_dir_name};

/// One file of a payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayloadFile {
    /// The bytes to write.
    pub data: Vec<u8>,
    /// Permission bits (e.g. `0o644`).
    pub mode: u32,
}

impl PayloadFile {
    /// A file with mode 0644 (the API's default `defaultMode`).
    pub fn new(data: impl Into<Vec<u8>>) -> Self {
        Self {
            data: data.into(),
            mode: 0o644,
        }
    }

    /// A file with the given mode.
    pub fn with_mode(data: impl Into<Vec<u8>>, mode: u32) -> Self {
        Self {
            data: data.into(),
            mode,
        }
    }
}

/// Relative path (`a/b/c`) to file.
pub type Payload = BTreeMap<String, PayloadFile>;

/// What a write did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The content on disk already matched; nothing was written.
    Unchanged,
    /// A new timestamped directory was published.
    Written {
        /// Its name (`..2026_...`).
        data_dir: String,
    },
}

/// The points between the AtomicWriter's steps, for tests that race a reader
/// against a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteStep {
    /// The new timestamped directory is complete but not yet published.
    DataDirWritten {
        /// Its name.
        data_dir: String,
    },
    /// `..data` now points to the new directory; links not yet updated.
    Swapped,
    /// Top-level links are updated; the old directory still exists.
    LinksUpdated,
    /// The old timestamped directory is gone.
    OldDirRemoved,
}

/// Errors of the writer double.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// A payload path the kubelet would refuse.
    #[error("invalid payload path {path:?}: {reason}")]
    InvalidPath {
        /// The path.
        path: String,
        /// Why it is refused.
        reason: &'static str,
    },
    /// A filesystem operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path operated on.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WriterError {
    let path = path.to_path_buf();
    move |source| WriterError::Io { op, path, source }
}

/// Checks a payload path the way the kubelet's `validatePath` does.
pub fn validate_path(path: &str) -> Result<(), WriterError> {
    let bad = |reason| {
        Err(WriterError::InvalidPath {
            path: path.to_string(),
            reason,
        })
    };
    if path.is_empty() {
        return bad("empty path");
    }
    if path.len() > 4096 {
        return bad("longer than 4096 bytes");
    }
    if path.starts_with('/') {
        return bad("must be relative");
    }
    if path.starts_with("..") {
        return bad("must not start with '..'");
    }
    for part in path.split('/') {
        if part.len() > 255 {
            return bad("a path component is longer than 255 bytes");
        }
        if part == ".." {
            return bad("must not contain '..'");
        }
    }
    Ok(())
}

/// A double of the kubelet's AtomicWriter for one volume directory.
#[derive(Debug, Clone)]
pub struct AtomicWriterDouble {
    target: PathBuf,
}

static COUNTER: AtomicU64 = AtomicU64::new(0);

fn random_suffix() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    (nanos ^ (u64::from(std::process::id()) << 20) ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15))
        % 1_000_000_000
}

impl AtomicWriterDouble {
    /// A writer for the volume directory `target` (created on first write).
    pub fn new(target: impl Into<PathBuf>) -> Self {
        Self {
            target: target.into(),
        }
    }

    /// The volume directory.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The current `..data` target name, if the volume was written.
    pub fn current_data_dir(&self) -> Option<String> {
        let link = fs::read_link(self.target.join(DATA_LINK)).ok()?;
        link.to_str().map(str::to_string)
    }

    /// Writes `payload` like the kubelet.
    pub fn write(&self, payload: &Payload) -> Result<WriteOutcome, WriterError> {
        self.write_with_hook(payload, &mut |_| {})
    }

    /// Writes `payload`, calling `hook` between the steps.
    pub fn write_with_hook(
        &self,
        payload: &Payload,
        hook: &mut dyn FnMut(&WriteStep),
    ) -> Result<WriteOutcome, WriterError> {
        for path in payload.keys() {
            validate_path(path)?;
        }
        fs::create_dir_all(&self.target).map_err(io_err("create", &self.target))?;

        let old_dir = self.current_data_dir().filter(|d| is_data_dir_name(d));
        let old_paths = match &old_dir {
            Some(d) => list_files(&self.target.join(d))?,
            None => BTreeSet::new(),
        };
        let to_remove: BTreeSet<&String> = old_paths
            .iter()
            .filter(|p| !payload.contains_key(p.as_str()))
            .collect();
        if let Some(d) = &old_dir {
            let base = self.target.join(d);
            let same = payload
                .iter()
                .all(|(p, f)| fs::read(base.join(p)).is_ok_and(|b| b == f.data));
            if same && to_remove.is_empty() {
                return Ok(WriteOutcome::Unchanged);
            }
        }

        // Step 3: the new timestamped directory.
        let stamp = jiff::Timestamp::now()
            .strftime("%Y_%m_%d_%H_%M_%S")
            .to_string();
        let (data_dir, ts_path) = loop {
            let name = format!("..{stamp}.{:09}", random_suffix());
            let path = self.target.join(&name);
            match fs::create_dir(&path) {
                Ok(()) => break (name, path),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(io_err("create", &path)(e)),
            }
        };
        fs::set_permissions(&ts_path, fs::Permissions::from_mode(0o755))
            .map_err(io_err("chmod", &ts_path))?;
        for (rel, file) in payload {
            let full = ts_path.join(rel);
            if let Some(parent) = full.parent() {
                fs::create_dir_all(parent).map_err(io_err("create", parent))?;
            }
            fs::write(&full, &file.data).map_err(io_err("write", &full))?;
            fs::set_permissions(&full, fs::Permissions::from_mode(file.mode))
                .map_err(io_err("chmod", &full))?;
        }
        hook(&WriteStep::DataDirWritten {
            data_dir: data_dir.clone(),
        });

        // Step 4: publish atomically.
        let tmp = self.target.join(DATA_TMP_LINK);
        let _ = fs::remove_file(&tmp);
        symlink(&data_dir, &tmp).map_err(io_err("symlink", &tmp))?;
        let data = self.target.join(DATA_LINK);
        fs::rename(&tmp, &data).map_err(io_err("rename", &data))?;
        hook(&WriteStep::Swapped);

        // Step 5: user-visible links.
        let new_top: BTreeSet<&str> = payload.keys().map(|p| top_component(p)).collect();
        for top in &new_top {
            let visible = self.target.join(top);
            if fs::symlink_metadata(&visible).is_err() {
                symlink(Path::new(DATA_LINK).join(top), &visible)
                    .map_err(io_err("symlink", &visible))?;
            }
        }
        let old_top: BTreeSet<&str> = to_remove.iter().map(|p| top_component(p)).collect();
        for top in old_top.difference(&new_top) {
            let visible = self.target.join(top);
            match fs::remove_file(&visible) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err("remove", &visible)(e)),
            }
        }
        hook(&WriteStep::LinksUpdated);

        if let Some(d) = old_dir {
            let old = self.target.join(d);
            fs::remove_dir_all(&old).map_err(io_err("remove", &old))?;
        }
        hook(&WriteStep::OldDirRemoved);
        Ok(WriteOutcome::Written { data_dir })
    }

    /// Removes the whole volume directory, as the kubelet's teardown does.
    pub fn remove(&self) -> Result<(), WriterError> {
        match fs::remove_dir_all(&self.target) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("remove", &self.target)(e)),
        }
    }
}

fn top_component(path: &str) -> &str {
    path.split('/').next().unwrap_or(path)
}

/// Relative paths of every regular file below `dir`.
fn list_files(dir: &Path) -> Result<BTreeSet<String>, WriterError> {
    let mut out = BTreeSet::new();
    let mut stack = vec![(dir.to_path_buf(), String::new())];
    while let Some((abs, rel)) = stack.pop() {
        let entries = match fs::read_dir(&abs) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err("read", &abs)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(io_err("read", &abs))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let child_rel = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let ft = entry.file_type().map_err(io_err("stat", &entry.path()))?;
            if ft.is_dir() {
                stack.push((entry.path(), child_rel));
            } else {
                out.insert(child_rel);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(items: &[(&str, &str)]) -> Payload {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), PayloadFile::new(v.as_bytes())))
            .collect()
    }

    fn visible(dir: &Path) -> BTreeSet<String> {
        fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with(".."))
            .collect()
    }

    #[test]
    fn first_write_publishes_data_dir_and_links() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriterDouble::new(tmp.path().join("vol"));
        let out = w.write(&payload(&[("a", "1"), ("dir/b", "2")])).unwrap();
        let WriteOutcome::Written { data_dir } = out else {
            panic!("expected a write")
        };
        assert!(is_data_dir_name(&data_dir), "{data_dir}");
        assert_eq!(w.current_data_dir().as_deref(), Some(data_dir.as_str()));
        assert_eq!(fs::read(w.target().join("a")).unwrap(), b"1");
        assert_eq!(fs::read(w.target().join("dir/b")).unwrap(), b"2");
        assert_eq!(
            fs::read_link(w.target().join("dir")).unwrap(),
            Path::new("..data/dir")
        );
        assert_eq!(
            visible(w.target()),
            BTreeSet::from(["a".into(), "dir".into()])
        );
        assert!(!w.target().join(DATA_TMP_LINK).exists());
    }

    #[test]
    fn identical_payload_writes_nothing_and_update_replaces_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriterDouble::new(tmp.path().join("vol"));
        w.write(&payload(&[("a", "1"), ("b", "2")])).unwrap();
        let first = w.current_data_dir().unwrap();
        assert_eq!(
            w.write(&payload(&[("a", "1"), ("b", "2")])).unwrap(),
            WriteOutcome::Unchanged
        );
        assert_eq!(w.current_data_dir().unwrap(), first);

        // Remove b, change a, add c.
        w.write(&payload(&[("a", "9"), ("c", "3")])).unwrap();
        let second = w.current_data_dir().unwrap();
        assert_ne!(first, second);
        assert!(!w.target().join(&first).exists(), "old dir deleted");
        assert_eq!(fs::read(w.target().join("a")).unwrap(), b"9");
        assert!(
            fs::symlink_metadata(w.target().join("b")).is_err(),
            "b link removed"
        );
        assert_eq!(
            visible(w.target()),
            BTreeSet::from(["a".into(), "c".into()])
        );

        // Removing a file alone triggers a write too.
        w.write(&payload(&[("a", "9")])).unwrap();
        assert_ne!(w.current_data_dir().unwrap(), second);
        assert_eq!(visible(w.target()), BTreeSet::from(["a".into()]));
    }

    #[test]
    fn modes_are_applied() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriterDouble::new(tmp.path().join("vol"));
        let mut p = Payload::new();
        p.insert(
            "slurm.key".into(),
            PayloadFile::with_mode(b"k".to_vec(), 0o600),
        );
        w.write(&p).unwrap();
        let meta = fs::metadata(w.target().join("slurm.key")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
    }

    #[test]
    fn hook_sees_steps_in_order() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriterDouble::new(tmp.path().join("vol"));
        w.write(&payload(&[("a", "1")])).unwrap();
        let mut steps = Vec::new();
        let target = w.target().to_path_buf();
        w.write_with_hook(&payload(&[("a", "2")]), &mut |s| {
            // Before the swap, readers still see the old bytes.
            if matches!(s, WriteStep::DataDirWritten { .. }) {
                assert_eq!(fs::read(target.join("a")).unwrap(), b"1");
            }
            if matches!(s, WriteStep::Swapped) {
                assert_eq!(fs::read(target.join("a")).unwrap(), b"2");
            }
            steps.push(std::mem::discriminant(s));
        })
        .unwrap();
        assert_eq!(steps.len(), 4);
    }

    #[test]
    fn invalid_paths_are_refused() {
        for bad in [
            "",
            "/abs",
            "..x",
            "a/../b",
            &"x".repeat(256),
            &"a/".repeat(2100),
        ] {
            assert!(validate_path(bad).is_err(), "{bad:?} accepted");
        }
        for good in ["a", "a/b/c", "a..b", ".hidden"] {
            assert!(validate_path(good).is_ok(), "{good:?} refused");
        }
    }

    #[test]
    fn remove_deletes_the_volume() {
        let tmp = tempfile::tempdir().unwrap();
        let w = AtomicWriterDouble::new(tmp.path().join("vol"));
        w.write(&payload(&[("a", "1")])).unwrap();
        w.remove().unwrap();
        assert!(!w.target().exists());
        w.remove().unwrap();
    }
}
