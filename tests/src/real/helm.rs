//! The chart installed as docs/install.md tells a user: the real Helm CLI
//! (Helm 4, [`Helm::new`]; Helm 3, [`Helm::v3`], for the one test that
//! installs, upgrades and uninstalls with it), the namespace with its Pod
//! Security labels, the images by digest; the agent DaemonSet's pod and
//! the controller's pod run as real containers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::mountguard::{http_get, parse_metrics, poll};
use crate::real::raw;
use crate::real::real_node::{RealNode, node_tools};
use serde_json::{Value, json};

/// The release and its namespace (docs/install.md).
pub const RELEASE: &str = "mountguard";
/// The release namespace.
pub const NAMESPACE: &str = "mountguard-system";
/// The chart's agent DaemonSet / ServiceAccount.
pub const AGENT: &str = "mountguard-agent";
/// The chart's controller Deployment / ServiceAccount / Service.
pub const CONTROLLER: &str = "mountguard-controller";
/// The report API's certificate Secret (`tls.existingSecret`).
pub const TLS_SECRET: &str = "mountguard-report-tls";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The Helm CLI of scripts/node-tools.sh against the rig's API server.
#[derive(Debug)]
pub struct Helm {
    bin: PathBuf,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Helm {
    /// Helm 4 (scripts/node-tools.sh's `helm`).
    pub fn new(node: &RealNode) -> Self {
        Self::named(node, "helm")
    }

    /// Helm 3 (scripts/node-tools.sh's `helm3`).
    pub fn v3(node: &RealNode) -> Self {
        Self::named(node, "helm3")
    }

    fn named(node: &RealNode, name: &str) -> Self {
        let bin = node_tools().expect("node tools").join(name);
        Self {
            bin,
            kubeconfig: node.cluster.kubeconfig_path().to_path_buf(),
            home: tempfile::tempdir().expect("helm home"),
        }
    }

    /// `helm <args>` (with its own cache, config and data directories).
    pub fn run(&self, args: &[&str]) -> Output {
        let h = self.home.path();
        Command::new(&self.bin)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .env("HELM_CACHE_HOME", h.join("cache"))
            .env("HELM_CONFIG_HOME", h.join("config"))
            .env("HELM_DATA_HOME", h.join("data"))
            .output()
            .expect("helm runs")
    }

    /// `helm <args>`, which must succeed; returns its stdout.
    pub fn ok_stdout(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "helm {}: {}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `helm <args>`, which must succeed; returns its stdout and stderr.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success(),
            "helm {}: {}\n{text}",
            args.join(" "),
            out.status
        );
        text
    }
}

/// The namespace as docs/install.md creates it (Pod Security: enforce
/// privileged, warn and audit restricted) and the report API's certificate
/// for the controller Service's name, signed by the rig's CA.
pub async fn prepare_namespace(node: &RealNode) {
    let client = node.cluster.client().await.expect("client");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": NAMESPACE, "labels": {
            "pod-security.kubernetes.io/enforce": "privileged",
            "pod-security.kubernetes.io/warn": "restricted",
            "pod-security.kubernetes.io/audit": "restricted"}}});
    let (code, body) = raw(&client, "POST", "/api/v1/namespaces", Some(&ns))
        .await
        .expect("namespace");
    assert_eq!(code, 201, "{body}");
    let svc = format!("{CONTROLLER}.{NAMESPACE}.svc");
    let (cert, key) = node
        .cluster
        .serving_cert(&[&svc, &format!("{svc}.cluster.local")])
        .expect("certificate");
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": TLS_SECRET, "namespace": NAMESPACE},
        "stringData": {"tls.crt": cert, "tls.key": key, "ca.crt": node.cluster.ca_pem()}});
    let (code, body) = raw(
        &client,
        "POST",
        &format!("/api/v1/namespaces/{NAMESPACE}/secrets"),
        Some(&secret),
    )
    .await
    .expect("secret");
    assert_eq!(code, 201, "{body}");
}

/// The values of the install: the images by digest, the kubelet's root
/// directory of this node, the certificate, short intervals for the test.
pub fn install_args(node: &RealNode) -> Vec<String> {
    let root = node.kubelet.root().to_string_lossy().into_owned();
    let i = &node.images;
    [
        format!("agent.image.repository={}", i.agent.0),
        format!("agent.image.digest={}", i.agent.1),
        format!("controller.image.repository={}", i.controller.0),
        format!("controller.image.digest={}", i.controller.1),
        "image.pullPolicy=Never".to_string(),
        format!("agent.kubeletRootDir={root}"),
        "tls.certManager.enabled=false".to_string(),
        format!("tls.existingSecret={TLS_SECRET}"),
        "agent.rescanInterval=5s".to_string(),
        "agent.heartbeatInterval=5s".to_string(),
    ]
    .into_iter()
    .flat_map(|v| ["--set".to_string(), v])
    .collect()
}

