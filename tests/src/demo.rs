//! The demo (`mountguard-demo`): the cluster in a box with 3 nodes, the
//! real agent (one [`Daemon`] with an [`HttpSink`] per node) and the real
//! controller ([`Controller::start`]) in this process, and the seed
//! scenario: the immutable Secret `slurm-auth-slurm` is deleted and
//! recreated with a new `slurm.key` while a second pod on node A also
//! references it.
//!
//! [`run_seed`] returns a [`Summary`] (printed by `--json`) and narrates
//! through a [`Narrator`]. The end-to-end tests run it too.

use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

use mountguard_agent::{Backoff, Daemon, DaemonConfig, HttpSink, HttpSinkConfig, ScanOptions};
use mountguard_controller::remediation::settings::ObjectName;
use mountguard_controller::run::Controller;
use mountguard_controller::settings::RemediationMode;
use mountguard_controller::settings::RunArgs;
use mountguard_core::remediation::REMEDIATE_ANNOTATION;
use serde::Serialize;
use serde_json::Value;

use crate::apiserver::resources;
use crate::cluster::{AUTH_SECRET, Cluster, JWT_SECRET, NODESET, SLURM_NAMESPACE};
use crate::mountguard::{
    AGENT_DAEMONSET, AgentIdentity, RecordedEvent, agent_service_account_flag,
    deploy_agent_identities, http_get, parse_metrics, poll, recorded_events,
};
use crate::scenario::{
    KEY_VOLUME, PINNING_POD, add_pinning_pod, api_auth_key, find_verdict, replace_slurmd_pod,
    rotate_auth_key, served_key, state_tag, verdicts, wait_for_slurmd_pods,
};

/// What the demo does after detecting the stale key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Remediation {
    /// Detect and report only; the demo then replaces two slurmd pods by
    /// hand to show which node a replacement fixes.
    #[default]
    Off,
    /// The controller runs with `--remediation on` and the NodeSet opts in:
    /// it drains, evicts, verifies on the node and undrains the workers a
    /// replacement can fix, and reports the pinned node instead of looping.
    On,
}

/// Demo settings.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Nodes in the cluster (node A is `node-0`).
    pub nodes: usize,
    /// The controller's `--grace`.
    pub grace: Duration,
    /// The agents' rescan and heartbeat interval.
    pub heartbeat: Duration,
    /// See [`Remediation`].
    pub remediation: Remediation,
}

impl Default for DemoOptions {
    fn default() -> Self {
        Self {
            nodes: 3,
            grace: Duration::from_secs(2),
            heartbeat: Duration::from_secs(1),
            remediation: Remediation::Off,
        }
    }
}

/// The acts of the demo, in order; [`Narrator::act`] prints a heading for each.
pub const ACTS: [&str; 5] = ["setup", "rotation", "detection", "remediation", "outcome"];

/// Width of the printed narration.
pub const COLUMNS: usize = 120;

/// Timestamped narration (on stdout, or collected when quiet), in acts,
/// wrapped to [`COLUMNS`].
#[derive(Debug)]
pub struct Narrator {
    start: Instant,
    quiet: bool,
    lines: Vec<String>,
    printed: Vec<String>,
}

impl Narrator {
    /// Prints each line when `quiet` is false.
    pub fn new(quiet: bool) -> Self {
        Self {
            start: Instant::now(),
            quiet,
            lines: Vec::new(),
            printed: Vec::new(),
        }
    }

    /// A heading for one of [`ACTS`]: `=== 2/5 rotation ===`.
    pub fn act(&mut self, name: &str) {
        let n = ACTS.iter().position(|a| *a == name).map_or(0, |i| i + 1);
        let heading = format!("=== {n}/{} {name} ===", ACTS.len());
        let mut out = Vec::new();
        if !self.printed.is_empty() {
            out.push(String::new());
        }
        out.push(heading.clone());
        self.print(out);
        self.lines.push(heading);
    }

