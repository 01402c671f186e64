//! Patches: JSON merge patch and JSON patch (RFC 7386 / 6902, via the
//! `json-patch` crate), and deliberately limited strategic-merge and
//! server-side-apply support: enough for a controller that writes labels,
//! annotations, status fields and Events. What is not supported is refused
//! with a 415 Status instead of being applied wrongly.

use serde_json::{Map, Value, json};

use super::status::ApiError;

/// Patch content types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json`
    Merge,
    /// `application/json-patch+json`
    Json,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

impl PatchType {
    /// From a Content-Type header.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(Self::Merge),
            "application/json-patch+json" => Ok(Self::Json),
            "application/strategic-merge-patch+json" => Ok(Self::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(Self::Apply),
            other => Err(ApiError::unsupported(format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"
            ))),
        }
    }
}

fn contains_array_or_directive(v: &Value, path: &str) -> Option<String> {
    match v {
        Value::Array(_) => Some(path.to_string()),
        Value::Object(m) => m.iter().find_map(|(k, v)| {
            if k.starts_with('$') {
                Some(format!("{path}/{k}"))
            } else {
                contains_array_or_directive(v, &format!("{path}/{k}"))
            }
        }),
        _ => None,
    }
}

/// Applies a merge, JSON or strategic-merge patch to `target`.
pub fn apply_patch(target: &Value, kind: PatchType, body: &[u8]) -> Result<Value, ApiError> {
    let mut out = target.clone();
    match kind {
        PatchType::Merge | PatchType::Strategic => {
            let patch: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(ApiError::bad_request("patch is not a JSON object"));
            }
            if kind == PatchType::Strategic
                && let Some(at) = contains_array_or_directive(&patch, "")
            {
                return Err(ApiError::unsupported(format!(
                    "the API server double supports strategic merge patches only without lists or $-directives (found at {at}); use a merge patch or JSON patch"
                )));
            }
            json_patch::merge(&mut out, &patch);
        }
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?;
            json_patch::patch(&mut out, &patch).map_err(|e| ApiError {
                code: 422,
                reason: "Invalid",
                message: format!(
                    "the server rejected our request due to an error in our request: {e}"
                ),
                details: None,
            })?;
        }
        PatchType::Apply => {
            return Err(ApiError::internal("apply is handled by server_side_apply"));
        }
    }
    Ok(out)
}

/// `fieldsV1` of an apply configuration: `{"f:metadata":{"f:labels":{"f:a":{}}}}`.
pub fn fields_of(config: &Value) -> Value {
    fn walk(v: &Value) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| (format!("f:{k}"), walk(v)))
                    .collect::<Map<String, Value>>(),
            ),
            _ => json!({}),
        }
    }
    let mut c = config.clone();
    if let Some(m) = c.as_object_mut() {
        m.remove("apiVersion");
        m.remove("kind");
    }
    if let Some(m) = c["metadata"].as_object_mut() {
        for k in [
            "name",
            "namespace",
            "resourceVersion",
            "managedFields",
            "uid",
        ] {
            m.remove(k);
        }
        if m.is_empty() {
            c.as_object_mut().map(|o| o.remove("metadata"));
        }
    }
    walk(&c)
}

fn owned_paths(fields: &Value, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    if let Some(m) = fields.as_object() {
        if m.is_empty() {
            out.push(prefix);
            return;
        }
        for (k, v) in m {
            let mut p = prefix.clone();
            p.push(k.trim_start_matches("f:").to_string());
            owned_paths(v, p, out);
        }
    }
}

