//! Heap profile of the controller's state, by structure, for the cluster of
//! the `reports` benchmark (5,000 nodes x 110 pods x 3 volumes by default).
//!
//! Every allocation goes through a counting allocator; each step below
//! prints the live heap bytes (and blocks) it added or freed, per pod and
//! per node. Two passes over the same inputs:
//!
//! 1. the engine's structures alone (sources, pod models as the pod watch
//!    builds them, the index's reverse maps, converted inventories, the
//!    engine's history, every verdict held at once), built step by step;
//! 2. the live evaluation task (`eval`, as `run` drives it, without
//!    HTTP): everything of pass 1 it holds plus the published verdicts and
//!    what each pod's verdicts were computed against; then torn down piece
//!    by piece.
//!
//! Bytes are what the program asked for; the allocator adds its own
//! overhead per block (glibc: 8-16 bytes), so the process's resident size
//! is larger (printed at the end). For allocation sites, run the same
//! benchmark under heaptrack: `scripts/heap-profile.sh`.
//!
//! Run: `cargo bench -p mountguard-controller --bench heap`
//! (`-- --nodes N --pods P` for other sizes).

use std::alloc::System;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use jiff::Timestamp;
use mountguard_controller::api::store::ReadModel;
use mountguard_controller::eval::metrics::EvalMetrics;
use mountguard_controller::eval::{EvalTask, EvaluationSnapshot, Input};
use mountguard_controller::runtime::metrics::Metrics;
use mountguard_controller::state::Shared;
use mountguard_core::index::ClusterIndex;
use mountguard_core::model::{Interner, ObservedNode};
use mountguard_core::{Config, Engine, EngineState, Fingerprinter};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use cluster::Cluster;
use common::{arg, status_mib};

mod cluster;
// Only the flag parser and the memory readers are used here; the HTTP helpers
// serve the report-API benchmarks.
#[allow(dead_code)]
mod common;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Live heap: (bytes, blocks).
fn live() -> (i64, i64) {
    let s = GLOBAL.stats();
    // A reallocation is counted in both byte totals already (growth as
    // allocated, shrinking as deallocated).
    (
        s.bytes_allocated as i64 - s.bytes_deallocated as i64,
        s.allocations as i64 - s.deallocations as i64,
    )
}

/// Prints heap changes since the last step.
struct Meter {
    start: i64,
    last: (i64, i64),
    pods: f64,
    nodes: f64,
    t: Instant,
}

impl Meter {
    fn new(c: Cluster) -> Self {
        let now = live();
        Self {
            start: now.0,
            last: now,
            pods: c.pods() as f64,
            nodes: c.nodes as f64,
            t: Instant::now(),
        }
    }

    /// Live heap bytes per pod added since the meter started.
    fn total_per_pod(&self) -> f64 {
        (live().0 - self.start) as f64 / self.pods
    }

    /// Prints the change since the last step under `what`.
    fn step(&mut self, what: &str) -> i64 {
        let now = live();
        let (db, dn) = (now.0 - self.last.0, now.1 - self.last.1);
        println!(
            "  {what:<58} {:>9.1} MiB {:>10} blocks {:>7.1} B/pod {:>9.0} B/node  ({:.1} s)",
            db as f64 / (1 << 20) as f64,
            dn,
            db as f64 / self.pods,
            db as f64 / self.nodes,
            self.t.elapsed().as_secs_f64()
        );
        self.last = now;
        self.t = Instant::now();
        db
    }
}

fn at() -> Timestamp {
    "2026-11-30T10:00:00Z".parse().unwrap()
}

/// Pass 1: the engine's structures, one at a time.
fn engine_pass(c: Cluster) {
    println!("engine structures (pass 1):");
    let mut m = Meter::new(c);
    let engine = Engine::new(Config::default(), Fingerprinter::new(&[9u8; 32]).unwrap());
    let mut ix = ClusterIndex::new();
    // The watches' interner (names, volume specs), alive as long as they are.
    let mut watch = Interner::default();
    for (r, content) in cluster::sources(&mut watch) {
        ix.apply_source(r, content);
    }
    m.step("sources (6,001, hashed, in the index)");
    let mut pods = Vec::with_capacity(c.pods());
    for n in 0..c.nodes {
        pods.extend(c.node_pods(&mut watch, n));
    }
    m.step("pod models as the pod watch builds them (+ its interner)");
    for p in pods {
        ix.apply_pod(p);
    }
    m.step("index: pod slots, by UID, by source, by node");
    // One parsed wire inventory: what each in-flight report holds.
    let one = c.inventory(0, 1, at());
    m.step("one parsed wire inventory (each in-flight report)");
    drop(one);
    m.last = live();
    for n in 0..c.nodes {
        let inv = c.inventory(n, 1, at());
        let obs = ObservedNode::from_inventory(&inv, &mut ix.interner);
        ix.apply_inventory(obs);
    }
    m.step("observed node inventories (converted, interned)");
    let mut state = EngineState::default();
    let mut verdicts = 0usize;
    engine.evaluate_all_each(&ix, &mut state, at(), |pv| verdicts += pv.verdicts.len());
    m.step("engine history (EngineState) after a full evaluation");
    let all = engine.evaluate_all(&ix, &mut state, at());
    assert_eq!(all.len(), verdicts);
    m.step("every verdict held at once (Evaluation)");
    drop(all);
    m.step("  dropped again");
    drop(state);
    drop(ix);
    drop(watch);
    m.step("everything dropped");
}

