//! The edge: k8s-openapi objects (and raw JSON items) into the compact
//! model. Secret and ConfigMap values are hashed here and never stored.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStatus, EnvFromSource, EnvVar, Pod, Secret,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

use crate::READ_AT_START_ANNOTATION;
use mountguard_core::PodUid;
use mountguard_core::model::{
    ContainerKind, ContainerModel, ControllerKind, ControllerRef, EnvRef, ExtraRefs, Interner,
    KeyToPath, MountModel, NodeSetMember, PodModel, ProjectedSource, SkipReason, SourceContent,
    SourceKind, SourceProjection, SourceRef, VolumeModel, VolumeSource, parse_read_at_start,
};

/// The newest `managedFields[].time`, else `creationTimestamp`.
pub fn last_write(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter_map(|m| m.time.as_ref().map(|t| t.0))
        .max()
        .or_else(|| meta.creation_timestamp.as_ref().map(|t| t.0))
}

fn source_ref(interner: &mut Interner, kind: SourceKind, meta: &ObjectMeta) -> Option<SourceRef> {
    Some(SourceRef::new(
        kind,
        interner.intern(meta.namespace.as_deref()?),
        interner.intern(meta.name.as_deref()?),
    ))
}

/// Hashes a Secret: `data` (already decoded from base64) with `stringData`
/// merged over it, as the API server does on write. `None` without
/// namespace or name.
pub fn secret(interner: &mut Interner, s: &Secret) -> Option<(SourceRef, SourceContent)> {
    let r = source_ref(interner, SourceKind::Secret, &s.metadata)?;
    let mut values: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for (k, v) in s.data.iter().flatten() {
        values.insert(k, &v.0);
    }
    for (k, v) in s.string_data.iter().flatten() {
        values.insert(k, v.as_bytes());
    }
    let content = SourceContent::from_plain(
        interner,
        s.immutable.unwrap_or(false),
        values.into_iter().map(|(k, v)| (k, v, false)),
        s.metadata.uid.as_deref(),
        last_write(&s.metadata),
    );
    Some((r, content))
}

/// Hashes a ConfigMap: `data` and `binaryData`.
pub fn config_map(interner: &mut Interner, c: &ConfigMap) -> Option<(SourceRef, SourceContent)> {
    let r = source_ref(interner, SourceKind::ConfigMap, &c.metadata)?;
    let data = c
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.as_bytes(), false));
    let binary = c
        .binary_data
        .iter()
        .flatten()
        .map(|(k, v)| (k.as_str(), v.0.as_slice(), true));
    let content = SourceContent::from_plain(
        interner,
        c.immutable.unwrap_or(false),
        data.chain(binary),
        c.metadata.uid.as_deref(),
        last_write(&c.metadata),
    );
    Some((r, content))
}

fn items(
    interner: &mut Interner,
    items: Option<&Vec<k8s_openapi::api::core::v1::KeyToPath>>,
) -> Option<Box<[KeyToPath]>> {
    items.filter(|v| !v.is_empty()).map(|v| {
        v.iter()
            .map(|i| KeyToPath {
                key: interner.intern(&i.key),
                path: interner.intern(&i.path),
            })
            .collect()
    })
}

/// Extra facts only the raw JSON has (fields newer than the k8s-openapi
/// version compiled in): podCertificate paths per (volume index, source
/// index).
#[derive(Debug, Default)]
pub struct RawPodExtras {
    pod_certificate_paths: BTreeMap<(usize, usize), Vec<String>>,
}

impl RawPodExtras {
    /// Reads the extras from a pod's raw JSON.
    pub fn from_json(pod: &Value) -> Self {
        let mut out = Self::default();
        let Some(volumes) = pod.pointer("/spec/volumes").and_then(Value::as_array) else {
            return out;
        };
        for (vi, v) in volumes.iter().enumerate() {
            let Some(sources) = v.pointer("/projected/sources").and_then(Value::as_array) else {
                continue;
            };
            for (si, s) in sources.iter().enumerate() {
                if let Some(pc) = s.get("podCertificate") {
                    let paths = ["credentialBundlePath", "keyPath", "certificateChainPath"]
                        .iter()
                        .filter_map(|k| pc.get(*k).and_then(Value::as_str))
                        .filter(|s| !s.is_empty())
                        .map(str::to_string)
                        .collect();
                    out.pod_certificate_paths.insert((vi, si), paths);
                }
            }
        }
        out
    }
}

