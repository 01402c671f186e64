//! `mountguard-controller verify`: the engine run offline on a `kubectl get
//! pods,secrets,configmaps -A -o json` dump and agent inventories.
//!
//! Exit codes: 0 all fine, 1 a verdict matched `--fail-on` (or, with
//! `--fail-on`, a subject could not be verified: the gate fails closed
//! unless `--allow-unverifiable`), 2 bad input (no `--inventory` without
//! `--spec-only` among it).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::ValueEnum;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use mountguard_inventory::{NodeInventory, SCHEMA};
use serde::Serialize;
use serde_json::Value;

use crate::Error;
use crate::edge::convert::{self, RawPodExtras, describe_item};
use mountguard_core::fingerprint::Fingerprinter;
use mountguard_core::index::ClusterIndex;
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

/// What the command read, before evaluation.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The index.
    pub index: ClusterIndex,
    /// Items of other kinds that were ignored.
    pub ignored_items: usize,
}

fn read_input(path: &Path, stdin: &mut dyn Read) -> Result<Vec<u8>, Error> {
    let name = path.display().to_string();
    if name == "-" {
        let mut buf = Vec::new();
        stdin
            .read_to_end(&mut buf)
            .map_err(|source| Error::Io { file: name, source })?;
        Ok(buf)
    } else {
        std::fs::read(path).map_err(|source| Error::Io { file: name, source })
    }
}

fn parse_json(file: &str, bytes: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::Json {
        file: file.to_string(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })
}

/// The command that makes what `--objects` takes.
const OBJECTS_HOWTO: &str =
    "--objects takes JSON: `kubectl get pods,secrets,configmaps -A -o json > objects.json`";
/// The command that makes what `--inventory` takes.
const INVENTORY_HOWTO: &str = "--inventory takes the JSON inventory of a node: \
     `mountguard-agent scan --output json > NODE.json` on that node";

/// What text that is not JSON looks like, when it looks like something
/// people pass by mistake: YAML, a `kubectl get` table, the table of
/// `mountguard-agent scan`.
fn looks_like(bytes: &[u8]) -> Option<&'static str> {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(4096)]);
    let first = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    if first.starts_with('{') || first.starts_with('[') {
        return None;
    }
    if first.starts_with("POD UID") {
        return Some("the table of `mountguard-agent scan` (without --output json)");
    }
    if first.starts_with("NAME ") || first.starts_with("NAMESPACE ") {
        return Some("a `kubectl get` table (without -o json)");
    }
    if first == "---"
        || text
            .lines()
            .any(|l| l.starts_with("apiVersion:") || l.starts_with("kind:"))
        || first.starts_with("schema:")
    {
        return Some("YAML (-o yaml), not JSON");
    }
    None
}

/// Parses `bytes` of `file` given to `flag`; when it is not JSON but looks
/// like something else, says what and how to make the right file.
fn parse_input(file: &str, bytes: &[u8], howto: &str) -> Result<Value, Error> {
    parse_json(file, bytes).map_err(|e| match looks_like(bytes) {
        Some(what) => Error::WrongInput {
            file: file.to_string(),
            message: format!("this looks like {what}; {howto}"),
        },
        None => e,
    })
}

/// Whether `doc` is a node inventory (or an array of them).
fn is_inventory(doc: &Value) -> bool {
    let one = |v: &Value| {
        v.get("schema")
            .and_then(Value::as_str)
            .is_some_and(|s| s.starts_with("mountguard.io/node-inventory"))
    };
    match doc {
        Value::Array(items) => items.first().is_some_and(one),
        v => one(v),
    }
}

