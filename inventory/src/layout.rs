//! Where the kubelet puts things under its root directory.
//!
//! `<root>/pods/<pod-uid>/volumes/<plugin>/<volume>/` for volumes and
//! `<root>/pods/<pod-uid>/volume-subpaths/<volume>/<container>/<index>` for
//! subPath bind targets.

use std::path::{Path, PathBuf};

use crate::Plugin;

/// Name of the directory holding pod directories under the kubelet root.
pub const PODS_DIR: &str = "pods";
/// Name of the per-pod directory holding volume plugin directories.
pub const VOLUMES_DIR: &str = "volumes";
/// Name of the per-pod directory holding subPath bind targets.
pub const SUBPATHS_DIR: &str = "volume-subpaths";
/// The symlink the kubelet swaps atomically to publish new content.
pub const DATA_LINK: &str = "..data";
/// The temporary symlink renamed over [`DATA_LINK`].
pub const DATA_TMP_LINK: &str = "..data_tmp";

/// `<root>/pods`
pub fn pods_dir(root: &Path) -> PathBuf {
    root.join(PODS_DIR)
}

/// `<root>/pods/<uid>`
pub fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    pods_dir(root).join(uid)
}

/// `<root>/pods/<uid>/volumes/<plugin dir>/<name>`
pub fn volume_dir(root: &Path, uid: &str, plugin: Plugin, name: &str) -> PathBuf {
    pod_dir(root, uid)
        .join(VOLUMES_DIR)
        .join(plugin.dir_name())
        .join(name)
}

/// `<root>/pods/<uid>/volume-subpaths/<volume>/<container>/<index>`
pub fn subpath_target(
    root: &Path,
    uid: &str,
    volume: &str,
    container: &str,
    index: u32,
) -> PathBuf {
    pod_dir(root, uid)
        .join(SUBPATHS_DIR)
        .join(volume)
        .join(container)
        .join(index.to_string())
}

/// Whether `name` is a valid `..data` target: a single path component that
/// starts with `..` and is neither `..` itself nor one of the kubelet's own
/// link names.
pub fn is_data_dir_name(name: &str) -> bool {
    name.len() > 2
        && name.starts_with("..")
        && !name.contains('/')
        && name != DATA_LINK
        && name != DATA_TMP_LINK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_kubelet_layout() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            volume_dir(root, "u1", Plugin::Projected, "slurm-etc"),
            Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~projected/slurm-etc")
        );
        assert_eq!(
            subpath_target(root, "u1", "sshd", "slurmd", 3),
            Path::new("/var/lib/kubelet/pods/u1/volume-subpaths/sshd/slurmd/3")
        );
    }

    #[test]
    fn data_dir_names() {
        assert!(is_data_dir_name("..2026_11_30_08_25_30.123456789"));
        assert!(!is_data_dir_name(".."));
        assert!(!is_data_dir_name("..data"));
        assert!(!is_data_dir_name("..data_tmp"));
        assert!(!is_data_dir_name("../etc"));
        assert!(!is_data_dir_name("plain"));
        assert!(!is_data_dir_name(".x"));
    }
}
