//! How the kubelet turns a pod's volumes and env into bytes, written for the
//! double independently of mountguard's own projection engine (a shared bug
//! must not pass both). Rules from `pkg/volume/{secret,configmap,projected,
//! downwardapi}` and `pkg/kubelet/kubelet_pods.go`.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::{BTreeMap, BTreeSet};

use base64::Engine;
use mountguard_inventory::writer::{Payload, PayloadFile};
use serde_json::Value;

use super::manager::{Manager, ObjKey};
use crate::apiserver::ApiHandle;

/// The kubelet's plugin directory names.
pub fn plugin_dir(volume: &Value) -> Option<&'static str> {
    if volume.get("secret").is_some() {
        Some("kubernetes.io~secret")
    } else if volume.get("configMap").is_some() {
        Some("kubernetes.io~configmap")
    } else if volume.get("projected").is_some() {
        Some("kubernetes.io~projected")
    } else if volume.get("downwardAPI").is_some() {
        Some("kubernetes.io~downward-api")
    } else {
        None
    }
}

fn b64decode(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_default()
}

/// Key -> bytes of a Secret (`data`, base64 in the API).
pub(crate) fn secret_data(obj: &Value) -> BTreeMap<String, Vec<u8>> {
    obj["data"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), b64decode(v.as_str().unwrap_or(""))))
                .collect()
        })
        .unwrap_or_default()
}

/// Key -> bytes of a ConfigMap (`data`, then `binaryData`).
pub(crate) fn configmap_data(obj: &Value) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = obj["data"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").as_bytes().to_vec()))
                .collect()
        })
        .unwrap_or_default();
    if let Some(m) = obj["binaryData"].as_object() {
        for (k, v) in m {
            out.entry(k.clone())
                .or_insert_with(|| b64decode(v.as_str().unwrap_or("")));
        }
    }
    out
}

pub(crate) fn mode_of(v: &Value) -> Option<u32> {
    v.as_u64().map(|m| m as u32)
}

/// Files of one Secret/ConfigMap source with `items`, `optional`, modes.
pub(crate) fn keyed_source(
    data: Option<BTreeMap<String, Vec<u8>>>,
    what: &str,
    source: &Value,
    default_mode: u32,
) -> Result<Payload, String> {
    let optional = source["optional"].as_bool() == Some(true);
    let Some(data) = data else {
        return if optional {
            Ok(Payload::new())
        } else {
            Err(format!("{what} not found"))
        };
    };
    let mut out = Payload::new();
    match source["items"].as_array().filter(|i| !i.is_empty()) {
        None => {
            for (k, v) in data {
                out.insert(k, PayloadFile::with_mode(v, default_mode));
            }
        }
        Some(items) => {
            for it in items {
                let key = it["key"].as_str().unwrap_or("");
                let Some(v) = data.get(key) else {
                    if optional {
                        continue;
                    }
                    return Err(format!("{what} references non-existent key: {key}"));
                };
                let path = it["path"].as_str().unwrap_or(key);
                let mode = mode_of(&it["mode"]).unwrap_or(default_mode);
                out.insert(path.to_string(), PayloadFile::with_mode(v.clone(), mode));
            }
        }
    }
    Ok(out)
}

/// A pod field for downward API and env `fieldRef`.
pub fn field_ref(pod: &Value, path: &str) -> String {
    let map = |m: &Value| {
        m.as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| format!("{k}=\"{}\"\n", v.as_str().unwrap_or("")))
                    .collect::<String>()
            })
            .unwrap_or_default()
    };
    match path {
        "metadata.labels" => map(&pod["metadata"]["labels"]),
        "metadata.annotations" => map(&pod["metadata"]["annotations"]),
        _ => {
            if let Some(rest) = path.strip_prefix("metadata.labels['") {
                let k = rest.trim_end_matches("']");
                return pod["metadata"]["labels"][k]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
            }
            if let Some(rest) = path.strip_prefix("metadata.annotations['") {
                let k = rest.trim_end_matches("']");
                return pod["metadata"]["annotations"][k]
                    .as_str()
                    .unwrap_or("")
                    .to_string();
            }
            let mut cur = pod;
            for p in path.split('.') {
                cur = &cur[p];
            }
            match cur {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            }
        }
    }
}