/// Adds the objects of one document (list or single object) to the index.
pub fn load_objects(file: &str, bytes: &[u8], loaded: &mut Loaded) -> Result<(), Error> {
    let doc = parse_input(file, bytes, OBJECTS_HOWTO)?;
    if is_inventory(&doc) {
        return Err(Error::WrongInput {
            file: file.to_string(),
            message: format!(
                "this is a node inventory (`mountguard-agent scan --output json`), not an \
                 object dump: pass it with --inventory; {OBJECTS_HOWTO}"
            ),
        });
    }
    let obj_err = |place: String, message: String| Error::Object {
        file: file.to_string(),
        place,
        message,
    };
    if !doc.is_object() {
        return Err(obj_err(
            "document".into(),
            "expected a JSON object (a v1 List or a single object)".into(),
        ));
    }
    match doc.get("items") {
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                load_item(item, loaded)
                    .map_err(|m| obj_err(place(&format!("items[{i}]"), item), m))?;
            }
        }
        Some(_) => {
            return Err(obj_err("items".into(), "is not an array".into()));
        }
        None => {
            load_item(&doc, loaded).map_err(|m| obj_err(place("top-level object", &doc), m))?;
        }
    }
    Ok(())
}

/// Where a bad object is: its position, and its kind and name when it has a
/// kind (without one, "? ?" would name nothing).
fn place(position: &str, item: &Value) -> String {
    if item.get("kind").and_then(Value::as_str).is_some() {
        format!("{position} ({})", describe_item(item))
    } else {
        position.to_string()
    }
}

fn load_item(item: &Value, loaded: &mut Loaded) -> Result<(), String> {
    let kind = item
        .get("kind")
        .and_then(Value::as_str)
        .ok_or("no \"kind\" field")?;
    let need_meta = |m: Option<&str>, what: &str| -> Result<(), String> {
        match m {
            Some(s) if !s.is_empty() => Ok(()),
            _ => Err(format!("metadata.{what} is missing")),
        }
    };
    let meta_str = |k: &str| {
        item.pointer(&format!("/metadata/{k}"))
            .and_then(Value::as_str)
    };
    let ix = &mut loaded.index;
    match kind {
        "Pod" => {
            let pod: Pod = serde_json::from_value(item.clone()).map_err(|e| e.to_string())?;
            need_meta(meta_str("namespace"), "namespace")?;
            need_meta(meta_str("name"), "name")?;
            need_meta(meta_str("uid"), "uid")?;
            if pod.spec.is_none() {
                return Err("spec is missing".into());
            }
            let extras = RawPodExtras::from_json(item);
            let model = convert::pod(&mut ix.interner, &pod, &extras)
                .ok_or("pod is missing metadata or spec")?;
            ix.apply_pod(model);
        }
        "Secret" => {
            let s: Secret = serde_json::from_value(item.clone()).map_err(|e| e.to_string())?;
            need_meta(meta_str("namespace"), "namespace")?;
            need_meta(meta_str("name"), "name")?;
            let (r, c) = convert::secret(&mut ix.interner, &s).ok_or("missing metadata")?;
            // `s` (plaintext) is dropped at the end of this arm.
            ix.apply_source(r, c);
        }
        "ConfigMap" => {
            let c: ConfigMap = serde_json::from_value(item.clone()).map_err(|e| e.to_string())?;
            need_meta(meta_str("namespace"), "namespace")?;
            need_meta(meta_str("name"), "name")?;
            let (r, c) = convert::config_map(&mut ix.interner, &c).ok_or("missing metadata")?;
            ix.apply_source(r, c);
        }
        _ => loaded.ignored_items += 1,
    }
    Ok(())
}

