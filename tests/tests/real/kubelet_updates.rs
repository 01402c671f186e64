//! Mutable Secrets and ConfigMaps changing under running pods on the real
//! kubelet: what the kubelet does with the volumes, subPath binds and env,
//! and what mountguard says about it over time.
//!
//! The kubelet in the rig (tests/src/real/kubelet.rs) runs the
//! watch-based Secret and ConfigMap managers
//! (`configMapAndSecretChangeDetectionStrategy: Watch`,
//! pkg/kubelet/apis/config/types.go) and `syncFrequency: 10s`: its cache
//! has a change at once, but a pod's volumes are set up again only when
//! the pod worker resyncs the pod, 10 to 15 s after its previous sync
//! (pkg/kubelet/pod_workers.go `completeWork`; the sync's
//! `WaitForAttachAndMount` -> `ReprocessPod` in
//! pkg/kubelet/volumemanager/volume_manager.go). The controller's grace
//! is set well above that, as `--grace` (180 s) is above the real
//! default resync of 60 to 90 s.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::time::{Duration, Instant};

use mountguard_tests::cluster::SLURM_NAMESPACE;
use mountguard_tests::real::create;
use mountguard_tests::real::kubelet::MAX_RESYNC;
use serde_json::json;

use crate::kubelet_support::{
    On, b64, compress, no_stale, patch_data, phases, running_pod, sample_until, volume_file,
};

/// The controller's grace in these tests (`MOUNTGUARD_GRACE` of the system
/// they run on): four times the kubelet's longest resync, so a kubelet
/// doing its job never makes a mount Stale.
pub const GRACE: Duration = Duration::from_secs(60);

/// The Secret and ConfigMap of the tests, mutable.
async fn mutable_sources(on: On<'_>, base: &str, value: &str) {
    create(
        &on.sys.client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": on.name(&format!("{base}-secret")), "namespace": SLURM_NAMESPACE},
                "data": {"password": b64(format!("password {value}\n").as_bytes())}}),
    )
    .await
    .unwrap();
    create(
        &on.sys.client,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": on.name(&format!("{base}-config")), "namespace": SLURM_NAMESPACE},
                "data": {"app.conf": format!("setting = {value}\n")}}),
    )
    .await
    .unwrap();
}

async fn change_sources(on: On<'_>, base: &str, value: &str) {
    patch_data(
        on.sys,
        "secrets",
        &on.name(&format!("{base}-secret")),
        json!({"password": b64(format!("password {value}\n").as_bytes())}),
    )
    .await;
    patch_data(
        on.sys,
        "configmaps",
        &on.name(&format!("{base}-config")),
        json!({"app.conf": format!("setting = {value}\n")}),
    )
    .await;
}