/// Pass 2: the evaluation task, then torn down.
fn live_pass(c: Cluster) {
    println!("live evaluation task (pass 2):");
    let mut m = Meter::new(c);
    let shared = Arc::new(Shared::new(Metrics::new()));
    shared.acting.store(true, Ordering::SeqCst);
    let (etx, _erx) = tokio::sync::mpsc::channel(1024);
    let (stx, _) = tokio::sync::watch::channel(Arc::new(EvaluationSnapshot::default()));
    let engine = Engine::new(Config::default(), Fingerprinter::new(&[9u8; 32]).unwrap());
    let store = ReadModel::default();
    let evaluation = EvalMetrics::register(&shared.metrics);
    let mut task = EvalTask::new(engine, shared.clone(), evaluation, store.clone(), etx, stx);
    let mut watch = Interner::default();
    let sources = cluster::sources(&mut watch)
        .into_iter()
        .map(|(r, content)| Input::Source(r, content))
        .collect();
    task.apply_batch(sources, at());
    for n in 0..c.nodes {
        let pods = c
            .node_pods(&mut watch, n)
            .into_iter()
            .map(|p| Input::Pod(Box::new(p)))
            .collect();
        task.apply_batch(pods, at());
    }
    m.step("sources and pods in the task's index (+ watch interner)");
    shared.ready.store(true, Ordering::SeqCst);
    task.apply_batch(Vec::new(), at());
    m.step("first full evaluation, no inventory yet (published)");
    // As the report handler hands them over: at most 32 in flight.
    let nodes: Vec<usize> = (0..c.nodes).collect();
    for chunk in nodes.chunks(32) {
        let batch = chunk
            .iter()
            .map(|n| Input::Inventory(Box::new(c.inventory(*n, 1, at())), None))
            .collect();
        task.apply_batch(batch, at());
    }
    m.step("every inventory applied and evaluated (published)");
    // The settled live state: everything the task and what it publishes
    // hold (index, pods, observed nodes, history with the verdicts, the
    // published store, series, trackers, the watches' interner).
    println!("total: {:.0} B/pod (target < 512)", m.total_per_pod());
    let peak_rss = status_mib("VmHWM");
    let rss = status_mib("VmRSS");
    {
        let store = store.read().unwrap();
        assert_eq!(store.pods.len(), c.pods());
    }
    println!("  teardown:");
    let pods = std::mem::take(&mut store.write().unwrap().pods);
    drop(pods);
    m.step("  published pods: verdicts and checks (VerdictStore.pods)");
    let sources = std::mem::take(&mut store.write().unwrap().sources);
    drop(sources);
    m.step("  published sources (VerdictStore.sources)");
    drop(task);
    m.step("  the task: index, observed nodes, history, series, trackers");
    drop(watch);
    m.step("  the watches' interner");
    drop(shared);
    m.step("  metrics and the rest");
    println!("  process: VmRSS {rss:.0} MiB with the state loaded, VmHWM {peak_rss:.0} MiB");
}

/// Sizes of the per-pod, per-volume and per-verdict types (their own
/// bytes; what they point to is counted by the passes).
fn sizes() {
    use mountguard_controller::api::store::PublishedPod;
    use mountguard_core::model::{
        ContainerModel, ObservedPod, ObservedVolume, PodModel, SourceRef, VolumeModel,
    };
    use mountguard_core::verdict::present::PodCheck;
    use mountguard_core::verdict::{PodHistory, PodVerdicts, SubjectHistory, Verdict};
    use std::mem::size_of;
    println!(
        "type sizes (bytes): PodModel {}, VolumeModel {}, ContainerModel {}, ObservedPod {}, \
         ObservedVolume {}, Verdict {}, PodVerdicts {}, PodHistory {}, SubjectHistory {}, \
         PodCheck {}, PublishedPod {}, SourceRef {}, Timestamp {}, Option<Timestamp> {}",
        size_of::<PodModel>(),
        size_of::<VolumeModel>(),
        size_of::<ContainerModel>(),
        size_of::<ObservedPod>(),
        size_of::<ObservedVolume>(),
        size_of::<Verdict>(),
        size_of::<PodVerdicts>(),
        size_of::<PodHistory>(),
        size_of::<SubjectHistory>(),
        size_of::<PodCheck>(),
        size_of::<PublishedPod>(),
        size_of::<SourceRef>(),
        size_of::<Timestamp>(),
        size_of::<Option<Timestamp>>(),
    );
}

fn main() {
    sizes();
    let c = Cluster {
        nodes: arg("--nodes", 5000),
        pods_per_node: arg("--pods", 110),
    };
    println!(
        "controller heap by structure: {} nodes x {} pods x 3 volumes ({} pods)",
        c.nodes,
        c.pods_per_node,
        c.pods()
    );
    if std::env::args().all(|a| a != "live") {
        engine_pass(c);
    }
    if std::env::args().all(|a| a != "engine") {
        live_pass(c);
    }
}
