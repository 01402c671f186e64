//! mountguard on the real control plane: the chart's rendered identity and
//! RBAC applied to the real API server, the chart's agent DaemonSet run by
//! the real DaemonSet controller and scheduler (its pods "run" on the node
//! doubles, which project real TokenRequest tokens bound to them), the
//! Slinky-like objects of the cluster in a box (the NodeSet validated by the
//! real Slinky CRD), and the real `mountguard-controller` and
//! `mountguard-agent` binaries as child processes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use mountguard_tests::cluster::{NODESET, SLURM_CLUSTER, SLURM_NAMESPACE, slurmd_template};
use mountguard_tests::mountguard::{ChildGuard, binary, free_addr, poll, tail, wait_ready};
use mountguard_tests::nodeset::{LABEL_CLUSTER, LABEL_POD_HOSTNAME};
use mountguard_tests::real::kubelet::{RealKubelet, kubelet_binaries};
use mountguard_tests::real::operator::OperatorBuild;
use mountguard_tests::real::{RealCluster, create, ensure_namespace, raw, token_request};
use serde_json::{Value, json};

/// The chart scenario whose objects are applied (reports over plain HTTP:
/// no cert-manager in the rig).
pub const CHART_SCENARIO: &str = "plaintext";
/// The chart's release namespace (charts/tests/render.py).
pub const NAMESPACE: &str = "mountguard-system";
/// The chart's agent ServiceAccount and DaemonSet.
pub const AGENT: &str = "mg-mountguard-agent";
/// The chart's controller ServiceAccount.
pub const CONTROLLER: &str = "mg-mountguard-controller";
/// The controller's pod (made from the chart Deployment's pod template).
pub const CONTROLLER_POD: &str = "mg-mountguard-controller-rig";
/// The agent's projected token volume in the chart's DaemonSet.
pub const TOKEN_VOLUME: &str = "report-credentials";
/// Agents' heartbeat interval.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// The chart scenario of the remediation tier (remediation on with the
/// jwt.key Secret, two replicas: leader election; plain HTTP reports).
pub const REMEDIATION_SCENARIO: &str = "rig-remediation";

/// The chart scenario of the workload remediation tier (remediation on
/// for Deployments, ReplicaSets, StatefulSets and DaemonSets, no
/// slurmrestd; plain HTTP reports).
pub const WORKLOADS_SCENARIO: &str = "rig-workloads";

/// What the rig runs besides the control plane, the chart and mountguard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    /// Detection only.
    Detect,
    /// NodeSet remediation: the Slinky doubles (with the operator double's
    /// rules when true).
    Slinky(bool),
    /// Workload remediation: the real controller-manager's ReplicaSet,
    /// StatefulSet and DaemonSet controllers recreate the pods.
    Workloads,
}

/// The chart rendered by the real Helm engine (charts/tests/render.py):
/// the objects of `scenario`.
fn render_chart(out: &Path, scenario: &str) -> Vec<Value> {
    let res = Command::new("python3")
        .arg(repo().join("charts/tests/render.py"))
        .arg("--out")
        .arg(out)
        .output()
        .expect("python3 must be installed");
    assert!(
        res.status.success(),
        "rendering the chart failed (pip install helm-python-sdk pyyaml; see scripts/test.sh):\n{}",
        String::from_utf8_lossy(&res.stderr)
    );
    let mut files: Vec<PathBuf> = std::fs::read_dir(out.join(scenario))
        .expect("rendered scenario")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    files
        .iter()
        .map(|f| serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap())
        .collect()
}

/// One node's agent: its DaemonSet pod and the token the node projected.
#[derive(Debug, Clone)]
pub struct Agent {
    pub node: String,
    pub pod: String,
    pub uid: String,
    pub root: PathBuf,
    pub token_file: PathBuf,
}

impl Agent {
    pub fn token(&self) -> String {
        std::fs::read_to_string(&self.token_file)
            .unwrap_or_default()
            .trim()
            .to_string()
    }
}

/// The real control plane, the chart's objects, controller and agents.
pub struct RealSystem {
    pub cluster: RealCluster,
    pub client: kube::Client,
    pub agents: Vec<Agent>,
    pub controller: Option<ChildGuard>,
    pub agent_procs: Vec<ChildGuard>,
    pub report_addr: std::net::SocketAddr,
    pub metrics_addr: std::net::SocketAddr,
    /// The real kubelets, when the nodes are real kubelets.
    pub kubelets: Vec<RealKubelet>,
    /// The version of each of `kubelets`.
    pub kubelet_versions: Vec<String>,
    /// Admin access as `Objects` (blocking calls).
    pub objects: std::sync::Arc<mountguard_tests::real::objects::RealObjects>,
    /// The chart Deployment's pod template (as a Pod in the release
    /// namespace), for more controller replicas' pods.
    controller_pod: Value,
    controller_env: Vec<(String, String)>,
    controller_kubeconfig: PathBuf,
    logs: PathBuf,
}

