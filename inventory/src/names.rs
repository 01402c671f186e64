//! The chart's object names (`charts/mountguard/templates/_helpers.tpl`
//! `mountguard.fullname` and the helpers built on it), for the hints the
//! binaries print: the same rule, so a hint names the object a render has.
//! `tests/tests/chart.rs` `hint_names` checks it against rendered releases.

/// The chart name (`Chart.yaml` `name`).
pub const CHART: &str = "mountguard";
/// The release name of the README's install command.
pub const RELEASE: &str = "mountguard";
/// The namespace the docs install into.
pub const NAMESPACE: &str = "mountguard-system";

/// `helm`'s `trunc 40 | trimSuffix "-"`: at most 40 bytes, then one
/// trailing `-` removed (release names are ASCII).
fn trunc40(s: &str) -> String {
    let t = &s[..s.len().min(40)];
    t.strip_suffix('-').unwrap_or(t).to_string()
}

/// `mountguard.fullname` without overrides: the release name when it
/// contains the chart name, else `<release>-mountguard`, cut to 40.
pub fn fullname(release: &str) -> String {
    if release.contains(CHART) {
        trunc40(release)
    } else {
        trunc40(&format!("{release}-{CHART}"))
    }
}

/// `mountguard.controller.fullname`: the Deployment and its report Service.
pub fn controller(release: &str) -> String {
    format!("{}-controller", fullname(release))
}

/// `mountguard.controller.metricsService`: the controller's metrics Service.
pub fn controller_metrics_service(release: &str) -> String {
    format!("{}-controller-metrics", fullname(release))
}

/// The dashboard ConfigMap (`templates/dashboard.yaml`).
pub fn dashboard(release: &str) -> String {
    format!("{}-dashboard", fullname(release))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_helper() {
        assert_eq!(fullname("mountguard"), "mountguard");
        assert_eq!(fullname("mg"), "mg-mountguard");
        assert_eq!(fullname("prod-mountguard"), "prod-mountguard");
        assert_eq!(
            controller_metrics_service("mountguard"),
            "mountguard-controller-metrics"
        );
        assert_eq!(controller("mg"), "mg-mountguard-controller");
        assert_eq!(fullname(&"a".repeat(50)).len(), 40);
    }
}
