//! The edge: k8s-openapi objects (and raw JSON items) into the compact
//! model. Secret and ConfigMap values are hashed here and never stored; a
//! NodeSet (read as JSON) becomes what remediation keeps of it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, ContainerState, ContainerStatus, EnvFromSource, EnvVar, Pod, Secret,
    VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::READ_AT_START_ANNOTATION;
use mountguard_core::PodUid;
use mountguard_core::model::{
    ContainerKind, ContainerModel, ControllerKind, ControllerRef, EnvRef, ExtraRefs, Interner,
    KeyToPath, MountModel, NodeSetMember, PodModel, ProjectedSource, SkipReason, SourceContent,
    SourceKind, SourceProjection, SourceRef, VolumeModel, VolumeSource, parse_read_at_start,
};
use mountguard_core::remediation::inputs::{IntOrString, NodeSetKey, NodeSetModel, NodeSetObject};
use mountguard_core::remediation::{
    ATTEMPTS_ANNOTATION, REMEDIATE_ANNOTATION, REMEDIATE_ON_ANNOTATION,
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

/// Builds the compact model of a pod.
pub fn pod(interner: &mut Interner, p: &Pod) -> Option<PodModel> {
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
    for v in spec.volumes.iter().flatten() {
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
            for s in pr.sources.iter().flatten() {
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
                } else if let Some(pc) = &s.pod_certificate {
                    ProjectedSource::NotFromApi {
                        reason: SkipReason::PodCertificate,
                        paths: [
                            &pc.credential_bundle_path,
                            &pc.key_path,
                            &pc.certificate_chain_path,
                        ]
                        .into_iter()
                        .flatten()
                        .filter(|p| !p.is_empty())
                        .map(|p| interner.intern(p))
                        .collect(),
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
            other_refs.extend(
                model
                    .env
                    .iter()
                    .filter_map(EnvRef::target)
                    .map(|(kind, name)| (kind, name.clone())),
            );
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
        } else if vf.file_key_ref.is_some() {
            // `fileKeyRef` (gate `EnvFiles`, beta and on from 1.35): a value
            // the kubelet reads at container start from a file of an
            // emptyDir volume (`pkg/kubelet/kubelet_pods.go`
            // `makeEnvironmentVariables`, v1.37.2); no Secret or ConfigMap
            // behind it, nothing to check.
            env.push(EnvRef::NotFromApi {
                var: interner.intern(&e.name),
                reason: SkipReason::FileKeyRef,
            });
        } else if vf.field_ref.is_none() && vf.resource_field_ref.is_none() {
            // None of the sources the compiled-in API (1.37) knows: the API
            // server accepts exactly one source per `valueFrom`
            // (`pkg/apis/core/validation/validation.go`
            // `validateEnvVarValueFrom`, v1.37.2), so this is a source newer
            // than 1.37. Never taken for a Secret or a ConfigMap.
            env.push(EnvRef::NotFromApi {
                var: interner.intern(&e.name),
                reason: SkipReason::UnknownSource,
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

/// What remediation keeps of a NodeSet object (`slinky.slurm.net`, read
/// as JSON): its model, UID and persisted attempts (none without a
/// namespace and name).
pub fn nodeset(ns: &DynamicObject) -> Option<NodeSetObject> {
    let spec = &ns.data["spec"];
    let max_unavailable = &spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"];
    let annotations = ns.metadata.annotations.as_ref();
    Some(NodeSetObject {
        model: NodeSetModel {
            namespace: ns.metadata.namespace.clone()?,
            name: ns.metadata.name.clone()?,
            annotations: [REMEDIATE_ANNOTATION, REMEDIATE_ON_ANNOTATION]
                .into_iter()
                .filter_map(|k| Some((k.to_string(), annotations?.get(k)?.clone())))
                .collect(),
            replicas: spec["replicas"].as_u64(),
            max_unavailable: match (max_unavailable.as_u64(), max_unavailable.as_str()) {
                (Some(n), _) => Some(IntOrString::Int(n)),
                (None, Some(s)) => Some(IntOrString::String(s.to_string())),
                (None, None) => None,
            },
        },
        uid: ns.metadata.uid.clone(),
        attempts: annotations
            .and_then(|a| a.get(ATTEMPTS_ANNOTATION))
            .cloned(),
    })
}

/// A NodeSet's key from its metadata.
pub fn nodeset_key(ns: &DynamicObject) -> Option<NodeSetKey> {
    Some(NodeSetKey {
        namespace: ns.metadata.namespace.clone()?,
        name: ns.metadata.name.clone()?,
    })
}

#[cfg(test)]
mod tests;