/// What runs the nodes' pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nodes {
    /// Node doubles (`mountguard_tests::real::node`).
    Doubles,
    /// The real kubelet on the fake CRI runtime, one per node.
    RealKubelets,
    /// The real kubelets of every minor of the skew window
    /// (`kubelet_binaries`, oldest first), one per node: node `i` runs
    /// the `i`th (the node count asked for is not used).
    EveryKubeletVersion,
}

/// Starts the real control plane or fails the test with the reason (the
/// upstream build, a process that did not start).
pub async fn start_cluster(nodes: usize) -> RealCluster {
    match RealCluster::builder().nodes(nodes).start().await {
        Ok(c) => c,
        Err(e) => panic!("the real control plane did not start: {e}"),
    }
}

impl RealSystem {
    pub async fn start(nodes: usize) -> RealSystem {
        Self::start_with(nodes, Nodes::Doubles).await
    }

    pub async fn start_with(nodes: usize, kind: Nodes) -> RealSystem {
        Self::start_opts(nodes, kind, Tier::Detect).await
    }

    /// The workload remediation tier on real kubelets: the chart's
    /// [`WORKLOADS_SCENARIO`] (the apps/v1 rules for every kind), the
    /// controller without slurmrestd, with short remediation timings.
    pub async fn start_workload_remediation_on_real_kubelets(nodes: usize) -> RealSystem {
        Self::start_opts(nodes, Nodes::RealKubelets, Tier::Workloads).await
    }

    /// The remediation tier: node doubles, the Slinky doubles as clients
    /// of the real API server (slurmrestd, NodeSet, bridge; with
    /// `operator_rules` also the operator double's syncCordon and the
    /// slurmd preStop hook in the pod template), the chart's
    /// [`REMEDIATION_SCENARIO`] (remediation RBAC, leader election on a
    /// real Lease) and the controller pointed at the slurmrestd double
    /// with short remediation timings.
    pub async fn start_remediation(nodes: usize, operator_rules: bool) -> RealSystem {
        Self::start_opts(nodes, Nodes::Doubles, Tier::Slinky(operator_rules)).await
    }

    /// The remediation tier with the real kubelet on the fake CRI runtime
    /// running every node's pods, the NodeSet's included; container execs
    /// (the slurmd preStop hook, with `operator_rules`) go to the same
    /// exec hook as the node doubles' (`RealKubelet::start_with_exec`).
    pub async fn start_remediation_on_real_kubelets(
        nodes: usize,
        operator_rules: bool,
    ) -> RealSystem {
        Self::start_opts(nodes, Nodes::RealKubelets, Tier::Slinky(operator_rules)).await
    }

    /// The remediation tier with the real Slinky operator
    /// (`mountguard_tests::real::operator`, built from checkouts) in place
    /// of the operator and NodeSet doubles: its NodeSet controller makes
    /// the slurmd pods, its slurm client does the Slurm writes of its
    /// rules, the node doubles run its preStop hook. Fails with what to do
    /// when the build is not there.
    pub async fn start_with_real_operator(nodes: usize) -> RealSystem {
        let build = OperatorBuild::from_env().unwrap_or_else(|e| panic!("{e}"));
        Self::start_full(nodes, Nodes::Doubles, Tier::Slinky(false), Some(build)).await
    }

    /// The remediation tier of [`Self::start_remediation`] (without the
    /// operator's rules) with real Slurm in place of the slurmrestd double
    /// (`RealClusterBuilder::real_slurm`): the controller drains, verifies
    /// and resumes through real slurmrestd, as SlurmUser `slurm` (without
    /// Slurm accounting the only administrators are SlurmUser and root).
    /// With `real_kubelets`, the real kubelet on the fake CRI runtime runs
    /// every node's pods, and each slurmd reads the `slurm.key` the real
    /// kubelet wrote; else the node doubles do.
    pub async fn start_remediation_on_real_slurm(
        nodes: usize,
        prefix: PathBuf,
        real_kubelets: bool,
    ) -> RealSystem {
        let kind = if real_kubelets {
            Nodes::RealKubelets
        } else {
            Nodes::Doubles
        };
        Self::start_with_slurm(
            nodes,
            kind,
            Tier::Slinky(false),
            None,
            Some((prefix, false)),
        )
        .await
    }

    /// [`Self::start_remediation_on_real_slurm`] on node doubles, the
    /// workers dynamic Slurm nodes as Slinky runs them, slurmctld losing
    /// its saved state on a restart
    /// (`RealClusterBuilder::dynamic_slurm_nodes`).
    pub async fn start_remediation_on_real_dynamic_slurm(
        nodes: usize,
        prefix: PathBuf,
    ) -> RealSystem {
        Self::start_with_slurm(
            nodes,
            Nodes::Doubles,
            Tier::Slinky(false),
            None,
            Some((prefix, true)),
        )
        .await
    }

