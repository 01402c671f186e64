//! Prometheus from Debian's package (`prometheus`), started by the rig on
//! loopback with a scrape configuration for the given targets (pod
//! addresses on the rig's bridge) and a rule file; read through its HTTP
//! API (`/api/v1/alerts`, `/api/v1/query`).
//!
//! The chart's alert rules group by the `namespace` target label, which
//! prometheus-operator adds to every target of a ServiceMonitor or
//! PodMonitor (its generated `relabel_configs` set `namespace` from
//! `__meta_kubernetes_namespace`); a plain Prometheus has no such label,
//! so each static target here carries `namespace`, `pod` and `node`
//! labels as the operator's relabelling would.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::mountguard::{ChildGuard, free_addr, http_get, poll};

/// A scrape target: job name, `host:port`, extra target labels, and
/// whether the scraped series keep their own labels where they clash with
/// the target's (`honor_labels`; a ServiceMonitor's `honorLabels`).
#[derive(Debug, Clone)]
pub struct Target {
    pub job: String,
    pub addr: String,
    pub labels: Vec<(String, String)>,
    pub honor_labels: bool,
}

/// A running Prometheus.
#[derive(Debug)]
pub struct Prometheus {
    child: ChildGuard,
    url: String,
    dir: PathBuf,
    /// The jobs, in the order of their target files (`targets-<i>.json`).
    jobs: Vec<String>,
}

/// Writes the file-based service discovery file of `t` (`file_sd_configs`):
/// one group, its address and labels, replaced whole by a rename so that
/// Prometheus never reads half a file.
fn write_targets(path: &Path, t: &Target) -> io::Result<()> {
    let labels: serde_json::Map<String, serde_json::Value> = t
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone())))
        .collect();
    let doc = serde_json::json!([{"targets": [t.addr], "labels": labels}]);
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, doc.to_string())?;
    std::fs::rename(&tmp, path)
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

impl Prometheus {
    /// Starts `prometheus` in `dir` (2 s scrape and evaluation
    /// intervals) with `rules` (a rule file's YAML); waits until ready.
    pub async fn start(
        dir: &Path,
        log: &Path,
        targets: &[Target],
        rules: &str,
    ) -> io::Result<Self> {
        let bin = which("prometheus").ok_or_else(|| {
            io::Error::other("prometheus not found on PATH (Debian package prometheus)")
        })?;
        std::fs::create_dir_all(dir.join("data"))?;
        std::fs::write(dir.join("rules.yaml"), rules)?;
        let mut scrape = String::new();
        for (i, t) in targets.iter().enumerate() {
            let file = dir.join(format!("targets-{i}.json"));
            write_targets(&file, t)?;
            scrape.push_str(&format!(
                "  - job_name: {job}\n    honor_labels: {honor}\n    file_sd_configs:\n      - files: [{file}]\n        refresh_interval: 2s\n",
                job = serde_json::to_string(&t.job).unwrap_or_default(),
                honor = t.honor_labels,
                file = serde_json::to_string(&file.to_string_lossy()).unwrap_or_default(),
            ));
        }
        let config = format!(
            "global:\n  scrape_interval: 2s\n  scrape_timeout: 1s\n  evaluation_interval: 2s\nrule_files:\n  - {}\nscrape_configs:\n{scrape}",
            dir.join("rules.yaml").display()
        );
        std::fs::write(dir.join("prometheus.yml"), &config)?;
        let addr = free_addr()?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!(
            "--config.file={}",
            dir.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .current_dir(dir);
        let mut child = ChildGuard::spawn("prometheus", cmd, log)?;
        let url = format!("http://{addr}");
        let ready = format!("{url}/-/ready");
        let r = poll("Prometheus to be ready", Duration::from_secs(60), || {
            let ready = ready.clone();
            let exited = child.exited();
            async move {
                if exited.is_some() {
                    return Some(false);
                }
                http_get(&ready).await.ok().map(|_| true)
            }
        })
        .await;
        if !matches!(r, Ok(true)) {
            return Err(io::Error::other(format!(
                "Prometheus did not become ready ({r:?}):\n{}",
                child.log_tail(20)
            )));
        }
        Ok(Self {
            child,
            url,
            dir: dir.to_path_buf(),
            jobs: targets.iter().map(|t| t.job.clone()).collect(),
        })
    }

    /// Points job `t.job` at `t`'s address and labels (a new controller pod
    /// after `helm upgrade`, as a ServiceMonitor's endpoints follow it);
    /// Prometheus reads the file again within its 2 s refresh.
    pub fn retarget(&self, t: &Target) -> io::Result<()> {
        let i = self
            .jobs
            .iter()
            .position(|j| *j == t.job)
            .ok_or_else(|| io::Error::other(format!("no job {} to retarget", t.job)))?;
        write_targets(&self.dir.join(format!("targets-{i}.json")), t)
    }

    /// Its base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The directory of its configuration and data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `GET /api/v1/<path>`'s `data`.
    pub async fn api(&self, path: &str) -> io::Result<Value> {
        let body = http_get(&format!("{}/api/v1/{path}", self.url)).await?;
        let v: Value = serde_json::from_str(&body).map_err(io::Error::other)?;
        if v["status"] != "success" {
            return Err(io::Error::other(format!("/api/v1/{path}: {body}")));
        }
        Ok(v["data"].clone())
    }

    /// The alerts (`/api/v1/alerts`): `(alertname, state, labels)`.
    pub async fn alerts(&self) -> io::Result<Vec<(String, String, Value)>> {
        let data = self.api("alerts").await?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| {
                (
                    a["labels"]["alertname"].as_str().unwrap_or("").to_string(),
                    a["state"].as_str().unwrap_or("").to_string(),
                    a["labels"].clone(),
                )
            })
            .collect())
    }

    /// An instant query's result vector (`/api/v1/query?query=`).
    pub async fn query(&self, q: &str) -> io::Result<Vec<Value>> {
        let enc: String = q
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                    (b as char).to_string()
                }
                _ => format!("%{b:02X}"),
            })
            .collect();
        let data = self.api(&format!("query?query={enc}")).await?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The rule groups' health (`/api/v1/rules`): `(rule name, health)`.
    pub async fn rule_health(&self) -> io::Result<Vec<(String, String)>> {
        let data = self.api("rules").await?;
        Ok(data["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                (
                    r["name"].as_str().unwrap_or("").to_string(),
                    r["health"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect())
    }

    /// Waits (up to `timeout`) until job `job` was scraped up once.
    pub async fn wait_scraped(&self, job: &str, timeout: Duration) -> io::Result<()> {
        let q = format!(
            "up{{job={}}} == 1",
            serde_json::to_string(job).unwrap_or_default()
        );
        poll(&format!("Prometheus scraping {job}"), timeout, || async {
            let r = self.query(&q).await.ok()?;
            (!r.is_empty()).then_some(())
        })
        .await
    }

    /// The end of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.child.log_tail(lines)
    }
}
