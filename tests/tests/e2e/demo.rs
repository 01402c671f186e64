//! The demo's seed scenario (in-process agents and controller) and its
//! `--json` summary, with remediation on as the demo runs by default; and
//! the tutorial's commands, run as the demo binary.

use mountguard_tests::demo::{DemoOptions, Narrator, Remediation, run_seed};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_seed_scenario_summary() {
    let opts = DemoOptions {
        remediation: Remediation::On,
        ..DemoOptions::default()
    };
    let mut say = Narrator::new(true);
    let result = run_seed(&opts, &mut say).await;
    let summary = result.unwrap_or_else(|e| panic!("{e}\nnarration:\n{}", say.lines().join("\n")));
    let json = serde_json::to_value(&summary).unwrap();

    assert_eq!(json["scenario"], "seed");
    assert_eq!(json["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(json["pinnedNode"], "node-0");
    assert_eq!(json["pinningPod"], "slurm/slurm-auth-check");
    for s in json["servedAfterRotation"].as_array().unwrap() {
        assert_eq!(s["key"], "old", "{s}");
    }

    // As Slurm 26.05 shows a slurmd on the old key: not DOWN, and no
    // registration since the rotation.
    let slurm = json["slurmStates"].as_object().unwrap();
    assert_eq!(slurm.len(), 3, "{slurm:?}");
    for (host, state) in slurm {
        assert_eq!(state[0], "IDLE", "{host}: {state}");
        assert_eq!(
            json["slurmRegisteredSinceRotation"][host], false,
            "{host}: {json}"
        );
    }

    // Verdicts: ImmutableCachePinned on node A naming the pinning pod,
    // ImmutableCache elsewhere.
    let key_verdicts: Vec<&serde_json::Value> = json["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["subject"] == "volume slurm-etc" && v["state"] == "Stale")
        .collect();
    assert_eq!(key_verdicts.len(), 3, "{key_verdicts:?}");
    for v in &key_verdicts {
        if v["node"] == "node-0" {
            assert_eq!(v["cause"], "ImmutableCachePinned", "{v}");
            assert!(
                v["pinnedBy"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|p| p.as_str().unwrap().ends_with("slurm-auth-check")),
                "{v}"
            );
        } else {
            assert_eq!(v["cause"], "ImmutableCache", "{v}");
        }
    }

    // Events recorded by the API double.
    let events = json["events"].as_array().unwrap();
    let has = |reason: &str, object: &str| {
        events.iter().any(|e| {
            e["reason"] == reason
                && e["object"] == object
                && !e["message"].as_str().unwrap().is_empty()
        })
    };
    assert!(
        has("KubeletCachePinned", "Pod slurm/slurm-worker-slinky-0"),
        "{events:?}"
    );
    assert!(
        has("StaleMount", "Pod slurm/slurm-worker-slinky-1"),
        "{events:?}"
    );
    assert!(
        has("StaleMount", "Pod slurm/slurm-worker-slinky-2"),
        "{events:?}"
    );

    // Metric samples scraped from /metrics.
    let metrics = json["metrics"].as_array().unwrap();
    let sample = |pod: &str, cause: &str| {
        metrics.iter().any(|m| {
            m["name"] == "mountguard_mount_state"
                && m["value"] == 1.0
                && m["labels"]["pod"] == pod
                && m["labels"]["volume"] == "slurm-etc"
                && m["labels"]["cause"] == cause
        })
    };
    assert!(
        sample("slurm-worker-slinky-0", "ImmutableCachePinned"),
        "{metrics:?}"
    );
    assert!(sample("slurm-worker-slinky-1", "ImmutableCache"));
    assert!(sample("slurm-worker-slinky-2", "ImmutableCache"));
    assert!(
        metrics
            .iter()
            .all(|m| m["name"].as_str().unwrap().starts_with("mountguard_"))
    );

    // Remediation: the two workers a replacement can fix went through every
    // phase and are served the new key; nothing was attempted on node A.
    assert_eq!(json["remediation"], "on");
    let attempts = json["attempts"].as_array().unwrap();
    let mut repaired: Vec<&str> = attempts
        .iter()
        .filter(|a| a["result"] == "Succeeded")
        .map(|a| a["node"].as_str().unwrap())
        .collect();
    repaired.sort();
    assert_eq!(repaired, vec!["node-1", "node-2"], "{attempts:?}");
    for a in attempts {
        assert_eq!(
            a["phases"],
            serde_json::json!(crate::remediation::FULL_RUN),
            "{a}"
        );
    }
    let repl = json["replacements"].as_array().unwrap();
    for node in ["node-1", "node-2"] {
        assert!(
            repl.iter().any(|r| r["node"] == node && r["key"] == "new"),
            "{repl:?}"
        );
    }
    assert!(!repl.iter().any(|r| r["node"] == "node-0"), "{repl:?}");

    // Within 5 s of the first report after the grace period.
    let t = &summary.timings;
    let bound = t.grace_seconds + opts.heartbeat.as_secs_f64() + 5.0;
    assert!(t.metric_after_rotation_seconds <= bound, "{t:?}");
    assert!(t.events_after_rotation_seconds <= bound, "{t:?}");
    // The narration names the rotation and the pinning pod.
    let text = say.lines().join("\n");
    assert!(text.contains("ROTATION"), "{text}");
    assert!(text.contains("pinned by slurm-auth-check"), "{text}");
    assert!(
        text.contains("Event KubeletCachePinned on NodeSet slurm/slurm-worker-slinky"),
        "{text}"
    );
}

/// The printed narration: a heading per act, in order; every line within
/// the columns; the Slurm drain reason once per attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_narration_reads_at_a_glance() {
    use mountguard_tests::demo::{ACTS, COLUMNS};
    let opts = DemoOptions {
        remediation: Remediation::On,
        ..DemoOptions::default()
    };
    let mut say = Narrator::new(true);
    let result = run_seed(&opts, &mut say).await;
    let printed = say.printed().join("\n");
    result.unwrap_or_else(|e| panic!("{e}\nnarration:\n{printed}"));
    let headings: Vec<&str> = say
        .printed()
        .iter()
        .filter(|l| l.starts_with("=== "))
        .map(String::as_str)
        .collect();
    let want: Vec<String> = ACTS
        .iter()
        .enumerate()
        .map(|(i, a)| format!("=== {}/{} {a} ===", i + 1, ACTS.len()))
        .collect();
    assert_eq!(headings, want, "{printed}");
    for l in say.printed() {
        assert!(l.chars().count() <= COLUMNS, "too wide:\n{l}");
    }
    // Each attempt (one per pod in the demo) drains one Slurm node:
    // mountguard's drain reason is shown once, whichever of its phases the
    // narration caught first (a 100 ms poll can miss a short Draining
    // phase), and again only as Slurm rewrote it (" : Not responding"
    // appended when the evicted slurmd's node went DOWN); no reason is
    // printed twice in a row for one attempt.
    let attempt_pod = |l: &str| {
        l.split("attempt for ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .map(str::to_string)
    };
    let lines = say.lines();
    let pods: std::collections::BTreeSet<String> =
        lines.iter().filter_map(|l| attempt_pod(l)).collect();
    assert!(pods.len() >= 2, "{printed}");
    for pod in &pods {
        let reasons: Vec<&str> = lines
            .iter()
            .filter(|l| attempt_pod(l).as_ref() == Some(pod))
            .filter_map(|l| l.split("reason \"").nth(1))
            .filter_map(|rest| rest.split('"').next())
            .collect();
        let ours: Vec<&&str> = reasons
            .iter()
            .filter(|r| r.starts_with("mountguard:"))
            .collect();
        let written: std::collections::BTreeSet<&str> = ours
            .iter()
            .map(|r| mountguard_core::remediation::machine::reason_as_written(r))
            .collect();
        assert_eq!(written.len(), 1, "{pod}: {reasons:?}\n{printed}");
        assert!(ours.len() <= 2, "{pod}: {reasons:?}\n{printed}");
        assert!(
            reasons.windows(2).all(|w| w[0] != w[1]),
            "{pod}: a reason repeated: {reasons:?}\n{printed}"
        );
    }
}

/// Every command of docs/tutorials/demo.md, run as the binary `cargo run`
/// builds (the three at once): each exits 0; the narrated runs end with
/// their `done:` line and say what the tutorial says (repair on by
/// default, the two hand replacements with `--detect-only`); `--json`
/// prints the summary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_tutorials_commands_run() {
    const CARGO_RUN: &str = "cargo run -p mountguard-tests --bin mountguard-demo";
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let page = std::fs::read_to_string(repo.join("docs/tutorials/demo.md")).unwrap();
    let runs: Vec<Vec<String>> = mountguard_tests::docs::shell_blocks(&page)
        .into_iter()
        .flat_map(|b| b.commands)
        .map(|c| {
            let code = c.split(" #").next().unwrap().trim().to_string();
            code.strip_prefix(CARGO_RUN)
                .unwrap_or_else(|| panic!("not the demo: {c}"))
                .trim()
                .trim_start_matches("--")
                .split_whitespace()
                .map(String::from)
                .collect()
        })
        .collect();
    assert_eq!(
        runs,
        [
            vec![],
            vec!["--detect-only".to_string()],
            vec!["--json".to_string()]
        ],
        "the tutorial's commands"
    );
    let outs = futures::future::join_all(runs.iter().map(|args| {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_mountguard-demo"))
            .args(args)
            .kill_on_drop(true)
            .output()
    }))
    .await;
    for (args, out) in runs.iter().zip(outs) {
        let out = out.expect("the demo runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "demo {args:?}: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        match args.first().map(String::as_str) {
            Some("--json") => {
                let summary: serde_json::Value = serde_json::from_str(&stdout)
                    .unwrap_or_else(|e| panic!("--json: {e}\n{stdout}"));
                assert_eq!(summary["scenario"], "seed", "{summary}");
            }
            other => {
                let last = stdout.lines().rev().find(|l| !l.trim().is_empty());
                assert!(
                    last.is_some_and(|l| l.contains("done:")),
                    "demo {other:?} ends with its done line:\n{stdout}"
                );
                assert_eq!(
                    stdout.contains("remediation is off"),
                    other == Some("--detect-only"),
                    "demo {other:?}: repair runs by default only:\n{stdout}"
                );
                if other == Some("--detect-only") {
                    assert!(
                        stdout.contains("replaced the slurmd pod on node-0"),
                        "the hand replacements:\n{stdout}"
                    );
                }
            }
        }
    }
}
