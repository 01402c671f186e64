//! What an admission review costs the controller: a normal review (a
//! Secret of one key) against a hostile one (up to the 3 MiB body limit,
//! its object's `data` holding 1.5 million small JSON numbers), in the
//! same run.
//!
//! 1. One parse each, by the webhook's parser (`admission::review`)
//!    and, for comparison, into kube's generic `AdmissionReview<
//!    DynamicObject>` (the object read into a JSON value, as the webhook
//!    once did): heap bytes allocated during the parse (an upper bound of
//!    its peak), heap still held by the parsed review, time, and the
//!    process's RSS and peak RSS after (the generic parses run last: the
//!    peak only grows).
//! 2. `--concurrent N` (64) hostile reviews sent at once to the webhook's
//!    handler, each body arriving in 64 KiB chunks: how many were read and
//!    answered, how many answered 503 unread beyond the bound, and the
//!    peak RSS they added.
//!
//! The counting allocator wraps the system allocator (the controller
//! binary uses mimalloc, which keeps freed memory longer).
//!
//! Run: `cargo bench -p mountguard-controller --bench admission`
//! (`-- --numbers N --concurrent C` for other sizes).

use std::alloc::System;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http::{Method, Request, StatusCode};
use http_body_util::StreamBody;
use hyper::body::{Bytes, Frame};
use kube::api::DynamicObject;
use kube::core::admission::AdmissionReview;
use mountguard_controller::admission::metrics::AdmissionMetrics;
use mountguard_controller::admission::review;
use mountguard_controller::admission::{
    AdmissionHandler, AdmissionSettings, MAX_BODY, MAX_REVIEWS_AT_ONCE, PATH,
};
use mountguard_controller::runtime::metrics::Metrics;
use mountguard_controller::state::Shared;
use mountguard_core::admission::Mode;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

use common::{arg, status_mib};

