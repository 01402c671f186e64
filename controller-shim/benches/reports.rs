//! Report API benchmark: the real report handler (HTTP/1.1 over loopback,
//! plaintext), the evaluation task and the metrics, with a cached fake
//! TokenReview, for 5,000 simulated nodes x 110 pods x 3 volumes.
//!
//! The controller side runs in this process on a 2-worker tokio runtime;
//! the load generator is this binary re-executed as a child process, so the
//! CPU time measured with getrusage is the controller's alone.
//!
//! Phases: pods and sources enter through the evaluation channel (as the
//! watches would send them); every node sends its inventory; then
//! `--rounds` rounds of one heartbeat per node, as fast as the controller
//! takes them; then one Secret referenced by 550 pods changes and the time
//! until `mountguard_mounts{state="Propagating"}` moves is measured.
//!
//! Run: `cargo bench -p mountguard-controller --bench reports`
//! (`-- --nodes N --rounds R` for other sizes).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use jiff::Timestamp;
use mountguard_controller::live::auth::{
    AgentPod, AgentPods, AuthError, CachedReviewer, EXTRA_POD_NAME, EXTRA_POD_UID, ReviewedUser,
    TokenReviewer,
};
use mountguard_controller::live::eval::{self, EvalTask, EvaluationSnapshot, Input};
use mountguard_controller::live::metrics::Metrics;
use mountguard_controller::live::report::{self, CountLimits, ReportConfig, ReportHandler};
use mountguard_controller::live::{Shared, Shutdown};
use mountguard_core::model::{
    Interner, SourceContent, SourceKind, SourceProjection, SourceRef, VolumeSource,
};
use mountguard_core::testkit::PodB;
use mountguard_core::{Config, Engine, Fingerprinter};
use mountguard_inventory::report::Heartbeat;
use mountguard_inventory::{
    NodeInventory, Plugin, PodInventory, Sha256Hex, VolumeInventory, file_digest, volume_digest,
};
use nix::sys::resource::{UsageWho, getrusage};

use common::{arg, connect, node_name, peak_rss_mib, put};

mod common;

const PODS_PER_NODE: usize = 110;
const SECRETS: usize = 1000;
const CONFIGS: usize = 5000;
const NS: &str = "bench";

fn pod_uid(n: usize, j: usize) -> String {
    format!("uid-{n:05}-{j:03}")
}

/// The three sources of pod (n, j): a shared ConfigMap, one of SECRETS
/// Secrets and one of CONFIGS ConfigMaps.
fn sources_of(n: usize, j: usize) -> [(SourceKind, String); 3] {
    let i = n * PODS_PER_NODE + j;
    [
        (SourceKind::ConfigMap, "common".to_string()),
        (SourceKind::Secret, format!("secret-{}", i % SECRETS)),
        (SourceKind::ConfigMap, format!("app-{}", i % CONFIGS)),
    ]
}

fn value(name: &str, version: u32) -> Vec<u8> {
    format!("{name}:v{version}").into_bytes()
}

fn plugin(kind: SourceKind) -> Plugin {
    match kind {
        SourceKind::Secret => Plugin::Secret,
        SourceKind::ConfigMap => Plugin::Configmap,
    }
}

fn inventory(n: usize, generation: u64, at: Timestamp) -> NodeInventory {
    let mut inv = NodeInventory::new(node_name(n), "bench", at);
    inv.generation = generation;
    for j in 0..PODS_PER_NODE {
        let mut volumes = Vec::new();
        for (vi, (kind, name)) in sources_of(n, j).into_iter().enumerate() {
            let mut files = BTreeMap::new();
            files.insert("key".to_string(), Sha256Hex(file_digest(&value(&name, 1))));
            let digest = volume_digest(files.iter().map(|(k, v)| (k.as_str(), &v.0)));
            volumes.push(VolumeInventory {
                plugin: plugin(kind),
                name: format!("v{vi}"),
                data_dir: Some("..2026_11_30_10_00_00.1".into()),
                written_at: Some("2026-11-30T09:00:00Z".parse().unwrap()),
                digest: Some(Sha256Hex(digest)),
                files,
                modes: BTreeMap::new(),
                errors: vec![],
            });
        }
        volumes.sort_by(|a, b| (a.plugin, &a.name).cmp(&(b.plugin, &b.name)));
        inv.pods.push(PodInventory {
            uid: pod_uid(n, j),
            volumes,
            sub_paths: vec![],
            errors: vec![],
        });
    }
    inv
}

