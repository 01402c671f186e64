//! issue 31 §3: the agent's durations and sizes follow the grammar and
//! message the controller's do: `--max-file-size 16MiB` (and `16Mi`) is a
//! size; `--debounce -1s` or `--rescan-interval 1 minute` get the duration
//! message, not clap's "unexpected argument".

use std::process::Command;

/// Whether this test binary runs under user-mode emulation (the arm64 run
/// under qemu-aarch64 on an x86_64 host), as `it.rs` tells it.
fn emulated() -> bool {
    Command::new("uname")
        .arg("-m")
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).trim() != std::env::consts::ARCH)
}

fn agent(args: &[&str]) -> (Option<i32>, String) {
    let bin = env!("CARGO_BIN_EXE_mountguard-agent");
    let mut cmd = if emulated() {
        let mut c = Command::new("qemu-aarch64");
        c.args(["-L", "/usr/aarch64-linux-gnu", bin]);
        c
    } else {
        Command::new(bin)
    };
    let out = cmd.args(args).output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn error_hint_durations_and_sizes() {
    for (args, value) in [
        (&["run", "--debounce", "-1s"][..], "\"-1s\""),
        (
            &["run", "--rescan-interval", "1", "minute"][..],
            "\"1 minute\"",
        ),
    ] {
        let (code, err) = agent(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{value} is not a duration"))
                && err.contains("like 250ms, 60s, 5m or 1h")
                && !err.contains("unexpected argument"),
            "{args:?}: {err}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("pods")).unwrap();
    let root = dir.path().display().to_string();
    for size in ["16MiB", "16Mi", "16777216"] {
        let (code, err) = agent(&[
            "scan",
            "--kubelet-root",
            &root,
            "--node-name",
            "n",
            "--max-file-size",
            size,
        ]);
        assert!(!err.contains("--max-file-size"), "{size}: {err}");
        assert_ne!(code, Some(2), "{size}: {err}");
    }
    let (code, err) = agent(&["scan", "--max-file-size", "16 MiB"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("like 16777216, 16Mi or 16MiB"), "{err}");
}
