//! Verdict engine benchmark: 5,000 nodes x 110 pods x 3 volumes from
//! in-memory inputs, then the incremental cost when one Secret referenced by
//! 10,000 pods changes.
//!
//! Run: `cargo bench -p mountguard-controller --bench engine`
//! (`-- --nodes N` for a smaller run). Prints wall times and the peak
//! resident set size (VmHWM); asserts only that the results are plausible.

use std::collections::BTreeMap;
use std::time::Instant;

use jiff::{SignedDuration, Timestamp};
use mountguard_core::index::ClusterIndex;
use mountguard_core::model::{
    ContainerKind, ContainerModel, EnvRef, KeyToPath, MountModel, ObservedNode, PodModel,
    ProjectedSource, SkipReason, SourceContent, SourceKind, SourceProjection, SourceRef,
    VolumeModel, VolumeSource,
};
use mountguard_core::verdict::{Config, Engine, EngineState, State};
use mountguard_core::{Fingerprinter, PodUid};
use mountguard_inventory::{
    NodeInventory, Plugin, PodInventory, Sha256Hex, VolumeInventory, file_digest,
};

const PODS_PER_NODE: usize = 110;
const HOT_EVERY: usize = 55; // 550,000 / 55 = 10,000 pods reference the hot Secret
const NAMESPACES: usize = 50;
const SECRETS_PER_NS: usize = 200;
const CONFIGS_PER_NS: usize = 100;

fn vm(field: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .map(|l| l[field.len() + 1..].trim().to_string())
        })
        .unwrap_or_else(|| "n/a".into())
}

fn value(kind: &str, ns: &str, name: &str, key: &str, version: u32) -> Vec<u8> {
    format!("{kind}:{ns}/{name}:{key}:v{version}").into_bytes()
}

struct Gen {
    ix: ClusterIndex,
}

