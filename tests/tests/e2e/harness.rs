//! The real `mountguard-controller` and `mountguard-agent` binaries as
//! child processes against the cluster in a box.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use mountguard_tests::cluster::Cluster;
use mountguard_tests::mountguard::{
    AGENT_DAEMONSET, AgentIdentity, ChildGuard, agent_service_account_flag, binary,
    deploy_agent_identities, free_addr, wait_ready,
};
use serde_json::Value;

/// The rig's waits: on a timeout they panic with the processes' logs.
pub use mountguard_tests::rig::{wait, wait_all_fresh, wait_metrics, wait_verdicts};

/// Short timings so scenarios finish in seconds.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// How to start the system.
#[derive(Debug, Clone)]
pub struct Options {
    pub nodes: usize,
    pub grace: Duration,
    /// `(CA file for the agents, cert file, key file)`: https; `None`: http
    /// with `--insecure-plaintext-reports`.
    pub tls: Option<(PathBuf, PathBuf, PathBuf)>,
    pub extra_controller_args: Vec<String>,
    /// The Slinky operator's Slurm-side rules in the cluster (preStop hook,
    /// syncCordon; `ClusterBuilder::slinky_operator_rules`).
    pub operator_rules: bool,
    /// With `operator_rules`: the operator's syncCordon reads each Slurm
    /// node's reason a pass behind (`ClusterBuilder::operator_cache_lag`).
    pub operator_cache_lag: bool,
    /// Run the controller with this open file limit (soft and hard,
    /// through util-linux `prlimit`).
    pub controller_nofile: Option<u64>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            nodes: 3,
            grace: Duration::from_secs(2),
            tls: None,
            extra_controller_args: Vec::new(),
            operator_rules: false,
            operator_cache_lag: false,
            controller_nofile: None,
        }
    }
}

/// Cluster, agents and controller.
pub struct System {
    pub cluster: Cluster,
    pub ids: Vec<AgentIdentity>,
    pub controller: Option<ChildGuard>,
    pub agents: Vec<ChildGuard>,
    pub report_addr: std::net::SocketAddr,
    pub metrics_addr: std::net::SocketAddr,
    pub opts: Options,
    key_file: PathBuf,
    logs: PathBuf,
}

impl System {
    pub async fn start(opts: Options) -> System {
        // Fail first, clearly, when the binaries are not built.
        for bin in ["mountguard-controller", "mountguard-agent"] {
            if let Err(e) = binary(bin) {
                panic!("{e}");
            }
        }
        let mut builder = Cluster::builder().nodes(opts.nodes).slinky();
        if opts.operator_rules {
            builder = builder.slinky_operator_rules();
        }
        if opts.operator_cache_lag {
            builder = builder.operator_cache_lag();
        }
        let cluster = builder.start().await.unwrap();
        let ids = deploy_agent_identities(&cluster).await.unwrap();
        let logs = cluster.dir().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        // A fixed fingerprint key: fingerprints stay equal across a restart.
        let key_file = cluster.dir().join("fingerprint.key");
        std::fs::write(&key_file, b"mountguard-e2e-fingerprint-key-0123456789").unwrap();
        let mut sys = System {
            cluster,
            ids,
            controller: None,
            agents: Vec::new(),
            report_addr: free_addr().unwrap(),
            metrics_addr: free_addr().unwrap(),
            opts,
            key_file,
            logs,
        };
        sys.start_controller().await;
        for i in 0..sys.ids.len() {
            let a = sys.spawn_agent(i);
            sys.agents.push(a);
        }
        sys
    }

