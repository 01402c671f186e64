//! Real Slurm 26.05 on loopback: slurmctld, slurmrestd (JWT) and one slurmd
//! per node, built from SchedMD's source by `scripts/slurm.sh` into the
//! upstream cache (nothing of Slurm's is in this repository).
//!
//! How the daemons are started, and why (each is a wall real Slurm put up):
//! - auth/slurm with one key file per daemon (`SLURM_SACK_KEY`,
//!   `init_internal` in `src/plugins/auth/slurm/internal.c`): slurmctld's key
//!   is the cluster's; each slurmd reads the file it is given (in the tiers
//!   with a kubelet: the `slurm.key` the kubelet wrote into the worker pod's
//!   volume). The key must have no permission bit for others
//!   (`_check_key_permissions`).
//! - Every auth/slurm daemon binds its credential socket at a fixed path
//!   under `/run` (`init_sack_conmgr` in `src/plugins/auth/slurm/sack.c`:
//!   `/run/slurmctld/sack.socket`, `/run/slurm/sack.socket`), so each
//!   daemon runs in a mount namespace of its own whose `/run` is a
//!   directory of this rig: several slurmd (and several rigs) share the
//!   host, and a daemon's slurmstepd children find their slurmd's socket.
//! - slurmrestd runs as `nobody` (it refuses root and SlurmUser,
//!   `src/slurmrestd/slurmrestd.c`) with `SLURM_JWT=daemon` and
//!   `rest_auth/jwt`, so it forwards each request's token to slurmctld,
//!   which verifies it with `AuthAltParameters=jwt_key=...` (auth/jwt).
//! - SlurmUser is `slurm` (the user the Slinky images run as; the token
//!   mountguard mints names it, and `scripts/slurm.sh` creates it);
//!   `--enable-multiple-slurmd` lets every slurmd of the rig share this host,
//!   each `-N <node>` on the port its `NodeName` line gives.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::{Value, json};

use crate::mountguard::ChildGuard;

/// The Slurm release the Slinky operator v1.2 images ship, at the tag
/// `scripts/slurm.sh` builds.
pub const SLURM_TAG: &str = "slurm-26-05-3-1";

/// The REST API version mountguard and the Slinky operator use.
pub const API: &str = "v0.0.44";

/// The SlurmUser of the rig (an administrator by being SlurmUser).
pub const SLURM_USER: &str = "slurm";

