//! The real upstream control plane in the rig: etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler built from the module proxy
//! by `scripts/upstream.sh` (nothing of theirs is committed), started as
//! child processes on loopback, with the Slinky CRDs applied.
//!
//! Only built with the `real-upstream` feature. Each [`RealCluster`] has its
//! own temporary directory (etcd data, certificates, kubeconfigs, logs,
//! the API server's audit log) and free ports; every process is killed when
//! the cluster is dropped. Credentials are generated here with rcgen: one CA
//! for serving and client certificates, an admin client certificate
//! (`system:masters`), one client certificate per control-plane component
//! (the bootstrap RBAC policy's `system:kube-controller-manager` and
//! `system:kube-scheduler` users) and per simulated node
//! (`system:node:<name>` in `system:nodes`, so the Node authorizer applies),
//! and the service-account signing key, so TokenRequest and TokenReview are
//! the API server's own.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use mountguard_tests::real::RealCluster;
//! let cluster = RealCluster::builder().nodes(2).start().await?;
//! let client = cluster.client().await?;
//! # Ok(()) }
//! ```
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

pub mod binfmt;
pub mod containerd;
pub mod helm;
pub mod kubelet;
pub mod netpol;
pub mod node;
pub mod objects;
pub mod operator;
pub mod prometheus;
pub mod real_node;
pub mod services;
pub mod signer;
pub mod slinky;
pub mod slurm;

use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use http_body_util::BodyExt;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use serde_json::{Value, json};

use crate::mountguard::{ChildGuard, free_addr, http_get, poll};
use node::{NodeDouble, NodeDoubleConfig};

/// The ClusterIP of Service `default/kubernetes` (first address of the
/// API server's `--service-cluster-ip-range` 10.0.0.0/24).
pub const KUBERNETES_SERVICE_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// The service-account token issuer of the real API server.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Where `scripts/upstream.sh` put the binaries and the Slinky CRDs.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Directory of the binaries (kube-apiserver, etcd, ...).
    pub bin: PathBuf,
    /// Directory of the Slinky CRD yaml files.
    pub crds: PathBuf,
}

impl Upstream {
    /// One binary.
    pub fn binary(&self, name: &str) -> io::Result<PathBuf> {
        let p = self.bin.join(name);
        if p.is_file() {
            Ok(p)
        } else {
            Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} is missing; run `bash scripts/upstream.sh`", p.display()),
            ))
        }
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The upstream binaries: `$MOUNTGUARD_UPSTREAM_BIN` when set, else the
/// directory `scripts/upstream.sh` prints (it builds when its cache lacks
/// the pinned versions, and answers at once when it has them).
pub fn upstream() -> io::Result<Upstream> {
    let bin = match std::env::var_os("MOUNTGUARD_UPSTREAM_BIN") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let out = Command::new("bash")
                .arg(repo().join("scripts/upstream.sh"))
                .output()
                .map_err(|e| io::Error::other(format!("running scripts/upstream.sh: {e}")))?;
            let stdout = String::from_utf8_lossy(&out.stdout);
            let last = stdout.lines().last().unwrap_or("").trim().to_string();
            if !out.status.success() || last.is_empty() {
                let err = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = err.lines().rev().take(20).collect();
                return Err(io::Error::other(format!(
                    "scripts/upstream.sh failed ({}):\n{}",
                    out.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )));
            }
            PathBuf::from(last)
        }
    };
    let crds = bin
        .parent()
        .map(|p| p.join("crds"))
        .unwrap_or_else(|| bin.join("crds"));
    Ok(Upstream { bin, crds })
}

/// The rig's certificate authority (serving and client certificates).
pub(crate) struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki").finish_non_exhaustive()
    }
}

