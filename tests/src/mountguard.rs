//! mountguard on the cluster in a box: the agent identity the controller
//! authorizes (namespace, ServiceAccount, one agent pod per node owned by
//! the agent DaemonSet, each with a projected token the API double's
//! TokenReview knows), the real binaries as child processes, and small
//! clients for the controller's `/metrics` and `/v1/verdicts`.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use mountguard_tests::cluster::Cluster;
//! use mountguard_tests::mountguard::deploy_agent_identities;
//! let cluster = Cluster::builder().nodes(2).slinky().start().await?;
//! let agents = deploy_agent_identities(&cluster).await?;
//! let token_file = &agents[0].token_file; // for --token-file of node-0's agent
//! # Ok(()) }
//! ```

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::apiserver::resources;
use crate::cluster::Cluster;

/// Namespace of mountguard's own objects.
pub const NAMESPACE: &str = "mountguard";
/// The agent's ServiceAccount.
pub const AGENT_SERVICE_ACCOUNT: &str = "mountguard-agent";
/// The agent DaemonSet (owner of the agent pods).
pub const AGENT_DAEMONSET: &str = "mountguard-agent";
/// Audience of the agents' projected tokens.
pub const TOKEN_AUDIENCE: &str = "mountguard";
/// Projected volume holding the agent's token.
pub const TOKEN_VOLUME: &str = "mountguard-token";

/// `--agent-service-account` for the controller.
pub fn agent_service_account_flag() -> String {
    format!("{NAMESPACE}:{AGENT_SERVICE_ACCOUNT}")
}

/// One node's agent identity.
#[derive(Debug, Clone)]
pub struct AgentIdentity {
    /// Node name.
    pub node: String,
    /// Agent pod name.
    pub pod: String,
    /// Agent pod UID.
    pub uid: String,
    /// The kubelet root of the node.
    pub kubelet_root: PathBuf,
    /// The projected token file the kubelet wrote (`--token-file`).
    pub token_file: PathBuf,
}

impl AgentIdentity {
    /// The token as the agent would send it.
    pub fn token(&self) -> io::Result<String> {
        Ok(std::fs::read_to_string(&self.token_file)?
            .trim()
            .to_string())
    }
}

/// The agent pod of a DaemonSet `mountguard-agent` on `node`: the
/// ServiceAccount, a projected service-account token with audience
/// `mountguard`, and the DaemonSet as controlling owner.
pub fn agent_pod(node: &str, daemonset_uid: &str) -> Value {
    json!({
        "metadata": {
            "name": format!("{AGENT_DAEMONSET}-{node}"),
            "labels": {"app.kubernetes.io/name": "mountguard-agent"},
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": AGENT_DAEMONSET,
                "uid": daemonset_uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_SERVICE_ACCOUNT,
            "containers": [{
                "name": "agent",
                "image": "ghcr.io/mountguard/mountguard-agent:test",
                "volumeMounts": [{"name": TOKEN_VOLUME, "mountPath": "/var/run/secrets/mountguard", "readOnly": true}],
            }],
            "volumes": [{"name": TOKEN_VOLUME, "projected": {"sources": [
                {"serviceAccountToken": {"audience": TOKEN_AUDIENCE, "expirationSeconds": 3600, "path": "token"}},
            ]}}],
        },
    })
}

