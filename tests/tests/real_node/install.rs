//! `helm install` on the real node: the agent and the controller as the
//! chart's own containers.

use std::time::Duration;

use mountguard_tests::mountguard::poll;
use mountguard_tests::real::real_node::NODE;
use mountguard_tests::real::real_node::RealNode;
use mountguard_tests::real::services::CLUSTER_DOMAIN;
use mountguard_tests::real::{create, ensure_namespace, raw, wait_for_default_service_account};
use mountguard_tests::real_node_or_skip;
use serde_json::{Value, json};

use crate::harness::{container_id, wait_pod_ready};
use crate::helm::{AGENT, CONTROLLER, Helm, NAMESPACE, install, metric};

fn cmdline(pid: u32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default())
        .replace('\0', " ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_helm_install_runs_agent_and_controller_ready_as_containers() {
    let node =
        real_node_or_skip!("real_node_helm_install_runs_agent_and_controller_ready_as_containers");
    let helm = Helm::new(&node);
    let (agent, controller) = install(&node, &helm, &[]).await;

    // Their processes are this host's, the images' entrypoints.
    let agent_pid = node
        .runtime
        .task_pid(&container_id(&agent, "agent"))
        .expect("agent task");
    assert!(
        cmdline(agent_pid).starts_with("/mountguard-agent run"),
        "agent process {agent_pid}: {}",
        cmdline(agent_pid)
    );
    let controller_pid = node
        .runtime
        .task_pid(&container_id(&controller, "controller"))
        .expect("controller task");
    assert!(
        cmdline(controller_pid).starts_with("/mountguard-controller run"),
        "controller process {controller_pid}: {}",
        cmdline(controller_pid)
    );

    // The agent's reports, with its projected token, reach the controller
    // by the chart's Service name (cluster DNS, kube-proxy) and are
    // accepted.
    let controller_ip = controller["status"]["podIP"]
        .as_str()
        .expect("controller IP");
    let url = format!("http://{controller_ip}:8080/metrics");
    let accepted = poll("an accepted agent report", Duration::from_secs(120), || {
        let url = url.clone();
        async move {
            metric(
                &url,
                "mountguard_report_requests_total",
                &[("result", "accepted")],
            )
            .await
            .filter(|v| *v >= 1.0)
        }
    })
    .await;
    if let Err(e) = accepted {
        let body = mountguard_tests::mountguard::http_get(&url)
            .await
            .unwrap_or_default();
        let lines: Vec<&str> = body.lines().filter(|l| l.contains("report")).collect();
        panic!("{e}\n{}\n{}", lines.join("\n"), node.logs(30));
    }
    // The name it asked CoreDNS for, from its own pod, and was answered.
    let agent_ip = agent["status"]["podIP"].as_str().expect("agent IP");
    let service = format!("{CONTROLLER}.{NAMESPACE}.svc.{CLUSTER_DOMAIN}.");
    let queries = node.dns.queries();
    assert!(
        queries.iter().any(|q| q.client == agent_ip
            && q.qtype == "A"
            && q.name == service
            && q.rcode == "NOERROR"),
        "CoreDNS answered the agent ({agent_ip}) no A query for {service}: {queries:#?}"
    );

    // The controller reads the cluster with the chart's RBAC only: no
    // request of its ServiceAccount was refused.
    let user = format!("system:serviceaccount:{NAMESPACE}:{CONTROLLER}");
    let refused: Vec<String> = node
        .cluster
        .audit_events()
        .iter()
        .filter(|e| e["user"]["username"] == user.as_str())
        .filter(|e| matches!(e["responseStatus"]["code"].as_u64(), Some(401 | 403)))
        .map(|e| {
            format!(
                "{} {} {}",
                e["verb"], e["requestURI"], e["responseStatus"]["code"]
            )
        })
        .collect();
    assert!(
        refused.is_empty(),
        "the controller was refused: {refused:#?}"
    );
    let agent_user = format!("system:serviceaccount:{NAMESPACE}:{AGENT}");
    assert!(
        !node
            .cluster
            .audit_events()
            .iter()
            .any(|e| e["user"]["username"] == agent_user.as_str()),
        "the agent called the API (it should only hold its report token)"
    );
}

