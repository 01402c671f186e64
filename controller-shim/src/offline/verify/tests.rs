//! Tests of `verify`: its gate, exit codes, inputs and their errors.

use super::*;
use crate::cli::{Cli, Command};
use clap::Parser;
use mountguard_core::testkit::{NodeB, ts};
use mountguard_inventory::Plugin;
use serde_json::Value;
use serde_json::json;
use std::path::Path;

fn objects() -> Value {
    json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"namespace": "n", "name": "cfg", "managedFields": [
             {"manager": "kubectl", "operation": "Update", "time": "2026-11-30T10:30:00Z"}]},
         "data": {"a.conf": "new"}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "n", "name": "ignored"}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"namespace": "n", "name": "p", "uid": "uid-p"},
         "spec": {"nodeName": "node-a",
            "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
            "containers": [{"name": "c", "image": "x"}]},
         "status": {"phase": "Running"}}
    ]})
}

fn inventory(content: &[u8]) -> String {
    let b = NodeB::new("node-a", ts("2026-11-30T11:00:00Z")).volume(
        "uid-p",
        Plugin::Configmap,
        "cfg",
        &[("a.conf", content)],
        ts("2026-11-30T10:00:00Z"),
    );
    serde_json::to_string(&b.inv).unwrap()
}

fn run(args: &[&str], stdin: &str) -> (Result<u8, Error>, String) {
    let (r, out, _) = run_err(args, stdin);
    (r, out)
}

/// `run`, with what went to standard error.
fn run_err(args: &[&str], stdin: &str) -> (Result<u8, Error>, String, String) {
    let mut argv = vec!["mountguard-controller", "verify"];
    argv.extend_from_slice(args);
    let Command::Verify(v) = Cli::try_parse_from(argv).unwrap().command else {
        unreachable!("verify parses as verify")
    };
    let v = Verify::from(v);
    let mut out = Vec::new();
    let mut err = Vec::new();
    let r = v.run(
        ts("2026-11-30T11:00:10Z"),
        [9u8; 32],
        &mut stdin.as_bytes(),
        &mut out,
        &mut err,
    );
    (
        r,
        String::from_utf8(out).unwrap(),
        String::from_utf8(err).unwrap(),
    )
}

fn write(dir: &Path, name: &str, content: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p.display().to_string()
}

#[test]
fn verify_refuses_input_with_nothing_to_judge() {
    let dir = tempfile::tempdir().unwrap();
    let inv = write(dir.path(), "inv.json", &inventory(b"new"));
    // (case, objects, what the error names)
    let no_pods = json!({"apiVersion": "v1", "kind": "List", "items": [
        objects()["items"][0].clone()]});
    let mut elsewhere = objects();
    elsewhere["items"][2]["spec"]["nodeName"] = json!("node-b");
    let cases = [
        (
            "an empty list",
            json!({"apiVersion": "v1", "kind": "List", "items": []}),
            "contain(s) no Pod",
        ),
        ("sources without pods", no_pods, "contain(s) no Pod"),
        (
            "no pod on the scanned node",
            elsewhere,
            "runs on node(s) node-a",
        ),
    ];
    for (case, objs, want) in cases {
        let (r, out) = run(
            &["--objects", "-", "--inventory", &inv, "--fail-on", "stale"],
            &objs.to_string(),
        );
        let e = r.expect_err(case);
        assert!(matches!(e, Error::NothingToJudge(_)), "{case}: {e}");
        assert!(e.to_string().contains(want), "{case}: {e}");
        assert!(out.is_empty(), "{case}: no verdict table: {out}");
    }
    // The same dump with a pod on the scanned node is judged.
    let (r, _) = run(
        &["--objects", "-", "--inventory", &inv],
        &objects().to_string(),
    );
    assert_eq!(r.unwrap(), 0);
}