    /// One entry: wall-clock time (UTC), time since start, text; printed
    /// wrapped at word boundaries, continuation lines indented.
    pub fn say(&mut self, text: impl AsRef<str>) {
        let now = jiff::Timestamp::now();
        let prefix = format!(
            "{} +{:>6.2}s  ",
            now.strftime("%H:%M:%S%.3f"),
            self.start.elapsed().as_secs_f64(),
        );
        let indent = " ".repeat(prefix.len());
        let out = wrap(text.as_ref(), COLUMNS - prefix.len())
            .into_iter()
            .enumerate()
            .map(|(i, l)| format!("{}{l}", if i == 0 { &prefix } else { &indent }))
            .collect();
        self.print(out);
        self.lines.push(format!("{prefix}{}", text.as_ref()));
    }

    fn print(&mut self, out: Vec<String>) {
        if !self.quiet {
            for l in &out {
                println!("{l}");
            }
        }
        self.printed.extend(out);
    }

    /// Every entry so far, unwrapped (one per `say` or `act`).
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// The lines as printed (wrapped, with the headings' blank lines).
    pub fn printed(&self) -> &[String] {
        &self.printed
    }
}

/// `text` in lines of at most `width` characters, broken between words; a
/// word longer than `width` is cut.
pub fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let mut word: Vec<char> = word.chars().collect();
        loop {
            let len = line.chars().count();
            let sep = usize::from(len > 0);
            if len + sep + word.len() <= width {
                if sep == 1 {
                    line.push(' ');
                }
                line.extend(word.iter());
                break;
            }
            if len > 0 {
                out.push(std::mem::take(&mut line));
                continue;
            }
            let rest = word.split_off(width);
            out.push(word.into_iter().collect());
            word = rest;
        }
    }
    if !line.is_empty() || out.is_empty() {
        out.push(line);
    }
    out
}

/// An Event as the summary shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EventSummary {
    /// Reason.
    pub reason: String,
    /// `Pod namespace/name`.
    pub object: String,
    /// Message.
    pub message: String,
}

/// A metric sample as the summary shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetricSample {
    /// Name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Value.
    pub value: f64,
}

/// Which `slurm.key` a slurmd pod is served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServedKey {
    /// Node.
    pub node: String,
    /// Pod.
    pub pod: String,
    /// Whether the pod replaced the one that ran at rotation time.
    pub replacement: bool,
    /// `old` or `new` (compared byte for byte with the API's Secret).
    pub key: &'static str,
}

/// Seconds from the rotation to each signal.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// The controller's grace period.
    pub grace_seconds: f64,
    /// Every stale verdict visible in `/v1/verdicts`.
    pub verdicts_after_rotation_seconds: f64,
    /// Every `mountguard_mount_state` sample present.
    pub metric_after_rotation_seconds: f64,
    /// Every Event recorded.
    pub events_after_rotation_seconds: f64,
}

/// The machine-readable result of the demo (`--json`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// `seed`.
    pub scenario: &'static str,
    /// Node names.
    pub nodes: Vec<String>,
    /// Node A.
    pub pinned_node: String,
    /// The second pod on node A referencing the Secret.
    pub pinning_pod: String,
    /// `namespace/name` of the rotated Secret.
    pub secret: String,
    /// Remediation mode.
    pub remediation: Remediation,
    /// Which key each slurmd pod is served right after the rotation.
    pub served_after_rotation: Vec<ServedKey>,
    /// The controller's `/v1/verdicts?namespace=slurm` items once every
    /// stale verdict, metric and Event was seen.
    pub verdicts: Vec<Value>,
    /// Events recorded by the API double.
    pub events: Vec<EventSummary>,
    /// Every `mountguard_*` sample of the controller's `/metrics`.
    pub metrics: Vec<MetricSample>,
    /// Slurm's view (slurmrestd double) of each slurmd host once the
    /// stale verdicts were seen: slurmctld uses the new key, and a slurmd
    /// still on the old key is not DOWN: its node reads `IDLE` (with
    /// `NOT_RESPONDING` now and then), as Slurm 26.05 shows it.
    pub slurm_states: BTreeMap<String, Vec<String>>,
    /// Per slurmd host: whether Slurm shows a registration of its slurmd
    /// since the rotation (`slurmd_start_time` at or after it). A slurmd on
    /// the old key never registers.
    pub slurm_registered_since_rotation: BTreeMap<String, bool>,
    /// Replacement pods on node A and one other node.
    pub replacements: Vec<ServedKey>,
    /// Verdicts of the replacement pods' key volume (`State/Cause`).
    pub replacement_verdicts: BTreeMap<String, String>,
    /// Remediation attempts (with `remediation: on`), as the controller
    /// recorded them on the NodeSet.
    pub attempts: Vec<AttemptSummary>,
    /// Time from rotation to each signal.
    pub timings: Timings,
}