    async fn start_opts(nodes: usize, kind: Nodes, tier: Tier) -> RealSystem {
        Self::start_full(nodes, kind, tier, None).await
    }

    async fn start_full(
        nodes: usize,
        kind: Nodes,
        tier: Tier,
        operator: Option<OperatorBuild>,
    ) -> RealSystem {
        Self::start_with_slurm(nodes, kind, tier, operator, None).await
    }

    async fn start_with_slurm(
        nodes: usize,
        kind: Nodes,
        tier: Tier,
        operator: Option<OperatorBuild>,
        real_slurm: Option<(PathBuf, bool)>,
    ) -> RealSystem {
        let slinky = match tier {
            Tier::Slinky(rules) => Some(rules),
            Tier::Detect | Tier::Workloads => None,
        };
        for bin in ["mountguard-controller", "mountguard-agent"] {
            if let Err(e) = binary(bin) {
                panic!("{e}");
            }
        }
        let real_operator = operator.is_some();
        let mut cluster = {
            let mut b =
                RealCluster::builder().nodes(if kind == Nodes::Doubles { nodes } else { 0 });
            if let Some(rules) = slinky {
                b = b.slinky_doubles(rules);
            }
            if let Some(build) = operator {
                b = b.real_slinky_operator(build);
            }
            if let Some((prefix, dynamic)) = real_slurm {
                b = b.real_slurm(prefix, nodes);
                if dynamic {
                    b = b.dynamic_slurm_nodes();
                }
            }
            match b.start().await {
                Ok(c) => c,
                Err(e) => panic!("the real control plane did not start: {e}"),
            }
        };
        let mut kubelets = Vec::new();
        let mut kubelet_versions = Vec::new();
        if kind == Nodes::RealKubelets {
            for i in 0..nodes {
                let exec = cluster
                    .slurm()
                    .map(mountguard_tests::real::slinky::slurmd_exec_hook);
                match RealKubelet::start_with_exec(&cluster, &format!("node-{i}"), exec).await {
                    Ok(k) => kubelets.push(k),
                    Err(e) => panic!("{e}"),
                }
            }
        }
        if kind == Nodes::EveryKubeletVersion {
            let binaries = kubelet_binaries(&cluster).unwrap_or_else(|e| panic!("{e}"));
            let starts = binaries.iter().enumerate().map(|(i, (_, bin))| {
                let name = format!("node-{i}");
                let cluster = &cluster;
                async move { RealKubelet::start_binary(cluster, &name, None, bin).await }
            });
            for (r, (version, _)) in futures::future::join_all(starts)
                .await
                .into_iter()
                .zip(&binaries)
            {
                match r {
                    Ok(k) => kubelets.push(k),
                    Err(e) => panic!("kubelet {version}: {e}"),
                }
                kubelet_versions.push(version.clone());
            }
        }
        if kind == Nodes::RealKubelets && slinky.is_some() {
            let roots = kubelets
                .iter()
                .map(|k| (k.name().to_string(), k.root().to_path_buf()))
                .collect();
            if let Err(e) = cluster.start_slinky_doubles(roots).await {
                panic!("starting the Slinky doubles: {e}");
            }
        }
        let node_roots: Vec<(String, PathBuf)> = match kind {
            Nodes::Doubles => cluster
                .node_names()
                .into_iter()
                .enumerate()
                .map(|(i, n)| (n, cluster.kubelet_root(i)))
                .collect(),
            Nodes::RealKubelets | Nodes::EveryKubeletVersion => kubelets
                .iter()
                .map(|k| (k.name().to_string(), k.root().to_path_buf()))
                .collect(),
        };
        let client = cluster.client().await.unwrap();
        let logs = cluster.dir().join("mountguard-logs");
        std::fs::create_dir_all(&logs).unwrap();
        let scenario = match tier {
            Tier::Slinky(_) => REMEDIATION_SCENARIO,
            Tier::Workloads => WORKLOADS_SCENARIO,
            Tier::Detect => CHART_SCENARIO,
        };
        let rendered = render_chart(&cluster.dir().join("chart"), scenario);
        ensure_namespace(&client, NAMESPACE).await.unwrap();
        let mut deployment = None;
        let mut fingerprint_key = None;
        for obj in &rendered {
            match obj["kind"].as_str().unwrap_or("") {
                "Deployment" => deployment = Some(obj.clone()),
                "ServiceAccount" | "ClusterRole" | "ClusterRoleBinding" | "Role"
                | "RoleBinding" | "DaemonSet" | "Secret" => {
                    let mut obj = obj.clone();
                    if obj["kind"] == "DaemonSet" {
                        // The agent reads each kubelet's own root (given
                        // with --kubelet-root), not the host's
                        // /var/lib/kubelet: no type check for that hostPath
                        // (a real kubelet would refuse a missing Directory).
                        for v in obj["spec"]["template"]["spec"]["volumes"]
                            .as_array_mut()
                            .into_iter()
                            .flatten()
                        {
                            if let Some(h) = v["hostPath"].as_object_mut() {
                                h.remove("type");
                            }
                        }
                    }
                    let obj = &obj;
                    let stored = create(&client, obj)
                        .await
                        .unwrap_or_else(|e| panic!("applying the chart's {}: {e}", obj["kind"]));
                    if obj["kind"] == "Secret" {
                        fingerprint_key = stored["data"]["key"]
                            .as_str()
                            .map(|k| base64::engine::general_purpose::STANDARD.decode(k).unwrap());
                    }
                }
                _ => {}
            }
        }
        // The rig's status reader (the real API server's static token): the
        // chart's status reader ClusterRole, bound cluster-wide to its group.
        let reader_role = rendered
            .iter()
            .find(|o| {
                o["kind"] == "ClusterRole"
                    && o["metadata"]["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with("-status-reader"))
            })
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .expect("the chart renders the status reader ClusterRole");
        create(
            &client,
            &json!({
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "rig-status-readers"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": reader_role},
                "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io",
                              "name": mountguard_tests::mountguard::STATUS_READER_GROUP}],
            }),
        )
        .await
        .unwrap_or_else(|e| panic!("binding the rig's status reader: {e}"));
        let deployment = deployment.expect("the chart renders the controller Deployment");
        let key_file = cluster.dir().join("fingerprint.key");
        std::fs::write(
            &key_file,
            fingerprint_key.expect("the chart renders the fingerprint key Secret"),
        )
        .unwrap();
        // The controller's own pod, from the chart Deployment's template
        // (the controller labels the acting replica's pod; the real
        // scheduler binds it and a node double "runs" it).
        let mut pod_template = deployment["spec"]["template"].clone();
        pod_template["metadata"]["name"] = json!(CONTROLLER_POD);
        pod_template["metadata"]["namespace"] = json!(NAMESPACE);
        pod_template["apiVersion"] = json!("v1");
        pod_template["kind"] = json!("Pod");
        create(&client, &pod_template)
            .await
            .unwrap_or_else(|e| panic!("creating the controller pod: {e}"));
        let controller_pod = pod_template.clone();
        if real_operator {
            let ip = cluster
                .slurmrestd_ip()
                .expect("the real operator's rig has the slurmrestd double");
            operator_objects(&client, nodes, ip).await;
        } else {
            slinky_objects(
                &client,
                nodes,
                !cluster.makes_nodeset_pods(),
                slinky == Some(true),
            )
            .await;
        }
        let agents = wait_for_agent_pods(&cluster, &client, &node_roots).await;
        // The controller's identity: a TokenRequest token of the chart's
        // controller ServiceAccount (what its projected token would be).
        let token = token_request(&client, NAMESPACE, CONTROLLER, &[], 3600, None)
            .await
            .unwrap();
        let controller_kubeconfig = cluster.token_kubeconfig("controller", &token).unwrap();
        let report_addr = free_addr().unwrap();
        let metrics_addr = free_addr().unwrap();
        let mut controller_env = controller_env(&deployment, &key_file, report_addr, metrics_addr);
        let mut rig_env = Vec::new();
        if let Some(url) = cluster.slurmrestd_url() {
            rig_env.push(("MOUNTGUARD_SLURMRESTD_URL", url));
        }
        if cluster.real_slurm().is_some() {
            rig_env.push((
                "MOUNTGUARD_SLURM_USER",
                mountguard_tests::real::slurm::SLURM_USER.to_string(),
            ));
        }
        if tier != Tier::Detect {
            rig_env.push(("MOUNTGUARD_REMEDIATION_DELAY", "1s".to_string()));
            rig_env.push(("MOUNTGUARD_REPLACEMENT_TIMEOUT", "2m".to_string()));
        }
        for (k, v) in rig_env {
            controller_env.retain(|(x, _)| x != k);
            controller_env.push((k.to_string(), v));
        }
        let objects = std::sync::Arc::new(mountguard_tests::real::objects::RealObjects::new(
            client.clone(),
        ));
        let mut sys = RealSystem {
            cluster,
            client,
            agents,
            controller: None,
            agent_procs: Vec::new(),
            report_addr,
            metrics_addr,
            kubelets,
            kubelet_versions,
            objects,
            controller_pod,
            controller_env,
            controller_kubeconfig,
            logs,
        };
        sys.start_controller().await;
        for i in 0..sys.agents.len() {
            let a = sys.spawn_agent(i);
            sys.agent_procs.push(a);
        }
        sys
    }

    /// Starts (or restarts) the controller; waits until it is ready.
    pub async fn start_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            c.kill();
        }
        let child = self.spawn_controller("controller", CONTROLLER_POD).await;
        self.controller = Some(child);
    }

    /// Starts one controller process (log `<name>.log`) acting for pod
    /// `pod`, on the system's addresses; waits until it is ready.
    pub async fn spawn_controller(&self, name: &str, pod: &str) -> ChildGuard {
        let mut child = self.launch_controller(name, pod, &[]);
        if let Err(e) = wait_ready(&mut child, &self.metrics_base(), Duration::from_secs(60)).await
        {
            panic!(
                "{name} did not become ready: {e}\n{}",
                self.cluster.logs(10)
            );
        }
        child
    }

    /// Starts one controller process like [`RealSystem::spawn_controller`]
    /// with `env` added to its environment; does not wait until it is
    /// ready (a fail point may kill it first).
    pub fn launch_controller(&self, name: &str, pod: &str, env: &[(&str, &str)]) -> ChildGuard {
        let mut cmd = Command::new(binary("mountguard-controller").unwrap());
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(&self.controller_kubeconfig)
            .env_remove("KUBECONFIG");
        for (k, _) in std::env::vars() {
            if k.starts_with("MOUNTGUARD_") {
                cmd.env_remove(k);
            }
        }
        cmd.envs(self.controller_env.iter().map(|(k, v)| (k, v)));
        cmd.env("MOUNTGUARD_POD_NAME", pod);
        cmd.envs(env.iter().copied());
        ChildGuard::spawn(name, cmd, &self.logs.join(format!("{name}.log"))).unwrap()
    }

    /// Restarts the controller with `vars` set in its environment over the
    /// chart's and the rig's values (e.g. a longer `MOUNTGUARD_GRACE`);
    /// waits until it is ready.
    pub async fn restart_controller_with(&mut self, vars: &[(&str, &str)]) {
        for (k, v) in vars {
            self.controller_env.retain(|(key, _)| key != k);
            self.controller_env.push((k.to_string(), v.to_string()));
        }
        self.start_controller().await;
    }

    fn spawn_agent(&self, i: usize) -> ChildGuard {
        let a = &self.agents[i];
        let mut cmd = Command::new(binary("mountguard-agent").unwrap());
        cmd.arg("run")
            .arg("--kubelet-root")
            .arg(&a.root)
            .args(["--node-name", &a.node])
            .args(["--listen", "127.0.0.1:0"])
            .args(["--rescan-interval", "1s"])
            .args([
                "--heartbeat-interval",
                &format!("{}ms", HEARTBEAT.as_millis()),
            ])
            .args(["--debounce", "50ms"])
            .args(["--controller-url", &format!("http://{}", self.report_addr)])
            .arg("--token-file")
            .arg(&a.token_file)
            .args(["--log", "info"]);
        for (k, _) in std::env::vars() {
            if k.starts_with("MOUNTGUARD_") {
                cmd.env_remove(k);
            }
        }
        ChildGuard::spawn(
            &format!("agent-{}", a.node),
            cmd,
            &self.logs.join(format!("agent-{}.log", a.node)),
        )
        .unwrap()
    }

    pub fn metrics_base(&self) -> String {
        format!("http://{}", self.metrics_addr)
    }

    pub fn report_base(&self) -> String {
        format!("http://{}", self.report_addr)
    }

    /// The controller ServiceAccount's user name.
    pub fn controller_user(&self) -> String {
        format!("system:serviceaccount:{NAMESPACE}:{CONTROLLER}")
    }

    /// Logs of mountguard's processes and of the control plane.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for c in self.controller.iter().chain(self.agent_procs.iter()) {
            out.push_str(&format!(
                "--- {} ---\n{}\n",
                c.name(),
                c.log_tail(if c.name() == "controller" { 120 } else { 30 })
            ));
        }
        // Replicas a body started (`Rig::launch_replica`): their own logs.
        out.push_str(&mountguard_tests::mountguard::replica_logs(&self.logs, 30));
        for k in &self.kubelets {
            out.push_str(&k.logs(15));
        }
        let op = self.cluster.slinky_operator_log();
        if !op.is_empty() {
            out.push_str(&format!("--- slurm-operator ---\n{}\n", tail(&op, 40)));
        }
        out.push_str(&self.cluster.logs(15));
        out
    }

    /// The controller's full log.
    pub fn controller_log(&self) -> String {
        std::fs::read_to_string(self.logs.join("controller.log")).unwrap_or_default()
    }

    /// Every request of the controller's user, from the API server's audit
    /// log, in order.
    pub fn controller_requests(&self) -> Vec<Audited> {
        let user = self.controller_user();
        self.cluster
            .audit_events()
            .into_iter()
            .filter(|e| e["user"]["username"] == user.as_str())
            .map(|e| {
                let s = |v: &Value| v.as_str().unwrap_or("").to_string();
                Audited {
                    verb: s(&e["verb"]),
                    resource: s(&e["objectRef"]["resource"]),
                    subresource: s(&e["objectRef"]["subresource"]),
                    namespace: s(&e["objectRef"]["namespace"]),
                    name: s(&e["objectRef"]["name"]),
                    code: e["responseStatus"]["code"].as_u64().unwrap_or(0),
                    dry_run: s(&e["requestURI"]).contains("dryRun="),
                }
            })
            .collect()
    }

    /// The pods the controller evicted through the Eviction API (answered
    /// 201, not a dry run), in order, from the audit log; panics if the
    /// controller ever deleted a pod itself (remediation evicts, never
    /// deletes).
    pub fn evicted_never_deleted(&self) -> Vec<String> {
        let reqs = self.controller_requests();
        assert!(
            !reqs
                .iter()
                .any(|r| r.verb == "delete" && r.resource == "pods"),
            "no pod DELETE by the controller: {reqs:?}"
        );
        reqs.into_iter()
            .filter(|r| {
                r.resource == "pods" && r.subresource == "eviction" && r.code == 201 && !r.dry_run
            })
            .map(|r| r.name)
            .collect()
    }

    pub async fn shutdown(mut self) {
        for a in &mut self.agent_procs {
            a.kill();
        }
        if let Some(c) = self.controller.as_mut() {
            c.kill();
        }
        for k in &mut self.kubelets {
            k.stop();
        }
        self.cluster.shutdown().await;
    }
}

