//! The real kubelet (`k8s.io/kubernetes/cmd/kubelet`, built by
//! `scripts/upstream.sh`) against the real API server, with upstream's fake
//! CRI runtime (`k8s.io/cri-client/pkg/fake`, served by our small
//! `scripts/fakecri/main.go`) as its container runtime: no images, no
//! containers, no network. Its volume manager, Secret/ConfigMap managers
//! and AtomicWriter are the real ones.
//!
//! A container exec (CRI `ExecSync`: the kubelet's exec probes and
//! postStart/preStop exec hooks) does nothing on the fake runtime, unless
//! the kubelet is started with an [`ExecHook`]
//! ([`RealKubelet::start_with_exec`]): then fakecri posts each exec to a
//! small HTTP server of the rig, which runs the hook with the pod (read
//! from the API) and its directory under the kubelet's root, as the node
//! doubles do. The kubelet's own termination path decides when: on a
//! graceful deletion (a DELETE or an eviction) it runs the preStop hook
//! before it stops the container (pkg/kubelet/kuberuntime/
//! kuberuntime_container.go, `killContainer` calling
//! `executePreStopHook`).
//!
//! The KubeletConfiguration turns off what needs a real node
//! (pkg/kubelet/apis/config/types.go for each field):
//! - `failSwapOn: false`: the machine may have swap;
//! - `cgroupsPerQOS: false`, `enforceNodeAllocatable: []`: no QoS or
//!   node-allocatable cgroups (the fake runtime creates none);
//! - `cgroupDriver: cgroupfs` (no systemd);
//! - `authentication`/`authorization`: x509 against the rig's CA, webhook
//!   and anonymous access off, `AlwaysAllow`, on its own port on every
//!   address of the host (the API server reaches it at the Node's
//!   InternalIP for logs, exec, port-forward and the node proxy, with its
//!   `--kubelet-client-certificate` from that CA);
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

use hyper::StatusCode;
use serde_json::{Value, json};

use super::node::{ExecHook, PreStop};
use super::{RealCluster, raw};
use crate::http::{Server, json as json_response, read_body};
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
    /// The server fakecri posts container execs to, with an exec hook.
    exec_server: Option<Server>,
    /// The execs fakecri posted, in order.
    exec_calls: ExecCalls,
}

/// A container exec the kubelet asked the runtime for: pod
/// `namespace/name`, container, command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecCall {
    pub pod: String,
    pub container: String,
    pub command: Vec<String>,
}

