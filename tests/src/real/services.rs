//! What a real cluster gives pods besides a runtime: Service `kubernetes`
//! reachable from the pod network, Services through kube-proxy (the same
//! Kubernetes release, iptables mode), and cluster DNS (Service names to
//! ClusterIPs). All of it answers on the rig's bridge only.
//!
//! - The API server listens on loopback; a pod's 127.0.0.1 is its own. The
//!   rig forwards `<bridge gateway>:<port>` to it ([`ApiForwarder`]) and
//!   publishes that address as the EndpointSlice of Service
//!   `default/kubernetes` (the API server runs with
//!   `--endpoint-reconciler-type none`, see [`super::RealCluster`]), so
//!   in-cluster clients dial the ClusterIP 10.0.0.1:443 as anywhere.
//! - kube-proxy: `mode: iptables`, `masqueradeAll: true` (the pods share one
//!   bridge and `br_netfilter` is not loaded here: without masquerading
//!   the reply of a pod to a pod that dialled a ClusterIP would bypass the
//!   host's conntrack, pkg/proxy/iptables/proxier.go `syncProxyRules`),
//!   `localhostNodePorts: false` (no `route_localnet` sysctl) and
//!   `conntrack.maxPerCore: 0` (no conntrack sysctls,
//!   cmd/kube-proxy/app/server_linux.go `setupConntrack`). Its chains are
//!   removed at the end with `kube-proxy --cleanup`.
//! - Cluster DNS on the bridge gateway ([`ClusterDns`], the rig's own
//!   resolver standing in for CoreDNS, see there); the kubelet's
//!   `clusterDNS` points at it.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::{RealCluster, raw};
use crate::mountguard::{ChildGuard, free_addr, poll};

/// Forwards TCP connections from `listen` to the API server.
#[derive(Debug)]
pub struct ApiForwarder {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl ApiForwarder {
    /// Listens on `ip` (a free port) and forwards to `api`.
    pub async fn start(ip: Ipv4Addr, api: SocketAddr) -> io::Result<Self> {
        let listener = tokio::net::TcpListener::bind((ip, 0)).await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(api).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Self { addr, task })
    }

