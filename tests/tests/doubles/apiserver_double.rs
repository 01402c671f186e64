//! The API server double against the real `kube` client and kube-runtime.
//!
//! Kubernetes code cited here is at v1.37.2 (`k8s.io/*` staging modules
//! at v0.37.2).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams,
    Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Config};
use mountguard_tests::apiserver::{API_AUDIENCES, ApiServerDouble, TokenUser, resources};
use serde_json::json;
use tokio::sync::mpsc;

use crate::{eventually, within};

async fn client(api: &ApiServerDouble) -> Client {
    let config = Config::new(api.url().parse().expect("url"));
    Client::try_from(config).expect("client")
}

/// A client without kube's default retry layer (which retries 429, 503 and
/// 504 up to 15 times), to see the double's answers as they are.
async fn client_no_retry(api: &ApiServerDouble) -> Client {
    let mut config = Config::new(api.url().parse().expect("url"));
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

fn cm(name: &str, value: &str) -> ConfigMap {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "hooks"}},
        "data": {"k": value},
    }))
    .unwrap()
}

fn api_err(e: kube::Error) -> Box<kube::core::Status> {
    match e {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other}"),
    }
}

#[derive(Debug, PartialEq)]
enum Seen {
    Init,
    InitApply(String),
    InitDone,
    Apply(String, String),
    Delete(String),
}

#[tokio::test]
async fn kube_runtime_watcher_and_reflector_see_changes_in_order_and_survive_410_relist_on_the_double()
 {
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("before", "0"))
        .await
        .unwrap();

    let (reader, writer) = reflector::store::<ConfigMap>();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = watcher(cms.clone(), watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let name = |c: &ConfigMap| c.metadata.name.clone().unwrap_or_default();
            let seen = match ev {
                Ok(watcher::Event::Init) => Seen::Init,
                Ok(watcher::Event::InitApply(c)) => Seen::InitApply(name(&c)),
                Ok(watcher::Event::InitDone) => Seen::InitDone,
                Ok(watcher::Event::Apply(c)) => {
                    let v = c
                        .data
                        .as_ref()
                        .and_then(|d| d.get("k").cloned())
                        .unwrap_or_default();
                    Seen::Apply(name(&c), v)
                }
                Ok(watcher::Event::Delete(c)) => Seen::Delete(name(&c)),
                Err(_) => continue,
            };
            if tx.send(seen).is_err() {
                break;
            }
        }
    });
    let mut next = async || {
        within(10, "watch event", rx.recv())
            .await
            .expect("stream ended")
    };
    assert_eq!(next().await, Seen::Init);
    assert_eq!(next().await, Seen::InitApply("before".into()));
    assert_eq!(next().await, Seen::InitDone);
    within(10, "reflector ready", reader.wait_until_ready())
        .await
        .unwrap();

    let created = cms
        .create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();
    let mut updated = created.clone();
    updated.data = Some(BTreeMap::from([("k".to_string(), "2".to_string())]));
    cms.replace("a", &PostParams::default(), &updated)
        .await
        .unwrap();
    cms.delete("a", &DeleteParams::default()).await.unwrap();
    assert_eq!(next().await, Seen::Apply("a".into(), "1".into()));
    assert_eq!(next().await, Seen::Apply("a".into(), "2".into()));
    assert_eq!(next().await, Seen::Delete("a".into()));

    // Forced 410: the watch gets an ERROR event with an Expired Status; the
    // watcher re-lists and the reflector converges.
    cms.create(&PostParams::default(), &cm("b", "1"))
        .await
        .unwrap();
    assert_eq!(next().await, Seen::Apply("b".into(), "1".into()));
    api.handle().expire_watches();
    assert_eq!(next().await, Seen::Init);
    let mut relisted = vec![next().await, next().await];
    relisted.sort_by_key(|s| format!("{s:?}"));
    assert_eq!(
        relisted,
        vec![
            Seen::InitApply("b".into()),
            Seen::InitApply("before".into())
        ]
    );
    assert_eq!(next().await, Seen::InitDone);
    cms.create(&PostParams::default(), &cm("c", "1"))
        .await
        .unwrap();
    assert_eq!(next().await, Seen::Apply("c".into(), "1".into()));
    let mut names: Vec<String> = reader
        .state()
        .iter()
        .map(|c| c.metadata.name.clone().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["b", "before", "c"]);
    // The watcher listed twice (start and after the 410) and watched again.
    let lists = api
        .handle()
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && !r.uri.contains("watch="))
        .count();
    assert!(lists >= 2, "re-listed after the 410");
    assert!(
        api.handle()
            .requests()
            .iter()
            .filter(|r| r.uri.contains("watch=true"))
            .count()
            >= 2
    );
    task.abort();
    api.shutdown().await;
}

