//! Tests of the conversion of Kubernetes objects into the core model.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

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
    let m = super::pod(&mut it, &pod).unwrap();
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
    let m2 = super::pod(&mut it, &p2).unwrap();
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
                "podCertificate paths are the projection's own"
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
        let m = super::pod(&mut Interner::default(), &pod).unwrap();
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
        let m = super::pod(&mut it, &pod).unwrap();
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
    let m = super::pod(&mut it, &pod).unwrap();
    let cs: Vec<(&str, ContainerKind)> = m.containers.iter().map(|c| (&*c.name, c.kind)).collect();
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
    let m = super::pod(&mut it, &pod).unwrap();
    assert!(
        m.terminating && m.registered(),
        "terminating pods stay registered"
    );
}

/// `env[].valueFrom.fileKeyRef` (k8s.io/api v0.37.2 `core/v1/types.go`
/// `EnvVarSource.FileKeyRef`, gate `EnvFiles`, beta and on from 1.35): a
/// value the kubelet reads at container start from a file of an emptyDir
/// volume (`pkg/kubelet/kubelet_pods.go` `makeEnvironmentVariables`,
/// v1.37.2). No Secret or ConfigMap is behind it, so it registers nothing
/// (`pkg/api/v1/pod/util.go` `VisitPodSecretNames` does not visit it) and
/// becomes an env reference that is not checked, in every container list,
/// at its own index; `envFrom` has no such source at v1.37.2. A
/// `valueFrom` of none of the sources the compiled-in API (1.37) knows is
/// an unknown source, never taken for a Secret, a ConfigMap or a
/// fileKeyRef.
#[test]
fn file_key_ref_env_is_a_reference_that_is_not_checked() {
    let file = |var: &str| json!({"name": var, "valueFrom": {"fileKeyRef": {"volumeName": "envs", "path": "e.env", "key": var}}});
    let secret = json!({"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}});
    let field = json!({"name": "N", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}});
    let future = json!({"name": "F", "valueFrom": {"someNewRef": {"x": "y"}}});
    let raw = json!({"metadata": {"namespace": "ns", "name": "p", "uid": "u"},
    "spec": {"nodeName": "n",
        "volumes": [{"name": "envs", "emptyDir": {}}],
        "initContainers": [{"name": "init", "env": [secret.clone(), file("I")]}],
        "containers": [{"name": "c", "env": [file("A"), field, secret, future, file("B")]}],
        "ephemeralContainers": [{"name": "dbg", "env": [file("E")]}]},
    "status": {"startTime": "2026-11-30T10:00:00Z"}});
    let pod: Pod = serde_json::from_value(raw).unwrap();
    let not_checked = |var: &str, reason| EnvRef::NotFromApi {
        var: var.into(),
        reason,
    };
    let key = |var: &str| EnvRef::Key {
        var: var.into(),
        kind: SourceKind::Secret,
        name: "s".into(),
        key: "k".into(),
        optional: false,
    };
    let file_ref = SkipReason::FileKeyRef;
    let mut it = Interner::default();
    let m = super::pod(&mut it, &pod).unwrap();
    let env = |name: &str| -> Vec<EnvRef> {
        m.containers
            .iter()
            .find(|x| &*x.name == name)
            .unwrap_or_else(|| panic!("no container {name}"))
            .env
            .to_vec()
    };
    assert_eq!(
        env("c"),
        vec![
            not_checked("A", file_ref),
            key("S"),
            not_checked("F", SkipReason::UnknownSource),
            not_checked("B", file_ref),
        ]
    );
    assert_eq!(env("init"), vec![key("S"), not_checked("I", file_ref)]);
    assert_eq!(env("dbg"), vec![not_checked("E", file_ref)]);
    let refs: Vec<String> = m.references().iter().map(ToString::to_string).collect();
    assert_eq!(refs, ["Secret/ns/s"], "a file registers nothing");
}

/// In-place container restarts (gate `ContainerRestartRules`, beta and on
/// from 1.35; `RestartAllContainersOnContainerExits`, on from 1.36,
/// `pkg/features/kube_features.go` v1.37.2): the kubelet starts the
/// container again in the same pod (same UID, same cache registration)
/// and reads its env and binds its subPaths again
/// (`pkg/kubelet/kuberuntime/kuberuntime_container.go` `startContainer` ->
/// `generateContainerConfig` -> `pkg/kubelet/kubelet_pods.go`
/// `GenerateRunContainerOptions`: `makeEnvironmentVariables`, `makeMounts`).
/// What the container holds dates from its current process:
/// `state.running.startedAt`, never the pod's `status.startTime` nor the
/// previous process in `lastState`; a container waiting to be started
/// again has no start.
#[test]
fn a_container_restarted_in_place_starts_at_its_current_process() {
    let status = |state: serde_json::Value| {
        json!({"metadata": {"namespace": "ns", "name": "p", "uid": "u"},
        "spec": {"nodeName": "n", "containers": [{"name": "c", "image": "x",
            "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}]},
        "status": {"startTime": "2026-11-30T09:00:00Z", "containerStatuses": [
            {"name": "c", "ready": true, "restartCount": 1, "image": "x", "imageID": "",
             "lastState": {"terminated": {"exitCode": 1,
                "startedAt": "2026-11-30T09:00:05Z", "finishedAt": "2026-11-30T10:29:00Z"}},
             "state": state}]}})
    };
    let t = |s: &str| Some(s.parse::<Timestamp>().unwrap());
    let cases = [
        (
            "running again",
            json!({"running": {"startedAt": "2026-11-30T10:30:00Z"}}),
            t("2026-11-30T10:30:00Z"),
        ),
        (
            "waiting to restart",
            json!({"waiting": {"reason": "CrashLoopBackOff"}}),
            None,
        ),
    ];
    for (case, state, want) in cases {
        let raw = status(state);
        let pod: Pod = serde_json::from_value(raw.clone()).unwrap();
        let mut it = Interner::default();
        let m = super::pod(&mut it, &pod).unwrap();
        assert_eq!(m.containers[0].started_at(), want, "{case}");
        assert_eq!(
            m.synced_at.map(CompactTime::get),
            t("2026-11-30T09:00:00Z"),
            "{case}: the registration stays the pod's"
        );
    }
}

fn nodeset_object(spec: serde_json::Value) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"namespace": "slurm", "name": "worker"},
        "spec": spec,
    }))
    .expect("object")
}

#[test]
fn max_unavailable_from_the_nodeset() {
    let t = [
        (serde_json::json!({"replicas": 8}), 2),
        (serde_json::json!({"replicas": 3}), 1),
        (
            serde_json::json!({"replicas": 10, "updateStrategy": {"rollingUpdate": {"maxUnavailable": 3}}}),
            3,
        ),
        (
            serde_json::json!({"replicas": 10, "updateStrategy": {"rollingUpdate": {"maxUnavailable": "50%"}}}),
            5,
        ),
        (
            serde_json::json!({"replicas": 10, "updateStrategy": {"rollingUpdate": {"maxUnavailable": 0}}}),
            0,
        ),
    ];
    for (spec, want) in t {
        let model = nodeset(&nodeset_object(spec.clone())).expect("named").model;
        assert_eq!(
            mountguard_core::remediation::inputs::max_unavailable(&model),
            want,
            "{spec}"
        );
    }
}
