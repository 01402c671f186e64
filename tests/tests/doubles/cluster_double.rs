//! The NodeSet double and the wired cluster in a box.

use std::time::Duration;

use base64::Engine;
use mountguard_tests::apiserver::{ApiHandle, DeleteOptions, resources};
use mountguard_tests::cluster::{self, Cluster};
use mountguard_tests::nodeset::LABEL_POD_HOSTNAME;
use mountguard_tests::slurmrestd::mint_token;
use serde_json::{Value, json};

use crate::{eventually, set_unschedulable};

const NS: &str = cluster::SLURM_NAMESPACE;

async fn running(api: &ApiHandle, name: &str, not_uid: Option<&str>) -> Value {
    eventually(15, &format!("{name} running"), || {
        let p = api.get(&resources::PODS, NS, name).ok();
        let not_uid = not_uid.map(String::from);
        async move {
            let p = p?;
            let ok = p["status"]["phase"] == "Running"
                && p["metadata"]["deletionTimestamp"].is_null()
                && p["metadata"]["uid"].as_str() != not_uid.as_deref();
            ok.then_some(p)
        }
    })
    .await
}

fn uid(p: &Value) -> String {
    p["metadata"]["uid"].as_str().unwrap().to_string()
}

fn api_key(api: &ApiHandle) -> Vec<u8> {
    let s = api
        .get(&resources::SECRETS, NS, cluster::AUTH_SECRET)
        .unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(s["data"]["slurm.key"].as_str().unwrap())
        .unwrap()
}

fn key_on_node(c: &Cluster, node: usize, pod: &Value) -> Vec<u8> {
    let dir = c
        .kubelet(node)
        .volume_dir(&uid(pod), "kubernetes.io~projected", "slurm-etc");
    std::fs::read(dir.join("slurm.key")).unwrap()
}

async fn replace_pod(api: &ApiHandle, name: &str) -> Value {
    let old = api.get(&resources::PODS, NS, name).unwrap();
    api.delete(&resources::PODS, NS, name, &DeleteOptions::default())
        .unwrap();
    running(api, name, Some(&uid(&old))).await
}

