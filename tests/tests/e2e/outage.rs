//! An API server outage as the operator reads it in the controller's log:
//! one line when a watch starts failing, retries with growing backoff (not
//! a line per retry), "watch recovered" only once a re-list succeeds, and
//! no colour codes in a log that is not a terminal.

use std::time::Duration;

use crate::harness::{Options, System, wait, wait_metrics};

/// `mountguard_watch_restarts_total{resource="pods"}` in the controller's
/// metrics `text` (0 before the first restart: the series does not exist
/// yet).
fn pod_watch_restarts(text: &str) -> Option<f64> {
    match text
        .lines()
        .find(|l| l.starts_with("mountguard_watch_restarts_total{resource=\"pods\"}"))
    {
        Some(l) => l.rsplit(' ').next()?.parse().ok(),
        None => Some(0.0),
    }
}

fn count(log: &str, needle: &str) -> usize {
    log.lines().filter(|l| l.contains(needle)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_outage_is_logged_once_per_watch_and_recovery_after_a_relist() {
    let sys = System::start(Options {
        nodes: 1,
        extra_controller_args: vec!["--log-format".into(), "text".into()],
        ..Options::default()
    })
    .await;
    let api = sys.cluster.api();
    let controller = sys.controller.as_ref().expect("controller");
    let restarts_before = wait_metrics(
        &sys,
        "the pod watch's metric",
        Duration::from_secs(30),
        pod_watch_restarts,
    )
    .await;
    let lines_before = controller.log_tail(usize::MAX).lines().count();

    // Every request fails (500: kube-client retries 503 by itself), and
    // every watch must re-list.
    api.fail_requests(500, usize::MAX, None);
    api.expire_watches();
    // At least four failed attempts of the pod watch: with a backoff of
    // 0.8, 1.6 and 3.2 s between them, over about 5.6 s.
    wait_metrics(
        &sys,
        "four failed pod watch attempts",
        Duration::from_secs(60),
        |text| {
            let n = pod_watch_restarts(text)?;
            (n >= restarts_before + 4.0).then_some(())
        },
    )
    .await;
    let log = controller.log_tail(usize::MAX);
    let outage: Vec<&str> = log.lines().skip(lines_before).collect();
    let outage = outage.join("\n");
    // Not a terminal: no ANSI escape sequences.
    assert!(
        !outage.contains('\u{1b}'),
        "colour codes in a log file:\n{outage}"
    );
    assert_eq!(
        count(&outage, "watch failed; retrying with backoff"),
        count(&outage, "watch=") - count(&outage, "watch recovered"),
        "only the first failure of each watch is logged:\n{outage}"
    );
    assert_eq!(
        count(&outage, "watch failed; retrying with backoff watch=pods"),
        1,
        "{outage}"
    );
    assert_eq!(count(&outage, "watch recovered"), 0, "{outage}");
    assert_eq!(count(&outage, "kube_client"), 0, "{outage}");
    assert!(
        outage.lines().count() <= 12,
        "an outage of a few seconds fills the log:\n{outage}"
    );

    // The API server answers again: each failing watch re-lists and says so once.
    api.clear_faults();
    wait(
        &sys,
        "the pod watch to recover",
        Duration::from_secs(60),
        || {
            let log = controller.log_tail(usize::MAX);
            async move { (count(&log, "watch recovered watch=pods") == 1).then_some(()) }
        },
    )
    .await;
    let log = controller.log_tail(usize::MAX);
    let recovered = log
        .lines()
        .find(|l| l.contains("watch recovered watch=pods"))
        .unwrap();
    assert!(recovered.contains("failures="), "{recovered}");
    // Not a terminal: no ANSI escape sequences anywhere in the log.
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a log file:\n{log}"
    );
    // The agent's log, written the same way, has none either.
    let agent = sys.agents[0].log_tail(usize::MAX);
    assert!(agent.contains("INFO"), "{agent}");
    assert!(
        !agent.contains('\u{1b}'),
        "colour codes in the agent's log file:\n{agent}"
    );
    sys.shutdown().await;
}