/// The installed Slurm: `$MOUNTGUARD_SLURM_PREFIX` when set, else what
/// `scripts/slurm.sh` prints (it answers at once from its cache). `Err`
/// carries the reason a test prints with SKIPPED.
pub fn prefix() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("MOUNTGUARD_SLURM_PREFIX") {
        let p = PathBuf::from(p);
        return if p.join("sbin/slurmctld").is_file() {
            Ok(p)
        } else {
            Err(format!(
                "MOUNTGUARD_SLURM_PREFIX={} holds no sbin/slurmctld",
                p.display()
            ))
        };
    }
    let out = Command::new("bash")
        .arg(super::repo().join("scripts/slurm.sh"))
        .output()
        .map_err(|e| format!("running scripts/slurm.sh: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match out.status.code() {
        Some(0) => Ok(PathBuf::from(stdout.lines().last().unwrap_or("").trim())),
        _ => Err(String::from_utf8_lossy(&out.stderr)
            .lines()
            .filter(|l| l.starts_with("SKIPPED") || l.starts_with("error"))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

/// The installed Slurm, or `None` after printing a SKIPPED line that says
/// why (the test then asserts nothing and says so).
pub fn prefix_or_skip(test: &str) -> Option<PathBuf> {
    match prefix() {
        Ok(p) => Some(p),
        Err(why) => {
            eprintln!("SKIPPED: {test}: no Slurm {SLURM_TAG}: {why}");
            None
        }
    }
}

/// What the rig's slurm.conf sets that the tests vary.
#[derive(Debug, Clone)]
pub struct SlurmConfig {
    /// Node names, each with a slurmd of its own.
    pub nodes: Vec<String>,
    /// `SlurmdTimeout` in seconds (Slurm's default is 300; Slinky's
    /// generated slurm.conf leaves the default).
    pub slurmd_timeout: u32,
    /// `ReturnToService` (0, 1 or 2; Slurm's default is 1).
    pub return_to_service: u8,
    /// The key slurmctld verifies tokens with (None: a random one).
    pub jwt_key: Option<Vec<u8>>,
    /// The cluster's `slurm.key` (None: a random one).
    pub cluster_key: Option<Vec<u8>>,
    /// Whether [`RealSlurm::start`] starts a slurmd on the cluster key for
    /// every node and waits for their registrations (false: the caller
    /// starts them, on key files of its own).
    pub start_slurmd: bool,
    /// Dynamic nodes, as the Slinky operator runs them (slurm-operator
    /// v1.2.1 internal/builder/workerbuilder/worker_app.go, `slurmdArgs`:
    /// `-Z`): slurm.conf names no node and bounds them with MaxNodeCount;
    /// each slurmd creates its node by registering (Slurm 26.05
    /// src/slurmctld/proc_req.c `_slurm_rpc_node_registration` ->
    /// src/slurmctld/node_mgr.c `create_dynamic_reg_node`, which takes the
    /// `--conf` line, its Port included).
    pub dynamic: bool,
    /// Whether slurmctld keeps its saved state across a restart (false:
    /// `slurmctld -c`, as on a new StateSaveLocation; dynamic nodes are
    /// then gone until their slurmd registers again).
    pub keep_state: bool,
    /// The address slurmctld and slurmrestd are reached at (slurmctld
    /// listens on every address; slurmrestd on this one).
    pub address: std::net::Ipv4Addr,
    /// `Some(plugin_dir)`: the slurmd run in the worker pods' containers
    /// (the image of scripts/images.sh, `slurmd_image`, which holds
    /// Slurm's plugins at `plugin_dir`), not as processes of the rig:
    /// configless, as Slinky runs them (slurm-operator v1.2.1
    /// internal/builder/common/common.go `ConfiglessArgs`: `--conf-server`;
    /// slurmctld serves its slurm.conf with `SlurmctldParameters=
    /// enable_configless`, Slurm 26.05 src/slurmctld/proc_req.c
    /// `configless_update`, `_slurm_rpc_config_request`), so the paths
    /// slurm.conf names for slurmd are the image's. Every directory of
    /// PluginDir must be readable by each daemon (src/common/read_config.c
    /// refuses the file otherwise), so the rig links the install's plugins
    /// at `plugin_dir` on the host too and names that one directory.
    pub pods_plugin_dir: Option<PathBuf>,
    /// slurmrestd's port (None: a free one); the Slinky operator's slurm
    /// client dials 6820 ([`super::operator::SLURMRESTD_PORT`]).
    pub restd_port: Option<u16>,
}

impl SlurmConfig {
    /// `n` nodes `node-0`..; SlurmdTimeout 6 s (pings every 2 s), RTS 1.
    pub fn nodes(n: usize) -> Self {
        Self {
            nodes: (0..n).map(|i| format!("node-{i}")).collect(),
            slurmd_timeout: 6,
            return_to_service: 1,
            jwt_key: None,
            cluster_key: None,
            start_slurmd: true,
            dynamic: false,
            keep_state: true,
            address: std::net::Ipv4Addr::LOCALHOST,
            pods_plugin_dir: None,
            restd_port: None,
        }
    }
}

/// One running Slurm cluster on loopback.
pub struct RealSlurm {
    prefix: PathBuf,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
    config: SlurmConfig,
    ctld: Mutex<Option<ChildGuard>>,
    restd: Mutex<Option<ChildGuard>>,
    slurmds: Mutex<BTreeMap<String, ChildGuard>>,
    /// Each node's slurmd port.
    ports: BTreeMap<String, u16>,
    restd_addr: SocketAddr,
    /// slurmctld's address (SlurmctldHost's) and port.
    ctld_addr: SocketAddr,
    jwt_key: Vec<u8>,
    slurmd_delay: Mutex<Duration>,
}

impl std::fmt::Debug for RealSlurm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealSlurm")
            .field("dir", &self.dir)
            .field("restd_addr", &self.restd_addr)
            .finish_non_exhaustive()
    }
}

/// A fresh random key of `len` bytes.
pub fn random_key(len: usize) -> Vec<u8> {
    use std::io::Read;
    let mut k = vec![0u8; len];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut k))
        .expect("/dev/urandom");
    k
}

