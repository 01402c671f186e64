//! Forged reports are rejected and change nothing.

use mountguard_inventory::NodeInventory;
use mountguard_inventory::report::{Heartbeat, heartbeat_path, inventory_path};
use mountguard_tests::demo::scrape;
use mountguard_tests::mountguard::http_request;

use crate::harness::{HEARTBEAT, Options, System, wait_all_fresh};

/// What, path, token, body, expected status, expected error code.
type Case = (&'static str, String, String, Vec<u8>, u16, &'static str);

fn states(doc: &serde_json::Value) -> Vec<(String, String, String, String)> {
    let mut v: Vec<_> = doc["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["pod"].as_str().unwrap_or("").to_string(),
                v["subject"].as_str().unwrap_or("").to_string(),
                v["state"].as_str().unwrap_or("").to_string(),
                v["observed"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    v.sort();
    v
}

async fn put(sys: &System, path: &str, token: &str, body: Vec<u8>) -> (u16, String) {
    let auth = format!("Bearer {token}");
    http_request(
        "PUT",
        &format!("{}{path}", sys.report_base()),
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ],
        body,
    )
    .await
    .unwrap()
}

fn counter(samples: &[mountguard_tests::demo::MetricSample], result: &str) -> f64 {
    samples
        .iter()
        .filter(|s| {
            s.name == "mountguard_report_requests_total"
                && s.labels.get("result").map(String::as_str) == Some(result)
        })
        .map(|s| s.value)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_reports_are_rejected_and_change_nothing() {
    let sys = System::start(Options {
        extra_controller_args: vec![
            "--max-report-bytes".into(),
            "1Mi".into(),
            "--report-rate-limit".into(),
            "100/s,100".into(),
        ],
        ..Options::default()
    })
    .await;
    let before = states(&wait_all_fresh(&sys).await);
    let node_a = &sys.ids[0];
    let node_b = &sys.ids[1];
    // An inventory that, if accepted, would empty node-0 and claim a
    // generation far ahead of the agent's.
    let mut forged = NodeInventory::new("node-0", "forged", jiff::Timestamp::now());
    forged.generation = 1 << 62;
    let forged = serde_json::to_vec(&forged).unwrap();
    let hb =
        serde_json::to_vec(&Heartbeat::new("node-0", 1 << 62, jiff::Timestamp::now())).unwrap();

    let inv_a = inventory_path("node-0");
    let cases: Vec<Case> = vec![
        (
            "node B's token for node A",
            inv_a.clone(),
            node_b.token().unwrap(),
            forged.clone(),
            403,
            "forbidden",
        ),
        (
            "node B's token, heartbeat for node A",
            heartbeat_path("node-0"),
            node_b.token().unwrap(),
            hb,
            403,
            "forbidden",
        ),
        (
            "unknown token",
            inv_a.clone(),
            "not-a-token".into(),
            forged.clone(),
            401,
            "unauthenticated",
        ),
        (
            "malformed body",
            inv_a.clone(),
            node_a.token().unwrap(),
            b"{\"schema\": ".to_vec(),
            400,
            "badRequest",
        ),
        (
            "node in body differs from path",
            inventory_path("node-1"),
            node_b.token().unwrap(),
            forged.clone(),
            400,
            "badRequest",
        ),
        (
            "oversized body",
            inv_a.clone(),
            node_a.token().unwrap(),
            vec![b' '; 2 << 20],
            413,
            "tooLarge",
        ),
    ];
    for (what, path, token, body, code, error) in cases {
        let (got, text) = put(&sys, &path, &token, body).await;
        assert_eq!(got, code, "{what}: {text}");
        let err: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
        assert_eq!(err["error"], error, "{what}: {text}");
        assert!(
            err["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{what}: {text}"
        );
    }
    // Several heartbeats later nothing changed: same verdicts, and the
    // real agent's reports are still accepted (no 409 from a stolen
    // generation).
    tokio::time::sleep(HEARTBEAT * 3).await;
    let after = states(&sys.verdicts("all=1").await);
    assert_eq!(before, after);
    let m = scrape(&sys.metrics_base()).await.unwrap();
    assert!(counter(&m, "forbidden") >= 2.0);
    assert!(counter(&m, "unauthenticated") >= 1.0);
    assert!(counter(&m, "bad_request") >= 2.0);
    assert!(counter(&m, "too_large") >= 1.0);
    assert_eq!(counter(&m, "conflict"), 0.0);
    sys.shutdown().await;
}

/// A pod that merely names the agent DaemonSet in an ownerReference (not
/// as its controller, or with another UID), running on node-0 under the
/// agent ServiceAccount with a projected `mountguard` token, is not an
/// agent: its reports are refused while the real agent's are accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_only_names_the_agent_daemonset_is_not_an_agent() {
    use mountguard_tests::mountguard::{agent_daemonset_uid, agent_pod, deploy_pod_with_token};
    let sys = System::start(Options::default()).await;
    wait_all_fresh(&sys).await;
    let live_uid = agent_daemonset_uid(&sys.cluster).unwrap();
    let cases = [
        ("not-controller", live_uid.as_str(), false),
        ("forged-uid", "00000000-0000-0000-0000-000000000000", true),
    ];
    let inv = serde_json::to_vec(&NodeInventory::new(
        "node-0",
        "forged",
        jiff::Timestamp::now(),
    ))
    .unwrap();
    for (name, uid, controller) in cases {
        let mut pod = agent_pod("node-0", uid);
        pod["metadata"]["name"] = format!("imposter-{name}").into();
        pod["metadata"]["ownerReferences"][0]["controller"] = controller.into();
        let id = deploy_pod_with_token(&sys.cluster, 0, pod).await.unwrap();
        let (code, text) = put(
            &sys,
            &inventory_path("node-0"),
            &id.token().unwrap(),
            inv.clone(),
        )
        .await;
        assert_eq!(code, 403, "{name}: {text}");
        assert!(
            text.contains("not controlled by the agent DaemonSet"),
            "{name}: {text}"
        );
    }
    // The real agent of node-0 still reports.
    let (code, text) = put(
        &sys,
        &heartbeat_path("node-0"),
        &sys.ids[0].token().unwrap(),
        serde_json::to_vec(&Heartbeat::new("node-0", u64::MAX, jiff::Timestamp::now())).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    sys.shutdown().await;
}

fn metric(samples: &[mountguard_tests::demo::MetricSample], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

/// Random tokens do not each cost a TokenReview: one source drives at most
/// its burst (20) plus 2 per second, the rest are answered 429 at once,
/// and the real agents (same address here, their tokens cached) keep
/// reporting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_tokens_do_not_each_cost_a_token_review() {
    let sys = System::start(Options::default()).await;
    wait_all_fresh(&sys).await;
    let m = scrape(&sys.metrics_base()).await.unwrap();
    let reviews_before = metric(&m, "mountguard_tokenreview_duration_seconds_count");
    let started = std::time::Instant::now();
    let hb = serde_json::to_vec(&Heartbeat::new("node-0", 1, jiff::Timestamp::now())).unwrap();
    let mut codes = std::collections::BTreeMap::new();
    for i in 0..300 {
        let (code, _) = put(
            &sys,
            &heartbeat_path("node-0"),
            &format!("random-{i}"),
            hb.clone(),
        )
        .await;
        *codes.entry(code).or_insert(0) += 1;
    }
    let elapsed = started.elapsed().as_secs_f64();
    let m = scrape(&sys.metrics_base()).await.unwrap();
    let reviews = metric(&m, "mountguard_tokenreview_duration_seconds_count") - reviews_before;
    assert!(
        reviews <= 20.0 + 2.0 * elapsed + 1.0,
        "{reviews} TokenReviews for 300 random tokens in {elapsed:.1}s ({codes:?})"
    );
    assert!(codes.get(&429).copied().unwrap_or(0) >= 200, "{codes:?}");
    assert!(metric(&m, "mountguard_tokenreview_throttled_total") >= 200.0);
    // The real agent's token is cached: still accepted.
    let (code, text) = put(
        &sys,
        &heartbeat_path("node-0"),
        &sys.ids[0].token().unwrap(),
        serde_json::to_vec(&Heartbeat::new("node-0", u64::MAX, jiff::Timestamp::now())).unwrap(),
    )
    .await;
    assert_eq!(code, 200, "{text}");
    sys.shutdown().await;
}