#[tokio::test]
async fn nodeset_double_keeps_replicas_with_slinky_labels_and_recreates_deleted_pods_under_the_same_name()
 {
    let mut c = Cluster::builder().nodes(2).slinky().start().await.unwrap();
    let api = c.api();
    let p0 = running(&api, "slurm-worker-slinky-0", None).await;
    let p1 = running(&api, "slurm-worker-slinky-1", None).await;
    assert_eq!(p0["spec"]["nodeName"], "node-0");
    assert_eq!(p1["spec"]["nodeName"], "node-1");
    let labels = &p0["metadata"]["labels"];
    assert_eq!(labels[LABEL_POD_HOSTNAME], "slurm-worker-slinky-0");
    assert_eq!(labels["app.kubernetes.io/name"], "slurmd");
    assert_eq!(labels["app.kubernetes.io/component"], "worker");
    assert_eq!(labels["slinky.slurm.net/cluster"], "slurm");
    let owner = &p0["metadata"]["ownerReferences"][0];
    let nodeset = api.get(&resources::NODESETS, NS, cluster::NODESET).unwrap();
    assert_eq!(owner["kind"], "NodeSet");
    assert_eq!(owner["apiVersion"], "slinky.slurm.net/v1beta1");
    assert_eq!(owner["controller"], true);
    assert_eq!(owner["uid"], nodeset["metadata"]["uid"]);

    // Deleted: graceful deletion, kubelet confirms, then the same name comes
    // back with a new UID.
    let again = replace_pod(&api, "slurm-worker-slinky-0").await;
    assert_ne!(uid(&again), uid(&p0));
    assert_eq!(again["spec"]["nodeName"], "node-0");
    assert!(!mountguard_inventory::layout::pod_dir(&c.kubelet_root(0), &uid(&p0)).exists());

    // Status, scale down, garbage collection.
    eventually(10, "nodeset status", || {
        let s = api.get(&resources::NODESETS, NS, cluster::NODESET).unwrap();
        async move { (s["status"]["readyReplicas"] == 2).then_some(()) }
    })
    .await;
    api.merge_patch(
        &resources::NODESETS,
        NS,
        cluster::NODESET,
        &json!({"spec": {"replicas": 1}}),
        None,
    )
    .unwrap();
    eventually(10, "scaled down", || {
        let gone = api
            .get(&resources::PODS, NS, "slurm-worker-slinky-1")
            .is_err();
        async move { gone.then_some(()) }
    })
    .await;
    api.delete(
        &resources::NODESETS,
        NS,
        cluster::NODESET,
        &DeleteOptions::default(),
    )
    .unwrap();
    eventually(10, "garbage collected", || {
        let n = api.list_all(&resources::PODS, Some(NS)).len();
        async move { (n == 0).then_some(()) }
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn cluster_slinky_setup_mounts_volumes_and_bridges_slurmd_to_slurmrestd() {
    let mut c = Cluster::builder().nodes(2).slinky().start().await.unwrap();
    let api = c.api();
    let p0 = running(&api, "slurm-worker-slinky-0", None).await;
    assert_eq!(key_on_node(&c, 0, &p0), api_key(&api));
    let root = c.kubelet_root(0);
    assert!(root.starts_with(c.dir()));
    let sub =
        mountguard_inventory::layout::subpath_target(&root, &uid(&p0), "sshd-config", "slurmd", 1);
    assert_eq!(
        std::fs::read_to_string(sub).unwrap(),
        "Port 22\nUsePAM yes\n"
    );
    let hooks = c
        .kubelet(0)
        .volume_dir(&uid(&p0), "kubernetes.io~configmap", "hooks");
    assert!(hooks.join("99-mountguard.sh").exists());

    // slurmrestd: both workers registered with the right key.
    let slurm = c.slurm();
    eventually(10, "slurm nodes idle", || {
        let a = slurm.node("slurm-worker-slinky-0").map(|n| n.state);
        let b = slurm.node("slurm-worker-slinky-1").map(|n| n.state);
        async move { (a == Some(vec!["IDLE".into()]) && b == Some(vec!["IDLE".into()])).then_some(()) }
    })
    .await;
    // A JWT signed with the cluster's jwt.key is accepted over HTTP.
    let jwt_secret = api
        .get(&resources::SECRETS, NS, cluster::JWT_SECRET)
        .unwrap();
    let jwt_key = base64::engine::general_purpose::STANDARD
        .decode(jwt_secret["data"]["jwt.key"].as_str().unwrap())
        .unwrap();
    let token = mint_token(&jwt_key, "slurm", Duration::from_secs(60));
    let url: hyper::Uri = format!("{}/slurm/v0.0.44/nodes/", c.slurmrestd_url())
        .parse()
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Empty<hyper::body::Bytes>>();
    let req = hyper::Request::get(url)
        .header("X-SLURM-USER-TOKEN", token)
        .body(Default::default())
        .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 200);

    // The real kube client works through the kubeconfig the cluster wrote.
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig_path()).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> = kube::Api::namespaced(client, NS);
    let listed = pods
        .list(
            &kube::api::ListParams::default()
                .labels("app.kubernetes.io/name=slurmd")
                .fields("spec.nodeName=node-1"),
        )
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0].metadata.name.as_deref(),
        Some("slurm-worker-slinky-1")
    );

    // Clean shutdown: temp dir gone, ports closed.
    let dir = c.dir().to_path_buf();
    let api_url = c.api_url();
    c.shutdown().await;
    assert!(!dir.exists());
    let addr = api_url.trim_start_matches("http://").to_string();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn cluster_reproduces_a_rotated_immutable_key_pinned_on_one_node_end_to_end() {
    let mut c = Cluster::builder().nodes(2).slinky().start().await.unwrap();
    let api = c.api();
    let slurm = c.slurm();
    let w0 = running(&api, "slurm-worker-slinky-0", None).await;
    running(&api, "slurm-worker-slinky-1", None).await;
    // Another pod on node-0 references the key Secret (say, a login pod).
    let mut login = json!({"metadata": {"name": "login-0"}, "spec": cluster::slurmd_template()["spec"].clone()});
    login["spec"]["nodeName"] = json!("node-0");
    api.create(&resources::PODS, NS, login).unwrap();
    running(&api, "login-0", None).await;
    let old_key = api_key(&api);

    // Rotate the immutable key by delete and recreate: slurmctld loads the
    // new key, running slurmds still have the old one.
    api.delete(
        &resources::SECRETS,
        NS,
        cluster::AUTH_SECRET,
        &DeleteOptions::default(),
    )
    .unwrap();
    let new_key = b"rotated-slurm-key".to_vec();
    api.create(
        &resources::SECRETS,
        NS,
        json!({"metadata": {"name": cluster::AUTH_SECRET}, "immutable": true,
               "data": {"slurm.key": base64::engine::general_purpose::STANDARD.encode(&new_key)}}),
    )
    .unwrap();
    // slurmctld restarted on the new key; the running workers are not. As
    // Slurm 26.05 shows it: not DOWN; UNKNOWN until the slurmd answers,
    // then IDLE; slurmd_start_time 0 (no registration since the restart).
    let before = slurm
        .node("slurm-worker-slinky-1")
        .and_then(|n| n.slurmd_start_time);
    let before0 = slurm
        .node("slurm-worker-slinky-0")
        .and_then(|n| n.slurmd_start_time);
    assert!(before0.is_some(), "worker 0 registered before the rotation");
    eventually(10, "workers on the old key", || {
        let stale = !slurm.slurmd_key_matches("slurm-worker-slinky-1");
        async move { stale.then_some(()) }
    })
    .await;
    let s1 = slurm.node("slurm-worker-slinky-1").unwrap();
    assert!(
        matches!(s1.state[0].as_str(), "UNKNOWN" | "IDLE"),
        "{:?}",
        s1.state
    );
    assert!(before.is_some_and(|t| t > 0), "{before:?}");
    assert_eq!(s1.slurmd_start_time, Some(0));

    // Replace both workers: node-1's pod was the only reference and gets the
    // new key; node-0's replacement is served the pinned old key.
    let n1 = replace_pod(&api, "slurm-worker-slinky-1").await;
    let n0 = replace_pod(&api, "slurm-worker-slinky-0").await;
    assert_ne!(uid(&n0), uid(&w0));
    assert_eq!(key_on_node(&c, 1, &n1), new_key);
    assert_eq!(key_on_node(&c, 0, &n0), old_key);
    eventually(10, "node-1 worker back", || {
        let s = slurm.node("slurm-worker-slinky-1").map(|n| n.state);
        async move { (s == Some(vec!["IDLE".into()])).then_some(()) }
    })
    .await;
    // node-0's replacement runs on the pinned old key: it looks UNKNOWN,
    // then IDLE (with NOT_RESPONDING now and then), and has not registered
    // since slurmctld restarted.
    assert!(!slurm.slurmd_key_matches("slurm-worker-slinky-0"));
    let s0 = slurm.node("slurm-worker-slinky-0").unwrap();
    assert!(
        matches!(s0.state[0].as_str(), "UNKNOWN" | "IDLE"),
        "{:?}",
        s0.state
    );
    assert_eq!(s0.slurmd_start_time, Some(0), "no registration: {s0:?}");
    c.shutdown().await;
}

