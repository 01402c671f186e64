"""The chart's escape hatches (scenario "escape-hatches" of render.py): each
value reaches the object it is meant for, and nothing else changes."""

from __future__ import annotations

from typing import Any

import helm_python
import pytest

from render import MONITORING_API, SCENARIOS, render, render_scenario

V = SCENARIOS["escape-hatches"].values


@pytest.fixture(scope="module")
def r() -> Any:
    return render_scenario("escape-hatches")


def pods(r: Any) -> dict[str, dict[str, Any]]:
    return {
        "agent": r.one("DaemonSet")["spec"]["template"],
        "controller": r.one("Deployment")["spec"]["template"],
    }


@pytest.mark.parametrize("comp", ["agent", "controller"])
def test_extra_env_args_volumes_and_mounts(r: Any, comp: str) -> None:
    spec = pods(r)[comp]["spec"]
    (c,) = spec["containers"]
    v = V[comp]
    assert c["args"] == ["run", *v["extraArgs"]]
    assert c["env"][-len(v["extraEnv"]):] == v["extraEnv"]
    assert spec["volumes"][-1] == v["extraVolumes"][0]
    assert c["volumeMounts"][-1] == v["extraVolumeMounts"][0]
    # The chart's own env, volumes and mounts stay.
    default = pods(render())[comp]["spec"]
    (d,) = default["containers"]
    assert c["env"][: len(d["env"])] == d["env"]
    assert spec["volumes"][: len(default["volumes"])] == default["volumes"]


@pytest.mark.parametrize(
    ("comp", "name"),
    [("agent", "MOUNTGUARD_CONTROLLER_URL"), ("controller", "MOUNTGUARD_LOG")],
)
def test_extra_env_replaces_a_variable_the_chart_sets(comp: str, name: str) -> None:
    """One entry per name (server-side apply refuses a second one: "duplicate
    entries for key"); the user's value wins, the other variables stay."""
    default = pods(render())[comp]["spec"]["containers"][0]["env"]
    mine = {"name": name, "value": "http://10.0.0.9:8443"}
    (c,) = pods(render({comp: {"extraEnv": [mine]}}))[comp]["spec"]["containers"]
    names = [e["name"] for e in c["env"]]
    assert len(names) == len(set(names)), names
    assert [e for e in c["env"] if e["name"] == name] == [mine]
    assert [e for e in c["env"] if e["name"] != name] == [e for e in default if e["name"] != name]


def test_security_context_overrides_replace_single_keys(r: Any) -> None:
    agent = pods(r)["agent"]["spec"]
    (a,) = agent["containers"]
    assert a["securityContext"]["seLinuxOptions"] == {"type": "spc_t"}
    assert a["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH"]}
    assert agent["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"}, "seLinuxOptions": {"type": "spc_t"},
    }
    ctrl = pods(r)["controller"]["spec"]
    (c,) = ctrl["containers"]
    assert ctrl["securityContext"]["runAsUser"] == 10001
    assert ctrl["securityContext"]["fsGroup"] == 10001
    assert ctrl["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL", "NET_RAW"]}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # Defaults unchanged without overrides.
    (d,) = pods(render())["controller"]["spec"]["containers"]
    assert d["securityContext"]["capabilities"] == {"drop": ["ALL"]}


@pytest.mark.parametrize(
    "bad",
    [
        {"agent": {"securityContext": {"privilegd": True}}},
        {"controller": {"podSecurityContext": {"runAsUser": "root"}}},
        {"controller": {"securityContext": {"capabilities": {"add": "NET_ADMIN"}}}},
        {"agent": {"extraEnv": [{"value": "no name"}]}},
        {"agent": {"extraArgs": [1]}},
        {"controller": {"extraVolumeMounts": [{"name": "x"}]}},
        {"controller": {"topologySpreadConstraints": [{"maxSkew": 1}]}},
        {"agent": {"image": {"digest": "latest"}}},
        {"global": {"imageRegistry": "https://registry.example.com"}},
        {"metrics": {"prometheusRule": {"disabled": {"MountguardNoSuchAlert": True}}}},
        {"metrics": {"prometheusRule": {"extraRules": [{"expr": "up"}]}}},
        {"metrics": {"serviceMonitor": {"relabelings": {"targetLabel": "x"}}}},
    ],
    ids=str,
)
def test_schema_rejects_bad_escape_hatches(bad: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmError):
        render(bad)


