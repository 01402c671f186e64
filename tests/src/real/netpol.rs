//! A NetworkPolicy engine on the rig's node: kube-router's network policy
//! controller alone (`--run-firewall --run-router=false
//! --run-service-proxy=false`; v2.1.0, built by scripts/node-tools.sh) as a
//! host process against the rig's API server. It writes iptables rules and
//! ipsets on this host. A packet between two pods of the rig's bridge is
//! switched, not routed: it passes the FORWARD chain only through
//! br_netfilter, for a bridge with `nf_call_iptables` (Linux
//! net/bridge/br_netfilter_hooks.c `br_nf_pre_routing`: the global
//! `net.bridge.bridge-nf-call-iptables` or the bridge's own option), so
//! [`NetworkPolicyEngine::start`] turns on the option of the rig's bridge
//! only (the global sysctl is the other rigs' too).
//!
//! What it needs, from kube-router v2.1.0's
//! pkg/controllers/netpol/network_policy_controller.go
//! `NewNetworkPolicyController`: `--service-cluster-ip-range` (the API
//! server's, 10.0.0.0/24), the Node with an InternalIP (the kubelet's
//! `--node-ip`), found by `NODE_NAME`, else the host's name, else
//! `--hostname-override` (pkg/utils/node.go `GetNodeObject`: the rig sets
//! `NODE_NAME`); it enforces policies for the pods whose
//! `status.hostIP` is that address (pkg/controllers/netpol/pod.go
//! `getLocalPods`), no `spec.podCIDR` (only the router reads it). It calls
//! `iptables`, `iptables-save`, `iptables-restore` and `ipset`
//! (pkg/utils/ipset.go `NewIPSet`: Debian's `ipset` package).
//!
//! What it admits without a policy rule: traffic from the node itself
//! (pod.go, "rule to permit the traffic traffic to pods when source is the
//! pod's local node", `--src-type LOCAL`): the kubelet's probes and the
//! rig's own scrapes from the host are not what a policy decides; a client
//! of a policy test must be a pod. What it refuses: REJECT at the end of a
//! selected pod's chain (pod.go, "rule to REJECT traffic destined for
//! POD").
//!
//! [`NetworkPolicyEngine::start`] answers `Err(Unavailable)` when the engine
//! cannot run here (no binary, no `ipset`, the process exiting or never
//! writing its chains); the test prints a loud SKIPPED line. Dropping it
//! stops the process and removes its chains and ipsets as kube-router's own
//! `NetworkPolicyController.Cleanup` would (the same file): not with
//! `kube-router --cleanup-config`, which also flushes every IPVS service of
//! the host.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::RealCluster;
use super::containerd::Unavailable;
use crate::mountguard::{ChildGuard, poll};

/// The chain prefixes of kube-router's network policy controller
/// (network_policy_controller.go: `kubeInputChainName` and the other two
/// top-level chains, `kubePodFirewallChainPrefix`,
/// `kubeNetworkPolicyChainPrefix`, which `kubeDefaultNetpolChain` shares).
const CHAIN_PREFIXES: [&str; 3] = ["KUBE-ROUTER-", "KUBE-POD-FW-", "KUBE-NWPLCY-"];
/// Its ipset prefixes (`kubeSourceIPSetPrefix`,
/// `kubeDestinationIPSetPrefix`; `cleanupStaleIPSets`).
const IPSET_PREFIXES: [&str; 2] = ["KUBE-SRC-", "KUBE-DST-"];
/// The top-level chain that holds the jumps to the pods' chains.
const FORWARD_CHAIN: &str = "KUBE-ROUTER-FORWARD";

/// A running kube-router network policy controller.
#[derive(Debug)]
pub struct NetworkPolicyEngine {
    child: Option<ChildGuard>,
}

fn ours(chain: &str) -> bool {
    CHAIN_PREFIXES.iter().any(|p| chain.starts_with(p))
}

/// The filter table's chains of the engine and the rules of the built-in
/// chains that jump to one (`iptables-save` lines after `-A `).
fn engine_rules() -> (Vec<String>, Vec<Vec<String>>) {
    let Ok(out) = Command::new("iptables-save")
        .args(["-t", "filter"])
        .output()
    else {
        return (Vec::new(), Vec::new());
    };
    let (mut chains, mut jumps) = (Vec::new(), Vec::new());
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(c) = line.strip_prefix(':') {
            let name = c.split(' ').next().unwrap_or("");
            if ours(name) {
                chains.push(name.to_string());
            }
        } else if let Some(rule) = line.strip_prefix("-A ") {
            let args: Vec<String> = shell_words(rule);
            let builtin = args.first().is_some_and(|c| !ours(c));
            let to_ours = args.windows(2).any(|w| w[0] == "-j" && ours(&w[1]));
            if builtin && to_ours {
                jumps.push(args);
            }
        }
    }
    (chains, jumps)
}

