//! The checks of a volume's structure and how what they find is
//! classified: a `..data` target that is not a timestamped directory, a
//! volume without `..data` (with the mount propagation hint), and visible
//! entries that are not links into `..data` (`symlinkEscape`,
//! `notRegularFile`).

use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;

use mountguard_inventory::{Plugin, ReadError, ReadErrorKind, VolumeInventory, escape_name};
use nix::dir::Type;
use nix::errno::Errno;
use nix::fcntl::readlinkat;

use crate::safe_read::{entry_type, errno_error, error, list_dir, type_name};

use super::Ident;

/// Whether `..data` names a valid timestamped directory: one component,
/// starting with `..`, not `..` itself nor the kubelet's link names.
pub(super) fn valid_data_target(t: &[u8]) -> bool {
    std::str::from_utf8(t).is_ok_and(mountguard_inventory::layout::is_data_dir_name)
}

/// A volume without `..data`. Secret and projected volumes are tmpfs mounts
/// of their own: if the directory is not a mount point in the agent's view,
/// mount propagation from the host is probably missing.
pub(super) fn no_data(
    mut volume: VolumeInventory,
    vol: Ident,
    plugin_dev: Option<u64>,
) -> VolumeInventory {
    if volume.plugin != Plugin::Configmap && plugin_dev == Some(vol.dev) {
        volume.errors.push(error(
            "",
            ReadErrorKind::MountPropagation,
            "no ..data and the directory is not a mount point here: the kubelet's tmpfs \
             mount is not visible to the agent; mount the kubelet directory with \
             mountPropagation: HostToContainer",
        ));
    }
    volume
}

/// Checks every visible top-level entry of a volume directory is a link
/// `name -> ..data/name`. Links are read, never followed.
pub(super) fn check_links(vfd: &OwnedFd) -> Vec<ReadError> {
    let mut errors = Vec::new();
    let entries = match list_dir(vfd) {
        Ok(e) => e,
        Err(errno) => {
            errors.push(errno_error("", "listing the volume directory", errno));
            return errors;
        }
    };
    for entry in entries {
        let bytes = entry.bytes();
        if bytes.starts_with(b"..") {
            continue;
        }
        let path = escape_name(bytes);
        match entry_type(vfd, &entry) {
            Ok(Type::Symlink) => match readlinkat(vfd, entry.name.as_c_str()) {
                Ok(target) => {
                    let mut expected = b"..data/".to_vec();
                    expected.extend_from_slice(bytes);
                    if target.as_bytes() != expected.as_slice() {
                        errors.push(error(
                            &path,
                            ReadErrorKind::SymlinkEscape,
                            format!(
                                "visible link points to {:?}, not ..data/{path}; not followed",
                                escape_name(target.as_bytes())
                            ),
                        ));
                    }
                }
                Err(Errno::ENOENT) => {}
                Err(errno) => errors.push(errno_error(&path, "reading the link", errno)),
            },
            Ok(other) => errors.push(error(
                &path,
                ReadErrorKind::NotRegularFile,
                format!(
                    "visible entry is {}, not a link into ..data; not read",
                    type_name(other)
                ),
            )),
            Err(Errno::ENOENT) => {}
            Err(errno) => errors.push(errno_error(&path, "stat", errno)),
        }
    }
    errors
}
