//! Soak benchmark: the cluster in a box (API server, kubelet, NodeSet and
//! slurmrestd doubles) and one real agent per node in this process, the
//! real controller binary (`mountguard-controller run`, remediation on,
//! with the allocator settings the chart gives its pod) as a child
//! process, for `--duration` (30 min by default) under a steady mix
//! of changes and faults:
//!
//! - the hooks ConfigMap (mutable) changes every `--tick` (5 s);
//! - the immutable `slurm.key` Secret is deleted and recreated every
//!   `--rotate-every` (240 s), and every worker is repaired (drained,
//!   evicted, replaced, verified on the node, undrained);
//! - pods come and go: one extra pod mounting the hooks ConfigMap is
//!   created on a node every 4 ticks and deleted 8 ticks later;
//! - an agent restarts every 12 ticks (round robin over the nodes);
//! - every watch stream is dropped every 12 ticks (the clients reconnect);
//! - slurmrestd answers "not found" for two reads after a write to a node
//!   every 18 ticks (a transient slurmrestd error).
//!
//! Every `--sample-every` (10 s) it samples the controller's RSS, open
//! descriptors, tokio tasks (`mountguard_tokio_alive_tasks`) and metric
//! series, this process's RSS (the agents and the doubles together) and the
//! Events recorded by the API server; at the end it prints
//! each one's first and last values after the warm-up (the first fifth of
//! the run) and the growth per hour (a least-squares line through the
//! samples after warm-up, as a percentage of the first of them).
//!
//! Then it checks (and exits 1 when one fails): every attempt recorded on
//! the NodeSet closed and none failed, no Slurm node left drained by
//! mountguard, every worker Fresh again, and no Event storm (at most
//! `--max-events-per-min`, 60 by default, over the whole run).
//!
//! The agents share this process with the doubles, whose request and
//! event logs grow with the load by design: this process's RSS is an upper
//! bound of the agents', not their own figure.
//!
//! Run: `cargo bench -p mountguard-tests --bench soak` (`-- --duration 10m
//! --nodes 24 --csv soak.csv`); CI runs a 100 s smoke form with
//! `--profile dev`.

use std::fmt::Write as _;
use std::io;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use mountguard_agent::Daemon;
use mountguard_tests::apiserver::DeleteOptions;
use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{Cluster, JWT_SECRET};
use mountguard_tests::cluster::{HOOKS_CONFIGMAP, NODESET, SLURM_NAMESPACE};
use mountguard_tests::demo::start_agent;
use mountguard_tests::mountguard::{
    AGENT_DAEMONSET, AgentIdentity, ChildGuard, agent_service_account_flag, binary,
    deploy_agent_identities, free_addr, http_get, poll, recorded_events, wait_ready,
};
use mountguard_tests::objects::Objects;
use mountguard_tests::rig::nodeset_attempts;
use mountguard_tests::scenario::{rotate_auth_key, verdicts, wait_for_slurmd_pods};
use serde_json::{Value, json};

/// Command-line settings.
#[derive(Debug, Clone)]
struct Opts {
    duration: Duration,
    nodes: usize,
    tick: Duration,
    rotate_every: Duration,
    sample_every: Duration,
    max_events_per_min: f64,
    csv: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, "s"), |i| s.split_at(i));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration such as 100s, 30m or 2h"))?;
    let secs = match unit {
        "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        _ => return Err(format!("{s:?}: the unit is s, m or h")),
    };
    Ok(Duration::from_secs(secs))
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        duration: Duration::from_secs(30 * 60),
        nodes: 24,
        tick: Duration::from_secs(5),
        rotate_every: Duration::from_secs(240),
        sample_every: Duration::from_secs(10),
        max_events_per_min: 60.0,
        csv: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--duration" => o.duration = parse_duration(&value()?)?,
            "--nodes" => o.nodes = value()?.parse().map_err(|e| format!("--nodes: {e}"))?,
            "--tick" => o.tick = parse_duration(&value()?)?,
            "--rotate-every" => o.rotate_every = parse_duration(&value()?)?,
            "--sample-every" => o.sample_every = parse_duration(&value()?)?,
            "--max-events-per-min" => {
                o.max_events_per_min = value()?
                    .parse()
                    .map_err(|e| format!("--max-events-per-min: {e}"))?
            }
            "--csv" => o.csv = Some(value()?),
            // cargo bench passes --bench to every bench binary.
            "--bench" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.nodes < 2 {
        return Err("--nodes: at least 2".into());
    }
    if o.tick.is_zero() || o.sample_every.is_zero() {
        return Err("--tick and --sample-every must be above zero".into());
    }
    Ok(o)
}

