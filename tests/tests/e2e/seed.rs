//! The seed scenario with the real binaries, and subPath.

use std::time::{Duration, Instant};

use mountguard_tests::apiserver::resources;
use mountguard_tests::cluster::{SLURM_NAMESPACE, SSHD_CONFIGMAP};
use mountguard_tests::demo::metric_samples;
use mountguard_tests::mountguard::recorded_events;
use mountguard_tests::scenario::{
    PINNING_POD, add_pinning_pod, api_auth_key, every_pod_has, find_verdict, replace_slurmd_pod,
    rotate_auth_key, served_key, state_tag, wait_for_slurmd_pods,
};
use serde_json::json;

use crate::harness::{
    HEARTBEAT, Options, System, wait, wait_all_fresh, wait_metrics, wait_verdicts,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_immutable_key_rotation_pinned_on_node_a() {
    let opts = Options::default();
    let grace = opts.grace;
    let sys = System::start(opts).await;
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    add_pinning_pod(&api, "node-0").await.unwrap();
    wait_all_fresh(&sys).await;

    let old_key = api_auth_key(&api).unwrap();
    let new_key = rotate_auth_key(&api).unwrap();
    let rotated = Instant::now();
    assert_ne!(old_key, new_key);
    // Every running slurmd pod keeps the old bytes.
    for (i, (_, uid)) in pods.iter().enumerate() {
        assert_eq!(
            served_key(&sys.cluster, i, uid).unwrap(),
            old_key,
            "node-{i}"
        );
    }

    let subject = "volume slurm-etc";
    let doc = wait_verdicts(
        &sys,
        "stale verdicts",
        Duration::from_secs(20),
        "namespace=slurm",
        |doc| {
            let ok = pods.iter().enumerate().all(|(i, (p, _))| {
                let want = if i == 0 {
                    "Stale/ImmutableCachePinned"
                } else {
                    "Stale/ImmutableCache"
                };
                find_verdict(&doc, p, subject).is_some_and(|v| state_tag(v) == want)
            });
            ok.then_some(doc)
        },
    )
    .await;
    let pinned = find_verdict(&doc, &pods[0].0, subject).unwrap();
    let pinned_by: Vec<&str> = pinned["pinnedBy"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(
        pinned_by.iter().any(|p| p.ends_with(PINNING_POD)),
        "the pinning pod is named: {pinned}"
    );
    for (_, v) in pods
        .iter()
        .skip(1)
        .map(|(p, _)| (p, find_verdict(&doc, p, subject).unwrap()))
    {
        assert!(v["pinnedBy"].as_array().is_none_or(|a| a.is_empty()), "{v}");
        assert_ne!(v["expected"], v["observed"], "{v}");
    }

    // Metric and Event: within 5 s of the first report after the grace
    // period (one heartbeat interval).
    let bound = grace + HEARTBEAT + Duration::from_secs(5);
    wait_metrics(
        &sys,
        "the mount_state metric",
        bound.saturating_sub(rotated.elapsed()),
        |text| {
            let samples = metric_samples(text);
            pods.iter()
                .enumerate()
                .all(|(i, (p, _))| {
                    let cause = if i == 0 {
                        "ImmutableCachePinned"
                    } else {
                        "ImmutableCache"
                    };
                    samples.iter().any(|s| {
                        s.name == "mountguard_mount_state"
                            && s.value == 1.0
                            && s.labels.get("pod") == Some(p)
                            && s.labels.get("volume").map(String::as_str) == Some("slurm-etc")
                            && s.labels.get("source_kind").map(String::as_str) == Some("Secret")
                            && s.labels.get("source_name").map(String::as_str)
                                == Some("slurm-auth-slurm")
                            && s.labels.get("state").map(String::as_str) == Some("Stale")
                            && s.labels.get("cause").map(String::as_str) == Some(cause)
                    })
                })
                .then_some(())
        },
    )
    .await;
    let events = wait(
        &sys,
        "the Events",
        bound.saturating_sub(rotated.elapsed()),
        || {
            let api = api.clone();
            let pods = pods.clone();
            async move {
                let ev = recorded_events(&api);
                pods.iter()
                    .enumerate()
                    .all(|(i, (p, _))| {
                        let reason = if i == 0 {
                            "KubeletCachePinned"
                        } else {
                            "StaleMount"
                        };
                        ev.iter()
                            .any(|e| e.kind == "Pod" && e.name == *p && e.reason == reason)
                    })
                    .then_some(ev)
            }
        },
    )
    .await;
    let a = events
        .iter()
        .find(|e| e.name == pods[0].0 && e.reason == "KubeletCachePinned")
        .unwrap();
    assert!(a.message.contains(PINNING_POD), "{a:?}");
    assert!(a.message.contains("slurm-auth-slurm"), "{a:?}");
    // No secret bytes or digests in Events.
    for key in [&old_key, &new_key] {
        use sha2::Digest as _;
        let raw = hex::encode(sha2::Sha256::digest(key));
        for e in &events {
            assert!(!e.message.contains(&raw[..12]), "{e:?}");
        }
    }

    // A replaced pod: new key where nothing else pins the entry, old on node A.
    let (p1, uid1) = replace_slurmd_pod(&sys.cluster, 1).await.unwrap();
    assert_eq!(served_key(&sys.cluster, 1, &uid1).unwrap(), new_key);
    let (p0, uid0) = replace_slurmd_pod(&sys.cluster, 0).await.unwrap();
    assert_eq!(served_key(&sys.cluster, 0, &uid0).unwrap(), old_key);
    wait_verdicts(
        &sys,
        "replacement verdicts",
        Duration::from_secs(20),
        "namespace=slurm&all=1",
        |doc| {
            let v1 = find_verdict(&doc, &p1, subject)?;
            let v0 = find_verdict(&doc, &p0, subject)?;
            (state_tag(v1) == "Fresh" && state_tag(v0) == "Stale/ImmutableCachePinned")
                .then_some(())
        },
    )
    .await;
    sys.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subpath_configmap_change_is_frozen_until_the_pod_restarts() {
    let sys = System::start(Options::default()).await;
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    wait_all_fresh(&sys).await;
    sys.cluster
        .api()
        .merge_patch(
            &resources::CONFIGMAPS,
            SLURM_NAMESPACE,
            SSHD_CONFIGMAP,
            &json!({"data": {"sshd_config": "Port 2222\nUsePAM yes\n"}}),
            None,
        )
        .unwrap();
    let is_subpath = |v: &serde_json::Value| {
        v["subject"]
            .as_str()
            .is_some_and(|s| s.starts_with("subPath ") && s.contains("sshd-config"))
    };
    wait_verdicts(
        &sys,
        "subPath Frozen on every node",
        Duration::from_secs(20),
        "namespace=slurm",
        |doc| {
            every_pod_has(&doc, &pods, |v| {
                is_subpath(v) && state_tag(v) == "Frozen/SubPath"
            })
            .then_some(())
        },
    )
    .await;
    // The volume itself is updated by the kubelet's resync: Fresh.
    wait_verdicts(
        &sys,
        "the sshd-config volume Fresh",
        Duration::from_secs(20),
        "namespace=slurm&all=1",
        |doc| {
            pods.iter()
                .all(|(p, _)| {
                    find_verdict(&doc, p, "volume sshd-config")
                        .is_some_and(|v| v["state"] == "Fresh")
                })
                .then_some(())
        },
    )
    .await;
    wait(&sys, "FrozenMount Events", Duration::from_secs(10), || {
        let api = sys.cluster.api();
        let pods = pods.clone();
        async move {
            let ev = recorded_events(&api);
            pods.iter()
                .all(|(p, _)| ev.iter().any(|e| e.name == *p && e.reason == "FrozenMount"))
                .then_some(())
        }
    })
    .await;
    // Still Frozen a few heartbeats later; a restarted pod is Fresh.
    tokio::time::sleep(HEARTBEAT * 2).await;
    let doc = sys.verdicts("namespace=slurm").await;
    assert!(
        doc["verdicts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["pod"] == pods[2].0.as_str()
                && is_subpath(v)
                && state_tag(v) == "Frozen/SubPath"),
        "{doc}"
    );
    let (p2, _) = replace_slurmd_pod(&sys.cluster, 2).await.unwrap();
    wait_verdicts(
        &sys,
        "the restarted pod's subPath Fresh",
        Duration::from_secs(20),
        "namespace=slurm&all=1",
        |doc| {
            doc["verdicts"]
                .as_array()?
                .iter()
                .any(|v| v["pod"] == p2.as_str() && is_subpath(v) && v["state"] == "Fresh")
                .then_some(())
        },
    )
    .await;
    sys.shutdown().await;
}
