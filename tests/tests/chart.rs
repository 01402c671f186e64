//! The Helm chart (`charts/mountguard`), checked against the Kubernetes API
//! types and against the running binaries.
//!
//! - Every object the chart renders, in every scenario of
//!   `charts/tests/render.py` (rendered by the real Helm engine from the PyPI
//!   package helm-python-sdk), is parsed into its k8s-openapi type and
//!   serialized back; a field that does not survive the round trip is a field
//!   the API server does not know (a typo like `mountPropogation` would be
//!   dropped silently by a lenient client and by the API server).
//!   cert-manager and monitoring.coreos.com objects have no k8s-openapi type;
//!   `charts/tests/validate.py` checks them against the upstream CRD schemas.
//! - Every `mountguard_*` metric name in the chart's alert expressions, in
//!   the Grafana dashboard's queries and in the series of the alerts' unit
//!   tests (`charts/tests/promtool/alerts_test.yaml`) is
//!   exported by a running binary: the agent is started on an empty kubelet
//!   root and scraped; the controller is started against the API server
//!   double (idle, then with one node and one pod so that the per-node and
//!   per-mount families have samples) and scraped. While the controller has
//!   no `run` command, that half is skipped with a loud message.
//!
//! Needs `python3` with helm-python-sdk and pyyaml (scripts/test.sh installs
//! them) and the workspace binaries built (`cargo nextest run --workspace`
//! builds them; `cargo build --bins` otherwise).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use mountguard_tests::apiserver::resources;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Renders every scenario into a temporary directory: scenario -> objects.
fn render_all() -> (tempfile::TempDir, BTreeMap<String, Vec<(String, Value)>>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("python3")
        .arg(repo().join("charts/tests/render.py"))
        .arg("--out")
        .arg(dir.path())
        .output()
        .expect("python3 must be installed");
    assert!(
        out.status.success(),
        "rendering the chart failed (does `pip install helm-python-sdk pyyaml` need to run? \
         see scripts/test.sh):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut scenarios = BTreeMap::new();
    for entry in std::fs::read_dir(dir.path()).expect("read out dir") {
        let entry = entry.expect("entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let mut objects = Vec::new();
        let mut files: Vec<_> = std::fs::read_dir(entry.path())
            .expect("scenario dir")
            .map(|e| e.expect("entry").path())
            .collect();
        files.sort();
        for f in files {
            let text = std::fs::read_to_string(&f).expect("read object");
            let v: Value = serde_json::from_str(&text).expect("rendered JSON");
            objects.push((f.file_name().unwrap().to_string_lossy().into_owned(), v));
        }
        scenarios.insert(name, objects);
    }
    (dir, scenarios)
}

/// Paths present in `orig` whose value is missing or different in `back`.
fn dropped(orig: &Value, back: &Value, path: &str, out: &mut Vec<String>) {
    match (orig, back) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                let p = format!("{path}.{k}");
                match b.get(k) {
                    Some(w) => dropped(v, w, &p, out),
                    None if v.is_null() => {}
                    None => out.push(format!("{p} (unknown field)")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                dropped(v, w, &format!("{path}[{i}]"), out);
            }
        }
        (Value::Number(a), Value::Number(b)) if a.as_f64() == b.as_f64() => {}
        (a, b) if a == b => {}
        (a, b) => out.push(format!("{path}: {a} became {b}")),
    }
}

fn roundtrip<T: DeserializeOwned + Serialize>(v: &Value) -> Result<Vec<String>, String> {
    let typed: T = serde_json::from_value(v.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    dropped(v, &back, "", &mut out);
    Ok(out)
}

/// Round-trips one rendered object through its k8s-openapi type. `None`:
/// no k8s-openapi type (custom resources checked elsewhere).
fn check_object(v: &Value) -> Option<Result<Vec<String>, String>> {
    let api = v["apiVersion"].as_str().unwrap_or_default();
    let kind = v["kind"].as_str().unwrap_or_default();
    Some(match (api, kind) {
        ("v1", "ServiceAccount") => roundtrip::<ServiceAccount>(v),
        ("v1", "Secret") => roundtrip::<Secret>(v),
        ("v1", "ConfigMap") => roundtrip::<ConfigMap>(v),
        ("networking.k8s.io/v1", "NetworkPolicy") => roundtrip::<NetworkPolicy>(v),
        ("v1", "Service") => roundtrip::<Service>(v),
        ("apps/v1", "DaemonSet") => roundtrip::<DaemonSet>(v),
        ("apps/v1", "Deployment") => roundtrip::<Deployment>(v),
        ("policy/v1", "PodDisruptionBudget") => roundtrip::<PodDisruptionBudget>(v),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => roundtrip::<ClusterRole>(v),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            roundtrip::<ClusterRoleBinding>(v)
        }
        ("rbac.authorization.k8s.io/v1", "Role") => roundtrip::<Role>(v),
        ("rbac.authorization.k8s.io/v1", "RoleBinding") => roundtrip::<RoleBinding>(v),
        ("admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration") => {
            roundtrip::<ValidatingWebhookConfiguration>(v)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicy") => {
            roundtrip::<ValidatingAdmissionPolicy>(v)
        }
        ("admissionregistration.k8s.io/v1", "ValidatingAdmissionPolicyBinding") => {
            roundtrip::<ValidatingAdmissionPolicyBinding>(v)
        }
        ("cert-manager.io/v1", "Certificate" | "Issuer")
        | ("monitoring.coreos.com/v1", "ServiceMonitor" | "PodMonitor" | "PrometheusRule") => {
            return None;
        }
        _ => Err(format!("no k8s-openapi type mapped for {api} {kind}")),
    })
}

#[test]
fn unknown_field_detection_catches_a_misspelt_field() {
    // The round trip is a real check: a misspelt field inside a pod template,
    // a wrong value type and a wrong kind are all reported.
    let good = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "x"},
        "spec": {"selector": {"matchLabels": {"a": "b"}},
                 "template": {"metadata": {"labels": {"a": "b"}},
                              "spec": {"containers": [{"name": "c", "image": "i",
                                "volumeMounts": [{"name": "v", "mountPath": "/v",
                                                  "mountPropagation": "HostToContainer"}]}]}}}
    });
    assert_eq!(check_object(&good), Some(Ok(vec![])));
    let mut typo = good.clone();
    let mount = &mut typo["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0];
    mount["mountPropogation"] = mount["mountPropagation"].take();
    mount.as_object_mut().unwrap().remove("mountPropagation");
    let problems = check_object(&typo).unwrap().unwrap();
    assert_eq!(
        problems,
        [".spec.template.spec.containers[0].volumeMounts[0].mountPropogation (unknown field)"]
    );
    let mut bad_type = good.clone();
    bad_type["spec"]["template"]["spec"]["hostPID"] = Value::from("false");
    assert!(check_object(&bad_type).unwrap().is_err());
    let mut bad_kind = good;
    bad_kind["kind"] = Value::from("DeamonSet");
    assert!(check_object(&bad_kind).unwrap().is_err());
}