pub(crate) fn downward_items(pod: &Value, items: &Value, default_mode: u32) -> Payload {
    let mut out = Payload::new();
    for it in items.as_array().into_iter().flatten() {
        let path = it["path"].as_str().unwrap_or("");
        let value = if let Some(f) = it["fieldRef"]["fieldPath"].as_str() {
            field_ref(pod, f)
        } else if let Some(r) = it["resourceFieldRef"]["resource"].as_str() {
            // No resource accounting in the double: "0" for requests/limits.
            let _ = r;
            "0".into()
        } else {
            continue;
        };
        let mode = mode_of(&it["mode"]).unwrap_or(default_mode);
        out.insert(path.to_string(), PayloadFile::with_mode(value, mode));
    }
    out
}

/// A plausible (unsigned) projected service-account token. Deterministic
/// for a pod, audience and expiry, so resyncs do not rewrite the volume (the
/// real kubelet rotates at 80% of the lifetime; the double never does).
pub fn service_account_token(
    pod: &Value,
    node: &str,
    audience: &str,
    expiration_seconds: i64,
) -> String {
    use sha2::Digest;
    let enc = |v: &Value| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(v).unwrap_or_default())
    };
    let iat = pod["metadata"]["creationTimestamp"]
        .as_str()
        .and_then(|t| t.parse::<jiff::Timestamp>().ok())
        .map(|t| t.as_second())
        .unwrap_or(0);
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
    let sa = pod["spec"]["serviceAccountName"]
        .as_str()
        .unwrap_or("default");
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let digest = hex::encode(sha2::Sha256::digest(format!(
        "{uid}|{audience}|{expiration_seconds}"
    )));
    let header = serde_json::json!({"alg": "RS256", "kid": "mountguard-double"});
    let claims = serde_json::json!({
        "aud": [audience], "exp": iat + expiration_seconds, "iat": iat, "nbf": iat,
        "iss": "https://kubernetes.default.svc",
        "sub": format!("system:serviceaccount:{ns}:{sa}"),
        "jti": &digest[..32],
        "kubernetes.io": {
            "namespace": ns,
            "node": {"name": node},
            "pod": {"name": pod["metadata"]["name"], "uid": uid},
            "serviceaccount": {"name": sa},
        },
    });
    format!("{}.{}.{}", enc(&header), enc(&claims), &digest[32..])
}

/// Managers and context needed to build payloads.
#[derive(Debug)]
pub struct Sources<'a> {
    /// API access (Get strategy, serviceAccountToken registration).
    pub api: &'a ApiHandle,
    /// Secret manager.
    pub secrets: &'a mut Manager,
    /// ConfigMap manager.
    pub configmaps: &'a mut Manager,
    /// Node name.
    pub node: &'a str,
}