type ExecCalls = std::sync::Arc<std::sync::Mutex<Vec<ExecCall>>>;

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
        Self::start_with_exec(cluster, name, None).await
    }

    /// [`Self::start`], with container execs run by `exec` (see the
    /// module doc); `None`: execs do nothing.
    pub async fn start_with_exec(
        cluster: &RealCluster,
        name: &str,
        exec: Option<ExecHook>,
    ) -> io::Result<Self> {
        Self::start_inner(cluster, name, exec, None, None).await
    }

    /// [`Self::start_with_exec`] with another kubelet program: one of
    /// [`kubelet_binaries`] (a kubelet of an older minor of the skew
    /// window, on the same fake runtime and configuration).
    pub async fn start_binary(
        cluster: &RealCluster,
        name: &str,
        exec: Option<ExecHook>,
        binary: &Path,
    ) -> io::Result<Self> {
        Self::start_inner(cluster, name, exec, None, Some(binary)).await
    }

    /// A kubelet for node `name` on the real container runtime at
    /// `endpoint` (a CRI socket, e.g. [`super::containerd::Containerd`]'s),
    /// with image garbage collection off (the
    /// runtime's images are imported locally, there is no registry to pull
    /// them back from: `imageGCHighThresholdPercent: 100`,
    /// pkg/kubelet/images/image_gc_manager.go `GarbageCollect`).
    /// `extra_config` is appended to the KubeletConfiguration (e.g.
    /// `clusterDNS`).
    pub async fn start_on_cri(
        cluster: &RealCluster,
        name: &str,
        endpoint: &str,
        extra_config: &str,
    ) -> io::Result<Self> {
        Self::start_inner(cluster, name, None, Some((endpoint, extra_config)), None).await
    }

    async fn start_inner(
        cluster: &RealCluster,
        name: &str,
        exec: Option<ExecHook>,
        real_cri: Option<(&str, &str)>,
        binary: Option<&Path>,
    ) -> io::Result<Self> {
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
        let exec_calls = ExecCalls::default();
        let exec_server = match exec {
            Some(hook) => Some(
                exec_server(
                    cluster.client().await?,
                    root.clone(),
                    hook,
                    exec_calls.clone(),
                )
                .await?,
            ),
            None => None,
        };
        let (endpoint, cri) = match real_cri {
            Some((e, _)) => (e.to_string(), None),
            None => {
                let mut cmd = Command::new(cluster.upstream().binary("fakecri")?);
                cmd.arg(&endpoint).current_dir(&cwd);
                if let Some(s) = &exec_server {
                    cmd.arg(format!("{}/exec", s.url()));
                }
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
                (endpoint, Some(cri))
            }
        };
        let kubeconfig = cluster.node_kubeconfig(name)?;
        let ca = cluster.dir().join("ca.crt");
        let port = free_addr()?.port();
        let healthz = free_addr()?.port();
        let config = dir.join("kubelet-config.yaml");
        let mut text = kubelet_config(&endpoint, &ca, port, healthz);
        if let Some((_, extra)) = real_cri {
            text.push_str(REAL_RUNTIME_CONFIG);
            text.push_str(extra);
        }
        std::fs::write(&config, text)?;
        let program = match binary {
            Some(b) => b.to_path_buf(),
            None => cluster.upstream().binary("kubelet")?,
        };
        let mut argv: Vec<std::ffi::OsString> = vec![program.into()];
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
        // Node lifecycle does not run in the rig: what it would do once
        // the node is Ready (see `clear_not_ready_taint`).
        super::clear_not_ready_taint(&client, name).await?;
        Ok(Self {
            name: name.to_string(),
            root,
            cri,
            kubelet: Some(kubelet),
            argv,
            cwd,
            log,
            healthz,
            exec_server,
            exec_calls,
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

    /// The container execs (probes, exec hooks) this kubelet ran through
    /// its runtime, when started with an exec hook.
    pub fn exec_calls(&self) -> Vec<ExecCall> {
        self.exec_calls
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default()
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
        self.exec_server.take();
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

/// The server fakecri posts a container exec to (`POST /exec`, the JSON
/// of scripts/fakecri/main.go `execCall`): runs `hook` with the pod read
/// from the API by namespace and name (the same UID: a terminating pod is
/// still there while its preStop hook runs) and its directory under
/// `root`, and answers exit code 0; an exec of a pod the API no longer
/// has, or a malformed call, answers exit code 1 with the reason on
/// stderr (what the kubelet records as a failed hook).
async fn exec_server(
    client: kube::Client,
    root: PathBuf,
    hook: ExecHook,
    calls: ExecCalls,
) -> io::Result<Server> {
    Server::start(move |req| {
        let (client, root, hook, calls) =
            (client.clone(), root.clone(), hook.clone(), calls.clone());
        async move {
            let failed = |why: String| {
                json_response(
                    StatusCode::OK,
                    &json!({"exitCode": 1, "stdout": "", "stderr": why}),
                )
            };
            let body = match read_body(req).await {
                Ok((_, b)) => b,
                Err(e) => return failed(e),
            };
            let call: Value = match serde_json::from_slice(&body) {
                Ok(v) => v,
                Err(e) => return failed(format!("not an exec call: {e}")),
            };
            let field = |k: &str| call[k].as_str().unwrap_or("").to_string();
            let (ns, name, uid) = (field("podNamespace"), field("podName"), field("podUid"));
            let pod = match raw(
                &client,
                "GET",
                &format!("/api/v1/namespaces/{ns}/pods/{name}"),
                None,
            )
            .await
            {
                Ok((200, p)) if p["metadata"]["uid"] == uid.as_str() => p,
                other => return failed(format!("pod {ns}/{name} ({uid}): {other:?}")),
            };
            let command: Vec<String> = call["cmd"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|a| a.as_str().map(String::from))
                .collect();
            let container = field("container");
            if let Ok(mut c) = calls.lock() {
                c.push(ExecCall {
                    pod: format!("{ns}/{name}"),
                    container: container.clone(),
                    command: command.clone(),
                });
            }
            let pod_dir = mountguard_inventory::layout::pod_dir(&root, &uid);
            let ran = tokio::task::spawn_blocking(move || {
                (hook.0)(&PreStop {
                    pod: &pod,
                    container: &container,
                    command,
                    pod_dir,
                })
            })
            .await;
            match ran {
                Ok(()) => json_response(
                    StatusCode::OK,
                    &json!({"exitCode": 0, "stdout": "", "stderr": ""}),
                ),
                Err(e) => failed(format!("the exec hook failed: {e}")),
            }
        }
    })
    .await
}

/// Mount points at or under `dir`, deepest first (from /proc/self/mounts;
/// octal escapes as the kernel writes them).
pub(crate) fn mounts_under(dir: &Path) -> Vec<PathBuf> {
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

/// Appended to [`kubelet_config`] on a real runtime: no image garbage
/// collection (see [`RealKubelet::start_on_cri`]); a short runtime request
/// timeout so a wedged runtime shows in the log quickly.
const REAL_RUNTIME_CONFIG: &str = "imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
runtimeRequestTimeout: 2m
serializeImagePulls: false
";

fn kubelet_config(endpoint: &str, ca: &Path, port: u16, healthz: u16) -> String {
    format!(
        "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: {endpoint}
imageServiceEndpoint: {endpoint}
address: 0.0.0.0
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
{cgroup_v1}",
        ca = ca.display(),
        sync = SYNC_FREQUENCY.as_secs(),
        cgroup_v1 = if cgroup_v1_host() {
            "failCgroupV1: false\n"
        } else {
            ""
        },
    )
}

/// Whether this host mounts cgroup v1 (no unified hierarchy at
/// /sys/fs/cgroup). The kubelet of 1.35 and later refuses to start on
/// such a host unless `failCgroupV1: false` (`FailCgroupV1`, defaulted to
/// true in pkg/kubelet/apis/config/v1beta1/defaults.go
/// `SetDefaults_KubeletConfiguration` and refused in
/// pkg/kubelet/apis/config/validation/validation_linux.go
/// `validateKubeletOSConfiguration`, v1.37.2; the field exists since 1.31,
/// so every kubelet of the skew window reads it).
fn cgroup_v1_host() -> bool {
    !Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// The kubelets `scripts/upstream.sh` built, oldest minor first, each with
/// its version: those of the older minors of the skew window
/// (`kubelet-<version>`) and the cluster's own (`kubelet`, whose version
/// is what it prints for `--version`).
pub fn kubelet_binaries(cluster: &RealCluster) -> io::Result<Vec<(String, PathBuf)>> {
    let own = cluster.upstream().binary("kubelet")?;
    let out = Command::new(&own).arg("--version").output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .split_whitespace()
        .find(|w| w.starts_with('v'))
        .ok_or_else(|| io::Error::other(format!("{}: no version in {text:?}", own.display())))?
        .to_string();
    let mut all = vec![(version, own.clone())];
    let dir = own.parent().unwrap_or(Path::new("."));
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if let Some(v) = name.strip_prefix("kubelet-v") {
            all.push((format!("v{v}"), e.path()));
        }
    }
    all.sort_by_key(|(v, _)| version_numbers(v));
    Ok(all)
}

/// `v1.35.4` -> `[1, 35, 4]` (a part that is not a number counts 0): the
/// order of versions, and `>= [1, 35]` for "1.35 or later".
pub fn version_numbers(v: &str) -> Vec<u32> {
    v.trim_start_matches('v')
        .split('.')
        .map(|p| p.parse().unwrap_or(0))
        .collect()
}