/// One sample of the resources watched.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: f64,
    rss_kib: f64,
    fds: f64,
    tasks: f64,
    series: f64,
    bench_rss_kib: f64,
    events: f64,
}

/// Reads one figure of a sample.
type Figure = fn(&Sample) -> f64;

const FIGURES: [(&str, Figure); 6] = [
    ("controller RSS (KiB)", |s| s.rss_kib),
    ("controller open descriptors", |s| s.fds),
    ("controller tokio alive tasks", |s| s.tasks),
    ("controller metric series", |s| s.series),
    ("agents and doubles RSS (KiB)", |s| s.bench_rss_kib),
    ("Events recorded (cumulative)", |s| s.events),
];

/// VmRSS of process `pid` (`self` for this one), from /proc (proc(5)).
fn rss_kib(pid: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(f64::NAN)
}

fn open_fds(pid: &str) -> f64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(f64::NAN, |d| d.count() as f64)
}

async fn sample(sys: &Soak, start: Instant) -> Sample {
    let text = http_get(&format!("{}/metrics", sys.metrics_base))
        .await
        .unwrap_or_default();
    let series = text
        .lines()
        .filter(|l| l.starts_with("mountguard_"))
        .count() as f64;
    let tasks = text
        .lines()
        .find_map(|l| l.strip_prefix("mountguard_tokio_alive_tasks "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN);
    let pid = sys
        .controller
        .id()
        .map_or("0".to_string(), |p| p.to_string());
    Sample {
        at: start.elapsed().as_secs_f64(),
        rss_kib: rss_kib(&pid),
        fds: open_fds(&pid),
        tasks,
        series,
        bench_rss_kib: rss_kib("self"),
        events: recorded_events(&sys.cluster.api()).len() as f64,
    }
}

/// The doubles and agents here, the controller as a child process.
struct Soak {
    cluster: Cluster,
    identities: Vec<AgentIdentity>,
    agents: Vec<Daemon>,
    controller: ChildGuard,
    report_addr: std::net::SocketAddr,
    metrics_base: String,
    heartbeat: Duration,
}

/// The `MIMALLOC_*` variables the chart sets on the controller
/// (charts/mountguard/templates/_env.tpl: `- name:` then `value:`).
fn chart_allocator_env() -> io::Result<Vec<(String, String)>> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/mountguard/templates/_env.tpl"
    );
    let text = std::fs::read_to_string(path)?;
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let vars: Vec<(String, String)> = lines
        .windows(2)
        .filter_map(|w| {
            let name = w[0].strip_prefix("- name: ")?.trim();
            let value = w[1].strip_prefix("value: ")?.trim().trim_matches('"');
            name.starts_with("MIMALLOC_")
                .then(|| (name.to_string(), value.to_string()))
        })
        .collect();
    if vars.is_empty() {
        return Err(io::Error::other(format!(
            "{path}: no MIMALLOC_* variable with a literal value; the soak runs the controller with the chart's allocator settings"
        )));
    }
    Ok(vars)
}

