//! The agent's clock is not trusted: report times ahead of the
//! controller's clock are clamped to the receipt time.

use std::time::Duration;

use mountguard_inventory::report::{Heartbeat, heartbeat_path};
use mountguard_tests::mountguard::http_request;

use crate::harness::{Options, System, wait_all_fresh, wait_verdicts};

async fn heartbeat(sys: &System, token: &str, generation: u64, at: jiff::Timestamp) -> Value {
    let body = serde_json::to_vec(&Heartbeat::new("node-0", generation, at)).unwrap();
    let auth = format!("Bearer {token}");
    let (code, text) = http_request(
        "PUT",
        &format!("{}{}", sys.report_base(), heartbeat_path("node-0")),
        &[
            ("authorization", auth.as_str()),
            ("content-type", "application/json"),
        ],
        body,
    )
    .await
    .unwrap();
    assert!(code == 200 || code == 409, "{code}: {text}");
    serde_json::from_str(&text).unwrap()
}

use serde_json::Value;

/// One heartbeat dated a day ahead (sent with node-0's real token, the way
/// an agent on a node with a wrong clock, or a compromised one, would),
/// then the agent dies: node-0's inventory must still age out on the
/// controller's clock and its verdicts leave Fresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_dated_ahead_does_not_keep_a_dead_node_fresh() {
    let mut sys = System::start(Options {
        extra_controller_args: vec!["--inventory-max-age".into(), "6s".into()],
        ..Options::default()
    })
    .await;
    wait_all_fresh(&sys).await;
    let token = sys.ids[0].token().unwrap();
    sys.agents[0].kill();
    // The held generation: a heartbeat for a generation far ahead is
    // answered `resend` with the generation the controller holds.
    let r = heartbeat(&sys, &token, u64::MAX, jiff::Timestamp::now()).await;
    assert_eq!(r["status"], "resend", "{r}");
    let held = r["generation"].as_u64().expect("a held generation");
    let ahead = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24);
    let r = heartbeat(&sys, &token, held, ahead).await;
    assert_eq!(r["status"], "unchanged", "{r}");
    wait_verdicts(
        &sys,
        "node-0's verdicts to leave Fresh once its inventory is older than 6 s",
        Duration::from_secs(40),
        "all=1",
        |doc| {
            let on_node: Vec<&Value> = doc["verdicts"]
                .as_array()?
                .iter()
                .filter(|v| v["node"] == "node-0" && v["state"] != "Skipped")
                .collect();
            (!on_node.is_empty() && on_node.iter().all(|v| v["state"] == "Unverifiable"))
                .then_some(())
        },
    )
    .await;
    // The other nodes' agents still report: they stay Fresh.
    let doc = sys.verdicts("all=1").await;
    for v in doc["verdicts"].as_array().unwrap() {
        if v["node"] != "node-0" && v["state"] != "Skipped" {
            assert_eq!(v["state"], "Fresh", "{v}");
        }
    }
    let m = mountguard_tests::demo::scrape(&sys.metrics_base())
        .await
        .unwrap();
    assert!(
        m.iter()
            .any(|s| s.name == "mountguard_report_clock_clamped_total" && s.value >= 1.0),
        "the clamp is counted"
    );
    sys.shutdown().await;
}