/// One remediation attempt as the summary shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AttemptSummary {
    /// `namespace/pod`.
    pub pod: String,
    /// Kubernetes node.
    pub node: String,
    /// Slurm node.
    pub slurm_node: String,
    /// Every phase gone through, in order (`Pending` ... `Succeeded`).
    pub phases: Vec<String>,
    /// The final phase.
    pub result: String,
}

/// The cluster in a box with agents and controller running in-process.
#[derive(Debug)]
pub struct InProcess {
    /// The doubles.
    pub cluster: Cluster,
    /// Agent identities, by node index.
    pub identities: Vec<AgentIdentity>,
    /// The controller.
    pub controller: Option<Controller>,
    /// One agent per node.
    pub agents: Vec<Daemon>,
}

/// Starts the agent of identity `id` in this process (plaintext reports
/// to `report_addr`), rescanning and sending heartbeats every `heartbeat`.
pub async fn start_agent(
    report_addr: std::net::SocketAddr,
    id: &AgentIdentity,
    heartbeat: Duration,
) -> io::Result<Daemon> {
    let url: http::Uri = format!("http://{report_addr}")
        .parse()
        .map_err(io::Error::other)?;
    let mut cfg = DaemonConfig::new(ScanOptions::new(&id.kubelet_root, &id.node));
    cfg.rescan_interval = heartbeat;
    cfg.heartbeat_interval = heartbeat;
    cfg.debounce = Duration::from_millis(50);
    let mut sink = HttpSinkConfig::new(url, &id.node);
    sink.token_file = id.token_file.clone();
    sink.backoff = Backoff {
        initial: Duration::from_millis(100),
        max: Duration::from_secs(1),
        auth_min: Duration::from_millis(500),
        window: heartbeat,
    };
    let sink = HttpSink::new(sink).map_err(io::Error::other)?;
    Daemon::start(cfg, sink).await.map_err(io::Error::other)
}

impl InProcess {
    /// Starts a Slinky-like cluster with `opts.nodes` nodes, the agent
    /// identities, the controller and one agent per node; returns once the
    /// controller's watches are synced.
    pub async fn start(opts: &DemoOptions) -> io::Result<Self> {
        let cluster = Cluster::builder()
            .nodes(opts.nodes)
            .slinky()
            .start()
            .await?;
        let identities = deploy_agent_identities(&cluster).await?;
        let mut args = RunArgs::for_test(
            cluster.kubeconfig_path().to_path_buf(),
            &agent_service_account_flag(),
            AGENT_DAEMONSET,
        );
        args.grace = opts.grace;
        if opts.remediation == Remediation::On {
            args.remediation = RemediationMode::On;
            args.slurmrestd_url = Some(cluster.slurmrestd_url());
            args.slurm_jwt_key_secret = Some(ObjectName {
                namespace: SLURM_NAMESPACE.to_string(),
                name: JWT_SECRET.to_string(),
            });
            // Long enough that the demo shows the detection (every stale
            // verdict, metric and Event) before the first drain.
            args.remediation_delay = Duration::from_secs(8);
            args.replacement_timeout = Duration::from_secs(120);
        }
        let controller = Controller::start(args)
            .await
            .map_err(|e| io::Error::other(format!("starting the controller: {e}")))?;
        poll(
            "the controller's watches to sync",
            Duration::from_secs(20),
            || async { controller.is_ready().then_some(()) },
        )
        .await?;
        let mut agents = Vec::new();
        for id in &identities {
            agents.push(start_agent(controller.report_addr(), id, opts.heartbeat).await?);
        }
        Ok(Self {
            cluster,
            identities,
            controller: Some(controller),
            agents,
        })
    }