impl Soak {
    /// `allocator`: the variables of [`chart_allocator_env`].
    async fn start(nodes: usize, allocator: &[(String, String)]) -> io::Result<Self> {
        let cluster = Cluster::builder().nodes(nodes).slinky().start().await?;
        let identities = deploy_agent_identities(&cluster).await?;
        let report_addr = free_addr()?;
        let metrics_addr = free_addr()?;
        let key_file = cluster.dir().join("fingerprint.key");
        std::fs::write(&key_file, [7u8; 32])?;
        let mut cmd = std::process::Command::new(binary("mountguard-controller")?);
        cmd.arg("run")
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path())
            .args(["--report-listen", &report_addr.to_string()])
            .args(["--metrics-listen", &metrics_addr.to_string()])
            .args(["--agent-service-account", &agent_service_account_flag()])
            .args(["--agent-daemonset", AGENT_DAEMONSET])
            .args(["--grace", "2s"])
            .arg("--fingerprint-key-file")
            .arg(&key_file)
            .arg("--insecure-plaintext-reports")
            .args(["--remediation", "on"])
            .args(["--slurmrestd-url", &cluster.slurmrestd_url()])
            .args([
                "--slurm-jwt-key-secret",
                &format!("{SLURM_NAMESPACE}/{JWT_SECRET}"),
            ])
            .args(["--remediation-delay", "8s"])
            .args(["--replacement-timeout", "120s"])
            .args(["--log", "warn"])
            .env_remove("KUBECONFIG");
        for (k, _) in std::env::vars() {
            if k.starts_with("MOUNTGUARD_") || k.starts_with("MIMALLOC_") {
                cmd.env_remove(k);
            }
        }
        // The allocator settings the chart gives the controller's pod, so
        // the memory measured is the memory the chart's pod would hold.
        cmd.envs(allocator.iter().map(|(k, v)| (k, v)));
        let log = cluster.dir().join("controller.log");
        let mut controller = ChildGuard::spawn("controller", cmd, &log)?;
        let metrics_base = format!("http://{metrics_addr}");
        wait_ready(&mut controller, &metrics_base, Duration::from_secs(60))
            .await
            .map_err(io::Error::other)?;
        let heartbeat = Duration::from_secs(1);
        let mut agents = Vec::new();
        for id in &identities {
            agents.push(start_agent(report_addr, id, heartbeat).await?);
        }
        Ok(Self {
            cluster,
            identities,
            agents,
            controller,
            report_addr,
            metrics_base,
            heartbeat,
        })
    }

    /// Stops the agent of node `i` and starts a new one, as a DaemonSet
    /// pod restart would.
    async fn restart_agent(&mut self, i: usize) -> io::Result<()> {
        let new = start_agent(self.report_addr, &self.identities[i], self.heartbeat).await?;
        let old = std::mem::replace(&mut self.agents[i], new);
        old.shutdown().await;
        Ok(())
    }

    async fn shutdown(mut self) {
        for a in self.agents.drain(..) {
            a.shutdown().await;
        }
        self.controller.kill();
        self.cluster.shutdown().await;
    }
}

/// Least-squares slope of `y` over `x` (per second).
fn slope(xy: &[(f64, f64)]) -> f64 {
    let n = xy.len() as f64;
    if xy.len() < 2 {
        return 0.0;
    }
    let mx = xy.iter().map(|p| p.0).sum::<f64>() / n;
    let my = xy.iter().map(|p| p.1).sum::<f64>() / n;
    let num: f64 = xy.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let den: f64 = xy.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if den == 0.0 { 0.0 } else { num / den }
}

fn churn_pod(name: &str, node: &str) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"app": "soak-churn"}},
        "spec": {
            "nodeName": node,
            "containers": [{
                "name": "c",
                "image": "busybox",
                "volumeMounts": [{"name": "hooks", "mountPath": "/hooks"}],
            }],
            "volumes": [{"name": "hooks", "configMap": {"name": HOOKS_CONFIGMAP}}],
        },
    })
}

/// Counts of what the run did.
#[derive(Debug, Default)]
struct Done {
    configmap_updates: u64,
    rotations: u64,
    pods_created: u64,
    pods_deleted: u64,
    agent_restarts: u64,
    watch_drops: u64,
    slurm_faults: u64,
    errors: Vec<String>,
}

