"""The chart's Prometheus rules and dashboard queries, checked by `promtool`.

promtool comes from Debian's `prometheus` package (scripts/test.sh installs
it). The rendered PrometheusRule's `spec` is a Prometheus rule file; it is
written out and given to `promtool check rules` (syntax, PromQL, templates)
and, with the unit tests in promtool/alerts_test.yaml, to `promtool test
rules`. Dashboard queries become recording rules of a generated file, so
promtool parses every one of them too.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import shutil
import subprocess
from typing import Any

import yaml

HERE = pathlib.Path(__file__).resolve().parent
ALERT_TESTS = HERE / "promtool" / "alerts_test.yaml"

# Grafana's variables in the dashboard's queries, replaced by what Grafana
# would substitute so that promtool sees plain PromQL.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m",
    "$__interval": "1m",
    "$__range": "1h",
    "${node}": ".*",
    "$node": ".*",
}


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool not found: install Debian's prometheus package (scripts/test.sh)"
    return path


def run(*args: str, cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool(), *args], cwd=cwd, capture_output=True, text=True, check=False
    )


def rule_file(prometheus_rule: dict[str, Any]) -> dict[str, Any]:
    """The PrometheusRule's spec as a Prometheus rule file."""
    return {"groups": copy.deepcopy(prometheus_rule["spec"]["groups"])}


def without_annotations(rules: dict[str, Any]) -> dict[str, Any]:
    """promtool's unit tests compare every annotation of a firing alert; the
    firing tests assert labels and timing only (`check rules` parses the
    annotation templates)."""
    out = copy.deepcopy(rules)
    for g in out["groups"]:
        for r in g["rules"]:
            r.pop("annotations", None)
    return out


def check_rules(rules: dict[str, Any], tmp: pathlib.Path) -> subprocess.CompletedProcess[str]:
    path = tmp / "rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return run("check", "rules", str(path))


def test_rules(
    rules: dict[str, Any], tmp: pathlib.Path, tests: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs the alert unit tests (or `tests`, a test file's text) against
    `rules`, written next to the test file as rules.yaml."""
    (tmp / "rules.yaml").write_text(yaml.safe_dump(without_annotations(rules), sort_keys=False))
    (tmp / "alerts_test.yaml").write_text(tests if tests is not None else ALERT_TESTS.read_text())
    return run("test", "rules", "alerts_test.yaml", cwd=tmp)


def dashboard_queries(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of every panel, rows included."""
    out = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            for t in p.get("targets", []):
                if "expr" in t:
                    out.append((p.get("title", "?"), t["expr"]))
            walk(p.get("panels", []))

    walk(dashboard.get("panels", []))
    for v in dashboard.get("templating", {}).get("list", []):
        q = v.get("query")
        if v.get("type") == "query" and isinstance(q, dict) and "query" in q:
            m = re.fullmatch(r"label_values\((.+),\s*\w+\)", q["query"].strip())
            if m:
                out.append((f"variable {v['name']}", m.group(1)))
    return out


def plain_promql(expr: str) -> str:
    for var, value in sorted(GRAFANA_VARIABLES.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(var, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr!r}"
    return expr


def dashboard_rule_file(dashboard: dict[str, Any]) -> dict[str, Any]:
    """Every dashboard query as a recording rule, for `promtool check rules`."""
    rules = [
        {"record": f"dashboard:query_{i}", "expr": plain_promql(expr), "labels": {"panel": title}}
        for i, (title, expr) in enumerate(dashboard_queries(dashboard))
    ]
    return {"groups": [{"name": "dashboard", "rules": rules}]}


def dashboard_of(configmap: dict[str, Any]) -> dict[str, Any]:
    (text,) = configmap["data"].values()
    return json.loads(text)
