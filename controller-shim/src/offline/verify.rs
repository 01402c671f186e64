//! `mountguard-controller verify`: the engine run offline on a `kubectl get
//! pods,secrets,configmaps -A -o json` dump and agent inventories.
//!
//! Exit codes: 0 all fine, 1 a verdict matched `--fail-on` (or, with
//! `--fail-on`, a subject could not be verified: the gate fails closed
//! unless `--allow-unverifiable`), 2 bad input (no `--inventory` without
//! `--spec-only` among it).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::PathBuf;

use clap::ValueEnum;
use jiff::{SignedDuration, Timestamp};
use mountguard_inventory::NodeInventory;
use serde::Serialize;

use crate::Error;
use crate::offline::load::{Loaded, load_objects, parse_inventories, read_input};
use mountguard_core::fingerprint::Fingerprinter;
use mountguard_core::model::ObservedNode;
use mountguard_core::verdict::{Config, Engine, EngineState, Evaluation, State, VerdictView};

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One row per verdict that needs attention, then a summary.
    Table,
    /// Every verdict and a summary, as JSON.
    Json,
}

/// Which verdicts make the command exit 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FailOn {
    /// Any Stale verdict.
    Stale,
    /// Any Frozen verdict.
    Frozen,
    /// Any verdict other than Fresh and Skipped.
    Any,
}

impl FailOn {
    fn matches(self, s: &State) -> bool {
        match self {
            FailOn::Stale => matches!(s, State::Stale(_)),
            FailOn::Frozen => matches!(s, State::Frozen(_)),
            FailOn::Any => !matches!(s, State::Fresh | State::Skipped(_)),
        }
    }
}

/// What `verify` judges and how (from its flags).
#[derive(Debug, Clone, PartialEq)]
pub struct Verify {
    /// JSON of `kubectl get pods,secrets,configmaps -A -o json` (a v1 List,
    /// a typed list or a single object); several files allowed, `-` reads
    /// standard input.
    pub objects: Vec<PathBuf>,
    /// Agent inventories (`mountguard-agent scan --output json`), one node
    /// each (a JSON array of inventories is accepted too).
    pub inventory: Vec<PathBuf>,
    /// Evaluation time (RFC 3339); defaults to the current time.
    pub now: Option<Timestamp>,
    /// Grace period for propagation of changed content.
    pub grace: SignedDuration,
    /// Inventories scanned longer ago than this are too old to judge by.
    pub inventory_max_age: SignedDuration,
    /// Minimum number of mutable volume mounts on a node for the
    /// KubeletNotSyncing rule.
    pub not_syncing_min_mounts: u32,
    /// File holding the installation's fingerprint key (at least 16 bytes).
    /// Without it a one-off random key is used and fingerprints are only
    /// comparable within one run.
    pub fingerprint_key_file: Option<PathBuf>,
    /// Output format.
    pub output: Output,
    /// Exit 1 when a verdict matches.
    pub fail_on: Option<FailOn>,
    /// With `--fail-on`, Unverifiable subjects do not fail the gate.
    pub allow_unverifiable: bool,
    /// No inventories: judge only what the objects alone show; the
    /// subjects no inventory can vouch for (`Unverifiable/NoInventory`) do
    /// not fail the gate.
    pub spec_only: bool,
}

/// Whether `s` fails a `--fail-on f` gate. The gate fails closed: a subject
/// it cannot verify fails it like one it judged, unless the user allowed
/// that (`--allow-unverifiable`) or asked for the checks the objects alone
/// can make (`--spec-only`, for `Unverifiable/NoInventory`).
pub fn fails_gate(f: FailOn, s: &State, allow_unverifiable: bool, spec_only: bool) -> bool {
    use mountguard_core::verdict::UnverifiableReason;
    if f.matches(s) {
        return true;
    }
    match s {
        State::Unverifiable(UnverifiableReason::NoInventory) if spec_only => false,
        State::Unverifiable(_) => !allow_unverifiable,
        _ => false,
    }
}

/// `492` seconds as `8m12s`.
fn age_text(secs: i64) -> String {
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

/// Summary counts.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    /// Pods evaluated.
    pub pods: usize,
    /// Verdicts.
    pub verdicts: usize,
    /// Count per `State` or `State/Cause`.
    pub by_state: BTreeMap<String, usize>,
    /// Items of other kinds ignored.
    pub ignored_items: usize,
    /// Verdicts matching `--fail-on`.
    pub failing: usize,
}

