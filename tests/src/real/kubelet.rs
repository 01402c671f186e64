//! The real kubelet (`k8s.io/kubernetes/cmd/kubelet`, built by
//! `scripts/upstream.sh`) against the real API server, with upstream's fake
//! CRI runtime (`k8s.io/cri-client/pkg/fake`, served by the script's small
//! `fakecri` main) as its container runtime: no images, no containers, no
//! network. Its volume manager, Secret/ConfigMap managers and AtomicWriter
//! are the real ones.
//!
//! The KubeletConfiguration turns off what needs a real node
//! (pkg/kubelet/apis/config/types.go for each field):
//! - `failSwapOn: false`: the machine may have swap;
//! - `cgroupsPerQOS: false`, `enforceNodeAllocatable: []`: no QoS or
//!   node-allocatable cgroups (the fake runtime creates none);
//! - `cgroupDriver: cgroupfs` (no systemd);
//! - `authentication`/`authorization`: x509 against the rig's CA, webhook
//!   off, `AlwaysAllow` on its own port (loopback only);
//! - `readOnlyPort: 0`, a free `port` and `healthzPort`;
//! - `evictionHard: {}`, `localStorageCapacityIsolation: false`: no eviction
//!   from this machine's disk and memory figures;
//! - `makeIPTablesUtilChains: false`, `resolvConf: ""`: no iptables, no DNS.
//!
//! And what the tests rely on, set explicitly:
//! - `configMapAndSecretChangeDetectionStrategy: Watch` (the default,
//!   `ResourceChangeDetectionStrategy`): the Secret and ConfigMap managers
//!   are the watch-based ones (pkg/kubelet/secret/secret_manager.go
//!   `NewWatchingSecretManager`, pkg/kubelet/configmap/configmap_manager.go
//!   `NewWatchingConfigMapManager`, on
//!   pkg/kubelet/util/manager/watch_based_manager.go): one entry per
//!   object, kept current by a watch, never refreshed once immutable;
//! - `syncFrequency: 10s` (real default 1m): the pod workers resync each
//!   running pod after `wait.Jitter(syncFrequency, 0.5)`, i.e. 10 to 15 s
//!   (pkg/kubelet/pod_workers.go `completeWork`,
//!   `workerResyncIntervalJitterFactor`), and every sync calls
//!   `WaitForAttachAndMount`, whose `ReprocessPod` makes the volume
//!   manager set Secret, ConfigMap and projected volumes up again
//!   (pkg/kubelet/volumemanager/volume_manager.go): a change of a mutable
//!   object reaches its volumes within one resync. A change does not make
//!   the kubelet sync the pod sooner.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::{RealCluster, raw};
use crate::mountguard::{ChildGuard, free_addr, poll};

/// The kubelet's `syncFrequency` in the rig.
pub const SYNC_FREQUENCY: Duration = Duration::from_secs(10);

/// The longest wait between two syncs of a running pod:
/// `wait.Jitter(syncFrequency, 0.5)` (pkg/kubelet/pod_workers.go).
pub const MAX_RESYNC: Duration = Duration::from_secs(15);

/// A real kubelet and its fake CRI runtime.
#[derive(Debug)]
pub struct RealKubelet {
    name: String,
    root: PathBuf,
    cri: Option<ChildGuard>,
    kubelet: Option<ChildGuard>,
    /// The kubelet's program and flags, to start it again.
    argv: Vec<std::ffi::OsString>,
    cwd: PathBuf,
    log: PathBuf,
    healthz: u16,
}

fn spawn_kubelet(
    name: &str,
    argv: &[std::ffi::OsString],
    cwd: &Path,
    log: &Path,
) -> io::Result<ChildGuard> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).current_dir(cwd);
    ChildGuard::spawn(&format!("kubelet-{name}"), cmd, log)
}

