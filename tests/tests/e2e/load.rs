//! Servers under load and abuse: idle connections cannot starve the
//! report API or `/metrics`.

use std::time::Duration;

use mountguard_tests::demo::{metric_samples, scrape};

use crate::harness::{Options, System, wait_all_fresh, wait_metrics};

fn counter(
    samples: &[mountguard_tests::demo::MetricSample],
    name: &str,
    label: (&str, &str),
) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name && s.labels.get(label.0).map(String::as_str) == Some(label.1))
        .map(|s| s.value)
        .sum()
}

/// 1,100 idle connections held open against a controller limited to 1,024
/// descriptors: the real agents' heartbeats are still answered and
/// `/metrics` still answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_do_not_starve_heartbeats_or_metrics() {
    let sys = System::start(Options {
        controller_nofile: Some(1024),
        extra_controller_args: vec!["--header-read-timeout".into(), "3s".into()],
        ..Options::default()
    })
    .await;
    wait_all_fresh(&sys).await;
    let mut idle = Vec::new();
    for _ in 0..1100 {
        match tokio::net::TcpStream::connect(sys.report_addr).await {
            Ok(s) => idle.push(s),
            Err(e) => panic!("connect: {e}"),
        }
    }
    let m = scrape(&sys.metrics_base()).await.ok();
    let before = m.map_or(0.0, |m| {
        counter(
            &m,
            "mountguard_report_requests_total",
            ("result", "unchanged"),
        )
    });
    wait_metrics(
        &sys,
        "agents' heartbeats answered and /metrics answering while 1,100 idle connections are held",
        Duration::from_secs(60),
        |text| {
            let now = counter(
                &metric_samples(text),
                "mountguard_report_requests_total",
                ("result", "unchanged"),
            );
            // Three agents, one heartbeat a second: several answered.
            (now >= before + 6.0).then_some(())
        },
    )
    .await;
    let m = scrape(&sys.metrics_base()).await.unwrap();
    // The cap fits in 1,024 descriptors and one address holds at most half
    // of it: each connection over that took the place of the address's
    // oldest idle one (the others close at the header-read timeout).
    let shed = counter(
        &m,
        "mountguard_connections_shed_total",
        ("listener", "report"),
    );
    assert!(shed >= 500.0, "idle connections shed: {shed}");
    // Still held on our side the whole time.
    assert_eq!(idle.len(), 1100);
    drop(idle);
    sys.shutdown().await;
}
