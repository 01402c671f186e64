//! The chart's NetworkPolicies (`networkPolicy.enabled=true`) enforced by
//! a real engine on the node (kube-router's network policy controller,
//! `mountguard_tests::real::netpol`): what they admit and what they
//! refuse, seen from pods on the node's bridge.
//!
//! The clients are pause pods; the test runs `curl` (the host's) in a
//! client pod's network namespace (`nsenter --net`), so each connection
//! leaves from that pod's address through its veth, as a process of the
//! pod would. (The engine admits whatever comes from the node itself, the
//! rig's Prometheus on the host included: the scrapes a policy decides are
//! those of a Prometheus pod.)

use std::process::Command;
use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::netpol::NetworkPolicyEngine;
use mountguard_tests::real::real_node::{NODE, RealNode, node_tools, print_skipped};
use mountguard_tests::real::{create, ensure_namespace, wait_for_default_service_account};
use mountguard_tests::real_node_or_skip;
use serde_json::json;

use crate::harness::{container_id, wait_pod_ready};
use crate::helm::{Helm, install, metric};

/// The chart's default `networkPolicy.metrics.namespaceSelector`
/// (`kubernetes.io/metadata.name: monitoring`, the label the API server
/// sets on every namespace).
const MONITORING: &str = "monitoring";
/// A namespace no rule of the chart's policies selects.
const ELSEWHERE: &str = "netpol-demo";

/// What `curl` in a pod's network namespace got.
struct Fetched {
    /// curl's exit code (7: could not connect, 28: timed out).
    code: Option<i32>,
    body: String,
    stderr: String,
}

impl Fetched {
    /// No TCP connection was made.
    fn refused(&self) -> bool {
        matches!(self.code, Some(7 | 28))
    }
}

impl std::fmt::Display for Fetched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let body: String = self.body.chars().take(200).collect();
        write!(
            f,
            "curl exit {:?}, stderr {:?}, body {body:?}",
            self.code,
            self.stderr.trim()
        )
    }
}

/// A pause pod `ns/name` on the node; returns the host pid of its
/// container (whose network namespace is the pod's).
async fn client_pod(node: &RealNode, ns: &str, name: &str) -> u32 {
    let client = node.cluster.client().await.expect("client");
    ensure_namespace(&client, ns).await.expect("namespace");
    wait_for_default_service_account(&client, ns)
        .await
        .expect("sa");
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {"app": name}},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": node.images.pause,
                "imagePullPolicy": "Never"}]}}),
    )
    .await
    .expect("client pod");
    let pod = wait_pod_ready(node, ns, name, Duration::from_secs(120)).await;
    node.runtime
        .task_pid(&container_id(&pod, "c"))
        .expect("client task")
}

/// `curl` from the network namespace of `pid` (3 s to connect).
fn fetch_from(pid: u32, url: &str) -> Fetched {
    let out = Command::new("nsenter")
        .arg(format!("--net=/proc/{pid}/ns/net"))
        .args([
            "curl",
            "--silent",
            "--show-error",
            "--insecure",
            "--connect-timeout",
            "3",
            "--max-time",
            "10",
            url,
        ])
        .output()
        .expect("nsenter curl");
    Fetched {
        code: out.status.code(),
        body: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The metrics of a mountguard component were served.
fn scraped(f: &Fetched) -> bool {
    f.code == Some(0) && f.body.contains("mountguard_")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_network_policy_admits_the_agents_and_prometheus_and_refuses_others() {
    let what = "real_node_network_policy_admits_the_agents_and_prometheus_and_refuses_others";
    let node = real_node_or_skip!(what);
    let helm = Helm::new(&node);
    let (agent, controller) = install(&node, &helm, &["--set", "networkPolicy.enabled=true"]).await;
    let ip = |pod: &serde_json::Value| pod["status"]["podIP"].as_str().expect("pod IP").to_string();
    let (agent_ip, controller_ip) = (ip(&agent), ip(&controller));
    let controller_metrics = format!("http://{controller_ip}:8080/metrics");
    let controller_reports = format!("https://{controller_ip}:8443/");
    let agent_metrics = format!("http://{agent_ip}:9808/metrics");

    let prometheus = client_pod(&node, MONITORING, "prometheus").await;
    let other = client_pod(&node, ELSEWHERE, "other").await;

    // The policies alone decide nothing: before the engine runs, the
    // outsider reaches the controller's metrics.
    let before = fetch_from(other, &controller_metrics);
    assert!(
        scraped(&before),
        "no engine yet, the outsider should be served: {before}"
    );

    let tools = node_tools().expect("node tools");
    let (bridge, _, _) = node.runtime.network();
    let engine =
        match NetworkPolicyEngine::start(&node.cluster, &tools.join("kube-router"), NODE, bridge)
            .await
        {
            Ok(e) => e,
            Err(why) => {
                print_skipped(
                    what,
                    &format!("the NetworkPolicy engine cannot run here: {why}"),
                );
                return;
            }
        };
    let diagnostics = || {
        format!(
            "--- kube-router ---\n{}\n--- its rules ---\n{}",
            engine.log_tail(30),
            engine.rules()
        )
    };

    // Refused: a pod of another namespace, on every port of both.
    let refused = poll(
        "the outsider refused at the controller's metrics",
        Duration::from_secs(60),
        || {
            let f = fetch_from(other, &controller_metrics);
            async move { f.refused().then_some(()) }
        },
    )
    .await;
    if let Err(e) = refused {
        panic!(
            "{e}: {}\n{}",
            fetch_from(other, &controller_metrics),
            diagnostics()
        );
    }
    for url in [&controller_reports, &agent_metrics] {
        let f = fetch_from(other, url);
        assert!(f.refused(), "the outsider at {url}: {f}\n{}", diagnostics());
    }

    // Admitted: the monitoring namespace's pod scrapes both components,
    // and only their metrics ports.
    for url in [&controller_metrics, &agent_metrics] {
        let f = fetch_from(prometheus, url);
        assert!(scraped(&f), "Prometheus at {url}: {f}\n{}", diagnostics());
    }
    let f = fetch_from(prometheus, &controller_reports);
    assert!(
        f.refused(),
        "Prometheus at the report port: {f}\n{}",
        diagnostics()
    );

    // Admitted: the agent's reports (through the Service, its ClusterIP)
    // still reach the controller and are answered 200 (its heartbeat every
    // 5 s counts `unchanged`, a changed inventory `accepted`), after the
    // refusals above showed the policy enforced. Read from the host, which
    // the engine always admits.
    let accepted = || async {
        let mut sum = None;
        for result in ["accepted", "unchanged", "resend"] {
            if let Some(v) = metric(
                &controller_metrics,
                "mountguard_report_requests_total",
                &[("result", result)],
            )
            .await
            {
                sum = Some(sum.unwrap_or(0.0) + v);
            }
        }
        sum
    };
    let start = accepted().await.unwrap_or(0.0);
    let more = poll(
        "an agent report answered under the policy",
        Duration::from_secs(60),
        || async { accepted().await.filter(|v| *v > start) },
    )
    .await;
    if let Err(e) = more {
        panic!(
            "{e} (answered before: {start})\n{}\n{}",
            diagnostics(),
            node.logs(20)
        );
    }
}
