//! The real Slinky operator (`cmd/manager` of slurm-operator v1.2.1),
//! built by `scripts/upstream.sh` from local checkouts of
//! slurm-operator and slurm-client (the module proxy refuses both), run as
//! a child process against the real API server with the RBAC its own chart
//! grants (`helm/slurm-operator/files/operator_rbac_rules.yaml`, bound to
//! its ServiceAccount, whose TokenRequest token it uses).
//!
//! Its slurm-client reaches slurmrestd at
//! `http://<RestApi name>-restapi.<namespace>:6820` (slurm-operator
//! `internal/controller/slurmclient/slurmclient_sync.go`,
//! `getRestApiServer`; `api/v1beta1/restapi_keys.go`, `ServiceFQDNShort`;
//! `internal/builder/restapibuilder`, `SlurmrestdPort`). No DNS serves
//! that name here, and the port cannot be changed: the manager runs in a
//! mount namespace of its own (`unshare --mount`) whose `/etc/hosts` maps
//! the name to a loopback address of this test's ([`loopback_for`]), where
//! the slurmrestd double listens on port 6820. Nothing outside that
//! namespace changes.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::{RealCluster, create, ensure_namespace, raw_with, token_request};
use crate::mountguard::{ChildGuard, free_addr, poll};

/// The environment variable naming the directory `scripts/upstream.sh`
/// prints as `slinky-operator-dir:`.
pub const OPERATOR_DIR_VAR: &str = "MOUNTGUARD_SLINKY_OPERATOR_DIR";

/// The release the directory holds (scripts/upstream.sh `SLINKY_SRC_VERSION`).
pub const OPERATOR_VERSION: &str = "v1.2.1";

/// slurmrestd's port, fixed in the operator's slurm client URL
/// (`restapibuilder.SlurmrestdPort`).
pub const SLURMRESTD_PORT: u16 = 6820;

/// The operator's namespace and ServiceAccount (the Slinky docs install
/// the operator's chart in namespace `slinky`).
pub const OPERATOR_NAMESPACE: &str = "slinky";
/// The operator's ServiceAccount and ClusterRole.
pub const OPERATOR_ACCOUNT: &str = "slurm-operator";

/// The RestApi custom resource of the rig (bound to the Controller
/// `crate::cluster::SLURM_CLUSTER`).
pub const RESTAPI: &str = "slurm";

/// The short name of the RestApi's Service, which the operator's slurm
/// client dials (`RestApi.Key`: `<name>-restapi`; `domainname.FqdnShort`:
/// `<name>.<namespace>`).
pub fn restapi_host() -> String {
    format!("{RESTAPI}-restapi.{}", crate::cluster::SLURM_NAMESPACE)
}

/// The operator build of `scripts/upstream.sh`: `bin/slurm-operator`,
/// `crds/`, `rbac/operator_rbac_rules.yaml` (and `versions.txt`, which
/// scripts/test.sh prints).
#[derive(Debug, Clone)]
pub struct OperatorBuild {
    dir: PathBuf,
}

impl OperatorBuild {
    /// The build named by [`OPERATOR_DIR_VAR`], else the one
    /// `scripts/upstream.sh` reports (`slinky-operator-dir:`), or why there
    /// is none (with what to do).
    pub fn from_env() -> Result<Self, String> {
        let dir = match std::env::var_os(OPERATOR_DIR_VAR) {
            Some(dir) => PathBuf::from(dir),
            None => from_upstream_script()?,
        };
        let b = Self { dir };
        for p in [b.manager(), b.rbac_rules(), b.crds()] {
            if !p.exists() {
                return Err(format!(
                    "{} is missing: {OPERATOR_DIR_VAR} must name a complete build of scripts/upstream.sh",
                    p.display()
                ));
            }
        }
        Ok(b)
    }

    /// The manager binary.
    pub fn manager(&self) -> PathBuf {
        self.dir.join("bin/slurm-operator")
    }

    /// The release's CRDs (`config/crd/bases`).
    pub fn crds(&self) -> PathBuf {
        self.dir.join("crds")
    }

    /// The ClusterRole rules of the operator's chart.
    pub fn rbac_rules(&self) -> PathBuf {
        self.dir.join("rbac/operator_rbac_rules.yaml")
    }
}

