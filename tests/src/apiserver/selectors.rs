//! Label and field selectors, parsed the way the API server parses them.

use serde_json::Value;

use super::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector (`a=b,c!=d,e in (f,g),!h`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_values(s: &str) -> Result<Vec<String>, ApiError> {
    let s = s.trim();
    let inner = s
        .strip_prefix('(')
        .and_then(|s| s.strip_suffix(')'))
        .ok_or_else(|| ApiError::bad_request(format!("unable to parse requirement: {s}")))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    /// Parses a selector string.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top(s) {
            let req = if let Some(k) = term.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = term.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = term.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(v)?)
            } else if let Some((k, v)) = term.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(v)?)
            } else if term.contains(' ') || term.contains('(') {
                return Err(ApiError::bad_request(format!(
                    "unable to parse requirement: {term}"
                )));
            } else {
                LabelReq::Exists(term)
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// From a `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`).
    pub fn from_object(sel: &Value) -> Self {
        let mut reqs = Vec::new();
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                reqs.push(LabelReq::Eq(k.clone(), v.as_str().unwrap_or("").into()));
            }
        }
        if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
            for e in exprs {
                let key = e["key"].as_str().unwrap_or("").to_string();
                let values = super::strings(&e["values"]);
                match e["operator"].as_str() {
                    Some("In") => reqs.push(LabelReq::In(key, values)),
                    Some("NotIn") => reqs.push(LabelReq::NotIn(key, values)),
                    Some("Exists") => reqs.push(LabelReq::Exists(key)),
                    Some("DoesNotExist") => reqs.push(LabelReq::NotExists(key)),
                    _ => {}
                }
            }
        }
        Self(reqs)
    }

    /// Whether the object's labels match.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector (`spec.nodeName=n1,metadata.name!=x`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The fields each resource supports in field selectors, as the real API
/// server (metadata.name and metadata.namespace everywhere).
fn supported(resource: &str, field: &str) -> bool {
    if matches!(field, "metadata.name" | "metadata.namespace") {
        return true;
    }
    match resource {
        "pods" => matches!(
            field,
            "spec.nodeName"
                | "spec.restartPolicy"
                | "spec.schedulerName"
                | "spec.serviceAccountName"
                | "spec.hostNetwork"
                | "status.phase"
                | "status.podIP"
                | "status.nominatedNodeName"
        ),
        "secrets" => field == "type",
        "nodes" => field == "spec.unschedulable",
        "namespaces" => field == "status.phase",
        "events" => {
            field.starts_with("involvedObject.")
                || field.starts_with("regarding.")
                || matches!(
                    field,
                    "reason" | "type" | "source" | "reportingComponent" | "reportingController"
                )
        }
        _ => false,
    }
}

fn field_value(obj: &Value, field: &str) -> String {
    let field = if field == "source" {
        "source.component"
    } else {
        field
    };
    let mut cur = obj;
    for part in field.split('.') {
        cur = &cur[part];
    }
    match cur {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null if field == "spec.unschedulable" || field == "spec.hostNetwork" => {
            "false".into()
        }
        _ => String::new(),
    }
}

impl FieldSelector {
    /// Parses a selector for a resource; unsupported fields are a 400, as upstream.
    pub fn parse(resource: &str, s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for term in split_top(s) {
            let (field, eq, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !supported(resource, field) {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), eq, value.trim().to_string()));
        }
        Ok(Self(reqs))
    }

    /// Whether the object matches.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0
            .iter()
            .all(|(f, eq, v)| (field_value(obj, f) == *v) == *eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value, node: &str) -> Value {
        json!({"metadata": {"name": "p", "namespace": "ns", "labels": labels}, "spec": {"nodeName": node}})
    }

    #[test]
    fn label_selector_forms() {
        let p = pod(json!({"app": "slurmd", "tier": "worker"}), "n1");
        for (sel, want) in [
            ("app=slurmd", true),
            ("app==slurmd", true),
            ("app!=slurmd", false),
            ("app in (slurmd, other)", true),
            ("app notin (slurmd)", false),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("app=slurmd,tier=web", false),
            ("app in (a,b),tier", false),
            ("", true),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&p),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("app in slurmd").is_err());
    }

    #[test]
    fn label_selector_object_form() {
        let p = pod(json!({"app": "slurmd", "protect": "true"}), "n1");
        let sel = json!({"matchLabels": {"app": "slurmd"}, "matchExpressions": [{"key": "protect", "operator": "In", "values": ["true"]}]});
        assert!(LabelSelector::from_object(&sel).matches(&p));
        let sel = json!({"matchLabels": {"app": "other"}});
        assert!(!LabelSelector::from_object(&sel).matches(&p));
    }

    #[test]
    fn field_selectors_as_upstream() {
        let p = pod(json!({}), "n1");
        let s = FieldSelector::parse("pods", "spec.nodeName=n1").unwrap();
        assert!(s.matches(&p));
        let s = FieldSelector::parse("pods", "spec.nodeName!=n1").unwrap();
        assert!(!s.matches(&p));
        let s = FieldSelector::parse("pods", "metadata.name=p,spec.nodeName=n2").unwrap();
        assert!(!s.matches(&p));
        let e = FieldSelector::parse("secrets", "spec.nodeName=n1").unwrap_err();
        assert_eq!(e.code, 400);
        assert_eq!(e.message, "field label not supported: spec.nodeName");
    }
}
