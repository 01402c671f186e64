//! What a real cluster gives pods besides a runtime: Service `kubernetes`
//! reachable from the pod network, Services through kube-proxy (the same
//! Kubernetes release, iptables mode), and cluster DNS (Service names to
//! ClusterIPs). All of it answers on the rig's bridge only.
//!
//! - The API server listens on loopback; a pod's 127.0.0.1 is its own. The
//!   rig forwards `<bridge gateway>:<port>` to it ([`TcpForwarder`]) and
//!   publishes that address as the EndpointSlice of Service
//!   `default/kubernetes` (the API server runs with
//!   `--endpoint-reconciler-type none`, see [`super::RealCluster`]), so
//!   in-cluster clients dial the ClusterIP 10.0.0.1:443 as anywhere.
//! - kube-proxy: `mode: iptables`, `masqueradeAll: true` (the pods share one
//!   bridge: unless its switched traffic passes iptables, through
//!   br_netfilter with `bridge-nf-call-iptables`, which a host may turn
//!   off, the reply of a pod to a pod that dialled a ClusterIP would
//!   bypass the host's conntrack; masquerading holds either way,
//!   pkg/proxy/iptables/proxier.go `syncProxyRules`),
//!   `localhostNodePorts: false` (no `route_localnet` sysctl) and
//!   `conntrack.maxPerCore: 0` and zero timeouts (no conntrack sysctls,
//!   pkg/proxy/conntrack/sysctls.go `setSysctls`, called from
//!   cmd/kube-proxy/app/server_linux.go `platformSetup`). Its chains are
//!   removed at the end with `kube-proxy --cleanup`.
//! - Cluster DNS: CoreDNS on the bridge gateway ([`CoreDns`]); the
//!   kubelet's `clusterDNS` points at it.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::{RealCluster, raw};
use crate::mountguard::{ChildGuard, free_addr, wait_answering};

/// Forwards TCP connections from an address pods reach (on the node's
/// bridge) to a server of the rig on loopback: the API server, the
/// slurmrestd double.
#[derive(Debug)]
pub struct TcpForwarder {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl TcpForwarder {
    /// Listens on `ip` (a free port) and forwards to `to`.
    pub async fn start(ip: Ipv4Addr, to: SocketAddr) -> io::Result<Self> {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The address pods reach the server on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for TcpForwarder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Publishes `addr` as the endpoint of Service `default/kubernetes`.
pub async fn publish_kubernetes_endpoint(
    client: &kube::Client,
    addr: SocketAddr,
) -> io::Result<()> {
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": "kubernetes-rig",
            "namespace": "default",
            "labels": {
                "kubernetes.io/service-name": "kubernetes",
                "endpointslice.kubernetes.io/managed-by": "mountguard-rig"
            }
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [addr.ip().to_string()], "conditions": {"ready": true}}],
        "ports": [{"name": "https", "port": addr.port(), "protocol": "TCP"}]
    });
    let (code, body) = raw(
        client,
        "POST",
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
        Some(&slice),
    )
    .await?;
    if code != 201 {
        return Err(io::Error::other(format!(
            "creating the kubernetes EndpointSlice: {code} {body}"
        )));
    }
    Ok(())
}

/// A running kube-proxy; its iptables chains are removed on drop.
#[derive(Debug)]
pub struct KubeProxy {
    child: Option<ChildGuard>,
    binary: std::path::PathBuf,
    config: std::path::PathBuf,
    /// `KUBE-*` chains (tool, table, chain) that existed before it started.
    preexisting: Vec<Chain>,
}

const IPTABLES: [&str; 2] = ["iptables", "ip6tables"];

/// `(tool, table, chain)`.
type Chain = (String, String, String);
/// `(tool, table, rule arguments)`.
type Jump = (String, String, Vec<String>);