#[test]
fn every_rendered_object_parses_into_its_api_type_without_unknown_fields() {
    let (_dir, scenarios) = render_all();
    for expected in [
        "default",
        "remediation-on",
        "remediation-dry-run",
        "tls-user-secret",
        "plaintext",
        "monitoring-with-api",
        "replicas-2",
    ] {
        assert!(
            scenarios.contains_key(expected),
            "scenario {expected} not rendered"
        );
    }
    let mut failures = Vec::new();
    let mut typed = 0;
    let mut kinds = BTreeSet::new();
    for (scenario, objects) in &scenarios {
        assert!(
            objects.len() >= 10,
            "{scenario}: only {} objects",
            objects.len()
        );
        for (file, v) in objects {
            match check_object(v) {
                None => {}
                Some(Ok(problems)) if problems.is_empty() => {
                    typed += 1;
                    kinds.insert(v["kind"].as_str().unwrap_or_default().to_string());
                }
                Some(Ok(problems)) => failures.push(format!("{scenario}/{file}: {problems:?}")),
                Some(Err(e)) => failures.push(format!("{scenario}/{file}: {e}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    for kind in [
        "DaemonSet",
        "Deployment",
        "Service",
        "ServiceAccount",
        "Secret",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "ConfigMap",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ] {
        assert!(kinds.contains(kind), "no {kind} was checked");
    }
    assert!(typed > 80, "only {typed} objects checked");
}

// ------------------------------------------------------------- metric names

/// Every `mountguard_*` name in `text` (a name starts after a character
/// that cannot be part of one).
fn mountguard_names(text: &str, names: &mut BTreeSet<String>) {
    let mut rest = text;
    while let Some(i) = rest.find("mountguard_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let before = rest[..i].chars().next_back();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
            names.insert(tail[..end].to_string());
        }
        rest = &tail[end..];
    }
}

/// Every `mountguard_*` name in the PrometheusRule's expressions.
fn alert_metric_names(scenarios: &BTreeMap<String, Vec<(String, Value)>>) -> BTreeSet<String> {
    let objects = &scenarios["monitoring-with-api"];
    let rules: Vec<&Value> = objects
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["kind"] == "PrometheusRule")
        .collect();
    assert_eq!(rules.len(), 1, "one PrometheusRule");
    let mut names = BTreeSet::new();
    for group in rules[0]["spec"]["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            mountguard_names(rule["expr"].as_str().expect("expr"), &mut names);
        }
    }
    names
}

/// Every `mountguard_*` name in the dashboard ConfigMap's queries.
fn dashboard_metric_names(scenarios: &BTreeMap<String, Vec<(String, Value)>>) -> BTreeSet<String> {
    let dashboards: Vec<&Value> = scenarios["monitoring-with-api"]
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["kind"] == "ConfigMap" && v["data"]["mountguard.json"].is_string())
        .collect();
    assert_eq!(dashboards.len(), 1, "one dashboard ConfigMap");
    let dash: Value =
        serde_json::from_str(dashboards[0]["data"]["mountguard.json"].as_str().unwrap())
            .expect("dashboard JSON");
    let mut names = BTreeSet::new();
    let mut panels: Vec<&Value> = dash["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = panels.pop() {
        for t in p["targets"].as_array().into_iter().flatten() {
            mountguard_names(t["expr"].as_str().unwrap_or_default(), &mut names);
        }
        panels.extend(p["panels"].as_array().into_iter().flatten());
    }
    names
}

