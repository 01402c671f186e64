//! `mountguard-local-cluster` (what `scripts/local-cluster.sh` runs, after
//! building what it needs): `up` brings the one-node cluster with the chart
//! installed and Prometheus; the commands of docs/tutorials/local-cluster.md
//! run as a reader runs them; `rotate` runs the seed rotation; SIGTERM
//! takes it all down.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use mountguard_tests::docs::{run_block, shell_blocks, substitute};
use mountguard_tests::mountguard::{http_get, kubectl_plugin, poll};
use mountguard_tests::real::helm;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_mountguard-local-cluster");

/// The `up` process; a failing test still takes its cluster down
/// (SIGTERM, then up to 240 s for it to exit).
struct Up(Child);

impl Up {
    fn term(&self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.term();
            for _ in 0..240 {
                if !matches!(self.0.try_wait(), Ok(None)) {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            let _ = self.0.kill();
        }
    }
}

fn env_of(state: &Path) -> Vec<(String, String)> {
    helm::parse_env(&std::fs::read_to_string(state.join("env")).expect("env"))
}

/// The tutorial of the local cluster.
const TUTORIAL: &str = "docs/tutorials/local-cluster.md";

/// Runs the tutorial's commands after `up`, as a reader does: `. env`
/// (the state's), then the programs it puts on PATH, with the kubectl
/// plugin linked as the how-to links it. The script's own commands (`bash
/// scripts/local-cluster.sh ...`) are what this test runs as the binary.
/// Every command must succeed or give an answer, and what they print must
/// show each of them reached the cluster.
async fn tutorial_commands_run(state: &Path, home: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let text = std::fs::read_to_string(repo.join(TUTORIAL)).expect("the tutorial");
    let plugin = kubectl_plugin(home).expect("plugin");
    let env_file = state.join("env").display().to_string();
    let env = [
        (
            "PATH",
            format!(
                "{}:/usr/local/bin:/usr/bin:/bin",
                plugin.parent().unwrap().display()
            ),
        ),
        ("HOME", home.display().to_string()),
    ];
    let (mut ran, mut failed, mut printed) = (0, Vec::new(), String::new());
    for block in shell_blocks(&text) {
        let mut commands = Vec::new();
        for c in &block.commands {
            if c.starts_with("bash scripts/local-cluster.sh ") {
                println!(
                    "not run: {TUTORIAL}:{}: {c}: this test runs it as the binary",
                    block.line
                );
            } else {
                commands.push(substitute(c, &[("target/local-cluster/env", &env_file)]));
            }
        }
        if commands.is_empty() {
            continue;
        }
        ran += commands.len();
        let run = run_block(&commands, home, &env, Duration::from_secs(120)).await;
        failed.extend(
            run.failures
                .into_iter()
                .map(|f| format!("{TUTORIAL}:{}: {f}", block.line)),
        );
        printed.push_str(&run.stdout);
    }
    assert!(ran >= 8, "only {ran} commands found in {TUTORIAL}");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    for (what, shows) in [
        ("helm status", "STATUS: deployed"),
        (
            "the controller's metrics",
            "mountguard_mounts{state=\"Fresh\"}",
        ),
        ("the agent's metrics", "mountguard_agent_"),
        (
            "the metrics through kubectl port-forward",
            "mountguard_build_info{",
        ),
        ("kubectl logs", "\"message\":\"controller started\""),
        ("kubectl mountguard status", "verdicts:"),
    ] {
        assert!(
            printed.contains(shows),
            "{what}: no {shows:?} in\n{printed}"
        );
    }
}

/// Up, the tutorial's commands, then the rotation makes the chart's
/// MountguardKubeletCachePinned alert fire in its Prometheus for the pinned worker, then
/// SIGTERM: the release is uninstalled, the process exits 0 and its state
/// files are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_local_cluster_up_rotate_down() {
    let dir = tempfile::tempdir().expect("dir");
    let state = dir.path().join("state");
    let log = std::fs::File::create(dir.path().join("up.log")).expect("log");
    let mut up = Up(Command::new(BIN)
        .args(["up", "--state"])
        .arg(&state)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("mountguard-local-cluster up"));
    let up_log = || std::fs::read_to_string(dir.path().join("up.log")).unwrap_or_default();
    let ready = poll("up: ready", Duration::from_secs(420), || {
        let mut done = up.0.try_wait().ok().flatten();
        let ready = state.join("ready").exists();
        async move {
            if let Some(s) = done.take() {
                return Some(Err(s));
            }
            ready.then_some(Ok(()))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", up_log()));
    if let Err(status) = ready {
        let text = up_log();
        if status.code() == Some(2) && text.contains("SKIPPED: ") {
            let line = text
                .lines()
                .find(|l| l.starts_with("SKIPPED: "))
                .unwrap_or("");
            println!("{line}");
            return;
        }
        panic!("up exited {status}:\n{text}");
    }
    let text = up_log();
    assert!(
        text.contains("mountguard is installed on a one-node cluster"),
        "{text}"
    );
    let env = env_of(&state);
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{k} in env: {env:?}"))
    };
    assert!(Path::new(&get("KUBECONFIG")).is_file());
    let metrics = http_get(&get("CONTROLLER_METRICS"))
        .await
        .expect("controller");
    assert!(metrics.contains("mountguard_"), "{metrics}");
    let agent = http_get(&get("AGENT_METRICS")).await.expect("agent");
    assert!(
        agent.contains("mountguard_agent_landlock_enforced 1"),
        "{agent}"
    );

    tutorial_commands_run(&state, dir.path()).await;

    let rotate = Command::new(BIN)
        .args(["rotate", "--state"])
        .arg(&state)
        .stdin(Stdio::null())
        .output()
        .expect("rotate");
    assert!(rotate.status.success(), "rotate: {rotate:?}");
    let alerts = format!("{}/api/v1/alerts", get("PROMETHEUS"));
    let seen = poll(
        "MountguardKubeletCachePinned firing for demo/worker",
        Duration::from_secs(240),
        || {
            let alerts = alerts.clone();
            async move {
                let body: Value = serde_json::from_str(&http_get(&alerts).await.ok()?).ok()?;
                body["data"]["alerts"].as_array()?.iter().find_map(|a| {
                    (a["labels"]["alertname"] == "MountguardKubeletCachePinned"
                        && a["labels"]["namespace"] == "demo"
                        && a["labels"]["pod"] == "worker"
                        && a["state"] == "firing")
                        .then(|| {
                            a["labels"]["source_name"]
                                .as_str()
                                .unwrap_or("")
                                .to_string()
                        })
                })
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", up_log()));
    assert_eq!(seen, "slurm-key");

    up.term();
    let status = poll("up to exit", Duration::from_secs(240), || {
        let s = up.0.try_wait().ok().flatten();
        async move { s }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", up_log()));
    assert!(status.success(), "up exited {status}:\n{}", up_log());
    let text = up_log();
    assert!(!text.contains("warning: helm uninstall"), "{text}");
    assert!(text.trim_end().ends_with("==> down"), "{text}");
    for f in ["ready", "env", "kubeconfig", "bin"] {
        assert!(!state.join(f).exists(), "{f} left");
    }
}