#[tokio::test]
async fn watch_from_a_compacted_version_gets_410_and_bookmarks_arrive() {
    let mut api = ApiServerDouble::start().await.unwrap();
    api.handle().set_event_log_capacity(3);
    api.handle()
        .set_bookmark_interval(Duration::from_millis(100));
    let client = client(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let first = cms
        .create(&PostParams::default(), &cm("x0", "0"))
        .await
        .unwrap();
    let old_rv = first.metadata.resource_version.unwrap();
    for i in 1..6 {
        cms.create(&PostParams::default(), &cm(&format!("x{i}"), "0"))
            .await
            .unwrap();
    }
    let mut s = cms
        .watch(&WatchParams::default(), &old_rv)
        .await
        .unwrap()
        .boxed();
    match within(5, "410", s.next()).await {
        Some(Ok(WatchEvent::Error(st))) => {
            assert_eq!((st.code, st.reason.as_str()), (410, "Expired"));
            assert!(
                st.message.starts_with("too old resource version"),
                "{}",
                st.message
            );
        }
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // A current version works and gets bookmarks.
    let list = cms.list(&ListParams::default()).await.unwrap();
    let rv = list.metadata.resource_version.unwrap();
    let mut s = cms
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let y = cms
        .create(&PostParams::default(), &cm("y", "0"))
        .await
        .unwrap();
    let y_rv: u64 = y.metadata.resource_version.unwrap().parse().unwrap();
    let mut added = false;
    loop {
        match within(5, "added, then a bookmark", s.next()).await {
            Some(Ok(WatchEvent::Added(c))) => {
                assert_eq!(c.metadata.name.as_deref(), Some("y"));
                added = true;
            }
            Some(Ok(WatchEvent::Bookmark(b))) => {
                let brv: u64 = b.metadata.resource_version.parse().unwrap();
                assert!(brv >= rv.parse::<u64>().unwrap());
                if added {
                    assert!(brv >= y_rv, "a bookmark never goes behind delivered events");
                    break;
                }
            }
            other => panic!("expected ADDED or BOOKMARK, got {other:?}"),
        }
    }
    api.shutdown().await;
}

#[tokio::test]
async fn selectors_pagination_conflicts_and_real_error_statuses() {
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client(&api).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for (name, node) in [("p1", "n1"), ("p2", "n2"), ("p3", "n1")] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"app": if name == "p2" { "other" } else { "slurmd" }}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let names = |l: kube::core::ObjectList<Pod>| {
        l.items
            .iter()
            .map(|p| p.metadata.name.clone().unwrap())
            .collect::<Vec<_>>()
    };
    let on_n1 = pods
        .list(&ListParams::default().fields("spec.nodeName=n1"))
        .await
        .unwrap();
    assert_eq!(names(on_n1), ["p1", "p3"]);
    let by_name = pods
        .list(&ListParams::default().fields("metadata.name=p2"))
        .await
        .unwrap();
    assert_eq!(names(by_name), ["p2"]);
    let by_label = pods
        .list(&ListParams::default().labels("app in (slurmd),app!=x"))
        .await
        .unwrap();
    assert_eq!(names(by_label), ["p1", "p3"]);
    let page1 = pods.list(&ListParams::default().limit(2)).await.unwrap();
    let token = page1.metadata.continue_.clone().expect("continue token");
    assert_eq!(names(page1), ["p1", "p2"]);
    let page2 = pods
        .list(&ListParams::default().limit(2).continue_token(&token))
        .await
        .unwrap();
    assert_eq!(names(page2), ["p3"]);
    let e = api_err(
        pods.list(&ListParams::default().fields("spec.bogus=1"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (400, "BadRequest"));

    let e = api_err(pods.get("nope").await.unwrap_err());
    assert_eq!(
        (e.code, e.reason.as_str(), e.message.as_str()),
        (404, "NotFound", "pods \"nope\" not found")
    );

    // Conflict on a stale resourceVersion.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let v1 = cms
        .create(&PostParams::default(), &cm("c", "1"))
        .await
        .unwrap();
    let mut v2 = v1.clone();
    v2.data = Some(BTreeMap::from([("k".into(), "2".into())]));
    cms.replace("c", &PostParams::default(), &v2).await.unwrap();
    let e = api_err(
        cms.replace("c", &PostParams::default(), &v2)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    let e = api_err(
        cms.create(&PostParams::default(), &cm("c", "1"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));

    // Immutable Secret: data changes are refused with the real message.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    let s: Secret = serde_json::from_value(json!({
        "metadata": {"name": "slurm-auth-slurm"}, "immutable": true,
        "data": {"slurm.key": "b2xk"},
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &s).await.unwrap();
    let patch = json!({"data": {"slurm.key": "bmV3"}});
    let e = api_err(
        secrets
            .patch(
                "slurm-auth-slurm",
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "Secret \"slurm-auth-slurm\" is invalid: data: Forbidden: field is immutable when `immutable` is set"
    );
    // Labels still patch.
    let patch = json!({"metadata": {"labels": {"x": "y"}}});
    secrets
        .patch(
            "slurm-auth-slurm",
            &PatchParams::default(),
            &Patch::Strategic(&patch),
        )
        .await
        .unwrap();
    api.shutdown().await;
}

#[tokio::test]
async fn patches_apply_delete_eviction_and_token_reviews_through_kube() {
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client_no_retry(&api).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mk = |name: &str, protect: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"nodeset.slinky.slurm.net/pod-protect": protect}},
            "spec": {"nodeName": "n1", "containers": [{"name": "slurmd", "image": "slurmd"}]},
        }))
        .unwrap()
    };
    for (n, p) in [("busy", "true"), ("idle", "false")] {
        pods.create(&PostParams::default(), &mk(n, p))
            .await
            .unwrap();
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(n, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    // Server-side apply of annotations, then dropping one.
    let pp = PatchParams::apply("mountguard").force();
    let cfg = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "annotations": {"mountguard.io/a": "1", "mountguard.io/b": "2"}}});
    pods.patch("busy", &pp, &Patch::Apply(&cfg)).await.unwrap();
    let cfg = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "busy", "annotations": {"mountguard.io/a": "3"}}});
    let p = pods.patch("busy", &pp, &Patch::Apply(&cfg)).await.unwrap();
    let ann = p.metadata.annotations.unwrap();
    assert_eq!(ann.get("mountguard.io/a").map(String::as_str), Some("3"));
    assert!(!ann.contains_key("mountguard.io/b"));
    // Unsupported strategic-merge list patches are refused, not misapplied.
    let bad = json!({"spec": {"containers": [{"name": "slurmd", "image": "new"}]}});
    let e = api_err(
        pods.patch("busy", &PatchParams::default(), &Patch::Strategic(&bad))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 415);

    // Eviction honours the PDB: 429 for a protected busy pod.
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "default");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "slurm-workers-pdb-slurm"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"nodeset.slinky.slurm.net/pod-protect": "true"}}},
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    let e = api_err(
        pods.evict("busy", &EvictParams::default())
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));
    pods.evict("idle", &EvictParams::default()).await.unwrap();
    // Graceful deletion: deletionTimestamp set, pod still there until the
    // kubelet's final delete.
    let idle = pods.get("idle").await.unwrap();
    assert!(idle.metadata.deletion_timestamp.is_some());
    let uid = idle.metadata.uid.clone().unwrap();
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..Default::default()
    };
    pods.delete("idle", &dp).await.unwrap();
    assert_eq!(api_err(pods.get("idle").await.unwrap_err()).code, 404);

    // TokenReview: configured tokens map to users with extra.
    api.handle().add_token(
        "agent-token",
        TokenUser {
            username: "system:serviceaccount:mountguard:agent".into(),
            uid: "sa-uid".into(),
            groups: vec!["system:serviceaccounts".into()],
            extra: BTreeMap::from([(
                "authentication.kubernetes.io/node-name".into(),
                vec!["n1".into()],
            )]),
            audiences: vec!["mountguard".into()],
        },
    );
    let reviews: Api<TokenReview> = Api::all(client.clone());
    let review = |token: &str, aud: &str| TokenReview {
        spec: TokenReviewSpec {
            token: token.into(),
            audiences: Some(vec![aud.into()]),
        },
        ..Default::default()
    };
    let ok = reviews
        .create(&PostParams::default(), &review("agent-token", "mountguard"))
        .await
        .unwrap();
    let st = ok.status.unwrap();
    assert_eq!(st.authenticated, Some(true));
    let user = st.user.unwrap();
    assert_eq!(
        user.username.as_deref(),
        Some("system:serviceaccount:mountguard:agent")
    );
    assert_eq!(
        user.extra.unwrap()["authentication.kubernetes.io/node-name"],
        vec!["n1".to_string()]
    );
    let wrong_aud = reviews
        .create(&PostParams::default(), &review("agent-token", "other"))
        .await
        .unwrap();
    assert_eq!(wrong_aud.status.unwrap().authenticated, Some(false));
    let unknown = reviews
        .create(&PostParams::default(), &review("nope", "mountguard"))
        .await
        .unwrap();
    assert_eq!(unknown.status.unwrap().authenticated, Some(false));
    api.shutdown().await;
}