/// `helm uninstall` of the release as docs/install.md says, waiting for
/// its objects to go (at most `timeout`, Helm's duration form).
pub fn uninstall_args(timeout: &str) -> [&str; 7] {
    [
        "uninstall",
        RELEASE,
        "--namespace",
        NAMESPACE,
        "--wait",
        "--timeout",
        timeout,
    ]
}

/// The pairs of a local cluster's `env` file ([`crate::envfile`]).
pub fn parse_env(text: &str) -> Vec<(String, String)> {
    crate::envfile::parse(text)
}

/// Waits until the pod of `component` in the release namespace is Running
/// and Ready; returns it.
pub async fn component_pod(node: &RealNode, component: &str, timeout: Duration) -> Value {
    component_pod_where(node, component, "", timeout, |_| true).await
}

/// [`component_pod`] for a pod that also satisfies `wanted` (`what` says
/// which, in the messages). On a timeout the panic shows the pods, the
/// namespace's Events and the last lines each container of the
/// component's pods logged (the kubelet's `/var/log/pods`).
pub async fn component_pod_where(
    node: &RealNode,
    component: &str,
    what: &str,
    timeout: Duration,
    wanted: impl Fn(&Value) -> bool + Clone,
) -> Value {
    let client = node.cluster.client().await.expect("client");
    let path = format!(
        "/api/v1/namespaces/{NAMESPACE}/pods?labelSelector=app.kubernetes.io%2Fcomponent%3D{component}"
    );
    let r = poll(
        &format!("the {component} pod Running and Ready{what}"),
        timeout,
        || {
            let (client, path, wanted) = (client.clone(), path.clone(), wanted.clone());
            async move {
                let (_, list) = raw(&client, "GET", &path, None).await.ok()?;
                list["items"].as_array()?.iter().find_map(|p| {
                    let ready = p["status"]["conditions"]
                        .as_array()?
                        .iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True");
                    (p["status"]["phase"] == "Running"
                        && ready
                        && p["metadata"]["deletionTimestamp"].is_null()
                        && wanted(p))
                    .then(|| p.clone())
                })
            }
        },
    )
    .await;
    match r {
        Ok(p) => p,
        Err(e) => {
            let list = raw(&client, "GET", &path, None)
                .await
                .map(|p| p.1)
                .unwrap_or_default();
            let events = raw(
                &client,
                "GET",
                &format!("/api/v1/namespaces/{NAMESPACE}/events"),
                None,
            )
            .await
            .map(|p| p.1)
            .unwrap_or_default();
            let events: Vec<String> = events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    format!(
                        "{} {} {}",
                        e["involvedObject"]["name"], e["reason"], e["message"]
                    )
                })
                .collect();
            let mut logs = String::new();
            for p in list["items"].as_array().into_iter().flatten() {
                let (name, uid) = (&p["metadata"]["name"], &p["metadata"]["uid"]);
                let dir = format!(
                    "/var/log/pods/{NAMESPACE}_{}_{}",
                    name.as_str().unwrap_or_default(),
                    uid.as_str().unwrap_or_default()
                );
                for c in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let mut files: Vec<_> = std::fs::read_dir(c.path())
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|f| f.path())
                        .collect();
                    files.sort();
                    if let Some(f) = files.last() {
                        let text = std::fs::read_to_string(f).unwrap_or_default();
                        let tail: Vec<&str> = text.lines().rev().take(10).collect();
                        logs.push_str(&format!("--- {} ---\n", f.display()));
                        for l in tail.iter().rev() {
                            logs.push_str(l);
                            logs.push('\n');
                        }
                    }
                }
            }
            panic!(
                "{e}\npods: {:#}\nevents:\n{}\ncontainer logs:\n{logs}{}",
                list["items"],
                events.join("\n"),
                node.logs(30)
            );
        }
    }
}