/// One request in the API server's audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Audited {
    pub verb: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: u64,
    /// Asked with `dryRun` (in the query): checked, nothing written.
    pub dry_run: bool,
}

impl Audited {
    /// A mutating verb (TokenReviews, creates that store nothing, excepted).
    pub fn is_write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        ) && !matches!(
            // Reviews are `create`s that persist nothing: the report API's
            // TokenReviews, the status API's TokenReviews and
            // SubjectAccessReviews.
            self.resource.as_str(),
            "tokenreviews" | "subjectaccessreviews"
        )
    }

    /// The refused ones.
    pub fn is_refused(&self) -> bool {
        self.code == 401 || self.code == 403
    }
}

/// The chart Deployment's controller environment, with the addresses,
/// the fingerprint key file and short timings of the rig.
fn controller_env(
    deployment: &Value,
    key_file: &Path,
    report: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
) -> Vec<(String, String)> {
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if let (Some(k), Some(v)) = (e["name"].as_str(), e["value"].as_str()) {
            // The webhook's certificate is a file of the chart's pod that
            // this rig does not have: its tests give their own
            // (`admission.rs`, `RealSystem::serve_admission`).
            if k.starts_with("MOUNTGUARD_ADMISSION_") {
                continue;
            }
            env.insert(k.to_string(), v.to_string());
        }
    }
    for (k, v) in [
        ("MOUNTGUARD_POD_NAME", CONTROLLER_POD.to_string()),
        ("MOUNTGUARD_POD_NAMESPACE", NAMESPACE.to_string()),
        ("MOUNTGUARD_REPORT_LISTEN", report.to_string()),
        ("MOUNTGUARD_METRICS_LISTEN", metrics.to_string()),
        (
            "MOUNTGUARD_FINGERPRINT_KEY_FILE",
            key_file.display().to_string(),
        ),
        ("MOUNTGUARD_GRACE", "2s".to_string()),
        ("MOUNTGUARD_REPORT_RATE_LIMIT", "100/s,100".to_string()),
        ("MOUNTGUARD_LOG_FORMAT", "text".to_string()),
    ] {
        env.insert(k.to_string(), v);
    }
    env.into_iter().collect()
}