/// `(tool, table, chain)` of every `KUBE-*` chain, and the rules of the
/// built-in chains that jump to one, as `(tool, table, rule args)`.
fn kube_chains() -> (Vec<Chain>, Vec<Jump>) {
    let (mut chains, mut jumps) = (Vec::new(), Vec::new());
    for tool in IPTABLES {
        let Ok(out) = Command::new(format!("{tool}-save")).output() else {
            continue;
        };
        let mut table = String::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(t) = line.strip_prefix('*') {
                table = t.to_string();
            } else if let Some(c) = line.strip_prefix(':') {
                let name = c.split(' ').next().unwrap_or("");
                if name.starts_with("KUBE-") {
                    chains.push((tool.to_string(), table.clone(), name.to_string()));
                }
            } else if let Some(rule) = line.strip_prefix("-A ") {
                let args: Vec<String> = rule.split_whitespace().map(String::from).collect();
                let builtin = !args.first().is_some_and(|c| c.starts_with("KUBE-"));
                let jumps_kube = args
                    .windows(2)
                    .any(|w| w[0] == "-j" && w[1].starts_with("KUBE-"));
                if builtin && jumps_kube {
                    jumps.push((tool.to_string(), table.clone(), args));
                }
            }
        }
    }
    (chains, jumps)
}

impl KubeProxy {
    /// Starts kube-proxy (`binary`) for node `node` with pod CIDR `cidr`,
    /// as user `system:kube-proxy` (bootstrap ClusterRoleBinding
    /// `system:node-proxier`); waits until it is healthy.
    pub async fn start(
        cluster: &RealCluster,
        binary: &Path,
        node: &str,
        cidr: &str,
        dir: &Path,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let kubeconfig = cluster.user_kubeconfig("kube-proxy", "system:kube-proxy", &[])?;
        let healthz = free_addr()?;
        let metrics = free_addr()?;
        let config = dir.join("kube-proxy.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kc}
mode: iptables
clusterCIDR: {cidr}
hostnameOverride: {node}
bindAddress: 127.0.0.1
healthzBindAddress: {healthz}
metricsBindAddress: {metrics}
iptables:
  masqueradeAll: true
  localhostNodePorts: false
  syncPeriod: 1s
  minSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
",
                kc = kubeconfig.display()
            ),
        )?;
        let preexisting = kube_chains().0;
        let mut cmd = Command::new(binary);
        cmd.arg("--config").arg(&config).arg("--v=2");
        let mut child = ChildGuard::spawn(
            "kube-proxy",
            cmd,
            &cluster.logs_dir().join("kube-proxy.log"),
        )?;
        wait_answering(
            &mut child,
            &format!("http://{healthz}/healthz"),
            Duration::from_secs(60),
        )
        .await
        .map_err(|e| io::Error::other(format!("kube-proxy did not become healthy: {e}")))?;
        Ok(Self {
            child: Some(child),
            binary: binary.to_path_buf(),
            config,
            preexisting,
        })
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.child
            .as_ref()
            .map(|c| c.log_tail(lines))
            .unwrap_or_default()
    }
}

impl Drop for KubeProxy {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
            // Removes every chain and jump rule kube-proxy made
            // (cmd/kube-proxy/app/options.go `--cleanup`, server_linux.go
            // `platformCleanup`).
            let _ = Command::new(&self.binary)
                .arg("--config")
                .arg(&self.config)
                .arg("--cleanup")
                .output();
            // What `--cleanup` leaves (KUBE-FIREWALL, KUBE-MARK-MASQ and
            // the canary chains, in both families): the jumps to the new
            // chains first, then the chains.
            let (chains, jumps) = kube_chains();
            let new: Vec<_> = chains
                .into_iter()
                .filter(|c| !self.preexisting.contains(c))
                .collect();
            for (tool, table, args) in jumps {
                let target = args
                    .windows(2)
                    .find(|w| w[0] == "-j")
                    .map(|w| w[1].clone())
                    .unwrap_or_default();
                if new
                    .iter()
                    .any(|(t, tb, c)| *t == tool && *tb == table && *c == target)
                {
                    let _ = Command::new(&tool)
                        .args(["-t", &table, "-D"])
                        .args(&args)
                        .output();
                }
            }
            for (tool, table, chain) in &new {
                let _ = Command::new(tool).args(["-t", table, "-F", chain]).output();
            }
            for (tool, table, chain) in &new {
                let _ = Command::new(tool).args(["-t", table, "-X", chain]).output();
            }
        }
    }
}

/// The cluster domain (the kubelet's `clusterDomain`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// Cluster DNS: CoreDNS (`scripts/node-tools.sh`, built with the plugins
/// `bind`, `ready`, `errors`, `log` and `kubernetes` only) on `<ip>:53`,
/// UDP and TCP, authoritative for [`CLUSTER_DOMAIN`] from the API server
/// (its `kubernetes` plugin, as the admin). Nothing is forwarded off the
/// machine: it has no server block for other names, which it refuses.
/// Every query is logged as `<client> <proto> <type> <name> <rcode>`
/// ([`Self::queries`]).
#[derive(Debug)]
pub struct CoreDns {
    /// Killed and reaped on drop.
    child: ChildGuard,
    ip: Ipv4Addr,
}

