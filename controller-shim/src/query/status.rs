//! `mountguard-controller status` (and `kubectl mountguard status`): asks
//! the status API for its verdicts and prints them as JSON or a table.

use std::io::Write;

use clap::ValueEnum;
use mountguard_inventory::table::write_aligned;

use crate::Error;
use crate::api::store::{AttemptItem, StatusDoc};
use crate::query::endpoint::{Endpoint, Limits};

/// Output formats of `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusOutput {
    /// A table.
    Table,
    /// The endpoint's JSON.
    Json,
}

/// Filters and output of `status` (shared by `mountguard-controller status`
/// and `kubectl mountguard status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusQuery {
    /// Only this namespace.
    pub namespace: Option<String>,
    /// Only this node.
    pub node: Option<String>,
    /// Only this state (`Stale`) or tag (`Stale/ImmutableCachePinned`).
    pub state: Option<String>,
    /// Include Fresh and Skipped verdicts.
    pub all: bool,
    /// Output format.
    pub output: StatusOutput,
    /// The request, connect to last byte, must end within this.
    pub request_timeout: std::time::Duration,
    /// Largest answer accepted, in bytes.
    pub max_response_size: u64,
}

impl StatusQuery {
    /// The request path and query.
    pub fn path(&self) -> String {
        let mut q = Vec::new();
        if self.all {
            q.push("all=1".to_string());
        }
        for (k, v) in [
            ("namespace", &self.namespace),
            ("node", &self.node),
            ("state", &self.state),
        ] {
            if let Some(v) = v {
                q.push(format!("{k}={}", encode(v)));
            }
        }
        if q.is_empty() {
            "/v1/verdicts".into()
        } else {
            format!("/v1/verdicts?{}", q.join("&"))
        }
    }

    /// Fetches the document and prints it; returns the exit code (0 when
    /// no verdict needs attention, 1 otherwise).
    pub async fn run(self, endpoint: &Endpoint, out: &mut dyn Write) -> Result<u8, Error> {
        let limits = Limits::from_now(
            self.request_timeout,
            "--request-timeout",
            self.max_response_size,
        );
        let doc: StatusDoc = endpoint.get_json(&self.path(), &limits).await?;
        let io = |e: std::io::Error| Error::Io {
            file: "<stdout>".into(),
            source: e,
        };
        match self.output {
            StatusOutput::Json => {
                serde_json::to_writer_pretty(&mut *out, &doc).map_err(|e| io(e.into()))?;
                writeln!(out).map_err(io)?;
            }
            StatusOutput::Table => write_table(&doc, out).map_err(io)?,
        }
        let attention = doc
            .verdicts
            .iter()
            .any(|v| !matches!(v.state.as_str(), "Fresh" | "Skipped"))
            || doc.attempts.iter().any(|a| a.open);
        Ok(u8::from(attention))
    }
}

fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prints the document as a table: one row per verdict, notes, a summary.
pub fn write_table(doc: &StatusDoc, out: &mut dyn Write) -> std::io::Result<()> {
    if !doc.acting {
        writeln!(
            out,
            "note: this replica is not the acting controller; ask the leader (label mountguard.io/leader=true)"
        )?;
    } else if !doc.ready {
        writeln!(
            out,
            "note: the controller is still loading the cluster state"
        )?;
    }
    let mut rows: Vec<[String; 7]> = vec![[
        "STATE".into(),
        "CAUSE".into(),
        "POD".into(),
        "NODE".into(),
        "SUBJECT".into(),
        "SOURCE".into(),
        "MOUNTED/CURRENT".into(),
    ]];
    let mut notes = Vec::new();
    for v in &doc.verdicts {
        let mut cause = v.cause.clone().unwrap_or_default();
        if !v.pinned_by.is_empty() {
            cause.push_str(&format!(" (pinned by {})", v.pinned_by.join(",")));
        }
        // What Slurm shows beside it (the advice note says it in full).
        if let Some(s) = &v.slurm {
            use mountguard_core::remediation::slurm_view::SlurmFinding as F;
            cause.push_str(match s.finding {
                F::NotRegistered => " (Slurm: not registered)",
                F::Registered => " (Slurm: registered)",
                F::UnknownNode => " (Slurm: unknown node)",
                F::NotRead => " (Slurm: not read)",
            });
        }
        rows.push([
            v.state.clone(),
            cause,
            format!("{}/{}", v.namespace, v.pod),
            v.node.clone().unwrap_or_else(|| "-".into()),
            v.subject.clone(),
            v.sources.join(","),
            format!(
                "{} vs {}",
                v.observed.as_deref().unwrap_or("-"),
                v.expected.as_deref().unwrap_or("-")
            ),
        ]);
        if let Some(m) = &v.message {
            notes.push(format!(
                "{}/{} {}: {m} (since {})",
                v.namespace, v.pod, v.subject, v.since
            ));
        }
        if let Some(a) = &v.advice {
            notes.push(format!("{}/{} {}: {a}", v.namespace, v.pod, v.subject));
        }
    }
    if rows.len() == 1 {
        writeln!(out, "no verdict needs attention")?;
    } else {
        write_aligned(&rows, out)?;
    }
    for n in notes {
        writeln!(out, "  {n}")?;
    }
    write_attempts(&doc.attempts, out)?;
    let summary: Vec<String> = doc
        .by_state
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    writeln!(
        out,
        "verdicts: {}",
        if summary.is_empty() {
            "none".into()
        } else {
            summary.join(" ")
        }
    )?;
    Ok(())
}

