//! Tests of the status API's reader authorization: tokens, access reviews,
//! their cache and its limits, refusals.

use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A reviewer double: `reader-token` is `alice` (allowed in `team`),
/// `admin-token` is `root` (allowed everywhere); API errors on demand.
#[derive(Debug, Default)]
struct Fake {
    reviews: AtomicUsize,
    fail: std::sync::atomic::AtomicBool,
    /// `reader-token` is no longer accepted.
    revoked: std::sync::atomic::AtomicBool,
    /// When set, a TokenReview of a `flood-` token waits for a permit
    /// of it (`parked` counts those waiting).
    hold: Option<tokio::sync::Semaphore>,
    parked: AtomicUsize,
}

impl AccessReviewer for Fake {
    fn authenticate<'a>(&'a self, token: &'a str) -> BoxFuture<'a, Result<Option<Reader>, String>> {
        Box::pin(async move {
            self.reviews.fetch_add(1, Ordering::SeqCst);
            if self.fail.load(Ordering::SeqCst) {
                return Err("connection refused".into());
            }
            if let Some(hold) = &self.hold
                && token.starts_with("flood-")
            {
                self.parked.fetch_add(1, Ordering::SeqCst);
                let _ = hold.acquire().await.unwrap();
            }
            Ok(match token {
                "reader-token" if self.revoked.load(Ordering::SeqCst) => None,
                "reader-token" => Some(Reader {
                    username: "alice".into(),
                    ..Default::default()
                }),
                "admin-token" => Some(Reader {
                    username: "root".into(),
                    groups: vec!["admins".into()],
                    ..Default::default()
                }),
                _ => None,
            })
        })
    }

    fn authorize<'a>(
        &'a self,
        reader: &'a Reader,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<bool, String>> {
        Box::pin(async move {
            Ok(reader.groups.iter().any(|g| g == "admins")
                || (reader.username == "alice" && namespace == Some("team")))
        })
    }
}

fn headers(h: &[(&str, &str)]) -> HeaderMap {
    let mut m = HeaderMap::new();
    for (k, v) in h {
        m.insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    m
}

#[test]
fn the_token_comes_from_authorization_or_the_proxy_header() {
    assert_eq!(
        bearer(&headers(&[("authorization", "Bearer abc")])),
        Some("abc")
    );
    assert_eq!(
        bearer(&headers(&[("authorization", "bearer  abc ")])),
        Some("abc")
    );
    assert_eq!(
        bearer(&headers(&[("x-mountguard-authorization", "Bearer p")])),
        Some("p")
    );
    assert_eq!(
        bearer(&headers(&[
            ("authorization", "Bearer a"),
            ("x-mountguard-authorization", "Bearer p")
        ])),
        Some("a")
    );
    assert_eq!(bearer(&headers(&[("authorization", "Basic abc")])), None);
    assert_eq!(bearer(&headers(&[("authorization", "Bearer ")])), None);
    assert_eq!(bearer(&HeaderMap::new()), None);
}

#[test]
fn a_request_reads_the_namespace_of_its_target_or_filter() {
    use crate::api::store::Query;
    let q = |s: &str| Query::parse(Some(s));
    assert_eq!(
        scope_of("/v1/rollouts/secret/prod/db", &q("")),
        Some("prod".into())
    );
    assert_eq!(
        scope_of("/v1/verdicts", &q("namespace=team")),
        Some("team".into())
    );
    assert_eq!(scope_of("/v1/verdicts", &q("all=1")), None);
}

#[test]
fn the_access_review_asks_for_get_verdicts_in_the_namespace() {
    let r = Reader {
        username: "alice".into(),
        uid: "u1".into(),
        groups: vec!["g".into()],
        ..Default::default()
    };
    let sar = access_review(&r, Some("team"));
    let a = sar.spec.resource_attributes.unwrap();
    assert_eq!(a.group.as_deref(), Some("mountguard.io"));
    assert_eq!(a.resource.as_deref(), Some("verdicts"));
    assert_eq!(a.verb.as_deref(), Some("get"));
    assert_eq!(a.namespace.as_deref(), Some("team"));
    assert_eq!(sar.spec.user.as_deref(), Some("alice"));
    assert_eq!(sar.spec.groups, Some(vec!["g".to_string()]));
    assert_eq!(
        access_review(&r, None)
            .spec
            .resource_attributes
            .unwrap()
            .namespace,
        None
    );
}

#[tokio::test]
async fn only_authorized_readers_get_in_and_answers_are_cached_apart() {
    let fake = Arc::new(Fake::default());
    let limits = StatusAuthLimits {
        denied_entries: 4,
        ..Default::default()
    };
    let gate = StatusGate::kubernetes(fake.clone(), limits);
    let team = Some("team".to_string());

    let e = gate
        .check(&HeaderMap::new(), team.clone(), None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED);
    assert!(e.message().contains("bearer token"), "{e:?}");

    let alice = headers(&[("authorization", "Bearer reader-token")]);
    assert_eq!(
        gate.check(&alice, team.clone(), None).await.unwrap(),
        "alice"
    );
    let e = gate
        .check(&alice, Some("prod".into()), None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), StatusCode::FORBIDDEN);
    assert!(
        e.message().contains("\"alice\"") && e.message().contains("prod"),
        "{e:?}"
    );
    assert_eq!(
        gate.check(&alice, None, None).await.unwrap_err().status(),
        StatusCode::FORBIDDEN
    );

    let bad = headers(&[("x-mountguard-authorization", "Bearer forged")]);
    assert_eq!(
        gate.check(&bad, team.clone(), None)
            .await
            .unwrap_err()
            .status(),
        StatusCode::UNAUTHORIZED
    );
    let admin = headers(&[("x-mountguard-authorization", "Bearer admin-token")]);
    assert_eq!(gate.check(&admin, None, None).await.unwrap(), "root");

    // Cached: no more reviews for the same answers.
    let n = fake.reviews.load(Ordering::SeqCst);
    gate.check(&alice, team.clone(), None).await.unwrap();
    gate.check(&alice, Some("prod".into()), None)
        .await
        .unwrap_err();
    gate.check(&bad, team.clone(), None).await.unwrap_err();
    assert_eq!(fake.reviews.load(Ordering::SeqCst), n);

    // A flood of refused tokens does not evict the reader's entry.
    for i in 0..50 {
        let h = headers(&[("authorization", &format!("Bearer flood-{i}"))]);
        gate.check(&h, team.clone(), None).await.unwrap_err();
    }
    let n = fake.reviews.load(Ordering::SeqCst);
    gate.check(&alice, team.clone(), None).await.unwrap();
    assert_eq!(fake.reviews.load(Ordering::SeqCst), n, "still cached");
}