async fn run(o: &Opts) -> io::Result<bool> {
    let allocator = chart_allocator_env()?;
    let mut sys = Soak::start(o.nodes, &allocator).await?;
    let api = sys.cluster.api();
    let slurm = sys.cluster.slurm();
    let nodes = sys.cluster.node_names();
    wait_for_slurmd_pods(&sys.cluster).await?;
    api.merge_patch(
        &resources::NODESETS,
        SLURM_NAMESPACE,
        NODESET,
        &json!({"metadata": {"annotations": {
            mountguard_core::remediation::REMEDIATE_ANNOTATION: "true"}}}),
        None,
    )
    .map_err(|e| io::Error::other(format!("opting the NodeSet in: {e}")))?;
    println!(
        "soak: {} nodes, {} s, a tick every {} s, a rotation every {} s, a sample every {} s",
        o.nodes,
        o.duration.as_secs(),
        o.tick.as_secs(),
        o.rotate_every.as_secs(),
        o.sample_every.as_secs()
    );
    let alloc: Vec<String> = allocator.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "soak: controller allocator settings (the chart's): {}",
        alloc.join(" ")
    );
    let start = Instant::now();
    let mut samples = vec![sample(&sys, start).await];
    let mut done = Done::default();
    let mut tick: u64 = 0;
    let mut next_sample = start + o.sample_every;
    let mut next_rotation = start + (o.rotate_every / 2).min(o.duration / 4);
    let mut churn: Vec<(u64, String)> = Vec::new();
    while start.elapsed() < o.duration {
        tokio::time::sleep(o.tick).await;
        tick += 1;
        let patch = json!({"data": {"99-mountguard.sh": format!("#!/bin/sh\n# soak tick {tick}\nexit 0\n")}});
        match api.merge_patch(
            &resources::CONFIGMAPS,
            SLURM_NAMESPACE,
            HOOKS_CONFIGMAP,
            &patch,
            None,
        ) {
            Ok(_) => done.configmap_updates += 1,
            Err(e) => done
                .errors
                .push(format!("tick {tick}: ConfigMap update: {e}")),
        }
        if Instant::now() >= next_rotation {
            next_rotation += o.rotate_every;
            match rotate_auth_key(&api) {
                Ok(_) => done.rotations += 1,
                Err(e) => done.errors.push(format!("tick {tick}: rotation: {e}")),
            }
        }
        if tick.is_multiple_of(4) {
            let name = format!("soak-churn-{tick}");
            let node = &nodes[(tick as usize / 4) % nodes.len()];
            match api.create(&resources::PODS, SLURM_NAMESPACE, churn_pod(&name, node)) {
                Ok(_) => {
                    done.pods_created += 1;
                    churn.push((tick + 8, name));
                }
                Err(e) => done.errors.push(format!("tick {tick}: pod create: {e}")),
            }
        }
        while churn.first().is_some_and(|(due, _)| *due <= tick) {
            let (_, name) = churn.remove(0);
            match Objects::delete(
                &api,
                &resources::PODS,
                SLURM_NAMESPACE,
                &name,
                &DeleteOptions::default(),
            ) {
                Ok(()) => done.pods_deleted += 1,
                Err(e) => done.errors.push(format!("tick {tick}: pod delete: {e}")),
            }
        }
        if tick % 12 == 6 {
            let i = (done.agent_restarts as usize) % nodes.len();
            match sys.restart_agent(i).await {
                Ok(()) => done.agent_restarts += 1,
                Err(e) => done.errors.push(format!("tick {tick}: agent restart: {e}")),
            }
        }
        if tick.is_multiple_of(12) {
            sys.cluster.api().drop_watches();
            done.watch_drops += 1;
        }
        if tick % 18 == 9 {
            let host = format!("{NODESET}-{}", (tick as usize / 18) % nodes.len());
            slurm.not_found_after_write(&host, 2);
            done.slurm_faults += 1;
        }
        if Instant::now() >= next_sample {
            next_sample += o.sample_every;
            let s = sample(&sys, start).await;
            println!(
                "t={:>6.0}s controller: rss={:>7.0} KiB fds={:>4.0} tasks={:>4.0} series={:>5.0}; agents+doubles rss={:>7.0} KiB; events={:>6.0}",
                s.at, s.rss_kib, s.fds, s.tasks, s.series, s.bench_rss_kib, s.events
            );
            samples.push(s);
        }
    }
    // Quiet end: the last churn pods go, the last rotation is repaired.
    for (_, name) in churn.drain(..) {
        let _ = Objects::delete(
            &api,
            &resources::PODS,
            SLURM_NAMESPACE,
            &name,
            &DeleteOptions::default(),
        );
    }
    let elapsed = start.elapsed();
    let settled = poll(
        "every attempt closed and every worker Fresh",
        Duration::from_secs(300),
        || {
            let open = nodeset_attempts(&api).iter().any(|a| a.is_open());
            let base = sys.metrics_base.clone();
            async move {
                if open {
                    return None;
                }
                let doc = verdicts(&base, "all=1").await.ok()?;
                // The workers' verdicts (the churn pods are gone).
                let all_fresh = doc["verdicts"]
                    .as_array()?
                    .iter()
                    .filter(|v| v["pod"].as_str().is_some_and(|p| p.starts_with(NODESET)))
                    .all(|v| v["state"] == "Fresh" || v["state"] == "Skipped");
                all_fresh.then_some(())
            }
        },
    )
    .await;
    let report = summary(o, &samples, &done, elapsed);
    print!("{report}");
    if let Some(path) = &o.csv {
        let mut csv = String::from(
            "seconds,controller_rss_kib,controller_fds,controller_tasks,controller_series,agents_doubles_rss_kib,events\n",
        );
        for s in &samples {
            let _ = writeln!(
                csv,
                "{:.1},{},{},{},{},{},{}",
                s.at, s.rss_kib, s.fds, s.tasks, s.series, s.bench_rss_kib, s.events
            );
        }
        std::fs::write(path, csv)?;
        println!("samples written to {path}");
    }
    // Checks.
    let mut ok = true;
    let mut fail = |what: String| {
        println!("CHECK FAILED: {what}");
        ok = false;
    };
    if let Err(e) = settled {
        fail(format!(
            "{e}: open attempts {:?}",
            nodeset_attempts(&api)
                .iter()
                .filter(|a| a.is_open())
                .map(|a| (&a.pod, a.phase.name()))
                .collect::<Vec<_>>()
        ));
    }
    if let Some(st) = sys.controller.exited() {
        fail(format!(
            "the controller exited ({st}):\n{}",
            sys.controller.log_tail(30)
        ));
    }
    let all = nodeset_attempts(&api);
    let failed: Vec<_> = all
        .iter()
        .filter(|a| a.phase.is_terminal() && a.phase.name() != "Succeeded")
        .map(|a| (a.pod.clone(), a.phase.name()))
        .collect();
    if !failed.is_empty() {
        fail(format!("attempts that did not succeed: {failed:?}"));
    }
    for i in 0..o.nodes {
        let host = format!("{NODESET}-{i}");
        if let Some(v) = slurm.node(&host)
            && v.reason.starts_with("mountguard:")
        {
            fail(format!(
                "{host} left with mountguard's reason {:?} ({:?})",
                v.reason, v.state
            ));
        }
    }
    let events = recorded_events(&api).len() as f64;
    let per_min = events / (elapsed.as_secs_f64() / 60.0).max(1.0 / 60.0);
    println!(
        "Events: {events:.0} in {:.0} s, {per_min:.1} per minute (limit {})",
        elapsed.as_secs_f64(),
        o.max_events_per_min
    );
    if per_min > o.max_events_per_min {
        fail(format!("Event storm: {per_min:.1} per minute"));
    }
    if !done.errors.is_empty() {
        fail(format!("the load itself failed: {:?}", done.errors));
    }
    if done.rotations == 0 {
        fail("no rotation happened: run longer than half of --rotate-every".into());
    }
    println!("checks: {}", if ok { "all passed" } else { "FAILED" });
    sys.shutdown().await;
    Ok(ok)
}