impl Sources<'_> {
    fn secret(&mut self, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        self.secrets
            .get(self.api, ns, name)
            .ok()
            .map(|o| secret_data(&o))
    }

    fn configmap(&mut self, ns: &str, name: &str) -> Option<BTreeMap<String, Vec<u8>>> {
        self.configmaps
            .get(self.api, ns, name)
            .ok()
            .map(|o| configmap_data(&o))
    }

    /// The payload of one pod volume (None: not a volume the double writes).
    pub fn volume_payload(
        &mut self,
        pod: &Value,
        volume: &Value,
    ) -> Option<Result<Payload, String>> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
        let fs_group = pod["spec"]["securityContext"]["fsGroup"].is_number();
        let result = if let Some(s) = volume.get("secret") {
            let name = s["secretName"].as_str().unwrap_or("");
            let mode = mode_of(&s["defaultMode"]).unwrap_or(0o644);
            let data = self.secret(ns, name);
            keyed_source(data, &format!("secret \"{name}\""), s, mode)
        } else if let Some(c) = volume.get("configMap") {
            let name = c["name"].as_str().unwrap_or("");
            let mode = mode_of(&c["defaultMode"]).unwrap_or(0o644);
            let data = self.configmap(ns, name);
            keyed_source(data, &format!("configmap \"{name}\""), c, mode)
        } else if let Some(d) = volume.get("downwardAPI") {
            let mode = mode_of(&d["defaultMode"]).unwrap_or(0o644);
            Ok(downward_items(pod, &d["items"], mode))
        } else if let Some(p) = volume.get("projected") {
            let mode = mode_of(&p["defaultMode"]).unwrap_or(0o644);
            let mut out = Payload::new();
            let mut err = None;
            for src in p["sources"].as_array().into_iter().flatten() {
                let part = if let Some(s) = src.get("secret") {
                    let name = s["name"].as_str().unwrap_or("");
                    let data = self.secret(ns, name);
                    keyed_source(data, &format!("secret \"{name}\""), s, mode)
                } else if let Some(c) = src.get("configMap") {
                    let name = c["name"].as_str().unwrap_or("");
                    let data = self.configmap(ns, name);
                    keyed_source(data, &format!("configmap \"{name}\""), c, mode)
                } else if let Some(d) = src.get("downwardAPI") {
                    Ok(downward_items(pod, &d["items"], mode))
                } else if let Some(t) = src.get("serviceAccountToken") {
                    let aud = t["audience"]
                        .as_str()
                        .unwrap_or("https://kubernetes.default.svc");
                    let path = t["path"].as_str().unwrap_or("token");
                    let exp = t["expirationSeconds"].as_i64().unwrap_or(3600);
                    let token = service_account_token(pod, self.node, aud, exp);
                    Ok(Payload::from([(
                        path.to_string(),
                        PayloadFile::with_mode(token, mode),
                    )]))
                } else {
                    Ok(Payload::new())
                };
                match part {
                    // Later sources overwrite earlier ones at the same path.
                    Ok(files) => out.extend(files),
                    Err(e) => {
                        err = Some(e);
                        break;
                    }
                }
            }
            match err {
                Some(e) => Err(e),
                None => Ok(out),
            }
        } else {
            return None;
        };
        Some(result.map(|mut p| {
            if fs_group {
                for f in p.values_mut() {
                    f.mode |= 0o440;
                }
            }
            p
        }))
    }

    /// The environment of one container, frozen at its start.
    pub fn container_env(
        &mut self,
        pod: &Value,
        container: &Value,
    ) -> Result<BTreeMap<String, String>, String> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("");
        let text = |b: &Vec<u8>| String::from_utf8_lossy(b).into_owned();
        let mut env = BTreeMap::new();
        for from in container["envFrom"].as_array().into_iter().flatten() {
            let prefix = from["prefix"].as_str().unwrap_or("");
            let (data, optional, what) = if let Some(r) = from.get("configMapRef") {
                let name = r["name"].as_str().unwrap_or("");
                // envFrom a ConfigMap uses `data` only.
                let data = self.configmaps.get(self.api, ns, name).ok().map(|o| {
                    o["data"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.as_str().unwrap_or("").as_bytes().to_vec())
                                })
                                .collect::<BTreeMap<_, _>>()
                        })
                        .unwrap_or_default()
                });
                (
                    data,
                    r["optional"].as_bool() == Some(true),
                    format!("configmap \"{name}\""),
                )
            } else if let Some(r) = from.get("secretRef") {
                let name = r["name"].as_str().unwrap_or("");
                (
                    self.secret(ns, name),
                    r["optional"].as_bool() == Some(true),
                    format!("secret \"{name}\""),
                )
            } else {
                continue;
            };
            match data {
                Some(d) => {
                    for (k, v) in d {
                        env.insert(format!("{prefix}{k}"), text(&v));
                    }
                }
                None if optional => {}
                None => return Err(format!("{what} not found")),
            }
        }
        for e in container["env"].as_array().into_iter().flatten() {
            let name = e["name"].as_str().unwrap_or("").to_string();
            if let Some(v) = e["value"].as_str() {
                env.insert(name, v.to_string());
                continue;
            }
            let vf = &e["valueFrom"];
            let (lookup, r, what) = if let Some(r) = vf.get("secretKeyRef") {
                let n = r["name"].as_str().unwrap_or("");
                (self.secret(ns, n), r, format!("secret \"{n}\""))
            } else if let Some(r) = vf.get("configMapKeyRef") {
                let n = r["name"].as_str().unwrap_or("");
                let data = self.configmaps.get(self.api, ns, n).ok().map(|o| {
                    o["data"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.as_str().unwrap_or("").as_bytes().to_vec())
                                })
                                .collect::<BTreeMap<_, _>>()
                        })
                        .unwrap_or_default()
                });
                (data, r, format!("configmap \"{n}\""))
            } else if let Some(f) = vf["fieldRef"]["fieldPath"].as_str() {
                env.insert(name, field_ref(pod, f));
                continue;
            } else {
                env.insert(name, String::new());
                continue;
            };
            let optional = r["optional"].as_bool() == Some(true);
            let key = r["key"].as_str().unwrap_or("");
            match lookup.as_ref().and_then(|d| d.get(key)) {
                Some(v) => {
                    env.insert(name, text(v));
                }
                None if optional => {}
                None => return Err(format!("couldn't find key {key} in {what}")),
            }
        }
        Ok(env)
    }
}