/// Splits an `iptables-save` rule into arguments (its comments are double
/// quoted and may hold spaces).
fn shell_words(rule: &str) -> Vec<String> {
    let (mut words, mut cur, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    let mut chars = rule.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            '\\' if quoted => cur.extend(chars.next()),
            ' ' if !quoted => {
                if any || !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
                any = false;
            }
            c => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        words.push(cur);
    }
    words
}

impl NetworkPolicyEngine {
    /// Starts `binary` (kube-router) for node `node` against `cluster`,
    /// with the pods of `bridge`, logging to `<logs>/kube-router.log`;
    /// waits until its forward chain is hooked into FORWARD.
    pub async fn start(
        cluster: &RealCluster,
        binary: &Path,
        node: &str,
        bridge: &str,
    ) -> Result<Self, Unavailable> {
        if !Path::new("/proc/sys/net/bridge").is_dir() {
            return Err(Unavailable(
                "br_netfilter is not loaded (no /proc/sys/net/bridge): the bridge's traffic \
                 would not pass iptables"
                    .into(),
            ));
        }
        let set = Command::new("ip")
            .args([
                "link",
                "set",
                bridge,
                "type",
                "bridge",
                "nf_call_iptables",
                "1",
            ])
            .output()
            .map_err(|e| Unavailable(format!("ip link set {bridge}: {e}")))?;
        if !set.status.success() {
            return Err(Unavailable(format!(
                "ip link set {bridge} type bridge nf_call_iptables 1: {}",
                String::from_utf8_lossy(&set.stderr).trim()
            )));
        }
        if !binary.is_file() {
            return Err(Unavailable(format!(
                "{} not found (scripts/node-tools.sh builds it)",
                binary.display()
            )));
        }
        let found = |p: &str| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        };
        if !found("ipset") {
            return Err(Unavailable(
                "ipset not found on PATH (Debian package ipset)".into(),
            ));
        }
        let mut cmd = Command::new(binary);
        cmd.env("NODE_NAME", node)
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .args([
                "--run-firewall=true",
                "--run-router=false",
                "--run-service-proxy=false",
                &format!("--hostname-override={node}"),
                // The API server's (super::RealCluster).
                "--service-cluster-ip-range=10.0.0.0/24",
                "--health-port=0",
                "--metrics-port=0",
                // A full sync also restores the top-level chains
                // (`fullPolicySync` calls `ensureTopLevelChains`).
                "--iptables-sync-period=10s",
                "--v=2",
            ]);
        let log = cluster.logs_dir().join("kube-router.log");
        let mut child = ChildGuard::spawn("kube-router", cmd, &log)
            .map_err(|e| Unavailable(format!("starting kube-router: {e}")))?;
        let hooked = poll(
            "kube-router's chains in the filter table",
            Duration::from_secs(60),
            || {
                let exited = child.exited();
                async move {
                    if exited.is_some() {
                        return Some(false);
                    }
                    let (_, jumps) = engine_rules();
                    jumps
                        .iter()
                        .any(|j| j[0] == "FORWARD" && j.iter().any(|a| a == FORWARD_CHAIN))
                        .then_some(true)
                }
            },
        )
        .await;
        if !matches!(hooked, Ok(true)) {
            return Err(Unavailable(format!(
                "kube-router did not install its chains ({hooked:?}, exit {:?}):\n{}",
                child.exited(),
                child.log_tail(20)
            )));
        }
        Ok(Self { child: Some(child) })
    }

    /// Its rules in the filter table (`iptables-save` lines naming one of
    /// its chains), for failure messages.
    pub fn rules(&self) -> String {
        let Ok(out) = Command::new("iptables-save")
            .args(["-t", "filter"])
            .output()
        else {
            return String::new();
        };
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| CHAIN_PREFIXES.iter().any(|p| l.contains(p)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.child
            .as_ref()
            .map(|c| c.log_tail(lines))
            .unwrap_or_default()
    }
}

impl Drop for NetworkPolicyEngine {
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        c.kill();
        let (chains, jumps) = engine_rules();
        for args in jumps {
            let _ = Command::new("iptables")
                .args(["-t", "filter", "-D"])
                .args(&args)
                .output();
        }
        for chain in &chains {
            let _ = Command::new("iptables")
                .args(["-t", "filter", "-F", chain])
                .output();
        }
        for chain in &chains {
            let _ = Command::new("iptables")
                .args(["-t", "filter", "-X", chain])
                .output();
        }
        let sets = Command::new("ipset")
            .args(["list", "-n"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for set in sets
            .lines()
            .filter(|s| IPSET_PREFIXES.iter().any(|p| s.starts_with(p)))
        {
            let _ = Command::new("ipset").args(["destroy", set]).output();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shell_words;

    #[test]
    fn splits_an_iptables_save_rule_with_a_quoted_comment() {
        assert_eq!(
            shell_words(
                r#"FORWARD -m comment --comment "kube-router netpol - ABC" -j KUBE-ROUTER-FORWARD"#
            ),
            [
                "FORWARD",
                "-m",
                "comment",
                "--comment",
                "kube-router netpol - ABC",
                "-j",
                "KUBE-ROUTER-FORWARD"
            ]
        );
    }
}