fn summary(o: &Opts, samples: &[Sample], done: &Done, elapsed: Duration) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "load in {:.0} s: {} ConfigMap updates, {} rotations of the immutable Secret, {} pods created and {} deleted, {} agent restarts, {} watch drops, {} slurmrestd faults",
        elapsed.as_secs_f64(),
        done.configmap_updates,
        done.rotations,
        done.pods_created,
        done.pods_deleted,
        done.agent_restarts,
        done.watch_drops,
        done.slurm_faults
    );
    let warm = o.duration.as_secs_f64() / 5.0;
    let after: Vec<&Sample> = samples.iter().filter(|s| s.at >= warm).collect();
    let _ = writeln!(
        out,
        "after warm-up ({warm:.0} s, {} samples): first, last, growth per hour (least squares)",
        after.len()
    );
    for (name, f) in FIGURES {
        let xy: Vec<(f64, f64)> = after.iter().map(|s| (s.at, f(s))).collect();
        let (Some(first), Some(last)) = (xy.first(), xy.last()) else {
            let _ = writeln!(out, "  {name}: too few samples");
            continue;
        };
        let per_hour = slope(&xy) * 3600.0;
        let pct = if first.1 == 0.0 {
            0.0
        } else {
            100.0 * per_hour / first.1
        };
        let _ = writeln!(
            out,
            "  {name}: {:.0} -> {:.0}, {per_hour:+.1}/h ({pct:+.1} %/h)",
            first.1, last.1
        );
    }
    out
}

fn main() -> ExitCode {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("soak: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match rt.block_on(run(&o)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::from(1)
        }
    }
}