/// issue 31 §1: a gate fails closed. An inventory aged past
/// --inventory-max-age fails `--fail-on stale` (and says so on stderr
/// with its age and the flag), unless --allow-unverifiable; no
/// --inventory is a usage error unless --spec-only.
#[test]
fn fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let inv = write(dir.path(), "inv.json", &inventory(b"new"));
    let objs = objects().to_string();
    let gate = ["--objects", "-", "--fail-on", "stale"];
    let with = |extra: &[&str]| -> Vec<String> {
        gate.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    let call = |extra: &[&str]| {
        let argv = with(extra);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        run_err(&argv, &objs)
    };

    // Fresh and young: passes, nothing on stderr.
    let (r, out, err) = call(&["--inventory", &inv]);
    assert_eq!(r.unwrap(), 0, "{out}");
    assert_eq!(err, "");

    // The same scan eight minutes later: every verdict is
    // Unverifiable/InventoryTooOld, and the gate fails.
    let later = ["--inventory", &inv, "--now", "2026-11-30T11:08:00Z"];
    let (r, out, err) = call(&later);
    assert_eq!(r.unwrap(), 1, "{out}");
    assert!(out.contains("Unverifiable/InventoryTooOld=1"), "{out}");
    let warning: Vec<&str> = err.lines().filter(|l| l.contains("node-a")).collect();
    assert_eq!(warning.len(), 1, "{err}");
    for part in [
        "inv.json",
        "8m0s",
        "older than --inventory-max-age 5m",
        "--inventory-max-age 8m",
    ] {
        assert!(warning[0].contains(part), "{part}: {err}");
    }
    assert!(err.contains("--allow-unverifiable"), "{err}");
    // ...unless the user says otherwise.
    let (r, _, _) = call(&[&later[..], &["--allow-unverifiable"]].concat());
    assert_eq!(r.unwrap(), 0);
    let (r, _, _) = call(&[&later[..], &["--inventory-max-age", "9m"]].concat());
    assert_eq!(r.unwrap(), 0);

    // No inventory at all: a usage error naming the way out.
    let (r, out, _) = call(&[]);
    let e = r.unwrap_err();
    assert!(matches!(e, Error::Usage(_)), "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains("--inventory")
            && msg.contains("mountguard-agent scan --output json")
            && msg.contains("--spec-only"),
        "{msg}"
    );
    assert!(out.is_empty());
    // Spec-only checks: what no inventory can vouch for does not fail.
    let (r, out, _) = call(&["--spec-only"]);
    assert_eq!(r.unwrap(), 0, "{out}");
    assert!(out.contains("Unverifiable/NoInventory=1"), "{out}");

    // The rule, state by state: Unverifiable fails every gate unless
    // allowed; NoInventory passes a spec-only gate.
    use mountguard_core::verdict::UnverifiableReason as U;
    for s in State::all() {
        for f in [FailOn::Stale, FailOn::Frozen, FailOn::Any] {
            let unverifiable = matches!(s, State::Unverifiable(_));
            assert_eq!(
                fails_gate(f, &s, false, false),
                f.matches(&s) || unverifiable,
                "{s:?} {f:?}"
            );
            assert_eq!(fails_gate(f, &s, true, false), f.matches(&s), "{s:?}");
            assert_eq!(
                fails_gate(f, &s, false, true),
                f.matches(&s) || (unverifiable && s != State::Unverifiable(U::NoInventory)),
                "{s:?}"
            );
        }
    }
}

