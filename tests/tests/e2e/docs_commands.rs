//! Every `kubectl mountguard status` and `wait` command of the user docs
//! (runbooks, how-to guides, tutorials, troubleshooting, the install
//! guide, the kind walkthrough, the README), run as the kubectl plugin
//! against the cluster in a box with everything Fresh. A command with a
//! flag the plugin does not have, or a value it refuses, fails here. The
//! placeholders become this cluster's names: a namespace `slurm`, a node
//! `node-0`, a wait target the Secret `slurm/slurm-auth-slurm`.

use std::collections::BTreeSet;
use std::path::Path;

use mountguard_tests::cluster::STATUS_READER_TOKEN;
use mountguard_tests::mountguard::{clean_command as command, kubectl_plugin};

use crate::harness::{Options, System, wait_all_fresh};

/// The user pages.
fn pages(repo: &Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![
        repo.join("README.md"),
        repo.join("docs/troubleshooting.md"),
        repo.join("docs/install.md"),
        repo.join("docs/kind-walkthrough.md"),
        repo.join("docs/rotation.md"),
    ];
    for dir in ["docs/runbooks", "docs/how-to", "docs/tutorials"] {
        for e in std::fs::read_dir(repo.join(dir)).unwrap() {
            out.push(e.unwrap().path());
        }
    }
    out
}

/// The plugin commands of `text`: lines of code blocks and inline code
/// that start with `kubectl mountguard status` or `wait`, up to a pipe,
/// redirection, comment or line continuation.
fn commands(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let spans: Vec<&str> = if fenced {
            vec![line.trim()]
        } else {
            line.split('`').skip(1).step_by(2).collect()
        };
        for s in spans {
            if let Some(rest) = s.strip_prefix("kubectl mountguard ") {
                let cut = rest
                    .split(['|', '>', '#', '\\'])
                    .next()
                    .unwrap_or("")
                    .trim();
                if cut.starts_with("status") || cut.starts_with("wait ") {
                    found.push(cut.to_string());
                }
            }
        }
    }
    found
}

/// `cmd` with this cluster's names, as arguments.
fn arguments(cmd: &str, token_file: &Path) -> Vec<String> {
    let words: Vec<String> = cmd
        .split_whitespace()
        .map(|w| w.trim_matches('"').to_string())
        .collect();
    let mut out = Vec::new();
    let mut it = words.into_iter().peekable();
    let sub = it.next().unwrap();
    out.push(sub.clone());
    if sub == "wait" {
        it.next(); // the target
        out.push("secret/slurm/slurm-auth-slurm".into());
    }
    while let Some(w) = it.next() {
        let value = |it: &mut std::iter::Peekable<std::vec::IntoIter<String>>| it.next();
        match w.as_str() {
            "--namespace" => {
                value(&mut it);
                out.extend(["--namespace".into(), "slurm".into()]);
            }
            "--node" => {
                value(&mut it);
                out.extend(["--node".into(), "node-0".into()]);
            }
            "--timeout" => {
                value(&mut it);
                out.extend(["--timeout".into(), "60s".into()]);
            }
            "--token-file" => {
                value(&mut it);
                out.extend(["--token-file".into(), token_file.display().to_string()]);
            }
            // A rotation's own UID: this cluster's Secret was not rotated.
            "--uid" => {
                value(&mut it);
            }
            _ => out.push(w),
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kubectl_mountguard_command_of_the_user_docs_runs_on_a_fresh_cluster() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let sys = System::start(Options::default()).await;
    wait_all_fresh(&sys).await;
    sys.expose_metrics();
    let plugin = kubectl_plugin(sys.cluster.dir()).unwrap();
    let token_file = sys.cluster.dir().join("reader.token");
    std::fs::write(&token_file, STATUS_READER_TOKEN).unwrap();
    let mut runs: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut seen = 0;
    for page in pages(&repo) {
        for cmd in commands(&std::fs::read_to_string(&page).unwrap()) {
            seen += 1;
            runs.insert(arguments(&cmd, &token_file));
        }
    }
    assert!(seen >= 30 && runs.len() >= 8, "{seen} commands, {runs:?}");
    for args in &runs {
        let out = command(&plugin)
            .env("KUBECONFIG", sys.cluster.kubeconfig_path())
            .args(args)
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "kubectl mountguard {}\nstdout: {}\nstderr: {}\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            sys.logs()
        );
    }
    sys.shutdown().await;
}

#[test]
fn commands_are_read_from_code_blocks_and_inline_code() {
    let text = "Run `kubectl mountguard status --namespace NS --output json | jq .` now.\n\
                ```sh\nkubectl mountguard wait secret/NS/NAME --timeout 15m   # the gate\n\
                kubectl get pods\n```\n";
    assert_eq!(
        commands(text),
        [
            "status --namespace NS --output json",
            "wait secret/NS/NAME --timeout 15m"
        ]
    );
    let a = arguments(
        "wait secret/\"$NS\"/\"$NAME\" --uid \"$uid\" --timeout 30m",
        Path::new("/t"),
    );
    assert_eq!(
        a,
        ["wait", "secret/slurm/slurm-auth-slurm", "--timeout", "60s"]
    );
}