/// The controller's own eviction request (`remediation::eviction::evict`)
/// against the double: a dry run refused by a PodDisruptionBudget answers
/// Refused, an allowed one writes nothing, and the UID precondition
/// reaches the server (kube's `Api::evict` sends the options under a key
/// the API server does not read, `delete_options`).
#[tokio::test]
async fn a_dry_run_eviction_refused_by_a_pdb_writes_nothing_and_the_uid_precondition_reaches_the_server()
 {
    use mountguard_controller::remediation::eviction::evict;
    use mountguard_controller::runtime::metrics::Metrics;
    use mountguard_core::remediation::EvictionResult;
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client_no_retry(&api).await;
    let metrics = Metrics::new();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut uids = BTreeMap::new();
    for (name, protect) in [("busy", "true"), ("idle", "false")] {
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"protect": protect}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "app"}]},
        }))
        .unwrap();
        let p = pods.create(&PostParams::default(), &p).await.unwrap();
        uids.insert(name, p.metadata.uid.unwrap());
        let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
    }
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "protect"},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"protect": "true"}}},
    }))
    .unwrap();
    Api::<PodDisruptionBudget>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &pdb)
        .await
        .unwrap();
    let ask = |pod: &'static str, uid: String, dry_run: bool| {
        let (client, metrics) = (client.clone(), metrics.clone());
        async move { evict(&client, &client, &metrics, "default", pod, &uid, dry_run).await }
    };
    let r = ask("busy", uids["busy"].clone(), true).await;
    assert!(
        matches!(&r, EvictionResult::Refused { message, .. } if message.contains("disruption budget")),
        "{r:?}"
    );
    let before = pods.get("idle").await.unwrap();
    assert_eq!(
        ask("idle", uids["idle"].clone(), true).await,
        EvictionResult::Evicted
    );
    let after = pods.get("idle").await.unwrap();
    assert_eq!(
        (
            after.metadata.resource_version,
            after.metadata.deletion_timestamp
        ),
        (before.metadata.resource_version, None),
        "a dry run writes nothing"
    );
    // Another UID: refused by the precondition (409), and the pod under
    // the name is not the one asked for: Gone, the pod untouched.
    assert_eq!(
        ask("idle", "not-its-uid".into(), false).await,
        EvictionResult::Gone
    );
    assert!(
        pods.get("idle")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
    // Its own UID: evicted.
    assert_eq!(
        ask("idle", uids["idle"].clone(), false).await,
        EvictionResult::Evicted
    );
    assert!(
        pods.get("idle")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some()
    );
    api.shutdown().await;
}