/// The chart installed with the probe on the kubelet's root, then a Secret
/// volume mounted after the agent started: `(agent pod, agent container,
/// probe path, the volume's file)`.
async fn agent_and_a_later_volume(node: &RealNode) -> (Value, String, String, String) {
    let root = node.kubelet.root().to_path_buf();
    // The probe (no shell in the image): on the kubelet's root, which the
    // agent's container mounts read-only at the same path.
    let probe = root.join("mountguard-probe");
    std::fs::copy(node.images.dir.join("probe"), &probe).expect("probe");
    let helm = Helm::new(node);
    let (agent, _) = install(node, &helm, &[]).await;
    let agent_id = container_id(&agent, "agent");

    // A Secret volume mounted after the agent started.
    let client = node.cluster.client().await.expect("client");
    ensure_namespace(&client, "demo").await.expect("namespace");
    wait_for_default_service_account(&client, "demo")
        .await
        .expect("sa");
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "later", "namespace": "demo"},
        "stringData": {"key": "after the agent"}}),
    )
    .await
    .expect("secret");
    create(
        &client,
        &json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "later", "namespace": "demo"},
        "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": node.images.pause, "imagePullPolicy": "Never",
                "volumeMounts": [{"name": "s", "mountPath": "/s", "readOnly": true}]}],
            "volumes": [{"name": "s", "secret": {"secretName": "later"}}]}}),
    )
    .await
    .expect("pod");
    let pod = wait_pod_ready(node, "demo", "later", Duration::from_secs(120)).await;
    let uid = pod["metadata"]["uid"].as_str().expect("uid");
    let file = root.join(format!("pods/{uid}/volumes/kubernetes.io~secret/s/key"));
    let (probe, file) = (probe.to_string_lossy(), file.to_string_lossy());

    (agent, agent_id, probe.into_owned(), file.into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_agent_sees_volumes_mounted_after_it_started_and_enforces_landlock() {
    let node = real_node_or_skip!(
        "real_node_agent_sees_volumes_mounted_after_it_started_and_enforces_landlock"
    );
    let (agent, agent_id, probe, file) = agent_and_a_later_volume(&node).await;
    // Seen from inside the agent's container (HostToContainer)...
    let read = node
        .runtime
        .exec(&agent_id, &[&probe, "read", &file])
        .expect("exec read");
    assert_eq!(
        String::from_utf8_lossy(&read.stdout),
        "after the agent",
        "read inside the agent container: {read:?}"
    );
    // Landlock is enforced in the agent's process.
    let ip = agent["status"]["podIP"].as_str().expect("agent IP");
    let url = format!("http://{ip}:9808/metrics");
    let landlock = poll(
        "mountguard_agent_landlock_enforced",
        Duration::from_secs(30),
        || {
            let url = url.clone();
            async move { metric(&url, "mountguard_agent_landlock_enforced", &[]).await }
        },
    )
    .await
    .expect("landlock metric");
    assert_eq!(landlock, 1.0);
}

/// Finding of this tier (kubelet v1.33, containerd 1.6.20, runc 1.1.5;
/// the same on containerd v2.4.2 and runc v1.5.3), kept as its record: a tmpfs the kubelet mounts under its root after the
/// agent started reaches the agent's container through HostToContainer
/// propagation with the kubelet's read-write flags (Linux copies the
/// source's flags to a propagated mount; the container's `readOnly: true`
/// makes only the bind mount of the root read-only, and
/// `recursiveReadOnly` cannot be combined with propagation). The agent's
/// own process is held by its Landlock ruleset (the test above); a process
/// the runtime itself starts in the container (node root's exec, not the
/// API's: that one the chart's policy refuses, the test below) runs as the
/// agent's root user outside that ruleset and changes the volume. If this
/// starts failing, the boundary moved: update docs/security.md ("Exec into
/// the agent").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_agent_container_runtime_exec_can_write_a_later_volume() {
    let node =
        real_node_or_skip!("real_node_agent_container_runtime_exec_can_write_a_later_volume");
    let (_, agent_id, probe, file) = agent_and_a_later_volume(&node).await;
    let write = node
        .runtime
        .exec(&agent_id, &[&probe, "write", &file])
        .expect("exec write");
    let text = String::from_utf8_lossy(&write.stdout);
    assert!(
        text.contains("ALLOWED"),
        "the runtime's exec could not write: {write:?}\n{text}"
    );
}