impl RealKubelet {
    /// Starts `fakecri` and `kubelet` for node `name` with its own root
    /// directory under the cluster's; waits until the kubelet registered
    /// the Node and reports it Ready, or fails with the kubelet's log.
    pub async fn start(cluster: &RealCluster, name: &str) -> io::Result<Self> {
        let dir = cluster.dir().join(format!("kubelet-{name}"));
        let root = dir.join("root");
        std::fs::create_dir_all(&root)?;
        // The fake runtime reports containers with an empty log path, and
        // the kubelet's log manager removes `<log path>*` when it removes a
        // container (pkg/kubelet/logs/container_log_manager.go, `Clean`):
        // every file in its working directory. Both run in an empty one.
        let cwd = dir.join("cwd");
        std::fs::create_dir_all(&cwd)?;
        let sock = dir.join("cri.sock");
        let endpoint = format!("unix://{}", sock.display());
        let logs = cluster.logs_dir();
        let mut cmd = Command::new(cluster.upstream().binary("fakecri")?);
        cmd.arg(&endpoint).current_dir(&cwd);
        let cri = ChildGuard::spawn(
            &format!("fakecri-{name}"),
            cmd,
            &logs.join(format!("fakecri-{name}.log")),
        )?;
        poll("the fake CRI socket", Duration::from_secs(20), || {
            let sock = sock.clone();
            async move { sock.exists().then_some(()) }
        })
        .await?;
        let kubeconfig = cluster.node_kubeconfig(name)?;
        let ca = cluster.dir().join("ca.crt");
        let port = free_addr()?.port();
        let healthz = free_addr()?.port();
        let config = dir.join("kubelet-config.yaml");
        std::fs::write(&config, kubelet_config(&endpoint, &ca, port, healthz))?;
        let mut argv: Vec<std::ffi::OsString> = vec![cluster.upstream().binary("kubelet")?.into()];
        argv.extend([
            "--config".into(),
            config.clone().into_os_string(),
            "--kubeconfig".into(),
            kubeconfig.into_os_string(),
            "--root-dir".into(),
            root.clone().into_os_string(),
            "--cert-dir".into(),
            dir.join("pki").into_os_string(),
            "--hostname-override".into(),
            name.into(),
            "--v=2".into(),
        ]);
        let log = logs.join(format!("kubelet-{name}.log"));
        let mut kubelet = spawn_kubelet(name, &argv, &cwd, &log)?;
        let client = cluster.client().await?;
        let path = format!("/api/v1/nodes/{name}");
        let r = poll(
            &format!("kubelet {name} to register a Ready Node"),
            Duration::from_secs(90),
            || {
                let client = client.clone();
                let path = path.clone();
                let exited = kubelet.exited();
                async move {
                    if exited.is_some() {
                        return Some(false);
                    }
                    let (code, node) = raw(&client, "GET", &path, None).await.ok()?;
                    let ready = node["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    (code == 200 && ready).then_some(true)
                }
            },
        )
        .await;
        if !matches!(r, Ok(true)) {
            let status = kubelet.exited();
            return Err(io::Error::other(format!(
                "kubelet {name} did not register a Ready Node ({r:?}, exit {status:?}); last lines of its log:\n{}",
                kubelet.log_tail(40)
            )));
        }
        Ok(Self {
            name: name.to_string(),
            root,
            cri: Some(cri),
            kubelet: Some(kubelet),
            argv,
            cwd,
            log,
            healthz,
        })
    }

    /// Kills the kubelet (SIGKILL, as a crash or an upgrade would stop it)
    /// and starts it again with the same flags, root directory and
    /// runtime; the runtime, the pods' containers and the kubelet's mounts
    /// stay. Waits until the new kubelet answers on its healthz port. A
    /// restarted kubelet starts with empty Secret and ConfigMap managers:
    /// each running pod registers again with fresh reads.
    pub async fn restart(&mut self) -> io::Result<()> {
        if let Some(mut k) = self.kubelet.take() {
            k.kill();
        }
        let mut kubelet = spawn_kubelet(&self.name, &self.argv, &self.cwd, &self.log)?;
        let url = format!("http://127.0.0.1:{}/healthz", self.healthz);
        let r = poll(
            &format!("the restarted kubelet {} to be healthy", self.name),
            Duration::from_secs(60),
            || {
                let url = url.clone();
                let exited = kubelet.exited();
                async move {
                    if exited.is_some() {
                        return Some(false);
                    }
                    let body = crate::mountguard::http_get(&url).await.ok()?;
                    (body.trim() == "ok").then_some(true)
                }
            },
        )
        .await;
        if !matches!(r, Ok(true)) {
            return Err(io::Error::other(format!(
                "the restarted kubelet {} is not healthy ({r:?}); last lines of its log:\n{}",
                self.name,
                kubelet.log_tail(40)
            )));
        }
        self.kubelet = Some(kubelet);
        Ok(())
    }

    /// Node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The kubelet's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The last lines of the kubelet's and the runtime's logs.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for c in [&self.kubelet, &self.cri].into_iter().flatten() {
            out.push_str(&format!("--- {} ---\n{}\n", c.name(), c.log_tail(lines)));
        }
        out
    }

    /// Stops the kubelet, then the runtime, and unmounts what the kubelet
    /// left mounted under its root (its bind mount of the root itself, the
    /// tmpfs of Secret and projected volumes): a killed kubelet does not
    /// unmount, and a mounted directory cannot be removed.
    pub fn stop(&mut self) {
        for c in [&mut self.kubelet, &mut self.cri] {
            if let Some(mut c) = c.take() {
                c.kill();
            }
        }
        for m in mounts_under(&self.root) {
            let _ = Command::new("umount").arg("-l").arg(&m).status();
        }
    }
}

impl Drop for RealKubelet {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Mount points at or under `dir`, deepest first (from /proc/self/mounts;
/// octal escapes as the kernel writes them).
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let mut out: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(1))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect();
    out.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    out.dedup();
    out
}

fn kubelet_config(endpoint: &str, ca: &Path, port: u16, healthz: u16) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: {endpoint}
imageServiceEndpoint: {endpoint}
address: 127.0.0.1
port: {port}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: {healthz}
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: {ca}
authorization:
  mode: AlwaysAllow
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
cgroupDriver: cgroupfs
evictionHard: {{}}
localStorageCapacityIsolation: false
makeIPTablesUtilChains: false
resolvConf: \"\"
syncFrequency: {sync}s
configMapAndSecretChangeDetectionStrategy: Watch
nodeStatusUpdateFrequency: 2s
registerNode: true
",
        ca = ca.display(),
        sync = SYNC_FREQUENCY.as_secs()
    )
}
