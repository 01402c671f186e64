"""Every render scenario through validators nobody on the project wrote.

- the Kubernetes JSON schemas (kubernetes-validate, strict) of the oldest and
  the newest supported release;
- the prometheus-operator and cert-manager CRD schemas vendored in crds/;
- promtool: `check rules` on the alerts and on every dashboard query, `test
  rules` with promtool/alerts_test.yaml.

And proof that each of them fails on a broken field, alert or query.
"""

from __future__ import annotations

import copy
import hashlib
import pathlib
import re
from typing import Any

import pytest
import yaml

import promtool
import validate
from render import MONITORING_API, SCENARIOS, render, render_scenario

HERE = pathlib.Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    return {name: render_scenario(name) for name in SCENARIOS}


@pytest.mark.parametrize("version", validate.K8S_VERSIONS)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_object_passes_the_upstream_schemas(
    rendered: dict[str, Any], name: str, version: str
) -> None:
    objects = rendered[name].objects
    assert objects
    for o in objects:
        validate.validate(o, version)


def test_the_scenarios_cover_every_custom_resource_kind(rendered: dict[str, Any]) -> None:
    kinds = {
        (o["apiVersion"], o["kind"]) for r in rendered.values() for o in r.objects
    }
    assert set(validate.crd_schemas()) <= kinds, "a vendored CRD no scenario renders"


def _first(rendered: dict[str, Any], kind: str) -> dict[str, Any]:
    """The first object of `kind` any scenario renders."""
    return copy.deepcopy(next(o for r in rendered.values() for o in r.of_kind(kind)))


