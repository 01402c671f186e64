//! Integration tests of the agent: the binary, a large kubelet root, the
//! daemon reacting to an AtomicWriter swap through inotify, and the chart's
//! two deployment claims (HostToContainer mount propagation, root with only
//! `DAC_READ_SEARCH`) on the real kernel, when run as root.
//!
//! The kubelet is replaced by `AtomicWriterDouble`, a test double that
//! writes volume directories the way the kubelet's AtomicWriter does.
//!
//! Under `qemu-aarch64` (the arm64 CI run), binaries are started through the
//! emulator, and the inotify test is skipped with a message only if inotify
//! is shown not to work there.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mountguard_agent::{Daemon, DaemonConfig, InventorySink, ScanOptions, Scanner};
use mountguard_inventory::layout::{PODS_DIR, volume_dir};
use mountguard_inventory::writer::{AtomicWriterDouble, Payload, PayloadFile};
use mountguard_inventory::{
    NodeInventory, Plugin, ReadErrorKind, Sha256Hex, file_digest, volume_digest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_mountguard-agent");

fn payload(items: &[(&str, &[u8])]) -> Payload {
    items
        .iter()
        .map(|(p, d)| (p.to_string(), PayloadFile::new(d.to_vec())))
        .collect()
}

fn root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join(PODS_DIR)).unwrap();
    dir
}

/// Whether this test binary runs under user-mode emulation (the arm64 run
/// under qemu-aarch64 on an x86_64 host): host programs we spawn report
/// another architecture than ours.
fn emulated() -> bool {
    let host = Command::new("uname").arg("-m").output();
    match host {
        Ok(out) => String::from_utf8_lossy(&out.stdout).trim() != std::env::consts::ARCH,
        Err(_) => false,
    }
}

