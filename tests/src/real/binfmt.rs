//! A `binfmt_misc` handler of the test's own for arm64 ELF programs, run
//! by qemu-user (Debian's `qemu-user-static`), so that a container of an
//! arm64 image runs on this amd64 node. Registered under a name of this
//! process (`mountguard-aarch64-<pid>`) and removed when dropped; nothing
//! is written under /etc.
//!
//! The rule follows the kernel's `Documentation/admin-guide/binfmt-misc.rst`
//! (the `:name:type:offset:magic:mask:interpreter:flags` line written to
//! `register`; an entry is removed by writing `-1` to it). Flag `F` opens
//! the interpreter when the rule is registered, so it is found from inside
//! a container's mount namespace, where no qemu exists. The magic is the
//! ELF header of the System V gABI (`e_ident`: `\x7fELF`, ELFCLASS64,
//! ELFDATA2LSB, EV_CURRENT, the OS ABI and padding masked; `e_type`
//! ET_EXEC or ET_DYN, the low bit masked; `e_machine` EM_AARCH64, 183).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::containerd::Unavailable;

/// The statically linked qemu-user the rule names (Debian `qemu-user-static`).
pub const QEMU_AARCH64: &str = "/usr/bin/qemu-aarch64-static";

const BINFMT_DIR: &str = "/proc/sys/fs/binfmt_misc";

/// The registered rule; removed on drop.
#[derive(Debug)]
pub struct Aarch64Handler {
    entry: PathBuf,
}

/// The bytes of the ELF header the rule matches, and its mask (20 bytes:
/// `e_ident` then `e_type` and `e_machine`, little-endian).
fn magic_and_mask() -> ([u8; 20], [u8; 20]) {
    let mut magic = [0u8; 20];
    magic[..4].copy_from_slice(b"\x7fELF");
    magic[4] = 2; // EI_CLASS: ELFCLASS64
    magic[5] = 1; // EI_DATA: ELFDATA2LSB
    magic[6] = 1; // EI_VERSION: EV_CURRENT
    magic[16] = 2; // e_type: ET_EXEC (ET_DYN = 3 through the mask)
    magic[18] = 183; // e_machine: EM_AARCH64
    let mut mask = [0xffu8; 20];
    mask[7] = 0; // EI_OSABI: any
    mask[16] = 0xfe;
    (magic, mask)
}

fn escaped(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("\\x{b:02x}")).collect()
}

impl Aarch64Handler {
    /// Mounts `binfmt_misc` where it is not (as systemd does at boot; it is
    /// left mounted) and registers the rule. `Err` says why it cannot be
    /// had here.
    pub fn register() -> Result<Self, Unavailable> {
        if !Path::new(QEMU_AARCH64).is_file() {
            return Err(Unavailable(format!(
                "{QEMU_AARCH64} not found (Debian package qemu-user-static)"
            )));
        }
        let dir = Path::new(BINFMT_DIR);
        if !dir.join("register").exists() {
            let out = Command::new("mount")
                .args(["-t", "binfmt_misc", "binfmt_misc", BINFMT_DIR])
                .output()
                .map_err(|e| Unavailable(format!("running mount: {e}")))?;
            if !out.status.success() {
                return Err(Unavailable(format!(
                    "mount -t binfmt_misc binfmt_misc {BINFMT_DIR}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        let name = format!("mountguard-aarch64-{}", std::process::id());
        let (magic, mask) = magic_and_mask();
        let rule = format!(
            ":{name}:M:0:{}:{}:{QEMU_AARCH64}:F",
            escaped(&magic),
            escaped(&mask)
        );
        std::fs::write(dir.join("register"), &rule)
            .map_err(|e| Unavailable(format!("registering {rule} in {BINFMT_DIR}: {e}")))?;
        let entry = dir.join(&name);
        let handler = Self { entry };
        let state = handler
            .state()
            .map_err(|e| Unavailable(format!("reading {}: {e}", handler.entry.display())))?;
        if !state.lines().any(|l| l == "enabled") || !state.contains("flags: F") {
            return Err(Unavailable(format!(
                "{} is not an enabled fix-binary rule:\n{state}",
                handler.entry.display()
            )));
        }
        Ok(handler)
    }

    /// Whether the host already has an enabled or disabled rule whose
    /// interpreter is an aarch64 emulator (one of its own, registered
    /// before this test).
    pub fn host_has_one() -> bool {
        std::fs::read_dir(BINFMT_DIR)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .any(|s| {
                s.lines()
                    .any(|l| l.starts_with("interpreter ") && l.contains("aarch64"))
            })
    }

    /// The kernel's view of the rule (interpreter, flags, magic).
    pub fn state(&self) -> io::Result<String> {
        std::fs::read_to_string(&self.entry)
    }
}

impl Drop for Aarch64Handler {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.entry, "-1");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_matches_arm64_elf_programs_and_no_x86_64_one() {
        let (magic, mask) = magic_and_mask();
        let matches = |header: &[u8]| {
            header
                .iter()
                .zip(magic.iter().zip(&mask))
                .all(|(h, (m, k))| h & k == m & k)
        };
        // The first 20 bytes of a static-pie aarch64 program (ET_DYN) and
        // of a static one (ET_EXEC), OS ABI System V or Linux.
        let mut arm_pie = [0u8; 20];
        arm_pie[..7].copy_from_slice(b"\x7fELF\x02\x01\x01");
        arm_pie[16] = 3;
        arm_pie[18] = 0xb7;
        assert!(matches(&arm_pie));
        let mut arm_exec = arm_pie;
        arm_exec[16] = 2;
        arm_exec[7] = 3;
        assert!(matches(&arm_exec));
        let mut x86 = arm_pie;
        x86[18] = 0x3e; // EM_X86_64
        assert!(!matches(&x86));
        let mut arm32 = arm_pie;
        arm32[4] = 1; // ELFCLASS32
        arm32[18] = 0x28; // EM_ARM
        assert!(!matches(&arm32));
        let mut core = arm_pie;
        core[16] = 4; // ET_CORE
        assert!(!matches(&core));
    }

    #[test]
    fn the_rule_is_written_as_escaped_bytes() {
        assert_eq!(escaped(b"\x7fE"), "\\x7f\\x45");
    }
}