impl Gen {
    fn source(
        &mut self,
        kind: SourceKind,
        ns: &str,
        name: &str,
        keys: &[&str],
        version: u32,
    ) -> SourceRef {
        let r = SourceRef::new(
            kind,
            self.ix.interner.intern(ns),
            self.ix.interner.intern(name),
        );
        if self.ix.source(&r).is_none() || version > 0 {
            let vals: Vec<(String, Vec<u8>)> = keys
                .iter()
                .map(|k| (k.to_string(), value(kind.as_str(), ns, name, k, version)))
                .collect();
            let c = SourceContent::from_plain(
                &mut self.ix.interner,
                false,
                vals.iter().map(|(k, v)| (k.as_str(), v.as_slice(), false)),
                None,
                Some("2026-11-30T08:00:00Z".parse().unwrap()),
            );
            self.ix.apply_source(r.clone(), c);
        }
        r
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let nodes: usize = args
        .iter()
        .position(|a| a == "--nodes")
        .and_then(|i| args.get(i + 1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(5000);
    let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
    let started: Timestamp = "2026-11-30T09:00:00Z".parse().unwrap();
    let scanned = now - SignedDuration::from_secs(30);

    let t = Instant::now();
    let mut g = Gen {
        ix: ClusterIndex::new(),
    };
    let mut hot_uids: Vec<String> = Vec::new();
    let mut pod_no = 0usize;
    for n in 0..nodes {
        let node_name = format!("node-{n:05}");
        let mut inv = NodeInventory::new(node_name.as_str(), "bench", scanned);
        for _ in 0..PODS_PER_NODE {
            let i = pod_no;
            pod_no += 1;
            let hot = i.is_multiple_of(HOT_EVERY);
            let ns = if hot {
                "hot".to_string()
            } else {
                format!("ns-{:02}", i % NAMESPACES)
            };
            let secret = if hot {
                "hot-secret".to_string()
            } else {
                format!("secret-{}", i % SECRETS_PER_NS)
            };
            let config = format!("config-{}", i % CONFIGS_PER_NS);
            let uid = format!("{:08x}-0000-4000-8000-{:012x}", i, i);
            if hot {
                hot_uids.push(uid.clone());
            }
            g.source(SourceKind::Secret, &ns, &secret, &["tls.crt", "tls.key"], 0);
            g.source(
                SourceKind::ConfigMap,
                &ns,
                &config,
                &["app.yaml", "log.yaml", "extra"],
                0,
            );
            g.source(
                SourceKind::ConfigMap,
                &ns,
                "kube-root-ca.crt",
                &["ca.crt"],
                0,
            );
            let ix = &mut g.ix;
            let it = &mut ix.interner;
            // The API server names the token volume with a random suffix per pod.
            let kaa_name = format!("kube-api-access-{:05x}", i % 0xfffff);
            let creds = VolumeSource::Object(SourceProjection {
                kind: SourceKind::Secret,
                name: it.intern(&secret),
                items: None,
                optional: false,
            });
            let config_src = VolumeSource::Object(SourceProjection {
                kind: SourceKind::ConfigMap,
                name: it.intern(&config),
                items: Some(Box::new([
                    KeyToPath {
                        key: it.intern("app.yaml"),
                        path: it.intern("app.yaml"),
                    },
                    KeyToPath {
                        key: it.intern("log.yaml"),
                        path: it.intern("conf.d/log.yaml"),
                    },
                ])),
                optional: false,
            });
            let kaa_src = VolumeSource::Projected(Box::new([
                ProjectedSource::NotFromApi {
                    reason: SkipReason::ServiceAccountToken,
                    paths: Box::new([it.intern("token")]),
                },
                ProjectedSource::Object(SourceProjection {
                    kind: SourceKind::ConfigMap,
                    name: it.intern("kube-root-ca.crt"),
                    items: Some(Box::new([KeyToPath {
                        key: it.intern("ca.crt"),
                        path: it.intern("ca.crt"),
                    }])),
                    optional: false,
                }),
                ProjectedSource::NotFromApi {
                    reason: SkipReason::DownwardApi,
                    paths: Box::new([it.intern("namespace")]),
                },
            ]));
            let volumes = vec![
                VolumeModel {
                    name: it.intern("creds"),
                    source: it.intern_volume_source(creds),
                    read_at_start: false,
                },
                VolumeModel {
                    name: it.intern("config"),
                    source: it.intern_volume_source(config_src),
                    read_at_start: false,
                },
                VolumeModel {
                    name: it.intern(&kaa_name),
                    source: it.intern_volume_source(kaa_src),
                    read_at_start: false,
                },
            ];
            let volumes = it.intern_volumes(volumes);
            let mounts = vec![MountModel {
                index: 1,
                volume: 1,
                sub_path: Some(it.intern("app.yaml")),
                sub_path_expr: false,
            }];
            let mounts = it.intern_mounts(mounts);
            let env = vec![EnvRef::Key {
                var: it.intern("LOG_CONFIG"),
                kind: SourceKind::ConfigMap,
                name: it.intern(&config),
                key: it.intern("log.yaml"),
                optional: false,
            }];
            let env = it.intern_env(env);
            let pod = PodModel {
                uid: PodUid::new(&uid),
                place: it.intern_place(&ns, Some(&node_name)),
                name: format!("app-{i}").into(),
                terminated: false,
                terminating: false,
                synced_at: Some(started.into()),
                ready: true,
                slinky: None,
                workload: None,
                volumes,
                containers: Box::new([ContainerModel {
                    name: it.intern("app"),
                    kind: ContainerKind::Regular,
                    started: Some(started.into()),
                    finished: false,
                    mounts,
                    env,
                }]),
                extra_refs: Default::default(),
            };
            ix.apply_pod(pod);

            // What the kubelet wrote: current content everywhere.
            let f = |kind: &str, name: &str, key: &str| {
                Sha256Hex(file_digest(&value(kind, &ns, name, key, 0)))
            };
            let vol = |plugin, name: &str, files: BTreeMap<String, Sha256Hex>| VolumeInventory {
                plugin,
                name: name.to_string(),
                data_dir: Some("..2026_11_30_09_00_00.1".into()),
                written_at: Some(started - SignedDuration::from_secs(2)),
                digest: None,
                files,
                modes: BTreeMap::new(),
                errors: vec![],
            };
            // One pod in 100 shows an old app.yaml in its volume and subPath.
            let app = if i % 100 == 1 {
                Sha256Hex(file_digest(b"an older app.yaml"))
            } else {
                f("ConfigMap", &config, "app.yaml")
            };
            inv.pods.push(PodInventory {
                uid,
                volumes: vec![
                    vol(
                        Plugin::Secret,
                        "creds",
                        BTreeMap::from([
                            ("tls.crt".into(), f("Secret", &secret, "tls.crt")),
                            ("tls.key".into(), f("Secret", &secret, "tls.key")),
                        ]),
                    ),
                    vol(
                        Plugin::Configmap,
                        "config",
                        BTreeMap::from([
                            ("app.yaml".into(), app),
                            (
                                "conf.d/log.yaml".into(),
                                f("ConfigMap", &config, "log.yaml"),
                            ),
                        ]),
                    ),
                    vol(
                        Plugin::Projected,
                        &kaa_name,
                        BTreeMap::from([
                            (
                                "ca.crt".into(),
                                f("ConfigMap", "kube-root-ca.crt", "ca.crt"),
                            ),
                            (
                                "token".into(),
                                Sha256Hex(file_digest(format!("token-{i}").as_bytes())),
                            ),
                            ("namespace".into(), Sha256Hex(file_digest(ns.as_bytes()))),
                        ]),
                    ),
                ],
                sub_paths: vec![mountguard_inventory::SubPathInventory {
                    volume: "config".into(),
                    container: "app".into(),
                    index: 1,
                    files: BTreeMap::from([(String::new(), app)]),
                    errors: vec![],
                }],
                errors: vec![],
            });
        }
        let obs = ObservedNode::from_inventory(&inv, &mut g.ix.interner);
        g.ix.apply_inventory(obs);
    }
    let build = t.elapsed();
    let mut ix = g.ix;
    println!(
        "inputs: {} nodes, {} pods, {} volumes; built in {:.2} s; RSS {}",
        nodes,
        ix.pod_count(),
        ix.pod_count() * 3,
        build.as_secs_f64(),
        vm("VmRSS:")
    );

    let engine = Engine::new(Config::default(), Fingerprinter::new(&[7u8; 32]).unwrap());
    let mut state = EngineState::default();
    // Full evaluation as the controller consumes it: counts per state and
    // the non-Fresh verdicts kept, everything else dropped as it streams by.
    let t = Instant::now();
    let mut verdicts = 0usize;
    let mut fresh = 0usize;
    let mut pods = 0usize;
    let mut kept = Vec::new();
    engine.evaluate_all_each(&ix, &mut state, now, |p| {
        pods += 1;
        verdicts += p.verdicts.len();
        let f = p
            .verdicts
            .iter()
            .filter(|v| v.state == State::Fresh)
            .count();
        fresh += f;
        if f < p.verdicts.len() {
            kept.push(p);
        }
    });
    let full = t.elapsed();
    println!(
        "full evaluation: {} pods, {} verdicts ({} fresh) in {:.2} s; RSS {}",
        pods,
        verdicts,
        fresh,
        full.as_secs_f64(),
        vm("VmRSS:")
    );
    assert_eq!(pods, ix.pod_count());
    assert_eq!(verdicts, pods * 5);
    let stale: usize = kept
        .iter()
        .flat_map(|p| p.verdicts.iter())
        .filter(|v| matches!(v.state, State::Stale(_)))
        .count();
    println!(
        "  kept {} pods with non-Fresh verdicts ({} Stale)",
        kept.len(),
        stale
    );
    let stale_pods = (0..pods).filter(|i| i % 100 == 1).count();
    assert_eq!(kept.len(), stale_pods);
    assert_eq!(stale, 2 * stale_pods, "config volume and its subPath");

    // One Secret referenced by 10,000 pods changes.
    let mut g = Gen { ix };
    let hot = g.source(
        SourceKind::Secret,
        "hot",
        "hot-secret",
        &["tls.crt", "tls.key"],
        1,
    );
    ix = g.ix;
    let later = now + SignedDuration::from_secs(5);
    let t = Instant::now();
    let uids: Vec<PodUid> = ix
        .pods_referencing(&hot)
        .iter()
        .filter_map(|id| ix.pod(*id).map(|p| p.uid.clone()))
        .collect();
    let uid_refs: Vec<&PodUid> = uids.iter().collect();
    let inc = engine.evaluate_pods(&ix, &mut state, &uid_refs, later);
    let incremental = t.elapsed();
    let propagating = inc
        .iter()
        .filter(|(_, v)| v.state == State::Propagating)
        .count();
    println!(
        "incremental: 1 Secret referenced by {} pods changed; {} pods re-evaluated ({} verdicts, {} propagating) in {:.3} s",
        uids.len(),
        inc.pods.len(),
        inc.len(),
        propagating,
        incremental.as_secs_f64()
    );
    assert_eq!(uids.len(), hot_uids.len());
    assert_eq!(
        propagating,
        hot_uids.len(),
        "every hot volume now differs, inside grace"
    );
    println!("peak RSS (VmHWM): {}", vm("VmHWM:"));
    drop(inc);
    drop(kept);

    // Steady state: a full evaluation again, now with history.
    let t = Instant::now();
    let mut n = 0usize;
    engine.evaluate_all_each(&ix, &mut state, later, |p| n += p.verdicts.len());
    println!(
        "full evaluation with history: {} verdicts in {:.2} s; RSS {}",
        n,
        t.elapsed().as_secs_f64(),
        vm("VmRSS:")
    );

    // For comparison: the same evaluation collecting every verdict.
    let t = Instant::now();
    let all = engine.evaluate_all(&ix, &mut state, later);
    println!(
        "full evaluation collecting all {} verdicts: {:.2} s; RSS {} (peak {})",
        all.len(),
        t.elapsed().as_secs_f64(),
        vm("VmRSS:"),
        vm("VmHWM:")
    );
}