/// The agent binary as a command, through qemu when emulated.
fn agent_cmd(prefix: &[&str]) -> Command {
    let mut argv: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
    if emulated() {
        argv.extend(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"].map(String::from));
    }
    argv.push(BIN.to_string());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]);
    // Keep the environment from configuring the agent behind the test's back.
    for (k, _) in std::env::vars() {
        if k.starts_with("MOUNTGUARD_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

#[test]
fn scan_command_prints_the_inventory_and_fails_clearly_on_a_bad_root() {
    let r = root();
    AtomicWriterDouble::new(volume_dir(r.path(), "u1", Plugin::Secret, "auth"))
        .write(&payload(&[("slurm.key", b"k1")]))
        .unwrap();
    let out = agent_cmd(&[])
        .args(["scan", "--node", "n1", "--output", "json", "--kubelet-root"])
        .arg(r.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let inv = NodeInventory::from_json(&out.stdout).unwrap();
    assert_eq!(inv.node, "n1");
    let v = inv.pod("u1").unwrap().volume("auth").unwrap();
    assert_eq!(v.files["slurm.key"], Sha256Hex(file_digest(b"k1")));

    // Flags are also read from the environment.
    let out = agent_cmd(&[])
        .arg("scan")
        .env("MOUNTGUARD_KUBELET_ROOT", r.path())
        .env("MOUNTGUARD_OUTPUT", "table")
        .output()
        .unwrap();
    assert!(out.status.success());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("POD UID"), "{table}");
    assert!(table.contains("auth"), "{table}");

    let out = agent_cmd(&[])
        .args(["scan", "--kubelet-root"])
        .arg(r.path().join("does-not-exist"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot open the kubelet root directory"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn unreadable_file_is_a_permission_error() {
    let r = root();
    let w = AtomicWriterDouble::new(volume_dir(r.path(), "u1", Plugin::Secret, "s"));
    let mut p = payload(&[("readable", b"r")]);
    p.insert(
        "locked".into(),
        PayloadFile::with_mode(b"l".to_vec(), 0o600),
    );
    w.write(&p).unwrap();
    std::fs::set_permissions(r.path(), std::fs::Permissions::from_mode(0o755)).unwrap();

    let is_root = nix::unistd::geteuid().is_root();
    let inv = if is_root {
        // Root reads everything: run the scan as an unprivileged user with
        // no capabilities. The file stays owned by root with mode 0600.
        if Command::new("setpriv").arg("--version").output().is_err() {
            eprintln!("SKIPPED: running as root and setpriv is not installed");
            return;
        }
        let out = agent_cmd(&[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .args(["scan", "--output", "json", "--kubelet-root"])
        .arg(r.path())
        .output()
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        NodeInventory::from_json(&out.stdout).unwrap()
    } else {
        let f = w
            .target()
            .join(w.current_data_dir().unwrap())
            .join("locked");
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o000)).unwrap();
        let inv = Scanner::new(ScanOptions::new(r.path(), "n"))
            .scan()
            .unwrap();
        (*inv.inventory).clone()
    };
    let v = inv.pod("u1").unwrap().volume("s").unwrap();
    // The readable file proves the unprivileged scan could reach the volume.
    assert_eq!(v.files.keys().collect::<Vec<_>>(), vec!["readable"]);
    assert_eq!(v.errors.len(), 1, "{:?}", v.errors);
    assert_eq!(v.errors[0].kind, ReadErrorKind::Permission);
    assert_eq!(v.errors[0].path, "locked");
    assert!(v.digest.is_none());
}

#[test]
fn ten_thousand_volumes() {
    let r = root();
    let plugins = [Plugin::Secret, Plugin::Configmap, Plugin::Projected];
    let mut want = BTreeMap::new();
    for pod in 0..2500 {
        let uid = format!("pod-{pod:05}");
        for vol in 0..4 {
            let plugin = plugins[vol % 3];
            let name = format!("vol-{vol}");
            let content = format!("{uid}/{name}");
            AtomicWriterDouble::new(volume_dir(r.path(), &uid, plugin, &name))
                .write(&payload(&[("key", content.as_bytes())]))
                .unwrap();
            want.insert((uid.clone(), name), file_digest(content.as_bytes()));
        }
    }
    let mut s = Scanner::new(ScanOptions::new(r.path(), "n"));
    let first = s.scan().unwrap();
    assert_eq!(first.stats.volumes, 10_000);
    assert_eq!(first.stats.rehashed, 10_000);
    assert_eq!(first.inventory.pods.len(), 2500);
    let mut seen = 0;
    for pod in &first.inventory.pods {
        for v in &pod.volumes {
            assert!(
                v.errors.is_empty(),
                "{}/{}: {:?}",
                pod.uid,
                v.name,
                v.errors
            );
            let d = want[&(pod.uid.clone(), v.name.clone())];
            assert_eq!(v.files["key"], Sha256Hex(d));
            assert_eq!(v.digest, Some(Sha256Hex(volume_digest([("key", &d)]))));
            seen += 1;
        }
    }
    assert_eq!(seen, 10_000);

    let steady = s.scan().unwrap();
    assert!(!steady.changed);
    assert_eq!((steady.stats.rehashed, steady.stats.reused), (0, 10_000));
    assert_eq!(steady.inventory.generation, first.inventory.generation);

    AtomicWriterDouble::new(volume_dir(
        r.path(),
        "pod-01234",
        Plugin::Projected,
        "vol-2",
    ))
    .write(&payload(&[("key", b"changed")]))
    .unwrap();
    let one = s.scan().unwrap();
    assert!(one.changed);
    assert_eq!(one.stats.rehashed, 1);
    assert_eq!(one.inventory.generation, first.inventory.generation + 1);
    let v = one
        .inventory
        .pod("pod-01234")
        .unwrap()
        .volume("vol-2")
        .unwrap();
    assert_eq!(v.files["key"], Sha256Hex(file_digest(b"changed")));
    // Every other volume is carried over from the cache in full.
    let mut carried = 0;
    for pod in &one.inventory.pods {
        for v in &pod.volumes {
            if (pod.uid.as_str(), v.name.as_str()) != ("pod-01234", "vol-2") {
                let d = want[&(pod.uid.clone(), v.name.clone())];
                assert_eq!(v.files["key"], Sha256Hex(d), "{}/{}", pod.uid, v.name);
                carried += 1;
            }
        }
    }
    assert_eq!(carried, 9_999);
}

/// Whether inotify delivers an event for a file created in a watched
/// directory within a few seconds (qemu-user may not emulate it).
fn inotify_works() -> bool {
    use notify::Watcher;
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let Ok(mut w) = notify::recommended_watcher(move |e: notify::Result<notify::Event>| {
        if let Ok(e) = e
            && e.kind.is_create()
        {
            let _ = tx.send(());
        }
    }) else {
        return false;
    };
    if w.watch(dir.path(), notify::RecursiveMode::NonRecursive)
        .is_err()
    {
        return false;
    }
    std::fs::write(dir.path().join("probe"), b"x").unwrap();
    rx.recv_timeout(Duration::from_secs(5)).is_ok()
}

/// Counts what the daemon hands to its sink.
#[derive(Debug, Default, Clone)]
struct CountingSink(Arc<std::sync::Mutex<Vec<u64>>>);

impl InventorySink for CountingSink {
    async fn publish(&self, inv: &NodeInventory) -> Result<(), mountguard_agent::Error> {
        self.0.lock().unwrap().push(inv.generation);
        Ok(())
    }
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

async fn wait_for<F: Fn(&NodeInventory) -> bool>(
    rx: &mut tokio::sync::watch::Receiver<Option<Arc<NodeInventory>>>,
    deadline: Duration,
    what: &str,
    f: F,
) -> Arc<NodeInventory> {
    let res = tokio::time::timeout(deadline, rx.wait_for(|i| i.as_deref().is_some_and(&f))).await;
    match res {
        Ok(Ok(inv)) => inv.clone().unwrap(),
        _ => panic!("timed out after {deadline:?} waiting for {what}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_reacts_to_a_swap_without_waiting_for_the_rescan() {
    if !inotify_works() {
        assert!(
            emulated(),
            "inotify delivered no event on a native run: that is a failure, not a skip"
        );
        eprintln!("SKIPPED: inotify events are not delivered under this emulator (qemu-user)");
        return;
    }
    let r = root();
    let w = AtomicWriterDouble::new(volume_dir(r.path(), "u1", Plugin::Projected, "slurm-etc"));
    w.write(&payload(&[("slurm.key", b"v1")])).unwrap();

    let mut cfg = DaemonConfig::new(ScanOptions::new(r.path(), "n"));
    cfg.listen = Some("127.0.0.1:0".parse().unwrap());
    cfg.rescan_interval = Duration::from_secs(3600);
    cfg.debounce = Duration::from_millis(20);
    let sink = CountingSink::default();
    let daemon = Daemon::start(cfg, sink.clone()).await.unwrap();
    let addr = daemon.http_addr().unwrap();
    let mut rx = daemon.inventory();

    let first = wait_for(&mut rx, Duration::from_secs(20), "the first scan", |_| true).await;
    let v = first.pod("u1").unwrap().volume("slurm-etc").unwrap();
    assert_eq!(v.files["slurm.key"], Sha256Hex(file_digest(b"v1")));
    assert!(daemon.is_ready());
    assert_eq!(http_get(addr, "/readyz").await.0, 200);
    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(http_get(addr, "/nope").await.0, 404);

    // The swap: only inotify can make the daemon rescan within the hour.
    let started = Instant::now();
    w.write(&payload(&[("slurm.key", b"v2")])).unwrap();
    let second = wait_for(
        &mut rx,
        Duration::from_secs(20),
        "the swap to be seen",
        |i| i.generation > first.generation,
    )
    .await;
    let v = second.pod("u1").unwrap().volume("slurm-etc").unwrap();
    assert_eq!(v.files["slurm.key"], Sha256Hex(file_digest(b"v2")));
    assert_eq!(v.data_dir, w.current_data_dir());
    eprintln!("swap seen after {:?}", started.elapsed());

    // A new pod with a new volume appears through the pods directory watch
    // and the per-pod watches added after the rescan.
    let w2 = AtomicWriterDouble::new(volume_dir(r.path(), "u2", Plugin::Secret, "s"));
    w2.write(&payload(&[("k", b"x")])).unwrap();
    wait_for(
        &mut rx,
        Duration::from_secs(20),
        "the new pod's volume",
        |i| {
            i.pod("u2")
                .is_some_and(|p| p.volume("s").is_some_and(|v| !v.files.is_empty()))
        },
    )
    .await;

    let (status, metrics) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    for name in [
        "mountguard_agent_scans_total{result=\"ok\"}",
        "mountguard_agent_inventory_generation",
        "mountguard_agent_volume_reads_total{result=\"rehashed\"}",
        "mountguard_agent_watch_events_total{kind=\"change\"}",
        "mountguard_agent_last_successful_scan_timestamp_seconds",
        "mountguard_agent_read_errors{kind=\"permission\"} 0",
    ] {
        assert!(metrics.contains(name), "{name} missing from:\n{metrics}");
    }
    let published = sink.0.lock().unwrap().clone();
    assert!(published.contains(&first.generation), "{published:?}");

    assert!(this_process_listens_on(addr.port()), "before shutdown");
    tokio::time::timeout(Duration::from_secs(10), daemon.shutdown())
        .await
        .expect("shutdown within 10 s");
    // Whether this process still listens on the port (another process of a
    // parallel test run may bind the freed port: a connect proves nothing).
    assert!(
        !this_process_listens_on(addr.port()),
        "the HTTP server still listens after shutdown"
    );
}

/// Whether a socket of this process listens on TCP `port` (IPv4 or IPv6):
/// a LISTEN row of /proc/net/tcp{,6} whose inode is one of this
/// process's file descriptors.
fn this_process_listens_on(port: u16) -> bool {
    let ours: std::collections::BTreeSet<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy().into_owned();
            l.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(String::from)
        })
        .collect();
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|table| {
        std::fs::read_to_string(table)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|row| {
                let f: Vec<&str> = row.split_whitespace().collect();
                let listening_on = f
                    .get(1)
                    .and_then(|local| local.rsplit_once(':'))
                    .is_some_and(|(_, p)| u16::from_str_radix(p, 16).ok() == Some(port))
                    && f.get(3) == Some(&"0A");
                listening_on && f.get(9).is_some_and(|inode| ours.contains(*inode))
            })
    })
}

/// (full scans, targeted scans) the daemon completed so far.
fn scan_counts(d: &Daemon) -> (u64, u64) {
    let m = d.metrics();
    let ok = m.scans.with_label_values(&["ok"]).get();
    let targeted = m.targeted_scans.get();
    (ok - targeted, targeted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_rescans_only_the_pods_events_name() {
    if !inotify_works() {
        assert!(
            emulated(),
            "inotify delivered no event on a native run: that is a failure, not a skip"
        );
        eprintln!("SKIPPED: inotify events are not delivered under this emulator (qemu-user)");
        return;
    }
    let r = root();
    let w = AtomicWriterDouble::new(volume_dir(r.path(), "u1", Plugin::Secret, "s"));
    w.write(&payload(&[("k", b"v1")])).unwrap();
    for name in ["a", "b", "c"] {
        AtomicWriterDouble::new(volume_dir(r.path(), "u2", Plugin::Configmap, name))
            .write(&payload(&[("k", name.as_bytes())]))
            .unwrap();
    }
    let mut cfg = DaemonConfig::new(ScanOptions::new(r.path(), "n"));
    // Only inotify can make the daemon rescan within the hour.
    cfg.rescan_interval = Duration::from_secs(3600);
    cfg.debounce = Duration::from_millis(20);
    let daemon = Daemon::start(cfg, CountingSink::default()).await.unwrap();
    let mut rx = daemon.inventory();
    let first = wait_for(&mut rx, Duration::from_secs(20), "the first scan", |_| true).await;
    assert_eq!(scan_counts(&daemon), (1, 0));
    let reused = || {
        daemon
            .metrics()
            .volume_reads
            .with_label_values(&["reused"])
            .get()
    };
    let reused_before = reused();

    w.write(&payload(&[("k", b"v2")])).unwrap();
    let second = wait_for(&mut rx, Duration::from_secs(20), "the swap", |i| {
        i.generation > first.generation
    })
    .await;
    let v = second.pod("u1").unwrap().volume("s").unwrap();
    assert_eq!(v.files["k"], Sha256Hex(file_digest(b"v2")));
    let (full, targeted) = scan_counts(&daemon);
    assert_eq!(full, 1, "the swap was picked up by a full rescan");
    assert!(targeted >= 1);
    // u2's three volumes were not looked at (u1's one volume may be
    // confirmed by a later scan of the same events).
    let looked_at = reused() - reused_before;
    assert!(
        looked_at <= targeted,
        "{looked_at} volumes confirmed in {targeted} targeted scans"
    );

    // A removed pod directory is named by the event on pods/.
    std::fs::remove_dir_all(r.path().join(PODS_DIR).join("u2")).unwrap();
    wait_for(&mut rx, Duration::from_secs(20), "u2 to go", |i| {
        i.pod("u2").is_none()
    })
    .await;
    assert_eq!(
        scan_counts(&daemon).0,
        1,
        "the removal needed a full rescan"
    );

    tokio::time::timeout(Duration::from_secs(10), daemon.shutdown())
        .await
        .expect("shutdown within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn periodic_full_rescan_catches_a_change_no_event_reported() {
    // subPath targets are not watched (a kubelet bind-mount source, not
    // where AtomicWriter swaps): a change there never produces an event,
    // like any change whose event is lost to a queue overflow. With inotify
    // on, only the periodic full rescan can find it.
    let r = root();
    AtomicWriterDouble::new(volume_dir(r.path(), "u1", Plugin::Configmap, "cfg"))
        .write(&payload(&[("slurm.conf", b"v1")]))
        .unwrap();
    let target = mountguard_inventory::layout::subpath_target(r.path(), "u1", "cfg", "slurmd", 0);
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(&target, b"v1").unwrap();
    let mut cfg = DaemonConfig::new(ScanOptions::new(r.path(), "n"));
    cfg.rescan_interval = Duration::from_secs(1);
    cfg.debounce = Duration::from_millis(20);
    let daemon = Daemon::start(cfg, CountingSink::default()).await.unwrap();
    let mut rx = daemon.inventory();
    let first = wait_for(&mut rx, Duration::from_secs(20), "the first scan", |_| true).await;
    assert_eq!(
        first.pod("u1").unwrap().sub_paths[0].files[""],
        Sha256Hex(file_digest(b"v1"))
    );
    let (full_before, _) = scan_counts(&daemon);

    std::fs::write(&target, b"v2").unwrap();
    let seen = wait_for(
        &mut rx,
        Duration::from_secs(30),
        "the subPath change",
        |i| {
            i.pod("u1").is_some_and(|p| {
                p.sub_paths
                    .first()
                    .is_some_and(|s| s.files.get("") == Some(&Sha256Hex(file_digest(b"v2"))))
            })
        },
    )
    .await;
    assert!(seen.generation > first.generation);
    let (full, _) = scan_counts(&daemon);
    assert!(full > full_before, "found without a full rescan?");

    tokio::time::timeout(Duration::from_secs(10), daemon.shutdown())
        .await
        .expect("shutdown within 10 s");
}

#[test]
fn run_command_becomes_ready_and_stops_cleanly_on_sigterm() {
    let r = root();
    AtomicWriterDouble::new(volume_dir(r.path(), "u1", Plugin::Secret, "s"))
        .write(&payload(&[("k", b"v")]))
        .unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = agent_cmd(&[])
        .args([
            "run",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--kubelet-root",
        ])
        .arg(r.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = rt.block_on(async {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(_) => http_get(addr, "/readyz").await.0 == 200,
                Err(_) => false,
            }
        });
        if ready {
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("agent exited early: {status}");
        }
        assert!(Instant::now() < deadline, "agent not ready within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "agent did not stop within 15 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    assert!(stderr.contains("shutting down"), "{stderr}");
    assert!(stderr.contains("stopped"), "{stderr}");
    let _ = Path::new(BIN);
}

/// Why the kernel-level deployment tests below cannot run here, if they
/// cannot: they need root, util-linux `unshare` and `setpriv`, and mount
/// namespaces.
fn namespace_tests_unavailable() -> Option<String> {
    if !nix::unistd::geteuid().is_root() {
        return Some("not running as root".into());
    }
    for tool in ["unshare", "setpriv"] {
        if Command::new(tool).arg("--version").output().is_err() {
            return Some(format!("{tool} (util-linux) is not installed"));
        }
    }
    match Command::new("unshare").args(["-m", "true"]).status() {
        Ok(s) if s.success() => None,
        _ => Some("`unshare -m true` failed: mount namespaces are not permitted here".into()),
    }
}

/// The agent command line (`[qemu ...] mountguard-agent`) as argv, for a
/// shell script to exec.
fn agent_argv() -> Vec<String> {
    let cmd = agent_cmd(&[]);
    let mut argv = vec![cmd.get_program().to_string_lossy().into_owned()];
    argv.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    argv
}

/// [`agent_argv`] with `scan ...` of kubelet root `root`.
fn agent_scan_argv(root: &Path) -> Vec<String> {
    let mut argv = agent_argv();
    argv.extend(["scan", "--node", "n", "--output", "json", "--kubelet-root"].map(String::from));
    argv.push(root.to_string_lossy().into_owned());
    argv
}

/// Runs shell `script` in a scratch mount namespace of its own (private
/// propagation), with `paths` then `argv` as its arguments; its output.
fn in_private_mount_namespace(script: &str, paths: &[&Path], argv: &[String]) -> Output {
    Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", script, "sh"])
        .args(paths)
        .args(argv)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Runs `$1..$4` = kubelet root, volume dir, staged volume content, work
/// dir; the rest is the agent argv. Inside a private scratch mount namespace
/// (nothing leaks to the machine): the kubelet root becomes a shared mount,
/// two agents enter their own mount namespaces (slave = HostToContainer,
/// private = no propagation) and wait; only then is the volume's tmpfs
/// mounted and filled, and the agents scan.
const PROPAGATION_SCRIPT: &str = r#"
set -eu
R=$1; V=$2; STAGE=$3; W=$4; shift 4
mount --bind "$R" "$R"
mount --make-rshared "$R"
for p in slave private; do
    unshare -m --propagation "$p" sh -c '
        W=$1; p=$2; shift 2
        touch "$W/ready-$p"
        i=0
        while [ ! -e "$W/go" ]; do
            i=$((i + 1)); [ "$i" -lt 1200 ] || exit 97
            sleep 0.05
        done
        exec "$@"' sh "$W" "$p" "$@" >"$W/out-$p" 2>"$W/err-$p" &
    eval "pid_$p=\$!"
done
i=0
while [ ! -e "$W/ready-slave" ] || [ ! -e "$W/ready-private" ]; do
    i=$((i + 1)); [ "$i" -lt 1200 ] || { touch "$W/go"; exit 98; }
    sleep 0.05
done
mount -t tmpfs -o mode=0755 tmpfs "$V"
cp -a "$STAGE/." "$V/"
touch "$W/go"
rc=0
wait "$pid_slave" || rc=$?
echo "$rc" >"$W/rc-slave"
rc=0
wait "$pid_private" || rc=$?
echo "$rc" >"$W/rc-private"
"#;

/// The chart mounts the kubelet root with `mountPropagation: HostToContainer`
/// because each Secret volume is a tmpfs the kubelet mounts after the agent
/// started. On the real kernel: an agent whose mount namespace is a slave of
/// the host's sees a tmpfs mounted later and hashes its files; an agent with
/// private propagation sees the empty directory below it and says so with a
/// `mountPropagation` error instead of reporting an empty volume.
#[test]
fn host_to_container_propagation_shows_volumes_mounted_after_the_agent_started() {
    if let Some(why) = namespace_tests_unavailable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let r = root();
    let vol = volume_dir(r.path(), "u1", Plugin::Secret, "s");
    std::fs::create_dir_all(&vol).unwrap();
    let stage = tempfile::tempdir().unwrap();
    AtomicWriterDouble::new(stage.path().join("v"))
        .write(&payload(&[("slurm.key", b"k1"), ("sub/conf", b"c1")]))
        .unwrap();
    let work = tempfile::tempdir().unwrap();

    let out = in_private_mount_namespace(
        PROPAGATION_SCRIPT,
        &[r.path(), &vol, &stage.path().join("v"), work.path()],
        &agent_scan_argv(r.path()),
    );
    let read = |f: &str| std::fs::read_to_string(work.path().join(f)).unwrap_or_default();
    assert!(
        out.status.success(),
        "scenario failed: {:?}\n{}\nslave: {}\nprivate: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        read("err-slave"),
        read("err-private"),
    );
    for p in ["slave", "private"] {
        assert_eq!(
            read(&format!("rc-{p}")).trim(),
            "0",
            "{p}: {}",
            read(&format!("err-{p}"))
        );
    }

    // Nothing leaked into this test's mount namespace.
    let mounts = Command::new("findmnt")
        .args(["-rn", "-o", "TARGET"])
        .output()
        .unwrap();
    let mounts = String::from_utf8_lossy(&mounts.stdout);
    let r_path = r.path().to_string_lossy();
    assert!(!mounts.lines().any(|m| m.starts_with(&*r_path)), "{mounts}");
    assert!(std::fs::read_dir(&vol).unwrap().next().is_none());

    let slave = NodeInventory::from_json(read("out-slave").as_bytes()).unwrap();
    let v = slave.pod("u1").unwrap().volume("s").unwrap();
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    assert_eq!(v.files["slurm.key"], Sha256Hex(file_digest(b"k1")));
    assert_eq!(v.files["sub/conf"], Sha256Hex(file_digest(b"c1")));
    assert!(v.digest.is_some());

    let private = NodeInventory::from_json(read("out-private").as_bytes()).unwrap();
    let v = private.pod("u1").unwrap().volume("s").unwrap();
    assert!(v.files.is_empty(), "{:?}", v.files);
    assert_eq!(v.errors.len(), 1, "{:?}", v.errors);
    assert_eq!(v.errors[0].kind, ReadErrorKind::MountPropagation);
    assert!(v.digest.is_none());
}

/// `setpriv` as root (uid 0) with a bounding set of `caps`: after exec, the
/// process holds exactly the capabilities in the bounding set.
fn with_caps(caps: &str) -> Vec<String> {
    [
        "setpriv",
        "--reuid=0",
        "--regid=0",
        "--clear-groups",
        "--inh-caps=-all",
        "--ambient-caps=-all",
    ]
    .map(String::from)
    .into_iter()
    .chain([format!("--bounding-set={caps}")])
    .collect()
}

/// The effective capability mask of a process started with `prefix`.
fn cap_eff(prefix: &[String]) -> u64 {
    let out = Command::new(&prefix[0])
        .args(&prefix[1..])
        .args(["cat", "/proc/self/status"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = String::from_utf8_lossy(&out.stdout);
    let line = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).unwrap()
}

/// The chart runs the agent as root with no capability but
/// `DAC_READ_SEARCH`. On the real kernel: that alone reads a 0400 file of
/// another user in that user's 0700 directory; with no capability at all the
/// same scan reports a `permission` error and still succeeds.
#[test]
fn dac_read_search_alone_reads_other_users_private_files() {
    if let Some(why) = namespace_tests_unavailable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    const CAP_DAC_READ_SEARCH: u64 = 1 << 2;
    let r = root();
    let w = AtomicWriterDouble::new(volume_dir(r.path(), "u1", Plugin::Secret, "s"));
    w.write(&payload(&[("slurm.key", b"secret-k")])).unwrap();
    let data = w.target().join(w.current_data_dir().unwrap());
    let file = data.join("slurm.key");
    std::os::unix::fs::chown(&file, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o400)).unwrap();
    std::os::unix::fs::chown(&data, Some(1000), Some(1000)).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();

    let scan = |prefix: &[String]| {
        let prefix: Vec<&str> = prefix.iter().map(String::as_str).collect();
        let out = agent_cmd(&prefix)
            .args(["scan", "--node", "n", "--output", "json", "--kubelet-root"])
            .arg(r.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        NodeInventory::from_json(&out.stdout).unwrap()
    };

    let only_dac = with_caps("-all,+dac_read_search");
    assert_eq!(cap_eff(&only_dac), CAP_DAC_READ_SEARCH);
    let inv = scan(&only_dac);
    let v = inv.pod("u1").unwrap().volume("s").unwrap();
    assert!(v.errors.is_empty(), "{:?}", v.errors);
    assert_eq!(v.files["slurm.key"], Sha256Hex(file_digest(b"secret-k")));
    assert!(v.digest.is_some());

    let none = with_caps("-all");
    assert_eq!(cap_eff(&none), 0);
    let inv = scan(&none);
    let v = inv.pod("u1").unwrap().volume("s").unwrap();
    assert!(v.files.is_empty(), "{:?}", v.files);
    assert_eq!(v.errors.len(), 1, "{:?}", v.errors);
    assert_eq!(v.errors[0].kind, ReadErrorKind::Permission);
    // The 0700 data directory already stops a scan without the capability.
    assert_eq!(v.errors[0].path, "..data");
    assert!(v.digest.is_none());
}

/// Runs `$1..$3` = kubelet root, volume dir, work dir; the rest is the
/// agent argv. In a private scratch mount namespace: the agent applies its
/// Landlock restriction (hidden `sandbox-check` command, the same function
/// as `run`) and waits; only then is a tmpfs mounted on the volume
/// directory and a Secret file written into it, as the kubelet would; then
/// the agent tries to read, overwrite and create files there and in the
/// kubelet root.
const LANDLOCK_SCRIPT: &str = r#"
set -eu
R=$1; V=$2; W=$3; shift 3
mkfifo "$W/in"
"$@" sandbox-check --kubelet-root "$R" <"$W/in" >"$W/out" 2>"$W/err" &
pid=$!
exec 3>"$W/in"
i=0
while ! grep -q '^restricted' "$W/out" 2>/dev/null; do
    i=$((i + 1)); [ "$i" -lt 1200 ] || exit 98
    sleep 0.05
done
mount -t tmpfs -o mode=0755 tmpfs "$V"
printf 'secret' >"$V/key"
echo "read $V/key" >&3
echo "write $V/key" >&3
echo "create $V/new" >&3
echo "create $R/pods/new" >&3
exec 3>&-
wait "$pid"
cat "$V/key" >"$W/after"
ls -A "$V" >"$W/ls"
"#;

/// A compromised agent cannot write: on the real kernel, a tmpfs mounted
/// below the kubelet root after the agent restricted itself (a Secret
/// volume) is readable by the agent and neither writable nor extendable;
/// nor is the kubelet root. Skipped where Landlock is missing (the agent
/// then reports `mountguard_agent_landlock_enforced 0`).
#[test]
fn landlock_keeps_the_agent_from_writing_to_volumes_mounted_after_it_started() {
    if let Some(why) = namespace_tests_unavailable() {
        eprintln!("SKIPPED: {why}");
        return;
    }
    let r = root();
    let vol = volume_dir(r.path(), "u1", Plugin::Secret, "s");
    std::fs::create_dir_all(&vol).unwrap();
    let work = tempfile::tempdir().unwrap();
    let out = in_private_mount_namespace(
        LANDLOCK_SCRIPT,
        &[r.path(), &vol, work.path()],
        &agent_argv(),
    );
    let read = |f: &str| std::fs::read_to_string(work.path().join(f)).unwrap_or_default();
    assert!(
        out.status.success(),
        "scenario failed: {:?}\n{}\nagent: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        read("err"),
    );
    let lines: Vec<String> = read("out").lines().map(String::from).collect();
    if lines.first().map(String::as_str) == Some("restricted not") {
        eprintln!("SKIPPED: this kernel has no Landlock");
        return;
    }
    assert_eq!(lines[0], "restricted fully", "{lines:?}");
    assert_eq!(lines[1], "read ok", "the agent must still read: {lines:?}");
    for (i, what) in [(2, "write"), (3, "create"), (4, "create")] {
        assert!(
            lines[i].starts_with(&format!("{what} denied")),
            "line {i}: {lines:?}"
        );
    }
    assert_eq!(read("after"), "secret", "the Secret file was changed");
    assert_eq!(read("ls").trim(), "key", "a file was created");
    assert!(!r.path().join("pods/new").exists());
}
