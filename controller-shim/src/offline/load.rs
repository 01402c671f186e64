//! What `verify` reads: the objects of a `kubectl get -o json` dump into
//! the index, and agent inventories, from files or stdin, with errors that
//! name the file and the place.

use std::io::Read;
use std::path::Path;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use mountguard_inventory::{NodeInventory, SCHEMA};
use serde_json::Value;

use crate::Error;
use crate::edge::convert::{self, describe_item};
use mountguard_core::index::ClusterIndex;

/// What the command read, before evaluation.
#[derive(Debug, Default)]
pub struct Loaded {
    /// The index.
    pub index: ClusterIndex,
    /// Items of other kinds that were ignored.
    pub ignored_items: usize,
}

pub(crate) fn read_input(path: &Path, stdin: &mut dyn Read) -> Result<Vec<u8>, Error> {
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

pub(crate) fn parse_json(file: &str, bytes: &[u8]) -> Result<Value, Error> {
    serde_json::from_slice(bytes).map_err(|e| Error::Json {
        file: file.to_string(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })
}

/// The command that makes what `--objects` takes.
pub(crate) const OBJECTS_HOWTO: &str =
    "--objects takes JSON: `kubectl get pods,secrets,configmaps -A -o json > objects.json`";
/// The command that makes what `--inventory` takes.
pub(crate) const INVENTORY_HOWTO: &str = "--inventory takes the JSON inventory of a node: \
     `mountguard-agent scan --output json > NODE.json` on that node";

/// What text that is not JSON looks like, when it looks like something
/// people pass by mistake: YAML, a `kubectl get` table, the table of
/// `mountguard-agent scan`.
pub(crate) fn looks_like(bytes: &[u8]) -> Option<&'static str> {
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
pub(crate) fn parse_input(file: &str, bytes: &[u8], howto: &str) -> Result<Value, Error> {
    parse_json(file, bytes).map_err(|e| match looks_like(bytes) {
        Some(what) => Error::WrongInput {
            file: file.to_string(),
            message: format!("this looks like {what}; {howto}"),
        },
        None => e,
    })
}

/// Whether `doc` is a node inventory (or an array of them).
pub(crate) fn is_inventory(doc: &Value) -> bool {
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
pub(crate) fn place(position: &str, item: &Value) -> String {
    if item.get("kind").and_then(Value::as_str).is_some() {
        format!("{position} ({})", describe_item(item))
    } else {
        position.to_string()
    }
}

pub(crate) fn load_item(item: &Value, loaded: &mut Loaded) -> Result<(), String> {
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
            let model =
                convert::pod(&mut ix.interner, &pod).ok_or("pod is missing metadata or spec")?;
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