/// A mutable Secret and a mutable ConfigMap, each mounted as a volume of
/// a running pod on the real kubelet, change. The kubelet writes the new
/// bytes within one pod resync; mountguard says `Propagating` while the
/// volume holds the old bytes and the API the new, then `Fresh` against
/// the new content, and never `Stale` in between. When the kubelet happens
/// to resync right after the change (Propagating too short to be sampled),
/// the sources change again: in some round Propagating must be seen.
pub async fn mutable_updates_go_propagating_then_fresh_never_stale(on: On<'_>) {
    let sys = on.sys;
    let app = on.name("app");
    mutable_sources(on, "app", "v0").await;
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": app, "namespace": SLURM_NAMESPACE},
                "spec": {"nodeName": on.node(), "automountServiceAccountToken": false,
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "example.invalid/c:1",
                                         "volumeMounts": [{"name": "sec", "mountPath": "/sec"},
                                                          {"name": "cfg", "mountPath": "/cfg"}]}],
                         "volumes": [{"name": "sec", "secret": {"secretName": on.name("app-secret")}},
                                     {"name": "cfg", "configMap": {"name": on.name("app-config")}}]}}),
    )
    .await
    .unwrap();
    let pod = running_pod(sys, &app).await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let subjects = ["volume sec", "volume cfg"];
    let files = [
        volume_file(sys, on.i, &uid, "secret", "sec/password"),
        volume_file(sys, on.i, &uid, "configmap", "cfg/app.conf"),
    ];
    let read = || files.clone().map(|f| std::fs::read(f).unwrap_or_default());

    // Fresh before any change.
    let (before, _) = sample_until(
        sys,
        &app,
        &subjects,
        Instant::now(),
        Duration::from_secs(60),
        || (),
        |latest, _| latest.iter().all(|s| s.tag == "Fresh"),
    )
    .await;
    let mut old: Vec<String> = before
        .iter()
        .map(|s| s.last().unwrap().expected.clone())
        .collect();
    assert_eq!(
        read(),
        [b"password v0\n".to_vec(), b"setting = v0\n".to_vec()]
    );

    let mut propagating_seen = [false, false];
    for round in 1..=4 {
        let value = format!("v{round}");
        let new_bytes = [
            format!("password {value}\n").into_bytes(),
            format!("setting = {value}\n").into_bytes(),
        ];
        let t0 = Instant::now();
        change_sources(on, "app", &value).await;
        let old_fp = old.clone();
        let (seen, disk) = sample_until(
            sys,
            &app,
            &subjects,
            t0,
            GRACE + MAX_RESYNC,
            read,
            |latest, disk| {
                latest
                    .iter()
                    .zip(&old_fp)
                    .all(|(s, o)| s.tag == "Fresh" && s.expected != *o)
                    && disk.iter().zip(&new_bytes).all(|(d, n)| d == n)
            },
        )
        .await;
        for (i, subject) in subjects.iter().enumerate() {
            let samples = &seen[i];
            let text = compress(samples).join(" -> ");
            no_stale(subject, samples);
            // Fresh against the old content, then Propagating against the
            // new, then Fresh against the new: nothing else, in that order.
            let new_fp = samples.last().unwrap().expected.clone();
            let mut stage = 0;
            for p in phases(samples) {
                let this = match (p.0.as_str(), &p.1) {
                    ("Fresh", e) if *e == old[i] => 0,
                    ("Propagating", e) if *e == new_fp => 1,
                    ("Fresh", e) if *e == new_fp => 2,
                    _ => panic!("{subject}, round {round}: unexpected {p:?} in {text}"),
                };
                assert!(
                    this >= stage,
                    "{subject}, round {round}: out of order: {text}"
                );
                stage = this;
            }
            // While Propagating, the agent saw the old bytes (observed is
            // the old content's fingerprint).
            for s in samples.iter().filter(|s| s.tag == "Propagating") {
                assert_eq!(s.observed, old[i], "{subject}, round {round}: {s:?}");
            }
            if samples.iter().any(|s| s.tag == "Propagating") {
                propagating_seen[i] = true;
            }
            // Fresh against the new content only once the kubelet wrote
            // it (the disk is read right after each verdict sample).
            for (s, (_, d)) in samples.iter().zip(&disk) {
                if s.tag == "Fresh" && s.expected == new_fp {
                    assert_eq!(d[i], new_bytes[i], "{subject}, round {round}: {text}");
                }
            }
            // The kubelet wrote the new bytes within one resync (plus the
            // watch's and the rig's latency).
            let written = disk
                .iter()
                .find(|(_, d)| d[i] == new_bytes[i])
                .map(|(at, _)| *at)
                .unwrap();
            assert!(
                written <= MAX_RESYNC * 2,
                "{subject}, round {round}: the kubelet wrote the change after {written:?}"
            );
            eprintln!("{subject}, round {round}: {text}; on disk after {written:.1?}");
        }
        old = seen
            .iter()
            .map(|s| s.last().unwrap().expected.clone())
            .collect();
        if propagating_seen.iter().all(|p| *p) {
            break;
        }
    }
    assert!(
        propagating_seen.iter().all(|p| *p),
        "Propagating was never sampled in 4 changes for {subjects:?}: {propagating_seen:?}"
    );
}