/// The family of a histogram's series name (`x_bucket` -> `x`).
fn family(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// Every `metrics.rs` under `dir`: the controller's registry and shared
/// families (`runtime/metrics.rs`) and each component's own.
fn metrics_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read a source folder") {
        let path = entry.expect("a folder entry").path();
        if path.is_dir() {
            metrics_files(&path, out);
        } else if path.file_name().is_some_and(|n| n == "metrics.rs") {
            out.push(path);
        }
    }
}

/// Metric names registered in the controller's `metrics.rs` files (the
/// shared `runtime/metrics.rs` and each component's beside what it
/// measures): the `o("name", ..)` options (prefixed `mountguard_`) and the
/// full `"mountguard_..."` names.
fn registered_controller_names() -> BTreeSet<String> {
    let mut files = Vec::new();
    metrics_files(&repo().join("controller-shim/src"), &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("runtime/metrics.rs")),
        "no runtime/metrics.rs among {files:?}"
    );
    let src: String = files
        .iter()
        .map(|f| std::fs::read_to_string(f).expect("a metrics.rs"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut names = BTreeSet::new();
    let mut rest = src.as_str();
    while let Some(i) = rest.find("o(") {
        let tail = rest[i + 2..].trim_start();
        if let Some(lit) = tail.strip_prefix('"') {
            let end = lit.find('"').unwrap_or(0);
            names.insert(format!("mountguard_{}", &lit[..end]));
        }
        rest = &rest[i + 2..];
    }
    let mut quoted = BTreeSet::new();
    mountguard_names(&src, &mut quoted);
    names.extend(
        quoted
            .into_iter()
            .filter(|n| src.contains(&format!("\"{n}\""))),
    );
    names
}

/// Every `mountguard_*` series name of the alerts' promtool unit tests.
fn unit_test_series_names() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo().join("charts/tests/promtool/alerts_test.yaml"))
        .expect("alerts_test.yaml");
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(series) = line.trim().strip_prefix("- series:") {
            mountguard_names(series, &mut names);
        }
    }
    names
}