#[tokio::test]
async fn discovery_and_nodeset_custom_resource_through_dynamic_api() {
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client(&api).await;
    let discovery = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let gvk = GroupVersionKind::gvk("slinky.slurm.net", "v1beta1", "NodeSet");
    let (ar, caps) = discovery.resolve_gvk(&gvk).expect("nodesets discovered");
    assert_eq!(ar.plural, "nodesets");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    assert!(
        discovery
            .resolve_gvk(&GroupVersionKind::gvk("coordination.k8s.io", "v1", "Lease"))
            .is_some()
    );
    let v = client.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");

    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "slurm"}})).unwrap(),
    )
    .await
    .unwrap();
    let nodesets: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "slurm", &ApiResource::from_gvk(&gvk));
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": {"name": "slurm-worker-slinky"}, "spec": {"replicas": 2},
    }))
    .unwrap();
    let created = nodesets.create(&PostParams::default(), &obj).await.unwrap();
    assert_eq!(created.metadata.generation, Some(1));
    // Custom resources need a resourceVersion on update.
    let mut upd = created.clone();
    upd.metadata.resource_version = None;
    upd.data["spec"]["replicas"] = json!(3);
    let e = api_err(
        nodesets
            .replace("slurm-worker-slinky", &PostParams::default(), &upd)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    let p = nodesets
        .patch(
            "slurm-worker-slinky",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(p.metadata.generation, Some(2));
    // Status changes through the main resource are ignored, through the subresource applied.
    let s = nodesets
        .patch_status(
            "slurm-worker-slinky",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"replicas": 3}})),
        )
        .await
        .unwrap();
    assert_eq!(s.data["status"]["replicas"], json!(3));
    assert_eq!(s.metadata.generation, Some(2));
    assert!(
        api.handle()
            .get(&resources::NODESETS, "slurm", "slurm-worker-slinky")
            .is_ok()
    );
    api.shutdown().await;
}