/// Runs `scripts/upstream.sh` (it answers at once from its cache) and
/// takes its `slinky-operator-dir:` line, or its SKIPPED reason.
fn from_upstream_script() -> Result<PathBuf, String> {
    let script = super::repo().join("scripts/upstream.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(dir) = stdout
        .lines()
        .find_map(|l| l.strip_prefix("slinky-operator-dir: "))
    {
        return Ok(PathBuf::from(dir.trim()));
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let why: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("SKIPPED: the Slinky operator v"))
        .collect();
    Err(format!(
        "no build of the real Slinky operator {OPERATOR_VERSION}: {}; it is built by scripts/upstream.sh \
         from checkouts of github.com/SlinkyProject/slurm-operator and slurm-client \
         (MOUNTGUARD_SLINKY_SRC, MOUNTGUARD_SLURM_CLIENT_SRC; see docs/testing.md), or set \
         {OPERATOR_DIR_VAR} to a build's directory",
        if why.is_empty() {
            "scripts/upstream.sh reported none".to_string()
        } else {
            why.join("; ")
        }
    ))
}

/// A loopback address of this process's own (127.x.y.1, from the process
/// id and `salt`), so that tests running side by side each have their
/// own slurmrestd on port 6820.
pub fn loopback_for(salt: u16) -> Ipv4Addr {
    let id = std::process::id();
    let v = id.wrapping_mul(2_654_435_761).wrapping_add(u32::from(salt)) % (250 * 250);
    Ipv4Addr::new(127, 1 + (v / 250) as u8, 1 + (v % 250) as u8, 1)
}

/// The slurmrestd double on port 6820 of a loopback address of this
/// test's (tries a few addresses if one is taken).
pub async fn start_slurmrestd_double(
    cluster_name: &str,
) -> std::io::Result<crate::slurmrestd::SlurmrestdDouble> {
    let mut last = None;
    for salt in 0..16 {
        let addr = SocketAddr::from((loopback_for(salt), SLURMRESTD_PORT));
        match crate::slurmrestd::SlurmrestdDouble::start_on(cluster_name, addr).await {
            Ok(d) => return Ok(d),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("no loopback address")))
}

/// The running manager.
#[derive(Debug)]
pub struct RealOperator {
    child: ChildGuard,
    log: PathBuf,
}

impl RealOperator {
    /// Applies the operator's ServiceAccount and chart RBAC, then starts
    /// the manager with its token; `restapi_host` (the RestApi Service's
    /// short name) resolves to `restapi_ip` in its mount namespace. Waits
    /// until its readiness endpoint answers.
    pub async fn start(
        cluster: &RealCluster,
        build: &OperatorBuild,
        restapi_host: &str,
        restapi_ip: Ipv4Addr,
    ) -> std::io::Result<Self> {
        let client = cluster.client().await?;
        ensure_namespace(&client, OPERATOR_NAMESPACE).await?;
        create(
            &client,
            &json!({"apiVersion": "v1", "kind": "ServiceAccount",
                    "metadata": {"name": OPERATOR_ACCOUNT, "namespace": OPERATOR_NAMESPACE}}),
        )
        .await?;
        // The chart's ClusterRole: its rules file as the chart includes it
        // (helm/slurm-operator/templates/operator/rbac.yaml), posted as YAML.
        let rules = std::fs::read_to_string(build.rbac_rules())?;
        let role = format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: {OPERATOR_ACCOUNT}\n{rules}"
        );
        let (code, body) = raw_with(
            &client,
            "POST",
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            role.into_bytes(),
            "application/yaml",
        )
        .await?;
        if code != 201 {
            return Err(std::io::Error::other(format!(
                "creating the operator's ClusterRole: {code} {body}"
            )));
        }
        create(
            &client,
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": OPERATOR_ACCOUNT},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": OPERATOR_ACCOUNT},
                    "subjects": [{"kind": "ServiceAccount", "name": OPERATOR_ACCOUNT, "namespace": OPERATOR_NAMESPACE}]}),
        )
        .await?;
        let token = token_request(
            &client,
            OPERATOR_NAMESPACE,
            OPERATOR_ACCOUNT,
            &[],
            24 * 3600,
            None,
        )
        .await?;
        let kubeconfig = cluster.token_kubeconfig("slurm-operator", &token)?;
        let hosts = cluster.dir().join("slurm-operator.hosts");
        std::fs::write(
            &hosts,
            format!("127.0.0.1 localhost\n{restapi_ip} {restapi_host}\n"),
        )?;
        let health = free_addr()?;
        let metrics = free_addr()?;
        let log = cluster.dir().join("logs/slurm-operator.log");
        // A new mount namespace whose /etc/hosts is `hosts` (bind-mounted,
        // private propagation: the host's mount table is untouched).
        let mut cmd = Command::new("unshare");
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount --bind \"$0\" /etc/hosts && exec \"$@\"")
            .arg(&hosts)
            .arg(build.manager())
            .arg(format!("--health-addr={health}"))
            .arg(format!("--metrics-addr={metrics}"))
            .arg("--zap-log-level=debug")
            .env("KUBECONFIG", &kubeconfig);
        let child =
            ChildGuard::spawn("slurm-operator (in unshare --mount; needs root)", cmd, &log)?;
        let op = Self { child, log };
        let url = format!("http://{health}/readyz");
        let ready = poll(
            "the Slinky operator's /readyz",
            Duration::from_secs(60),
            || {
                let url = url.clone();
                async move { crate::mountguard::http_get(&url).await.ok().map(|_| ()) }
            },
        )
        .await;
        if let Err(e) = ready {
            return Err(std::io::Error::other(format!(
                "{e}\n{}",
                op.child.log_tail(40)
            )));
        }
        Ok(op)
    }

    /// Its whole log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The Slinky custom resources of the rig, the way the Slinky docs (and
