//! Controller restart: state rebuilt from heartbeats, no spurious Events.

use std::time::Duration;

use mountguard_tests::mountguard::recorded_events;
use mountguard_tests::scenario::{
    add_pinning_pod, rotate_auth_key, state_tag, wait_for_slurmd_pods,
};

use crate::harness::{HEARTBEAT, Options, System, wait_all_fresh, wait_verdicts};

fn tags(doc: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = doc["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            format!(
                "{} {} {} {} {}",
                v["pod"].as_str().unwrap_or(""),
                v["subject"].as_str().unwrap_or(""),
                state_tag(v),
                v["expected"].as_str().unwrap_or(""),
                v["observed"].as_str().unwrap_or("")
            )
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_restart_rebuilds_from_heartbeats_without_spurious_events() {
    let mut sys = System::start(Options::default()).await;
    let api = sys.cluster.api();
    let pods = wait_for_slurmd_pods(&sys.cluster).await.unwrap();
    add_pinning_pod(&api, "node-0").await.unwrap();
    wait_all_fresh(&sys).await;
    // Some alarms to remember: the seed rotation.
    rotate_auth_key(&api).unwrap();
    let before = wait_verdicts(
        &sys,
        "stale verdicts and their Events",
        Duration::from_secs(20),
        "all=1",
        |doc| {
            let stale = doc["verdicts"]
                .as_array()?
                .iter()
                .filter(|v| v["state"] == "Stale")
                .count();
            let events = recorded_events(&api);
            let all_events = pods
                .iter()
                .all(|(p, _)| events.iter().any(|e| e.name == *p));
            (stale >= pods.len() && all_events).then_some(doc)
        },
    )
    .await;
    // Let the Event emitter settle, then restart.
    tokio::time::sleep(HEARTBEAT).await;
    let events_before = recorded_events(&api);
    sys.start_controller().await;
    let want = tags(&before);
    let after = wait_verdicts(
        &sys,
        "the same verdicts after the restart",
        Duration::from_secs(20),
        "all=1",
        |doc| (tags(&doc) == want).then_some(doc),
    )
    .await;
    assert_eq!(tags(&after), want);
    // The new process learnt the inventories through heartbeats answered
    // with `resend`.
    let m = mountguard_tests::demo::scrape(&sys.metrics_base())
        .await
        .unwrap();
    let resend: f64 = m
        .iter()
        .filter(|s| {
            s.name == "mountguard_report_requests_total"
                && s.labels.get("result").map(String::as_str) == Some("resend")
        })
        .map(|s| s.value)
        .sum();
    assert!(resend >= pods.len() as f64, "resend answers: {resend}");
    // A few more heartbeats: no Event was added by the new process.
    tokio::time::sleep(HEARTBEAT * 3).await;
    let events_after = recorded_events(&api);
    assert_eq!(
        events_before
            .iter()
            .map(|e| (&e.reason, &e.name, e.count))
            .collect::<Vec<_>>(),
        events_after
            .iter()
            .map(|e| (&e.reason, &e.name, e.count))
            .collect::<Vec<_>>(),
        "a restart raised Events"
    );
    sys.shutdown().await;
}