    /// The address pods reach the API server on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ApiForwarder {
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
        let url = format!("http://{healthz}/healthz");
        let r = poll("kube-proxy to be healthy", Duration::from_secs(60), || {
            let url = url.clone();
            let exited = child.exited();
            async move {
                if exited.is_some() {
                    return Some(false);
                }
                crate::mountguard::http_get(&url).await.ok().map(|_| true)
            }
        })
        .await;
        if !matches!(r, Ok(true)) {
            return Err(io::Error::other(format!(
                "kube-proxy did not become healthy ({r:?}):\n{}",
                child.log_tail(30)
            )));
        }
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
            // (cmd/kube-proxy/app/server.go `--cleanup`).
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

/// Cluster DNS of the rig: answers `A` queries for
/// `<service>.<namespace>.svc.cluster.local` with the Service's ClusterIP
/// (read from the API server at each query), `AAAA` with no record, and
/// every other name with NXDOMAIN (nothing is forwarded off the machine).
/// What CoreDNS's `kubernetes` plugin answers for a ClusterIP Service
/// (plugin/kubernetes/kubernetes.go `Records`, the DNS specification of
/// kubernetes/dns docs/specification.md, "4.1 Schema": A record for
/// `<service>.<ns>.svc.<zone>`); CoreDNS itself is served by the module
/// proxy, but its build (every plugin's dependencies) does not fit this
/// tier's time on a 2-core machine.
#[derive(Debug)]
pub struct ClusterDns {
    ip: Ipv4Addr,
    task: tokio::task::JoinHandle<()>,
    queries: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

/// The cluster domain (the kubelet's `clusterDomain`).
pub const CLUSTER_DOMAIN: &str = "cluster.local";

impl ClusterDns {
    /// Listens on `ip`:53 (UDP), answering from `client`.
    pub async fn start(client: kube::Client, ip: Ipv4Addr) -> io::Result<Self> {
        let sock = tokio::net::UdpSocket::bind((ip, 53)).await?;
        let queries = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = queries.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
                let Some((id, flags, name, qtype, qend)) = parse_query(&buf[..n]) else {
                    continue;
                };
                if let Ok(mut l) = log.lock() {
                    l.push(name.clone());
                }
                let answer = match (qtype, service_of(&name)) {
                    (1, Some((svc, ns))) => {
                        match raw(
                            &client,
                            "GET",
                            &format!("/api/v1/namespaces/{ns}/services/{svc}"),
                            None,
                        )
                        .await
                        {
                            Ok((200, s)) => s["spec"]["clusterIP"]
                                .as_str()
                                .and_then(|a| a.parse::<Ipv4Addr>().ok())
                                .map(|a| vec![a]),
                            _ => None,
                        }
                    }
                    // AAAA and other types of an existing name: no record.
                    (_, Some((svc, ns))) => {
                        match raw(
                            &client,
                            "GET",
                            &format!("/api/v1/namespaces/{ns}/services/{svc}"),
                            None,
                        )
                        .await
                        {
                            Ok((200, _)) => Some(Vec::new()),
                            _ => None,
                        }
                    }
                    _ => None,
                };
                let reply = build_reply(id, flags, &buf[12..qend], answer.as_deref());
                let _ = sock.send_to(&reply, peer).await;
            }
        });
        Ok(Self { ip, task, queries })
    }

    /// Its address (the pods' nameserver).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The names asked so far.
    pub fn queries(&self) -> Vec<String> {
        self.queries.lock().map(|q| q.clone()).unwrap_or_default()
    }

    /// The names asked, as a log tail.
    pub fn log_tail(&self, lines: usize) -> String {
        let q = self.queries();
        q[q.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for ClusterDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `(service, namespace)` of `<svc>.<ns>.svc.cluster.local`.
fn service_of(name: &str) -> Option<(String, String)> {
    let rest = name
        .trim_end_matches('.')
        .to_ascii_lowercase()
        .strip_suffix(&format!(".svc.{CLUSTER_DOMAIN}"))?
        .to_string();
    let (svc, ns) = rest.split_once('.')?;
    (!svc.is_empty() && !ns.is_empty() && !ns.contains('.'))
        .then(|| (svc.to_string(), ns.to_string()))
}

/// `(id, flags, name, qtype, end of the question)` of a one-question query
/// (RFC 1035 4.1).
fn parse_query(m: &[u8]) -> Option<(u16, u16, String, u16, usize)> {
    if m.len() < 12 || u16::from_be_bytes([m[4], m[5]]) != 1 || m[2] & 0x80 != 0 {
        return None;
    }
    let id = u16::from_be_bytes([m[0], m[1]]);
    let flags = u16::from_be_bytes([m[2], m[3]]);
    let mut i = 12;
    let mut labels = Vec::new();
    loop {
        let len = *m.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(m.get(i..i + len)?).into_owned());
        i += len;
    }
    let qtype = u16::from_be_bytes([*m.get(i)?, *m.get(i + 1)?]);
    Some((id, flags, labels.join("."), qtype, i + 4))
}

/// The reply: the question echoed, `answer` as A records (TTL 5 s), or
/// NXDOMAIN when `None`.
fn build_reply(id: u16, qflags: u16, question: &[u8], answer: Option<&[Ipv4Addr]>) -> Vec<u8> {
    let rcode: u16 = if answer.is_some() { 0 } else { 3 };
    // QR, the query's opcode and RD, AA, RA, rcode.
    let flags = 0x8000 | (qflags & 0x7900) | 0x0400 | 0x0080 | rcode;
    let an = answer.map_or(0, <[Ipv4Addr]>::len) as u16;
    let mut r = Vec::with_capacity(512);
    r.extend_from_slice(&id.to_be_bytes());
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&1u16.to_be_bytes());
    r.extend_from_slice(&an.to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(question);
    for a in answer.unwrap_or(&[]) {
        r.extend_from_slice(&[0xC0, 0x0C, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4]);
        r.extend_from_slice(&a.octets());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_query_for_a_service_name_is_parsed_and_answered() {
        // dig +norec mountguard-controller.mountguard-system.svc.cluster.local A
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        for l in [
            "mountguard-controller",
            "mountguard-system",
            "svc",
            "cluster",
            "local",
        ] {
            q.push(l.len() as u8);
            q.extend_from_slice(l.as_bytes());
        }
        q.extend_from_slice(&[0, 0, 1, 0, 1]);
        let (id, flags, name, qtype, end) = parse_query(&q).expect("query");
        assert_eq!((id, qtype, end), (0x1234, 1, q.len()));
        assert_eq!(
            service_of(&name),
            Some(("mountguard-controller".into(), "mountguard-system".into()))
        );
        assert_eq!(service_of("a.b.svc.cluster.local.x"), None);
        assert_eq!(
            service_of("x.mountguard-system.svc.mountguard-system.svc.cluster.local"),
            None
        );
        let r = build_reply(id, flags, &q[12..end], Some(&[Ipv4Addr::new(10, 0, 0, 7)]));
        assert_eq!(&r[..4], &[0x12, 0x34, 0x85, 0x80]);
        assert_eq!(&r[6..8], &[0, 1]);
        assert_eq!(&r[r.len() - 4..], &[10, 0, 0, 7]);
        let nx = build_reply(id, flags, &q[12..end], None);
        assert_eq!(nx[3] & 0x0f, 3);
    }
}