// Only the flag parser and the memory readers are used here.
#[allow(dead_code)]
mod common;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A delete review of immutable Secret `slurm/auth` whose `data` holds
/// `numbers` zeros (a normal one: `numbers` 0, one base64 key).
fn review(numbers: usize) -> Vec<u8> {
    let data = if numbers == 0 {
        r#"{"slurm.key":"c2VjcmV0"}"#.to_string()
    } else {
        let mut zeros = String::with_capacity(numbers * 2);
        for i in 0..numbers {
            if i > 0 {
                zeros.push(',');
            }
            zeros.push('0');
        }
        format!(r#"{{"k":[{zeros}]}}"#)
    };
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{
          "uid":"705ab4f5-6393-11e8-b7cc-42010a800002",
          "kind":{{"group":"","version":"v1","kind":"Secret"}},
          "resource":{{"group":"","version":"v1","resource":"secrets"}},
          "name":"auth","namespace":"slurm","operation":"DELETE",
          "userInfo":{{"username":"alice","groups":["system:authenticated"]}},
          "oldObject":{{"apiVersion":"v1","kind":"Secret",
            "metadata":{{"name":"auth","namespace":"slurm"}},"data":{data},"immutable":true}},
          "dryRun":false,"options":{{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/v1"}}}}}}"#
    )
    .into_bytes()
}

fn mib(b: i64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn live() -> i64 {
    let s = GLOBAL.stats();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

/// Parses `body` with `parse`, prints what it cost, and drops the result.
fn measure<T>(label: &str, body: &[u8], parse: impl Fn(&[u8]) -> T) {
    let before = live();
    let region = Region::new(GLOBAL);
    let t = Instant::now();
    let parsed = parse(body);
    let took = t.elapsed();
    let allocated = region.change().bytes_allocated as i64;
    let held = live() - before;
    drop(parsed);
    println!(
        "{label:<34} {:>9} B body  {:>12} B allocated ({:>7.2} MiB)  {:>12} B held ({:>7.2} MiB)  \
         {:>8.2} ms  RSS {:>6.1} MiB  peak {:>6.1} MiB",
        body.len(),
        allocated,
        mib(allocated),
        held,
        mib(held),
        took.as_secs_f64() * 1000.0,
        status_mib("VmRSS"),
        status_mib("VmHWM"),
    );
}

fn typed(body: &[u8]) -> review::Review {
    review::parse(body).expect("a valid review")
}

fn generic(body: &[u8]) -> AdmissionReview<DynamicObject> {
    serde_json::from_slice(body).expect("a valid review")
}

/// `concurrent` hostile reviews at once through the handler, each body in
/// 64 KiB chunks with a yield between them.
async fn flood(body: Bytes, concurrent: usize) {
    let shared = Arc::new(Shared::new(Metrics::new()));
    let metrics = AdmissionMetrics::register(&shared.metrics);
    // Not synced: a review that is read is answered "allowed" without a
    // query, so only reading and parsing are measured.
    let (tx, _rx) = tokio::sync::mpsc::channel(16);
    let handler = Arc::new(AdmissionHandler::new(
        AdmissionSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            tls: ("/c".into(), "/k".into()),
            mode: Mode::Warn,
            answer_timeout: Duration::from_millis(1500),
            remediation: false,
            client_ca: None,
        },
        shared.clone(),
        tx,
        metrics.clone(),
    ));
    let rss = status_mib("VmRSS");
    let peak = status_mib("VmHWM");
    let t = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrent {
        let h = handler.clone();
        let body = body.clone();
        tasks.push(tokio::spawn(async move {
            let chunks: Vec<Bytes> = (0..body.len())
                .step_by(64 * 1024)
                .map(|i| body.slice(i..(i + 64 * 1024).min(body.len())))
                .collect();
            let stream = futures::stream::iter(chunks).then(|c| async move {
                tokio::task::yield_now().await;
                Ok::<_, std::convert::Infallible>(Frame::data(c))
            });
            let req = Request::builder()
                .method(Method::POST)
                .uri(PATH)
                .body(StreamBody::new(stream))
                .unwrap();
            h.handle(req).await.status()
        }));
    }
    let (mut read, mut unread, mut other) = (0, 0, 0);
    for t in tasks {
        match t.await.unwrap() {
            StatusCode::OK => read += 1,
            StatusCode::SERVICE_UNAVAILABLE => unread += 1,
            _ => other += 1,
        }
    }
    println!(
        "{concurrent} hostile reviews at once (at most {MAX_REVIEWS_AT_ONCE} read at once): \
         {read} read and answered, {unread} answered 503 unread, {other} other, in {:.0} ms; \
         RSS {rss:.1} -> {:.1} MiB, peak {peak:.1} -> {:.1} MiB",
        t.elapsed().as_secs_f64() * 1000.0,
        status_mib("VmRSS"),
        status_mib("VmHWM"),
    );
    let overloaded = metrics
        .requests
        .with_label_values(&["other", "overloaded"])
        .get();
    assert_eq!(overloaded, unread as u64, "every unread review is counted");
}

fn main() {
    let numbers = arg("--numbers", 1_500_000);
    let concurrent = arg("--concurrent", 64);
    let normal = review(0);
    let hostile = review(numbers);
    assert!(
        hostile.len() <= MAX_BODY,
        "{} bytes: over the webhook's {MAX_BODY}-byte limit; fewer --numbers",
        hostile.len()
    );
    println!(
        "start: RSS {:.1} MiB, peak {:.1} MiB",
        status_mib("VmRSS"),
        status_mib("VmHWM")
    );
    measure("normal review, webhook parser", &normal, typed);
    measure(
        &format!("{numbers} numbers, webhook parser"),
        &hostile,
        typed,
    );
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(flood(Bytes::from(hostile.clone()), concurrent));
    measure("normal review, generic JSON", &normal, generic);
    measure(
        &format!("{numbers} numbers, generic JSON"),
        &hostile,
        generic,
    );
}
