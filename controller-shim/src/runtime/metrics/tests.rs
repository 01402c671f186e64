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

#[test]
fn series_are_replaced_and_removed() {
    let m = Metrics::new();
    let mut s = MountSeries::default();
    let uid = PodUid::new("u1");
    let c1 = [("Propagating", 1), ("Fresh", 2)];
    s.replace(&m, &uid, vec![labels("p", "Propagating", "")], &[], &c1);
    let t = text(&m);
    assert!(t.contains(r#"state="Propagating""#), "{t}");
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 2"#), "{t}");
    let c2 = [("Stale", 1), ("Fresh", 2)];
    s.replace(
        &m,
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
    s.replace(&m, &uid, vec![], &c2, &c3);
    let t = text(&m);
    assert!(!t.contains("mountguard_mount_state{"), "{t}");
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 3"#), "{t}");
    assert_eq!(s.pods(), 0, "fully fresh pods hold nothing");
    s.remove(&m, &uid, &c3);
    let t = text(&m);
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 0"#), "{t}");
    assert_eq!(s.pods(), 0);
}

/// The per-state totals move once per batch: `update` leaves
/// `mountguard_mounts` as it was until `flush`, so a scrape during a
/// batch sees the totals before it, not half of it.
#[test]
fn totals_move_on_flush_only() {
    let m = Metrics::new();
    let mut s = MountSeries::default();
    let uid = PodUid::new("u1");
    s.replace(&m, &uid, vec![], &[], &[("Fresh", 3)]);
    assert!(text(&m).contains(r#"mountguard_mounts{state="Fresh"} 3"#));
    s.update(
        &m,
        &uid,
        vec![],
        &[("Fresh", 3)],
        &[("Fresh", 1), ("Stale", 2)],
    );
    let t = text(&m);
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 3"#), "{t}");
    assert!(!t.contains(r#"mountguard_mounts{state="Stale"} 2"#), "{t}");
    s.flush(&m);
    let t = text(&m);
    assert!(t.contains(r#"mountguard_mounts{state="Fresh"} 1"#), "{t}");
    assert!(t.contains(r#"mountguard_mounts{state="Stale"} 2"#), "{t}");
}

#[test]
fn every_contract_name_is_exported() {
    let m = Metrics::new();
    m.tokenreview_duration.observe(0.01);
    m.evaluation_duration.observe(0.01);
    m.watch_restarts.with_label_values(&["pods"]).inc();
    m.api_errors.with_label_values(&["list"]).inc();
    m.events.with_label_values(&["StaleMount"]).inc();
    m.remediation_attempts
        .with_label_values(&["drain", "ok"])
        .inc();
    m.mount_state
        .with_label_values(&["a", "b", "c", "d", "e", "f", "g", "h"])
        .set(1.0);
    m.mounts.with_label_values(&["Fresh"]).set(1);
    m.node_inventory_timestamp
        .with_label_values(&["n"])
        .set(1.0);
    m.node_agent_reporting.with_label_values(&["n"]).set(1);
    let t = text(&m);
    for name in [
        "mountguard_mount_state",
        "mountguard_mounts",
        "mountguard_node_inventory_timestamp_seconds",
        "mountguard_node_agent_reporting",
        "mountguard_nodes",
        "mountguard_report_requests_total",
        "mountguard_tokenreview_duration_seconds_bucket",
        "mountguard_evaluation_duration_seconds_bucket",
        "mountguard_watch_restarts_total",
        "mountguard_api_errors_total",
        "mountguard_events_total",
        "mountguard_events_suppressed_total",
        "mountguard_leader",
        "mountguard_tokio_alive_tasks",
        "mountguard_build_info",
        "mountguard_remediation_attempts_total",
        "mountguard_remediation_open_attempts",
        "mountguard_remediation_oldest_open_attempt_age_seconds",
        "mountguard_slurm_nodes_drained",
        "mountguard_remediation_failed",
        "mountguard_remediation_failed_unresolved",
        "mountguard_remediation_blocked",
    ] {
        assert!(t.contains(&format!("\n{name}")), "{name} missing");
    }
}
