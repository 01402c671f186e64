//! The chart's alert rules evaluated by a real Prometheus (Debian's
//! package) scraping the controller installed by `helm install`.

use std::process::Command;
use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::prometheus::{Prometheus, Target};
use mountguard_tests::real::real_node::NODE;
use mountguard_tests::real::{create, ensure_namespace, raw, wait_for_default_service_account};
use mountguard_tests::real_node_or_skip;
use serde_json::{Value, json};

use crate::harness::wait_pod_ready;
use crate::helm::{CONTROLLER, Helm, NAMESPACE, RELEASE, chart, install};

/// The documents of one chart template as `helm template` renders it
/// (the `monitoring.coreos.com/v1` API assumed), as JSON.
fn rendered(helm: &Helm, template: &str, set: &[&str]) -> Vec<Value> {
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
        "v1.33.13",
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
fn chart_rules(helm: &Helm, set: &[&str]) -> String {
    let mut set = set.to_vec();
    set.push("metrics.prometheusRule.enabled=true");
    let rule = rendered(helm, "prometheusrule.yaml", &set).remove(0);
    json!({"groups": rule["spec"]["groups"]}).to_string()
}

/// `honorLabels` of the controller's endpoint in the chart's
/// ServiceMonitor: what prometheus-operator would turn into the scrape
/// job's `honor_labels`.
fn controller_honor_labels(helm: &Helm) -> bool {
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

fn secret(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "immutable": true,
        "metadata": {"name": name, "namespace": "demo"},
        "stringData": {"slurm.key": value}})
}

fn pod(name: &str, image: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "demo"},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": image, "imagePullPolicy": "Never",
                "volumeMounts": [{"name": "key", "mountPath": "/etc/slurm", "readOnly": true}]}],
            "volumes": [{"name": "key", "secret": {"secretName": "slurm-key"}}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_alert_kubelet_cache_pinned_fires_in_a_real_prometheus() {
    let node =
        real_node_or_skip!("real_node_alert_kubelet_cache_pinned_fires_in_a_real_prometheus");
    let helm = Helm::new(&node);
    let (_, controller) = install(&node, &helm, &["--set", "controller.grace=10s"]).await;
    let rules = chart_rules(&helm, &["metrics.prometheusRule.for.kubeletCachePinned=0m"]);
    let ip = controller["status"]["podIP"]
        .as_str()
        .expect("controller IP");
    let pod_name = controller["metadata"]["name"].as_str().unwrap_or("");
    let dir = tempfile::tempdir().expect("dir");
    let prom = Prometheus::start(
        dir.path(),
        &node.cluster.logs_dir().join("prometheus.log"),
        &[Target {
            job: "mountguard-controller".into(),
            addr: format!("{ip}:8080"),
            // The labels prometheus-operator's relabelling gives a
            // ServiceMonitor's target; the series' own namespace and pod
            // (the checked pod's) win where honorLabels says so.
            labels: vec![
                ("namespace".into(), NAMESPACE.into()),
                ("pod".into(), pod_name.into()),
            ],
            honor_labels: controller_honor_labels(&helm),
        }],
        &rules,
    )
    .await
    .expect("prometheus");
    // Every rule of the chart loads and evaluates.
    let health = poll(
        "the chart's rules evaluated",
        Duration::from_secs(60),
        || async {
            let h = prom.rule_health().await.ok()?;
            (!h.is_empty() && h.iter().all(|(_, s)| s == "ok")).then_some(h)
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", prom.log_tail(20)));
    assert!(
        health
            .iter()
            .any(|(n, _)| n == "MountguardKubeletCachePinned"),
        "{health:?}"
    );
    poll(
        "the controller scraped",
        Duration::from_secs(60),
        || async {
            let r = prom
                .query("up{job=\"mountguard-controller\"} == 1")
                .await
                .ok()?;
            (!r.is_empty()).then_some(())
        },
    )
    .await
    .expect("scraped");

    // The immutable key, a pod pinning it in the kubelet's cache, the key
    // recreated with new bytes, a new worker mounting it.
    let client = node.cluster.client().await.expect("client");
    ensure_namespace(&client, "demo").await.expect("ns");
    wait_for_default_service_account(&client, "demo")
        .await
        .expect("sa");
    create(&client, &secret("slurm-key", "seed-1"))
        .await
        .expect("secret");
    create(&client, &pod("pinner", &node.images.pause))
        .await
        .expect("pinner");
    wait_pod_ready(&node, "demo", "pinner", Duration::from_secs(120)).await;
    let (code, body) = raw(
        &client,
        "DELETE",
        "/api/v1/namespaces/demo/secrets/slurm-key",
        None,
    )
    .await
    .expect("delete");
    assert_eq!(code, 200, "{body}");
    create(&client, &secret("slurm-key", "seed-2"))
        .await
        .expect("recreated");
    create(&client, &pod("worker", &node.images.pause))
        .await
        .expect("worker");
    wait_pod_ready(&node, "demo", "worker", Duration::from_secs(120)).await;

    let firing = poll(
        "MountguardKubeletCachePinned firing",
        Duration::from_secs(180),
        || async {
            let alerts = prom.alerts().await.ok()?;
            alerts.into_iter().find(|(n, s, l)| {
                n == "MountguardKubeletCachePinned" && s == "firing" && l["pod"] == "worker"
            })
        },
    )
    .await;
    match firing {
        Ok((_, _, labels)) => {
            assert_eq!(labels["namespace"], "demo");
            assert_eq!(labels["source_name"], "slurm-key");
        }
        Err(e) => {
            let states = prom
                .query("mountguard_mount_state > 0")
                .await
                .unwrap_or_default();
            panic!(
                "{e}\nstates: {states:#?}\nalerts: {:?}\n{}",
                prom.alerts().await,
                node.logs(30)
            );
        }
    }
}
