use super::*;

fn labels(pod: &str, state: &str, cause: &str) -> MountLabels {
    [
        "ns".into(),
        pod.into(),
        "n1".into(),
        "vol".into(),
        "Secret".into(),
        "s".into(),
        state.into(),
        cause.into(),
    ]
}

fn text(m: &Metrics) -> String {
    String::from_utf8(m.encode()).unwrap()
}

/// A registry with the evaluation's families.
fn registered() -> (Metrics, EvalMetrics) {
    let m = Metrics::new();
    let e = EvalMetrics::register(&m);
    (m, e)
}

#[test]
fn series_are_replaced_and_removed() {
    let (m, e) = registered();
    let mut s = MountSeries::default();
    let uid = PodUid::new("u1");
    let c1 = [("Propagating", 1), ("Fresh", 2)];
    s.replace(&e, &uid, vec![labels("p", "Propagating", "")], &[], &c1);
    let t = text(&m);
    assert!(t.contains(r#"state="Propagating""#), "{t}");
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 2"#), "{t}");
    let c2 = [("Stale", 1), ("Fresh", 2)];
    s.replace(
        &e,
        &uid,
        vec![labels("p", "Stale", "ImmutableCache")],
        &c1,
        &c2,
    );
    let t = text(&m);
    let series: Vec<&str> = t
        .lines()
        .filter(|l| l.starts_with("mountguard_mount_state{"))
        .collect();
    assert_eq!(series.len(), 1, "{t}");
    assert!(series[0].contains(r#"cause="ImmutableCache""#), "{t}");
    assert!(
        t.contains(r#"mountguard_mounts{state="Propagating"} 0"#),
        "{t}"
    );
    assert!(t.contains(r#"mountguard_mounts{state="Stale"} 1"#), "{t}");
    // Became fresh: the series goes away.
    let c3 = [("Fresh", 3)];
    s.replace(&e, &uid, vec![], &c2, &c3);
    let t = text(&m);
    assert!(!t.contains("mountguard_mount_state{"), "{t}");
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 3"#), "{t}");
    assert_eq!(s.pods(), 0, "fully fresh pods hold nothing");
    s.remove(&e, &uid, &c3);
    let t = text(&m);
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 0"#), "{t}");
    assert_eq!(s.pods(), 0);
}

/// The per-state totals move once per batch: `update` leaves
/// `mountguard_mounts` as it was until `flush`, so a scrape during a
/// batch sees the totals before it, not half of it.
#[test]
fn totals_move_on_flush_only() {
    let (m, e) = registered();
    let mut s = MountSeries::default();
    let uid = PodUid::new("u1");
    s.replace(&e, &uid, vec![], &[], &[("Fresh", 3)]);
    assert!(text(&m).contains(r#"mountguard_mounts{state="Fresh"} 3"#));
    s.update(
        &e,
        &uid,
        vec![],
        &[("Fresh", 3)],
        &[("Fresh", 1), ("Stale", 2)],
    );
    let t = text(&m);
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 3"#), "{t}");
    assert!(!t.contains(r#"mountguard_mounts{state="Stale"} 2"#), "{t}");
    s.flush(&e);
    let t = text(&m);
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 1"#), "{t}");
    assert!(t.contains(r#"mountguard_mounts{state="Stale"} 2"#), "{t}");
}
