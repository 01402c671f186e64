//! The heap a hostile admission review costs. Anyone who reaches the
//! webhook port can send one (no client certificate by default): a review
//! of up to 3 MiB whose object holds 1.5 million small JSON numbers, read
//! into a generic JSON value, cost about 48 MiB of heap each and held the
//! controller's memory up after. The review parser reads only the fields
//! the decision needs and skips the rest unbuilt: its heap does not grow
//! with what the object holds.
//!
//! Its own test binary: every allocation of the process goes through a
//! counting allocator, and this file holds one test, so that nothing else
//! allocates while it measures.

use std::alloc::System;

use mountguard_controller::admission::MAX_BODY;
use mountguard_controller::admission::review::parse;
use mountguard_core::admission::Operation;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// A delete review of immutable Secret `slurm/auth` whose object's `data`
/// holds `numbers` zeros (and `managedFields` as the API server sends).
fn review(numbers: usize) -> Vec<u8> {
    let mut zeros = String::with_capacity(numbers * 2);
    for i in 0..numbers {
        if i > 0 {
            zeros.push(',');
        }
        zeros.push('0');
    }
    format!(
        r#"{{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{{
          "uid":"705ab4f5-6393-11e8-b7cc-42010a800002",
          "kind":{{"group":"","version":"v1","kind":"Secret"}},
          "resource":{{"group":"","version":"v1","resource":"secrets"}},
          "name":"auth","namespace":"slurm","operation":"DELETE",
          "userInfo":{{"username":"mallory","groups":["system:authenticated"]}},
          "oldObject":{{"apiVersion":"v1","kind":"Secret",
            "metadata":{{"name":"auth","namespace":"slurm","managedFields":[{{"manager":"kubectl"}}]}},
            "data":{{"k":[{zeros}]}},"immutable":true}},
          "dryRun":false,"options":{{"kind":"DeleteOptions","apiVersion":"meta.k8s.io/v1"}}}}}}"#
    )
    .into_bytes()
}

/// Bytes the parse of `body` allocated (whatever it freed again: an upper
/// bound of its peak), and the review.
fn parse_cost(body: &[u8]) -> (usize, mountguard_controller::admission::review::Review) {
    let region = Region::new(GLOBAL);
    let review = parse(body).expect("a valid review");
    (region.change().bytes_allocated, review)
}

#[test]
fn a_review_of_a_million_small_numbers_costs_no_more_heap_than_a_normal_one() {
    let normal = review(1);
    let hostile = review(1_500_000);
    assert!(hostile.len() <= MAX_BODY, "{} bytes", hostile.len());

    let (normal_bytes, normal_review) = parse_cost(&normal);
    let (hostile_bytes, hostile_review) = parse_cost(&hostile);
    assert_eq!(hostile_review, normal_review);
    let subject = hostile_review.subject.expect("a Secret delete");
    assert_eq!(subject.operation, Operation::Delete);
    assert_eq!(&*subject.source.name, "auth");
    assert!(subject.immutable);

    // A few small strings (uid, names): well under a page, and the same
    // for both whatever the object holds.
    assert!(
        normal_bytes <= 4096,
        "a normal review allocated {normal_bytes} bytes"
    );
    assert!(
        hostile_bytes <= normal_bytes + 256,
        "the review of 1.5 million numbers ({} bytes) allocated {hostile_bytes} bytes, a normal \
         one {normal_bytes}",
        hostile.len()
    );
}
