//! issue 31 §3: durations and sizes have one grammar and one message on
//! every command line: a duration the shell split (`--timeout 10 minutes`)
//! or one starting with `-` gets the duration message, not clap's
//! "unexpected argument"; sizes take the agent's and the controller's
//! forms alike (`32Mi`, `32MiB`).

use std::process::Command;

fn controller(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mountguard-controller"))
        .args(args)
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn error_hint_durations_and_sizes() {
    for (args, value) in [
        (
            &["wait", "secret/ns/s", "--timeout", "10", "minutes"][..],
            "\"10 minutes\"",
        ),
        (&["wait", "secret/ns/s", "--interval", "-1s"][..], "\"-1s\""),
        (
            &["status", "--request-timeout", "5", "seconds"][..],
            "\"5 seconds\"",
        ),
        (
            &["verify", "--objects", "o.json", "--grace", "3", "min"][..],
            "\"3 min\"",
        ),
    ] {
        let (code, err) = controller(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(
            err.contains(&format!("{value} is not a duration"))
                && err.contains("like 250ms, 60s, 5m or 1h")
                && !err.contains("unexpected argument"),
            "{args:?}: {err}"
        );
    }
    // Sizes: the same grammar as the agent's --max-file-size.
    let (code, err) = controller(&["status", "--max-response-size", "16 MiB"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("like 16777216, 16Mi or 16MiB"), "{err}");
}
