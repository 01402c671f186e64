//! A real container runtime for the real kubelet: containerd v2.4.2 (with
//! its runc shim and `ctr`) and runc v1.5.3, built by
//! scripts/node-tools.sh into its bin directory (the one [`super::real_node::node_tools`]
//! finds), and the CNI `bridge`, `loopback` and `host-local` plugins of
//! Debian's `containernetworking-plugins`, started from a configuration
//! generated into the rig's temporary directory. containerd is started
//! with that bin directory first on its `PATH`, where it finds the shim
//! (containerd v2.4.2 `core/runtime/v2/shim_manager.go`,
//! `ShimManager.resolveRuntimePath`: `exec.LookPath` of the shim's name),
//! and the runc runtime's `BinaryName` names runc by its path. Nothing is
//! written into the host's /etc; the runtime's root, state, runc state,
//! network namespaces, CNI configuration and IPAM leases all live under that
//! directory. What outlives it is removed by [`Containerd::stop`] (also on
//! drop): every container and sandbox, the shims, the mounts under the
//! directory, the bridge, the `k8s.io` cgroups it created.
//!
//! Configuration `version = 4`, v2.4.2's own (`version/version.go`
//! `ConfigVersion`; a version 3 file is migrated at every start, with a
//! warning): the gRPC and ttrpc sockets are the `address` of the plugins
//! `io.containerd.server.v1.grpc` and `io.containerd.server.v1.ttrpc`
//! (in version 4 the top-level `[grpc]` and `[ttrpc]` tables are not read:
//! `cmd/containerd/server/config/config.go` `serviceMigrate` moves them
//! there for older files), the debug and metrics servers stay off (no
//! address); the CRI plugin is split in three as since version 3:
//! `io.containerd.cri.v1.images` takes `ImageConfig`,
//! `io.containerd.cri.v1.runtime` takes `RuntimeConfig` and
//! `io.containerd.grpc.v1.cri` takes `ServerConfig` (all in
//! `internal/cri/config/config.go`; every path here at containerd v2.4.2).
//! No `imports`: only the files a configuration names are loaded, none of
//! the host's (same file, `LoadConfigWithPlugins`). The fields that matter
//! here:
//! - `restrict_oom_score_adj = true` (`RuntimeConfig`): the kubelet asks for
//!   a negative `oomScoreAdj` for the sandbox and for system-node-critical
//!   pods, and runc refuses to lower it without CAP_SYS_RESOURCE, which root
//!   lacks in this VM ("write /proc/self/oom_score_adj: permission denied");
//!   containerd then clamps it to its own value
//!   (`internal/cri/opts/spec_linux_opts.go`, `restrictOOMScoreAdj`);
//! - `SystemdCgroup = false`, `BinaryName` and `Root` among the runc
//!   runtime's `options` (`RuntimeConfig.ContainerdConfig.Runtimes`; the
//!   options `internal/cri/config/config_unix.go` `DefaultRuntimeConfig`
//!   lists): cgroupfs (the kubelet's `cgroupDriver`), the runc of the bin
//!   directory, its state under the rig's directory;
//! - `pinned_images.sandbox` (`ImageConfig.PinnedImages`, containerd 1's
//!   `sandbox_image`): the pause image built by scripts/images.sh, imported
//!   before the first pod (no registry is reachable);
//! - `netns_mounts_under_state_dir = true` (`RuntimeConfig`): the pods'
//!   network namespaces under the state directory, not /var/run/netns;
//! - `disable_apparmor = true` (`RuntimeConfig`): no AppArmor in this
//!   kernel.
//!
//! The pod network is one Linux bridge of this rig's own (`mgbr<n>`) with a
//! /24 of 10.213.0.0/16, host-local IPAM with its data in the temporary
//! directory, the bridge as the pods' gateway and no masquerading: pod
//! traffic stays on the machine.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::mountguard::{ChildGuard, poll};

/// The containerd namespace of the CRI plugin.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// A running containerd (see the module doc).
#[derive(Debug)]
pub struct Containerd {
    dir: PathBuf,
    /// scripts/node-tools.sh's bin directory (containerd, ctr, the shim, runc).
    bin: PathBuf,
    sock: PathBuf,
    child: Option<ChildGuard>,
    bridge: String,
    subnet: String,
    gateway: String,
    /// The cgroup v1 directories `<hierarchy>/k8s.io` that existed before
    /// this runtime started (runc creates the others for the first pod;
    /// they are removed at the end).
    preexisting_cgroups: Vec<PathBuf>,
    pause_image: String,
    /// `net.ipv4.ip_forward` before the start (the bridge plugin with
    /// `isGateway` sets it to 1; restored at the end).
    ip_forward: String,
}