impl Pki {
    fn new() -> io::Result<Self> {
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(io::Error::other)?;
        ca.distinguished_name
            .push(DnType::CommonName, "mountguard-real-rig-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(io::Error::other)?;
        let cert = ca.self_signed(&key).map_err(io::Error::other)?;
        Ok(Self {
            ca_pem: cert.pem(),
            issuer: Issuer::new(ca, key),
        })
    }

    /// `(cert PEM, key PEM)` for the API server on loopback.
    fn serving(&self) -> io::Result<(String, String)> {
        let mut p = CertificateParams::new(vec![
            "localhost".to_string(),
            "kubernetes".to_string(),
            "kubernetes.default.svc".to_string(),
        ])
        .map_err(io::Error::other)?;
        p.subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        // The `kubernetes` Service's ClusterIP (the first address of
        // `--service-cluster-ip-range`): what in-cluster clients dial on the
        // real-node tier, where kube-proxy forwards it to the API server.
        p.subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(KUBERNETES_SERVICE_IP)));
        p.subject_alt_names.push(SanType::DnsName(
            "kubernetes.default.svc.cluster.local"
                .try_into()
                .map_err(io::Error::other)?,
        ));
        p.distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(io::Error::other)?;
        let cert = p.signed_by(&key, &self.issuer).map_err(io::Error::other)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// `(cert PEM, key PEM)` of a client: user `cn`, groups `orgs`.
    fn client(&self, cn: &str, orgs: &[&str]) -> io::Result<(String, String)> {
        let mut p = CertificateParams::new(Vec::<String>::new()).map_err(io::Error::other)?;
        p.distinguished_name.push(DnType::CommonName, cn);
        for o in orgs {
            p.distinguished_name.push(DnType::OrganizationName, *o);
        }
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().map_err(io::Error::other)?;
        let cert = p.signed_by(&key, &self.issuer).map_err(io::Error::other)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// A kubeconfig for `server` trusting `ca_pem`, with either a client
/// certificate or a bearer token.
pub fn kubeconfig_yaml(server: &str, ca_pem: &str, user: &KubeconfigUser<'_>) -> String {
    let user = match user {
        KubeconfigUser::Cert { cert, key } => format!(
            "    client-certificate-data: {}\n    client-key-data: {}\n",
            b64(cert),
            b64(key)
        ),
        KubeconfigUser::Token(t) => format!("    token: {t}\n"),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: real\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\ncontexts:\n- name: real\n  context:\n    cluster: real\n    user: real\n    namespace: default\ncurrent-context: real\nusers:\n- name: real\n  user:\n{user}",
        b64(ca_pem)
    )
}

/// The credentials of a kubeconfig.
#[derive(Debug)]
pub enum KubeconfigUser<'a> {
    /// A client certificate and its key (PEM).
    Cert {
        /// Certificate PEM.
        cert: &'a str,
        /// Key PEM.
        key: &'a str,
    },
    /// A bearer token.
    Token(&'a str),
}

/// An audit policy recording every request's metadata, so a test can
/// count the writes one user made.
const AUDIT_POLICY: &str = "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n- level: Metadata\n";

/// Builder of a [`RealCluster`] (names follow [`crate::cluster::ClusterBuilder`]).
#[derive(Debug, Clone)]
pub struct RealClusterBuilder {
    nodes: usize,
    namespaces: Vec<String>,
    controller_manager: bool,
    scheduler: bool,
    slinky_crds: bool,
    /// `Some(operator_rules)`: the Slinky doubles (see [`Self::slinky_doubles`]).
    slinky_doubles: Option<bool>,
    /// The real Slinky operator (see [`Self::real_slinky_operator`]).
    slinky_operator: Option<operator::OperatorBuild>,
    /// Real Slurm's install prefix and node count (see [`Self::real_slurm`]).
    real_slurm: Option<(PathBuf, usize)>,
    /// See [`Self::dynamic_slurm_nodes`].
    real_slurm_dynamic: bool,
}

impl RealClusterBuilder {
    /// Number of simulated nodes (default 1).
    pub fn nodes(mut self, n: usize) -> Self {
        self.nodes = n;
        self
    }

    /// An extra namespace.
    pub fn namespace(mut self, name: &str) -> Self {
        self.namespaces.push(name.to_string());
        self
    }

    /// Without kube-controller-manager and kube-scheduler (API server and
    /// etcd only).
    pub fn api_only(mut self) -> Self {
        self.controller_manager = false;
        self.scheduler = false;
        self
    }

    /// Without the Slinky CRDs.
    pub fn without_slinky_crds(mut self) -> Self {
        self.slinky_crds = false;
        self
    }

    /// The Slinky side as doubles that are clients of the real API server
    /// ([`slinky`]): the slurmrestd double, the NodeSet double recreating
    /// NodeSet pods, and the slurmd/slurmctld bridge; the node doubles run
    /// the slurmd preStop command against it. With `operator_rules`, also
    /// the operator double's `syncCordon` (as
    /// [`crate::cluster::ClusterBuilder::slinky_operator_rules`]).
    pub fn slinky_doubles(mut self, operator_rules: bool) -> Self {
        self.slinky_doubles = Some(operator_rules);
        self
    }

    /// The real Slinky operator ([`operator`]) in place of the operator
    /// and NodeSet doubles: its CRDs from the same build, its manager
    /// started once the nodes are registered, its slurm client pointed at
    /// the slurmrestd double (on port 6820 of a loopback address of the
    /// test's), and the slurmd bridge of [`Self::slinky_doubles`] playing
    /// slurmctld and the slurmd daemons.
    pub fn real_slinky_operator(mut self, build: operator::OperatorBuild) -> Self {
        self.slinky_doubles = Some(false);
        self.slinky_operator = Some(build);
        self
    }

    /// The Slinky doubles of [`Self::slinky_doubles`] (without the
    /// operator's rules) with real Slurm in place of the slurmrestd double
    /// ([`slurm::RealSlurm`], installed at `prefix`): slurmctld on the
    /// `slurm.key` Secret's key (restarted on a new one), slurmrestd on its
    /// `jwt.key`, and for every worker pod a slurmd process on the
    /// `slurm.key` file the node double wrote into the pod's volume,
    /// started once the pod runs and stopped once it is gone. Slurm nodes:
    /// `<NodeSet>-<i>` for `i` below `nodes`, the pods' hostnames.
    pub fn real_slurm(mut self, prefix: PathBuf, nodes: usize) -> Self {
        self.slinky_doubles = Some(false);
        self.real_slurm = Some((prefix, nodes));
        self
    }

    /// With [`Self::real_slurm`]: the workers are dynamic Slurm nodes, as
    /// the Slinky operator runs them, and slurmctld restarts without its
    /// saved state (see [`slurm::SlurmConfig::dynamic`]).
    pub fn dynamic_slurm_nodes(mut self) -> Self {
        self.real_slurm_dynamic = true;
        self
    }

    /// Builds (if needed) and starts everything; waits until the API server
    /// is ready, the CRDs are established and every node is registered.
    pub async fn start(self) -> io::Result<RealCluster> {
        let mut upstream = upstream()?;
        let dir = tempfile::Builder::new()
            .prefix("mountguard-real-")
            .tempdir()?;
        let logs = dir.path().join("logs");
        std::fs::create_dir_all(&logs)?;
        let pki = Pki::new()?;
        let p = |n: &str| dir.path().join(n);
        std::fs::write(p("ca.crt"), &pki.ca_pem)?;
        let (srv_cert, srv_key) = pki.serving()?;
        std::fs::write(p("apiserver.crt"), srv_cert)?;
        std::fs::write(p("apiserver.key"), srv_key)?;
        let sa_key = KeyPair::generate().map_err(io::Error::other)?;
        std::fs::write(p("sa.key"), sa_key.serialize_pem())?;
        std::fs::write(p("sa.pub"), sa_key.public_key_pem())?;
        std::fs::write(p("audit-policy.yaml"), AUDIT_POLICY)?;
        // The rig's status API reader, a static token (`--token-auth-file`,
        // CSV `token,user,uid,"group,..."`:
        // staging/src/k8s.io/apiserver/pkg/authentication/token/tokenfile/tokenfile.go
        // `NewCSV`); the rig binds its group to the chart's reader role.
        std::fs::write(
            p("static-tokens.csv"),
            format!(
                "{},{},rig-status-reader-uid,\"{}\"\n",
                crate::mountguard::STATUS_READER_TOKEN,
                crate::mountguard::STATUS_READER_USER,
                crate::mountguard::STATUS_READER_GROUP
            ),
        )?;
        let etcd_client = free_addr()?;
        let etcd_peer = free_addr()?;
        let api_addr = free_addr()?;
        let server = format!("https://{api_addr}");
        let (admin_cert, admin_key) = pki.client("mountguard-rig-admin", &["system:masters"])?;
        let admin_kubeconfig = p("admin.kubeconfig");
        std::fs::write(
            &admin_kubeconfig,
            kubeconfig_yaml(
                &server,
                &pki.ca_pem,
                &KubeconfigUser::Cert {
                    cert: &admin_cert,
                    key: &admin_key,
                },
            ),
        )?;
        // The API server's client certificate for the kubelets' API (logs,
        // exec, attach, port-forward, node proxy): the kubelets trust the
        // rig's CA and authorize every authenticated caller.
        let (kc, kk) = pki.client("kube-apiserver-kubelet-client", &[])?;
        std::fs::write(p("kubelet-client.crt"), kc)?;
        std::fs::write(p("kubelet-client.key"), kk)?;
        for (file, cn) in [
            ("kcm.kubeconfig", "system:kube-controller-manager"),
            ("scheduler.kubeconfig", "system:kube-scheduler"),
        ] {
            let (c, k) = pki.client(cn, &[])?;
            std::fs::write(
                p(file),
                kubeconfig_yaml(
                    &server,
                    &pki.ca_pem,
                    &KubeconfigUser::Cert { cert: &c, key: &k },
                ),
            )?;
        }
        let real_slurm = match &self.real_slurm {
            Some((prefix, nodes)) => {
                let mut config = slurm::SlurmConfig::nodes(0);
                config.nodes = (0..*nodes)
                    .map(|i| format!("{}-{i}", crate::cluster::NODESET))
                    .collect();
                config.jwt_key = Some(slinky::JWT_KEY.to_vec());
                config.cluster_key = Some(slinky::first_slurm_key());
                config.start_slurmd = false;
                config.dynamic = self.real_slurm_dynamic;
                config.keep_state = !self.real_slurm_dynamic;
                Some(std::sync::Arc::new(
                    slurm::RealSlurm::start(prefix, config).await?,
                ))
            }
            None => None,
        };
        let slurm = match self.slinky_doubles {
            Some(_) if real_slurm.is_some() => None,
            Some(_) => {
                let d = match &self.slinky_operator {
                    Some(_) => {
                        operator::start_slurmrestd_double(crate::cluster::SLURM_CLUSTER).await?
                    }
                    None => {
                        crate::slurmrestd::SlurmrestdDouble::start(crate::cluster::SLURM_CLUSTER)
                            .await?
                    }
                };
                d.handle().add_token(crate::cluster::SLURM_TOKEN, "slurm");
                // The JWT user of the chart's remediation scenarios
                // (charts/tests/render.py, `user: mountguard`) is a Slurm
                // administrator here, as an operator makes it one
                // (`sacctmgr add user mountguard AdminLevel=Admin`): slurmctld
                // refuses node updates from any other user (error 2010).
                d.handle().add_admin("mountguard");
                Some(d)
            }
            None => None,
        };
        if let Some(b) = &self.slinky_operator {
            upstream.crds = b.crds();
        }
        let mut cluster = RealCluster {
            slurm,
            real_slurm,
            slinky: None,
            operator: None,
            operator_build: self.slinky_operator.clone(),
            slinky_rules: None,
            upstream,
            etcd: None,
            apiserver: None,
            controller_manager: None,
            scheduler: None,
            nodes: Vec::new(),
            server,
            api_addr,
            etcd_client,
            etcd_peer,
            admin_kubeconfig,
            ca_pem: pki.ca_pem.clone(),
            pki,
            logs,
            dir,
        };
        cluster.start_etcd().await?;
        cluster.start_apiserver().await?;
        if self.controller_manager {
            cluster.start_controller_manager()?;
        }
        if self.scheduler {
            cluster.start_scheduler()?;
        }
        let client = cluster.client().await?;
        for ns in &self.namespaces {
            ensure_namespace(&client, ns).await?;
        }
        if self.slinky_crds {
            cluster.apply_slinky_crds(&client).await?;
        }
        for i in 0..self.nodes {
            let name = format!("node-{i}");
            let kc = cluster.node_kubeconfig(&name)?;
            let root = cluster.path(&name).join("kubelet");
            let mut config = NodeDoubleConfig::new(&name, root, kc);
            config.exec = cluster
                .slurm
                .as_ref()
                .map(|d| slinky::slurmd_exec_hook(d.handle()));
            let node = NodeDouble::start(config).await?;
            clear_not_ready_taint(&client, &name).await?;
            cluster.nodes.push(node);
        }
        cluster.slinky_rules = self.slinky_doubles;
        if self.slinky_doubles.is_some() && !cluster.nodes.is_empty() {
            let roots = cluster
                .nodes
                .iter()
                .map(|n| (n.name().to_string(), n.root().to_path_buf()))
                .collect();
            cluster.start_slinky_doubles(roots).await?;
        }
        if !cluster.nodes.is_empty() {
            cluster.start_slinky_operator().await?;
        }
        Ok(cluster)
    }
}

/// A running real control plane.
#[derive(Debug)]
pub struct RealCluster {
    slurm: Option<crate::slurmrestd::SlurmrestdDouble>,
    real_slurm: Option<std::sync::Arc<slurm::RealSlurm>>,
    slinky: Option<slinky::SlinkyDoubles>,
    operator: Option<operator::RealOperator>,
    operator_build: Option<operator::OperatorBuild>,
    /// `Some(operator_rules)` when built with the Slinky doubles.
    slinky_rules: Option<bool>,
    upstream: Upstream,
    etcd: Option<ChildGuard>,
    apiserver: Option<ChildGuard>,
    controller_manager: Option<ChildGuard>,
    scheduler: Option<ChildGuard>,
    nodes: Vec<NodeDouble>,
    server: String,
    api_addr: std::net::SocketAddr,
    etcd_client: std::net::SocketAddr,
    etcd_peer: std::net::SocketAddr,
    admin_kubeconfig: PathBuf,
    ca_pem: String,
    pki: Pki,
    logs: PathBuf,
    dir: tempfile::TempDir,
}

impl RealCluster {
    /// A builder (1 node, controller-manager, scheduler, Slinky CRDs).
    pub fn builder() -> RealClusterBuilder {
        RealClusterBuilder {
            nodes: 1,
            namespaces: Vec::new(),
            controller_manager: true,
            scheduler: true,
            slinky_crds: true,
            slinky_doubles: None,
            slinky_operator: None,
            real_slurm: None,
            real_slurm_dynamic: false,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The API server's URL (`https://127.0.0.1:<port>`).
    pub fn api_url(&self) -> String {
        self.server.clone()
    }

    /// The admin kubeconfig (client certificate in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The CA that signed the API server's serving certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The temporary directory of this cluster.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Directory of the processes' logs.
    pub fn logs_dir(&self) -> &Path {
        &self.logs
    }

    /// The upstream binaries in use.
    pub fn upstream(&self) -> &Upstream {
        &self.upstream
    }

    /// Node names, in order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name().to_string()).collect()
    }

    /// The kubelet root of node `i`.
    pub fn kubelet_root(&self, i: usize) -> PathBuf {
        self.nodes[i].root().to_path_buf()
    }

    /// The simulated node `i`.
    pub fn node(&self, i: usize) -> &NodeDouble {
        &self.nodes[i]
    }

    /// The slurmrestd double (with [`RealClusterBuilder::slinky_doubles`]).
    pub fn slurm(&self) -> Option<crate::slurmrestd::SlurmHandle> {
        self.slurm.as_ref().map(|d| d.handle())
    }

    /// slurmrestd's URL: the double's (with
    /// [`RealClusterBuilder::slinky_doubles`]) or real Slurm's (with
    /// [`RealClusterBuilder::real_slurm`]).
    pub fn slurmrestd_url(&self) -> Option<String> {
        match &self.real_slurm {
            Some(r) => Some(r.url()),
            None => self.slurm.as_ref().map(|d| d.url()),
        }
    }

    /// Real Slurm started after the cluster (the real node's, on the pod
    /// network's gateway), for [`Self::start_slinky_doubles`] and
    /// [`Self::slurmrestd_url`].
    pub fn attach_real_slurm(&mut self, slurm: std::sync::Arc<slurm::RealSlurm>) {
        self.real_slurm = Some(slurm);
    }

    /// Real Slurm (with [`RealClusterBuilder::real_slurm`]).
    pub fn real_slurm(&self) -> Option<std::sync::Arc<slurm::RealSlurm>> {
        self.real_slurm.clone()
    }

    /// The slurmrestd double's address (loopback).
    pub fn slurmrestd_addr(&self) -> Option<std::net::SocketAddr> {
        self.slurm.as_ref().map(|d| d.addr())
    }

    /// The slurmrestd double's IPv4 address.
    pub fn slurmrestd_ip(&self) -> Option<std::net::Ipv4Addr> {
        match self.slurmrestd_addr()?.ip() {
            std::net::IpAddr::V4(ip) => Some(ip),
            std::net::IpAddr::V6(_) => None,
        }
    }

    /// Whether something of the rig makes the NodeSet's pods (the NodeSet
    /// double, or the real Slinky operator).
    pub fn makes_nodeset_pods(&self) -> bool {
        self.slinky.is_some() || self.operator_build.is_some()
    }

    /// The real Slinky operator's log ("" without one).
    pub fn slinky_operator_log(&self) -> String {
        self.operator.as_ref().map(|o| o.log()).unwrap_or_default()
    }

    /// Starts the real Slinky operator of a cluster built with
    /// [`RealClusterBuilder::real_slinky_operator`] (the builder does it
    /// for its node doubles; a cluster of real kubelets calls it once they
    /// run); nothing without one, or if it already runs.
    pub async fn start_slinky_operator(&mut self) -> io::Result<()> {
        let (Some(build), None) = (self.operator_build.as_ref(), self.operator.as_ref()) else {
            return Ok(());
        };
        let ip = match &self.real_slurm {
            Some(r) => match r.addr().ip() {
                std::net::IpAddr::V4(ip) if r.addr().port() == operator::SLURMRESTD_PORT => {
                    Some(ip)
                }
                _ => None,
            },
            None => self.slurmrestd_ip(),
        }
        .ok_or_else(|| {
            io::Error::other(format!(
                "the real Slinky operator needs slurmrestd on IPv4 port {}",
                operator::SLURMRESTD_PORT
            ))
        })?;
        let op = operator::RealOperator::start(self, build, &operator::restapi_host(), ip).await?;
        self.operator = Some(op);
        Ok(())
    }

    /// Starts the NodeSet double and the slurmd bridge of a cluster built
    /// with [`RealClusterBuilder::slinky_doubles`] for the nodes in `roots`
    /// (node name -> kubelet root). The builder does it for its node
    /// doubles; a cluster whose nodes are real kubelets, started after the
    /// control plane ([`kubelet::RealKubelet::start`]), calls it once they
    /// run.
    pub async fn start_slinky_doubles(
        &mut self,
        roots: std::collections::BTreeMap<String, PathBuf>,
    ) -> io::Result<()> {
        let side = match (&self.real_slurm, self.slurm.as_ref()) {
            (Some(r), _) => slinky::SlurmSide::Real(r.clone()),
            (None, Some(d)) => slinky::SlurmSide::Double(d.handle()),
            (None, None) => None.ok_or_else(|| {
                io::Error::other(
                    "the cluster was built without the Slinky doubles (RealClusterBuilder::slinky_doubles)",
                )
            })?,
        };
        let Some(rules) = self.slinky_rules else {
            return Err(io::Error::other(
                "the cluster was built without the Slinky doubles (RealClusterBuilder::slinky_doubles)",
            ));
        };
        if self.slinky.is_some() {
            return Err(io::Error::other("the Slinky doubles already run"));
        }
        let client = self.client().await?;
        self.slinky = Some(slinky::SlinkyDoubles::start(
            std::sync::Arc::new(objects::RealObjects::new(client)),
            side,
            roots,
            rules,
            self.operator_build.is_none(),
        ));
        Ok(())
    }

    /// An admin client as [`crate::objects::Objects`] (the calls block;
    /// call from a multi-threaded runtime).
    pub async fn objects(&self) -> io::Result<objects::RealObjects> {
        Ok(objects::RealObjects::new(self.client().await?))
    }

    /// An admin client.
    pub async fn client(&self) -> io::Result<kube::Client> {
        client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// Writes a kubeconfig with a client certificate of node `name`
    /// (`system:node:<name>` in `system:nodes`); returns its path.
    pub fn node_kubeconfig(&self, name: &str) -> io::Result<PathBuf> {
        let (c, k) = self
            .pki
            .client(&format!("system:node:{name}"), &["system:nodes"])?;
        let path = self.path(&format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig_yaml(
                &self.server,
                &self.ca_pem,
                &KubeconfigUser::Cert { cert: &c, key: &k },
            ),
        )?;
        Ok(path)
    }

    /// Writes a kubeconfig `<file>.kubeconfig` with a client certificate of
    /// user `cn` in groups `orgs`; returns its path.
    pub fn user_kubeconfig(&self, file: &str, cn: &str, orgs: &[&str]) -> io::Result<PathBuf> {
        let (c, k) = self.pki.client(cn, orgs)?;
        let path = self.path(&format!("{file}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig_yaml(
                &self.server,
                &self.ca_pem,
                &KubeconfigUser::Cert { cert: &c, key: &k },
            ),
        )?;
        Ok(path)
    }

    /// `(cert PEM, key PEM)` of a serving certificate for `dns_names`,
    /// signed by the rig's CA ([`Self::ca_pem`]).
    pub fn serving_cert(&self, dns_names: &[&str]) -> io::Result<(String, String)> {
        let mut p =
            CertificateParams::new(dns_names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .map_err(io::Error::other)?;
        p.distinguished_name.push(
            DnType::CommonName,
            dns_names.first().copied().unwrap_or("rig"),
        );
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(io::Error::other)?;
        let cert = p
            .signed_by(&key, &self.pki.issuer)
            .map_err(io::Error::other)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// The API server's address (loopback).
    pub fn api_addr(&self) -> std::net::SocketAddr {
        self.api_addr
    }

    /// Writes a kubeconfig with `token` as bearer token; returns its path.
    pub fn token_kubeconfig(&self, name: &str, token: &str) -> io::Result<PathBuf> {
        let path = self.path(&format!("{name}.kubeconfig"));
        std::fs::write(
            &path,
            kubeconfig_yaml(&self.server, &self.ca_pem, &KubeconfigUser::Token(token)),
        )?;
        Ok(path)
    }

    /// The audit log: one JSON event per request the API server answered.
    pub fn audit_events(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("audit.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The last lines of every control-plane process's log.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for c in [
            &self.etcd,
            &self.apiserver,
            &self.controller_manager,
            &self.scheduler,
        ]
        .into_iter()
        .flatten()
        {
            out.push_str(&format!("--- {} ---\n{}\n", c.name(), c.log_tail(lines)));
        }
        out
    }

    async fn start_etcd(&mut self) -> io::Result<()> {
        let mut cmd = Command::new(self.upstream.binary("etcd")?);
        let client = format!("http://{}", self.etcd_client);
        let peer = format!("http://{}", self.etcd_peer);
        cmd.args(["--name", "default"])
            .arg("--data-dir")
            .arg(self.path("etcd"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .arg("--unsafe-no-fsync")
            .args(["--log-level", "warn"]);
        let mut child = ChildGuard::spawn("etcd", cmd, &self.logs.join("etcd.log"))?;
        let url = format!("{client}/health");
        let r = poll("etcd to be healthy", Duration::from_secs(30), || {
            let url = url.clone();
            let exited = child.exited();
            async move {
                if exited.is_some() {
                    return Some(false);
                }
                http_get(&url)
                    .await
                    .ok()
                    .filter(|b| b.contains("true"))
                    .map(|_| true)
            }
        })
        .await;
        if !matches!(r, Ok(true)) {
            return Err(io::Error::other(format!(
                "etcd did not start ({r:?}):\n{}",
                child.log_tail(30)
            )));
        }
        self.etcd = Some(child);
        Ok(())
    }

    /// Flags after controller-runtime envtest's defaults for kube-apiserver
    /// (sigs.k8s.io/controller-runtime pkg/internal/testing/controlplane,
    /// `APIServerDefaultArgs`: advertise/bind on loopback, a service CIDR,
    /// privileged pods allowed), plus what the scenarios need: RBAC and the
    /// Node authorizer, service-account signing keys and issuer (real
    /// TokenRequest/TokenReview), client-certificate authentication, and an
    /// audit log.
    async fn start_apiserver(&mut self) -> io::Result<()> {
        let p = |n: &str| self.path(n);
        let mut cmd = Command::new(self.upstream.binary("kube-apiserver")?);
        cmd.args(["--etcd-servers", &format!("http://{}", self.etcd_client)])
            .args(["--bind-address", "127.0.0.1"])
            .args(["--advertise-address", "127.0.0.1"])
            .args(["--secure-port", &self.api_addr.port().to_string()])
            .arg("--cert-dir")
            .arg(p("apiserver-certs"))
            .arg("--tls-cert-file")
            .arg(p("apiserver.crt"))
            .arg("--tls-private-key-file")
            .arg(p("apiserver.key"))
            .arg("--client-ca-file")
            .arg(p("ca.crt"))
            // The kubelets' API: the API server's client certificate, and
            // the Node's InternalIP before its hostname (the default order,
            // Hostname first, sends it to a node name nothing resolves:
            // cmd/kube-apiserver/app/options/options.go
            // `NewServerRunOptions`, `PreferredAddressTypes`, v1.37.2). The
            // kubelets serve on every address of the host.
            .arg("--kubelet-client-certificate")
            .arg(p("kubelet-client.crt"))
            .arg("--kubelet-client-key")
            .arg(p("kubelet-client.key"))
            .args(["--kubelet-preferred-address-types", "InternalIP,Hostname"])
            .args(["--service-cluster-ip-range", "10.0.0.0/24"])
            .arg("--allow-privileged=true")
            .args(["--authorization-mode", "Node,RBAC"])
            .args(["--service-account-issuer", ISSUER])
            .arg("--service-account-key-file")
            .arg(p("sa.pub"))
            .arg("--service-account-signing-key-file")
            .arg(p("sa.key"))
            .arg("--token-auth-file")
            .arg(p("static-tokens.csv"))
            .arg("--audit-policy-file")
            .arg(p("audit-policy.yaml"))
            .arg("--audit-log-path")
            .arg(p("audit.log"))
            .args(["--audit-log-format", "json"])
            .arg("--enable-priority-and-fairness=false")
            // The Endpoints of Service "kubernetes" may not hold a loopback
            // address (validation), so the reconciler would fail every 10 s.
            .args(["--endpoint-reconciler-type", "none"])
            .arg("--profiling=false")
            .args(["--v", "1"]);
        let mut child =
            ChildGuard::spawn("kube-apiserver", cmd, &self.logs.join("kube-apiserver.log"))?;
        let client = client_from_kubeconfig(&self.admin_kubeconfig).await?;
        let r = poll(
            "kube-apiserver to be ready",
            Duration::from_secs(90),
            || {
                let client = client.clone();
                let exited = child.exited();
                async move {
                    if exited.is_some() {
                        return Some(false);
                    }
                    let (code, body) = raw(&client, "GET", "/readyz", None).await.ok()?;
                    (code == 200 && body.as_str() == Some("ok")).then_some(true)
                }
            },
        )
        .await;
        if !matches!(r, Ok(true)) {
            let etcd = self
                .etcd
                .as_mut()
                .map(|e| format!("{:?}\n{}", e.exited(), e.log_tail(15)))
                .unwrap_or_default();
            return Err(io::Error::other(format!(
                "kube-apiserver did not become ready ({r:?}):\n{}\n--- etcd (exit status, log) ---\n{etcd}",
                child.log_tail(20)
            )));
        }
        self.apiserver = Some(child);
        Ok(())
    }

    /// Stops kube-apiserver (etcd keeps its data) and starts it again on
    /// the same port with the same flags; waits until it is ready.
    pub async fn restart_apiserver(&mut self) -> io::Result<()> {
        self.stop_apiserver();
        self.start_apiserver().await
    }

    /// Kills kube-apiserver (SIGKILL); [`RealCluster::restart_apiserver`]
    /// starts it again.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            c.kill();
        }
    }

    /// Kills etcd (SIGKILL; its data directory is kept): kube-apiserver
    /// stays up and fails every request that needs storage.
    pub fn stop_etcd(&mut self) {
        if let Some(mut c) = self.etcd.take() {
            c.kill();
        }
    }

    /// Starts etcd again on its data directory after
    /// [`RealCluster::stop_etcd`]; waits until it is healthy.
    pub async fn restart_etcd(&mut self) -> io::Result<()> {
        self.stop_etcd();
        self.start_etcd().await
    }

    /// kube-controller-manager with every default controller but node
    /// lifecycle: the simulated nodes keep their Ready condition but no
    /// node Lease, so the node lifecycle controller would taint and evict
    /// them (it is disabled instead; see docs/testing.md). Each controller
    /// uses its own service-account credentials, like kubeadm clusters.
    fn start_controller_manager(&mut self) -> io::Result<()> {
        let p = |n: &str| self.path(n);
        let mut cmd = Command::new(self.upstream.binary("kube-controller-manager")?);
        cmd.arg("--kubeconfig")
            .arg(p("kcm.kubeconfig"))
            .args(["--controllers", "*,-nodelifecycle"])
            .arg("--leader-elect=false")
            .arg("--use-service-account-credentials=true")
            .arg("--service-account-private-key-file")
            .arg(p("sa.key"))
            .arg("--root-ca-file")
            .arg(p("ca.crt"))
            .args(["--secure-port", "0"])
            .args(["--v", "1"]);
        self.controller_manager = Some(ChildGuard::spawn(
            "kube-controller-manager",
            cmd,
            &self.logs.join("kube-controller-manager.log"),
        )?);
        Ok(())
    }

    fn start_scheduler(&mut self) -> io::Result<()> {
        let mut cmd = Command::new(self.upstream.binary("kube-scheduler")?);
        cmd.arg("--kubeconfig")
            .arg(self.path("scheduler.kubeconfig"))
            .arg("--leader-elect=false")
            .args(["--secure-port", "0"])
            .args(["--v", "1"]);
        self.scheduler = Some(ChildGuard::spawn(
            "kube-scheduler",
            cmd,
            &self.logs.join("kube-scheduler.log"),
        )?);
        Ok(())
    }

    /// Creates the Slinky CRDs (yaml, which the API server accepts as a
    /// request body) and waits until each is Established.
    async fn apply_slinky_crds(&self, client: &kube::Client) -> io::Result<()> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(&self.upstream.crds)
            .map_err(|e| {
                io::Error::other(format!(
                    "{}: {e}; run `bash scripts/upstream.sh`",
                    self.upstream.crds.display()
                ))
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        let mut names = Vec::new();
        for f in &files {
            let yaml = std::fs::read(f)?;
            let (code, body) = raw_with(
                client,
                "POST",
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                yaml,
                "application/yaml",
            )
            .await?;
            if code != 201 && code != 409 {
                return Err(io::Error::other(format!(
                    "creating CRD {}: {code} {body}",
                    f.display()
                )));
            }
            if let Some(n) = body["metadata"]["name"].as_str() {
                names.push(n.to_string());
            }
        }
        for n in names {
            poll(
                &format!("CRD {n} to be established"),
                Duration::from_secs(30),
                || {
                    let client = client.clone();
                    let path =
                        format!("/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}");
                    async move {
                        let (_, crd) = raw(&client, "GET", &path, None).await.ok()?;
                        crd["status"]["conditions"]
                            .as_array()?
                            .iter()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                            .then_some(())
                    }
                },
            )
            .await?;
        }
        Ok(())
    }

    /// Stops every process and the simulated nodes.
    pub async fn shutdown(&mut self) {
        if let Some(s) = self.slinky.as_mut() {
            s.shutdown().await;
        }
        if let Some(d) = self.slurm.as_mut() {
            d.shutdown().await;
        }
        for n in &mut self.nodes {
            n.shutdown().await;
        }
        for c in [
            &mut self.scheduler,
            &mut self.controller_manager,
            &mut self.apiserver,
            &mut self.etcd,
        ] {
            if let Some(mut c) = c.take() {
                c.kill();
            }
        }
    }
}

/// A client from a kubeconfig file.
pub async fn client_from_kubeconfig(path: &Path) -> io::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(io::Error::other)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(io::Error::other)?;
    kube::Client::try_from(config).map_err(io::Error::other)
}

/// One request through `client`: status code and body (JSON, or the text
/// as a JSON string when it is not JSON).
pub async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> io::Result<(u16, Value)> {
    let bytes = body
        .map(|b| serde_json::to_vec(b).unwrap_or_default())
        .unwrap_or_default();
    let ctype = if method == "PATCH" {
        "application/merge-patch+json"
    } else {
        "application/json"
    };
    raw_with(client, method, path, bytes, ctype).await
}

/// [`raw`] that also returns the texts of the response's `Warning`
/// headers (what kubectl prints as `Warning: ...`; admission webhooks'
/// warnings arrive this way).
pub async fn raw_warned(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> io::Result<(u16, Value, Vec<String>)> {
    let bytes = body
        .map(|b| serde_json::to_vec(b).unwrap_or_default())
        .unwrap_or_default();
    send(client, method, path, bytes, "application/json").await
}

/// `299 - "text"` -> `text`: the warning header's quoted text, unescaped
/// (`k8s.io/apimachinery/pkg/util/net/http.go`: `NewWarningHeader` quotes
/// the text with `makeQuotedString`, which escapes `"` and `\`).
fn warning_text(h: &str) -> String {
    let t = h.strip_prefix("299 - ").unwrap_or(h);
    let t = t.strip_prefix('"').unwrap_or(t);
    let t = t.strip_suffix('"').unwrap_or(t);
    t.replace("\\\"", "\"").replace("\\\\", "\\")
}

/// [`raw`] with an explicit body and content type.
pub async fn raw_with(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Vec<u8>,
    content_type: &str,
) -> io::Result<(u16, Value)> {
    let (code, v, _) = send(client, method, path, body, content_type).await?;
    Ok((code, v))
}

/// One request: status, body (JSON, or the text as a JSON string when it
/// is not JSON) and the `Warning` headers' texts; 30 s at most.
async fn send(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Vec<u8>,
    content_type: &str,
) -> io::Result<(u16, Value, Vec<String>)> {
    let req = http::Request::builder()
        .method(method)
        .uri(path)
        .header("content-type", content_type)
        .header("accept", "application/json")
        .body(kube::client::Body::from(body))
        .map_err(io::Error::other)?;
    let fut = async {
        let resp = client.send(req).await.map_err(io::Error::other)?;
        let code = resp.status().as_u16();
        let warnings = resp
            .headers()
            .get_all("warning")
            .iter()
            .map(|v| warning_text(v.to_str().unwrap_or_default()))
            .collect();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(io::Error::other)?
            .to_bytes();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok::<_, io::Error>((code, v, warnings))
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .map_err(|_| io::Error::other(format!("{method} {path}: no answer in 30 s")))?
}

/// Creates namespace `name` unless it exists.
pub async fn ensure_namespace(client: &kube::Client, name: &str) -> io::Result<()> {
    let (code, body) = raw(
        client,
        "POST",
        "/api/v1/namespaces",
        Some(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})),
    )
    .await?;
    match code {
        201 | 409 => Ok(()),
        _ => Err(io::Error::other(format!(
            "creating namespace {name}: {code} {body}"
        ))),
    }
}

/// Removes the `node.kubernetes.io/not-ready:NoSchedule` taint from a node
/// double's or a real kubelet's Node once it reports Ready, as the node lifecycle controller
/// would (pkg/controller/nodelifecycle/node_lifecycle_controller.go,
/// `doNoScheduleTaintingPass`: a Ready node keeps no condition taint). The
/// API server's NodeTaint admission plugin puts it on every new Node
/// (plugin/pkg/admission/nodetaint/admission.go, `Admit`), and node
/// lifecycle is disabled in the rig, so without this the taint stays and
/// kube-scheduler's TaintToleration filter (and the NodeSet double, which
/// follows it) keeps every pod without a toleration off the node. Done
/// with the admin client: NodeRestriction lets a node set its taints only
/// when it registers.
pub(crate) async fn clear_not_ready_taint(client: &kube::Client, name: &str) -> io::Result<()> {
    const NOT_READY: &str = "node.kubernetes.io/not-ready";
    let path = format!("/api/v1/nodes/{name}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, body) = raw(client, "GET", &path, None).await?;
        if code != 200 {
            return Err(io::Error::other(format!(
                "reading node {name}: {code} {body}"
            )));
        }
        let node = body;
        let taints = node["spec"]["taints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if taints.iter().all(|t| t["key"] != NOT_READY) {
            return Ok(());
        }
        let kept: Vec<&Value> = taints.iter().filter(|t| t["key"] != NOT_READY).collect();
        // The resourceVersion makes this a compare-and-swap: a taint added
        // meanwhile is not lost, the loop reads again.
        let patch = json!({
            "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
            "spec": {"taints": kept},
        });
        let (code, body) = raw(client, "PATCH", &path, Some(&patch)).await?;
        match code {
            200 => return Ok(()),
            409 if std::time::Instant::now() < deadline => continue,
            _ => {
                return Err(io::Error::other(format!(
                    "removing the {NOT_READY} taint of node {name}: {code} {body}"
                )));
            }
        }
    }
}

/// Waits (up to 60 s) until the service-account controller has made the
/// `default` ServiceAccount of `namespace`: the ServiceAccount admission
/// plugin refuses pods in a namespace without it
/// (plugin/pkg/admission/serviceaccount/admission.go, `Admit`).
pub async fn wait_for_default_service_account(
    client: &kube::Client,
    namespace: &str,
) -> io::Result<()> {
    let path = format!("/api/v1/namespaces/{namespace}/serviceaccounts/default");
    poll(
        &format!("the default ServiceAccount of {namespace}"),
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let path = path.clone();
            async move {
                let (code, _) = raw(&client, "GET", &path, None).await.ok()?;
                (code == 200).then_some(())
            }
        },
    )
    .await
    .map(|_| ())
}

/// The collection path of an object of `kind` (the kinds the rig applies).
pub fn collection_path(api_version: &str, kind: &str, namespace: Option<&str>) -> Option<String> {
    let plural = match kind {
        "Namespace" => "namespaces",
        "ServiceAccount" => "serviceaccounts",
        "Secret" => "secrets",
        "ConfigMap" => "configmaps",
        "Pod" => "pods",
        "Service" => "services",
        "ClusterRole" => "clusterroles",
        "ClusterRoleBinding" => "clusterrolebindings",
        "Role" => "roles",
        "RoleBinding" => "rolebindings",
        "PodDisruptionBudget" => "poddisruptionbudgets",
        "DaemonSet" => "daemonsets",
        "Deployment" => "deployments",
        "StatefulSet" => "statefulsets",
        "ReplicaSet" => "replicasets",
        "NodeSet" => "nodesets",
        "Controller" => "controllers",
        "RestApi" => "restapis",
        "Lease" => "leases",
        "ValidatingWebhookConfiguration" => "validatingwebhookconfigurations",
        "ClusterTrustBundle" => "clustertrustbundles",
        _ => return None,
    };
    let group = if api_version == "v1" {
        "/api/v1".to_string()
    } else {
        format!("/apis/{api_version}")
    };
    let cluster_scoped = matches!(
        kind,
        "Namespace"
            | "ClusterRole"
            | "ClusterRoleBinding"
            | "ValidatingWebhookConfiguration"
            | "ClusterTrustBundle"
    );
    Some(match (cluster_scoped, namespace) {
        (false, Some(ns)) => format!("{group}/namespaces/{ns}/{plural}"),
        _ => format!("{group}/{plural}"),
    })
}

/// Creates `obj` (its `apiVersion`, `kind` and `metadata.namespace` say
/// where); an existing object is left as it is. Returns the stored object.
pub async fn create(client: &kube::Client, obj: &Value) -> io::Result<Value> {
    let av = obj["apiVersion"].as_str().unwrap_or("");
    let kind = obj["kind"].as_str().unwrap_or("");
    let ns = obj["metadata"]["namespace"].as_str();
    let path = collection_path(av, kind, ns)
        .ok_or_else(|| io::Error::other(format!("the rig cannot create a {av} {kind}")))?;
    let (code, body) = raw(client, "POST", &path, Some(obj)).await?;
    match code {
        201 => Ok(body),
        409 => {
            let name = obj["metadata"]["name"].as_str().unwrap_or("");
            let (code, body) = raw(client, "GET", &format!("{path}/{name}"), None).await?;
            if code == 200 {
                Ok(body)
            } else {
                Err(io::Error::other(format!(
                    "GET {path}/{name}: {code} {body}"
                )))
            }
        }
        _ => Err(io::Error::other(format!(
            "creating {kind} {}: {code} {body}",
            obj["metadata"]["name"]
        ))),
    }
}

/// A TokenRequest for ServiceAccount `ns/sa`, optionally bound to a pod
/// `(name, uid)`; returns the token.
pub async fn token_request(
    client: &kube::Client,
    ns: &str,
    sa: &str,
    audiences: &[&str],
    expiration_seconds: i64,
    pod: Option<(&str, &str)>,
) -> io::Result<String> {
    let mut spec = json!({"audiences": audiences, "expirationSeconds": expiration_seconds});
    if let Some((name, uid)) = pod {
        spec["boundObjectRef"] =
            json!({"kind": "Pod", "apiVersion": "v1", "name": name, "uid": uid});
    }
    let body =
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec});
    let (code, resp) = raw(
        client,
        "POST",
        &format!("/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token"),
        Some(&body),
    )
    .await?;
    match resp["status"]["token"].as_str() {
        Some(t) if code == 201 => Ok(t.to_string()),
        _ => Err(io::Error::other(format!(
            "TokenRequest for {ns}/{sa}: {code} {resp}"
        ))),
    }
}

/// The real TokenReview of `token` for `audiences`: the `status` object.
pub async fn token_review(
    client: &kube::Client,
    token: &str,
    audiences: &[&str],
) -> io::Result<Value> {
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": audiences},
    });
    let (code, resp) = raw(
        client,
        "POST",
        "/apis/authentication.k8s.io/v1/tokenreviews",
        Some(&body),
    )
    .await?;
    if code != 201 {
        return Err(io::Error::other(format!("TokenReview: {code} {resp}")));
    }
    Ok(resp["status"].clone())
}
