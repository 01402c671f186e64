//! `mountguard-controller wait` (and `kubectl mountguard wait`): polls
//! `GET /v1/rollouts/{kind}/{namespace}/{name}` until the rollout gate's
//! decision ([`mountguard_core::rollout::decide`]) says every consumer is verified
//! for the current content, or the timeout passes.
//!
//! Exit codes: 0 complete; 1 timed out (what is missing is printed); 2 bad
//! input, or the controller unreachable (at the first request, or still at
//! the end; failures in between are retried). Progress goes to standard
//! error, the result to standard output. Fingerprints only.

use std::io::Write;
use std::time::Duration;

use clap::ValueEnum;
use serde::Serialize;

use crate::Error;
use crate::query::endpoint::{Endpoint, Limits};
use crate::query::status::StatusOutput;
use mountguard_core::rollout::{Progress, RolloutDoc, SourceItem, Target, decide};
use mountguard_inventory::table::write_aligned;

/// The condition `wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum WaitFor {
    /// Every consumer verified Fresh on its node for the current content.
    #[default]
    Fresh,
}

/// What to wait for and how (shared by `mountguard-controller wait` and
/// `kubectl mountguard wait`).
#[derive(Debug, Clone)]
pub struct WaitOptions {
    /// `secret/NAMESPACE/NAME`, `configmap/NAMESPACE/NAME`,
    /// `nodeset/NAMESPACE/NAME` or `pod/NAMESPACE/NAME`.
    pub target: Target,
    /// Condition.
    pub condition: WaitFor,
    /// Give up after this long (exit 1), e.g. `10m`.
    pub timeout: Duration,
    /// Time between two requests.
    pub interval: Duration,
    /// The UID the Secret or ConfigMap has now (after a delete and
    /// recreate): until the controller sees this object, the rollout is not
    /// complete.
    pub uid: Option<String>,
    /// Output format of the result.
    pub output: StatusOutput,
    /// Each request, connect to last byte, must end within this (and
    /// within `timeout`).
    pub request_timeout: Duration,
    /// Largest answer accepted, in bytes.
    pub max_response_size: u64,
}

/// The JSON result of `wait --output json`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct WaitResult<'a> {
    target: String,
    complete: bool,
    timed_out: bool,
    elapsed_seconds: u64,
    sources: &'a [SourceItem],
    #[serde(flatten)]
    progress: &'a Progress,
}