    /// `http://<metrics address>` of the controller.
    pub fn metrics_base(&self) -> String {
        self.controller
            .as_ref()
            .map(|c| format!("http://{}", c.metrics_addr()))
            .unwrap_or_default()
    }

    /// Stops agents, controller and cluster.
    pub async fn shutdown(mut self) {
        for a in self.agents.drain(..) {
            a.shutdown().await;
        }
        if let Some(c) = self.controller.take() {
            c.shutdown().await;
        }
        self.cluster.shutdown().await;
    }
}

fn io_err(msg: impl Into<String>) -> io::Error {
    io::Error::other(msg.into())
}

/// The `mountguard_*` samples of the controller's `/metrics`.
pub async fn scrape(metrics_base: &str) -> io::Result<Vec<MetricSample>> {
    let text = http_get(&format!("{metrics_base}/metrics")).await?;
    Ok(metric_samples(&text))
}

/// The `mountguard_*` samples of a `/metrics` exposition `text`.
pub fn metric_samples(text: &str) -> Vec<MetricSample> {
    parse_metrics(text)
        .into_iter()
        .filter(|s| s.name.starts_with("mountguard_"))
        .map(|s| MetricSample {
            name: s.name,
            labels: s.labels.into_iter().collect(),
            value: s.value,
        })
        .collect()
}

fn event_summary(e: &RecordedEvent) -> EventSummary {
    EventSummary {
        reason: e.reason.clone(),
        object: format!("{} {}/{}", e.kind, e.namespace, e.name),
        message: e.message.clone(),
    }
}

/// The expected stale tag of node `i`'s slurmd key volume.
fn expected_tag(i: usize) -> &'static str {
    if i == 0 {
        "Stale/ImmutableCachePinned"
    } else {
        "Stale/ImmutableCache"
    }
}