/// issue 31 §3: a file that is not what its flag takes says which file
/// it is, what it looks like and the command that makes the right one.
#[test]
fn error_hint() {
    let dir = tempfile::tempdir().unwrap();
    let inv = write(dir.path(), "inv.json", &inventory(b"new"));
    let objs = write(dir.path(), "objs.json", &objects().to_string());
    let yaml = write(
        dir.path(),
        "objs.yaml",
        "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Pod\nkind: List\n",
    );
    let table = write(
        dir.path(),
        "pods.txt",
        "NAMESPACE   NAME    READY   STATUS    RESTARTS   AGE\nslurm       w-0     1/1     Running   0          3d\n",
    );
    let scan_table = write(
        dir.path(),
        "scan.txt",
        "POD UID  PLUGIN     VOLUME     DATA DIR  FILES  DIGEST  ERRORS\n",
    );
    let objects_fix = "kubectl get pods,secrets,configmaps -A -o json";
    let inventory_fix = "mountguard-agent scan --output json";
    // (objects, inventory, the file named, what it looks like, the fix)
    let cases = [
        (&yaml, &inv, &yaml, "YAML", objects_fix),
        (&table, &inv, &table, "a `kubectl get` table", objects_fix),
        (
            &inv,
            &objs,
            &inv,
            "node inventory",
            "pass it with --inventory",
        ),
        (
            &objs,
            &objs,
            &objs,
            "object dump (List)",
            "pass it with --objects",
        ),
        (
            &objs,
            &scan_table,
            &scan_table,
            "the table of `mountguard-agent scan`",
            inventory_fix,
        ),
        (&objs, &yaml, &yaml, "YAML", inventory_fix),
    ];
    for (o, i, file, looks, fix) in cases {
        let (r, out) = run(&["--objects", o, "--inventory", i], "");
        let e = r.unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::WrongInput { .. }), "{o} {i}: {msg}");
        assert!(msg.starts_with(&format!("{file}: ")), "{msg}");
        assert!(msg.contains(looks), "{looks}: {msg}");
        assert!(msg.contains(fix), "{fix}: {msg}");
        assert!(out.is_empty());
    }
    // The swapped pair also tells the inventory side's command.
    let (r, _) = run(&["--objects", &inv, "--inventory", &objs], "");
    assert!(r.unwrap_err().to_string().contains(objects_fix));
}

/// An immutable Secret deleted and recreated with the same content
/// (`replace --force`) after the pod registered: its volume shows the
/// current bytes, so the kubelet's cached copy holds them, and the env
/// var read from it is Fresh too; recreated with new content, both are
/// Stale.
#[test]
fn verify_judges_env_from_an_immutable_secret_recreated_with_the_same_content_fresh() {
    let objs = |value: &str| {
        json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Secret", "immutable": true,
             "metadata": {"namespace": "n", "name": "auth", "uid": "u2",
                "creationTimestamp": "2026-11-30T10:30:00Z"},
             "data": {"key": value}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"namespace": "n", "name": "p", "uid": "uid-p"},
             "spec": {"nodeName": "node-a",
                "volumes": [{"name": "auth", "secret": {"secretName": "auth"}}],
                "containers": [{"name": "c", "image": "x",
                    "env": [{"name": "KEY", "valueFrom":
                        {"secretKeyRef": {"name": "auth", "key": "key"}}}]}]},
             "status": {"phase": "Running", "startTime": "2026-11-30T09:00:00Z",
                "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0,
                    "image": "x", "imageID": "",
                    "state": {"running": {"startedAt": "2026-11-30T09:00:05Z"}}}]}}
        ]})
        .to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let inv = NodeB::new("node-a", ts("2026-11-30T11:00:00Z")).volume(
        "uid-p",
        Plugin::Secret,
        "auth",
        &[("key", b"same")],
        ts("2026-11-30T09:00:01Z"),
    );
    let inv = write(
        dir.path(),
        "node-a.json",
        &serde_json::to_string(&inv.inv).unwrap(),
    );
    let args = ["--objects", "-", "--inventory", &inv, "--output", "json"];
    let states = |out: &str| -> Vec<String> {
        let doc: Value = serde_json::from_str(out).unwrap();
        doc["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| format!("{} {}", v["subject"], v["state"]))
            .collect()
    };
    // base64 of "same" and "next".
    let (code, out) = run(
        &[&args[..], &["--fail-on", "stale"]].concat(),
        &objs("c2FtZQ=="),
    );
    assert_eq!(code.unwrap(), 0, "{out}");
    assert!(
        states(&out).iter().all(|s| s.ends_with("\"Fresh\"")),
        "{:?}",
        states(&out)
    );
    let (code, out) = run(
        &[&args[..], &["--fail-on", "stale"]].concat(),
        &objs("bmV4dA=="),
    );
    assert_eq!(code.unwrap(), 1, "{out}");
    assert!(
        states(&out).iter().all(|s| s.ends_with("\"Stale\"")),
        "{:?}",
        states(&out)
    );
}