fn remove_path(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for p in parents {
        match cur.get_mut(p) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(m) = cur.as_object_mut() {
        m.remove(last);
    }
}

fn merge_apply(target: &mut Value, config: &Value, path: &str) -> Result<(), ApiError> {
    match (target, config) {
        (Value::Object(t), Value::Object(c)) => {
            for (k, v) in c {
                let p = format!("{path}.{k}");
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge_apply(existing, v, &p)?
                    }
                    Some(existing) if v.is_array() && existing != v => {
                        return Err(ApiError::unsupported(format!(
                            "the API server double does not merge lists in server-side apply ({p}); apply the list unchanged or use a merge patch"
                        )));
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
            Ok(())
        }
        (t, c) => {
            *t = c.clone();
            Ok(())
        }
    }
}

/// Server-side apply of `config` by `manager` onto `existing` (None: create).
/// Simplified: maps merge recursively, scalars are replaced, lists must be
/// unchanged; fields this manager applied before and no longer applies are
/// removed unless another manager owns them; conflicts between managers are
/// not detected (every apply behaves as `force=true`).
pub fn server_side_apply(
    existing: Option<&Value>,
    config: &Value,
    manager: &str,
    subresource: Option<&str>,
) -> Result<Value, ApiError> {
    if !config.is_object() {
        return Err(ApiError::bad_request(
            "apply configuration is not an object",
        ));
    }
    let fields = fields_of(config);
    let mut obj = match existing {
        None => config.clone(),
        Some(old) => {
            let mut obj = old.clone();
            let mut cfg = config.clone();
            if let Some(m) = cfg["metadata"].as_object_mut() {
                m.remove("resourceVersion");
                m.remove("managedFields");
            }
            merge_apply(&mut obj, &cfg, "")?;
            // Remove what this manager owned before and no longer applies.
            let managed = old["metadata"]["managedFields"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let mut before = Vec::new();
            let mut others = Vec::new();
            for e in &managed {
                if e["manager"] == manager && e["operation"] == "Apply" {
                    owned_paths(&e["fieldsV1"], vec![], &mut before);
                } else {
                    owned_paths(&e["fieldsV1"], vec![], &mut others);
                }
            }
            let mut now = Vec::new();
            owned_paths(&fields, vec![], &mut now);
            for p in before {
                if !now.contains(&p) && !others.contains(&p) {
                    remove_path(&mut obj, &p);
                }
            }
            obj
        }
    };
    let mut managed: Vec<Value> = existing
        .and_then(|o| o["metadata"]["managedFields"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|e| !(e["manager"] == manager && e["operation"] == "Apply"))
        .collect();
    let mut entry = json!({
        "manager": manager,
        "operation": "Apply",
        "apiVersion": config["apiVersion"].clone(),
        "time": crate::util::now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": fields,
    });
    if let Some(s) = subresource {
        entry["subresource"] = json!(s);
    }
    managed.push(entry);
    obj["metadata"]["managedFields"] = Value::Array(managed);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_and_json_patches() {
        let obj = json!({"metadata": {"labels": {"a": "1", "b": "2"}}});
        let out = apply_patch(
            &obj,
            PatchType::Merge,
            br#"{"metadata":{"labels":{"a":null,"c":"3"}}}"#,
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"], json!({"b": "2", "c": "3"}));
        let out = apply_patch(
            &obj,
            PatchType::Json,
            br#"[{"op":"add","path":"/metadata/labels/d","value":"4"}]"#,
        )
        .unwrap();
        assert_eq!(out["metadata"]["labels"]["d"], json!("4"));
        let e = apply_patch(
            &obj,
            PatchType::Json,
            br#"[{"op":"test","path":"/metadata/labels/a","value":"9"}]"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 422);
    }

    #[test]
    fn strategic_merge_refuses_lists() {
        let obj = json!({"spec": {"containers": [{"name": "a"}]}});
        let e = apply_patch(
            &obj,
            PatchType::Strategic,
            br#"{"spec":{"containers":[{"name":"b"}]}}"#,
        )
        .unwrap_err();
        assert_eq!(e.code, 415);
        let ok = apply_patch(
            &obj,
            PatchType::Strategic,
            br#"{"metadata":{"annotations":{"x":"y"}}}"#,
        )
        .unwrap();
        assert_eq!(ok["metadata"]["annotations"]["x"], json!("y"));
    }

    #[test]
    fn apply_removes_fields_the_manager_dropped() {
        let old = json!({"metadata": {"name": "p", "annotations": {"keep": "1"}}});
        let a1 = server_side_apply(
            Some(&old),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {"m/a": "1", "m/b": "2"}}}),
            "mg",
            None,
        )
        .unwrap();
        assert_eq!(
            a1["metadata"]["annotations"],
            json!({"keep": "1", "m/a": "1", "m/b": "2"})
        );
        let a2 = server_side_apply(
            Some(&a1),
            &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "annotations": {"m/a": "9"}}}),
            "mg",
            None,
        )
        .unwrap();
        assert_eq!(
            a2["metadata"]["annotations"],
            json!({"keep": "1", "m/a": "9"})
        );
        assert_eq!(a2["metadata"]["managedFields"].as_array().unwrap().len(), 1);
    }
}