/// One query in CoreDNS's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsQuery {
    /// The client's address.
    pub client: String,
    /// `udp` or `tcp`.
    pub proto: String,
    /// The query type (`A`, `AAAA`, ...).
    pub qtype: String,
    /// The name asked, fully qualified (trailing dot).
    pub name: String,
    /// The answer's rcode (`NOERROR`, `NXDOMAIN`, ...).
    pub rcode: String,
}

/// The `log` plugin's format of [`CoreDns`]'s Corefile (placeholders of
/// plugin/pkg/replacer/replacer.go), parsed back by [`parse_query_log`].
const QUERY_LOG_FORMAT: &str = "query {remote} {proto} {type} {name} {rcode}";

/// The queries in a CoreDNS log written with [`QUERY_LOG_FORMAT`]
/// (plugin/log/log.go `ServeDNS` writes each through `clog.Info`, as
/// `[INFO] <line>`).
fn parse_query_log(log: &str) -> Vec<DnsQuery> {
    log.lines()
        .filter_map(|l| {
            let rest = l.split_once("[INFO] query ")?.1;
            let f: Vec<&str> = rest.split_whitespace().collect();
            let [client, proto, qtype, name, rcode] = f[..] else {
                return None;
            };
            Some(DnsQuery {
                client: client.to_string(),
                proto: proto.to_string(),
                qtype: qtype.to_string(),
                name: name.to_string(),
                rcode: rcode.to_string(),
            })
        })
        .collect()
}

impl CoreDns {
    /// Starts CoreDNS (`binary`) on `ip`:53 with a Corefile in `dir`;
    /// waits until its `ready` endpoint answers 200, which it does once the
    /// `kubernetes` plugin's informers have synced
    /// (plugin/kubernetes/ready.go `Ready`).
    pub async fn start(
        cluster: &RealCluster,
        binary: &Path,
        ip: Ipv4Addr,
        dir: &Path,
    ) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let ready = free_addr()?;
        let corefile = dir.join("Corefile");
        std::fs::write(
            &corefile,
            format!(
                "{CLUSTER_DOMAIN}:53 {{
    bind {ip}
    ready {ready}
    errors
    log . \"{QUERY_LOG_FORMAT}\"
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kc}
    }}
}}
",
                kc = cluster.kubeconfig_path().display()
            ),
        )?;
        let mut cmd = Command::new(binary);
        cmd.arg("-conf").arg(&corefile).current_dir(dir);
        let mut child = ChildGuard::spawn("coredns", cmd, &cluster.logs_dir().join("coredns.log"))?;
        wait_answering(
            &mut child,
            &format!("http://{ready}/ready"),
            Duration::from_secs(60),
        )
        .await
        .map_err(|e| io::Error::other(format!("CoreDNS did not become ready on {ip}:53: {e}")))?;
        Ok(Self { child, ip })
    }

    /// Its address (the pods' nameserver).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The queries it answered so far, from its log.
    pub fn queries(&self) -> Vec<DnsQuery> {
        parse_query_log(&self.log_tail(usize::MAX))
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.child.log_tail(lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_log_lines_are_parsed_and_other_lines_skipped() {
        let log = "\
.:53 on 10.213.7.1
[INFO] plugin/ready: Still waiting on: \"kubernetes\"
[INFO] query 10.213.7.5 udp A mg-mountguard.mountguard-system.svc.cluster.local. NOERROR
[INFO] query 10.213.7.5 udp AAAA x.svc.cluster.local. NXDOMAIN
";
        let q = parse_query_log(log);
        assert_eq!(q.len(), 2, "{q:?}");
        assert_eq!(
            q[0],
            DnsQuery {
                client: "10.213.7.5".into(),
                proto: "udp".into(),
                qtype: "A".into(),
                name: "mg-mountguard.mountguard-system.svc.cluster.local.".into(),
                rcode: "NOERROR".into(),
            }
        );
        assert_eq!(
            (q[1].qtype.as_str(), q[1].rcode.as_str()),
            ("AAAA", "NXDOMAIN")
        );
    }
}