/// The Secret and ConfigMap names a pod references, as the kubelet
/// registers them with its managers: `pkg/api/v1/pod/util.go`
/// `VisitPodSecretNames` (imagePullSecrets; env and envFrom of init, regular
/// and ephemeral containers; secret and projected volumes; the secretRef of
/// azureFile, cephfs, cinder, flexVolume, iscsi, rbd, scaleIO, storageOS and
/// CSI `nodePublishSecretRef`) and `VisitPodConfigmapNames` (env, envFrom,
/// configMap and projected volumes); empty names are skipped
/// (`skipEmptyNames`).
pub fn referenced_names(pod: &Value) -> (BTreeSet<ObjKey>, BTreeSet<ObjKey>) {
    let ns = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let mut secrets = BTreeSet::new();
    let mut cms = BTreeSet::new();
    let add = |set: &mut BTreeSet<ObjKey>, n: &Value| {
        if let Some(n) = n.as_str().filter(|n| !n.is_empty()) {
            set.insert((ns.clone(), n.to_string()));
        }
    };
    for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
        add(&mut secrets, &v["secret"]["secretName"]);
        add(&mut cms, &v["configMap"]["name"]);
        for s in v["projected"]["sources"].as_array().into_iter().flatten() {
            add(&mut secrets, &s["secret"]["name"]);
            add(&mut cms, &s["configMap"]["name"]);
        }
        add(&mut secrets, &v["azureFile"]["secretName"]);
        for plugin in [
            "cephfs",
            "cinder",
            "flexVolume",
            "iscsi",
            "rbd",
            "scaleIO",
            "storageos",
        ] {
            add(&mut secrets, &v[plugin]["secretRef"]["name"]);
        }
        add(&mut secrets, &v["csi"]["nodePublishSecretRef"]["name"]);
    }
    for s in pod["spec"]["imagePullSecrets"]
        .as_array()
        .into_iter()
        .flatten()
    {
        add(&mut secrets, &s["name"]);
    }
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for c in pod["spec"][list].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                add(&mut secrets, &e["valueFrom"]["secretKeyRef"]["name"]);
                add(&mut cms, &e["valueFrom"]["configMapKeyRef"]["name"]);
            }
            for e in c["envFrom"].as_array().into_iter().flatten() {
                add(&mut secrets, &e["secretRef"]["name"]);
                add(&mut cms, &e["configMapRef"]["name"]);
            }
        }
    }
    (secrets, cms)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::{ApiServerDouble, resources};
    use crate::kubelet::manager::Strategy;
    use serde_json::json;

    fn enc(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    async fn setup() -> (ApiServerDouble, Manager, Manager) {
        let api = ApiServerDouble::start().await.unwrap();
        let h = api.handle();
        h.create(
            &resources::SECRETS,
            "default",
            json!({"metadata": {"name": "s"}, "data": {"a": enc("A"), "b": enc("B")}}),
        )
        .unwrap();
        h.create(
            &resources::CONFIGMAPS,
            "default",
            json!({"metadata": {"name": "c"}, "data": {"a": "cm-a", "x": "X"}, "binaryData": {"bin": enc("\u{1}\u{2}")}}),
        )
        .unwrap();
        (
            api,
            Manager::new(Strategy::Get, resources::SECRETS),
            Manager::new(Strategy::Get, resources::CONFIGMAPS),
        )
    }

    fn pod(volumes: Value, fs_group: bool) -> Value {
        let mut p = json!({"metadata": {"name": "p", "namespace": "default", "uid": "u1", "labels": {"b": "2", "a": "1"}},
                           "spec": {"nodeName": "n1", "volumes": volumes}});
        if fs_group {
            p["spec"]["securityContext"] = json!({"fsGroup": 1000});
        }
        p
    }

    fn files(p: &Payload) -> Vec<(String, Vec<u8>, u32)> {
        p.iter()
            .map(|(k, f)| (k.clone(), f.data.clone(), f.mode))
            .collect()
    }

    #[tokio::test]
    async fn kubelet_projection_rules() {
        let (api, mut s, mut c) = setup().await;
        let h = api.handle();
        let mut src = Sources {
            api: &h,
            secrets: &mut s,
            configmaps: &mut c,
            node: "n1",
        };
        let vols = json!([
            {"name": "all", "secret": {"secretName": "s"}},
            {"name": "items", "secret": {"secretName": "s", "defaultMode": 0o400, "items": [{"key": "b", "path": "dir/b.txt", "mode": 0o600}, {"key": "a", "path": "a"}]}},
            {"name": "cm", "configMap": {"name": "c"}},
            {"name": "missing-opt", "configMap": {"name": "nope", "optional": true}},
            {"name": "missing", "configMap": {"name": "nope"}},
            {"name": "badkey", "secret": {"secretName": "s", "items": [{"key": "zz", "path": "zz"}]}},
            {"name": "badkey-opt", "secret": {"secretName": "s", "optional": true, "items": [{"key": "zz", "path": "zz"}, {"key": "a", "path": "a"}]}},
            {"name": "proj", "projected": {"defaultMode": 0o440, "sources": [
                {"secret": {"name": "s", "items": [{"key": "a", "path": "same"}]}},
                {"configMap": {"name": "c", "items": [{"key": "a", "path": "same"}]}},
                {"configMap": {"name": "nope", "optional": true}},
                {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
            ]}},
        ]);
        let p = pod(vols.clone(), false);
        let get = |src: &mut Sources, i: usize| src.volume_payload(&p, &vols[i]).unwrap();
        assert_eq!(
            files(&get(&mut src, 0).unwrap()),
            vec![
                ("a".into(), b"A".to_vec(), 0o644),
                ("b".into(), b"B".to_vec(), 0o644)
            ]
        );
        assert_eq!(
            files(&get(&mut src, 1).unwrap()),
            vec![
                ("a".into(), b"A".to_vec(), 0o400),
                ("dir/b.txt".into(), b"B".to_vec(), 0o600)
            ]
        );
        let cm = get(&mut src, 2).unwrap();
        assert_eq!(cm["bin"].data, vec![1, 2], "binaryData decoded");
        assert_eq!(cm["a"].data, b"cm-a");
        assert!(get(&mut src, 3).unwrap().is_empty());
        assert!(get(&mut src, 4).unwrap_err().contains("not found"));
        assert!(
            get(&mut src, 5)
                .unwrap_err()
                .contains("non-existent key: zz")
        );
        assert_eq!(get(&mut src, 6).unwrap().keys().collect::<Vec<_>>(), ["a"]);
        let proj = get(&mut src, 7).unwrap();
        assert_eq!(proj["same"].data, b"cm-a", "later projected source wins");
        assert_eq!(proj["same"].mode, 0o440);
        assert_eq!(proj["labels"].data, b"a=\"1\"\nb=\"2\"\n");
        // fsGroup adds group read.
        let pg = pod(vols.clone(), true);
        let s0 = src
            .volume_payload(
                &pg,
                &json!({"name": "x", "secret": {"secretName": "s", "defaultMode": 0o600}}),
            )
            .unwrap()
            .unwrap();
        assert_eq!(s0["a"].mode, 0o640);
        // Not a kubelet-written volume.
        assert!(
            src.volume_payload(&p, &json!({"name": "e", "emptyDir": {}}))
                .is_none()
        );
    }

    #[tokio::test]
    async fn kubelet_env_rules() {
        let (api, mut s, mut c) = setup().await;
        let h = api.handle();
        let mut src = Sources {
            api: &h,
            secrets: &mut s,
            configmaps: &mut c,
            node: "n1",
        };
        let p = pod(json!([]), false);
        let container = json!({"name": "c",
        "envFrom": [{"configMapRef": {"name": "c"}, "prefix": "CM_"}, {"secretRef": {"name": "s"}}],
        "env": [
            {"name": "a", "value": "literal wins"},
            {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "b"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "nope", "optional": true}}},
        ]});
        let env = src.container_env(&p, &container).unwrap();
        assert_eq!(env["CM_a"], "cm-a");
        assert!(
            !env.contains_key("CM_bin"),
            "envFrom a ConfigMap uses data only"
        );
        assert_eq!(env["a"], "literal wins");
        assert_eq!(env["b"], "B");
        assert_eq!(env["FROM_SECRET"], "B");
        assert_eq!(env["NODE"], "n1");
        assert!(!env.contains_key("OPT"));
        let bad = json!({"name": "c", "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "bin"}}}]});
        assert!(
            src.container_env(&p, &bad)
                .unwrap_err()
                .contains("couldn't find key bin")
        );
    }

    #[test]
    fn referenced_names_cover_volumes_env_and_pull_secrets() {
        let p = json!({"metadata": {"namespace": "ns"}, "spec": {
            "imagePullSecrets": [{"name": "pull"}],
            "volumes": [{"secret": {"secretName": "s1"}}, {"projected": {"sources": [{"configMap": {"name": "c1"}}, {"secret": {"name": "s2"}}]}}],
            "initContainers": [{"envFrom": [{"configMapRef": {"name": "c2"}}]}],
            "containers": [{"env": [{"valueFrom": {"secretKeyRef": {"name": "s3"}}}]}],
        }});
        let (s, c) = referenced_names(&p);
        let names = |set: BTreeSet<ObjKey>| set.into_iter().map(|(_, n)| n).collect::<Vec<_>>();
        assert_eq!(names(s), ["pull", "s1", "s2", "s3"]);
        assert_eq!(names(c), ["c1", "c2"]);
    }

    #[test]
    fn referenced_names_cover_other_volume_types_and_ephemeral_containers() {
        let p = json!({"metadata": {"namespace": "ns"}, "spec": {
            "volumes": [
                {"azureFile": {"secretName": "az"}},
                {"cephfs": {"secretRef": {"name": "ceph"}}},
                {"cinder": {"secretRef": {"name": "cinder"}}},
                {"flexVolume": {"secretRef": {"name": "flex"}}},
                {"iscsi": {"secretRef": {"name": "iscsi"}}},
                {"rbd": {"secretRef": {"name": "rbd"}}},
                {"scaleIO": {"secretRef": {"name": "scaleio"}}},
                {"storageos": {"secretRef": {"name": "sos"}}},
                {"csi": {"nodePublishSecretRef": {"name": "csi"}}},
                {"csi": {"nodePublishSecretRef": {"name": ""}}},
                {"emptyDir": {}}
            ],
            "ephemeralContainers": [{"env": [{"valueFrom": {"configMapKeyRef": {"name": "dbg"}}}]}],
        }});
        let (s, c) = referenced_names(&p);
        let names = |set: BTreeSet<ObjKey>| set.into_iter().map(|(_, n)| n).collect::<Vec<_>>();
        assert_eq!(
            names(s),
            [
                "az", "ceph", "cinder", "csi", "flex", "iscsi", "rbd", "scaleio", "sos"
            ]
        );
        assert_eq!(names(c), ["dbg"]);
    }
}
