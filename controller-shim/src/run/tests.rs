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