/// A metric's value on `url` (sum over the series matching `labels`).
pub async fn metric(url: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let text = http_get(url).await.ok()?;
    let samples = parse_metrics(&text);
    let matching: Vec<f64> = samples
        .iter()
        .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.label(k) == Some(*v)))
        .map(|s| s.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// The chart's directory.
pub fn chart() -> String {
    repo()
        .join("charts/mountguard")
        .to_string_lossy()
        .into_owned()
}

/// Installs the chart (docs/install.md) and waits until the agent and the
/// controller are Running and Ready; returns `(agent pod, controller pod)`.
pub async fn install(node: &RealNode, helm: &Helm, extra: &[&str]) -> (Value, Value) {
    prepare_namespace(node).await;
    let chart = chart();
    let mut args = vec!["install", RELEASE, &chart, "--namespace", NAMESPACE];
    let values = install_args(node);
    args.extend(values.iter().map(String::as_str));
    args.extend_from_slice(extra);
    let out = helm.ok(&args);
    assert!(out.contains("STATUS: deployed"), "helm install:\n{out}");
    let agent = component_pod(node, "agent", Duration::from_secs(180)).await;
    let controller = component_pod(node, "controller", Duration::from_secs(180)).await;
    (agent, controller)
}

/// The arguments of `helm upgrade` of the release with the values it has
/// plus `set` (each a `--set` value), as docs/install.md changes a setting.
pub fn upgrade_args(set: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["upgrade", RELEASE, &chart(), "--namespace", NAMESPACE]
        .map(String::from)
        .into();
    args.push("--reuse-values".into());
    for v in set {
        args.extend(["--set".to_string(), v.to_string()]);
    }
    args
}

/// [`upgrade_args`] run, which must succeed; returns Helm's output, which
/// says `STATUS: deployed`.
pub fn upgrade(helm: &Helm, set: &[&str]) -> String {
    let args = upgrade_args(set);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = helm.ok(&args);
    assert!(out.contains("STATUS: deployed"), "helm upgrade:\n{out}");
    out
}

/// Waits for a Running and Ready controller pod, not being deleted, whose
/// container spec sets `MOUNTGUARD_REMEDIATION` to `mode` (the pod of the
/// revision an upgrade made).
pub async fn controller_with_remediation(node: &RealNode, mode: &str) -> Value {
    let mode = mode.to_string();
    let what = format!(" with remediation {mode}");
    component_pod_where(
        node,
        "controller",
        &what,
        Duration::from_secs(240),
        move |p| {
            p["spec"]["containers"][0]["env"]
                .as_array()
                .is_some_and(|env| {
                    env.iter().any(|e| {
                        e["name"] == "MOUNTGUARD_REMEDIATION" && e["value"] == mode.as_str()
                    })
                })
        },
    )
    .await
}

/// The documents of one chart template as `helm template` renders it
/// (the `monitoring.coreos.com/v1` API assumed), as JSON.
pub fn rendered(helm: &Helm, template: &str, set: &[&str]) -> Vec<Value> {
    let chart = chart();
    let show = format!("templates/{template}");
    let mut args = vec![
        "template",
        RELEASE,
        &chart,
        "--namespace",
        NAMESPACE,
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--kube-version",
        "v1.37.2",
        "--set",
        "tls.insecurePlaintextReports=true",
        "--show-only",
        &show,
    ];
    for s in set {
        args.extend(["--set", s]);
    }
    let out = helm.ok_stdout(&args);
    let json = Command::new("python3")
        .args([
            "-c",
            "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().expect("stdin").write_all(out.as_bytes())?;
            c.wait_with_output()
        })
        .expect("python3 with pyyaml");
    assert!(json.status.success(), "reading {template}: {json:?}");
    serde_json::from_slice(&json.stdout).expect("JSON")
}

/// The chart's rule groups: `spec.groups` of the rendered PrometheusRule,
/// as a Prometheus rule file (JSON is YAML).
pub fn chart_rules(helm: &Helm, set: &[&str]) -> String {
    let mut set = set.to_vec();
    set.push("metrics.prometheusRule.enabled=true");
    let rule = rendered(helm, "prometheusrule.yaml", &set).remove(0);
    json!({"groups": rule["spec"]["groups"]}).to_string()
}

/// `honorLabels` of the controller's endpoint in the chart's
/// ServiceMonitor: what prometheus-operator would turn into the scrape
/// job's `honor_labels`.
pub fn controller_honor_labels(helm: &Helm) -> bool {
    let monitors = rendered(
        helm,
        "servicemonitor.yaml",
        &["metrics.serviceMonitor.enabled=true"],
    );
    let controller = monitors
        .iter()
        .find(|m| m["metadata"]["name"] == CONTROLLER)
        .unwrap_or_else(|| panic!("no ServiceMonitor {CONTROLLER}: {monitors:?}"));
    controller["spec"]["endpoints"][0]["honorLabels"]
        .as_bool()
        .unwrap_or(false)
}