/// Whether `path` is a mount point (in /proc/self/mounts).
fn is_mount_point(path: &std::path::Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let want = path.display().to_string().replace(' ', "\\040");
    mounts
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(want.as_str()))
}

/// A running container with a subPath of a mutable ConfigMap volume and
/// env from a mutable Secret key and a ConfigMap key; both objects change.
/// The real kubelet bind-mounted the subPath under
/// `pods/<uid>/volume-subpaths/<volume>/<container>/<index>` when the
/// container started (pkg/volume/util/subpath/subpath_linux.go
/// `prepareSubpathTarget`, called from pkg/kubelet/kubelet_pods.go
/// `makeMounts`): it keeps the old bytes while the volume gets the new
/// ones. Env was fixed at the container's start, which the real kubelet
/// reports before the change. mountguard: the volume Propagating then
/// Fresh; the subPath Propagating while the volume is behind, then
/// `Frozen/SubPath`; both env references `Frozen/Env`; never Stale.
pub async fn subpath_and_env_keep_the_old_content_and_are_frozen(on: On<'_>) {
    let sys = on.sys;
    let frozen = on.name("frozen");
    mutable_sources(on, "frozen", "v0").await;
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": frozen, "namespace": SLURM_NAMESPACE},
                "spec": {"nodeName": on.node(), "automountServiceAccountToken": false,
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "example.invalid/c:1",
                                         "env": [
                                             {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": on.name("frozen-secret"), "key": "password"}}},
                                             {"name": "SETTING", "valueFrom": {"configMapKeyRef": {"name": on.name("frozen-config"), "key": "app.conf"}}}],
                                         "volumeMounts": [
                                             {"name": "cfg", "mountPath": "/cfg"},
                                             {"name": "cfg", "mountPath": "/etc/app.conf", "subPath": "app.conf"}]}],
                         "volumes": [{"name": "cfg", "configMap": {"name": on.name("frozen-config")}}]}}),
    )
    .await
    .unwrap();
    let pod = running_pod(sys, &frozen).await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let started = pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"]
        .as_str()
        .unwrap()
        .to_string();
    let subjects = [
        "volume cfg",
        "subPath c:cfg/app.conf",
        "env c:PASSWORD",
        "env c:SETTING",
    ];
    let volume = volume_file(sys, on.i, &uid, "configmap", "cfg/app.conf");
    // The second volumeMount of container c: index 1.
    let bind = on
        .root()
        .join("pods")
        .join(&uid)
        .join("volume-subpaths/cfg/c/1");
    let (before, _) = sample_until(
        sys,
        &frozen,
        &subjects,
        Instant::now(),
        Duration::from_secs(60),
        || (),
        |latest, _| latest.iter().all(|s| s.tag == "Fresh"),
    )
    .await;
    let old: Vec<String> = before
        .iter()
        .map(|s| s.last().unwrap().expected.clone())
        .collect();
    assert!(
        is_mount_point(&bind),
        "the real kubelet bind-mounted the subPath at {}",
        bind.display()
    );
    assert_eq!(std::fs::read(&bind).unwrap(), b"setting = v0\n");

    // The change comes at least a second after the container's start
    // (`startedAt` has second precision).
    let started_at: jiff::Timestamp = started.parse().unwrap();
    mountguard_tests::mountguard::poll(
        "a second past the container's start",
        Duration::from_secs(5),
        || async move {
            (jiff::Timestamp::now() > started_at + jiff::SignedDuration::from_secs(1)).then_some(())
        },
    )
    .await
    .unwrap();
    let t0 = Instant::now();
    change_sources(on, "frozen", "v1").await;
    let new_bytes = b"setting = v1\n".to_vec();
    let read = || {
        (
            std::fs::read(&volume).unwrap_or_default(),
            std::fs::read(&bind).unwrap_or_default(),
        )
    };
    let (seen, disk) = sample_until(
        sys,
        &frozen,
        &subjects,
        t0,
        GRACE + MAX_RESYNC,
        read,
        |latest, (vol, _)| {
            latest[0].tag == "Fresh"
                && latest[0].expected != old[0]
                && latest[1].tag == "Frozen/SubPath"
                && latest[2].tag == "Frozen/Env"
                && latest[3].tag == "Frozen/Env"
                && *vol == new_bytes
        },
    )
    .await;
    for (i, subject) in subjects.iter().enumerate() {
        let text = compress(&seen[i]).join(" -> ");
        no_stale(subject, &seen[i]);
        // Allowed states per subject, in this order.
        let order: &[&str] = match i {
            0 => &["Fresh", "Propagating", "Fresh"],
            1 => &["Fresh", "Propagating", "Frozen/SubPath"],
            _ => &["Fresh", "Frozen/Env"],
        };
        let mut stage = 0;
        for (tag, expected) in phases(&seen[i]) {
            // The first state is against the old content, the others
            // against the new.
            let pos = (stage..order.len())
                .find(|j| order[*j] == tag && ((*j == 0) == (expected == old[i])));
            match pos {
                Some(j) => stage = j,
                None => panic!("{subject}: unexpected {tag}[{expected}] in {text}"),
            }
        }
        eprintln!("{subject}: {text}");
    }
    // The subPath bind still holds the old bytes, the volume the new
    // ones, at every sample after the volume changed.
    let (vol, bound) = &disk.last().unwrap().1;
    assert_eq!(vol, &new_bytes);
    assert_eq!(
        String::from_utf8_lossy(bound),
        "setting = v0\n",
        "the real kubelet updated a subPath bind of a running container"
    );
    // The advice names the container start and what refreshes it.
    let doc = mountguard_tests::scenario::verdicts(&sys.metrics_base(), "all=1")
        .await
        .unwrap();
    for subject in &subjects[1..] {
        let v = mountguard_tests::scenario::find_verdict(&doc, &frozen, subject).unwrap();
        let msg = v["message"].as_str().unwrap_or("");
        assert!(
            msg.contains(&started) && msg.contains("restart"),
            "{subject}: the message names the container's start {started} and a restart: {v}"
        );
    }
}