impl WaitOptions {
    /// Polls until complete (0) or timed out (1); `Err` (exit 2) when the
    /// controller cannot be reached.
    pub async fn run(
        self,
        endpoint: &Endpoint,
        out: &mut dyn Write,
        progress: &mut dyn Write,
    ) -> Result<u8, Error> {
        let WaitFor::Fresh = self.condition;
        let io = |e: std::io::Error| Error::Io {
            file: "<stdout>".into(),
            source: e,
        };
        let path = self.target.path();
        let start = tokio::time::Instant::now();
        let deadline = start + self.timeout;
        let mut reached = false;
        let mut last: Option<(RolloutDoc, Progress)> = None;
        let mut last_err: Option<Error> = None;
        let mut last_line = String::new();
        loop {
            // No request outlives the timeout: a controller that accepts and
            // does not answer ends the wait at the deadline, not later.
            let limits = Limits {
                deadline,
                budget: self.timeout,
                flag: "--timeout",
                max_bytes: self.max_response_size,
            }
            .min(Limits::from_now(
                self.request_timeout,
                "--request-timeout",
                self.max_response_size,
            ));
            match endpoint.get_json::<RolloutDoc>(&path, &limits).await {
                Ok(doc) => {
                    reached = true;
                    last_err.take();
                    let p = decide(&doc, &self.target, self.uid.as_deref());
                    let elapsed = start.elapsed().as_secs();
                    if p.complete() {
                        self.write_result(&doc, &p, false, elapsed, out)
                            .map_err(io)?;
                        return Ok(0);
                    }
                    let line = progress_line(&p);
                    if line != last_line {
                        let _ = writeln!(progress, "[{elapsed}s] {}: {line}", self.target);
                        last_line = line;
                    }
                    last = Some((doc, p));
                }
                Err(e) if !reached => return Err(e),
                Err(e) => {
                    let _ = writeln!(progress, "request failed, retrying: {e}");
                    last_line.clear();
                    last_err = Some(e);
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            tokio::time::sleep(self.interval.min(deadline - now)).await;
            if tokio::time::Instant::now() >= deadline {
                // A request now would have no time left: the last answer
                // is the result.
                break;
            }
        }
        if let Some(e) = last_err {
            return Err(e);
        }
        let (doc, p) = last.expect("a document was received: reached is set");
        self.write_result(&doc, &p, true, start.elapsed().as_secs(), out)
            .map_err(io)?;
        Ok(1)
    }

    fn write_result(
        &self,
        doc: &RolloutDoc,
        p: &Progress,
        timed_out: bool,
        elapsed: u64,
        out: &mut dyn Write,
    ) -> std::io::Result<()> {
        match self.output {
            StatusOutput::Json => {
                let r = WaitResult {
                    target: self.target.to_string(),
                    complete: p.complete(),
                    timed_out,
                    elapsed_seconds: elapsed,
                    sources: &doc.sources,
                    progress: p,
                };
                serde_json::to_writer_pretty(&mut *out, &r)?;
                writeln!(out)
            }
            StatusOutput::Table => write_table(&self.target, doc, p, timed_out, elapsed, out),
        }
    }
}

/// One line of progress: how many are verified, and the first few that
/// are not, with why.
pub fn progress_line(p: &Progress) -> String {
    let mut s = format!("{} of {} consumers verified", p.verified, p.total);
    let mut waiting: Vec<String> = p.blockers.clone();
    for m in &p.missing {
        let mut w = format!(
            "{}/{} on {} {} is {}",
            m.namespace, m.pod, m.node, m.subject, m.state
        );
        if !m.pinned_by.is_empty() {
            w.push_str(&format!(" (pinned by {})", m.pinned_by.join(",")));
        }
        if let Some(a) = &m.attempt {
            w.push_str(&format!(" (remediation {a})"));
        }
        waiting.push(w);
    }
    const SHOWN: usize = 4;
    if !waiting.is_empty() {
        let more = waiting.len().saturating_sub(SHOWN);
        waiting.truncate(SHOWN);
        s.push_str("; waiting for: ");
        s.push_str(&waiting.join("; "));
        if more > 0 {
            s.push_str(&format!("; and {more} more"));
        }
    }
    s
}

/// The result as text: a summary, and on failure one row per missing
/// consumer and the blocking reasons.
pub fn write_table(
    target: &Target,
    doc: &RolloutDoc,
    p: &Progress,
    timed_out: bool,
    elapsed: u64,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let fps: Vec<String> = doc
        .sources
        .iter()
        .map(|s| {
            format!(
                "{} {}/{} {}",
                s.kind,
                s.namespace,
                s.name,
                s.fingerprint.as_deref().unwrap_or("(absent)")
            )
        })
        .collect();
    let fps = if fps.is_empty() {
        String::new()
    } else {
        format!(" (current content: {})", fps.join(", "))
    };
    if p.complete() {
        return writeln!(
            out,
            "{target}: {} of {} consumers verified fresh on their nodes{fps}",
            p.verified, p.total
        );
    }
    writeln!(
        out,
        "{target}: {}after {elapsed}s, {} of {} consumers verified{fps}",
        if timed_out { "timed out " } else { "" },
        p.verified,
        p.total
    )?;
    if !p.missing.is_empty() {
        let mut rows: Vec<[String; 7]> = vec![[
            "POD".into(),
            "NODE".into(),
            "SUBJECT".into(),
            "STATE".into(),
            "PINNED BY".into(),
            "ATTEMPT".into(),
            "WHY".into(),
        ]];
        for m in &p.missing {
            rows.push([
                format!("{}/{}", m.namespace, m.pod),
                m.node.clone(),
                m.subject.clone(),
                m.state.clone(),
                if m.pinned_by.is_empty() {
                    "-".into()
                } else {
                    m.pinned_by.join(",")
                },
                m.attempt.clone().unwrap_or_else(|| "-".into()),
                m.why.clone(),
            ]);
        }
        write_aligned(&rows, out)?;
    }
    for b in &p.blockers {
        writeln!(out, "  {b}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use mountguard_core::rollout::Missing;

    #[test]
    fn timeout_table_names_node_state_pin_and_attempt() {
        let target: Target = "secret/slurm/slurm-auth-slurm".parse().unwrap();
        let doc = RolloutDoc {
            acting: true,
            ready: true,
            target: target.to_string(),
            sources: vec![SourceItem {
                kind: "Secret".into(),
                namespace: "slurm".into(),
                name: "slurm-auth-slurm".into(),
                present: true,
                fingerprint: Some("aaaaaaaaaaaa".into()),
                uid: Some("u2".into()),
                changed_at: None,
            }],
            consumers: vec![],
            attempts: vec![],
            unscheduled: vec![],
        };
        let p = Progress {
            total: 2,
            verified: 1,
            missing: vec![Missing {
                namespace: "slurm".into(),
                pod: "slurm-worker-1".into(),
                node: "node-b".into(),
                subject: "volume slurm-auth".into(),
                state: "Stale/ImmutableCachePinned".into(),
                why: "Stale/ImmutableCachePinned".into(),
                pinned_by: vec!["monitor-b".into()],
                attempt: Some("a1 Failed".into()),
            }],
            blockers: vec![],
        };
        let mut out = Vec::new();
        write_table(&target, &doc, &p, true, 30, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("secret/slurm/slurm-auth-slurm: timed out after 30s, 1 of 2"),
            "{text}"
        );
        let row = text.lines().find(|l| l.contains("slurm-worker-1")).unwrap();
        for part in [
            "node-b",
            "Stale/ImmutableCachePinned",
            "monitor-b",
            "a1 Failed",
        ] {
            assert!(row.contains(part), "{part} missing: {text}");
        }
        assert!(
            text.contains("Secret slurm/slurm-auth-slurm aaaaaaaaaaaa"),
            "{text}"
        );
        let line = progress_line(&p);
        assert_eq!(
            line,
            "1 of 2 consumers verified; waiting for: slurm/slurm-worker-1 on node-b volume slurm-auth \
             is Stale/ImmutableCachePinned (pinned by monitor-b) (remediation a1 Failed)"
        );
        let done = Progress {
            total: 2,
            verified: 2,
            ..Default::default()
        };
        let mut out = Vec::new();
        write_table(&target, &doc, &done, false, 3, &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "secret/slurm/slurm-auth-slurm: 2 of 2 consumers verified fresh on their nodes \
             (current content: Secret slurm/slurm-auth-slurm aaaaaaaaaaaa)\n"
        );
    }
}