/// its `helm/slurm` chart) describe a cluster whose slurmctld runs outside
/// Kubernetes: a `Controller` with `external: true` (slurmctld at
/// `slurmctld`) and the auth Secrets of the rig, a `RestApi`
/// bound to it (the operator's slurm client dials its Service), and the
/// NodeSet of workers (`replicas`, one per node: the operator gives each
/// pod an anti-affinity to the others,
/// `internal/controller/nodeset/utils/utils.go` `NewNodeSetStatefulSetPod`),
/// whose slurmd mounts the hooks ConfigMap and reads it at start.
pub fn custom_resources(replicas: usize, slurmctld: SocketAddr) -> Vec<serde_json::Value> {
    use crate::cluster::{AUTH_SECRET, HOOKS_CONFIGMAP, JWT_SECRET, NODESET, SLURM_CLUSTER};
    let ns = crate::cluster::SLURM_NAMESPACE;
    vec![
        json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "Controller",
            "metadata": {"name": SLURM_CLUSTER, "namespace": ns},
            "spec": {
                "clusterName": SLURM_CLUSTER,
                "slurmKeyRef": {"name": AUTH_SECRET, "key": "slurm.key"},
                "jwtHs256KeyRef": {"name": JWT_SECRET, "key": "jwt.key"},
                "external": true,
                "externalConfig": {"host": slurmctld.ip().to_string(), "port": slurmctld.port()},
            },
        }),
        json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "RestApi",
            "metadata": {"name": RESTAPI, "namespace": ns},
            // No slurmrestd pod: it would mount `slurm.key` and pin the
            // kubelet's cache on its node (tests place their own pins).
            "spec": {
                "controllerRef": {"name": SLURM_CLUSTER},
                "replicas": 0,
                "slurmrestd": {"image": "ghcr.io/slinkyproject/slurmrestd:25.11-ubuntu24.04"},
            },
        }),
        json!({
            "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
            "metadata": {"name": NODESET, "namespace": ns},
            "spec": {
                "controllerRef": {"name": SLURM_CLUSTER},
                "replicas": replicas,
                "logfile": {"image": "docker.io/library/alpine:latest"},
                "slurmd": {
                    "image": "ghcr.io/slinkyproject/slurmd:25.11-ubuntu24.04",
                    "volumeMounts": [{"name": "hooks", "mountPath": "/etc/enroot/hooks.d"}],
                },
                "template": {
                    // slurmd reads its hooks at start (from the first
                    // revision: a template change later would be a rolling
                    // update by the operator).
                    "metadata": {
                        "labels": {"app.kubernetes.io/part-of": "slurm"},
                        "annotations": {"mountguard.io/read-at-start": "hooks"},
                    },
                    "spec": {
                        "automountServiceAccountToken": false,
                        "volumes": [{"name": "hooks", "configMap": {"name": HOOKS_CONFIGMAP, "defaultMode": 0o755}}],
                    },
                },
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%"}},
            },
        }),
    ]
}