/// Runs the seed scenario on a running system (see the module docs).
pub async fn seed_scenario(
    sys: &InProcess,
    opts: &DemoOptions,
    say: &mut Narrator,
) -> io::Result<Summary> {
    let api = sys.cluster.api();
    let base = sys.metrics_base();
    let nodes = sys.cluster.node_names();
    let node_a = nodes[0].clone();
    let subject = format!("volume {KEY_VOLUME}");

    let pods = wait_for_slurmd_pods(&sys.cluster).await?;
    say.say(format!(
        "cluster in a box up: {} nodes, NodeSet slurm-worker-slinky runs {}",
        nodes.len(),
        pods.iter()
            .map(|p| p.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    add_pinning_pod(&api, &node_a).await?;
    say.say(format!(
        "pod {SLURM_NAMESPACE}/{PINNING_POD} on {node_a} also mounts Secret {AUTH_SECRET}"
    ));
    let fresh_query = "namespace=slurm&all=1";
    poll(
        "every slurmd key volume and the pinning pod to be Fresh",
        Duration::from_secs(30),
        || async {
            let doc = verdicts(&base, fresh_query).await.ok()?;
            let all_fresh = pods.iter().all(|(p, _)| {
                find_verdict(&doc, p, &subject).is_some_and(|v| v["state"] == "Fresh")
            }) && find_verdict(&doc, PINNING_POD, "volume auth")
                .is_some_and(|v| v["state"] == "Fresh");
            all_fresh.then_some(())
        },
    )
    .await?;
    say.say(format!(
        "controller: every slurmd pod's {KEY_VOLUME} (slurm.key) is Fresh; agents report every {:?}",
        opts.heartbeat
    ));

    if opts.remediation == Remediation::On {
        api.merge_patch(
            &resources::NODESETS,
            SLURM_NAMESPACE,
            NODESET,
            &serde_json::json!({"metadata": {"annotations": {REMEDIATE_ANNOTATION: "true"}}}),
            None,
        )
        .map_err(|e| io_err(format!("opting the NodeSet in to remediation: {e:?}")))?;
        say.say(format!(
            "NodeSet {SLURM_NAMESPACE}/{NODESET} opts in to remediation ({REMEDIATE_ANNOTATION}: \"true\"); controller runs with --remediation on"
        ));
    }

    say.act("rotation");
    let old_key = api_auth_key(&api)?;
    let new_key = rotate_auth_key(&api)?;
    let rotated = Instant::now();
    let rotated_unix = crate::util::unix_now();
    say.say(format!(
        "ROTATION: immutable Secret {SLURM_NAMESPACE}/{AUTH_SECRET} deleted and recreated with a new slurm.key"
    ));

    // What the kubelets serve: every running pod keeps its cache entry.
    let mut served_after_rotation = Vec::new();
    for (i, (pod, uid)) in pods.iter().enumerate() {
        let bytes = served_key(&sys.cluster, i, uid)?;
        let key = if bytes == old_key {
            "old"
        } else if bytes == new_key {
            "new"
        } else {
            "other"
        };
        served_after_rotation.push(ServedKey {
            node: nodes[i].clone(),
            pod: pod.clone(),
            replacement: false,
            key,
        });
    }
    say.say(format!(
        "kubelets serve the OLD slurm.key to: {}",
        served_after_rotation
            .iter()
            .filter(|s| s.key == "old")
            .map(|s| format!("{} ({})", s.pod, s.node))
            .collect::<Vec<_>>()
            .join(", ")
    ));

    say.act("detection");
    let doc = poll(
        "the stale verdicts",
        opts.grace + Duration::from_secs(20),
        || async {
            let doc = verdicts(&base, "namespace=slurm").await.ok()?;
            let all = pods.iter().enumerate().all(|(i, (p, _))| {
                find_verdict(&doc, p, &subject).is_some_and(|v| state_tag(v) == expected_tag(i))
            });
            all.then_some(doc)
        },
    )
    .await?;
    let verdicts_after = rotated.elapsed();
    for (i, (p, _)) in pods.iter().enumerate() {
        let v = find_verdict(&doc, p, &subject).cloned().unwrap_or_default();
        let pinned: Vec<&str> = v["pinnedBy"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let why = if pinned.is_empty() {
            "only its own reference keeps the old cache entry: replacing the pod fixes it"
                .to_string()
        } else {
            format!(
                "pinned by {}: replacing the pod alone cannot help",
                pinned.join(", ")
            )
        };
        say.say(format!(
            "verdict {} on {}: {} ({why})",
            p,
            nodes[i],
            expected_tag(i)
        ));
    }

    let metric_ready = |samples: &[MetricSample]| {
        pods.iter().enumerate().all(|(i, (p, _))| {
            samples.iter().any(|s| {
                s.name == "mountguard_mount_state"
                    && s.value == 1.0
                    && s.labels.get("pod").map(String::as_str) == Some(p)
                    && s.labels.get("volume").map(String::as_str) == Some(KEY_VOLUME)
                    && format!(
                        "{}/{}",
                        s.labels.get("state").map(String::as_str).unwrap_or(""),
                        s.labels.get("cause").map(String::as_str).unwrap_or("")
                    ) == expected_tag(i)
            })
        })
    };
    poll(
        "the mount-state metric",
        Duration::from_secs(10),
        || async {
            scrape(&base)
                .await
                .ok()
                .filter(|s| metric_ready(s))
                .map(|_| ())
        },
    )
    .await?;
    let metric_after = rotated.elapsed();
    say.say(
        "metric mountguard_mount_state{state=\"Stale\",cause=\"ImmutableCachePinned\"|\"ImmutableCache\"} = 1 for each slurmd pod",
    );

    let events_ready = |events: &[RecordedEvent]| {
        pods.iter().enumerate().all(|(i, (p, _))| {
            let reason = if i == 0 {
                "KubeletCachePinned"
            } else {
                "StaleMount"
            };
            events
                .iter()
                .any(|e| e.name == *p && e.kind == "Pod" && e.reason == reason)
        })
    };
    let events = poll("the Events", Duration::from_secs(10), || async {
        let ev = recorded_events(&api);
        events_ready(&ev).then_some(ev)
    })
    .await?;
    let events_after = rotated.elapsed();
    for e in events.iter().filter(|e| e.kind == "Pod") {
        say.say(format!(
            "Event {} on Pod {}/{}: {}",
            e.reason, e.namespace, e.name, e.message
        ));
    }
    let slurm = sys.cluster.slurm();
    let slurm_states: BTreeMap<String, Vec<String>> = pods
        .iter()
        .map(|(p, _)| {
            (
                p.clone(),
                slurm.node(p).map(|n| n.state).unwrap_or_default(),
            )
        })
        .collect();
    let slurm_registered_since_rotation: BTreeMap<String, bool> = pods
        .iter()
        .map(|(p, _)| {
            let at = slurm.node(p).and_then(|n| n.slurmd_start_time);
            (p.clone(), at.is_some_and(|t| t >= rotated_unix))
        })
        .collect();
    for (host, state) in &slurm_states {
        let registered = slurm_registered_since_rotation.get(host) == Some(&true);
        say.say(format!(
            "Slurm (slurmrestd) sees {host} as {}; {}",
            state.join(","),
            if registered {
                "its slurmd registered since the rotation"
            } else {
                "its slurmd has not registered since the rotation (a job sent there would queue forever)"
            }
        ));
    }
    let final_doc = verdicts(&base, "namespace=slurm").await?;
    let metrics = scrape(&base).await?;

    // Replacing a pod: fresh key where nothing else pins the entry.
    say.act("remediation");
    let mut replacements = Vec::new();
    let mut replacement_verdicts = BTreeMap::new();
    let mut attempts = Vec::new();
    let order: &[usize] = match opts.remediation {
        Remediation::Off if nodes.len() > 1 => &[1, 0],
        Remediation::Off => &[0],
        Remediation::On => &[],
    };
    let current_key = api_auth_key(&api)?;
    for &i in order {
        let (pod, uid) = replace_slurmd_pod(&sys.cluster, i).await?;
        let bytes = served_key(&sys.cluster, i, &uid)?;
        let key = if bytes == current_key { "new" } else { "old" };
        say.say(format!(
            "replaced the slurmd pod on {}: the new {} is served the {} slurm.key{}",
            nodes[i],
            pod,
            key.to_uppercase(),
            if i == 0 {
                format!(" ({PINNING_POD} still pins the cache entry)")
            } else {
                String::new()
            }
        ));
        let want = if i == 0 {
            "Stale/ImmutableCachePinned"
        } else {
            "Fresh"
        };
        let tag = poll(
            "the replacement pod's verdict",
            opts.grace + Duration::from_secs(20),
            || async {
                let doc = verdicts(&base, "namespace=slurm&all=1").await.ok()?;
                let v = find_verdict(&doc, &pod, &subject)?;
                let t = state_tag(v);
                (t == want).then_some(t)
            },
        )
        .await?;
        say.say(format!("verdict {pod} on {}: {tag}", nodes[i]));
        replacement_verdicts.insert(format!("{}/{pod}", nodes[i]), tag);
        replacements.push(ServedKey {
            node: nodes[i].clone(),
            pod,
            replacement: true,
            key,
        });
    }

    match opts.remediation {
        Remediation::Off => {
            say.act("outcome");
            say.say(
                "remediation is off: mountguard reported the stale key (metric, Event, /v1/verdicts) and changed nothing",
            )
        }
        Remediation::On => {
            attempts = remediate(sys, opts, say, &pods, &nodes, &subject, &current_key).await?;
            for a in &attempts {
                let i = nodes.iter().position(|n| *n == a.node).unwrap_or(0);
                if let Some((pod, uid)) = crate::scenario::slurmd_pod(&api, i) {
                    let bytes = served_key(&sys.cluster, i, &uid)?;
                    let key = if bytes == current_key { "new" } else { "old" };
                    replacements.push(ServedKey {
                        node: a.node.clone(),
                        pod,
                        replacement: true,
                        key,
                    });
                }
            }
        }
    }

    Ok(Summary {
        scenario: "seed",
        nodes,
        pinned_node: node_a,
        pinning_pod: format!("{SLURM_NAMESPACE}/{PINNING_POD}"),
        secret: format!("{SLURM_NAMESPACE}/{AUTH_SECRET}"),
        remediation: opts.remediation,
        served_after_rotation,
        slurm_states,
        slurm_registered_since_rotation,
        verdicts: final_doc["verdicts"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        events: events.iter().map(event_summary).collect(),
        metrics,
        replacements,
        replacement_verdicts,
        attempts,
        timings: Timings {
            grace_seconds: opts.grace.as_secs_f64(),
            verdicts_after_rotation_seconds: verdicts_after.as_secs_f64(),
            metric_after_rotation_seconds: metric_after.as_secs_f64(),
            events_after_rotation_seconds: events_after.as_secs_f64(),
        },
    })
}

/// Starts everything, runs the seed scenario, stops everything.
pub async fn run_seed(opts: &DemoOptions, say: &mut Narrator) -> io::Result<Summary> {
    say.act("setup");
    let sys = InProcess::start(opts).await?;
    say.say("agents (one per node) and controller started in this process");
    let result = seed_scenario(&sys, opts, say).await;
    sys.shutdown().await;
    result.map_err(|e| io_err(format!("seed scenario: {e}")))
}

/// The remediation part of the demo: waits until the controller repaired
/// every worker a replacement can fix (drain, evict, replacement fresh on
/// the node and responding in Slurm, undrain) and reported the pinned node
/// instead of replacing its pod.
async fn remediate(
    sys: &InProcess,
    opts: &DemoOptions,
    say: &mut Narrator,
    pods: &[(String, String)],
    nodes: &[String],
    subject: &str,
    current_key: &[u8],
) -> io::Result<Vec<AttemptSummary>> {
    let api = sys.cluster.api();
    let base = sys.metrics_base();
    let slurm = sys.cluster.slurm();
    let fixable: Vec<usize> = (1..pods.len()).collect();
    say.say(format!(
        "remediation: {} worker(s) can be fixed by a replacement; one at a time (budget 1 per NodeSet)",
        fixable.len()
    ));
    let read_attempts = || crate::rig::nodeset_attempts(&api);
    let mut seen_phase: BTreeMap<String, String> = BTreeMap::new();
    // The Slurm reason of each attempt's drain, shown once (it repeats in
    // every phase until the node is resumed).
    let mut seen_reason: BTreeMap<String, String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(150);
    let done = loop {
        let all = read_attempts();
        for a in &all {
            let phase = a
                .phase_names()
                .last()
                .map(|p| p.to_string())
                .unwrap_or_default();
            if seen_phase.get(&a.pod) != Some(&phase) {
                let slurm_state = slurm
                    .node(&a.slurm_node)
                    .map(|n| {
                        if n.reason.is_empty() || seen_reason.get(&a.id) == Some(&n.reason) {
                            n.state.join(",")
                        } else {
                            seen_reason.insert(a.id.clone(), n.reason.clone());
                            format!("{} reason \"{}\"", n.state.join(","), n.reason)
                        }
                    })
                    .unwrap_or_default();
                say.say(format!(
                    "attempt for {} on {}: {phase} (Slurm node {}: {slurm_state})",
                    a.pod, a.node, a.slurm_node
                ));
                seen_phase.insert(a.pod.clone(), phase);
            }
        }
        let succeeded: Vec<_> = all
            .iter()
            .filter(|a| a.phase_names().last() == Some(&"Succeeded"))
            .collect();
        let fixed = fixable
            .iter()
            .all(|&i| succeeded.iter().any(|a| a.node == nodes[i]));
        if fixed {
            break all;
        }
        if Instant::now() > deadline {
            return Err(io_err(format!(
                "remediation did not repair {:?} within 150 s; attempts: {:?}",
                fixable.iter().map(|&i| &nodes[i]).collect::<Vec<_>>(),
                all.iter()
                    .map(|a| (a.pod.clone(), a.phase_names()))
                    .collect::<Vec<_>>()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // Verified on the node, by the bytes: the replacements are Fresh, the
    // pinned node is still reported, and nothing was attempted there.
    say.act("outcome");
    for &i in &fixable {
        let (pod, uid) = crate::scenario::slurmd_pod(&api, i)
            .ok_or_else(|| io_err(format!("no slurmd pod on {}", nodes[i])))?;
        let bytes = served_key(&sys.cluster, i, &uid)?;
        let state = slurm
            .node(&pod)
            .map(|n| n.state.join(","))
            .unwrap_or_default();
        say.say(format!(
            "{} on {}: replacement is served the {} slurm.key; Slurm node {pod} is {state}",
            pod,
            nodes[i],
            if bytes == current_key { "NEW" } else { "OLD" },
        ));
    }
    let pinned_pod = &pods[0].0;
    let blocked = poll(
        "the pinned node's KubeletCachePinned report",
        opts.grace + Duration::from_secs(20),
        || async {
            let samples = scrape(&base).await.ok()?;
            let blocked = samples.iter().any(|s| {
                s.name == "mountguard_remediation_blocked"
                    && s.labels.get("reason").map(String::as_str) == Some("pinned")
                    && s.value >= 1.0
            });
            let event = recorded_events(&api)
                .into_iter()
                .find(|e| e.kind == "NodeSet" && e.reason == "KubeletCachePinned");
            let doc = verdicts(&base, "namespace=slurm").await.ok()?;
            let still = find_verdict(&doc, pinned_pod, subject)
                .is_some_and(|v| state_tag(v) == "Stale/ImmutableCachePinned");
            (blocked && still).then_some(event)
        },
    )
    .await?;
    if let Some(e) = blocked {
        say.say(format!(
            "Event KubeletCachePinned on NodeSet {}/{}: {}",
            e.namespace, e.name, e.message
        ));
    }
    let on_pinned = done.iter().filter(|a| a.node == nodes[0]).count();
    say.say(format!(
        "{pinned_pod} on {}: still Stale/ImmutableCachePinned, {on_pinned} replacement attempt(s) there (no loop); metric mountguard_remediation_blocked{{reason=\"pinned\"}} = 1; fix: recreate the Secret under a new name, replace the pinning pod, or restart that node's kubelet",
        nodes[0]
    ));
    Ok(done
        .iter()
        .map(|a| AttemptSummary {
            pod: format!("{}/{}", a.namespace, a.pod),
            node: a.node.clone(),
            slurm_node: a.slurm_node.clone(),
            phases: a.phase_names().into_iter().map(str::to_string).collect(),
            result: a
                .phase_names()
                .last()
                .map(|p| p.to_string())
                .unwrap_or_default(),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrap_breaks_between_words_and_cuts_only_longer_words() {
        assert_eq!(wrap("a bb ccc dddd", 6), ["a bb", "ccc", "dddd"]);
        assert_eq!(wrap("abcdefghij xy", 4), ["abcd", "efgh", "ij", "xy"]);
        assert_eq!(wrap("", 10), [""]);
        let long = "word ".repeat(60);
        assert!(wrap(&long, 97).iter().all(|l| l.chars().count() <= 97));
        assert_eq!(wrap(&long, 97).join(" "), long.trim_end());
    }

    #[test]
    fn narration_is_in_acts_and_fits_the_columns() {
        let mut n = Narrator::new(true);
        n.act("setup");
        n.say("short");
        n.act("rotation");
        n.say("x ".repeat(200));
        assert!(n.printed().iter().all(|l| l.chars().count() <= COLUMNS));
        assert_eq!(n.printed()[0], "=== 1/5 setup ===");
        assert!(n.printed().contains(&"=== 2/5 rotation ===".to_string()));
        // `lines` keeps one unwrapped entry per call.
        assert_eq!(n.lines().len(), 4);
        assert!(n.lines()[3].chars().count() > COLUMNS);
    }
}