#[tokio::test]
async fn faults_on_demand_errors_delays_and_dropped_watches() {
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("a", "1"))
        .await
        .unwrap();

    api.handle().fail_requests(500, 1, Some("/configmaps/a"));
    let e = api_err(cms.get("a").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));
    cms.get("a").await.unwrap();
    // 429 with Retry-After: kube's default retry layer retries it...
    let count = |api: &ApiServerDouble| {
        api.handle()
            .requests()
            .iter()
            .filter(|r| r.uri.ends_with("/configmaps/a"))
            .count()
    };
    let before = count(&api);
    api.handle().fail_requests(429, 1, None);
    cms.get("a").await.unwrap();
    assert_eq!(
        count(&api) - before,
        2,
        "one throttled request and one retry"
    );
    // ...and a client without it sees the 429 Status.
    let raw: Api<ConfigMap> = Api::namespaced(client_no_retry(&api).await, "default");
    api.handle().fail_requests(429, 1, None);
    let e = api_err(raw.get("a").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (429, "TooManyRequests"));

    api.handle().set_delay(Duration::from_millis(300));
    let t = Instant::now();
    cms.get("a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    api.handle().clear_faults();

    // A dropped watch is resumed from its last version without a re-list.
    let (tx, mut rx) = mpsc::unbounded_channel();
    let stream = watcher(cms.clone(), watcher::Config::default()).default_backoff();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(ev) = ev {
                let _ = tx.send(
                    format!("{:?}", std::mem::discriminant(&ev))
                        + &match ev {
                            watcher::Event::Apply(c) | watcher::Event::InitApply(c) => {
                                c.metadata.name.unwrap_or_default()
                            }
                            watcher::Event::Init => "init".into(),
                            watcher::Event::InitDone => "done".into(),
                            watcher::Event::Delete(_) => "delete".into(),
                        },
                );
            }
        }
    });
    let seen = eventually(10, "initial list", || {
        let got = rx.try_recv().ok();
        async move { got.filter(|s| s.ends_with("done")) }
    })
    .await;
    assert!(seen.ends_with("done"));
    let watches_before = api
        .handle()
        .requests()
        .iter()
        .filter(|r| r.uri.contains("watch="))
        .count();
    api.handle().drop_watches();
    eventually(10, "watch reconnect", || {
        let n = api
            .handle()
            .requests()
            .iter()
            .filter(|r| r.uri.contains("watch="))
            .count();
        async move { (n > watches_before).then_some(()) }
    })
    .await;
    cms.create(&PostParams::default(), &cm("after-drop", "1"))
        .await
        .unwrap();
    let got = within(10, "event after reconnect", rx.recv())
        .await
        .unwrap();
    assert!(got.ends_with("after-drop"), "{got}");
    assert!(rx.try_recv().is_err(), "no re-list after a plain reconnect");
    task.abort();
    api.shutdown().await;
}