const IP_FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";

/// Why the runtime cannot run here: a missing program, not root, or
/// containerd failing to start; the tests report these as SKIPPED.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl std::fmt::Display for Unavailable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The runtime's programs in scripts/node-tools.sh's bin directory.
pub const PROGRAMS: [&str; 4] = ["containerd", "containerd-shim-runc-v2", "runc", "ctr"];

/// `PATH` with `bin` first (the shim containerd starts, and what the shim
/// runs, come from there).
fn path_with(bin: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(bin.to_path_buf()).chain(std::env::split_paths(&rest)))
        .unwrap_or(rest)
}

/// The CNI plugin directory of Debian's containernetworking-plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

fn k8s_cgroups() -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(CGROUP_ROOT) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .map(|p| p.join(CRI_NAMESPACE))
        .collect();
    out.sort();
    out
}

impl Containerd {
    /// Checks the prerequisites and starts containerd in `dir` from
    /// scripts/node-tools.sh's bin directory `bin`, logging to `log`;
    /// `pause_image` is the sandbox image reference (imported by the caller
    /// with [`Self::import`] before the first pod).
    pub async fn start(
        bin: &Path,
        dir: &Path,
        log: &Path,
        pause_image: &str,
    ) -> Result<Self, Unavailable> {
        // The effective uid, from /proc (no libc binding here).
        let uid = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Uid:"))
                    .and_then(|l| l.split_whitespace().nth(2).map(String::from))
            })
            .unwrap_or_default();
        if uid != "0" {
            return Err(Unavailable(format!(
                "the real-node tier needs root (containers, mounts, a bridge); effective uid {uid}"
            )));
        }
        for prog in PROGRAMS {
            if !bin.join(prog).is_file() {
                return Err(Unavailable(format!(
                    "{} not found (scripts/node-tools.sh builds it)",
                    bin.join(prog).display()
                )));
            }
        }
        if which("ip").is_none() {
            return Err(Unavailable(
                "ip not found on PATH (Debian package iproute2)".into(),
            ));
        }
        for plugin in ["bridge", "loopback", "host-local"] {
            if !Path::new(CNI_BIN_DIR).join(plugin).is_file() {
                return Err(Unavailable(format!(
                    "{CNI_BIN_DIR}/{plugin} not found (Debian package containernetworking-plugins)"
                )));
            }
        }
        let n = std::process::id() % 250 + 1;
        let bridge = format!("mgbr{n}");
        let subnet = format!("10.213.{n}.0/24");
        let gateway = format!("10.213.{n}.1");
        let cfg = |e: io::Error| Unavailable(format!("writing the containerd configuration: {e}"));
        for d in ["root", "state", "runc", "cni/conf", "cni/ipam", "opt"] {
            std::fs::create_dir_all(dir.join(d)).map_err(cfg)?;
        }
        let sock = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        std::fs::write(&config, config_toml(bin, dir, &sock, pause_image)).map_err(cfg)?;
        std::fs::write(
            dir.join("cni/conf/10-mountguard.conflist"),
            cni_conflist(&bridge, &subnet, &gateway, &dir.join("cni/ipam")),
        )
        .map_err(cfg)?;
        // The bridge up front, with the gateway address, so the rig can
        // listen on it before the first pod (the CNI bridge plugin adopts
        // an existing bridge: plugins/main/bridge/bridge.go `setupBridge`).
        for args in [
            vec!["link", "add", "name", &bridge, "type", "bridge"],
            vec!["addr", "add", &format!("{gateway}/24"), "dev", &bridge],
            vec!["link", "set", &bridge, "up"],
        ] {
            let out = Command::new("ip")
                .args(&args)
                .output()
                .map_err(|e| Unavailable(format!("ip {}: {e}", args.join(" "))))?;
            if !out.status.success() {
                let _ = Command::new("ip")
                    .args(["link", "delete", &bridge])
                    .output();
                return Err(Unavailable(format!(
                    "ip {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        let ip_forward = std::fs::read_to_string(IP_FORWARD).unwrap_or_default();
        let before: Vec<PathBuf> = k8s_cgroups().into_iter().filter(|p| p.exists()).collect();
        let mut cmd = Command::new(bin.join("containerd"));
        cmd.arg("--config").arg(&config).env("PATH", path_with(bin));
        let mut child = ChildGuard::spawn("containerd", cmd, log)
            .map_err(|e| Unavailable(format!("starting containerd: {e}")))?;
        let ctr = bin.join("ctr");
        let ready = poll("containerd's socket", Duration::from_secs(30), || {
            let (sock, ctr) = (sock.clone(), ctr.clone());
            let exited = child.exited();
            async move {
                if exited.is_some() {
                    return Some(false);
                }
                let ok = Command::new(&ctr)
                    .arg("--address")
                    .arg(&sock)
                    .arg("version")
                    .output()
                    .map(|o| o.status.success())
                    .unwrap_or(false);
                ok.then_some(true)
            }
        })
        .await;
        if !matches!(ready, Ok(true)) {
            let why = Unavailable(format!(
                "containerd did not start ({ready:?}, exit {:?}):\n{}",
                child.exited(),
                child.log_tail(20)
            ));
            child.kill();
            let _ = Command::new("ip")
                .args(["link", "delete", &bridge])
                .output();
            return Err(why);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            bin: bin.to_path_buf(),
            sock,
            child: Some(child),
            bridge,
            subnet,
            gateway,
            preexisting_cgroups: before,
            pause_image: pause_image.to_string(),
            ip_forward: ip_forward.trim().to_string(),
        })
    }

    /// The CRI endpoint (`unix://...`) for the kubelet.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.sock.display())
    }

    /// The pod network's bridge, subnet and gateway address.
    pub fn network(&self) -> (&str, &str, &str) {
        (&self.bridge, &self.subnet, &self.gateway)
    }

    /// The sandbox image reference.
    pub fn pause_image(&self) -> &str {
        &self.pause_image
    }

    /// `ctr` against this containerd, in the CRI namespace.
    pub fn ctr(&self, args: &[&str]) -> io::Result<Output> {
        Command::new(self.bin.join("ctr"))
            .arg("--address")
            .arg(&self.sock)
            .args(["--namespace", CRI_NAMESPACE])
            .args(args)
            .output()
    }

    fn ctr_ok(&self, args: &[&str]) -> io::Result<String> {
        let out = self.ctr(args)?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(io::Error::other(format!(
                "ctr {}: {}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// Imports an OCI image archive (scripts/images.sh) and, with
    /// `repository` and `digest`, names it `repository@digest` as well: the
    /// CRI plugin resolves a reference only among image names
    /// (containerd v2.4.2 `internal/cri/store/image/image.go`,
    /// `Store.Resolve`), and a pull by digest would have recorded that
    /// name. `--local`: the import in `ctr` itself, which prints each image
    /// as `unpacking <name> (<digest>)...` (`cmd/ctr/commands/images/import.go`;
    /// through the transfer service it prints progress instead).
    pub fn import(&self, archive: &Path, digested: Option<(&str, &str)>) -> io::Result<()> {
        let archive = archive.to_string_lossy();
        let out = self.ctr_ok(&["images", "import", "--local", "--all-platforms", &archive])?;
        if let Some((repo, digest)) = digested {
            let name = out
                .lines()
                .find_map(|l| l.strip_prefix("unpacking "))
                .and_then(|l| l.split(' ').next())
                .ok_or_else(|| io::Error::other(format!("ctr import printed no image: {out}")))?
                .to_string();
            self.ctr_ok(&[
                "images",
                "tag",
                "--force",
                &name,
                &format!("{repo}@{digest}"),
            ])?;
        }
        Ok(())
    }

    /// Runs `cmd` in the running container `id` (a new process in its
    /// namespaces, cgroups and security profile: `ctr tasks exec`, what
    /// the CRI's ExecSync does).
    pub fn exec(&self, id: &str, cmd: &[&str]) -> io::Result<Output> {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let exec_id = format!("mg-exec-{}-{n}", std::process::id());
        let mut args = vec!["tasks", "exec", "--exec-id", &exec_id, id];
        args.extend_from_slice(cmd);
        self.ctr(&args)
    }

    /// The host PID of container `id`'s init process.
    pub fn task_pid(&self, id: &str) -> io::Result<u32> {
        let out = self.ctr_ok(&["tasks", "ls"])?;
        out.lines()
            .skip(1)
            .find_map(|l| {
                let mut f = l.split_whitespace();
                (f.next()? == id).then(|| f.next()?.parse().ok())?
            })
            .ok_or_else(|| io::Error::other(format!("no task {id} in\n{out}")))
    }

    /// The last lines of containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.child
            .as_ref()
            .map(|c| c.log_tail(lines))
            .unwrap_or_default()
    }

    /// Removes every container and sandbox (tasks killed, containers
    /// deleted), stops containerd and the shims it started, unmounts what is
    /// left under the directory, deletes the bridge and the cgroups it made.
    pub fn stop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if let Ok(list) = self.ctr_ok(&["containers", "ls", "-q"]) {
            for id in list.lines().filter(|l| !l.is_empty()) {
                let _ = self.ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", id]);
            }
            for id in list.lines().filter(|l| !l.is_empty()) {
                let _ = poll_blocking(Duration::from_secs(5), || {
                    self.ctr(&["tasks", "delete", "--force", id])
                        .map(|o| o.status.success())
                        .unwrap_or(true)
                        || !self.has_task(id)
                });
                let _ = self.ctr(&["containers", "delete", id]);
            }
        }
        let shims = shim_pids(&self.sock);
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
        for pid in shims {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
        for m in super::kubelet::mounts_under(&self.dir) {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .output();
        // containerd keeps shim sockets and `ctr`'s fifos under
        // /run/containerd whatever its state directory (containerd v2.4.2
        // `core/runtime/v2/shim_unix.go` `defaultSocketDir`,
        // `defaults/defaults_linux.go` `DefaultFIFODir`): the directories,
        // when empty, go too.
        for d in [
            "/run/containerd/s",
            "/run/containerd/fifo",
            "/run/containerd/runc/k8s.io",
            "/run/containerd/runc",
            "/run/containerd",
        ] {
            let _ = std::fs::remove_dir(d);
        }
        if !self.ip_forward.is_empty() {
            let _ = std::fs::write(IP_FORWARD, &self.ip_forward);
        }
        for cg in k8s_cgroups() {
            if cg.exists() && !self.preexisting_cgroups.contains(&cg) {
                remove_cgroup_tree(&cg);
            }
        }
    }

    fn has_task(&self, id: &str) -> bool {
        self.ctr_ok(&["tasks", "ls"])
            .map(|o| {
                o.lines()
                    .skip(1)
                    .any(|l| l.split_whitespace().next() == Some(id))
            })
            .unwrap_or(false)
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop();
    }
}

fn poll_blocking(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The shims of the containerd listening on `sock` (their command line
/// names its address).
fn shim_pids(sock: &Path) -> Vec<u32> {
    let want = sock.to_string_lossy().into_owned();
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmd.split(|b| *b == 0).collect();
            args.first()
                .is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args.contains(&want.as_bytes())
        })
        .collect()
}

/// Removes an (empty of processes) cgroup v1 directory and its children,
/// deepest first.
fn remove_cgroup_tree(dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

fn config_toml(bin: &Path, dir: &Path, sock: &Path, pause_image: &str) -> String {
    let d = dir.display();
    let s = sock.display();
    let runc = bin.join("runc");
    let runc = runc.display();
    format!(
        r#"version = 4
root = "{d}/root"
state = "{d}/state"
[plugins.'io.containerd.server.v1.grpc']
  address = "{s}"
[plugins.'io.containerd.server.v1.ttrpc']
  address = "{s}.ttrpc"
[plugins.'io.containerd.internal.v1.opt']
  path = "{d}/opt"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause_image}"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "{runc}"
        Root = "{d}/runc"
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{CNI_BIN_DIR}"]
    conf_dir = "{d}/cni/conf"
    max_conf_num = 1
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#
    )
}

fn cni_conflist(bridge: &str, subnet: &str, gateway: &str, ipam_dir: &Path) -> String {
    serde_json::to_string_pretty(&serde_json::json!({
        "cniVersion": "0.4.0",
        "name": "mountguard-real-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": ipam_dir,
                    "ranges": [[{"subnet": subnet, "gateway": gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}]
                }
            },
            {"type": "loopback"}
        ]
    }))
    .unwrap_or_default()
}