def test_scheduling_of_both_workloads(r: Any) -> None:
    p = pods(r)
    assert p["agent"]["spec"]["nodeSelector"] == V["agent"]["nodeSelector"]
    assert p["controller"]["spec"]["nodeSelector"] == V["controller"]["nodeSelector"]
    assert p["controller"]["spec"]["affinity"] == V["controller"]["affinity"]
    tsc = V["controller"]["topologySpreadConstraints"]
    assert p["controller"]["spec"]["topologySpreadConstraints"] == tsc
    assert "topologySpreadConstraints" not in p["agent"]["spec"]  # empty list: not rendered
    agent_tsc = [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                  "whenUnsatisfiable": "DoNotSchedule"}]
    a = pods(render({"agent": {"topologySpreadConstraints": agent_tsc,
                               "affinity": {"podAntiAffinity": {}}}}))["agent"]["spec"]
    assert a["topologySpreadConstraints"] == agent_tsc
    # The architecture requirement stays next to the user's affinity.
    assert "nodeAffinity" in a["affinity"] and "podAntiAffinity" in a["affinity"]


def test_images_digest_and_global_registry(r: Any) -> None:
    (a,) = pods(r)["agent"]["spec"]["containers"]
    (c,) = pods(r)["controller"]["spec"]["containers"]
    assert a["image"] == "registry.example.com/mirror/mountguard/mountguard-agent@sha256:" + "a" * 64
    assert c["image"] == "registry.example.com/mirror/mountguard/mountguard-controller:0.9.9"
    # A repository without a registry part keeps all of its path.
    r2 = render({"global": {"imageRegistry": "mirror.local:5000"},
                 "controller": {"image": {"repository": "mountguard/controller"}}})
    (c2,) = pods(r2)["controller"]["spec"]["containers"]
    assert c2["image"].startswith("mirror.local:5000/mountguard/controller:")


def test_pod_labels_and_annotations(r: Any) -> None:
    for comp, tpl in pods(r).items():
        assert tpl["metadata"]["labels"]["team"] == "hpc"
        assert tpl["metadata"]["annotations"] == V[comp]["podAnnotations"]


def test_monitor_relabelings(r: Any) -> None:
    sm = V["metrics"]["serviceMonitor"]
    for mon in r.of_kind("ServiceMonitor"):
        (ep,) = mon["spec"]["endpoints"]
        assert ep["relabelings"][-1] == sm["relabelings"][0]
        assert ep["metricRelabelings"] == sm["metricRelabelings"]
        if mon["metadata"]["labels"]["app.kubernetes.io/component"] == "agent":
            assert ep["relabelings"][0]["targetLabel"] == "node"
    pm = render({"metrics": {"podMonitor": {"enabled": True, **{k: sm[k] for k in (
        "relabelings", "metricRelabelings")}}}}, [MONITORING_API])
    for mon in pm.of_kind("PodMonitor"):
        (ep,) = mon["spec"]["podMetricsEndpoints"]
        assert ep["relabelings"][-1] == sm["relabelings"][0]
        assert ep["metricRelabelings"] == sm["metricRelabelings"]


def test_service_monitor_and_pod_monitor_are_exclusive() -> None:
    both = {"metrics": {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}}}
    for apis in ([MONITORING_API], []):
        with pytest.raises(helm_python.HelmError, match="not both"):
            render(both, apis)


def test_alerts_disabled_by_name_and_extra_rules(r: Any) -> None:
    (rule,) = r.of_kind("PrometheusRule")
    alerts = [x.get("alert") for g in rule["spec"]["groups"] for x in g["rules"]]
    assert "MountguardFrozenMount" not in alerts
    assert "MountguardStaleMount" in alerts
    extra = [g for g in rule["spec"]["groups"] if g["name"] == "mountguard.extra"]
    assert extra[0]["rules"] == V["metrics"]["prometheusRule"]["extraRules"]