#[tokio::test]
async fn kube_runtime_streaming_list_watcher_and_event_recorder_work_against_the_double() {
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client(&api).await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("s1", "1"))
        .await
        .unwrap();
    cms.create(&PostParams::default(), &cm("s2", "1"))
        .await
        .unwrap();
    let stream =
        watcher(cms.clone(), watcher::Config::default().streaming_lists()).default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut seen = Vec::new();
    loop {
        match within(10, "streaming list", stream.next()).await {
            Some(Ok(watcher::Event::InitDone)) => break,
            Some(Ok(watcher::Event::InitApply(c))) => seen.push(c.metadata.name.unwrap()),
            Some(Ok(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    seen.sort();
    assert_eq!(seen, ["s1", "s2"]);
    let sent = api.handle().requests();
    assert!(
        sent.iter()
            .any(|r| r.uri.contains("sendInitialEvents=true")),
        "{sent:?}"
    );

    // kube-runtime's Recorder creates an events.k8s.io/v1 Event, then
    // merge-patches its series on repetition.
    use kube::runtime::events::{Event, EventType, Recorder, Reporter};
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "mountguard".into(),
            instance: None,
        },
    );
    let cmobj = cms.get("s1").await.unwrap();
    let reference = kube::Resource::object_ref(&cmobj, &());
    let ev = Event {
        type_: EventType::Warning,
        reason: "Stale".into(),
        note: Some("content differs".into()),
        action: "Verify".into(),
        secondary: None,
    };
    recorder.publish(&ev, &reference).await.unwrap();
    recorder.publish(&ev, &reference).await.unwrap();
    let events = api.handle().list_all(&resources::EVENTS, Some("default"));
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["reason"], "Stale");
    assert_eq!(events[0]["regarding"]["name"], "s1");
    assert_eq!(events[0]["series"]["count"], 2);
    api.shutdown().await;
}

