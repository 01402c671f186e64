//! The real-node tier's rig: the real control plane ([`RealCluster`], the
//! same startup as the other real tests), one real kubelet on a real
//! container runtime ([`Containerd`]) and the mountguard images built here
//! by scripts/images.sh and imported into that runtime (no registry), so a
//! pod is processes under containerd's shim with the kubelet's volumes bind
//! mounted into its mount namespace.
//!
//! [`RealNode::start`] answers `Ok(Err(Unavailable))` when the runtime
//! cannot run on this machine (not root, a package missing, containerd or
//! the kubelet failing to start on it): the tests print a loud
//! `SKIPPED: <reason>` line and pass. Everything after a successful start is
//! asserted. Dropping a [`RealNode`] stops the kubelet, then the runtime
//! (containers, shims, mounts, bridge, cgroups), then the control plane.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::containerd::{Containerd, Unavailable};
use super::kubelet::RealKubelet;
use super::services::{
    CLUSTER_DOMAIN, CoreDns, KubeProxy, TcpForwarder, publish_kubernetes_endpoint,
};
use super::{RealCluster, repo};

/// The node's name.
pub const NODE: &str = "node-0";

/// The images of scripts/images.sh (its `images.env`).
#[derive(Debug, Clone)]
pub struct Images {
    /// The directory of the archives.
    pub dir: PathBuf,
    /// The chart's appVersion.
    pub version: String,
    /// `(repository, index digest)` of the agent image.
    pub agent: (String, String),
    /// `(repository, index digest)` of the controller image.
    pub controller: (String, String),
    /// The pause image reference (`repository:tag`).
    pub pause: String,
    /// The Slurm worker image, when scripts/images.sh built it
    /// (`MOUNTGUARD_SLURM_PREFIX`).
    pub slurmd: Option<SlurmdImage>,
}

/// The slurmd image of scripts/images.sh (`slurmd_image`).
#[derive(Debug, Clone)]
pub struct SlurmdImage {
    /// `(repository, index digest)`.
    pub image: (String, String),
    /// The Slurm install prefix it was built from (slurmctld and
    /// slurmrestd run from the same one).
    pub prefix: PathBuf,
    /// Where it holds Slurm's plugins (the rig's PluginDir).
    pub plugin_dir: PathBuf,
}

impl SlurmdImage {
    /// `repository@digest`.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.image.0, self.image.1)
    }
}

impl Images {
    /// Reads `dir/images.env`.
    pub fn read(dir: &Path) -> io::Result<Self> {
        let text = std::fs::read_to_string(dir.join("images.env"))?;
        let get = |k: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{k}=")))
                .map(str::to_string)
                .ok_or_else(|| io::Error::other(format!("{k} missing in images.env")))
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            version: get("VERSION")?,
            agent: (get("AGENT_IMAGE")?, get("AGENT_DIGEST")?),
            controller: (get("CONTROLLER_IMAGE")?, get("CONTROLLER_DIGEST")?),
            pause: format!("{}:{}", get("PAUSE_IMAGE")?, get("PAUSE_TAG")?),
            slurmd: match (
                get("SLURMD_IMAGE"),
                get("SLURMD_DIGEST"),
                get("SLURM_PREFIX"),
                get("SLURMD_PLUGIN_DIR"),
            ) {
                (Ok(i), Ok(d), Ok(p), Ok(plugins)) => Some(SlurmdImage {
                    image: (i, d),
                    prefix: PathBuf::from(p),
                    plugin_dir: PathBuf::from(plugins),
                }),
                _ => None,
            },
        })
    }

    /// `$MOUNTGUARD_IMAGES_DIR` (set by scripts/test.sh, which ran
    /// scripts/images.sh), else scripts/images.sh run into `out`.
    pub fn get(out: &Path) -> Result<Self, Unavailable> {
        if let Some(dir) = std::env::var_os("MOUNTGUARD_IMAGES_DIR") {
            return Self::read(Path::new(&dir)).map_err(|e| {
                Unavailable(format!(
                    "MOUNTGUARD_IMAGES_DIR={}: {e}",
                    Path::new(&dir).display()
                ))
            });
        }
        let res = Command::new("bash")
            .arg(repo().join("scripts/images.sh"))
            .arg(out)
            .output()
            .map_err(|e| Unavailable(format!("running scripts/images.sh: {e}")))?;
        if !res.status.success() {
            return Err(Unavailable(format!(
                "scripts/images.sh failed ({}): {}",
                res.status,
                String::from_utf8_lossy(&res.stderr).trim()
            )));
        }
        Self::read(out).map_err(|e| Unavailable(format!("scripts/images.sh: {e}")))
    }

    /// `repository@digest` of the agent image.
    pub fn agent_ref(&self) -> String {
        format!("{}@{}", self.agent.0, self.agent.1)
    }

    /// `repository@digest` of the controller image.
    pub fn controller_ref(&self) -> String {
        format!("{}@{}", self.controller.0, self.controller.1)
    }
}