/// `kubectl exec`, `attach` and an ephemeral container into the agent's
/// pod, through the real API server as a cluster administrator: each
/// refused (403) by the chart's ValidatingAdmissionPolicy, evaluated by
/// the API server itself; an exec into the controller's pod (same
/// namespace) is not refused by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_node_exec_into_the_agent_is_refused_by_the_chart_policy() {
    let node = real_node_or_skip!("real_node_exec_into_the_agent_is_refused_by_the_chart_policy");
    let helm = Helm::new(&node);
    let (agent, controller) = install(&node, &helm, &[]).await;
    let client = node.cluster.client().await.expect("client");
    let agent_name = agent["metadata"]["name"].as_str().expect("agent name");
    let controller_name = controller["metadata"]["name"]
        .as_str()
        .expect("controller name");
    let pods = format!("/api/v1/namespaces/{NAMESPACE}/pods");
    let refused = |code: u16, body: &Value, what: &str| {
        let msg = body["message"].as_str().unwrap_or("");
        assert_eq!(code, 403, "{what}: {body}");
        assert!(
            msg.contains("mountguard:") && msg.contains(&format!("{NAMESPACE}/{agent_name}")),
            "{what}: {msg}"
        );
    };
    // The policy is created with the chart; the API server loads it a
    // moment later.
    let exec = format!("{pods}/{agent_name}/exec?command=%2Fmountguard-agent&stdout=true");
    let (code, body) = poll("the policy refusing exec", Duration::from_secs(30), || {
        let (client, exec) = (client.clone(), exec.clone());
        async move {
            let r = raw(&client, "POST", &exec, None).await.ok()?;
            (r.0 == 403).then_some(r)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    refused(code, &body, "exec");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("exec into the agent pod"),
        "{body}"
    );
    let (code, body) = raw(
        &client,
        "POST",
        &format!("{pods}/{agent_name}/attach?stdout=true"),
        None,
    )
    .await
    .expect("attach");
    refused(code, &body, "attach");
    let (code, body) = raw(
        &client,
        "PATCH",
        &format!("{pods}/{agent_name}/ephemeralcontainers"),
        Some(&json!({"spec": {"ephemeralContainers": [{
            "name": "debug", "image": node.images.pause, "imagePullPolicy": "Never",
            "volumeMounts": [{"name": "kubelet-root", "mountPath": "/k"}]}]}})),
    )
    .await
    .expect("ephemeral container");
    refused(code, &body, "ephemeral container");
    let after = raw(&client, "GET", &format!("{pods}/{agent_name}"), None)
        .await
        .expect("agent pod");
    assert!(
        after.1["spec"]["ephemeralContainers"].is_null(),
        "no ephemeral container added: {}",
        after.1["spec"]
    );
    // Not the controller's pod: whatever the API server answers there, it
    // is not the policy's refusal.
    let (code, body) = raw(
        &client,
        "POST",
        &format!("{pods}/{controller_name}/exec?command=%2Fmountguard-controller&stdout=true"),
        None,
    )
    .await
    .expect("exec into the controller");
    assert!(
        !body["message"]
            .as_str()
            .unwrap_or("")
            .contains("mountguard:"),
        "{code}: {body}"
    );
}