#[test]
fn verify_reports_stale_content_and_exit_codes_follow_fail_on() {
    let dir = tempfile::tempdir().unwrap();
    let inv_old = write(dir.path(), "old.json", &inventory(b"old"));
    let inv_new = write(dir.path(), "new.json", &inventory(b"new"));
    let objs = objects().to_string();

    let (code, out) = run(
        &[
            "--objects",
            "-",
            "--inventory",
            &inv_old,
            "--fail-on",
            "stale",
        ],
        &objs,
    );
    assert_eq!(code.unwrap(), 1, "{out}");
    assert!(
        out.contains("Stale") && out.contains("n/p") && out.contains("volume cfg"),
        "{out}"
    );
    assert!(out.contains("differing paths: a.conf"), "{out}");
    assert!(out.contains("Stale/Unknown=1"), "{out}");
    // The advice (issue 31 §2) in the table and the JSON.
    let advice = "n/p volume cfg: Replace the pod so the kubelet sets the volume up again";
    assert!(out.contains(advice), "{out}");
    let (_, json_out) = run(
        &[
            "--objects",
            "-",
            "--inventory",
            &inv_old,
            "--output",
            "json",
        ],
        &objs,
    );
    let doc: Value = serde_json::from_str(&json_out).unwrap();
    assert!(
        doc["verdicts"][0]["advice"]
            .as_str()
            .unwrap()
            .starts_with("Replace the pod"),
        "{json_out}"
    );

    let (code, out) = run(
        &[
            "--objects",
            "-",
            "--inventory",
            &inv_old,
            "--fail-on",
            "frozen",
        ],
        &objs,
    );
    assert_eq!(code.unwrap(), 0, "{out}");

    let (code, out) = run(
        &[
            "--objects",
            "-",
            "--inventory",
            &inv_new,
            "--fail-on",
            "any",
            "--output",
            "json",
        ],
        &objs,
    );
    assert_eq!(code.unwrap(), 0, "{out}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    let v = &doc["verdicts"][0];
    assert_eq!(v["state"], "Fresh");
    assert_eq!(v["namespace"], "n");
    assert_eq!(v["volume"], "cfg");
    assert_eq!(v["sourceKind"], "ConfigMap");
    assert_eq!(v["expected"], v["observed"]);
    assert_eq!(v["expected"].as_str().unwrap().len(), 12);
    assert_eq!(v["files"][0]["path"], "a.conf");
    assert_eq!(doc["summary"]["ignoredItems"], 1);

    // A grace period longer than the change's age turns it into
    // Propagating.
    let (code, out) = run(
        &[
            "--objects",
            "-",
            "--inventory",
            &inv_old,
            "--grace",
            "1h",
            "--fail-on",
            "stale",
        ],
        &objs,
    );
    assert_eq!(code.unwrap(), 0, "{out}");
    assert!(out.contains("Propagating"), "{out}");
}

#[test]
fn bad_input_names_the_file_and_the_place() {
    let dir = tempfile::tempdir().unwrap();
    let inv = write(dir.path(), "inv.json", &inventory(b"x"));
    let full = objects().to_string();

    // Truncated JSON: line and column.
    let truncated = write(dir.path(), "trunc.json", &full[..full.len() / 2]);
    let (r, _) = run(&["--objects", &truncated, "--inventory", &inv], "");
    let e = r.unwrap_err();
    assert!(matches!(e, Error::Json { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&truncated) && msg.contains("line 1, column"),
        "{msg}"
    );

    // A bad item: index, kind, namespace/name.
    let mut doc = objects();
    doc["items"][2]["spec"]["volumes"] = json!("not a list");
    let bad = write(dir.path(), "bad.json", &doc.to_string());
    let msg = run(&["--objects", &bad, "--inventory", &inv], "")
        .0
        .unwrap_err()
        .to_string();
    assert!(msg.contains("bad.json: items[2] (Pod n/p)"), "{msg}");

    let mut doc = objects();
    doc["items"][0]["metadata"]["name"] = json!(null);
    let bad = write(dir.path(), "noname.json", &doc.to_string());
    let msg = run(&["--objects", &bad, "--inventory", &inv], "")
        .0
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("items[0]") && msg.contains("metadata.name is missing"),
        "{msg}"
    );

    let no_kind = write(dir.path(), "nokind.json", r#"{"items":[{"metadata":{}}]}"#);
    let msg = run(&["--objects", &no_kind, "--inventory", &inv], "")
        .0
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("items[0]") && msg.contains("no \"kind\""),
        "{msg}"
    );
    // Named by its position, not by a kind and name it does not have.
    assert!(!msg.contains('?'), "{msg}");
    let no_kind = write(dir.path(), "nokind1.json", r#"{"metadata":{"name":"x"}}"#);
    let msg = run(&["--objects", &no_kind, "--inventory", &inv], "")
        .0
        .unwrap_err()
        .to_string();
    assert_eq!(
        msg,
        format!("{no_kind}: top-level object: no \"kind\" field"),
        "{msg}"
    );

    let not_obj = write(dir.path(), "arr.json", "[1,2]");
    let msg = run(&["--objects", &not_obj, "--inventory", &inv], "")
        .0
        .unwrap_err()
        .to_string();
    assert!(msg.contains("expected a JSON object"), "{msg}");

    // Inventories: wrong schema, wrong shape, missing file.
    let objs = write(dir.path(), "objs.json", &full);
    let wrong = write(
        dir.path(),
        "schema.json",
        &inventory(b"x").replace("node-inventory/v1", "node-inventory/v9"),
    );
    let msg = run(&["--objects", &objs, "--inventory", &wrong], "")
        .0
        .unwrap_err()
        .to_string();
    assert!(msg.contains("schema.json") && msg.contains("v9"), "{msg}");
    let shape = write(
        dir.path(),
        "shape.json",
        r#"{"schema": "mountguard.io/node-inventory/v1"}"#,
    );
    let msg = run(&["--objects", &objs, "--inventory", &shape], "")
        .0
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("shape.json: document: not a node inventory"),
        "{msg}"
    );
    let missing = dir.path().join("nope.json").display().to_string();
    let e = run(&["--objects", &objs, "--inventory", &missing], "")
        .0
        .unwrap_err();
    assert!(
        matches!(e, Error::Io { .. }) && e.to_string().contains("nope.json"),
        "{e}"
    );

    // A key file that is too short.
    let key = write(dir.path(), "key", "short");
    let msg = run(
        &[
            "--objects",
            &objs,
            "--fingerprint-key-file",
            &key,
            "--spec-only",
        ],
        "",
    )
    .0
    .unwrap_err()
    .to_string();
    assert!(msg.contains("at least 16"), "{msg}");
}

#[test]
fn several_inventories_of_one_node_keep_the_newest_and_arrays_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let older = NodeB::new("node-a", ts("2026-11-30T10:59:00Z")).volume(
        "uid-p",
        Plugin::Configmap,
        "cfg",
        &[("a.conf", b"old")],
        ts("2026-11-30T10:00:00Z"),
    );
    let newer = inventory(b"new");
    let arr = format!("[{}]", serde_json::to_string(&older.inv).unwrap());
    let a = write(dir.path(), "arr.json", &arr);
    let b = write(dir.path(), "new.json", &newer);
    let objs = write(dir.path(), "objs.json", &objects().to_string());
    for order in [[&a, &b], [&b, &a]] {
        let (code, out) = run(
            &[
                "--objects",
                &objs,
                "--inventory",
                order[0],
                order[1],
                "--fail-on",
                "any",
            ],
            "",
        );
        assert_eq!(code.unwrap(), 0, "{out}");
    }
}
