//! Helpers of the tests that run mountguard against the real kubelet: pods
//! of the tests' own in the `slurm` namespace (whose default
//! ServiceAccount the harness waited for), the controller's verdicts
//! sampled over time, bytes read from the kubelet's root independently of
//! the agent.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use mountguard_inventory::NodeInventory;
use mountguard_tests::cluster::SLURM_NAMESPACE;
use mountguard_tests::mountguard::binary;
use mountguard_tests::real::raw;
use mountguard_tests::scenario::{find_verdict, state_tag};
use serde_json::Value;

use crate::harness::{RealSystem, wait};

/// Node `i` of a system on real kubelets: where a scenario body runs. The
/// objects and pods a body creates carry the node's index in their names,
/// so bodies running at once on several nodes of one cluster never meet.
#[derive(Clone, Copy)]
pub struct On<'a> {
    pub sys: &'a RealSystem,
    pub i: usize,
}

impl On<'_> {
    /// The node's name.
    pub fn node(&self) -> String {
        format!("node-{}", self.i)
    }

    /// `base` made this node's: `<base>-<i>`.
    pub fn name(&self, base: &str) -> String {
        format!("{base}-{}", self.i)
    }

    /// The kubelet's root directory.
    pub fn root(&self) -> &Path {
        self.sys.kubelets[self.i].root()
    }
}

pub fn b64(b: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// Waits until pod `name` of `SLURM_NAMESPACE` runs (not terminating);
/// returns the pod.
pub async fn running_pod(sys: &RealSystem, name: &str) -> Value {
    let client = sys.client.clone();
    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/pods/{name}");
    wait(
        sys,
        &format!("pod {name} to run on the real kubelet"),
        Duration::from_secs(90),
        || {
            let client = client.clone();
            let path = path.clone();
            async move {
                let (_, p) = raw(&client, "GET", &path, None).await.ok()?;
                (p["status"]["phase"] == "Running"
                    && p["metadata"]["deletionTimestamp"].is_null()
                    && p["metadata"]["uid"].is_string())
                .then_some(p)
            }
        },
    )
    .await
}

/// Merge-patches `data` of Secret or ConfigMap `name` (plural `secrets`
/// or `configmaps`) in `SLURM_NAMESPACE`.
pub async fn patch_data(sys: &RealSystem, plural: &str, name: &str, data: Value) {
    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/{plural}/{name}");
    let (code, body) = raw(
        &sys.client,
        "PATCH",
        &path,
        Some(&serde_json::json!({ "data": data })),
    )
    .await
    .unwrap();
    assert_eq!(code, 200, "PATCH {path}: {body}");
}

/// The kubelet-written path of a file of pod `uid`'s volume on node `i`.
pub fn volume_file(sys: &RealSystem, i: usize, uid: &str, plugin: &str, rel: &str) -> PathBuf {
    sys.kubelets[i]
        .root()
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(format!("kubernetes.io~{plugin}"))
        .join(rel)
}

/// One look at one subject: the controller's verdict (`State` or
/// `State/Cause`, the expected and observed fingerprints) when it was
/// sampled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub at: Duration,
    pub tag: String,
    pub expected: String,
    pub observed: String,
}

/// Samples `subjects` of pod `pod` from the controller's `/v1/verdicts`
/// every 200 ms from `start` until `done` holds for the latest samples
/// (every subject sampled), or panics after `timeout` with what was seen.
/// `probe` runs right after each sample (e.g. reads the bytes on disk) and
/// its value is kept with it. Returns, per subject, every sample, and the
/// probes.
pub async fn sample_until<P>(
    sys: &RealSystem,
    pod: &str,
    subjects: &[&str],
    start: Instant,
    timeout: Duration,
    mut probe: impl FnMut() -> P,
    mut done: impl FnMut(&[Sample], &P) -> bool,
) -> (Vec<Vec<Sample>>, Vec<(Duration, P)>) {
    let base = sys.metrics_base();
    let mut seen: Vec<Vec<Sample>> = vec![Vec::new(); subjects.len()];
    let mut probes = Vec::new();
    loop {
        let at = start.elapsed();
        if let Ok(doc) = mountguard_tests::scenario::verdicts(&base, "all=1").await {
            let latest: Option<Vec<Sample>> = subjects
                .iter()
                .map(|s| {
                    find_verdict(&doc, pod, s).map(|v| Sample {
                        at,
                        tag: state_tag(v),
                        expected: v["expected"].as_str().unwrap_or("").to_string(),
                        observed: v["observed"].as_str().unwrap_or("").to_string(),
                    })
                })
                .collect();
            let p = probe();
            if let Some(latest) = latest {
                for (i, s) in latest.iter().enumerate() {
                    seen[i].push(s.clone());
                }
                let finished = done(&latest, &p);
                probes.push((at, p));
                if finished {
                    return (seen, probes);
                }
            }
        }
        if start.elapsed() > timeout {
            let text: Vec<String> = subjects
                .iter()
                .zip(&seen)
                .map(|(s, v)| format!("{s}: {}", compress(v).join(" -> ")))
                .collect();
            panic!(
                "{pod}: not done after {timeout:?}; seen:\n{}\n{}",
                text.join("\n"),
                sys.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fails when any of `subject`'s samples was Stale.
pub fn no_stale(subject: &str, samples: &[Sample]) {
    assert!(
        samples.iter().all(|s| !s.tag.starts_with("Stale")),
        "{subject} was Stale: {}",
        compress(samples).join(" -> ")
    );
}

/// The distinct consecutive `(tag, expected)` of a subject's samples, as
/// `Tag[expected]@first seen`.
pub fn compress(samples: &[Sample]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut last: Option<(&str, &str)> = None;
    for s in samples {
        let key = (s.tag.as_str(), s.expected.as_str());
        if last != Some(key) {
            out.push(format!(
                "{}[{}]@{:.1}s",
                s.tag,
                s.expected,
                s.at.as_secs_f64()
            ));
            last = Some(key);
        }
    }
    out
}

/// The distinct consecutive `(tag, expected)` pairs of a subject's samples.
pub fn phases(samples: &[Sample]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for s in samples {
        let key = (s.tag.clone(), s.expected.clone());
        if out.last() != Some(&key) {
            out.push(key);
        }
    }
    out
}

/// `mountguard-agent scan --output json` of kubelet root `root`, in the
/// mount namespace of process `ns_pid` when given (through `nsenter`).
pub fn agent_scan(root: &Path, node: &str, ns_pid: Option<u32>) -> NodeInventory {
    let agent = binary("mountguard-agent").unwrap();
    let mut cmd = match ns_pid {
        Some(pid) => {
            let mut c = Command::new("nsenter");
            c.arg(format!("--target={pid}"))
                .arg("--mount")
                .arg("--")
                .arg(agent);
            c
        }
        None => Command::new(agent),
    };
    let out = cmd
        .arg("scan")
        .arg("--kubelet-root")
        .arg(root)
        .args(["--node", node, "--output", "json"])
        .env_remove("MOUNTGUARD_OUTPUT")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "mountguard-agent scan: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    NodeInventory::from_json(&out.stdout).unwrap()
}