fn ip(s: &str) -> Option<IpAddr> {
    Some(s.parse().unwrap())
}

fn bearer_of(token: &str) -> HeaderMap {
    headers(&[("authorization", &format!("Bearer {token}"))])
}

/// 24 callers on one address sending random tokens: at most the
/// address's burst of TokenReviews, 429 with `Retry-After` beyond; a
/// reader already known on that same address (e.g. every caller through
/// the API server's service proxy) reads namespaces it has not read yet
/// all along, at the cost of a SubjectAccessReview only.
#[tokio::test]
async fn a_flood_of_random_tokens_from_one_source_costs_its_burst_and_never_denies_a_known_reader()
{
    let fake = Arc::new(Fake::default());
    let limits = StatusAuthLimits {
        per_source_rate: 0.001,
        per_source_burst: 20,
        ..Default::default()
    };
    let gate = StatusGate::kubernetes(fake.clone(), limits);
    let proxy = ip("10.96.0.1");
    let admin = bearer_of("admin-token");
    assert_eq!(
        gate.check(&admin, Some("a".into()), proxy).await.unwrap(),
        "root"
    );
    let before = fake.reviews.load(Ordering::SeqCst);
    let mut throttled = 0;
    for i in 0..480 {
        let e = gate
            .check(&bearer_of(&format!("random-{i}")), Some("a".into()), proxy)
            .await
            .unwrap_err();
        if let Refusal::Throttled(_, wait) = e {
            assert!(wait >= 1, "{e:?}");
            assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(e.retry_after(), Some(wait));
            throttled += 1;
        } else {
            assert_eq!(e.status(), StatusCode::UNAUTHORIZED, "{e:?}");
        }
        if i % 24 == 0 {
            assert_eq!(
                gate.check(&admin, Some(format!("ns-{i}")), proxy)
                    .await
                    .unwrap(),
                "root",
                "the known reader, request {i} of the flood"
            );
        }
    }
    let reviews = fake.reviews.load(Ordering::SeqCst) - before;
    assert_eq!(
        reviews, 19,
        "480 random tokens from one address: its burst of 20 TokenReviews (one was the \
         reader's first), none for the known reader"
    );
    assert_eq!(throttled, 480 - 19);
    // Another address has its own bucket: a new reader gets in.
    assert_eq!(
        gate.check(
            &bearer_of("reader-token"),
            Some("team".into()),
            ip("10.0.0.9")
        )
        .await
        .unwrap(),
        "alice"
    );
}

