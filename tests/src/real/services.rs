//! What a real cluster gives pods besides a runtime: Service `kubernetes`
//! reachable from the pod network, Services through kube-proxy (the same
//! Kubernetes release, iptables mode), and cluster DNS (CoreDNS with its
//! `kubernetes` plugin). All of it answers on the rig's bridge only.
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
//! - CoreDNS bound to the bridge gateway, the `kubernetes` plugin for
//!   `cluster.local`, nothing forwarded off the machine (other names
//!   answer NXDOMAIN); the kubelet's `clusterDNS` points at it.

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
        }
    }
}

/// A running CoreDNS on the bridge gateway.
#[derive(Debug)]
pub struct CoreDns {
    child: ChildGuard,
    ip: Ipv4Addr,
}

impl CoreDns {
    /// Starts CoreDNS (`binary`) on `ip`:53 with the `kubernetes` plugin
    /// reading the cluster through the admin kubeconfig; waits until it
    /// answers (its `ready` plugin on loopback).
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
                ".:53 {{
    bind {ip}
    errors
    ready {ready}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kc}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
",
                kc = cluster.kubeconfig_path().display()
            ),
        )?;
        let mut cmd = Command::new(binary);
        cmd.arg("-conf").arg(&corefile).current_dir(dir);
        let mut child = ChildGuard::spawn("coredns", cmd, &cluster.logs_dir().join("coredns.log"))?;
        let url = format!("http://{ready}/ready");
        let r = poll("CoreDNS to be ready", Duration::from_secs(60), || {
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
                "CoreDNS did not become ready ({r:?}):\n{}",
                child.log_tail(30)
            )));
        }
        Ok(Self { child, ip })
    }

    /// Its address (the pods' nameserver).
    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.child.log_tail(lines)
    }
}