fn uid_gid(user: &str) -> io::Result<(u32, u32)> {
    let u = nix::unistd::User::from_name(user)
        .map_err(|e| io::Error::other(format!("looking up user {user}: {e}")))?
        .ok_or_else(|| {
            io::Error::other(format!(
                "no user {user} on this host (scripts/slurm.sh creates it: useradd --system {user})"
            ))
        })?;
    Ok((u.uid.as_raw(), u.gid.as_raw()))
}

fn chown(path: &Path, user: &str) -> io::Result<()> {
    let (uid, gid) = uid_gid(user)?;
    std::os::unix::fs::chown(path, Some(uid), Some(gid))
}

/// Writes a key file readable by its owner only (auth/slurm refuses any
/// bit for others).
pub fn write_key(path: &Path, key: &[u8]) -> io::Result<()> {
    std::fs::write(path, key)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
}

impl RealSlurm {
    /// Starts slurmctld and slurmrestd on a new cluster key, and a slurmd
    /// on that key for every node; returns once slurmrestd answers and
    /// every node has registered.
    pub async fn start(prefix: &Path, config: SlurmConfig) -> io::Result<Self> {
        let tmp = tempfile::Builder::new().prefix("mg-slurm-").tempdir()?;
        let dir = tmp.path().to_path_buf();
        // slurmrestd (as nobody) reads slurm.conf in here.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        for d in ["state", "logs", "run-ctld"] {
            std::fs::create_dir_all(dir.join(d))?;
        }
        chown(&dir.join("state"), SLURM_USER)?;
        // Bound again at each restart (a slurmd when its worker pod runs,
        // slurmctld on a new key): below the ephemeral range.
        let mut ports = crate::mountguard::stable_ports(config.nodes.len() + 2)?;
        let ctld_port = ports.pop().unwrap_or_default();
        let restd_port = ports.pop().unwrap_or_default();
        let restd_addr =
            SocketAddr::from((config.address, config.restd_port.unwrap_or(restd_port)));
        let address = config.address;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")?
            .trim()
            .split('.')
            .next()
            .unwrap_or("localhost")
            .to_string();
        let mut node_lines = String::new();
        let mut node_ports = BTreeMap::new();
        if config.dynamic {
            node_lines.push_str(&format!("MaxNodeCount={}\n", config.nodes.len()));
        }
        for n in &config.nodes {
            let port = ports.pop().unwrap_or_default();
            node_ports.insert(n.clone(), port);
            if !config.dynamic {
                node_lines.push_str(&format!(
                    "NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs=1 RealMemory=64 State=UNKNOWN\n"
                ));
            }
            std::fs::create_dir_all(dir.join(format!("spool-{n}")))?;
            std::fs::create_dir_all(dir.join(format!("run-{n}")))?;
        }
        let d = dir.display();
        let slurmd_paths = match &config.pods_plugin_dir {
            Some(plugins) => {
                if !plugins.join("libslurmfull.so").is_file() {
                    let _ = std::fs::remove_dir_all(plugins);
                    link_tree(&prefix.join("lib/slurm"), plugins)?;
                }
                // Readable by SlurmUser and nobody down from the root.
                for a in plugins.ancestors() {
                    if a.starts_with("/var/cache") && a != Path::new("/var/cache") {
                        std::fs::set_permissions(a, std::fs::Permissions::from_mode(0o755))?;
                    }
                }
                format!(
                    "SlurmctldParameters=enable_configless\n\
                     SlurmdSpoolDir=/var/spool/slurmd\n\
                     SlurmdPidFile=/run/slurmd.pid\n\
                     PluginDir={}\n",
                    plugins.display()
                )
            }
            None => format!(
                "SlurmdSpoolDir={d}/spool-%n\n\
                 SlurmdPidFile={d}/slurmd-%n.pid\n\
                 PluginDir={d}/slurm/lib/slurm\n"
            ),
        };
        // A job Slurm tried to launch on a slurmd it cannot authenticate
        // stays COMPLETING on that node (requeued held, or cancelled) until
        // a TERMINATE_JOB reaches a slurmd that answers: slurmctld re-sends
        // it for a job completing longer than KillWait + 2 * MessageTimeout
        // (src/slurmctld/job_mgr.c `_list_find_job_old` -> `re_kill_job`),
        // checked every MinJobAge when that is under 60 s, else every 60 s
        // (src/slurmctld/controller.c `_slurmctld_background`,
        // PURGE_JOB_INTERVAL), and only while the node is not
        // NOT_RESPONDING (src/slurmctld/node_scheduler.c `re_kill_job`).
        // A node holding such a job takes no new one. Slurm's defaults
        // (KillWait 30, MinJobAge 300) leave a repaired node busy for up to
        // about 95 s after its new slurmd registered; the rig's 2 and 10
        // bring that to about 16 s. Slurm 26.05.3.
        let conf = format!(
            "ClusterName=mountguard\n\
             SlurmctldHost={host}({address})\n\
             SlurmctldPort={ctld_port}\n\
             SlurmUser={SLURM_USER}\n\
             SlurmdUser=root\n\
             AuthType=auth/slurm\n\
             CredType=cred/slurm\n\
             AuthAltTypes=auth/jwt\n\
             AuthAltParameters=jwt_key={d}/jwt.key\n\
             StateSaveLocation={d}/state\n\
             SlurmctldPidFile={d}/slurmctld.pid\n\
             {slurmd_paths}\
             SlurmctldDebug=debug\n\
             SlurmdDebug=debug\n\
             ProctrackType=proctrack/pgid\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobCompType=jobcomp/none\n\
             SchedulerType=sched/builtin\n\
             SelectType=select/cons_tres\n\
             MpiDefault=none\n\
             MessageTimeout=2\n\
             KillWait=2\n\
             MinJobAge=10\n\
             SlurmdTimeout={timeout}\n\
             ReturnToService={rts}\n\
             {node_lines}\
             PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n",
            timeout = config.slurmd_timeout,
            rts = config.return_to_service,
        );
        std::fs::write(dir.join("slurm.conf"), conf)?;
        std::fs::write(dir.join("cgroup.conf"), "CgroupPlugin=disabled\n")?;
        link_tree(&prefix.join("lib/slurm"), &dir.join("slurm/lib/slurm"))?;
        link_tree(&prefix.join("sbin"), &dir.join("slurm/sbin"))?;
        let jwt_key = config.jwt_key.clone().unwrap_or_else(|| random_key(32));
        write_key(&dir.join("jwt.key"), &jwt_key)?;
        chown(&dir.join("jwt.key"), SLURM_USER)?;
        write_key(
            &dir.join("cluster.key"),
            &config.cluster_key.clone().unwrap_or_else(|| random_key(64)),
        )?;
        chown(&dir.join("cluster.key"), SLURM_USER)?;