    /// Starts (or restarts) the controller on the same addresses.
    pub async fn start_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            c.kill();
        }
        let child = self
            .spawn_controller("controller", self.report_addr, self.metrics_addr, &[])
            .await;
        self.controller = Some(child);
    }

    /// Starts one more controller process with the system's options plus
    /// `extra`, listening on the given addresses; waits until it is ready.
    pub async fn spawn_controller(
        &self,
        name: &str,
        report_addr: std::net::SocketAddr,
        metrics_addr: std::net::SocketAddr,
        extra: &[String],
    ) -> ChildGuard {
        let mut child = self.launch_controller(name, report_addr, metrics_addr, extra, &[]);
        if let Err(e) = wait_ready(
            &mut child,
            &format!("http://{metrics_addr}"),
            Duration::from_secs(30),
        )
        .await
        {
            panic!("{name} did not become ready: {e}");
        }
        child
    }

    /// Starts one controller process with `env` added to its environment;
    /// does not wait until it is ready (a fail point may kill it first).
    pub fn launch_controller(
        &self,
        name: &str,
        report_addr: std::net::SocketAddr,
        metrics_addr: std::net::SocketAddr,
        extra: &[String],
        env: &[(&str, &str)],
    ) -> ChildGuard {
        let bin = binary("mountguard-controller").unwrap();
        let mut cmd = match self.opts.controller_nofile {
            Some(n) => {
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(self.cluster.kubeconfig_path())
            .args(["--report-listen", &report_addr.to_string()])
            .args(["--metrics-listen", &metrics_addr.to_string()])
            .args(["--agent-service-account", &agent_service_account_flag()])
            .args(["--agent-daemonset", AGENT_DAEMONSET])
            .args(["--grace", &format!("{}ms", self.opts.grace.as_millis())])
            .arg("--fingerprint-key-file")
            .arg(&self.key_file)
            .args(["--log", "info"])
            .args(&self.opts.extra_controller_args)
            .args(extra)
            .env_remove("KUBECONFIG");
        for (k, _) in std::env::vars() {
            if k.starts_with("MOUNTGUARD_") {
                cmd.env_remove(k);
            }
        }
        match &self.opts.tls {
            Some((_, cert, key)) => {
                cmd.arg("--tls-cert-file")
                    .arg(cert)
                    .arg("--tls-key-file")
                    .arg(key);
            }
            None => {
                cmd.arg("--insecure-plaintext-reports");
            }
        }
        cmd.envs(env.iter().copied());
        ChildGuard::spawn(name, cmd, &self.logs.join(format!("{name}.log"))).unwrap()
    }

    fn spawn_agent(&self, i: usize) -> ChildGuard {
        let id = &self.ids[i];
        let scheme = if self.opts.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let mut cmd = Command::new(binary("mountguard-agent").unwrap());
        cmd.arg("run")
            .arg("--kubelet-root")
            .arg(&id.kubelet_root)
            .args(["--node-name", &id.node])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--rescan-interval", "1s"])
            .args([
                "--heartbeat-interval",
                &format!("{}ms", HEARTBEAT.as_millis()),
            ])
            .args(["--debounce", "50ms"])
            .args([
                "--controller-url",
                &format!("{scheme}://{}", self.report_addr),
            ])
            .arg("--token-file")
            .arg(&id.token_file)
            .args(["--log", "info"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("MOUNTGUARD_") {
                cmd.env_remove(k);
            }
        }
        if let Some((ca, _, _)) = &self.opts.tls {
            cmd.arg("--ca-file").arg(ca);
        }
        ChildGuard::spawn(
            &format!("agent-{}", id.node),
            cmd,
            &self.logs.join(format!("agent-{}.log", id.node)),
        )
        .unwrap()
    }

    pub fn metrics_base(&self) -> String {
        format!("http://{}", self.metrics_addr)
    }

    pub fn report_base(&self) -> String {
        format!("http://{}", self.report_addr)
    }

    /// Exposes the controller's metrics port behind the chart's metrics
    /// Service in the chart's default namespace, through the API server
    /// double's service proxy.
    pub fn expose_metrics(&self) {
        mountguard_tests::apiserver::proxy::expose(
            &self.cluster.api(),
            "mountguard-system",
            "mountguard-controller-metrics",
            "metrics",
            self.metrics_addr,
        )
        .unwrap();
    }

    pub async fn verdicts(&self, query: &str) -> Value {
        mountguard_tests::scenario::verdicts(&self.metrics_base(), query)
            .await
            .unwrap()
    }

    /// Logs of every process, for failure messages.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for c in self.controller.iter().chain(self.agents.iter()) {
            out.push_str(&format!("--- {} ---\n{}\n", c.name(), c.log_tail(30)));
        }
        // Replicas started by the tests (Rig::launch_replica).
        out.push_str(&mountguard_tests::mountguard::replica_logs(&self.logs, 30));
        out
    }

    pub async fn shutdown(mut self) {
        for a in &mut self.agents {
            a.kill();
        }
        if let Some(c) = self.controller.as_mut() {
            c.kill();
        }
        self.cluster.shutdown().await;
    }
}

impl mountguard_tests::rig::Rig for System {
    fn rig_name(&self) -> &'static str {
        "cluster in a box"
    }

    fn objects(&self) -> std::sync::Arc<dyn mountguard_tests::objects::Objects> {
        std::sync::Arc::new(self.cluster.api())
    }

    fn slurm(&self) -> mountguard_tests::slurmrestd::SlurmHandle {
        self.cluster.slurm()
    }

    fn metrics_base(&self) -> String {
        System::metrics_base(self)
    }

    fn node_count(&self) -> usize {
        self.cluster.node_names().len()
    }

    fn logs(&self) -> String {
        System::logs(self)
    }

    fn stop_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            c.kill();
        }
    }

    /// In namespace `mountguard`, Lease `mountguard-failover-e2e`.
    fn launch_replica(
        &self,
        name: &str,
        env: &[(&str, &str)],
    ) -> impl std::future::Future<Output = ChildGuard> {
        const NS: &str = "mountguard";
        let _ = self.cluster.api().create(
            &mountguard_tests::apiserver::resources::PODS,
            NS,
            serde_json::json!({"metadata": {"name": name, "labels": {"app.kubernetes.io/name": "mountguard-controller"}},
                   "spec": {"containers": [{"name": "controller", "image": "mountguard:e2e"}]}}),
        );
        let election: Vec<String> = [
            "--leader-election",
            "--lease-name",
            "mountguard-failover-e2e",
            "--pod-name",
            name,
            "--pod-namespace",
            NS,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let process = format!("controller-{name}");
        let child = self.launch_controller(
            &process,
            self.report_addr,
            self.metrics_addr,
            &election,
            env,
        );
        async move { child }
    }

    fn pod_deletes(&self) -> Vec<String> {
        self.cluster
            .api()
            .requests()
            .into_iter()
            .filter(|r| r.method == "DELETE" && r.uri.contains("/pods/"))
            .map(|r| r.uri)
            .collect()
    }

    fn evictions_of(&self, pod: &str) -> usize {
        let path = format!("/pods/{pod}/eviction");
        self.cluster
            .api()
            .requests()
            .iter()
            .filter(|r| r.uri.contains(&path))
            .count()
    }
}