#[derive(Serialize)]
struct JsonOut<'a> {
    verdicts: Vec<VerdictView<'a>>,
    summary: &'a Summary,
}

impl Verify {
    /// Runs the command; `now` is used when `--now` is absent and `random_key`
    /// when no key file is given. Returns the exit code.
    /// Notes on what the verdicts cannot vouch for go to `err`.
    pub fn run(
        self,
        now: Timestamp,
        random_key: [u8; 32],
        stdin: &mut dyn Read,
        out: &mut dyn Write,
        err: &mut dyn Write,
    ) -> Result<u8, Error> {
        let Self {
            objects,
            inventory,
            now: now_arg,
            grace,
            inventory_max_age,
            not_syncing_min_mounts,
            fingerprint_key_file,
            output,
            fail_on,
            allow_unverifiable,
            spec_only,
        } = self;
        if inventory.is_empty() && !spec_only {
            return Err(Error::Usage(
                "no --inventory: without the agents' scans nothing mounted on a node is \
                 verified and every mount would be Unverifiable/NoInventory. Pass the scans \
                 (`mountguard-agent scan --output json > NODE.json` on each node, then \
                 --inventory NODE.json,...), or --spec-only to check only what the objects \
                 alone show"
                    .into(),
            ));
        }
        let now = now_arg.unwrap_or(now);
        let key = match &fingerprint_key_file {
            Some(p) => read_input(p, stdin)?,
            None => random_key.to_vec(),
        };
        let fingerprinter = Fingerprinter::new(&key)?;
        drop(key);

        let mut loaded = Loaded::default();
        for path in &objects {
            let bytes = read_input(path, stdin)?;
            load_objects(&path.display().to_string(), &bytes, &mut loaded)?;
        }
        let mut by_node: BTreeMap<String, NodeInventory> = BTreeMap::new();
        let mut file_of: BTreeMap<String, String> = BTreeMap::new();
        for path in &inventory {
            let bytes = read_input(path, stdin)?;
            let file = path.display().to_string();
            for inv in parse_inventories(&file, &bytes)? {
                // Several scans of one node: the newest wins.
                match by_node.get(&inv.node) {
                    Some(old) if old.scanned_at >= inv.scanned_at => {}
                    _ => {
                        file_of.insert(inv.node.clone(), file.clone());
                        by_node.insert(inv.node.clone(), inv);
                    }
                }
            }
        }
        // An inventory past --inventory-max-age judges nothing: say so,
        // with its age and the flag that changes it.
        for (node, inv) in &by_node {
            let age = now.duration_since(inv.scanned_at);
            if age > inventory_max_age {
                let secs = age.as_secs();
                let _ = writeln!(
                    err,
                    "warning: {}: the inventory of node {node} was scanned at {} ({} before the evaluation time), older than --inventory-max-age {}: its mounts are Unverifiable/InventoryTooOld; scan again, or pass --inventory-max-age {}m to judge by it",
                    file_of[node],
                    inv.scanned_at,
                    age_text(secs),
                    age_text(inventory_max_age.as_secs()),
                    (secs + 59) / 60
                );
            }
        }
        // An empty dump, or scans of nodes the dump has no pod on, would
        // pass every --fail-on vacuously: refuse them.
        if loaded.index.pod_count() == 0 {
            return Err(Error::NothingToJudge(format!(
                "{} contain(s) no Pod; dump the pods with their Secrets and ConfigMaps, e.g. `kubectl get pods,secrets,configmaps -A -o json`",
                files(&objects)
            )));
        }
        if !by_node.is_empty()
            && !by_node
                .keys()
                .any(|n| !loaded.index.pods_on_node(n).is_empty())
        {
            return Err(Error::NothingToJudge(format!(
                "no Pod in {} runs on node(s) {}, the node(s) of the inventories in {}; dump the pods of those nodes (e.g. `kubectl get pods -A -o json --field-selector spec.nodeName=NODE` with the Secrets and ConfigMaps) or pass the scans of the nodes the dump covers",
                files(&objects),
                by_node.keys().cloned().collect::<Vec<_>>().join(", "),
                files(&inventory)
            )));
        }
        for inv in by_node.into_values() {
            let obs = ObservedNode::from_inventory(&inv, &mut loaded.index.interner);
            loaded.index.apply_inventory(obs);
        }

        let engine = Engine::new(
            Config {
                grace,
                inventory_max_age,
                not_syncing_min_mounts,
                list_fresh_files: output == Output::Json,
            },
            fingerprinter,
        );
        let mut state = EngineState::default();
        let mut eval = engine.evaluate_all(&loaded.index, &mut state, now);
        eval.pods.sort_by(|a, b| {
            (&a.pod.namespace(), &a.pod.name).cmp(&(&b.pod.namespace(), &b.pod.name))
        });

        let mut unverifiable = 0usize;
        let mut summary = Summary {
            pods: eval.pods.len(),
            verdicts: eval.len(),
            ignored_items: loaded.ignored_items,
            ..Default::default()
        };
        for (_, v) in eval.iter() {
            let key = match v.state.cause() {
                Some(c) => format!("{}/{c}", v.state.name()),
                None => v.state.name().to_string(),
            };
            *summary.by_state.entry(key).or_default() += 1;
            if let Some(f) = fail_on
                && fails_gate(f, &v.state, allow_unverifiable, spec_only)
            {
                summary.failing += 1;
                if !f.matches(&v.state) {
                    unverifiable += 1;
                }
            }
        }
        if unverifiable > 0 {
            let _ = writeln!(
                err,
                "error: {unverifiable} subject(s) could not be verified (Unverifiable): --fail-on fails closed; pass --allow-unverifiable to let them pass{}",
                if inventory.is_empty() {
                    ""
                } else {
                    ", --spec-only to judge without inventories"
                }
            );
        }
        let io = |e: std::io::Error| Error::Io {
            file: "<stdout>".into(),
            source: e,
        };
        match output {
            Output::Json => {
                let doc = JsonOut {
                    verdicts: eval.iter().map(|(p, v)| v.view(p)).collect(),
                    summary: &summary,
                };
                serde_json::to_writer_pretty(&mut *out, &doc).map_err(|e| io(e.into()))?;
                writeln!(out).map_err(io)?;
            }
            Output::Table => {
                write_table(&eval, &summary, fingerprint_key_file.is_none(), out).map_err(io)?
            }
        }
        Ok(if summary.failing > 0 { 1 } else { 0 })
    }
}

