//! A one-node cluster on this machine with the chart installed, for
//! looking at mountguard as an operator meets it: the real control plane,
//! the real kubelet on containerd, kube-proxy, CoreDNS, the
//! images built by scripts/images.sh, `helm install` of charts/mountguard,
//! and Prometheus scraping the controller and the agent with the chart's
//! alert rules. Run by `scripts/local-cluster.sh` (which builds and
//! installs what it needs first); needs root.
//!
//! ```text
//! mountguard-local-cluster up --state DIR      # until SIGINT/SIGTERM
//! mountguard-local-cluster rotate --state DIR  # the seed rotation, pinned
//! ```
//!
//! `up` writes `DIR/env` (`export` lines: KUBECONFIG, HELM, the URLs;
//! `DIR/bin`, with this cluster's kubectl and helm, first on PATH) and
//! `DIR/ready` once everything answers, prints how to look at it, and
//! on SIGINT or SIGTERM uninstalls the release and takes everything down
//! (nothing of the run is left on the machine); `DIR/ready` is removed
//! first. Exits 2 when this machine cannot run the node (the reason is
//! printed).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use mountguard_tests::real::client_from_kubeconfig;
use mountguard_tests::real::helm;
use mountguard_tests::real::helm::{
    Helm, NAMESPACE, RELEASE, chart_rules, controller_honor_labels, install,
};
use mountguard_tests::real::prometheus::{Prometheus, Target};
use mountguard_tests::real::real_node::{
    ROTATION_NAMESPACE, RealNode, node_tools, pinned_rotation,
};

/// The `for` of MountguardKubeletCachePinned here (the chart's default is
/// 5m).
const FOR_PINNED: &str = "metrics.prometheusRule.for.kubeletCachePinned=1m";

fn usage() -> ExitCode {
    eprintln!("usage: mountguard-local-cluster up|rotate --state DIR");
    ExitCode::from(64)
}

/// `KEY=value` lines of `DIR/env`.
fn read_env(state: &Path) -> Result<Vec<(String, String)>, String> {
    let path = state.join("env");
    let text = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (is the cluster up? scripts/local-cluster.sh up)",
            path.display()
        )
    })?;
    Ok(helm::parse_env(&text))
}

/// The page listing the alerts on this Prometheus: `/alerts` (the React
/// UI), else `/classic/alerts` (Debian's Prometheus 2.42 is built without
/// the React UI: `/alerts` answers 404), else the API's `/api/v1/alerts`.
async fn alerts_page(prom: &str) -> String {
    for path in ["/alerts", "/classic/alerts"] {
        let url = format!("{prom}{path}");
        if mountguard_tests::mountguard::http_get(&url).await.is_ok() {
            return url;
        }
    }
    format!("{prom}/api/v1/alerts")
}