        let slurm = Self {
            prefix: prefix.to_path_buf(),
            dir,
            _tmp: tmp,
            config,
            ctld: Mutex::new(None),
            restd: Mutex::new(None),
            slurmds: Mutex::new(BTreeMap::new()),
            ports: node_ports,
            restd_addr,
            ctld_addr: SocketAddr::from((address, ctld_port)),
            jwt_key,
            slurmd_delay: Mutex::new(Duration::ZERO),
        };
        slurm.start_ctld(false)?;
        // slurmrestd as nobody: SLURM_JWT=daemon makes it take each
        // request's token (src/slurmrestd/slurmrestd.c, `_parse_env`).
        let (uid, gid) = uid_gid("nobody")?;
        // SlurmUser and nobody cannot look into the cache under root's
        // home: every daemon runs the links in the rig's directory (slurmctld
        // execs itself as slurmscriptd after dropping to SlurmUser), with
        // their plugins and libslurmfull.
        let mut restd = Command::new(slurm.dir.join("slurm/sbin/slurmrestd"));
        restd
            .args(["-a", "rest_auth/jwt", "-s", "openapi/slurmctld"])
            .arg(restd_addr.to_string())
            .env("SLURM_CONF", slurm.conf())
            .env("SLURM_JWT", "daemon")
            .env("LD_LIBRARY_PATH", slurm.dir.join("slurm/lib/slurm"))
            .env(
                "SLURMRESTD_SECURITY",
                "disable_unshare_files,disable_unshare_sysv",
            )
            .uid(uid)
            .gid(gid);
        *slurm.restd.lock().unwrap() = Some(ChildGuard::spawn(
            "slurmrestd",
            restd,
            &slurm.dir.join("logs/slurmrestd.out"),
        )?);
        let nodes = slurm.config.nodes.clone();
        if !slurm.config.start_slurmd {
            slurm.wait_ctld().await?;
            return Ok(slurm);
        }
        for n in &nodes {
            let key = slurm.key_file(n, &slurm.cluster_key())?;
            slurm.start_slurmd(n, &key)?;
        }
        let token = slurm.token(SLURM_USER);
        for n in &nodes {
            let n = n.clone();
            slurm
                .wait(
                    &format!("{n} registered and idle"),
                    Duration::from_secs(60),
                    || {
                        let node = slurm.node(&n, &token);
                        async move {
                            let (_, v) = node.await;
                            let states = node_states(&v);
                            (states.iter().any(|s| s == "IDLE")
                                && !states.iter().any(|s| s == "NOT_RESPONDING" || s == "DOWN"))
                            .then_some(())
                        }
                    },
                )
                .await?;
        }
        Ok(slurm)
    }

    /// The rig's slurm.conf.
    pub fn conf(&self) -> PathBuf {
        self.dir.join("slurm.conf")
    }

    /// The installed Slurm.
    pub fn prefix(&self) -> &Path {
        &self.prefix
    }

    /// slurmrestd's base URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.restd_addr)
    }

    /// slurmrestd's address.
    pub fn addr(&self) -> SocketAddr {
        self.restd_addr
    }

    /// The key slurmctld verifies tokens with (`jwt_key`).
    pub fn jwt_key(&self) -> &[u8] {
        &self.jwt_key
    }

    /// A token for `user`, valid for ten minutes, as `scontrol token` makes
    /// one (HS256, claims `sun`, `iat`, `exp`).
    pub fn token(&self, user: &str) -> String {
        crate::slurmrestd::mint_token(&self.jwt_key, user, Duration::from_secs(600))
    }

    /// The cluster key slurmctld runs on.
    pub fn cluster_key(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("cluster.key")).unwrap_or_default()
    }

    /// Restarts slurmctld on `key` (the rotation: slurmctld's key file
    /// replaced, the daemon restarted to read it; the slurmd keep theirs).
    pub async fn restart_ctld_with_key(&self, key: &[u8]) -> io::Result<()> {
        // As Kubernetes stops slurmctld's container: SIGTERM, so it saves
        // its state (a job that ended but is not yet saved as ended would
        // be restored COMPLETING, waiting for a slurmd that may no longer
        // authenticate), then SIGKILL after a grace period.
        let ctld = self.ctld.lock().unwrap().take();
        if let Some(mut c) = ctld {
            if let Some(pid) = c.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
            while c.exited().is_none() && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            c.kill();
        }
        write_key(&self.dir.join("cluster.key"), key)?;
        chown(&self.dir.join("cluster.key"), SLURM_USER)?;
        self.start_ctld(!self.config.keep_state)?;
        self.wait_ctld().await
    }

    /// Waits (up to 60 s) until slurmctld answers slurmrestd's ping.
    async fn wait_ctld(&self) -> io::Result<()> {
        let token = self.token(SLURM_USER);
        let path = format!("/slurm/{API}/ping/");
        self.wait("slurmctld answering", Duration::from_secs(60), || async {
            (self.get(&path, Some(&token)).await.0 == 200).then_some(())
        })
        .await
    }

    /// Starts slurmctld; `clear` starts it without its saved state (`-c`).
    fn start_ctld(&self, clear: bool) -> io::Result<()> {
        let mut cmd = private_run(
            &self.dir.join("slurm/sbin/slurmctld"),
            &self.dir.join("run-ctld"),
        )?;
        if clear {
            cmd.arg("-c");
        }
        cmd.args(["-D", "-f"])
            .arg(self.conf())
            .env("LD_LIBRARY_PATH", self.dir.join("slurm/lib/slurm"))
            .env("SLURM_CONF", self.conf())
            .env("SLURM_SACK_KEY", self.dir.join("cluster.key"));
        *self.ctld.lock().unwrap() = Some(ChildGuard::spawn(
            "slurmctld",
            cmd,
            &self.dir.join("logs/slurmctld.out"),
        )?);
        Ok(())
    }

    /// Starts (or restarts) `node`'s slurmd reading its key from
    /// `key_file` (as a worker pod's slurmd reads the kubelet's file).
    pub fn start_slurmd(&self, node: &str, key_file: &Path) -> io::Result<()> {
        self.stop_slurmd(node);
        let mut cmd = private_run(
            &self.dir.join("slurm/sbin/slurmd"),
            &self.dir.join(format!("run-{node}")),
        )?;
        cmd.args(["-D", "-N", node, "-f"]).arg(self.conf());
        if self.config.dynamic {
            let port = self.ports.get(node).copied().unwrap_or_default();
            cmd.arg("-Z")
                .args(["--conf", &format!("Port={port} CPUs=1 RealMemory=64")]);
        }
        cmd.env("LD_LIBRARY_PATH", self.dir.join("slurm/lib/slurm"))
            .env("SLURM_CONF", self.conf())
            .env("SLURM_SACK_KEY", key_file);
        let child = ChildGuard::spawn(
            &format!("slurmd {node}"),
            cmd,
            &self.dir.join(format!("logs/slurmd-{node}.out")),
        )?;
        self.slurmds.lock().unwrap().insert(node.to_string(), child);
        Ok(())
    }

    /// slurmctld's address and port (a configless slurmd's
    /// `--conf-server`).
    pub fn ctld_addr(&self) -> SocketAddr {
        self.ctld_addr
    }

    /// Whether the slurmd run in the worker pods' containers
    /// ([`SlurmConfig::pods_plugin_dir`]).
    pub fn slurmd_in_pods(&self) -> bool {
        self.config.pods_plugin_dir.is_some()
    }

    /// How long after its container started a worker pod's slurmd starts
    /// (a slow image or entrypoint; the rig's bridge waits for it).
    pub fn slurmd_delay(&self) -> Duration {
        *self.slurmd_delay.lock().unwrap()
    }

    /// Sets [`Self::slurmd_delay`].
    pub fn set_slurmd_delay(&self, d: Duration) {
        *self.slurmd_delay.lock().unwrap() = d;
    }

    /// Stops `node`'s slurmd (its pod deleted); no-op when none runs.
    pub fn stop_slurmd(&self, node: &str) {
        if let Some(mut c) = self.slurmds.lock().unwrap().remove(node) {
            c.kill();
        }
    }

    /// Writes a key file for a slurmd in the rig's directory.
    pub fn key_file(&self, name: &str, key: &[u8]) -> io::Result<PathBuf> {
        let p = self.dir.join(format!("{name}.key"));
        write_key(&p, key)?;
        Ok(p)
    }

    /// A request to slurmrestd; the body parsed as JSON (`Null` when it
    /// is not JSON), with the status.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        call(&self.url(), method, path, token, body).await
    }

    /// GET `path`.
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.call("GET", path, token, None).await
    }

    /// GET one node.
    pub async fn node(&self, name: &str, token: &str) -> (u16, Value) {
        self.get(&format!("/slurm/{API}/node/{name}"), Some(token))
            .await
    }

    /// Submits a batch job pinned to `node` as SlurmUser, through
    /// slurmrestd (`POST /slurm/v0.0.44/job/submit`); its id.
    pub async fn submit_pinned_job(&self, node: &str, script: &str) -> io::Result<u64> {
        let token = self.token(SLURM_USER);
        let body = json!({"job": {
            "name": format!("pinned-{node}"),
            "partition": "all",
            "required_nodes": [node],
            "script": script,
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            "time_limit": {"set": true, "number": 2},
        }});
        let (code, v) = self
            .call(
                "POST",
                &format!("/slurm/{API}/job/submit"),
                Some(&token),
                Some(&body),
            )
            .await;
        v["job_id"]
            .as_u64()
            .filter(|_| code == 200)
            .ok_or_else(|| io::Error::other(format!("job submit: HTTP {code}: {v}")))
    }

    /// Cancels a job (`DELETE /slurm/v0.0.44/job/{id}`) as SlurmUser.
    pub async fn cancel_job(&self, id: u64) -> io::Result<()> {
        let token = self.token(SLURM_USER);
        let (code, v) = self
            .call(
                "DELETE",
                &format!("/slurm/{API}/job/{id}"),
                Some(&token),
                None,
            )
            .await;
        (code == 200)
            .then_some(())
            .ok_or_else(|| io::Error::other(format!("job cancel: HTTP {code}: {v}")))
    }

    /// A job's state names (`job_state`).
    pub async fn job_state(&self, id: u64) -> Vec<String> {
        let token = self.token(SLURM_USER);
        let (_, v) = self
            .get(&format!("/slurm/{API}/job/{id}"), Some(&token))
            .await;
        strings(&v["jobs"][0]["job_state"])
    }

    /// Polls `f` every 250 ms until it answers or `timeout` passes.
    pub async fn wait<T, F, Fut>(&self, what: &str, timeout: Duration, mut f: F) -> io::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(v) = f().await {
                return Ok(v);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(io::Error::other(format!(
                    "timed out after {timeout:?} waiting for {what}\n{}",
                    self.logs(30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The end of every daemon's log, for a failure message.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        if let Ok(rd) = std::fs::read_dir(self.dir.join("logs")) {
            let mut files: Vec<_> = rd.flatten().map(|e| e.path()).collect();
            files.sort();
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap_or_default();
                out.push_str(&format!(
                    "--- {} ---\n{}\n",
                    f.file_name().unwrap_or_default().to_string_lossy(),
                    crate::mountguard::tail(&text, lines)
                ));
            }
        }
        out
    }
}

/// The state names of the one node in a `node/{name}` answer.
pub fn node_states(v: &Value) -> Vec<String> {
    strings(&v["nodes"][0]["state"])
}

/// The strings of a JSON array (none when it is not one).
fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The error numbers of an answer, in order.
pub fn error_numbers(v: &Value) -> Vec<i64> {
    v["errors"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|e| e["error_number"].as_i64())
                .collect()
        })
        .unwrap_or_default()
}

/// Hard links (or copies, across file systems) the files of `from` into
/// `to`, symbolic links as they are.
fn link_tree(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type()?;
        if ft.is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src)?, &dst)?;
        } else if ft.is_file() && std::fs::hard_link(&src, &dst).is_err() {
            std::fs::copy(&src, &dst)?;
        }
    }
    Ok(())
}

/// A command that runs `program` in a mount namespace of its own whose
/// `/run` is `run_dir` (see the module docs: the fixed credential socket
/// paths), through util-linux's unshare(1).
fn private_run(program: &Path, run_dir: &Path) -> io::Result<Command> {
    std::fs::create_dir_all(run_dir)?;
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(r#"mount --bind "$0" /run && exec "$@""#)
        .arg(run_dir)
        .arg(program);
    Ok(cmd)
}

pub use crate::slurmrestd::call;