/// The Slinky-like objects of the cluster in a box, in the real API: auth
/// Secrets, ConfigMaps, the workers' PDB, the NodeSet (a `slinky.slurm.net`
/// custom resource of the real CRD), and its slurmd pods, one per node
/// (created here with the NodeSet as controlling owner when `create_pods`;
/// otherwise the NodeSet double creates them). With `prestop`, the slurmd
/// container carries the Slinky worker's preStop hook.
async fn slinky_objects(client: &kube::Client, nodes: usize, create_pods: bool, prestop: bool) {
    let mut template = slurmd_template();
    template["spec"]["automountServiceAccountToken"] = json!(false);
    if prestop {
        template["spec"]["containers"][0]["lifecycle"] = json!({"preStop": {"exec": {
            "command": mountguard_tests::real::slinky::slurmd_prestop_command(),
        }}});
    }
    let uid = mountguard_tests::real::slinky::create_nodeset(client, nodes, template)
        .await
        .unwrap_or_else(|e| panic!("creating the Slinky objects: {e}"));
    for i in 0..nodes {
        if create_pods {
            create(client, &slurmd_pod(i, &uid)).await.unwrap();
        }
    }
}

/// The objects of the rig with the real Slinky operator: the auth Secrets
/// and hooks ConfigMap ([`mountguard_tests::real::slinky::create_auth_and_hooks`]; not the PDB of [`slinky_objects`]: the operator makes
/// the workers' PDB, `workerbuilder` `BuildClusterWorkerPodDisruptionBudget`)
/// and the operator's custom resources
/// ([`mountguard_tests::real::operator::custom_resources`]).
async fn operator_objects(client: &kube::Client, nodes: usize, slurmctld: std::net::Ipv4Addr) {
    mountguard_tests::real::slinky::create_auth_and_hooks(client)
        .await
        .unwrap_or_else(|e| panic!("creating the Slinky Secrets: {e}"));
    let slurmctld = std::net::SocketAddr::from((slurmctld, 6817));
    for o in mountguard_tests::real::operator::custom_resources(nodes, slurmctld) {
        create(client, &o)
            .await
            .unwrap_or_else(|e| panic!("creating the {} for the real operator: {e}", o["kind"]));
    }
}