/// Parses one inventory file (an inventory, or an array of them).
pub fn parse_inventories(file: &str, bytes: &[u8]) -> Result<Vec<NodeInventory>, Error> {
    let doc = parse_input(file, bytes, INVENTORY_HOWTO)?;
    if doc.get("items").is_some() || doc.get("kind").and_then(Value::as_str).is_some() {
        return Err(Error::WrongInput {
            file: file.to_string(),
            message: format!(
                "this is a Kubernetes object dump ({}), not a node inventory: pass it with \
                 --objects; {INVENTORY_HOWTO}",
                doc.get("kind").and_then(Value::as_str).unwrap_or("a list")
            ),
        });
    }
    let one = |v: Value, place: String| -> Result<NodeInventory, Error> {
        let inv: NodeInventory = serde_json::from_value(v).map_err(|e| Error::Object {
            file: file.to_string(),
            place: place.clone(),
            message: format!("not a node inventory: {e}"),
        })?;
        if inv.schema != SCHEMA {
            return Err(Error::Inventory {
                file: file.to_string(),
                source: mountguard_inventory::Error::Schema { found: inv.schema },
            });
        }
        Ok(inv)
    };
    match doc {
        Value::Array(items) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| one(v, format!("[{i}]")))
            .collect(),
        v => Ok(vec![one(v, "document".into())?]),
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
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use mountguard_core::testkit::{NodeB, ts};
    use mountguard_inventory::Plugin;
    use serde_json::json;

    fn objects() -> Value {
        json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"namespace": "n", "name": "cfg", "managedFields": [
                 {"manager": "kubectl", "operation": "Update", "time": "2026-11-30T10:30:00Z"}]},
             "data": {"a.conf": "new"}},
            {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "n", "name": "ignored"}},
            {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"namespace": "n", "name": "p", "uid": "uid-p"},
             "spec": {"nodeName": "node-a",
                "volumes": [{"name": "cfg", "configMap": {"name": "cfg"}}],
                "containers": [{"name": "c", "image": "x"}]},
             "status": {"phase": "Running"}}
        ]})
    }

    fn inventory(content: &[u8]) -> String {
        let b = NodeB::new("node-a", ts("2026-11-30T11:00:00Z")).volume(
            "uid-p",
            Plugin::Configmap,
            "cfg",
            &[("a.conf", content)],
            ts("2026-11-30T10:00:00Z"),
        );
        serde_json::to_string(&b.inv).unwrap()
    }

    fn run(args: &[&str], stdin: &str) -> (Result<u8, Error>, String) {
        let (r, out, _) = run_err(args, stdin);
        (r, out)
    }

    /// `run`, with what went to standard error.
    fn run_err(args: &[&str], stdin: &str) -> (Result<u8, Error>, String, String) {
        let mut argv = vec!["mountguard-controller", "verify"];
        argv.extend_from_slice(args);
        let Command::Verify(v) = Cli::try_parse_from(argv).unwrap().command else {
            unreachable!("verify parses as verify")
        };
        let v = Verify::from(v);
        let mut out = Vec::new();
        let mut err = Vec::new();
        let r = v.run(
            ts("2026-11-30T11:00:10Z"),
            [9u8; 32],
            &mut stdin.as_bytes(),
            &mut out,
            &mut err,
        );
        (
            r,
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    fn write(dir: &Path, name: &str, content: &str) -> String {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        p.display().to_string()
    }

    #[test]
    fn verify_refuses_input_with_nothing_to_judge() {
        let dir = tempfile::tempdir().unwrap();
        let inv = write(dir.path(), "inv.json", &inventory(b"new"));
        // (case, objects, what the error names)
        let no_pods = json!({"apiVersion": "v1", "kind": "List", "items": [
            objects()["items"][0].clone()]});
        let mut elsewhere = objects();
        elsewhere["items"][2]["spec"]["nodeName"] = json!("node-b");
        let cases = [
            (
                "an empty list",
                json!({"apiVersion": "v1", "kind": "List", "items": []}),
                "contain(s) no Pod",
            ),
            ("sources without pods", no_pods, "contain(s) no Pod"),
            (
                "no pod on the scanned node",
                elsewhere,
                "runs on node(s) node-a",
            ),
        ];
        for (case, objs, want) in cases {
            let (r, out) = run(
                &["--objects", "-", "--inventory", &inv, "--fail-on", "stale"],
                &objs.to_string(),
            );
            let e = r.expect_err(case);
            assert!(matches!(e, Error::NothingToJudge(_)), "{case}: {e}");
            assert!(e.to_string().contains(want), "{case}: {e}");
            assert!(out.is_empty(), "{case}: no verdict table: {out}");
        }
        // The same dump with a pod on the scanned node is judged.
        let (r, _) = run(
            &["--objects", "-", "--inventory", &inv],
            &objects().to_string(),
        );
        assert_eq!(r.unwrap(), 0);
    }

    /// issue 31 §1: a gate fails closed. An inventory aged past
    /// --inventory-max-age fails `--fail-on stale` (and says so on stderr
    /// with its age and the flag), unless --allow-unverifiable; no
    /// --inventory is a usage error unless --spec-only.
    #[test]
    fn fails_closed() {
        let dir = tempfile::tempdir().unwrap();
        let inv = write(dir.path(), "inv.json", &inventory(b"new"));
        let objs = objects().to_string();
        let gate = ["--objects", "-", "--fail-on", "stale"];
        let with = |extra: &[&str]| -> Vec<String> {
            gate.iter().chain(extra).map(|s| s.to_string()).collect()
        };
        let call = |extra: &[&str]| {
            let argv = with(extra);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            run_err(&argv, &objs)
        };

        // Fresh and young: passes, nothing on stderr.
        let (r, out, err) = call(&["--inventory", &inv]);
        assert_eq!(r.unwrap(), 0, "{out}");
        assert_eq!(err, "");

        // The same scan eight minutes later: every verdict is
        // Unverifiable/InventoryTooOld, and the gate fails.
        let later = ["--inventory", &inv, "--now", "2026-11-30T11:08:00Z"];
        let (r, out, err) = call(&later);
        assert_eq!(r.unwrap(), 1, "{out}");
        assert!(out.contains("Unverifiable/InventoryTooOld=1"), "{out}");
        let warning: Vec<&str> = err.lines().filter(|l| l.contains("node-a")).collect();
        assert_eq!(warning.len(), 1, "{err}");
        for part in [
            "inv.json",
            "8m0s",
            "older than --inventory-max-age 5m",
            "--inventory-max-age 8m",
        ] {
            assert!(warning[0].contains(part), "{part}: {err}");
        }
        assert!(err.contains("--allow-unverifiable"), "{err}");
        // ...unless the user says otherwise.
        let (r, _, _) = call(&[&later[..], &["--allow-unverifiable"]].concat());
        assert_eq!(r.unwrap(), 0);
        let (r, _, _) = call(&[&later[..], &["--inventory-max-age", "9m"]].concat());
        assert_eq!(r.unwrap(), 0);

        // No inventory at all: a usage error naming the way out.
        let (r, out, _) = call(&[]);
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Usage(_)), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("--inventory")
                && msg.contains("mountguard-agent scan --output json")
                && msg.contains("--spec-only"),
            "{msg}"
        );
        assert!(out.is_empty());
        // Spec-only checks: what no inventory can vouch for does not fail.
        let (r, out, _) = call(&["--spec-only"]);
        assert_eq!(r.unwrap(), 0, "{out}");
        assert!(out.contains("Unverifiable/NoInventory=1"), "{out}");

        // The rule, state by state: Unverifiable fails every gate unless
        // allowed; NoInventory passes a spec-only gate.
        use mountguard_core::verdict::UnverifiableReason as U;
        for s in State::all() {
            for f in [FailOn::Stale, FailOn::Frozen, FailOn::Any] {
                let unverifiable = matches!(s, State::Unverifiable(_));
                assert_eq!(
                    fails_gate(f, &s, false, false),
                    f.matches(&s) || unverifiable,
                    "{s:?} {f:?}"
                );
                assert_eq!(fails_gate(f, &s, true, false), f.matches(&s), "{s:?}");
                assert_eq!(
                    fails_gate(f, &s, false, true),
                    f.matches(&s) || (unverifiable && s != State::Unverifiable(U::NoInventory)),
                    "{s:?}"
                );
            }
        }
    }

    /// issue 31 §3: a file that is not what its flag takes says which file
    /// it is, what it looks like and the command that makes the right one.
    #[test]
    fn error_hint() {
        let dir = tempfile::tempdir().unwrap();
        let inv = write(dir.path(), "inv.json", &inventory(b"new"));
        let objs = write(dir.path(), "objs.json", &objects().to_string());
        let yaml = write(
            dir.path(),
            "objs.yaml",
            "apiVersion: v1\nitems:\n- apiVersion: v1\n  kind: Pod\nkind: List\n",
        );
        let table = write(
            dir.path(),
            "pods.txt",
            "NAMESPACE   NAME    READY   STATUS    RESTARTS   AGE\nslurm       w-0     1/1     Running   0          3d\n",
        );
        let scan_table = write(
            dir.path(),
            "scan.txt",
            "POD UID  PLUGIN     VOLUME     DATA DIR  FILES  DIGEST  ERRORS\n",
        );
        let objects_fix = "kubectl get pods,secrets,configmaps -A -o json";
        let inventory_fix = "mountguard-agent scan --output json";
        // (objects, inventory, the file named, what it looks like, the fix)
        let cases = [
            (&yaml, &inv, &yaml, "YAML", objects_fix),
            (&table, &inv, &table, "a `kubectl get` table", objects_fix),
            (
                &inv,
                &objs,
                &inv,
                "node inventory",
                "pass it with --inventory",
            ),
            (
                &objs,
                &objs,
                &objs,
                "object dump (List)",
                "pass it with --objects",
            ),
            (
                &objs,
                &scan_table,
                &scan_table,
                "the table of `mountguard-agent scan`",
                inventory_fix,
            ),
            (&objs, &yaml, &yaml, "YAML", inventory_fix),
        ];
        for (o, i, file, looks, fix) in cases {
            let (r, out) = run(&["--objects", o, "--inventory", i], "");
            let e = r.unwrap_err();
            let msg = e.to_string();
            assert!(matches!(e, Error::WrongInput { .. }), "{o} {i}: {msg}");
            assert!(msg.starts_with(&format!("{file}: ")), "{msg}");
            assert!(msg.contains(looks), "{looks}: {msg}");
            assert!(msg.contains(fix), "{fix}: {msg}");
            assert!(out.is_empty());
        }
        // The swapped pair also tells the inventory side's command.
        let (r, _) = run(&["--objects", &inv, "--inventory", &objs], "");
        assert!(r.unwrap_err().to_string().contains(objects_fix));
    }

    /// An immutable Secret deleted and recreated with the same content
    /// (`replace --force`) after the pod registered: its volume shows the
    /// current bytes, so the kubelet's cached copy holds them, and the env
    /// var read from it is Fresh too; recreated with new content, both are
    /// Stale.
    #[test]
    fn verify_judges_env_from_an_immutable_secret_recreated_with_the_same_content_fresh() {
        let objs = |value: &str| {
            json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Secret", "immutable": true,
                 "metadata": {"namespace": "n", "name": "auth", "uid": "u2",
                    "creationTimestamp": "2026-11-30T10:30:00Z"},
                 "data": {"key": value}},
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"namespace": "n", "name": "p", "uid": "uid-p"},
                 "spec": {"nodeName": "node-a",
                    "volumes": [{"name": "auth", "secret": {"secretName": "auth"}}],
                    "containers": [{"name": "c", "image": "x",
                        "env": [{"name": "KEY", "valueFrom":
                            {"secretKeyRef": {"name": "auth", "key": "key"}}}]}]},
                 "status": {"phase": "Running", "startTime": "2026-11-30T09:00:00Z",
                    "containerStatuses": [{"name": "c", "ready": true, "restartCount": 0,
                        "image": "x", "imageID": "",
                        "state": {"running": {"startedAt": "2026-11-30T09:00:05Z"}}}]}}
            ]})
            .to_string()
        };
        let dir = tempfile::tempdir().unwrap();
        let inv = NodeB::new("node-a", ts("2026-11-30T11:00:00Z")).volume(
            "uid-p",
            Plugin::Secret,
            "auth",
            &[("key", b"same")],
            ts("2026-11-30T09:00:01Z"),
        );
        let inv = write(
            dir.path(),
            "node-a.json",
            &serde_json::to_string(&inv.inv).unwrap(),
        );
        let args = ["--objects", "-", "--inventory", &inv, "--output", "json"];
        let states = |out: &str| -> Vec<String> {
            let doc: Value = serde_json::from_str(out).unwrap();
            doc["verdicts"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| format!("{} {}", v["subject"], v["state"]))
                .collect()
        };
        // base64 of "same" and "next".
        let (code, out) = run(
            &[&args[..], &["--fail-on", "stale"]].concat(),
            &objs("c2FtZQ=="),
        );
        assert_eq!(code.unwrap(), 0, "{out}");
        assert!(
            states(&out).iter().all(|s| s.ends_with("\"Fresh\"")),
            "{:?}",
            states(&out)
        );
        let (code, out) = run(
            &[&args[..], &["--fail-on", "stale"]].concat(),
            &objs("bmV4dA=="),
        );
        assert_eq!(code.unwrap(), 1, "{out}");
        assert!(
            states(&out).iter().all(|s| s.ends_with("\"Stale\"")),
            "{:?}",
            states(&out)
        );
    }

    #[test]
    fn verify_reports_stale_content_and_exit_codes_follow_fail_on() {
        let dir = tempfile::tempdir().unwrap();
        let inv_old = write(dir.path(), "old.json", &inventory(b"old"));
        let inv_new = write(dir.path(), "new.json", &inventory(b"new"));
        let objs = objects().to_string();

        let (code, out) = run(
            &[
                "--objects",
                "-",
                "--inventory",
                &inv_old,
                "--fail-on",
                "stale",
            ],
            &objs,
        );
        assert_eq!(code.unwrap(), 1, "{out}");
        assert!(
            out.contains("Stale") && out.contains("n/p") && out.contains("volume cfg"),
            "{out}"
        );
        assert!(out.contains("differing paths: a.conf"), "{out}");
        assert!(out.contains("Stale/Unknown=1"), "{out}");
        // The advice (issue 31 §2) in the table and the JSON.
        let advice = "n/p volume cfg: Replace the pod so the kubelet sets the volume up again";
        assert!(out.contains(advice), "{out}");
        let (_, json_out) = run(
            &[
                "--objects",
                "-",
                "--inventory",
                &inv_old,
                "--output",
                "json",
            ],
            &objs,
        );
        let doc: Value = serde_json::from_str(&json_out).unwrap();
        assert!(
            doc["verdicts"][0]["advice"]
                .as_str()
                .unwrap()
                .starts_with("Replace the pod"),
            "{json_out}"
        );

        let (code, out) = run(
            &[
                "--objects",
                "-",
                "--inventory",
                &inv_old,
                "--fail-on",
                "frozen",
            ],
            &objs,
        );
        assert_eq!(code.unwrap(), 0, "{out}");

        let (code, out) = run(
            &[
                "--objects",
                "-",
                "--inventory",
                &inv_new,
                "--fail-on",
                "any",
                "--output",
                "json",
            ],
            &objs,
        );
        assert_eq!(code.unwrap(), 0, "{out}");
        let doc: Value = serde_json::from_str(&out).unwrap();
        let v = &doc["verdicts"][0];
        assert_eq!(v["state"], "Fresh");
        assert_eq!(v["namespace"], "n");
        assert_eq!(v["volume"], "cfg");
        assert_eq!(v["sourceKind"], "ConfigMap");
        assert_eq!(v["expected"], v["observed"]);
        assert_eq!(v["expected"].as_str().unwrap().len(), 12);
        assert_eq!(v["files"][0]["path"], "a.conf");
        assert_eq!(doc["summary"]["ignoredItems"], 1);

        // A grace period longer than the change's age turns it into
        // Propagating.
        let (code, out) = run(
            &[
                "--objects",
                "-",
                "--inventory",
                &inv_old,
                "--grace",
                "1h",
                "--fail-on",
                "stale",
            ],
            &objs,
        );
        assert_eq!(code.unwrap(), 0, "{out}");
        assert!(out.contains("Propagating"), "{out}");
    }

    #[test]
    fn bad_input_names_the_file_and_the_place() {
        let dir = tempfile::tempdir().unwrap();
        let inv = write(dir.path(), "inv.json", &inventory(b"x"));
        let full = objects().to_string();

        // Truncated JSON: line and column.
        let truncated = write(dir.path(), "trunc.json", &full[..full.len() / 2]);
        let (r, _) = run(&["--objects", &truncated, "--inventory", &inv], "");
        let e = r.unwrap_err();
        assert!(matches!(e, Error::Json { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.starts_with(&truncated) && msg.contains("line 1, column"),
            "{msg}"
        );

        // A bad item: index, kind, namespace/name.
        let mut doc = objects();
        doc["items"][2]["spec"]["volumes"] = json!("not a list");
        let bad = write(dir.path(), "bad.json", &doc.to_string());
        let msg = run(&["--objects", &bad, "--inventory", &inv], "")
            .0
            .unwrap_err()
            .to_string();
        assert!(msg.contains("bad.json: items[2] (Pod n/p)"), "{msg}");

        let mut doc = objects();
        doc["items"][0]["metadata"]["name"] = json!(null);
        let bad = write(dir.path(), "noname.json", &doc.to_string());
        let msg = run(&["--objects", &bad, "--inventory", &inv], "")
            .0
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("items[0]") && msg.contains("metadata.name is missing"),
            "{msg}"
        );

        let no_kind = write(dir.path(), "nokind.json", r#"{"items":[{"metadata":{}}]}"#);
        let msg = run(&["--objects", &no_kind, "--inventory", &inv], "")
            .0
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("items[0]") && msg.contains("no \"kind\""),
            "{msg}"
        );
        // Named by its position, not by a kind and name it does not have.
        assert!(!msg.contains('?'), "{msg}");
        let no_kind = write(dir.path(), "nokind1.json", r#"{"metadata":{"name":"x"}}"#);
        let msg = run(&["--objects", &no_kind, "--inventory", &inv], "")
            .0
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            format!("{no_kind}: top-level object: no \"kind\" field"),
            "{msg}"
        );

        let not_obj = write(dir.path(), "arr.json", "[1,2]");
        let msg = run(&["--objects", &not_obj, "--inventory", &inv], "")
            .0
            .unwrap_err()
            .to_string();
        assert!(msg.contains("expected a JSON object"), "{msg}");

        // Inventories: wrong schema, wrong shape, missing file.
        let objs = write(dir.path(), "objs.json", &full);
        let wrong = write(
            dir.path(),
            "schema.json",
            &inventory(b"x").replace("node-inventory/v1", "node-inventory/v9"),
        );
        let msg = run(&["--objects", &objs, "--inventory", &wrong], "")
            .0
            .unwrap_err()
            .to_string();
        assert!(msg.contains("schema.json") && msg.contains("v9"), "{msg}");
        let shape = write(
            dir.path(),
            "shape.json",
            r#"{"schema": "mountguard.io/node-inventory/v1"}"#,
        );
        let msg = run(&["--objects", &objs, "--inventory", &shape], "")
            .0
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("shape.json: document: not a node inventory"),
            "{msg}"
        );
        let missing = dir.path().join("nope.json").display().to_string();
        let e = run(&["--objects", &objs, "--inventory", &missing], "")
            .0
            .unwrap_err();
        assert!(
            matches!(e, Error::Io { .. }) && e.to_string().contains("nope.json"),
            "{e}"
        );

        // A key file that is too short.
        let key = write(dir.path(), "key", "short");
        let msg = run(
            &[
                "--objects",
                &objs,
                "--fingerprint-key-file",
                &key,
                "--spec-only",
            ],
            "",
        )
        .0
        .unwrap_err()
        .to_string();
        assert!(msg.contains("at least 16"), "{msg}");
    }

    #[test]
    fn several_inventories_of_one_node_keep_the_newest_and_arrays_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let older = NodeB::new("node-a", ts("2026-11-30T10:59:00Z")).volume(
            "uid-p",
            Plugin::Configmap,
            "cfg",
            &[("a.conf", b"old")],
            ts("2026-11-30T10:00:00Z"),
        );
        let newer = inventory(b"new");
        let arr = format!("[{}]", serde_json::to_string(&older.inv).unwrap());
        let a = write(dir.path(), "arr.json", &arr);
        let b = write(dir.path(), "new.json", &newer);
        let objs = write(dir.path(), "objs.json", &objects().to_string());
        for order in [[&a, &b], [&b, &a]] {
            let (code, out) = run(
                &[
                    "--objects",
                    &objs,
                    "--inventory",
                    order[0],
                    order[1],
                    "--fail-on",
                    "any",
                ],
                "",
            );
            assert_eq!(code.unwrap(), 0, "{out}");
        }
    }
}
