"""networkPolicy: the report API from agent pods only, metrics from the
monitoring namespace; off by default."""

from __future__ import annotations

from typing import Any

from render import SCENARIOS, render, render_scenario


def by_component(r: Any) -> dict[str, dict[str, Any]]:
    return {
        o["metadata"]["labels"]["app.kubernetes.io/component"]: o
        for o in r.of_kind("NetworkPolicy")
    }


def ports_of(template: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
            for p in c["ports"]}


def test_off_by_default() -> None:
    r = render()
    assert r.of_kind("NetworkPolicy") == []
    assert "NetworkPolicy" not in r.notes


def test_notes_say_who_may_scrape() -> None:
    assert 'namespace\n"monitoring"' in render_scenario("network-policy").notes


def test_reports_only_from_agents_and_metrics_only_from_monitoring() -> None:
    r = render_scenario("network-policy")
    nps = by_component(r)
    assert set(nps) == {"agent", "controller"}
    agent_tpl = r.one("DaemonSet")["spec"]["template"]
    ctrl_tpl = r.one("Deployment")["spec"]["template"]
    want = SCENARIOS["network-policy"].values["networkPolicy"]["metrics"]
    for comp, tpl in (("agent", agent_tpl), ("controller", ctrl_tpl)):
        spec = nps[comp]["spec"]
        # The policy selects exactly this component's pods.
        sel = spec["podSelector"]["matchLabels"]
        assert sel.items() <= tpl["metadata"]["labels"].items()
        assert spec["policyTypes"] == ["Ingress"]
        # Every named port exists on the pods.
        for rule in spec["ingress"]:
            for p in rule["ports"]:
                assert p["port"] in ports_of(tpl), p
        metrics = [x for x in spec["ingress"] if x["ports"][0]["port"] == "metrics"]
        assert metrics == [{"from": [want], "ports": [{"port": "metrics", "protocol": "TCP"}]}]
    reports = [x for x in nps["controller"]["spec"]["ingress"] if x["ports"][0]["port"] == "reports"]
    (rule,) = reports
    (peer,) = rule["from"]
    # Agent pods of this release, in the release namespace (no namespaceSelector).
    assert set(peer) == {"podSelector"}
    assert peer["podSelector"]["matchLabels"].items() <= agent_tpl["metadata"]["labels"].items()
    assert peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "agent"
    # No ingress to the agent except metrics.
    assert [x["ports"][0]["port"] for x in nps["agent"]["spec"]["ingress"]] == ["metrics"]


def test_default_metrics_peer_is_the_monitoring_namespace() -> None:
    nps = by_component(render({"networkPolicy": {"enabled": True}}))
    rule = nps["agent"]["spec"]["ingress"][0]
    assert rule["from"] == [{
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {},
    }]


def test_extra_ingress_is_appended_to_the_controller_policy() -> None:
    extra = {"from": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": 8080}]}
    nps = by_component(render({"networkPolicy": {"enabled": True, "extraIngress": [extra]}}))
    assert nps["controller"]["spec"]["ingress"][-1] == extra