/// Slurmd pod `i` of the NodeSet (UID `nodeset_uid`), on node `node-<i>`,
/// with the labels and owner the Slinky operator sets.
pub fn slurmd_pod(i: usize, nodeset_uid: &str) -> Value {
    let mut template = slurmd_template();
    template["spec"]["automountServiceAccountToken"] = json!(false);
    let name = format!("{NODESET}-{i}");
    let mut spec = template["spec"].clone();
    spec["hostname"] = json!(name);
    spec["nodeName"] = json!(format!("node-{i}"));
    let mut labels = template["metadata"]["labels"].clone();
    for (k, v) in [
        ("app.kubernetes.io/name", "slurmd"),
        ("app.kubernetes.io/component", "worker"),
        ("app.kubernetes.io/instance", NODESET),
        (LABEL_CLUSTER, SLURM_CLUSTER),
        (LABEL_POD_HOSTNAME, name.as_str()),
    ] {
        labels[k] = json!(v);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": SLURM_NAMESPACE, "labels": labels,
            "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                "name": NODESET, "uid": nodeset_uid, "controller": true, "blockOwnerDeletion": true}]},
        "spec": spec,
    })
}

/// Waits until the real DaemonSet controller and scheduler placed one agent
/// pod per node and each node double projected its token.
async fn wait_for_agent_pods(
    cluster: &RealCluster,
    client: &kube::Client,
    node_roots: &[(String, PathBuf)],
) -> Vec<Agent> {
    let nodes: Vec<String> = node_roots.iter().map(|(n, _)| n.clone()).collect();
    let roots: Vec<PathBuf> = node_roots.iter().map(|(_, r)| r.clone()).collect();
    let r = poll(
        "one running agent pod with a projected token per node",
        Duration::from_secs(90),
        || {
            let client = client.clone();
            let nodes = nodes.clone();
            let roots = roots.clone();
            async move {
                let (_, list) = raw(
                    &client,
                    "GET",
                    &format!("/api/v1/namespaces/{NAMESPACE}/pods"),
                    None,
                )
                .await
                .ok()?;
                let mut out = Vec::new();
                for (node, root) in nodes.iter().zip(&roots) {
                    let p = list["items"].as_array()?.iter().find(|p| {
                        p["spec"]["nodeName"] == node.as_str()
                            && p["status"]["phase"] == "Running"
                            && p["metadata"]["deletionTimestamp"].is_null()
                    })?;
                    let uid = p["metadata"]["uid"].as_str()?.to_string();
                    let token_file = mountguard_inventory::layout::pod_dir(root, &uid)
                        .join("volumes/kubernetes.io~projected")
                        .join(TOKEN_VOLUME)
                        .join("token");
                    let a = Agent {
                        node: node.clone(),
                        pod: p["metadata"]["name"].as_str()?.to_string(),
                        uid,
                        root: root.clone(),
                        token_file,
                    };
                    if a.token().is_empty() {
                        return None;
                    }
                    out.push(a);
                }
                Some(out)
            }
        },
    )
    .await;
    match r {
        Ok(a) => a,
        Err(e) => panic!("{e}\n{}", cluster.logs(20)),
    }
}