#[tokio::test]
async fn cluster_supports_the_drain_wait_evict_path_with_the_pdb_protecting_busy_workers() {
    let mut c = Cluster::builder().nodes(1).slinky().start().await.unwrap();
    let api = c.api();
    let slurm = c.slurm();
    let w0 = running(&api, "slurm-worker-slinky-0", None).await;
    eventually(10, "slurm node idle", || {
        let s = slurm.node("slurm-worker-slinky-0").map(|n| n.state);
        async move { (s == Some(vec!["IDLE".into()])).then_some(()) }
    })
    .await;
    let job = slurm.start_job("slurm-worker-slinky-0", 1);
    let protected = |api: &ApiHandle| {
        api.get(&resources::PODS, NS, "slurm-worker-slinky-0")
            .unwrap()["metadata"]["labels"][cluster::LABEL_POD_PROTECT]
            == "true"
    };
    eventually(10, "busy worker protected", || {
        let p = protected(&api);
        async move { p.then_some(()) }
    })
    .await;
    let e = api.evict(NS, "slurm-worker-slinky-0").unwrap_err();
    assert_eq!(e.code, 429);

    // Drain through slurmrestd, the job ends, the label goes, eviction works.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<hyper::body::Bytes>>();
    let body =
        serde_json::to_vec(&json!({"state": ["DRAIN"], "reason": "mountguard: stale content"}))
            .unwrap();
    let req = hyper::Request::post(format!(
        "{}/slurm/v0.0.44/node/slurm-worker-slinky-0",
        c.slurmrestd_url()
    ))
    .header("X-SLURM-USER-TOKEN", cluster::SLURM_TOKEN)
    .header("content-type", "application/json")
    .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))
    .unwrap();
    assert_eq!(client.request(req).await.unwrap().status(), 200);
    assert!(!slurm.node("slurm-worker-slinky-0").unwrap().is_drained());
    slurm.end_job(job);
    assert!(slurm.node("slurm-worker-slinky-0").unwrap().is_drained());
    eventually(10, "idle worker unprotected", || {
        let p = protected(&api);
        async move { (!p).then_some(()) }
    })
    .await;
    api.evict(NS, "slurm-worker-slinky-0").unwrap();
    let replacement = running(&api, "slurm-worker-slinky-0", Some(&uid(&w0))).await;
    assert_eq!(key_on_node(&c, 0, &replacement), api_key(&api));
    // The drain survives the pod's replacement; the new slurmd responds.
    eventually(10, "new slurmd registered, still drained", || {
        let s = slurm.node("slurm-worker-slinky-0").map(|n| n.state);
        async move { (s == Some(vec!["IDLE".into(), "DRAIN".into()])).then_some(()) }
    })
    .await;
    c.shutdown().await;
}