/// Metric family names in a Prometheus text exposition.
fn exposed_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let name = if let Some(rest) = line.strip_prefix("# TYPE ") {
            rest.split_whitespace().next()
        } else if line.starts_with('#') || line.is_empty() {
            None
        } else {
            line.split(['{', ' ']).next()
        };
        if let Some(n) = name {
            names.insert(n.to_string());
        }
    }
    names
}

fn bin(name: &str) -> PathBuf {
    let var = format!(
        "MOUNTGUARD_{}_BIN",
        name.rsplit('-').next().unwrap().to_uppercase()
    );
    if let Ok(p) = std::env::var(&var) {
        return PathBuf::from(p);
    }
    // target/<profile>/deps/<this test> -> target/<profile>/<name>
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join(name);
    assert!(
        p.is_file(),
        "{} not found: build the workspace binaries first (`cargo build --bins`), \
         or set {var}",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `path` to answer 200, then returns the body of `/metrics`.
fn scrape_when_ready(child: &mut Running, addr: SocketAddr, ready: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((200, _)) = http_get(addr, ready) {
            break;
        }
        if let Ok(Some(status)) = child.0.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.0.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            panic!("process exited early ({status}):\n{err}");
        }
        assert!(
            Instant::now() < deadline,
            "{addr}{ready} not ready within 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    match http_get(addr, "/metrics") {
        Some((200, body)) => body,
        other => panic!("GET /metrics: {other:?}"),
    }
}

fn scrape_agent() -> BTreeSet<String> {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(root.path().join("pods")).expect("pods dir");
    let port = free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = Running(
        Command::new(bin("mountguard-agent"))
            .args(["run", "--listen", &addr.to_string(), "--kubelet-root"])
            .arg(root.path())
            .args(["--node", "chart-test"])
            .env_remove("MOUNTGUARD_LOG_FORMAT")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start agent"),
    );
    exposed_names(&scrape_when_ready(&mut child, addr, "/readyz"))
}

/// The controller's exported names, or `None` while it has no `run` command.
fn scrape_controller() -> Option<BTreeSet<String>> {
    let controller = bin("mountguard-controller");
    let help = Command::new(&controller)
        .args(["run", "--help"])
        .output()
        .expect("run mountguard-controller");
    if !help.status.success() {
        return None;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let api = rt
        .block_on(mountguard_tests::apiserver::ApiServerDouble::start())
        .expect("API server double");
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: double\n\
             clusters: [{{name: double, cluster: {{server: \"{}\"}}}}]\n\
             users: [{{name: double, user: {{}}}}]\n\
             contexts: [{{name: double, context: {{cluster: double, user: double, namespace: default}}}}]\n",
            api.url()
        ),
    )
    .expect("kubeconfig");
    let key = dir.path().join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef").expect("key");
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let reports: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut child = Running(
        Command::new(controller)
            .arg("run")
            .args(["--metrics-listen", &metrics.to_string()])
            .args(["--report-listen", &reports.to_string()])
            .arg("--insecure-plaintext-reports")
            .arg("--fingerprint-key-file")
            .arg(&key)
            .args(["--agent-service-account", "default:mountguard-agent"])
            .args(["--agent-daemonset", "mountguard-agent"])
            .env("KUBECONFIG", &kubeconfig)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start controller"),
    );
    let idle = scrape_when_ready(&mut child, metrics, "/readyz");
    // Families with a sample per node or per mount only exist once there is
    // a node with a pod: add one on a node no agent reports for, with a
    // volume of a Secret that does not exist (SourceMissing: a per-mount
    // series even without an inventory; node-level Unverifiable reasons get
    // none, see docs/controller.md) and one of a Secret that does.
    let h = api.handle();
    let now = mountguard_tests::util::now_rfc3339();
    h.create(
        &resources::NODES,
        "",
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "chart-node"}}),
    )
    .expect("create node");
    h.create(
        &resources::SECRETS,
        "default",
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": "chart-secret", "namespace": "default"},
               "data": {"k": "dg=="}}),
    )
    .expect("create secret");
    h.create(
        &resources::PODS,
        "default",
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "chart-pod", "namespace": "default"},
               "spec": {"nodeName": "chart-node",
                        "containers": [{"name": "c", "image": "busybox",
                                        "volumeMounts": [{"name": "s", "mountPath": "/s"},
                                         {"name": "m", "mountPath": "/m"}]}],
                        "volumes": [{"name": "s", "secret": {"secretName": "chart-secret"}},
                                    {"name": "m", "secret": {"secretName": "chart-missing"}}]}}),
    )
    .expect("create pod");
    h.merge_patch(
        &resources::PODS,
        "default",
        "chart-pod",
        &json!({"status": {"phase": "Running", "containerStatuses": [{
            "name": "c", "image": "busybox", "imageID": "", "ready": true,
            "restartCount": 0, "state": {"running": {"startedAt": now}}}]}}),
        Some("status"),
    )
    .expect("pod status");
    let wanted = ["mountguard_mount_state", "mountguard_node_agent_reporting"];
    let deadline = Instant::now() + Duration::from_secs(30);
    let names = loop {
        let names = match http_get(metrics, "/metrics") {
            Some((200, body)) => exposed_names(&body),
            other => panic!("GET /metrics: {other:?}"),
        };
        if wanted.iter().all(|w| names.contains(*w)) || Instant::now() > deadline {
            break names;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    drop(child);
    drop(api);
    let mut all = exposed_names(&idle);
    all.extend(names);
    Some(all)
}

#[test]
fn alerts_dashboard_and_alert_tests_use_metric_names_the_binaries_export() {
    let (_dir, scenarios) = render_all();
    let alerts = alert_metric_names(&scenarios);
    assert!(alerts.len() >= 7, "too few metric names found: {alerts:?}");
    let dashboard = dashboard_metric_names(&scenarios);
    assert!(
        dashboard.len() >= 10,
        "too few dashboard metric names: {dashboard:?}"
    );
    let series = unit_test_series_names();
    assert!(
        alerts.is_subset(&series),
        "alerts without a unit-test series: {:?}",
        alerts.difference(&series).collect::<Vec<_>>()
    );
    // Alerts and their tests: every name must be scraped. Dashboard panels
    // also chart families that only have samples once agents report or a
    // remediation runs (an idle controller exports no series for them):
    // those must at least be registered in one of the controller's metrics.rs.
    let registered = registered_controller_names();
    let (dashboard_scraped_later, dashboard): (BTreeSet<String>, BTreeSet<String>) = dashboard
        .into_iter()
        .partition(|n| !n.starts_with("mountguard_agent_") && registered.contains(family(n)));
    let used: BTreeSet<String> = alerts.into_iter().chain(dashboard).chain(series).collect();

    let agent = scrape_agent();
    assert!(
        agent.contains("mountguard_agent_scans_total"),
        "agent scrape looks wrong: {agent:?}"
    );
    let (agent_used, controller_used): (BTreeSet<_>, BTreeSet<_>) = used
        .iter()
        .cloned()
        .partition(|n| n.starts_with("mountguard_agent_"));
    assert!(!agent_used.is_empty(), "no alert on agent metrics");
    let missing: Vec<_> = agent_used.difference(&agent).collect();
    assert!(
        missing.is_empty(),
        "the chart uses agent metrics the agent does not export: {missing:?}"
    );

    match scrape_controller() {
        Some(controller) => {
            let controller_used: BTreeSet<String> = controller_used
                .into_iter()
                .chain(
                    dashboard_scraped_later
                        .iter()
                        .filter(|n| controller.contains(*n))
                        .cloned(),
                )
                .collect();
            let missing: Vec<_> = controller_used.difference(&controller).collect();
            assert!(
                missing.is_empty(),
                "the chart uses controller metrics the controller does not export: {missing:?}\n\
                 exported: {controller:?}"
            );
        }
        None => {
            eprintln!(
                "\n!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n\
                 !!! SKIPPED: controller half of the alert/metric cross-check.\n\
                 !!! `mountguard-controller run --help` fails: the live controller does\n\
                 !!! not exist yet. These alert metric names are NOT verified:\n\
                 !!!   {controller_used:?}\n\
                 !!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!\n"
            );
        }
    }
}

#[test]
fn exposition_parser_reads_families_and_samples() {
    let text = "# HELP a_total x\n# TYPE a_total counter\na_total{r=\"ok\"} 1\n\
                # TYPE h histogram\nh_bucket{le=\"1\"} 0\nh_sum 0\nh_count 0\nplain 3\n";
    let names = exposed_names(text);
    for n in ["a_total", "h", "h_bucket", "h_sum", "h_count", "plain"] {
        assert!(names.contains(n), "{n} missing from {names:?}");
    }
    assert!(!names.contains("HELP"));
}

/// issue 31 §4: every hint the binaries print names the objects a render
/// of the chart has, by the chart's own naming rule
/// (`mountguard_inventory::names`, mirroring `_helpers.tpl`): rendered
/// for the README's release `mountguard`, a short one and one containing
/// the chart name.
#[test]
fn hint_names() {
    use mountguard_inventory::names;
    let script = "import json, sys; sys.path.insert(0, sys.argv[1]); import render; \
                  r = render.render({'dashboard': {'enabled': True}, \
                  'rbac': {'readerRole': {'create': True}}}, name=sys.argv[2], \
                  namespace=sys.argv[3]); \
                  print(json.dumps({'notes': r.notes, 'objects': \
                  [[o['kind'], o['metadata']['name']] for o in r.objects]}))";
    for release in [names::RELEASE, "mg", "prod-mountguard"] {
        let out = Command::new("python3")
            .args(["-c", script])
            .arg(repo().join("charts/tests"))
            .args([release, names::NAMESPACE])
            .output()
            .expect("python3 must be installed");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
        let objects: BTreeSet<(String, String)> = doc["objects"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| (o[0].as_str().unwrap().into(), o[1].as_str().unwrap().into()))
            .collect();
        let has = |kind: &str, name: String| {
            assert!(
                objects.contains(&(kind.to_string(), name.clone())),
                "{release}: no {kind} {name} in {objects:?}"
            );
        };
        has("Service", names::controller(release));
        has("Service", names::controller_metrics_service(release));
        has("Deployment", names::controller(release));
        has("ConfigMap", names::dashboard(release));
        has(
            "ClusterRole",
            format!("{}-reader", names::fullname(release)),
        );
        if release == names::RELEASE {
            // The port-forward the status hint gives is the one the
            // chart's NOTES print for the README's install.
            let hint = mountguard_controller::Error::Unreachable {
                url: "http://127.0.0.1:8080".into(),
                message: "refused".into(),
            }
            .to_string();
            let forward = format!(
                "kubectl -n {} port-forward svc/{} 8080",
                names::NAMESPACE,
                names::controller_metrics_service(release)
            );
            assert!(hint.contains(&forward), "{hint}");
            let notes = doc["notes"].as_str().unwrap();
            assert!(notes.contains(&forward), "{notes}");
        }
    }
}