/// Prints the remediation attempts (nothing when there are none).
fn write_attempts(attempts: &[AttemptItem], out: &mut dyn Write) -> std::io::Result<()> {
    if attempts.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(out, "remediation attempts:")?;
    let mut rows: Vec<[String; 7]> = vec![[
        "ATTEMPT".into(),
        "POD".into(),
        "OWNER".into(),
        "SLURM NODE".into(),
        "PHASE".into(),
        "SINCE".into(),
        "DETAIL".into(),
    ]];
    for a in attempts {
        let mut phase = a.phase.clone();
        if a.kept_drained {
            phase.push_str(" (kept drained)");
        } else if a.open && a.phase == "Failed" {
            phase.push_str(" (releasing drain)");
        }
        let detail = a
            .failure
            .clone()
            .or_else(|| a.last_error.clone().map(|e| format!("retrying: {e}")))
            .unwrap_or_else(|| a.phases.join(" > "));
        // A workload's attempt: its replacement and the node it landed on.
        let owner = match &a.workload {
            Some(w) => w.clone(),
            None => format!("NodeSet {}", a.nodeset),
        };
        let detail = match (&a.new_pod, &a.new_pod_node) {
            (Some(p), Some(n)) if a.workload.is_some() => {
                format!("{detail} (replacement {p} on {n})")
            }
            _ => detail,
        };
        rows.push([
            a.id.clone(),
            format!("{}/{}", a.namespace, a.pod),
            owner,
            if a.slurm_node.is_empty() {
                "-".into()
            } else {
                a.slurm_node.clone()
            },
            phase,
            a.since.clone(),
            detail,
        ]);
    }
    write_aligned(&rows, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::store::*;
    use mountguard_core::testkit::*;
    use mountguard_core::verdict::present::{PodCheck, event_message};
    use mountguard_core::{ClusterIndex, SourceKind};

    #[test]
    fn query_filters_and_table() {
        let mut ix = ClusterIndex::new();
        put_config_map(
            &mut ix,
            "ns",
            "cm",
            &[("a", b"new")],
            &[],
            Some(ts("2026-11-30T09:00:00Z")),
        );
        let pod = PodB::new("ns", "p1", "u1", "n1")
            .volume(
                "cfg",
                mountguard_core::model::VolumeSource::Object(obj(
                    SourceKind::ConfigMap,
                    "cm",
                    &[],
                    false,
                )),
            )
            .build();
        ix.apply_pod(pod);
        let pod2 = PodB::new("other", "p2", "u2", "n2").build();
        ix.apply_pod(pod2);
        NodeB::new("n1", ts("2026-11-30T10:00:00Z"))
            .volume(
                "u1",
                inventory_plugin(),
                "cfg",
                &[("a", b"old")],
                ts("2026-11-30T09:59:00Z"),
            )
            .apply(&mut ix);
        let store = VerdictStore::evaluated(&ix);
        let doc = store.document(&Query::parse(Some("")), true, true);
        assert_eq!(doc.verdicts.len(), 1, "{doc:?}");
        assert_eq!(doc.verdicts[0].state, "Stale");
        assert_eq!(doc.verdicts[0].subject, "volume cfg");
        assert_eq!(doc.verdicts[0].sources, vec!["ConfigMap/cm".to_string()]);
        let fp = doc.verdicts[0].expected.clone().unwrap();
        assert_eq!(fp.len(), 12, "fingerprints only");
        assert!(
            store
                .document(&Query::parse(Some("namespace=other")), true, true)
                .verdicts
                .is_empty()
        );
        assert!(
            store
                .document(&Query::parse(Some("node=n2")), true, true)
                .verdicts
                .is_empty()
        );
        assert_eq!(
            store
                .document(&Query::parse(Some("state=Stale%2FUnknown")), true, true)
                .verdicts
                .len(),
            1
        );
        assert!(
            store
                .document(&Query::parse(Some("state=Frozen")), true, true)
                .verdicts
                .is_empty()
        );
        let mut out = Vec::new();
        write_table(&doc, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("Stale  Unknown"), "{text}");
        // The advice (issue 31 §2): in the item, the table and the Event.
        let advice = doc.verdicts[0].advice.clone().unwrap();
        assert!(advice.starts_with("Replace the pod"), "{advice}");
        assert!(
            text.contains(&format!("ns/p1 volume cfg: {advice}")),
            "{text}"
        );
        let p = &store.pods["u1"];
        let note = event_message(&p.pv, &p.pv.verdicts[0], &PodCheck::default(), None);
        assert!(note.ends_with(&advice), "{note}");
        assert!(text.contains("ns/p1"), "{text}");
        assert!(text.contains("verdicts: Stale/Unknown=1"), "{text}");
        // JSON round trip for the status command.
        let back: StatusDoc = serde_json::from_slice(&serde_json::to_vec(&doc).unwrap()).unwrap();
        assert_eq!(back, doc);
        let args = StatusQuery {
            namespace: Some("a b".into()),
            node: None,
            state: Some("Stale/ImmutableCache".into()),
            all: true,
            output: StatusOutput::Json,
            request_timeout: std::time::Duration::from_secs(1),
            max_response_size: 1,
        };
        assert_eq!(
            args.path(),
            "/v1/verdicts?all=1&namespace=a%20b&state=Stale%2FImmutableCache"
        );
        assert_eq!(
            Query::parse(Some("namespace=a%20b")).namespace.as_deref(),
            Some("a b")
        );
    }

    #[test]
    fn attempts_are_listed_open_first_filtered_and_printed() {
        use mountguard_core::remediation::{Attempt, Phase};
        let t0: jiff::Timestamp = "2026-11-30T10:00:00Z".parse().unwrap();
        let mk = |id: &str, ns: &str, pod: &str, node: &str, phase: Phase, min: i64| {
            let mut a = Attempt::new(
                id.into(),
                ns,
                "worker",
                pod,
                "uid",
                node,
                pod,
                vec![],
                t0 + jiff::SignedDuration::from_mins(min),
            );
            a.phase = phase;
            a
        };
        let done = mk("aaa", "slurm", "worker-0", "node-a", Phase::Succeeded, 0);
        let mut failed = mk(
            "bbb",
            "slurm",
            "worker-1",
            "node-b",
            Phase::Failed(mountguard_core::remediation::FailReason::ReplacementStale),
            1,
        );
        failed.kept_drained = true;
        failed.failure = Some("ReplacementStale: volume slurm-etc still stale".into());
        let mut running = mk("ccc", "slurm", "worker-2", "node-c", Phase::Evicting, 2);
        running.retry.last_error = Some("eviction refused: PDB".into());
        let other_ns = mk("ddd", "hpc", "gpu-0", "node-a", Phase::Drained, 3);
        let store = VerdictStore {
            attempts: [&done, &failed, &running, &other_ns]
                .iter()
                .map(|a| AttemptItem::from_attempt(a))
                .collect(),
            ..Default::default()
        };
        let doc = store.document(&Query::parse(Some("namespace=slurm")), true, true);
        let ids: Vec<&str> = doc.attempts.iter().map(|a| a.id.as_str()).collect();
        // Open first (newest first), then closed.
        assert_eq!(ids, ["ccc", "bbb", "aaa"]);
        assert!(doc.attempts[1].open && doc.attempts[1].kept_drained);
        assert!(!doc.attempts[2].open);
        let doc = store.document(&Query::parse(Some("node=node-a")), true, true);
        let ids: Vec<&str> = doc.attempts.iter().map(|a| a.id.as_str()).collect();
        assert_eq!(ids, ["ddd", "aaa"]);

        let doc = store.document(&Query::parse(Some("namespace=slurm")), true, true);
        let mut out = Vec::new();
        write_table(&doc, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("remediation attempts:"), "{text}");
        let line = |id: &str| {
            text.lines()
                .find(|l| l.starts_with(id))
                .unwrap_or("")
                .to_string()
        };
        assert!(
            line("ccc").contains("Evicting")
                && line("ccc").contains("retrying: eviction refused: PDB"),
            "{text}"
        );
        assert!(
            line("bbb").contains("Failed (kept drained)")
                && line("bbb").contains("ReplacementStale"),
            "{text}"
        );
        assert!(line("aaa").contains("Succeeded"), "{text}");
        assert!(line("aaa").contains("NodeSet worker"), "{text}");
        // A workload's attempt: its owner, no Slurm node, its replacement.
        let mut w = Attempt::for_workload(
            "eee".into(),
            "shop",
            mountguard_core::remediation::workload::WorkloadRef {
                kind: mountguard_core::remediation::workload::WorkloadKind::Deployment,
                name: "web".into(),
            },
            "web-7d9f-a",
            "uid",
            "node-a",
            vec![],
            t0,
        );
        w.phase = Phase::Verifying;
        w.new_pod_uid = Some("uid-2".into());
        w.new_pod_name = Some("web-7d9f-z".into());
        w.new_pod_node = Some("node-c".into());
        let item = AttemptItem::from_attempt(&w);
        assert_eq!(item.workload.as_deref(), Some("Deployment web"));
        assert_eq!(item.new_pod.as_deref(), Some("web-7d9f-z"));
        let store = VerdictStore {
            attempts: vec![item],
            ..Default::default()
        };
        let mut out = Vec::new();
        write_table(&store.document(&Query::default(), true, true), &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let row = text.lines().find(|l| l.starts_with("eee")).unwrap_or("");
        assert!(
            row.contains("Deployment web")
                && row.contains(" - ")
                && row.contains("(replacement web-7d9f-z on node-c)"),
            "{text}"
        );
        // No attempts: no section, and the JSON omits the field.
        let empty = VerdictStore::default().document(&Query::default(), true, true);
        let mut out = Vec::new();
        write_table(&empty, &mut out).unwrap();
        assert!(!String::from_utf8(out).unwrap().contains("remediation"));
        assert!(
            serde_json::to_value(&empty)
                .unwrap()
                .get("attempts")
                .is_none()
        );
    }

    /// A stale worker's row says what Slurm shows, and its note the
    /// whole sentence after the advice.
    #[test]
    fn a_stale_workers_row_and_note_say_what_slurm_shows() {
        use mountguard_core::remediation::slurm_view::side;
        let s = side("w0", None, None);
        let item = StatusItem {
            namespace: "slurm".into(),
            pod: "w0".into(),
            node: Some("n1".into()),
            nodeset: Some("worker".into()),
            subject: "volume slurm-etc".into(),
            state: "Stale".into(),
            cause: Some("ImmutableCache".into()),
            sources: vec!["Secret/auth".into()],
            expected: None,
            observed: None,
            pinned_by: vec![],
            source_content: vec![],
            verified_at: None,
            differing_paths: vec!["slurm.key".into()],
            since: "2026-11-30T10:00:00Z".into(),
            message: None,
            advice: Some(format!("Replace the pod. {}", s.message)),
            slurm: Some(s),
        };
        let doc = StatusDoc {
            acting: true,
            ready: true,
            by_state: Default::default(),
            verdicts: vec![item],
            attempts: vec![],
        };
        let mut out = Vec::new();
        write_table(&doc, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("ImmutableCache (Slurm: not read)")
                && text.contains(
                    "slurm/w0 volume slurm-etc: Replace the pod. Slurm not read yet (node w0)."
                ),
            "{text}"
        );
    }

    fn inventory_plugin() -> mountguard_inventory::Plugin {
        mountguard_inventory::Plugin::Configmap
    }
}