/// An immutable Secret deleted and recreated with the same bytes while a
/// running pod pins it: the kubelet keeps serving its cached old object
/// (pkg/kubelet/util/manager/watch_based_manager.go: an immutable object's
/// watch stops and its entry stays while a pod on the node references
/// it), so a pod started after the recreation gets the old object, whose
/// bytes are the new one's. mountguard compares bytes: both pods' volumes
/// are Fresh, never Stale.
pub async fn a_same_content_recreation_is_fresh(on: On<'_>) {
    let sys = on.sys;
    let secret = on.name("same");
    let key = b"the same slurm.key\n";
    let immutable = || {
        json!({"apiVersion": "v1", "kind": "Secret",
               "metadata": {"name": secret, "namespace": SLURM_NAMESPACE},
               "immutable": true, "data": {"slurm.key": b64(key)}})
    };
    let pod = |name: &str| {
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": SLURM_NAMESPACE},
               "spec": {"nodeName": on.node(), "automountServiceAccountToken": false,
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "c", "image": "example.invalid/c:1",
                                        "volumeMounts": [{"name": "auth", "mountPath": "/auth"}]}],
                        "volumes": [{"name": "auth", "secret": {"secretName": secret}}]}})
    };
    let (pin, after) = (on.name("same-pin"), on.name("same-after"));
    create(&sys.client, &immutable()).await.unwrap();
    create(&sys.client, &pod(&pin)).await.unwrap();
    running_pod(sys, &pin).await;
    let path = format!("/api/v1/namespaces/{SLURM_NAMESPACE}/secrets/{secret}");
    let (code, body) = mountguard_tests::real::raw(&sys.client, "DELETE", &path, None)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    create(&sys.client, &immutable()).await.unwrap();
    create(&sys.client, &pod(&after)).await.unwrap();
    let uid = running_pod(sys, &after).await["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(
        std::fs::read(volume_file(sys, on.i, &uid, "secret", "auth/slurm.key")).unwrap(),
        key
    );
    for name in [&pin, &after] {
        let (seen, _) = sample_until(
            sys,
            name,
            &["volume auth"],
            Instant::now(),
            GRACE + MAX_RESYNC,
            || (),
            |latest, _| latest[0].tag == "Fresh",
        )
        .await;
        no_stale(&format!("{name} volume auth"), &seen[0]);
    }
}