/// Builds the compact model of a pod. `extras` carries facts from the raw
/// JSON that the compiled-in API version drops.
pub fn pod(interner: &mut Interner, p: &Pod, extras: &RawPodExtras) -> Option<PodModel> {
    let meta = &p.metadata;
    let namespace = meta.namespace.as_deref()?;
    // A pod's name and UID are its own: interning them would only cost the
    // interner an entry per pod (the UID is 16 bytes inline), and the name
    // is a plain box (no reference counts: 16 bytes less per pod).
    let name: Box<str> = meta.name.as_deref()?.into();
    let uid = PodUid::new(meta.uid.as_deref()?);
    let read_at_start: Vec<&str> = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(READ_AT_START_ANNOTATION))
        .map(|v| parse_read_at_start(v).collect())
        .unwrap_or_default();
    let nodeset = meta.owner_references.iter().flatten().find_map(|o| {
        (o.kind == "NodeSet"
            && o.api_version.starts_with("slinky.slurm.net/")
            && o.controller == Some(true))
        .then(|| interner.intern(&o.name))
    });
    let workload = meta.owner_references.iter().flatten().find_map(|o| {
        let kind = ControllerKind::of_owner(&o.api_version, &o.kind)?;
        (o.controller == Some(true))
            .then(|| ControllerRef::boxed(kind, interner.intern(&o.name), &o.uid))?
    });
    let spec = p.spec.as_ref()?;
    let status = p.status.as_ref();
    let terminated = status
        .and_then(|s| s.phase.as_deref())
        .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));

    let mut volumes: Vec<VolumeModel> = Vec::new();
    for (vi, v) in spec.volumes.iter().flatten().enumerate() {
        let source = if let Some(s) = &v.secret {
            let Some(n) = s.secret_name.as_deref() else {
                continue;
            };
            VolumeSource::Object(SourceProjection {
                kind: SourceKind::Secret,
                name: interner.intern(n),
                items: items(interner, s.items.as_ref()),
                optional: s.optional.unwrap_or(false),
            })
        } else if let Some(c) = &v.config_map {
            VolumeSource::Object(SourceProjection {
                kind: SourceKind::ConfigMap,
                name: interner.intern(&c.name),
                items: items(interner, c.items.as_ref()),
                optional: c.optional.unwrap_or(false),
            })
        } else if let Some(pr) = &v.projected {
            let mut sources = Vec::new();
            for (si, s) in pr.sources.iter().flatten().enumerate() {
                let src = if let Some(sec) = &s.secret {
                    ProjectedSource::Object(SourceProjection {
                        kind: SourceKind::Secret,
                        name: interner.intern(&sec.name),
                        items: items(interner, sec.items.as_ref()),
                        optional: sec.optional.unwrap_or(false),
                    })
                } else if let Some(cm) = &s.config_map {
                    ProjectedSource::Object(SourceProjection {
                        kind: SourceKind::ConfigMap,
                        name: interner.intern(&cm.name),
                        items: items(interner, cm.items.as_ref()),
                        optional: cm.optional.unwrap_or(false),
                    })
                } else if let Some(d) = &s.downward_api {
                    ProjectedSource::NotFromApi {
                        reason: SkipReason::DownwardApi,
                        paths: d
                            .items
                            .iter()
                            .flatten()
                            .map(|i| interner.intern(&i.path))
                            .collect(),
                    }
                } else if let Some(t) = &s.service_account_token {
                    ProjectedSource::NotFromApi {
                        reason: SkipReason::ServiceAccountToken,
                        paths: Box::new([interner.intern(&t.path)]),
                    }
                } else if let Some(c) = &s.cluster_trust_bundle {
                    ProjectedSource::NotFromApi {
                        reason: SkipReason::ClusterTrustBundle,
                        paths: Box::new([interner.intern(&c.path)]),
                    }
                } else if let Some(paths) = extras.pod_certificate_paths.get(&(vi, si)) {
                    ProjectedSource::NotFromApi {
                        reason: SkipReason::PodCertificate,
                        paths: paths.iter().map(|p| interner.intern(p)).collect(),
                    }
                } else {
                    ProjectedSource::NotFromApi {
                        reason: SkipReason::UnknownSource,
                        paths: Box::new([]),
                    }
                };
                sources.push(src);
            }
            VolumeSource::Projected(sources.into())
        } else {
            continue;
        };
        volumes.push(VolumeModel {
            name: interner.intern(&v.name),
            source: interner.intern_volume_source(source),
            read_at_start: read_at_start.contains(&v.name.as_str()),
        });
    }

    // Every container `pkg/api/v1/pod/util.go` `VisitContainers` walks
    // (regular, init, ephemeral; listed here in that order, which fixes the
    // subjects' container indexes), each with the start time of the process
    // that read its env and mounts.
    fn status_of<'a>(
        list: Option<&'a Vec<ContainerStatus>>,
        name: &str,
    ) -> Option<&'a ContainerState> {
        list?.iter().find(|s| s.name == name)?.state.as_ref()
    }
    let running_since =
        |st: Option<&ContainerState>| st?.running.as_ref()?.started_at.as_ref().map(|t| t.0);
    let terminated_since =
        |st: Option<&ContainerState>| st?.terminated.as_ref()?.started_at.as_ref().map(|t| t.0);
    let mut containers = Vec::new();
    let mut other_refs = Vec::new();
    for c in &spec.containers {
        let st = status_of(status.and_then(|s| s.container_statuses.as_ref()), &c.name);
        let parts = ContainerParts::of(c);
        containers.push(container(
            interner,
            parts,
            ContainerKind::Regular,
            running_since(st),
            false,
            &volumes,
        ));
    }
    for c in spec.init_containers.iter().flatten() {
        let st = status_of(
            status.and_then(|s| s.init_container_statuses.as_ref()),
            &c.name,
        );
        // A sidecar (`restartPolicy: Always`) restarts like a regular
        // container; any other init container that terminated ran once
        // (`pkg/api/v1/pod/util.go` `IsRestartableInitContainer`).
        let sidecar = c.restart_policy.as_deref() == Some("Always");
        let (started_at, finished) = match running_since(st) {
            Some(t) => (Some(t), false),
            None if !sidecar => match terminated_since(st) {
                Some(t) => (Some(t), true),
                None => (None, false),
            },
            None => (None, false),
        };
        let parts = ContainerParts::of(c);
        containers.push(container(
            interner,
            parts,
            ContainerKind::Init,
            started_at,
            finished,
            &volumes,
        ));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        let st = status_of(
            status.and_then(|s| s.ephemeral_container_statuses.as_ref()),
            &c.name,
        );
        let parts = ContainerParts {
            name: &c.name,
            mounts: c.volume_mounts.as_deref().unwrap_or_default(),
            env: c.env.as_deref().unwrap_or_default(),
            env_from: c.env_from.as_deref().unwrap_or_default(),
        };
        let exited = st.is_some_and(|s| s.terminated.is_some());
        let model = container(
            interner,
            parts,
            ContainerKind::Ephemeral,
            running_since(st),
            false,
            &volumes,
        );
        if exited {
            // Ephemeral containers never restart: no verdicts, but the
            // kubelet still counts their references.
            other_refs.extend(model.env.iter().map(|e| {
                let (kind, name) = e.target();
                (kind, name.clone())
            }));
        } else {
            containers.push(model);
        }
    }
    // The secretRefs of other volume types, as `VisitPodSecretNames` visits
    // them.
    for v in spec.volumes.iter().flatten() {
        let name = if let Some(x) = &v.azure_file {
            Some(x.secret_name.as_str())
        } else if let Some(x) = &v.cephfs {
            x.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(x) = &v.cinder {
            x.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(x) = &v.flex_volume {
            x.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(x) = &v.rbd {
            x.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(x) = &v.scale_io {
            Some(x.secret_ref.name.as_str())
        } else if let Some(x) = &v.iscsi {
            x.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(x) = &v.storageos {
            x.secret_ref.as_ref().map(|r| r.name.as_str())
        } else if let Some(x) = &v.csi {
            x.node_publish_secret_ref.as_ref().map(|r| r.name.as_str())
        } else {
            None
        };
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            other_refs.push((SourceKind::Secret, interner.intern(n)));
        }
    }
    other_refs.sort();
    other_refs.dedup();

    Some(PodModel {
        uid,
        place: interner.intern_place(namespace, spec.node_name.as_deref()),
        name,
        terminated,
        terminating: meta.deletion_timestamp.is_some(),
        synced_at: status
            .and_then(|s| s.start_time.as_ref())
            .map(|t| t.0.into()),
        ready,
        slinky: nodeset.and_then(|nodeset| {
            let slurm_node = meta
                .labels
                .as_ref()
                .and_then(|l| l.get(mountguard_core::remediation::POD_HOSTNAME_LABEL))
                .map(|h| interner.intern(h));
            NodeSetMember::boxed(nodeset, slurm_node)
        }),
        workload,
        volumes: interner.intern_volumes(volumes),
        containers: containers.into(),
        extra_refs: ExtraRefs::new(
            spec.image_pull_secrets
                .iter()
                .flatten()
                .filter(|s| !s.name.is_empty())
                .map(|s| interner.intern(&s.name))
                .collect(),
            other_refs,
        ),
    })
}

/// The parts of a regular, init or ephemeral container the model needs.
struct ContainerParts<'a> {
    name: &'a str,
    mounts: &'a [VolumeMount],
    env: &'a [EnvVar],
    env_from: &'a [EnvFromSource],
}

impl<'a> ContainerParts<'a> {
    fn of(c: &'a Container) -> Self {
        Self {
            name: &c.name,
            mounts: c.volume_mounts.as_deref().unwrap_or_default(),
            env: c.env.as_deref().unwrap_or_default(),
            env_from: c.env_from.as_deref().unwrap_or_default(),
        }
    }
}

fn container(
    interner: &mut Interner,
    c: ContainerParts<'_>,
    kind: ContainerKind,
    started_at: Option<Timestamp>,
    finished: bool,
    volumes: &[VolumeModel],
) -> ContainerModel {
    let mut mounts = Vec::new();
    for (i, m) in c.mounts.iter().enumerate() {
        let Some(vi) = volumes.iter().position(|v| *v.name == *m.name) else {
            continue;
        };
        let sub_path = m.sub_path.as_deref().filter(|s| !s.is_empty());
        let expr = m.sub_path_expr.as_deref().is_some_and(|s| !s.is_empty());
        if finished && (sub_path.is_some() || expr) {
            // The bind of a finished init container is read by nobody.
            continue;
        }
        if sub_path.is_none() && !expr && !volumes[vi].read_at_start {
            continue;
        }
        mounts.push(MountModel {
            index: i as u32,
            volume: vi as u16,
            sub_path: sub_path.map(|s| interner.intern(s)),
            sub_path_expr: expr && sub_path.is_none(),
        });
    }
    let mut env = Vec::new();
    for e in c.env {
        let Some(vf) = &e.value_from else { continue };
        if let Some(s) = &vf.secret_key_ref {
            env.push(EnvRef::Key {
                var: interner.intern(&e.name),
                kind: SourceKind::Secret,
                name: interner.intern(&s.name),
                key: interner.intern(&s.key),
                optional: s.optional.unwrap_or(false),
            });
        } else if let Some(s) = &vf.config_map_key_ref {
            env.push(EnvRef::Key {
                var: interner.intern(&e.name),
                kind: SourceKind::ConfigMap,
                name: interner.intern(&s.name),
                key: interner.intern(&s.key),
                optional: s.optional.unwrap_or(false),
            });
        }
    }
    for ef in c.env_from {
        let prefix = interner.intern(ef.prefix.as_deref().unwrap_or(""));
        if let Some(s) = &ef.secret_ref {
            env.push(EnvRef::From {
                kind: SourceKind::Secret,
                name: interner.intern(&s.name),
                prefix,
                optional: s.optional.unwrap_or(false),
            });
        } else if let Some(s) = &ef.config_map_ref {
            env.push(EnvRef::From {
                kind: SourceKind::ConfigMap,
                name: interner.intern(&s.name),
                prefix,
                optional: s.optional.unwrap_or(false),
            });
        }
    }
    ContainerModel {
        name: interner.intern(c.name),
        kind,
        started: started_at.map(Into::into),
        finished,
        mounts: interner.intern_mounts(mounts),
        env: interner.intern_env(env),
    }
}

/// Describes a raw item for error messages: `Kind namespace/name`.
pub fn describe_item(item: &Value) -> String {
    let kind = item.get("kind").and_then(Value::as_str).unwrap_or("?");
    let ns = item
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("");
    let name = item
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?");
    if ns.is_empty() {
        format!("{kind} {name}")
    } else {
        format!("{kind} {ns}/{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mountguard_core::model::{CompactTime, Interner, VolumeSource};
    use mountguard_inventory::file_digest;
    use serde_json::json;

    fn kaa_pod() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "namespace": "slurm", "name": "worker-0", "uid": "u-0",
                "annotations": {"mountguard.io/read-at-start": " slurm-etc , hooks,"},
                "labels": {"nodeset.slinky.slurm.net/pod-hostname": "gpu-0"},
                "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                    "name": "gpu", "uid": "ns-uid", "controller": true}]
            },
            "spec": {
                "nodeName": "node-a",
                "imagePullSecrets": [{"name": "regcred"}],
                "volumes": [
                    {"name": "slurm-etc", "projected": {"defaultMode": 384, "sources": [
                        {"secret": {"name": "auth", "items": [{"key": "slurm.key", "path": "slurm.key"}]}},
                        {"podCertificate": {"signerName": "x/y", "keyType": "ED25519",
                            "credentialBundlePath": "cred.pem"}}
                    ]}},
                    {"name": "hooks", "configMap": {"name": "enroot-hooks", "optional": true}},
                    {"name": "scratch", "emptyDir": {}},
                    {"name": "kube-api-access-abcde", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}
                    ]}}
                ],
                "initContainers": [
                    {"name": "done-init", "image": "x"},
                    {"name": "sidecar", "image": "x", "restartPolicy": "Always",
                     "envFrom": [{"secretRef": {"name": "side"}, "prefix": "S_"}]}
                ],
                "containers": [{
                    "name": "slurmd", "image": "x",
                    "volumeMounts": [
                        {"name": "scratch", "mountPath": "/tmp"},
                        {"name": "slurm-etc", "mountPath": "/etc/slurm"},
                        {"name": "hooks", "mountPath": "/etc/enroot/hooks.d/10.sh", "subPath": "10.sh"},
                        {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}
                    ],
                    "env": [
                        {"name": "PLAIN", "value": "x"},
                        {"name": "JWT", "valueFrom": {"secretKeyRef": {"name": "jwt", "key": "jwt.key", "optional": true}}},
                        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
                    ],
                    "envFrom": [{"configMapRef": {"name": "env-cm"}}]
                }]
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "slurmd", "ready": true, "restartCount": 0, "image": "x", "imageID": "",
                    "state": {"running": {"startedAt": "2026-11-30T10:00:00Z"}}}],
                "initContainerStatuses": [
                    {"name": "done-init", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
                     "state": {"terminated": {"exitCode": 0, "startedAt": "2026-11-30T09:59:00Z", "finishedAt": "2026-11-30T09:59:30Z"}}},
                    {"name": "sidecar", "ready": true, "restartCount": 0, "image": "x", "imageID": "",
                     "state": {"running": {"startedAt": "2026-11-30T09:59:40Z"}}}
                ]
            }
        })
    }

    #[test]
    fn pod_conversion_keeps_what_the_engine_needs() {
        let raw = kaa_pod();
        let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
        let mut it = Interner::default();
        let m = super::pod(&mut it, &pod, &RawPodExtras::from_json(&raw)).unwrap();
        assert_eq!(
            (&**m.namespace(), &*m.name, &*m.uid.to_string()),
            ("slurm", "worker-0", "u-0")
        );
        assert_eq!(m.node_name(), Some("node-a"));
        assert_eq!(m.nodeset(), Some("gpu"));
        assert_eq!(m.slurm_node(), Some("gpu-0"));
        assert!(!m.terminated);
        assert!(m.ready);
        let mut not_ready = raw.clone();
        not_ready["status"]["conditions"][0]["status"] = serde_json::json!("False");
        let p2: Pod = serde_json::from_value(not_ready.clone()).unwrap();
        let m2 = super::pod(&mut it, &p2, &RawPodExtras::from_json(&not_ready)).unwrap();
        assert!(!m2.ready);
        let names: Vec<&str> = m.volumes.iter().map(|v| &*v.name).collect();
        assert_eq!(
            names,
            ["slurm-etc", "hooks", "kube-api-access-abcde"],
            "emptyDir left out"
        );
        assert!(m.volumes[0].read_at_start && m.volumes[1].read_at_start);
        assert!(!m.volumes[2].read_at_start);
        match &*m.volumes[0].source {
            VolumeSource::Projected(s) => {
                assert_eq!(
                    s[1],
                    ProjectedSource::NotFromApi {
                        reason: SkipReason::PodCertificate,
                        paths: Box::new([it.intern("cred.pem")]),
                    },
                    "podCertificate paths come from the raw JSON"
                );
            }
            other => panic!("{other:?}"),
        }
        // Containers: slurmd, then the init containers: the finished one
        // keeps its references and its start time, the sidecar runs.
        let cs: Vec<(&str, ContainerKind, bool, Option<Timestamp>)> = m
            .containers
            .iter()
            .map(|c| (&*c.name, c.kind, c.finished, c.started_at()))
            .collect();
        let t = |s: &str| Some(s.parse::<Timestamp>().unwrap());
        assert_eq!(
            cs,
            [
                (
                    "slurmd",
                    ContainerKind::Regular,
                    false,
                    t("2026-11-30T10:00:00Z")
                ),
                (
                    "done-init",
                    ContainerKind::Init,
                    true,
                    t("2026-11-30T09:59:00Z")
                ),
                (
                    "sidecar",
                    ContainerKind::Init,
                    false,
                    t("2026-11-30T09:59:40Z")
                ),
            ]
        );
        let slurmd = &m.containers[0];
        assert_eq!(
            slurmd.started_at(),
            Some("2026-11-30T10:00:00Z".parse().unwrap())
        );
        // Mount indexes are positions in volumeMounts: slurm-etc (read at
        // start) is 1, the hooks subPath is 2.
        let mounts: Vec<(u32, u16, Option<&str>)> = slurmd
            .mounts
            .iter()
            .map(|mm| (mm.index, mm.volume, mm.sub_path.as_deref()))
            .collect();
        assert_eq!(mounts, [(1, 0, None), (2, 1, Some("10.sh"))]);
        assert_eq!(
            slurmd.env.len(),
            2,
            "fieldRef and plain values are not references"
        );
        assert!(
            matches!(&slurmd.env[0], EnvRef::Key { key, optional: true, .. } if &**key == "jwt.key")
        );
        assert!(matches!(
            &slurmd.env[1],
            EnvRef::From {
                kind: SourceKind::ConfigMap,
                ..
            }
        ));
        let refs: Vec<String> = m.references().iter().map(ToString::to_string).collect();
        assert_eq!(
            refs,
            [
                "Secret/slurm/auth",
                "Secret/slurm/jwt",
                "Secret/slurm/regcred",
                "Secret/slurm/side",
                "ConfigMap/slurm/enroot-hooks",
                "ConfigMap/slurm/env-cm",
                "ConfigMap/slurm/kube-root-ca.crt",
            ]
        );
    }

    #[test]
    fn the_controlling_apps_owner_is_kept_and_only_that() {
        use mountguard_core::model::ControllerKind as K;
        let t = [
            ("apps/v1", "ReplicaSet", Some(true), Some(K::ReplicaSet)),
            ("apps/v1", "StatefulSet", Some(true), Some(K::StatefulSet)),
            ("apps/v1", "DaemonSet", Some(true), Some(K::DaemonSet)),
            ("apps/v1", "ReplicaSet", None, None),
            ("apps/v1", "Deployment", Some(true), None),
            ("batch/v1", "Job", Some(true), None),
            ("example.com/v1", "ReplicaSet", Some(true), None),
        ];
        for (api_version, kind, controller, want) in t {
            let mut raw = kaa_pod();
            raw["metadata"]["ownerReferences"] = serde_json::json!([{
                "apiVersion": api_version, "kind": kind, "name": "web-7d9f",
                "uid": "o-uid", "controller": controller,
            }]);
            let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
            let m = super::pod(
                &mut Interner::default(),
                &pod,
                &RawPodExtras::from_json(&raw),
            )
            .unwrap();
            let got = m.controller().map(|c| (c.kind, &*c.name));
            assert_eq!(
                got,
                want.map(|k| (k, "web-7d9f")),
                "{api_version} {kind} {controller:?}"
            );
            assert_eq!(m.nodeset(), None);
        }
    }

    #[test]
    fn secrets_are_decoded_and_hashed_config_maps_keep_binary_keys() {
        let s: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"namespace": "n", "name": "s", "uid": "1",
                "creationTimestamp": "2026-11-30T08:00:00Z",
                "managedFields": [
                    {"manager": "a", "operation": "Update", "time": "2026-11-30T09:00:00Z"},
                    {"manager": "b", "operation": "Update", "time": "2026-11-30T09:30:00Z"}
                ]},
            "immutable": true,
            "data": {"slurm.key": "c2VjcmV0"}
        }))
        .unwrap();
        let mut it = Interner::default();
        let (r, c) = secret(&mut it, &s).unwrap();
        assert_eq!(r.to_string(), "Secret/n/s");
        assert!(c.immutable);
        assert_eq!(
            c.keys[&it.intern("slurm.key")].digest,
            file_digest(b"secret")
        );
        assert_eq!(c.last_write, Some("2026-11-30T09:30:00Z".parse().unwrap()));

        let cm: ConfigMap = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"namespace": "n", "name": "c", "creationTimestamp": "2026-11-30T08:00:00Z"},
            "data": {"t": "text"},
            "binaryData": {"b": "AAE="}
        }))
        .unwrap();
        let (_, c) = config_map(&mut it, &cm).unwrap();
        assert_eq!(c.keys.len(), 2);
        assert!(!c.keys[&it.intern("t")].binary);
        assert!(c.keys[&it.intern("b")].binary);
        assert_eq!(c.keys[&it.intern("b")].digest, file_digest(&[0, 1]));
        assert_eq!(c.last_write, Some("2026-11-30T08:00:00Z".parse().unwrap()));
    }

    /// `pkg/api/v1/pod/util.go` `VisitPodSecretNames`: the secretRef of
    /// every other volume type, env of exited ephemeral containers, and
    /// empty names skipped.
    #[test]
    fn references_cover_every_kind_the_kubelet_visits() {
        let cases: Vec<(&str, Value)> = vec![
            (
                "azureFile",
                json!({"name": "v", "azureFile": {"secretName": "x", "shareName": "s"}}),
            ),
            (
                "cephfs",
                json!({"name": "v", "cephfs": {"monitors": ["m"], "secretRef": {"name": "x"}}}),
            ),
            (
                "cinder",
                json!({"name": "v", "cinder": {"volumeID": "i", "secretRef": {"name": "x"}}}),
            ),
            (
                "flexVolume",
                json!({"name": "v", "flexVolume": {"driver": "d", "secretRef": {"name": "x"}}}),
            ),
            (
                "iscsi",
                json!({"name": "v", "iscsi": {"targetPortal": "t", "iqn": "q", "lun": 0, "secretRef": {"name": "x"}}}),
            ),
            (
                "rbd",
                json!({"name": "v", "rbd": {"monitors": ["m"], "image": "i", "secretRef": {"name": "x"}}}),
            ),
            (
                "scaleIO",
                json!({"name": "v", "scaleIO": {"gateway": "g", "system": "s", "secretRef": {"name": "x"}}}),
            ),
            (
                "storageos",
                json!({"name": "v", "storageos": {"secretRef": {"name": "x"}}}),
            ),
            (
                "csi",
                json!({"name": "v", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "x"}}}),
            ),
        ];
        for (case, volume) in cases {
            let raw = json!({"metadata": {"namespace": "ns", "name": "p", "uid": "u"},
                "spec": {"nodeName": "n", "containers": [], "volumes": [volume]}});
            let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
            let mut it = Interner::default();
            let m = super::pod(&mut it, &pod, &RawPodExtras::from_json(&raw)).unwrap();
            let refs: Vec<String> = m.references().iter().map(ToString::to_string).collect();
            assert_eq!(refs, ["Secret/ns/x"], "{case}");
            assert!(m.volumes.is_empty(), "{case}: no verdict of its own");
        }
        // Ephemeral containers: a running one is a consumer, an exited one
        // only references; an empty name is no reference.
        let raw = json!({"metadata": {"namespace": "ns", "name": "p", "uid": "u"},
        "spec": {"nodeName": "n", "containers": [],
            "volumes": [{"name": "e", "csi": {"driver": "d", "nodePublishSecretRef": {"name": ""}}}],
            "ephemeralContainers": [
                {"name": "live", "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "a", "key": "k"}}}]},
                {"name": "gone", "envFrom": [{"configMapRef": {"name": "b"}}]}
            ]},
        "status": {"startTime": "2026-11-30T10:00:00Z", "ephemeralContainerStatuses": [
            {"name": "live", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"running": {"startedAt": "2026-11-30T10:05:00Z"}}},
            {"name": "gone", "ready": false, "restartCount": 0, "image": "x", "imageID": "",
             "state": {"terminated": {"exitCode": 0, "startedAt": "2026-11-30T10:01:00Z"}}}
        ]}});
        let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
        let mut it = Interner::default();
        let m = super::pod(&mut it, &pod, &RawPodExtras::from_json(&raw)).unwrap();
        let cs: Vec<(&str, ContainerKind)> =
            m.containers.iter().map(|c| (&*c.name, c.kind)).collect();
        assert_eq!(cs, [("live", ContainerKind::Ephemeral)]);
        let refs: Vec<String> = m.references().iter().map(ToString::to_string).collect();
        assert_eq!(refs, ["Secret/ns/a", "ConfigMap/ns/b"]);
        assert_eq!(
            m.synced_at.map(CompactTime::get),
            Some("2026-11-30T10:00:00Z".parse().unwrap())
        );
        assert!(!m.terminating);
        let mut deleting = raw.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-11-30T11:00:00Z");
        let pod: Pod = serde_json::from_value(deleting.clone()).unwrap();
        let m = super::pod(&mut it, &pod, &RawPodExtras::from_json(&deleting)).unwrap();
        assert!(
            m.terminating && m.registered(),
            "terminating pods stay registered"
        );
    }
}