async fn up(state: &Path) -> Result<(), String> {
    std::fs::create_dir_all(state).map_err(|e| format!("{}: {e}", state.display()))?;
    let _ = std::fs::remove_file(state.join("ready"));
    eprintln!("==> starting the control plane, containerd, the kubelet, kube-proxy, CoreDNS");
    let node = match RealNode::start().await {
        Ok(Ok(n)) => n,
        Ok(Err(why)) => {
            eprintln!("SKIPPED: this machine cannot run the node: {why}");
            std::process::exit(2);
        }
        Err(e) => return Err(format!("starting the node: {e}")),
    };
    eprintln!("==> helm install {RELEASE} charts/mountguard --namespace {NAMESPACE}");
    let helm = Helm::new(&node);
    // Short waits so the demo shows its verdicts and alerts in a minute or
    // two (the chart's defaults: 180 s and 5 m).
    let (agent, controller) = install(&node, &helm, &["--set", "controller.grace=20s"]).await;
    let ip = |p: &serde_json::Value| p["status"]["podIP"].as_str().unwrap_or("").to_string();
    let name = |p: &serde_json::Value| p["metadata"]["name"].as_str().unwrap_or("").to_string();
    let (controller_ip, agent_ip) = (ip(&controller), ip(&agent));
    eprintln!("==> Prometheus with the chart's rules");
    let target = |job: &str, addr: String, pod: String, honor: bool| Target {
        job: job.into(),
        addr,
        labels: vec![("namespace".into(), NAMESPACE.into()), ("pod".into(), pod)],
        honor_labels: honor,
    };
    let prom = Prometheus::start(
        &state.join("prometheus"),
        &state.join("prometheus.log"),
        &[
            target(
                "mountguard-controller",
                format!("{controller_ip}:8080"),
                name(&controller),
                controller_honor_labels(&helm),
            ),
            target(
                "mountguard-agent",
                format!("{agent_ip}:9808"),
                name(&agent),
                false,
            ),
        ],
        &chart_rules(&helm, &[FOR_PINNED]),
    )
    .await
    .map_err(|e| format!("Prometheus: {e}"))?;
    let alerts = alerts_page(prom.url()).await;
    let kubeconfig = state.join("kubeconfig");
    std::fs::copy(node.cluster.kubeconfig_path(), &kubeconfig)
        .map_err(|e| format!("copying the kubeconfig: {e}"))?;
    let tools = node_tools().map_err(|e| format!("{e}"))?;
    let helm_bin = tools.join("helm");
    // kubectl and helm of this cluster's versions, first on the reader's
    // PATH after `. env`.
    let bin = state.join("bin");
    std::fs::create_dir_all(&bin).map_err(|e| format!("{}: {e}", bin.display()))?;
    for program in ["kubectl", "helm"] {
        let link = bin.join(program);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(tools.join(program), &link)
            .map_err(|e| format!("{}: {e}", link.display()))?;
    }
    let vars = [
        ("KUBECONFIG", kubeconfig.display().to_string()),
        ("HELM", helm_bin.display().to_string()),
        (
            "CONTROLLER_METRICS",
            format!("http://{controller_ip}:8080/metrics"),
        ),
        ("AGENT_METRICS", format!("http://{agent_ip}:9808/metrics")),
        ("PROMETHEUS", prom.url().to_string()),
        ("ALERTS", alerts),
        ("PAUSE_IMAGE", node.images.pause.clone()),
        ("LOGS", node.cluster.logs_dir().display().to_string()),
    ];
    let env =
        mountguard_tests::envfile::write(&vars) + &mountguard_tests::envfile::path_first(&bin);
    std::fs::write(state.join("env"), env).map_err(|e| format!("writing env: {e}"))?;
    // Prometheus has scraped the controller once.
    prom.wait_scraped("mountguard-controller", Duration::from_secs(60))
        .await
        .map_err(|e| format!("{e}\n{}", prom.log_tail(20)))?;
    std::fs::write(state.join("ready"), format!("{}\n", std::process::id()))
        .map_err(|e| format!("writing ready: {e}"))?;
    let get = |k: &str| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.as_str())
            .unwrap_or("")
    };
    println!(
        "\nmountguard is installed on a one-node cluster (release {RELEASE} in {NAMESPACE}).\n\
         \n  . {env}          # KUBECONFIG, the URLs below; kubectl and helm on PATH\n\
         \n  helm status {RELEASE} -n {NAMESPACE}\n\
         \n  curl -s {cm} | grep '^mountguard_mounts'        # the controller's verdicts, by state\
         \n  curl -s {am} | grep '^mountguard_agent'         # the agent on the node\
         \n  {alerts}   # Prometheus's alerts (the chart's rules)\
         \n\nThe seed rotation (an immutable slurm.key recreated while a pod pins it):\
         \n  scripts/local-cluster.sh rotate\
         \nthen watch MountguardKubeletCachePinned in {alerts} and\
         \n  curl -s {cm} | grep 'namespace=\"{rns}\"'\
         \n\nLogs of the control plane, kubelet and containerd: {logs}\
         \nkubectl logs, exec and port-forward reach the node as on any cluster.\
         \nInstalled with controller.grace=20s and the rules with {FOR_PINNED} (chart\
         \ndefaults: 180s and 5m), so the rotation shows in a minute or two.\
         \nStop and remove everything: scripts/local-cluster.sh down\n",
        env = state.join("env").display(),
        cm = get("CONTROLLER_METRICS"),
        am = get("AGENT_METRICS"),
        alerts = get("ALERTS"),
        rns = ROTATION_NAMESPACE,
        logs = get("LOGS"),
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("==> taking the cluster down");
    let _ = std::fs::remove_file(state.join("ready"));
    drop(prom);
    let out = helm.run(&helm::uninstall_args("2m"));
    if !out.status.success() {
        eprintln!(
            "warning: helm uninstall: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    drop(node);
    let _ = std::fs::remove_file(state.join("env"));
    let _ = std::fs::remove_file(state.join("kubeconfig"));
    let _ = std::fs::remove_dir_all(state.join("bin"));
    eprintln!("==> down");
    Ok(())
}

async fn rotate(state: &Path) -> Result<(), String> {
    let env = read_env(state)?;
    let get = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| format!("{k} missing in {}", state.join("env").display()))
    };
    let client = client_from_kubeconfig(Path::new(&get("KUBECONFIG")?))
        .await
        .map_err(|e| format!("kubeconfig: {e}"))?;
    pinned_rotation(&client, &get("PAUSE_IMAGE")?)
        .await
        .map_err(|e| format!("the rotation: {e}"))?;
    println!(
        "Secret {ns}/slurm-key recreated with new bytes while pod {ns}/pinner pins it;\n\
         pod {ns}/worker is served the old bytes by the kubelet. Watch:\n  \
         curl -s {cm} | grep 'namespace=\"{ns}\"'\n  {alerts}",
        ns = ROTATION_NAMESPACE,
        cm = get("CONTROLLER_METRICS")?,
        alerts = get("ALERTS")?,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, state) = match args.as_slice() {
        [cmd, flag, dir] if flag == "--state" => (cmd.as_str(), PathBuf::from(dir)),
        _ => return usage(),
    };
    let r = match cmd {
        "up" => up(&state).await,
        "rotate" => rotate(&state).await,
        _ => return usage(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