/// The directory of containerd, runc, kube-proxy, helm and coredns:
/// `$MOUNTGUARD_NODE_TOOLS_BIN` or what scripts/node-tools.sh prints (it
/// builds what its cache lacks).
pub fn node_tools() -> Result<PathBuf, Unavailable> {
    if let Some(d) = std::env::var_os("MOUNTGUARD_NODE_TOOLS_BIN") {
        return Ok(PathBuf::from(d));
    }
    let out = Command::new("bash")
        .arg(repo().join("scripts/node-tools.sh"))
        .output()
        .map_err(|e| Unavailable(format!("running scripts/node-tools.sh: {e}")))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    match stdout.lines().last() {
        Some(l) if out.status.success() => Ok(PathBuf::from(l.trim())),
        _ => Err(Unavailable(format!(
            "scripts/node-tools.sh failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))),
    }
}

/// Who plays Slurm on a [`RealNode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slurm {
    /// No Slinky side.
    None,
    /// The slurmrestd double and the slurmd bridge.
    Double,
    /// Real Slurm, slurmd in the worker pods the NodeSet double makes.
    Real,
    /// Real Slurm, slurmd in the worker pods the real Slinky operator
    /// makes.
    RealWithOperator,
}

/// The control plane, one kubelet on containerd, the images imported.
#[derive(Debug)]
pub struct RealNode {
    /// The kubelet (dropped first).
    pub kubelet: RealKubelet,
    /// Cluster DNS (CoreDNS).
    pub dns: CoreDns,
    /// kube-proxy.
    pub proxy: KubeProxy,
    /// Service `kubernetes`'s endpoint on the bridge.
    pub forwarder: TcpForwarder,
    /// The slurmrestd double's address on the bridge
    /// ([`RealNode::start_with_slinky`]).
    pub slurmrestd: Option<TcpForwarder>,
    /// The runtime (dropped after the kubelet).
    pub runtime: Containerd,
    /// The control plane (dropped last).
    pub cluster: RealCluster,
    /// The imported images.
    pub images: Images,
    // Dropped after the runtime: its state lives here.
    _dir: tempfile::TempDir,
}

impl RealNode {
    /// Starts everything; `Ok(Err(_))` when the runtime cannot run here.
    pub async fn start() -> io::Result<Result<Self, Unavailable>> {
        Self::start_opts(Slurm::None).await
    }

    /// [`RealNode::start`] with the Slinky side: the Slinky CRDs, the
    /// slurmrestd double (reachable from pods on the bridge gateway,
    /// [`RealNode::slurmrestd_url`]) and the NodeSet double and slurmd
    /// bridge ([`super::slinky`]) for this node's kubelet root.
    pub async fn start_with_slinky() -> io::Result<Result<Self, Unavailable>> {
        Self::start_opts(Slurm::Double).await
    }

    /// [`RealNode::start_with_slinky`] with real Slurm in place of the
    /// slurmrestd double: slurmctld and slurmrestd as processes on the
    /// pod network's gateway ([`super::slurm::RealSlurm`], from the prefix
    /// the slurmd image was built from), configless and with dynamic
    /// nodes as Slinky runs them, slurmctld restarted on a new `slurm.key`
    /// Secret; each NodeSet worker's slurmd is its pod's container from
    /// the slurmd image of scripts/images.sh (`Ok(Err(_))` without it).
    /// slurmctld and slurmrestd run on the host, not as pods: the rig has
    /// no image of theirs, and what mountguard judges is the slurmd in the
    /// worker pod, reading the key the kubelet wrote.
    pub async fn start_with_real_slurm() -> io::Result<Result<Self, Unavailable>> {
        Self::start_opts(Slurm::Real).await
    }

    /// [`RealNode::start_with_real_slurm`] with the real Slinky operator
    /// ([`super::operator`], `Ok(Err(_))` without its build) making the
    /// worker pods from its custom resources in place of the NodeSet
    /// double; its slurm client reaches the real slurmrestd (on port
    /// 6820 of the gateway).
    pub async fn start_with_real_slurm_and_operator() -> io::Result<Result<Self, Unavailable>> {
        Self::start_opts(Slurm::RealWithOperator).await
    }

    async fn start_opts(slurm: Slurm) -> io::Result<Result<Self, Unavailable>> {
        let builder = RealCluster::builder().nodes(0);
        let mut cluster = match slurm {
            Slurm::None => builder.without_slinky_crds(),
            Slurm::Double | Slurm::Real => builder.slinky_doubles(false),
            Slurm::RealWithOperator => match super::operator::OperatorBuild::from_env() {
                Ok(build) => builder.real_slinky_operator(build),
                Err(e) => return Ok(Err(Unavailable(format!("the real Slinky operator: {e}")))),
            },
        }
        .start()
        .await?;
        let dir = tempfile::Builder::new()
            .prefix("mountguard-node-")
            .tempdir()?;
        let tools = match node_tools() {
            Ok(t) => t,
            Err(e) => return Ok(Err(e)),
        };
        let images = match Images::get(&dir.path().join("images")) {
            Ok(i) => i,
            Err(e) => return Ok(Err(e)),
        };
        let runtime = match Containerd::start(
            &tools,
            &dir.path().join("containerd"),
            &cluster.logs_dir().join("containerd.log"),
            &images.pause,
        )
        .await
        {
            Ok(r) => r,
            Err(e) => return Ok(Err(e)),
        };
        let import = |name: &str, digested: Option<(&str, &str)>| {
            runtime
                .import(&images.dir.join(name), digested)
                .map_err(|e| Unavailable(format!("importing {name}: {e}")))
        };
        for r in [
            import("pause.tar", None),
            import(
                "mountguard-agent.tar",
                Some((&images.agent.0, &images.agent.1)),
            ),
            import(
                "mountguard-controller.tar",
                Some((&images.controller.0, &images.controller.1)),
            ),
        ] {
            if let Err(e) = r {
                return Ok(Err(e));
            }
        }
        let (_, subnet, gateway) = runtime.network();
        let (subnet, gateway) = (subnet.to_string(), gateway.to_string());
        let gateway_ip: std::net::Ipv4Addr = gateway
            .parse()
            .map_err(|e| io::Error::other(format!("gateway {gateway}: {e}")))?;
        let client = cluster.client().await?;
        let forwarder = TcpForwarder::start(gateway_ip, cluster.api_addr()).await?;
        publish_kubernetes_endpoint(&client, forwarder.addr()).await?;
        let dns = match CoreDns::start(
            &cluster,
            &tools.join("coredns"),
            gateway_ip,
            &dir.path().join("coredns"),
        )
        .await
        {
            Ok(d) => d,
            Err(e) => return Ok(Err(Unavailable(format!("coredns: {e}")))),
        };
        let extra = format!("clusterDNS: [{gateway}]\nclusterDomain: {CLUSTER_DOMAIN}\n");
        let kubelet =
            match RealKubelet::start_on_cri(&cluster, NODE, &runtime.endpoint(), &extra).await {
                Ok(k) => k,
                Err(e) => {
                    return Ok(Err(Unavailable(format!(
                        "the kubelet did not come up on containerd: {e}\n--- containerd ---\n{}",
                        runtime.log_tail(20)
                    ))));
                }
            };
        // kube-proxy once the kubelet has registered the node (v1.37.2):
        // it waits up to 30 s for its Node at startup, exits when the
        // Node's addresses later differ from those it started with
        // (pkg/proxy/node.go, `NewNodeManager`, `NodeManager.OnNodeChange`),
        // and its /healthz answers 503 while there is no Node
        // (pkg/proxy/healthcheck/proxy_health.go, `NodeEligible`).
        let proxy = match KubeProxy::start(
            &cluster,
            &tools.join("kube-proxy"),
            NODE,
            &subnet,
            &dir.path().join("kube-proxy"),
        )
        .await
        {
            Ok(p) => p,
            Err(e) => return Ok(Err(Unavailable(format!("kube-proxy: {e}")))),
        };
        if matches!(slurm, Slurm::Real | Slurm::RealWithOperator) {
            let Some(image) = images.slurmd.clone() else {
                return Ok(Err(Unavailable(
                    "no slurmd image: scripts/images.sh builds it when MOUNTGUARD_SLURM_PREFIX names \
                     the Slurm install (the last line scripts/slurm.sh prints)"
                        .into(),
                )));
            };
            if let Err(e) = runtime.import(
                &images.dir.join("slurmd.tar"),
                Some((&image.image.0, &image.image.1)),
            ) {
                return Ok(Err(Unavailable(format!("importing slurmd.tar: {e}"))));
            }
            let mut config = super::slurm::SlurmConfig::nodes(0);
            config.nodes = vec![format!("{}-0", crate::cluster::NODESET)];
            config.jwt_key = Some(super::slinky::JWT_KEY.to_vec());
            config.cluster_key = Some(super::slinky::first_slurm_key());
            config.start_slurmd = false;
            config.dynamic = true;
            config.address = gateway_ip;
            config.pods_plugin_dir = Some(image.plugin_dir.clone());
            if slurm == Slurm::RealWithOperator {
                config.restd_port = Some(super::operator::SLURMRESTD_PORT);
            }
            let real = super::slurm::RealSlurm::start(&image.prefix, config).await?;
            cluster.attach_real_slurm(std::sync::Arc::new(real));
            // The bridge alone with the operator: it restarts slurmctld on
            // a new key; the operator makes the worker pods.
            let roots = [(NODE.to_string(), kubelet.root().to_path_buf())].into();
            cluster.start_slinky_doubles(roots).await?;
            cluster.start_slinky_operator().await?;
        }
        let slurmrestd = match cluster.slurmrestd_addr() {
            Some(addr) if slurm == Slurm::Double => {
                let roots = [(NODE.to_string(), kubelet.root().to_path_buf())].into();
                cluster.start_slinky_doubles(roots).await?;
                Some(TcpForwarder::start(gateway_ip, addr).await?)
            }
            _ => None,
        };
        Ok(Ok(Self {
            kubelet,
            dns,
            proxy,
            forwarder,
            slurmrestd,
            runtime,
            cluster,
            images,
            _dir: dir,
        }))
    }

    /// slurmrestd's URL for pods (its address on the bridge): the
    /// double's with [`RealNode::start_with_slinky`], real slurmrestd's
    /// with [`RealNode::start_with_real_slurm`].
    pub fn slurmrestd_url(&self) -> Option<String> {
        match self.cluster.real_slurm() {
            Some(r) => Some(r.url()),
            None => self
                .slurmrestd
                .as_ref()
                .map(|f| format!("http://{}", f.addr())),
        }
    }

    /// The kubelet's, the runtime's and the control plane's last log lines.
    pub fn logs(&self, lines: usize) -> String {
        format!(
            "{}--- containerd ---\n{}\n--- kube-proxy ---\n{}\n--- coredns ---\n{}\n{}",
            self.kubelet.logs(lines),
            self.runtime.log_tail(lines),
            self.proxy.log_tail(lines),
            self.dns.log_tail(lines),
            self.cluster.logs(lines)
        )
    }
}

/// Prints that test `what` is skipped and why: a loud banner on stderr and
/// the `SKIPPED: <what>: <why>` line on stdout that scripts/test.sh
/// repeats at the end of the tier.
pub fn print_skipped(what: &str, why: &str) {
    let bar = "!".repeat(72);
    eprintln!("\n{bar}\n!!! SKIPPED: {what}: {why}\n{bar}\n");
    println!("SKIPPED: {what}: {why}");
}

/// Starts a [`RealNode`], or prints `SKIPPED: <reason>` and returns `None`.
#[macro_export]
macro_rules! real_node_or_skip {
    ($what:expr) => {
        $crate::real_node_or_skip!($what, start)
    };
    ($what:expr, $start:ident) => {
        match $crate::real::real_node::RealNode::$start().await {
            Ok(Ok(node)) => node,
            Ok(Err(why)) => {
                $crate::real::real_node::print_skipped(
                    $what,
                    &format!("the real-node runtime cannot run here: {why}"),
                );
                return;
            }
            Err(e) => panic!("the real control plane did not start: {e}"),
        }
    };
}

/// The namespace of [`pinned_rotation`].
pub const ROTATION_NAMESPACE: &str = "demo";

/// The seed rotation on this node: an immutable Secret `slurm-key`
/// (`slurm.key: seed-1`) mounted by pod `pinner`, deleted and created again
/// with `seed-2` while `pinner` keeps the kubelet's cache entry alive, then
/// pod `worker` mounting it: the kubelet serves `worker` the old bytes
/// (pkg/kubelet/util/manager/watch_based_manager.go: an immutable object's
/// item stops being watched and stays while a registered pod references
/// it). `pause` is the image of both pods (pulled `Never`).
pub async fn pinned_rotation(client: &kube::Client, pause: &str) -> io::Result<()> {
    use super::{create, ensure_namespace, raw, wait_for_default_service_account};
    let ns = ROTATION_NAMESPACE;
    let secret = |value: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Secret", "immutable": true,
            "metadata": {"name": "slurm-key", "namespace": ns},
            "stringData": {"slurm.key": value}})
    };
    let pod = |name: &str| {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": NODE, "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": pause, "imagePullPolicy": "Never",
                    "volumeMounts": [{"name": "key", "mountPath": "/etc/slurm", "readOnly": true}]}],
                "volumes": [{"name": "key", "secret": {"secretName": "slurm-key"}}]}})
    };
    let running = |name: &str| {
        let path = format!("/api/v1/namespaces/{ns}/pods/{name}");
        let what = format!("pod {ns}/{name} Running");
        let client = client.clone();
        async move {
            crate::mountguard::poll(&what, Duration::from_secs(120), || {
                let (client, path) = (client.clone(), path.clone());
                async move {
                    let (_, p) = raw(&client, "GET", &path, None).await.ok()?;
                    (p["status"]["phase"] == "Running").then_some(())
                }
            })
            .await
        }
    };
    ensure_namespace(client, ns).await?;
    wait_for_default_service_account(client, ns).await?;
    create(client, &secret("seed-1")).await?;
    create(client, &pod("pinner")).await?;
    running("pinner").await?;
    let (code, body) = raw(
        client,
        "DELETE",
        &format!("/api/v1/namespaces/{ns}/secrets/slurm-key"),
        None,
    )
    .await?;
    if code != 200 {
        return Err(io::Error::other(format!(
            "deleting slurm-key: {code} {body}"
        )));
    }
    create(client, &secret("seed-2")).await?;
    create(client, &pod("worker")).await?;
    running("worker").await
}