#[derive(Debug)]
struct Reviewer {
    nodes: usize,
}

impl TokenReviewer for Reviewer {
    fn review<'a>(
        &'a self,
        token: &'a str,
        _audience: &'a str,
    ) -> BoxFuture<'a, Result<ReviewedUser, AuthError>> {
        Box::pin(async move {
            let n: usize = token
                .strip_prefix("token-")
                .and_then(|s| s.parse().ok())
                .filter(|n| *n < self.nodes)
                .ok_or_else(|| AuthError::Unauthenticated("unknown".into()))?;
            let mut extra = BTreeMap::new();
            extra.insert(EXTRA_POD_NAME.to_string(), vec![format!("agent-{n}")]);
            extra.insert(EXTRA_POD_UID.to_string(), vec![format!("agent-uid-{n}")]);
            Ok(ReviewedUser {
                username: "system:serviceaccount:mg:agent".into(),
                uid: format!("sa-{n}"),
                extra,
            })
        })
    }
}

fn cpu_seconds() -> f64 {
    let u = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

// ---------------------------------------------------------------- client

fn client(addr: SocketAddr, nodes: usize, rounds: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        const CONNS: usize = 16;
        let out = std::io::stdout();
        let t = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..CONNS {
            tasks.push(tokio::spawn(async move {
                let mut s = connect(addr).await;
                let mut n = c;
                while n < nodes {
                    let inv = inventory(n, 1, Timestamp::now());
                    let st = put(
                        &mut s,
                        &format!("/v1/nodes/{}/inventory", node_name(n)),
                        &format!("token-{n}"),
                        serde_json::to_vec(&inv).unwrap(),
                    )
                    .await;
                    assert_eq!(st, "accepted");
                    n += CONNS;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        writeln!(out.lock(), "inventories {:.3}", t.elapsed().as_secs_f64()).unwrap();
        out.lock().flush().unwrap();
        // Wait until the controller evaluated them (it writes a line).
        let mut line = String::new();
        std::io::stdin().read_line(&mut line).unwrap();
        writeln!(out.lock(), "heartbeats-start").unwrap();
        out.lock().flush().unwrap();
        let t = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..CONNS {
            tasks.push(tokio::spawn(async move {
                let mut s = connect(addr).await;
                for _ in 0..rounds {
                    let mut n = c;
                    while n < nodes {
                        let hb = Heartbeat::new(node_name(n), 1, Timestamp::now());
                        let st = put(
                            &mut s,
                            &format!("/v1/nodes/{}/heartbeat", node_name(n)),
                            &format!("token-{n}"),
                            serde_json::to_vec(&hb).unwrap(),
                        )
                        .await;
                        assert_eq!(st, "unchanged");
                        n += CONNS;
                    }
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let secs = t.elapsed().as_secs_f64();
        writeln!(out.lock(), "heartbeats-done {secs:.3}").unwrap();
        out.lock().flush().unwrap();
    });
}

// ---------------------------------------------------------------- server

fn main() {
    if let Ok(addr) = std::env::var("MOUNTGUARD_BENCH_CLIENT") {
        client(
            addr.parse().unwrap(),
            arg("--nodes", 5000),
            arg("--rounds", 3),
        );
        return;
    }
    let nodes = arg("--nodes", 5000);
    let rounds = arg("--rounds", 3);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(server(nodes, rounds));
}

async fn server(nodes: usize, rounds: usize) {
    let metrics = Metrics::new();
    let shared = Arc::new(Shared::new(metrics.clone()));
    shared.acting.store(true, Ordering::SeqCst);
    let (_trigger, shutdown) = Shutdown::new();
    let (tx, rx) = tokio::sync::mpsc::channel::<Input>(4096);
    let (etx, mut erx) = tokio::sync::mpsc::channel(1024);
    tokio::spawn(async move { while erx.recv().await.is_some() {} });
    let (stx, _srx) = tokio::sync::watch::channel(Arc::new(EvaluationSnapshot::default()));
    let engine = Engine::new(Config::default(), Fingerprinter::new(&[9u8; 32]).unwrap());
    tokio::spawn(eval::run(
        EvalTask::new(engine, shared.clone(), etx, stx),
        rx,
        shutdown.clone(),
    ));

    // Pods and sources, as the watches deliver them.
    let t = Instant::now();
    let mut ix = Interner::default();
    let source = |ix: &mut Interner, kind: SourceKind, name: &str, version: u32| {
        let r = SourceRef::new(kind, ix.intern(NS), ix.intern(name));
        let v = value(name, version);
        let c = SourceContent::from_plain(
            ix,
            false,
            [("key", v.as_slice(), false)],
            Some(name),
            Some("2026-11-30T08:00:00Z".parse().unwrap()),
        );
        Input::Source(r, c)
    };
    tx.send(source(&mut ix, SourceKind::ConfigMap, "common", 1))
        .await
        .unwrap();
    for i in 0..SECRETS {
        tx.send(source(
            &mut ix,
            SourceKind::Secret,
            &format!("secret-{i}"),
            1,
        ))
        .await
        .unwrap();
    }
    for i in 0..CONFIGS {
        tx.send(source(
            &mut ix,
            SourceKind::ConfigMap,
            &format!("app-{i}"),
            1,
        ))
        .await
        .unwrap();
    }
    let agents = Arc::new(AgentPods::default());
    agents.set_daemonset_uid(Some("agent-ds-uid".into()));
    for n in 0..nodes {
        agents.apply(AgentPod {
            namespace: "mg".into(),
            name: format!("agent-{n}"),
            uid: format!("agent-uid-{n}"),
            node: Some(node_name(n)),
            controller: Some(("agent".into(), "agent-ds-uid".into())),
        });
        for j in 0..PODS_PER_NODE {
            let mut b = PodB::new(NS, &format!("p-{n}-{j}"), &pod_uid(n, j), &node_name(n));
            for (vi, (kind, name)) in sources_of(n, j).into_iter().enumerate() {
                b = b.volume(
                    &format!("v{vi}"),
                    VolumeSource::Object(SourceProjection {
                        kind,
                        name: ix.intern(&name),
                        items: None,
                        optional: false,
                    }),
                );
            }
            // As the watch edge does: equal volume specs share one value.
            let mut pod = b.build();
            let mut vols = pod.volumes.into_vec();
            for v in vols.iter_mut() {
                v.source = ix.intern_volume_source((*v.source).clone());
                v.name = ix.intern(&v.name);
            }
            pod.volumes = vols.into();
            pod.namespace = ix.intern(NS);
            pod.node = pod.node.map(|n| ix.intern(&n));
            tx.send(Input::Pod(Box::new(pod))).await.unwrap();
        }
    }
    drop(ix);
    // Readiness gates evaluation: flip it once the "lists" are in.
    shared.ready.store(true, Ordering::SeqCst);
    let pods = nodes * PODS_PER_NODE;
    let deadline = Instant::now() + Duration::from_secs(600);
    while shared.verdicts.read().unwrap().pods.len() < pods {
        assert!(
            Instant::now() < deadline,
            "initial evaluation did not finish"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let load_secs = t.elapsed().as_secs_f64();

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handler = Arc::new(ReportHandler::new(
        ReportConfig {
            audience: "mountguard".into(),
            agent_sa: "mg:agent".parse().unwrap(),
            agent_daemonset: "agent".into(),
            max_bytes: 32 << 20,
            rate: "100/s,100".parse().unwrap(),
            limits: CountLimits::default(),
        },
        shared.clone(),
        // Every simulated agent connects from 127.0.0.1: no per-source limit.
        Arc::new(CachedReviewer::with_limits(
            Reviewer { nodes },
            metrics.clone(),
            100_000,
            mountguard_controller::live::auth::ReviewLimits {
                per_source_burst: u32::MAX,
                ..Default::default()
            },
        )),
        agents,
        None,
        tx.clone(),
    ));
    tokio::spawn(report::serve(
        listener,
        None,
        handler,
        mountguard_serve::Limits {
            max_connections: 20_000,
            ..mountguard_serve::Limits::small()
        },
        metrics.serve("report"),
        shutdown.clone(),
    ));

    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env("MOUNTGUARD_BENCH_CLIENT", addr.to_string())
        .args([
            "--nodes",
            &nodes.to_string(),
            "--rounds",
            &rounds.to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut child_stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (ltx, mut lrx) = tokio::sync::mpsc::unbounded_channel::<(String, f64)>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line.unwrap();
            let _ = ltx.send((line, cpu_seconds()));
        }
    });
    let fresh = || metrics.mounts.with_label_values(&["Fresh"]).get();
    let mut inv_secs = 0.0;
    let mut inv_eval_secs = 0.0;
    let mut hb_cpu_start = 0.0;
    let mut hb = (0.0, 0.0);
    while let Some((line, cpu)) = lrx.recv().await {
        let mut parts = line.split_whitespace();
        match (parts.next(), parts.next()) {
            (Some("inventories"), Some(s)) => {
                inv_secs = s.parse().unwrap();
                // Every inventory evaluated (all Fresh) before heartbeats.
                let t = Instant::now();
                let deadline = t + Duration::from_secs(300);
                while fresh() < (pods * 3) as i64 {
                    assert!(
                        Instant::now() < deadline,
                        "inventories not evaluated: {}",
                        fresh()
                    );
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                inv_eval_secs = inv_secs + t.elapsed().as_secs_f64();
                writeln!(child_stdin, "go").unwrap();
                child_stdin.flush().unwrap();
            }
            (Some("heartbeats-start"), _) => hb_cpu_start = cpu,
            (Some("heartbeats-done"), Some(s)) => hb = (s.parse().unwrap(), cpu - hb_cpu_start),
            _ => {}
        }
    }
    assert!(child.wait().unwrap().success(), "load generator failed");
    // Wait for the inventories to be evaluated (all Fresh).
    let fresh = || metrics.mounts.with_label_values(&["Fresh"]).get();
    let deadline = Instant::now() + Duration::from_secs(120);
    while fresh() < (pods * 3) as i64 {
        assert!(
            Instant::now() < deadline,
            "inventories not evaluated: {}",
            fresh()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A Secret referenced by nodes*110/1000 pods changes.
    let propagating = || metrics.mounts.with_label_values(&["Propagating"]).get();
    let before = propagating();
    let mut ix = Interner::default();
    let t = Instant::now();
    tx.send(source(&mut ix, SourceKind::Secret, "secret-7", 2))
        .await
        .unwrap();
    while propagating() == before {
        assert!(t.elapsed() < Duration::from_secs(60), "metric never moved");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let change_ms = t.elapsed().as_secs_f64() * 1000.0;
    let heartbeats = (nodes * rounds) as f64;
    let evals = metrics.evaluation_duration.get_sample_count();

    println!(
        "controller report benchmark: {nodes} nodes x {PODS_PER_NODE} pods x 3 volumes ({pods} pods), 2 worker threads"
    );
    println!("  load pods+sources and first full evaluation: {load_secs:.2} s");
    println!(
        "  inventories: {nodes} accepted in {inv_secs:.2} s ({:.0}/s), all evaluated after {inv_eval_secs:.2} s",
        nodes as f64 / inv_secs
    );
    println!(
        "  heartbeats: {heartbeats:.0} in {:.2} s = {:.0} requests/s; controller CPU {:.2} s = {:.3} CPU s per 5,000 heartbeats",
        hb.0,
        heartbeats / hb.0,
        hb.1,
        hb.1 / heartbeats * 5000.0
    );
    println!(
        "  Secret change -> mountguard_mounts{{state=\"Propagating\"}} updated: {change_ms:.0} ms ({} pods moved)",
        propagating() - before
    );
    println!("  evaluation batches: {evals}");
    println!("  peak RSS (controller process): {:.0} MiB", peak_rss_mib());
}
