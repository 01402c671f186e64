//! Waits the end-to-end tests share: on the verdicts the status API
//! serves, and on the Events the API server double recorded.

use std::time::Duration;

use mountguard_tests::mountguard::{RecordedEvent, recorded_events};
use serde_json::Value;

use crate::harness::{System, wait};

/// Polls the verdicts document answering `query` (e.g.
/// `namespace=slurm&all=1`) until `pick` takes what it waits for from it;
/// on timeout, panics with `what` and the processes' logs.
pub async fn wait_verdicts<T>(
    sys: &System,
    what: &str,
    timeout: Duration,
    query: &str,
    pick: impl Fn(Value) -> Option<T>,
) -> T {
    let base = sys.metrics_base();
    let pick = &pick;
    let check = || {
        let url = (base.clone(), query.to_string());
        async move {
            let doc = mountguard_tests::scenario::verdicts(&url.0, &url.1).await;
            pick(doc.ok()?)
        }
    };
    wait(sys, what, timeout, check).await
}

/// Polls the Events the API server recorded until `pick` takes what it
/// waits for from them; on timeout, panics as [`wait_verdicts`].
pub async fn wait_events<T>(
    sys: &System,
    what: &str,
    timeout: Duration,
    pick: impl Fn(Vec<RecordedEvent>) -> Option<T>,
) -> T {
    let api = sys.cluster.api();
    let check = || std::future::ready(pick(recorded_events(&api)));
    wait(sys, what, timeout, check).await
}