/// Creates namespace `mountguard`, its agent ServiceAccount, the agent
/// DaemonSet `mountguard-agent` (stored only: the API double runs no
/// DaemonSet controller) and one agent pod per node controlled by it
/// (ownerReference with the DaemonSet's UID, `controller: true`, which is
/// what the controller checks), then waits until every kubelet double wrote
/// the pod's token and registered it for TokenReview.
pub async fn deploy_agent_identities(cluster: &Cluster) -> io::Result<Vec<AgentIdentity>> {
    let api = cluster.api();
    let io = |e: crate::apiserver::ApiError| io::Error::other(e.to_string());
    api.ensure_namespace(NAMESPACE).map_err(io)?;
    if api
        .get(
            &resources::SERVICE_ACCOUNTS,
            NAMESPACE,
            AGENT_SERVICE_ACCOUNT,
        )
        .is_err()
    {
        api.create(
            &resources::SERVICE_ACCOUNTS,
            NAMESPACE,
            json!({"metadata": {"name": AGENT_SERVICE_ACCOUNT}}),
        )
        .map_err(io)?;
    }
    let daemonset_uid = match api.get(&resources::DAEMONSETS, NAMESPACE, AGENT_DAEMONSET) {
        Ok(ds) => ds,
        Err(_) => api
            .create(
                &resources::DAEMONSETS,
                NAMESPACE,
                json!({"metadata": {"name": AGENT_DAEMONSET}, "spec": {
                    "selector": {"matchLabels": {"app.kubernetes.io/name": "mountguard-agent"}},
                    "template": {"metadata": {"labels": {"app.kubernetes.io/name": "mountguard-agent"}},
                                 "spec": {"containers": []}}}}),
            )
            .map_err(io)?,
    }["metadata"]["uid"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let mut out = Vec::new();
    for (i, node) in cluster.node_names().into_iter().enumerate() {
        out.push(deploy_pod_with_token(cluster, i, agent_pod(&node, &daemonset_uid)).await?);
    }
    Ok(out)
}

/// The UID of the agent DaemonSet [`deploy_agent_identities`] created.
pub fn agent_daemonset_uid(cluster: &Cluster) -> io::Result<String> {
    let ds = cluster
        .api()
        .get(&resources::DAEMONSETS, NAMESPACE, AGENT_DAEMONSET)
        .map_err(|e| io::Error::other(e.to_string()))?;
    Ok(ds["metadata"]["uid"].as_str().unwrap_or("").to_string())
}

/// Creates `pod` (a pod in namespace `mountguard` on node `node_index`
/// with the projected `mountguard` token volume, e.g. from [`agent_pod`])
/// and waits until the kubelet double wrote its token and the API double's
/// TokenReview knows it.
pub async fn deploy_pod_with_token(
    cluster: &Cluster,
    node_index: usize,
    pod: Value,
) -> io::Result<AgentIdentity> {
    let api = cluster.api();
    let io = |e: crate::apiserver::ApiError| io::Error::other(e.to_string());
    let node = cluster.node_names()[node_index].clone();
    let pod = api.create(&resources::PODS, NAMESPACE, pod).map_err(io)?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
    let root = cluster.kubelet_root(node_index);
    let token_file = mountguard_inventory::layout::pod_dir(&root, &uid)
        .join("volumes/kubernetes.io~projected")
        .join(TOKEN_VOLUME)
        .join("token");
    let id = AgentIdentity {
        pod: pod["metadata"]["name"].as_str().unwrap_or("").to_string(),
        node,
        uid,
        kubelet_root: root,
        token_file,
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let token = id.token().unwrap_or_default();
        if !token.is_empty()
            && token_review(&cluster.api_url(), &token)
                .await
                .is_ok_and(|u| {
                    u == format!("system:serviceaccount:{NAMESPACE}:{AGENT_SERVICE_ACCOUNT}")
                })
        {
            return Ok(id);
        }
        if Instant::now() > deadline {
            return Err(io::Error::other(format!(
                "the kubelet double of {} did not project the token {} in 15 s",
                id.node,
                id.token_file.display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asks the API double's TokenReview (audience `mountguard`) who `token`
/// is; `Err` when it is not authenticated.
pub async fn token_review(api_url: &str, token: &str) -> io::Result<String> {
    let body = json!({
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": token, "audiences": [TOKEN_AUDIENCE]},
    });
    let (code, text) = http_request(
        "POST",
        &format!("{api_url}/apis/authentication.k8s.io/v1/tokenreviews"),
        &[("content-type", "application/json")],
        serde_json::to_vec(&body).unwrap_or_default(),
    )
    .await?;
    let v: Value = serde_json::from_str(&text).map_err(io::Error::other)?;
    if code != 201 || v["status"]["authenticated"] != true {
        return Err(io::Error::other(format!("not authenticated: {text}")));
    }
    Ok(v["status"]["user"]["username"]
        .as_str()
        .unwrap_or("")
        .to_string())
}

/// One HTTP request over plain HTTP (loopback); status and body text.
pub async fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> io::Result<(u16, String)> {
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let mut req = http::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(io::Error::other)?;
    let fut = async {
        let resp = client.request(req).await.map_err(io::Error::other)?;
        let status = resp.status().as_u16();
        let bytes = Limited::new(resp.into_body(), 64 << 20)
            .collect()
            .await
            .map_err(io::Error::other)?
            .to_bytes();
        Ok::<_, io::Error>((status, String::from_utf8_lossy(&bytes).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(30), fut)
        .await
        .map_err(|_| io::Error::other(format!("{method} {url}: no answer in 30 s")))?
}

pub use crate::cluster::{STATUS_READER_GROUP, STATUS_READER_TOKEN, STATUS_READER_USER};

/// `GET url` with the rig's status reader token (the controller's status
/// API wants one; the other servers of the rig ignore it); the body when
/// the status is 200.
pub async fn http_get(url: &str) -> io::Result<String> {
    let auth = format!("Bearer {STATUS_READER_TOKEN}");
    let (code, body) = http_request("GET", url, &[("authorization", &auth)], Vec::new()).await?;
    if code != 200 {
        return Err(io::Error::other(format!("GET {url}: {code} {body}")));
    }
    Ok(body)
}

/// One Prometheus sample.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Sample {
    /// Metric name.
    pub name: String,
    /// Labels, in exposition order.
    pub labels: Vec<(String, String)>,
    /// Value.
    pub value: f64,
}

impl Sample {
    /// The value of label `k`.
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Parses the Prometheus text exposition (comments skipped; label values
/// unescaped).
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(b) => {
                let Some(e) = line.rfind('}') else { continue };
                (&line[..b], parse_labels(&line[b + 1..e]), &line[e + 1..])
            }
            None => {
                let Some((n, r)) = line.split_once(' ') else {
                    continue;
                };
                (n, Vec::new(), r)
            }
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        let mut name = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' {
                break;
            }
            if c != ',' && !c.is_whitespace() {
                name.push(c);
            }
            chars.next();
        }
        if chars.next().is_none() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(o) => value.push(o),
                    None => break,
                },
                '"' => break,
                o => value.push(o),
            }
        }
        out.push((name, value));
    }
}

/// Polls `check` every 50 ms until it returns `Some` or `timeout` passes;
/// the error names `what`.
pub async fn poll<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> io::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("timed out after {timeout:?} waiting for {what}"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the controller `child` answers `GET <base>/readyz`; an
/// error with the end of its log if it exits first or is not ready within
/// `timeout`.
pub async fn wait_ready(
    child: &mut ChildGuard,
    base: &str,
    timeout: Duration,
) -> Result<(), String> {
    wait_answering(child, &format!("{base}/readyz"), timeout).await
}

/// Waits until `GET url` answers while `child` runs (a process's health or
/// readiness endpoint); an error with the end of its log if it exits first
/// or does not answer within `timeout`.
pub async fn wait_answering(
    child: &mut ChildGuard,
    url: &str,
    timeout: Duration,
) -> Result<(), String> {
    let name = child.name().to_string();
    let ready = poll(&format!("{name} to answer {url}"), timeout, || {
        let exited = child.exited();
        let name = name.clone();
        async move {
            if exited.is_some() {
                return Some(Err(format!("{name} exited ({exited:?})")));
            }
            http_get(url).await.ok().map(|_| Ok(()))
        }
    })
    .await;
    match ready {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("{e}; log:\n{}", child.log_tail(40))),
        Err(e) => Err(format!("{e}; log:\n{}", child.log_tail(40))),
    }
}

/// Events recorded by the API double (core/v1 and events.k8s.io/v1), or
/// by the real API server (which serves each Event under both APIs: one
/// item per `metadata.uid`), as `(reason, "Kind namespace/name", message)`.
pub fn recorded_events<A: crate::objects::Objects + ?Sized>(api: &A) -> Vec<RecordedEvent> {
    let mut out = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for rt in [&resources::EVENTS, &resources::CORE_EVENTS] {
        for e in api.list_all(rt, None) {
            if let Some(uid) = e["metadata"]["uid"].as_str()
                && !seen.insert(uid.to_string())
            {
                continue;
            }
            let obj = if e["regarding"].is_object() {
                &e["regarding"]
            } else {
                &e["involvedObject"]
            };
            let message = e["note"]
                .as_str()
                .or_else(|| e["message"].as_str())
                .unwrap_or("")
                .to_string();
            out.push(RecordedEvent {
                reason: e["reason"].as_str().unwrap_or("").to_string(),
                kind: obj["kind"].as_str().unwrap_or("").to_string(),
                namespace: obj["namespace"].as_str().unwrap_or("").to_string(),
                name: obj["name"].as_str().unwrap_or("").to_string(),
                message,
                count: e["series"]["count"]
                    .as_u64()
                    .or_else(|| e["count"].as_u64())
                    .unwrap_or(1),
            });
        }
    }
    out
}

/// An Event as recorded by the API double.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RecordedEvent {
    /// Reason, e.g. `KubeletCachePinned`.
    pub reason: String,
    /// Kind of the regarding object.
    pub kind: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// The note / message.
    pub message: String,
    /// Occurrences (series count, 1 for a single Event).
    pub count: u64,
}

/// A real mountguard binary next to the running test executable
/// (`target/<profile>/`), or a message saying how to build it.
pub fn binary(name: &str) -> io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    // Test executables live in target/<profile>/deps.
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} not found; build the binaries first: cargo build --workspace --bins",
                path.display()
            ),
        ))
    }
}