/// Polls, and on timeout panics with every log.
pub async fn wait<T, F, Fut>(sys: &RealSystem, what: &str, timeout: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match poll(what, timeout, check).await {
        Ok(v) => v,
        Err(e) => panic!("{e}\n{}", sys.logs()),
    }
}

/// Waits until every slurmd pod's key volume is Fresh and every verdict is
/// Fresh or Skipped.
pub async fn wait_all_fresh(sys: &RealSystem) -> Value {
    let base = sys.metrics_base();
    let n = sys.agents.len();
    wait(
        sys,
        "every verdict Fresh or Skipped",
        Duration::from_secs(60),
        || {
            let base = base.clone();
            async move {
                let doc = mountguard_tests::scenario::verdicts(&base, "all=1")
                    .await
                    .ok()?;
                let items = doc["verdicts"].as_array()?;
                let keys_fresh = (0..n).all(|i| {
                    items.iter().any(|v| {
                        v["pod"] == format!("{NODESET}-{i}").as_str()
                            && v["subject"] == "volume slurm-etc"
                            && v["state"] == "Fresh"
                    })
                });
                let all_ok = items
                    .iter()
                    .all(|v| v["state"] == "Fresh" || v["state"] == "Skipped");
                (keys_fresh && all_ok).then_some(doc)
            }
        },
    )
    .await
}

