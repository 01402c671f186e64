//! `status` and `wait`, directly and as the kubectl plugin, end when they
//! say they will: against a server that accepts and never answers, one
//! that trickles its answer a byte a second, and one that streams a chunked
//! body without end, each exits 2 within its deadline plus a second, the
//! last with the size cap's message. Loopback servers only.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What the server does with each connection.
#[derive(Clone, Copy)]
enum Behaviour {
    /// Accepts, reads the request, never writes.
    Silent,
    /// Sends the status line and headers, then the body a byte a second.
    Trickle,
    /// Sends a chunked body without end, as fast as the client reads.
    EndlessChunked,
}

fn serve(b: Behaviour) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(s) = s else { return };
            std::thread::spawn(move || connection(s, b));
        }
    });
    port
}

fn connection(mut s: TcpStream, b: Behaviour) {
    let mut buf = [0u8; 4096];
    let _ = s.read(&mut buf);
    match b {
        Behaviour::Silent => {
            std::thread::sleep(Duration::from_secs(120));
        }
        Behaviour::Trickle => {
            if s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n")
                .is_err()
            {
                return;
            }
            loop {
                if s.write_all(b" ").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        Behaviour::EndlessChunked => {
            if s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n")
                .is_err()
            {
                return;
            }
            let mut chunk = format!("{:x}\r\n", 64 << 10).into_bytes();
            chunk.extend(std::iter::repeat_n(b' ', 64 << 10));
            chunk.extend_from_slice(b"\r\n");
            while s.write_all(&chunk).is_ok() {}
        }
    }
}

fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let p = dir.join(format!("kubeconfig-{port}"));
    std::fs::write(
        &p,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: \
             http://127.0.0.1:{port}\ncontexts:\n- name: loopback-ctx\n  context:\n    cluster: t\n    \
             user: t\ncurrent-context: loopback-ctx\nusers:\n- name: t\n  user: {{}}\n"
        ),
    )
    .unwrap();
    p
}

/// The binary as the kubectl plugin (kubectl runs `kubectl-mountguard`).
fn plugin(dir: &Path) -> PathBuf {
    let p = dir.join("kubectl-mountguard");
    if !p.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_mountguard-controller"), &p).unwrap();
    }
    p
}

struct Case {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
}

/// Runs every case at once; each must exit 2 within `budget` plus a
/// second, with `want` on standard error.
fn check(cases: Vec<Case>, budget: Duration, want: &str) {
    let running: Vec<_> = cases
        .into_iter()
        .map(|c| {
            let child = Command::new(&c.program)
                .args(&c.args)
                .env_remove("KUBECONFIG")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            (c, child, Instant::now())
        })
        .collect();
    let mut failures = Vec::new();
    for (c, mut child, start) in running {
        // Bounded, so that a command that hangs fails the test rather than
        // holding it.
        let limit = budget + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let elapsed = start.elapsed();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let code = status.and_then(|s| s.code());
        if code != Some(2) || elapsed > budget + Duration::from_secs(1) || !stderr.contains(want) {
            failures.push(format!(
                "{}: exit {code:?} after {elapsed:?} (allowed {:?}), stderr: {stderr}",
                c.name,
                budget + Duration::from_secs(1)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `status` and `wait`, at `--url` and through the plugin's service proxy,
/// against a server behaving as `b`.
fn cases(b: Behaviour, dir: &Path, extra: &[&str]) -> Vec<Case> {
    let port = serve(b);
    let url = format!("http://127.0.0.1:{port}");
    let kc = kubeconfig(dir, port).display().to_string();
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_mountguard-controller"));
    let s = |v: &[&str]| -> Vec<String> {
        v.iter()
            .chain(extra)
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
    };
    vec![
        Case {
            name: "status --url",
            program: bin.clone(),
            args: s(&["status", "--url", &url, "--request-timeout", "3s"]),
        },
        Case {
            name: "wait --url",
            program: bin,
            args: s(&["wait", "secret/ns/s", "--url", &url, "--timeout", "3s"]),
        },
        Case {
            name: "kubectl mountguard status",
            program: plugin(dir),
            args: s(&["--kubeconfig", &kc, "status", "--request-timeout", "3s"]),
        },
        Case {
            name: "kubectl mountguard wait",
            program: plugin(dir),
            args: s(&[
                "--kubeconfig",
                &kc,
                "wait",
                "secret/ns/s",
                "--timeout",
                "3s",
            ]),
        },
    ]
}

#[test]
fn client_deadline_server_that_never_answers() {
    let dir = tempfile::tempdir().unwrap();
    check(
        cases(Behaviour::Silent, dir.path(), &[]),
        Duration::from_secs(3),
        "no complete answer within 3s",
    );
}

#[test]
fn client_deadline_server_that_trickles() {
    let dir = tempfile::tempdir().unwrap();
    check(
        cases(Behaviour::Trickle, dir.path(), &[]),
        Duration::from_secs(3),
        "no complete answer within 3s",
    );
}

#[test]
fn client_deadline_endless_chunked_body_hits_the_size_cap() {
    let dir = tempfile::tempdir().unwrap();
    check(
        cases(
            Behaviour::EndlessChunked,
            dir.path(),
            &["--max-response-size", "1Mi"],
        ),
        Duration::from_secs(3),
        "larger than 1048576 bytes (--max-response-size)",
    );
}

/// issue 31 §3: the plugin against an API server nobody listens at names
/// the server and the kubeconfig context (exit 2).
#[test]
fn error_hint_plugin_names_the_server_and_the_context() {
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let kc = kubeconfig(dir.path(), port).display().to_string();
    let out = Command::new(plugin(dir.path()))
        .args(["--kubeconfig", &kc, "status"])
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    for part in [
        format!("API server http://127.0.0.1:{port}"),
        "kubeconfig context loopback-ctx".to_string(),
        "--context".to_string(),
    ] {
        assert!(stderr.contains(&part), "{part}: {stderr}");
    }
}