/// A known reader's answer expired: its new TokenReview is not charged
/// to an address that unknown tokens drained.
#[tokio::test]
async fn a_known_reader_is_reviewed_again_without_the_bucket_unknown_tokens_drain() {
    let fake = Arc::new(Fake::default());
    let limits = StatusAuthLimits {
        allowed_ttl: Duration::ZERO,
        denied_ttl: Duration::ZERO,
        per_source_rate: 0.001,
        per_source_burst: 2,
        ..Default::default()
    };
    let gate = StatusGate::kubernetes(fake.clone(), limits);
    let src = ip("10.96.0.1");
    let alice = bearer_of("reader-token");
    let team = || Some("team".to_string());
    assert_eq!(gate.check(&alice, team(), src).await.unwrap(), "alice");
    let e = gate
        .check(&bearer_of("random-1"), team(), src)
        .await
        .unwrap_err();
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED, "{e:?}");
    let e = gate
        .check(&bearer_of("random-2"), team(), src)
        .await
        .unwrap_err();
    assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS, "{e:?}");
    for _ in 0..5 {
        let n = fake.reviews.load(Ordering::SeqCst);
        assert_eq!(gate.check(&alice, team(), src).await.unwrap(), "alice");
        assert_eq!(
            fake.reviews.load(Ordering::SeqCst),
            n + 1,
            "reviewed again: its answer had expired"
        );
    }
    // A token the API server stops accepting is known no more: its
    // next review is charged to its address again.
    fake.revoked.store(true, Ordering::SeqCst);
    let e = gate.check(&alice, team(), src).await.unwrap_err();
    assert_eq!(e.status(), StatusCode::UNAUTHORIZED, "{e:?}");
    let e = gate.check(&alice, team(), src).await.unwrap_err();
    assert_eq!(e.status(), StatusCode::TOO_MANY_REQUESTS, "{e:?}");
}

/// Unknown tokens from many addresses (each within its own bucket)
/// hold every review slot they may: a known reader still gets one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_tokens_in_review_leave_slots_for_known_readers() {
    let fake = Arc::new(Fake {
        hold: Some(tokio::sync::Semaphore::new(0)),
        ..Default::default()
    });
    let limits = StatusAuthLimits::default();
    let gate = Arc::new(StatusGate::kubernetes(fake.clone(), limits));
    let admin = bearer_of("admin-token");
    assert_eq!(
        gate.check(&admin, Some("a".into()), ip("10.0.0.1"))
            .await
            .unwrap(),
        "root"
    );
    let flood = 3 * limits.in_flight;
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..flood {
        let (gate, done) = (gate.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let r = gate
                .check(
                    &bearer_of(&format!("flood-{i}")),
                    Some("a".into()),
                    ip(&format!("10.1.0.{i}")),
                )
                .await;
            done.fetch_add(1, Ordering::SeqCst);
            r
        }));
    }
    // Every flood request either holds a slot (its TokenReview parked)
    // or was answered.
    tokio::time::timeout(Duration::from_secs(30), async {
        while fake.parked.load(Ordering::SeqCst) + done.load(Ordering::SeqCst) < flood {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .expect("the flood settles");
    assert_eq!(
        gate.check(&admin, Some("b".into()), ip("10.0.0.1")).await,
        Ok("root".to_string()),
        "the known reader, every slot unknown tokens may use taken"
    );
    assert_eq!(
        fake.parked.load(Ordering::SeqCst),
        limits.unknown_in_flight,
        "unknown tokens hold at most their share of the slots"
    );
    fake.hold.as_ref().unwrap().add_permits(flood);
    for t in tasks {
        let r = t.await.unwrap();
        assert!(
            matches!(
                r,
                Err(Refusal::Unauthenticated(_) | Refusal::Unavailable(_))
            ),
            "{r:?}"
        );
    }
}

#[tokio::test]
async fn an_api_error_is_unavailable_and_never_remembered() {
    let fake = Arc::new(Fake::default());
    let gate = StatusGate::kubernetes(fake.clone(), StatusAuthLimits::default());
    let alice = headers(&[("authorization", "Bearer reader-token")]);
    fake.fail.store(true, Ordering::SeqCst);
    let e = gate
        .check(&alice, Some("team".into()), None)
        .await
        .unwrap_err();
    assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
    fake.fail.store(false, Ordering::SeqCst);
    assert_eq!(
        gate.check(&alice, Some("team".into()), None).await.unwrap(),
        "alice"
    );
}

#[tokio::test]
async fn an_open_gate_lets_everybody_in() {
    let gate = StatusGate::open();
    assert_eq!(
        gate.check(&HeaderMap::new(), None, None).await.unwrap(),
        "anonymous"
    );
}