#[tokio::test]
async fn a_cordoned_node_takes_no_new_nodeset_pod_until_it_is_uncordoned() {
    let mut c = Cluster::builder().nodes(2).slinky().start().await.unwrap();
    let api = c.api();
    let name = format!("{}-0", cluster::NODESET);
    let old = running(&api, &name, None).await;
    set_unschedulable(&api, "node-0", true);
    api.delete(&resources::PODS, NS, &name, &DeleteOptions::default())
        .unwrap();
    // Recreated (new UID) but left Pending, unbound.
    let pending = eventually(15, "a pending replacement", || {
        let p = api.get(&resources::PODS, NS, &name).ok();
        let old = uid(&old);
        async move {
            let p = p?;
            (p["metadata"]["uid"].as_str() != Some(old.as_str())).then_some(p)
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let p = api.get(&resources::PODS, NS, &name).unwrap();
    assert!(p["spec"]["nodeName"].is_null(), "{p}");
    assert_ne!(p["status"]["phase"], "Running", "{p}");
    // Uncordoned: bound to node-0 and started there.
    set_unschedulable(&api, "node-0", false);
    let p = running(&api, &name, Some(&uid(&old))).await;
    assert_eq!(uid(&p), uid(&pending));
    assert_eq!(p["spec"]["nodeName"], "node-0");
    // Binding is once only.
    let e = api.bind(NS, &name, "node-1").unwrap_err();
    assert_eq!(e.code, 409, "{e:?}");
    c.shutdown().await;
}
