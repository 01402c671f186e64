use super::*;

/// docs/reference/metrics.md lists every family the controller
/// registers (the shared families and every feature's), with its type
/// and labels, and nothing else: a metric added without its row, a row
/// left behind, or labels that changed fail here. The message prints the rows the code expects.
#[test]
fn the_metrics_reference_lists_what_the_controller_registers() {
    let doc = include_str!("../../../docs/reference/metrics.md");
    let section = doc
        .split("\n## ")
        .find(|s| s.starts_with("Controller"))
        .expect("a `## Controller` section");
    let ticked = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let documented: std::collections::BTreeSet<(String, String, Vec<String>)> = section
        .lines()
        .filter(|l| l.starts_with("| `mountguard_"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            (
                ticked(cells[0])[0].clone(),
                cells[1].trim().to_string(),
                ticked(cells[2]),
            )
        })
        .collect();
    let metrics = Metrics::new();
    FeatureMetrics::register(&metrics);
    let families = metrics.families();
    let registered: std::collections::BTreeSet<(String, String, Vec<String>)> = families
        .iter()
        .map(|f| (f.name.clone(), f.kind.to_string(), f.labels.clone()))
        .collect();
    let rows: Vec<String> = families
        .iter()
        .map(|f| {
            let labels = if f.labels.is_empty() {
                "-".to_string()
            } else {
                f.labels
                    .iter()
                    .map(|l| format!("`{l}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            format!("| `{}` | {} | {labels} | {} |", f.name, f.kind, f.help)
        })
        .collect();
    assert_eq!(
        documented,
        registered,
        "docs/reference/metrics.md differs from the registry; the rows it should have:\n{}",
        rows.join("\n")
    );
}

/// Every name of the runtime contract (the chart's alerts use them) is in
/// the exposition of the registry as `run.rs` fills it.
#[test]
fn every_contract_name_is_exported() {
    let m = Metrics::new();
    let f = FeatureMetrics::register(&m);
    f.token_review.tokenreview_duration.observe(0.01);
    f.eval.evaluation_duration.observe(0.01);
    m.watch_restarts.with_label_values(&["pods"]).inc();
    m.api_errors.with_label_values(&["list"]).inc();
    m.events.with_label_values(&["StaleMount"]).inc();
    f.remediation
        .remediation_attempts
        .with_label_values(&["drain", "ok"])
        .inc();
    f.eval
        .mount_state
        .with_label_values(&["a", "b", "c", "d", "e", "f", "g", "h"])
        .set(1.0);
    f.eval.mounts.with_label_values(&["Fresh"]).set(1);
    f.eval
        .node_inventory_timestamp
        .with_label_values(&["n"])
        .set(1.0);
    f.eval.node_agent_reporting.with_label_values(&["n"]).set(1);
    let t = String::from_utf8(m.encode()).unwrap();
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