fn files(paths: &[std::path::PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn write_table(
    eval: &Evaluation,
    summary: &Summary,
    random_key: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut rows: Vec<[String; 8]> = vec![[
        "STATE".into(),
        "CAUSE".into(),
        "POD".into(),
        "NODE".into(),
        "SUBJECT".into(),
        "SOURCE".into(),
        "MOUNTED/CURRENT".into(),
        "SINCE".into(),
    ]];
    let mut notes = Vec::new();
    for (p, v) in eval.iter() {
        if matches!(v.state, State::Fresh | State::Skipped(_)) {
            continue;
        }
        let view = v.view(p);
        let subject = p.subject(v).text();
        let who = format!("{}/{} {subject}", view.namespace, view.pod);
        let fps = format!(
            "{} vs {}",
            view.observed.map_or("-".into(), |f| f.to_string()),
            view.expected.map_or("-".into(), |f| f.to_string())
        );
        let mut cause = view.cause.unwrap_or("").to_string();
        if !view.pinned_by.is_empty() {
            cause.push_str(&format!(
                " (pinned by {})",
                view.pinned_by
                    .iter()
                    .map(|s| &**s)
                    .collect::<Vec<_>>()
                    .join(",")
            ));
        }
        rows.push([
            view.state.to_string(),
            cause,
            format!("{}/{}", view.namespace, view.pod),
            view.node.unwrap_or("-").to_string(),
            subject,
            view.sources
                .iter()
                .map(|s| format!("{}/{}", s.kind, s.name))
                .collect::<Vec<_>>()
                .join(","),
            fps,
            view.since.to_string(),
        ]);
        if let Some(m) = view.message {
            notes.push(format!("{who}: {m}"));
        }
        if let Some(a) = &view.advice {
            notes.push(format!("{who}: {a}"));
        }
        if !view.differing_paths.is_empty() {
            notes.push(format!(
                "{who}: differing paths: {}",
                view.differing_paths
                    .iter()
                    .map(|s| if s.is_empty() { "(the file)" } else { &**s })
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
    if rows.len() > 1 {
        mountguard_inventory::table::write_aligned(&rows, out)?;
        for n in notes {
            writeln!(out, "  {n}")?;
        }
    }
    let counts: Vec<String> = summary
        .by_state
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    writeln!(
        out,
        "summary: {} pods, {} verdicts: {}",
        summary.pods,
        summary.verdicts,
        if counts.is_empty() {
            "none".to_string()
        } else {
            counts.join(" ")
        }
    )?;
    if random_key {
        writeln!(
            out,
            "note: no --fingerprint-key-file given; fingerprints use a one-off random key"
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