/// Waits until an Event in [`SLURM_NAMESPACE`] satisfies
/// `wanted(reason, regarding kind, regarding name, note)`; returns its
/// note.
pub async fn wait_event(
    sys: &RealSystem,
    what: &str,
    timeout: Duration,
    wanted: impl Fn(&str, &str, &str, &str) -> bool + Clone,
) -> String {
    let client = sys.client.clone();
    wait(sys, what, timeout, || {
        let (client, wanted) = (client.clone(), wanted.clone());
        async move {
            events(&client, SLURM_NAMESPACE)
                .await
                .into_iter()
                .find(|(r, k, n, note)| wanted(r, k, n, note))
                .map(|(_, _, _, note)| note)
        }
    })
    .await
}

/// Events in the real API regarding objects in `ns` (both Event APIs):
/// `(reason, regarding kind, regarding name, note)`.
pub async fn events(client: &kube::Client, ns: &str) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    for path in [
        format!("/apis/events.k8s.io/v1/namespaces/{ns}/events"),
        format!("/api/v1/namespaces/{ns}/events"),
    ] {
        let Ok((200, list)) = raw(client, "GET", &path, None).await else {
            continue;
        };
        for e in list["items"].as_array().into_iter().flatten() {
            let obj = if e["regarding"].is_object() {
                &e["regarding"]
            } else {
                &e["involvedObject"]
            };
            let reason = e["reason"].as_str().unwrap_or("").to_string();
            let item = (
                reason,
                obj["kind"].as_str().unwrap_or("").to_string(),
                obj["name"].as_str().unwrap_or("").to_string(),
                e["note"]
                    .as_str()
                    .or_else(|| e["message"].as_str())
                    .unwrap_or("")
                    .to_string(),
            );
            if !out.contains(&item) {
                out.push(item);
            }
        }
    }
    out
}

impl mountguard_tests::rig::Rig for RealSystem {
    fn rig_name(&self) -> &'static str {
        "real control plane"
    }

    fn objects(&self) -> std::sync::Arc<dyn mountguard_tests::objects::Objects> {
        self.objects.clone()
    }

    fn slurm(&self) -> mountguard_tests::slurmrestd::SlurmHandle {
        self.cluster.slurm().expect(
            "the remediation tier runs the slurmrestd double (RealSystem::start_remediation)",
        )
    }

    fn metrics_base(&self) -> String {
        RealSystem::metrics_base(self)
    }

    fn node_count(&self) -> usize {
        self.agents.len()
    }

    fn logs(&self) -> String {
        RealSystem::logs(self)
    }

    fn stop_controller(&mut self) {
        if let Some(mut c) = self.controller.take() {
            c.kill();
        }
    }

    /// A pod from the chart Deployment's template named `name`; the
    /// replica runs with the chart's environment (leader election on the
    /// chart's Lease in the release namespace).
    fn launch_replica(
        &self,
        name: &str,
        env: &[(&str, &str)],
    ) -> impl std::future::Future<Output = ChildGuard> {
        let mut pod = self.controller_pod.clone();
        pod["metadata"]["name"] = json!(name);
        let name = name.to_string();
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        async move {
            create(&self.client, &pod)
                .await
                .unwrap_or_else(|e| panic!("creating the replica's pod {name}: {e}"));
            let env: Vec<(&str, &str)> =
                env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            self.launch_controller(&format!("controller-{name}"), &name, &env)
        }
    }

    /// From the API server's audit log.
    fn pod_deletes(&self) -> Vec<String> {
        self.controller_requests()
            .into_iter()
            .filter(|r| r.verb == "delete" && r.resource == "pods")
            .map(|r| format!("{}/{}", r.namespace, r.name))
            .collect()
    }

    /// From the API server's audit log (every answer, refusals included).
    fn evictions_of(&self, pod: &str) -> usize {
        self.controller_requests()
            .iter()
            .filter(|r| {
                r.resource == "pods" && r.subresource == "eviction" && r.name == pod && !r.dry_run
            })
            .count()
    }

    fn granted_evictions_of(&self, pod: &str) -> usize {
        self.controller_requests()
            .iter()
            .filter(|r| {
                r.resource == "pods"
                    && r.subresource == "eviction"
                    && r.name == pod
                    && !r.dry_run
                    && (200..300).contains(&r.code)
            })
            .count()
    }
}