/// The service proxy path form `kubectl` plugins use, through the real
/// kube client: by port name and number, query passed on, the backend's
/// status passed back, 503 without endpoints, 404 without the Service.
#[tokio::test]
async fn service_proxy_reaches_the_backend_by_port_name_and_number() {
    use mountguard_tests::apiserver::proxy;
    let api = ApiServerDouble::start().await.unwrap();
    let backend = mountguard_tests::http::Server::start(|req| async move {
        let pq = req
            .uri()
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default();
        if req.uri().path() == "/missing" {
            let mut r = hyper::Response::new(mountguard_tests::http::full("not found\n"));
            *r.status_mut() = hyper::StatusCode::NOT_FOUND;
            return r;
        }
        mountguard_tests::http::json(hyper::StatusCode::OK, &json!({"saw": pq}))
    })
    .await
    .unwrap();
    let addr: std::net::SocketAddr = backend.url().trim_start_matches("http://").parse().unwrap();
    proxy::expose(&api.handle(), "mg", "ctl-metrics", "metrics", addr).unwrap();
    let client = client_no_retry(&api).await;
    let get = |path: String| {
        let client = client.clone();
        async move {
            client
                .request_text(http::Request::get(path).body(Vec::new()).unwrap())
                .await
        }
    };
    for id in [
        "http:ctl-metrics:metrics".to_string(),
        "ctl-metrics:metrics".to_string(),
        format!("ctl-metrics:{}", addr.port()),
    ] {
        let body = get(format!(
            "/api/v1/namespaces/mg/services/{id}/proxy/v1/verdicts?all=1&state=Stale%2FUnknown"
        ))
        .await
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["saw"], "/v1/verdicts?all=1&state=Stale%2FUnknown", "{id}");
    }
    let e = get("/api/v1/namespaces/mg/services/http:ctl-metrics:metrics/proxy/missing".into())
        .await
        .unwrap_err();
    assert!(
        matches!(&e, kube::Error::Api(s) if s.code == 404),
        "the backend's status comes back: {e}"
    );
    let e = get("/api/v1/namespaces/mg/services/http:ctl-metrics:9/proxy/x".into())
        .await
        .unwrap_err();
    assert_eq!(api_err(e).code, 503);
    let e = get("/api/v1/namespaces/mg/services/http:nope:metrics/proxy/x".into())
        .await
        .unwrap_err();
    assert_eq!(api_err(e).code, 404);
    // Endpoints without a ready address: 503 like the real server.
    api.handle()
        .create(
            &resources::SERVICES,
            "mg",
            json!({"metadata": {"name": "empty"}, "spec": {"ports": [{"name": "metrics", "port": 80}]}}),
        )
        .unwrap();
    api.handle()
        .create(
            &resources::ENDPOINTS,
            "mg",
            json!({"metadata": {"name": "empty"}, "subsets": []}),
        )
        .unwrap();
    let e = get("/api/v1/namespaces/mg/services/http:empty:metrics/proxy/x".into())
        .await
        .unwrap_err();
    let s = api_err(e);
    assert_eq!(s.code, 503);
    assert!(
        s.message.contains("no endpoints available"),
        "{}",
        s.message
    );
}

/// A TokenReview without audiences checks the API server's own
/// (kubernetes/kubernetes `pkg/registry/authentication/tokenreview/storage.go`
/// `(*REST).Create`: `auds = r.apiAudiences` when `spec.audiences` is
/// empty), never "any": a token of another audience is not authenticated.
#[tokio::test]
async fn a_token_review_without_audiences_accepts_only_the_api_servers_own() {
    let mut api = ApiServerDouble::start().await.unwrap();
    let client = client(&api).await;
    let user = |aud: &[&str]| TokenUser {
        username: "u".into(),
        audiences: aud.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    };
    api.handle().add_token("agent-token", user(&["mountguard"]));
    api.handle().add_token("user-token", user(&[]));
    api.handle()
        .add_token("both-token", user(&["mountguard", API_AUDIENCES[0]]));
    let reviews: Api<TokenReview> = Api::all(client);
    let review = |token: &str, aud: Option<Vec<String>>| TokenReview {
        spec: TokenReviewSpec {
            token: token.into(),
            audiences: aud,
        },
        ..Default::default()
    };
    for audiences in [None, Some(vec![])] {
        let other = reviews
            .create(
                &PostParams::default(),
                &review("agent-token", audiences.clone()),
            )
            .await
            .unwrap()
            .status
            .unwrap();
        assert_eq!(other.authenticated, Some(false), "{other:?}");
        for token in ["user-token", "both-token"] {
            let own = reviews
                .create(&PostParams::default(), &review(token, audiences.clone()))
                .await
                .unwrap()
                .status
                .unwrap();
            assert_eq!(own.authenticated, Some(true), "{token}: {own:?}");
            assert_eq!(
                own.audiences,
                Some(vec![API_AUDIENCES[0].to_string()]),
                "{token}: only the audience checked is confirmed"
            );
        }
    }
    api.shutdown().await;
}