@pytest.mark.parametrize(
    "kind, breaks, message",
    [
        # A misspelt field of a built-in kind.
        ("DaemonSet",
         lambda o: o["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]
         .__setitem__("mountPropogation", "HostToContainer"),
         "mountPropogation"),
        # A wrong type.
        ("Deployment", lambda o: o["spec"].__setitem__("replicas", "2"), "replicas"),
        # A field of a custom resource its CRD does not declare.
        ("ServiceMonitor",
         lambda o: o["spec"]["endpoints"][0].__setitem__("relabellings", []), "relabellings"),
        ("PodMonitor",
         lambda o: o["spec"]["podMetricsEndpoints"][0].__setitem__("scrapeTimout", "5s"),
         "scrapeTimout"),
        ("PrometheusRule",
         lambda o: o["spec"]["groups"][0]["rules"][0].__setitem__("severity", "warning"),
         "severity"),
        ("Certificate", lambda o: o["spec"].__setitem__("dnsName", ["x"]), "dnsName"),
        ("Issuer", lambda o: o["spec"].__setitem__("selfsigned", {}), "selfsigned"),
        # An enum of a CRD.
        ("Certificate", lambda o: o["spec"].__setitem__("usages", ["server"]), "usages"),
        # Metadata of a custom resource is ObjectMeta.
        ("ServiceMonitor", lambda o: o["metadata"].__setitem__("label", {}), "label"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_the_schemas_reject_a_broken_field(
    rendered: dict[str, Any], kind: str, breaks: Any, message: str
) -> None:
    o = _first(rendered, kind)
    for version in validate.K8S_VERSIONS:
        validate.validate(o, version)
    breaks(o)
    for version in validate.K8S_VERSIONS:
        with pytest.raises(validate.Invalid, match=message):
            validate.validate(o, version)


def test_vendored_crds_are_the_upstream_files() -> None:
    # crds/SOURCES.md names each file's module, version and sha256.
    sources = (HERE / "crds" / "SOURCES.md").read_text()
    listed = dict(re.findall(r"`([0-9a-f]{64})`\s*\|\s*`([\w.-]+\.yaml)`", sources))
    on_disk = {p.name: p for p in (HERE / "crds").glob("*.yaml")}
    assert set(listed.values()) == set(on_disk)
    for digest, name in listed.items():
        assert hashlib.sha256(on_disk[name].read_bytes()).hexdigest() == digest, name


# ---------------------------------------------------------------- promtool


def _rules(values: dict[str, Any] | None = None) -> dict[str, Any]:
    v = values or {"metrics": {"prometheusRule": {"enabled": True}}}
    return promtool.rule_file(render(v, [MONITORING_API]).one("PrometheusRule"))


@pytest.mark.parametrize(
    "name", [n for n, s in SCENARIOS.items() if MONITORING_API in s.api_versions]
)
def test_promtool_accepts_the_rules_of_every_scenario(
    rendered: dict[str, Any], name: str, tmp_path: pathlib.Path
) -> None:
    for rule in rendered[name].of_kind("PrometheusRule"):
        p = promtool.check_rules(promtool.rule_file(rule), tmp_path)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "SUCCESS" in p.stdout


def test_promtool_unit_tests_make_every_alert_fire(tmp_path: pathlib.Path) -> None:
    rules = _rules()
    p = promtool.test_rules(rules, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    tests = yaml.safe_load(promtool.ALERT_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    silent = {
        case["alertname"]
        for t in tests
        for case in t.get("alert_rule_test", [])
        if not case.get("exp_alerts")
    }
    names = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert fired == names, "an alert no unit test makes fire"
    assert silent == names, "an alert no unit test keeps silent"


def test_a_single_rejected_report_fires_at_once(tmp_path: pathlib.Path) -> None:
    # The unit test of MountguardReportRejections fails with the old delay.
    old = _rules({"metrics": {"prometheusRule": {"enabled": True,
                                                 "for": {"reportRejections": "10m"}}}})
    p = promtool.test_rules(old, tmp_path)
    assert p.returncode != 0
    assert "MountguardReportRejections" in p.stdout + p.stderr


def test_promtool_rejects_a_broken_alert(tmp_path: pathlib.Path) -> None:
    rules = _rules()
    rule = rules["groups"][0]["rules"][0]
    rule["expr"] = rule["expr"].replace(")", "", 1)
    p = promtool.check_rules(rules, tmp_path)
    assert p.returncode != 0, p.stdout
    assert rule["alert"] in p.stdout + p.stderr or "parse error" in p.stdout + p.stderr

    # A broken annotation template.
    rules = _rules()
    rules["groups"][0]["rules"][0]["annotations"]["summary"] = "{{ $labels.node "
    p = promtool.check_rules(rules, tmp_path)
    assert p.returncode != 0, p.stdout


def test_promtool_unit_tests_catch_a_wrong_alert(tmp_path: pathlib.Path) -> None:
    # Valid PromQL, wrong meaning: the unit tests notice.
    rules = _rules()
    for g in rules["groups"]:
        for r in g["rules"]:
            if r["alert"] == "MountguardAgentNotReporting":
                r["expr"] = r["expr"].replace("== 0", "== 1")
    p = promtool.test_rules(rules, tmp_path)
    assert p.returncode != 0
    assert "MountguardAgentNotReporting" in p.stdout + p.stderr


def test_extra_rules_and_disabled_alerts_pass_promtool(tmp_path: pathlib.Path) -> None:
    rules = _rules({"metrics": {"prometheusRule": {
        "enabled": True,
        "disabled": {"MountguardRemediationFailed": True, "MountguardRemediationUnresolved": True,
                     "MountguardRemediationStuck": True},
        "extraRules": [
            {"record": "mountguard:stale_mounts:count", "expr": 'count(mountguard_mount_state{state="Stale"})'},
            {"alert": "MountguardManyStale", "expr": "mountguard:stale_mounts:count > 10",
             "for": "5m", "labels": {"severity": "warning"}},
        ],
    }}})
    names = [g["name"] for g in rules["groups"]]
    assert "mountguard.remediation" not in names, "an empty group is left out"
    assert names[-1] == "mountguard.extra"
    alerts = {r.get("alert") for g in rules["groups"] for r in g["rules"]}
    assert "MountguardRemediationFailed" not in alerts
    assert "MountguardStaleMount" in alerts and "MountguardManyStale" in alerts
    p = promtool.check_rules(rules, tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr


# ---------------------------------------------------------------- dashboard


def _dashboard(values: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    r = render(values or {"dashboard": {"enabled": True}})
    cm = r.one("ConfigMap", next(
        o["metadata"]["name"] for o in r.of_kind("ConfigMap")
        if o["metadata"]["name"].endswith("-dashboard")
    ))
    return cm, promtool.dashboard_of(cm)


def test_dashboard_is_off_by_default_and_labelled_for_the_sidecar() -> None:
    assert not [o for o in render().of_kind("ConfigMap")
                if o["metadata"]["name"].endswith("-dashboard")]
    cm, dash = _dashboard()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert dash["uid"] == "mountguard"
    notes = render({"dashboard": {"enabled": True}}).notes
    assert f"ConfigMap {cm['metadata']['name']} in namespace mountguard-system" in notes
    assert "grafana_dashboard=1" in notes
    cm, _ = _dashboard({"dashboard": {
        "enabled": True, "labels": {"grafana_dashboard": "mountguard"},
        "annotations": {"grafana_folder": "HPC"}, "namespace": "monitoring",
    }})
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "mountguard"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "HPC"}
    assert cm["metadata"]["namespace"] == "monitoring"


def test_every_dashboard_query_passes_promtool(tmp_path: pathlib.Path) -> None:
    _, dash = _dashboard()
    queries = promtool.dashboard_queries(dash)
    assert len(queries) >= 15
    p = promtool.check_rules(promtool.dashboard_rule_file(dash), tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(queries)} rules found" in p.stdout


def test_dashboard_shows_what_operators_look_for() -> None:
    _, dash = _dashboard()
    exprs = [e for _, e in promtool.dashboard_queries(dash)]

    def some(*needles: str) -> bool:
        return any(all(n in e for n in needles) for e in exprs)

    assert some("mountguard_mount_state", 'state="Stale"', "node", "source_name",
                'cause!="ImmutableCachePinned"')
    assert some("mountguard_mount_state", 'cause="ImmutableCachePinned"', "node", "source_name")
    assert some("mountguard_nodes", 'reporting="true"')
    assert some("mountguard_node_agent_reporting")
    assert some("mountguard_remediation_attempts_total", "phase")
    assert some("mountguard_report_requests_total", "unauthenticated|forbidden")
    # Every panel has a data source variable, not a fixed one.
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${datasource}", p["title"]


def test_promtool_rejects_a_broken_dashboard_query(tmp_path: pathlib.Path) -> None:
    _, dash = _dashboard()
    target = next(p for p in dash["panels"] if p.get("targets"))["targets"][0]
    target["expr"] = target["expr"].replace("(", "((", 1)
    p = promtool.check_rules(promtool.dashboard_rule_file(dash), tmp_path)
    assert p.returncode != 0, p.stdout
    # A Grafana variable promtool cannot be given is reported, not ignored.
    _, dash = _dashboard()
    next(p for p in dash["panels"] if p.get("targets"))["targets"][0]["expr"] += " * $scale"
    with pytest.raises(AssertionError, match="unknown Grafana variable"):
        promtool.dashboard_rule_file(dash)