/// `kubectl-mountguard` in `dir/bin`: a symlink to the controller binary,
/// as docs/install.md installs the kubectl plugin.
pub fn kubectl_plugin(dir: &Path) -> io::Result<PathBuf> {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin)?;
    let link = bin.join("kubectl-mountguard");
    if !link.exists() {
        std::os::unix::fs::symlink(binary("mountguard-controller")?, &link)?;
    }
    Ok(link)
}

/// A command of `program` without the test environment's `MOUNTGUARD_*`
/// and `KUBECONFIG`, its stdin empty, its output piped, killed when
/// dropped.
pub fn clean_command(program: &Path) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(program);
    for (k, _) in std::env::vars() {
        if k.starts_with("MOUNTGUARD_") || k == "KUBECONFIG" {
            cmd.env_remove(k);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A child process killed (and reaped) on drop.
#[derive(Debug)]
pub struct ChildGuard {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ChildGuard {
    /// Spawns `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> io::Result<Self> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| io::Error::other(format!("spawning {name}: {e}")))?;
        Ok(Self {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// The process id.
    pub fn id(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the process exited (and how).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whether the process is stopped (by SIGSTOP): state `T` in
    /// `/proc/<pid>/stat` (proc(5)).
    pub fn is_stopped(&self) -> bool {
        let Some(pid) = self.id() else {
            return false;
        };
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|s| {
                // The command name in parentheses may hold spaces: the
                // state follows the last `)`.
                let rest = &s[s.rfind(')')? + 1..];
                rest.split_whitespace().next().map(|st| st == "T")
            })
            .unwrap_or(false)
    }

    /// Sends SIGCONT (a stopped process goes on).
    pub fn resume(&self) -> io::Result<()> {
        let pid = self
            .id()
            .ok_or_else(|| io::Error::other(format!("{} was reaped", self.name)))?;
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).map_err(io::Error::other)?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).map_err(io::Error::other)
    }

    /// The end of its log (for failure messages).
    pub fn log_tail(&self, lines: usize) -> String {
        tail(
            &std::fs::read_to_string(&self.log).unwrap_or_default(),
            lines,
        )
    }

    /// Kills the process and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The ends (`lines` each) of the logs of controller replicas a test
/// started (`Rig::launch_replica`): `controller-*.log` in `dir`.
pub fn replica_logs(dir: &Path, lines: usize) -> String {
    let mut replicas: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("controller-") && n.ends_with(".log"))
        })
        .collect();
    replicas.sort();
    let mut out = String::new();
    for r in replicas {
        let text = std::fs::read_to_string(&r).unwrap_or_default();
        out.push_str(&format!(
            "--- {} ---\n{}\n",
            r.display(),
            tail(&text, lines)
        ));
    }
    out
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// A free loopback address (bound, then released; the caller binds it
/// right away).
pub fn free_addr() -> io::Result<std::net::SocketAddr> {
    Ok(std::net::SocketAddr::from((
        [127, 0, 0, 1],
        stable_ports(1)?[0],
    )))
}

/// `n` distinct loopback ports, each free when chosen, taken at random
/// from the 12,000 ports below the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`). A port of that range, once released,
/// may be taken by any outgoing connection on the machine at once; a
/// process restarted on its old port (a controller, a daemon) then fails
/// with "Address already in use". Below the range only a listener that
/// asks for the port by number takes it.
pub fn stable_ports(n: usize) -> io::Result<Vec<u16>> {
    use std::hash::{BuildHasher as _, Hasher as _};
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let floor = low.saturating_sub(12_000).max(1024);
    let span = u64::from(low - floor);
    let seed = std::collections::hash_map::RandomState::new();
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for i in 0..(8 * n as u64 + 256) {
        if ports.len() == n {
            break;
        }
        let mut h = seed.build_hasher();
        h.write_u64(i);
        let p = floor + (h.finish() % span) as u16;
        if ports.contains(&p) {
            continue;
        }
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", p)) {
            held.push(l);
            ports.push(p);
        }
    }
    if ports.len() < n {
        return Err(io::Error::other(format!(
            "no {n} free loopback ports in {floor}..{low}"
        )));
    }
    Ok(ports)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_text_parses_with_escaped_labels() {
        let text = "# HELP x y\n# TYPE x gauge\nmountguard_mounts{state=\"Stale\"} 2\nmountguard_mount_state{namespace=\"slurm\",pod=\"w-0\",cause=\"\",message=\"a \\\"b\\\"\"} 1\nup 1\n";
        let s = parse_metrics(text);
        assert_eq!(s.len(), 3);
        assert_eq!(s[0].name, "mountguard_mounts");
        assert_eq!(s[0].label("state"), Some("Stale"));
        assert_eq!(s[0].value, 2.0);
        assert_eq!(s[1].label("pod"), Some("w-0"));
        assert_eq!(s[1].label("cause"), Some(""));
        assert_eq!(s[1].label("message"), Some("a \"b\""));
        assert_eq!(s[2].name, "up");
        assert!(s[2].labels.is_empty());
    }

    #[tokio::test]
    async fn agent_identities_authenticate_as_the_agent_on_their_node_double() {
        let mut cluster = Cluster::builder().nodes(2).start().await.unwrap();
        let ids = deploy_agent_identities(&cluster).await.unwrap();
        assert_eq!(ids.len(), 2);
        for id in &ids {
            let pod = cluster
                .api()
                .get(&resources::PODS, NAMESPACE, &id.pod)
                .unwrap();
            assert_eq!(pod["spec"]["nodeName"], id.node.as_str());
            assert_eq!(pod["metadata"]["ownerReferences"][0]["kind"], "DaemonSet");
            assert_eq!(
                pod["metadata"]["ownerReferences"][0]["name"],
                AGENT_DAEMONSET
            );
            let user = token_review(&cluster.api_url(), &id.token().unwrap())
                .await
                .unwrap();
            assert_eq!(user, "system:serviceaccount:mountguard:mountguard-agent");
        }
        assert_ne!(ids[0].token().unwrap(), ids[1].token().unwrap());
        assert!(
            token_review(&cluster.api_url(), "not-a-token")
                .await
                .is_err()
        );
        cluster.shutdown().await;
    }
}