/// env `valueFrom.fileKeyRef` (gate `EnvFiles`, beta and on from 1.35:
/// pkg/features/kube_features.go, v1.37.2): the API server takes it; the
/// kubelet refuses to start the container while the file is missing from
/// the emptyDir (CreateContainerConfigError, pkg/kubelet/kubelet_pods.go
/// `makeEnvironmentVariables`) and starts it once the file is there (here
/// the test writes it, as an init container would); mountguard lists the
/// reference as
/// `Skipped/fileKeyRef`, saying it does not check it, never Stale, beside
/// a Secret key reference of the same container that it does judge.
pub async fn file_key_ref_env_is_listed_and_never_judged(on: On<'_>) {
    let sys = on.sys;
    let pod = on.name("envfile");
    let secret = on.name("envfile-secret");
    create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": secret, "namespace": SLURM_NAMESPACE},
                "data": {"password": b64(b"hunter2\n")}}),
    )
    .await
    .unwrap();
    let created = create(
        &sys.client,
        &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": pod, "namespace": SLURM_NAMESPACE},
                "spec": {"nodeName": on.node(), "automountServiceAccountToken": false,
                         "terminationGracePeriodSeconds": 0,
                         "volumes": [{"name": "envs", "emptyDir": {}}],
                         "containers": [{"name": "c", "image": "example.invalid/c:1",
                                         "env": [
                                             {"name": "FROM_FILE", "valueFrom": {"fileKeyRef": {
                                                 "volumeName": "envs", "path": "app.env",
                                                 "key": "FROM_FILE"}}},
                                             {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {
                                                 "name": secret, "key": "password"}}}],
                                         "volumeMounts": [{"name": "envs", "mountPath": "/envs"}]}]}}),
    )
    .await
    .unwrap();
    let uid = created["metadata"]["uid"].as_str().unwrap().to_string();
    let dir = on
        .root()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/envs");
    crate::harness::wait(
        sys,
        "the kubelet to set up the emptyDir",
        Duration::from_secs(60),
        || {
            let ready = dir.is_dir();
            async move { ready.then_some(()) }
        },
    )
    .await;
    // Every value single-quoted (pkg/kubelet/util/env/env_util.go,
    // v1.37.2: the parser refuses anything else).
    std::fs::write(dir.join("app.env"), "FROM_FILE='from a file'\n").unwrap();
    running_pod(sys, &pod).await;
    let (seen, _) = sample_until(
        sys,
        &pod,
        &["env c:FROM_FILE", "env c:PASSWORD"],
        Instant::now(),
        Duration::from_secs(60),
        || (),
        |latest, _| latest[1].tag == "Fresh",
    )
    .await;
    for s in &seen[0] {
        assert_eq!(s.tag, "Skipped/fileKeyRef", "{:?}", compress(&seen[0]));
    }
    let doc = mountguard_tests::scenario::verdicts(&sys.metrics_base(), "all=1")
        .await
        .unwrap();
    let v = mountguard_tests::scenario::find_verdict(&doc, &pod, "env c:FROM_FILE").unwrap();
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("does not check it")),
        "the verdict says mountguard does not check it: {v}"
    );
}
