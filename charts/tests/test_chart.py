"""Tests of charts/mountguard, rendered and linted with the real Helm engine.

No helm binary and no cluster: helm-python-sdk carries Helm's Go engine.
`lookup` returns nothing when rendering offline, as in `helm template`.
The Rust test tests/tests/chart.rs parses the same renders into
k8s-openapi types (unknown fields fail) and checks the alerts' metric names
against the running binaries.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
from typing import Any

import helm_python
import pytest
import yaml

from render import (
    CHART,
    MONITORING_API,
    NAMESPACE,
    RELEASE,
    REPO,
    SCENARIOS,
    chart,
    render,
    render_scenario,
)

RUNBOOKS = REPO / "docs" / "runbooks"
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
CONTROLLER_SA = f"{RELEASE}-mountguard-controller"
AGENT_SA = f"{RELEASE}-mountguard-agent"

# The controller's permissions: exactly the list documented in
# docs/security.md ("What the controller may do"). (scope, apiGroup,
# resource, verb); scope is "cluster" or the namespace of a Role.
BASE_RULES = {
    ("cluster", "", r, v)
    for r in ("pods", "secrets", "configmaps", "nodes")
    for v in ("get", "list", "watch")
} | {
    ("cluster", "slinky.slurm.net", "nodesets", v) for v in ("get", "list", "watch")
} | {
    ("cluster", g, "events", v) for g in ("", "events.k8s.io") for v in ("create", "patch")
} | {("cluster", "authentication.k8s.io", "tokenreviews", "create")} | {
    (NAMESPACE, "", "pods", "patch")
} | {(NAMESPACE, "apps", "daemonsets", v) for v in ("get", "list", "watch")}
REMEDIATION_RULES = {("cluster", "", "pods/eviction", "create")}
# Only with remediation.slurmrestd.url (NodeSets remediated).
SLURMRESTD_RULES = {("cluster", "slinky.slurm.net", "nodesets", "patch")}
# Only with remediation.workloads.kinds: the resources each kind needs (a
# Deployment's pods belong to its ReplicaSets).
WORKLOAD_RESOURCES = {
    "deployment": {"deployments", "replicasets"},
    "replicaset": {"replicasets"},
    "statefulset": {"statefulsets"},
    "daemonset": {"daemonsets"},
}


def workload_rules(kinds: list[str]) -> set[tuple[str, str, str, str]]:
    resources = set().union(*(WORKLOAD_RESOURCES[k] for k in kinds)) if kinds else set()
    return {
        ("cluster", "apps", r, v) for r in resources for v in ("get", "list", "watch", "patch")
    }
# Only with remediation.replacePinningPods (holding a node for a group) or
# with a deployment, replicaset or daemonset among remediation.workloads.kinds
# (holding the node of an evicted pod until it is gone).
PINNING_RULES = {("cluster", "", "nodes", "patch")}
LEADER_RULES = {
    (NAMESPACE, "coordination.k8s.io", "leases", v) for v in ("get", "create", "patch")
}
# Only with controller.statusAuth=kubernetes (the default): the status API's
# SubjectAccessReviews.
STATUS_AUTH_RULES = {("cluster", "authorization.k8s.io", "subjectaccessreviews", "create")}


def scenario_ids() -> list[str]:
    return list(SCENARIOS)


@pytest.fixture(scope="module", params=scenario_ids())
def scenario(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, render_scenario(request.param)


# Scenarios in which the user overrides the chart's own security and
# scheduling settings on purpose (test_escape_hatches.py checks them).
OVERRIDES = {"escape-hatches"}


@pytest.fixture(scope="module", params=[n for n in scenario_ids() if n not in OVERRIDES])
def own_scenario(request: pytest.FixtureRequest) -> tuple[str, Any]:
    return request.param, render_scenario(request.param)


def extra_env_names(name: str) -> set[str]:
    """Names of the scenario's agent.extraEnv and controller.extraEnv."""
    v = SCENARIOS[name].values
    return {
        e["name"] for comp in ("agent", "controller") for e in v.get(comp, {}).get("extraEnv", [])
    }


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# ---------------------------------------------------------------- lint, schema


def test_lint_is_clean_with_strict_checks() -> None:
    report = helm_python.lint(CHART, strict=True, namespace=NAMESPACE, kube_version="v1.37.0")
    assert report["errors"] == [], report
    worse_than_info = [m for m in report["messages"] if m["severity"] >= 2]
    assert worse_than_info == [], report


@pytest.mark.parametrize("name", scenario_ids())
def test_lint_is_clean_for_every_scenario(name: str) -> None:
    report = helm_python.lint(
        CHART, SCENARIOS[name].values, strict=True, namespace=NAMESPACE, kube_version="v1.37.0"
    )
    assert report["errors"] == [], report
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], report


def test_lint_reports_a_broken_value() -> None:
    # The lint call is not a no-op: the same call reports a schema violation.
    report = helm_python.lint(CHART, {"remediation": {"mode": "maybe"}}, strict=True)
    text = json.dumps(report)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"]), report
    assert "remediation" in text, report


def leaf_paths(values: Any, prefix: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    if isinstance(values, dict) and values:
        out: set[tuple[str, ...]] = set()
        for k, v in values.items():
            out |= leaf_paths(v, prefix + (k,))
        return out
    return {prefix}


def schema_at(schema: dict[str, Any], root: dict[str, Any], path: tuple[str, ...]) -> Any:
    node = schema
    for key in path:
        while "$ref" in node:
            node = root["$defs"][node["$ref"].split("/")[-1]]
        props = node.get("properties", {})
        if key in props:
            node = props[key]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif node.get("type") == "object" and "additionalProperties" not in node:
            return node  # free-form object (e.g. affinity passed through)
        else:
            return None
    return node


def test_schema_describes_every_value_and_nothing_else() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [p for p in leaf_paths(values) if schema_at(schema, schema, p) is None]
    assert missing == [], f"values without a schema entry: {missing}"

    # And every object in the schema is closed, so a misspelt key fails,
    # unless it says it is open (a Kubernetes object passed through, which
    # CI checks against the Kubernetes schemas; Helm's `global`).
    def walk(node: Any, where: str) -> list[str]:
        bad = []
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                if node.get("additionalProperties") not in (False, True):
                    bad.append(where)
            for k, v in node.items():
                bad += walk(v, f"{where}/{k}")
        elif isinstance(node, list):
            for i, v in enumerate(node):
                bad += walk(v, f"{where}/{i}")
        return bad

    assert walk(schema, "") == []
    # Every top-level schema property is a value of values.yaml.
    assert set(schema["properties"]) == set(values)


@pytest.mark.parametrize(
    "bad",
    [
        {"remediation": {"mode": "maybe"}},
        {"remediation": {"mode": True}},
        {"remediation": {"onFailure": "retry"}},
        {"remediation": {"budgetCluster": 0}},
        {"remediation": {"delay": "5 minutes"}},
        {"remediation": {"slurmrestd": {"url": "slurm-restapi:6820"}}},
        {"remediation": {"evictionTimeout": "30 minutes"}},
        {"remediation": {"verificationTimeout": "0s"}},
        {"remediation": {"replacePinningPods": "yes"}},
        {"remediation": {"drainState": "down"}},
        {"remediation": {"slurmrestd": {"jwtKeySecret": {"name": "x", "key": "jwt.key"}}}},
        {"remediation": {"slurmrestd": {"user": ""}}},
        {"remediation": {"workloads": {"kinds": ["job"]}}},
        {"remediation": {"workloads": {"kinds": ["deployment", "deployment"]}}},
        {"remediation": {"workloads": {"kinds": "deployment"}}},
        {"remediation": {"workloads": {"budget": -1}}},
        {"controller": {"reportRateLimit": "fast"}},
        {"controller": {"reportRateLimit": "0/s"}},
        {"controller": {"reportRateLimit": "2/s,0"}},
        {"controller": {"reportRateLimit": 2}},
        {"controller": {"replicas": 0}},
        {"controller": {"grace": "0s"}},
        {"controller": {"watchNamespaces": ["Not_A_Namespace"]}},
        {"agent": {"kubeletRootDir": "var/lib/kubelet"}},
        {"agent": {"architectures": ["s390x"]}},
        {"agent": {"updateStrategy": {"maxUnavailable": 0}}},
        {"agent": {"kubeletRoot": "/var/lib/kubelet"}},
        {"agent": {"affinity": {"nodeAffinity": {}}}},
        {"metrics": {"serviceMonitor": {"enable": True}}},
        {"metrics": {"prometheusRule": {"for": {"staleMount": "soon"}}}},
        {"tls": {"certManager": {"issuerRef": {"name": "x", "kind": "Vault"}}}},
        {"surprise": 1},
        {"rbac": {"readerRole": {"create": "yes"}}},
        {"rbac": {"readerRole": {"bind": True}}},
    ],
    ids=lambda v: json.dumps(v, separators=(",", ":")),
)
def test_schema_rejects(bad: dict[str, Any]) -> None:
    with pytest.raises(helm_python.HelmValuesError):
        chart().validate_schema(bad)
    with pytest.raises(helm_python.HelmError):
        render(bad)


DURATION_CASES = json.loads((REPO / "inventory" / "src" / "duration_cases.json").read_text())[
    "cases"
]


@pytest.mark.parametrize(("text", "millis"), DURATION_CASES, ids=lambda v: repr(v))
def test_durations_follow_the_table_the_binaries_are_tested_on(text: str, millis: int | None) -> None:
    # The same table is parsed by the agent's and the controller's flags
    # (inventory/src/duration.rs): the chart accepts exactly what they do.
    for values in (
        {"controller": {"grace": text}},
        {"agent": {"rescanInterval": text}},
        {"remediation": {"drainTimeout": text}},
    ):
        if millis is None:
            with pytest.raises(helm_python.HelmValuesError):
                chart().validate_schema(values)
        else:
            chart().validate_schema(values)


SIZE_CASES = json.loads((REPO / "inventory" / "src" / "size_cases.json").read_text())["cases"]


@pytest.mark.parametrize(("text", "size"), SIZE_CASES, ids=lambda v: repr(v))
def test_sizes_follow_the_table_the_binaries_are_tested_on(text: str, size: int | None) -> None:
    # The same table is parsed by the agent's --max-file-size and the
    # controller's --max-report-bytes (inventory/src/size.rs): the chart
    # accepts exactly what they do and hands the string on unchanged.
    for values in ({"agent": {"maxFileSize": text}}, {"controller": {"maxReportBytes": text}}):
        if size is None:
            with pytest.raises(helm_python.HelmValuesError):
                chart().validate_schema(values)
        else:
            chart().validate_schema(values)
    if size is not None and size >= 1024:
        r = render({"agent": {"maxFileSize": text}, "controller": {"maxReportBytes": text}})
        agent = env_of(r.one("DaemonSet")["spec"]["template"]["spec"]["containers"][0])
        controller = env_of(r.one("Deployment")["spec"]["template"]["spec"]["containers"][0])
        assert agent["MOUNTGUARD_MAX_FILE_SIZE"] == text
        assert controller["MOUNTGUARD_MAX_REPORT_BYTES"] == text


def test_sizes_as_integers_are_rendered_as_before() -> None:
    r = render({"agent": {"maxFileSize": 16777216}, "controller": {"maxReportBytes": 33554432}})
    agent = env_of(r.one("DaemonSet")["spec"]["template"]["spec"]["containers"][0])
    controller = env_of(r.one("Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert agent["MOUNTGUARD_MAX_FILE_SIZE"] == "16777216"
    assert controller["MOUNTGUARD_MAX_REPORT_BYTES"] == "33554432"
    # The defaults are strings the binaries read as 16 MiB and 32 MiB.
    r = render()
    agent = env_of(r.one("DaemonSet")["spec"]["template"]["spec"]["containers"][0])
    controller = env_of(r.one("Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert (agent["MOUNTGUARD_MAX_FILE_SIZE"], controller["MOUNTGUARD_MAX_REPORT_BYTES"]) == (
        "16Mi",
        "32Mi",
    )


@pytest.mark.parametrize("small", [1023, "1023", "1K", "1KB", "1000B"])
def test_a_report_limit_below_1024_bytes_fails_the_render_whatever_its_spelling(
    small: int | str,
) -> None:
    with pytest.raises(helm_python.HelmError) as e:
        render({"controller": {"maxReportBytes": small}})
    assert "controller.maxReportBytes" in str(e.value) and "1024" in str(e.value), str(e.value)
    render({"controller": {"maxReportBytes": "1Ki"}})
    render({"controller": {"maxReportBytes": 1024}})


def test_error_hint_a_bad_size_says_what_a_size_is() -> None:
    with pytest.raises(helm_python.HelmValuesError) as e:
        chart().validate_schema({"agent": {"maxFileSize": "16 MiB"}})
    msg = str(e.value)
    assert "/agent/maxFileSize" in msg, msg
    assert "whole_number_of_bytes_optionally_with_Ki_Mi_Gi_K_M_G_or_B__like_16Mi" in msg, msg


def test_schema_accepts_every_scenario() -> None:
    for name, s in SCENARIOS.items():
        chart().validate_schema(s.values)


def test_unquoted_off_in_a_values_file_means_off() -> None:
    # YAML 1.1 reads an unquoted `off` as false; the chart treats it as "off".
    values = helm_python.values_from_yaml("remediation:\n  mode: off\n")
    assert values["remediation"]["mode"] is False
    r = render(values)
    env = env_of(r.one("Deployment")["spec"]["template"]["spec"]["containers"][0])
    assert env["MOUNTGUARD_REMEDIATION"] == "off"
    assert not any(o["metadata"]["name"].endswith("-remediation") for o in r.objects)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"remediation": {"mode": "on"}}, "slurmrestd.url"),
        ({"remediation": {"mode": "on"}}, "remediation.workloads.kinds"),
        ({"tls": {"certManager": {"enabled": False}}}, "tls"),
        ({"tls": {"existingSecret": "both"}}, "not both"),
        (
            {"remediation": {"mode": "on", "slurmrestd": {"url": "http://slurmrestd:6820"}}},
            "remediation.slurmrestd.tokenSecret.name (or, if no token Secret can be provided, "
            "jwtKeySecret.name) is required",
        ),
        (
            {"remediation": {"mode": "dry-run", "slurmrestd": {
                "url": "http://slurmrestd:6820",
                "tokenSecret": {"name": "slurm-token"},
                "jwtKeySecret": {"name": "slurm-auth-jwt"},
            }}},
            "set either tokenSecret.name or jwtKeySecret.name, not both",
        ),
        # Contradictory even while remediation is off: caught before it is
        # turned on.
        (
            {"remediation": {"slurmrestd": {
                "tokenSecret": {"name": "slurm-token"},
                "jwtKeySecret": {"name": "slurm-auth-jwt"},
            }}},
            "set either tokenSecret.name or jwtKeySecret.name, not both",
        ),
    ],
)
def test_inconsistent_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm_python.HelmError, match=re.escape(message)):
        render(values)


# ---------------------------------------------------------------- agent


def agent_pod(r: Any) -> dict[str, Any]:
    return r.one("DaemonSet")["spec"]["template"]["spec"]


def test_agent_security_properties(own_scenario: tuple[str, Any]) -> None:
    scenario = own_scenario
    name, r = scenario
    ds = r.one("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    for host in ("hostNetwork", "hostPID", "hostIPC"):
        assert pod.get(host, False) is False, host
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"}
    arch = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    exprs = arch["nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64", "arm64"]} in exprs
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%"},
    }

    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for k in c["resources"]["requests"]:
        assert k in ("cpu", "memory")
    assert "memory" in c["resources"]["limits"]

    # The kubelet root: hostPath, read-only, HostToContainer, same path.
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    host_paths = [v for v in pod["volumes"] if "hostPath" in v]
    assert [v["name"] for v in host_paths] == ["kubelet-root"], "only the kubelet root"
    assert vols["kubelet-root"]["hostPath"] == {"path": "/var/lib/kubelet", "type": "Directory"}
    m = mounts["kubelet-root"]
    assert m["readOnly"] is True
    assert m["mountPropagation"] == "HostToContainer"
    assert m["mountPath"] == "/var/lib/kubelet"
    for mount in c["volumeMounts"]:
        assert mount.get("readOnly") is True, mount

    # Only a projected token with audience mountguard (and the report CA).
    sources = vols["report-credentials"]["projected"]["sources"]
    tokens = [s["serviceAccountToken"] for s in sources if "serviceAccountToken" in s]
    assert tokens == [{"audience": "mountguard", "expirationSeconds": 3600, "path": "token"}]
    secrets = [s["secret"] for s in sources if "secret" in s]
    plaintext = SCENARIOS[name].values.get("tls", {}).get("insecurePlaintextReports", False)
    if plaintext:
        assert secrets == []
    else:
        (ca,) = secrets
        assert ca["items"] == [{"key": "ca.crt", "path": "ca.crt"}], "never the TLS key"

    env = env_of(c)
    assert env["MOUNTGUARD_NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["MOUNTGUARD_KUBELET_ROOT"] == "/var/lib/kubelet"
    assert env["MOUNTGUARD_TOKEN_FILE"] == "/var/run/secrets/mountguard/token"
    assert mounts["report-credentials"]["mountPath"] == "/var/run/secrets/mountguard"
    scheme = "http" if plaintext else "https"
    assert env["MOUNTGUARD_CONTROLLER_URL"] == (
        f"{scheme}://{RELEASE}-mountguard-controller.{NAMESPACE}.svc:8443"
    )
    assert ("MOUNTGUARD_CA_FILE" in env) == (not plaintext)

    # The agent's service account exists, mounts nothing and is bound to nothing.
    sa = r.one("ServiceAccount", AGENT_SA)
    assert sa["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == AGENT_SA
    for b in r.of_kind("ClusterRoleBinding") + r.of_kind("RoleBinding"):
        assert all(s["name"] != AGENT_SA for s in b["subjects"]), b


def test_kubelet_root_value_moves_hostpath_mount_and_flag() -> None:
    root = "/var/lib/k0s/kubelet"
    r = render({"agent": {"kubeletRootDir": root}})
    pod = agent_pod(r)
    (c,) = pod["containers"]
    assert {"path": root, "type": "Directory"} in [v.get("hostPath") for v in pod["volumes"]]
    assert [m["mountPath"] for m in c["volumeMounts"] if m["name"] == "kubelet-root"] == [root]
    assert env_of(c)["MOUNTGUARD_KUBELET_ROOT"] == root


def test_agent_environment_names_flags_the_agent_has() -> None:
    # Every MOUNTGUARD_* variable the chart sets on the agent is declared in
    # the agent's CLI, or is one of the report flags of the runtime contract
    # (being added with the report client).
    declared = set()
    for src in (REPO / "agent" / "src").rglob("*.rs"):
        declared |= set(re.findall(r'env = "(MOUNTGUARD_[A-Z_]+)"', src.read_text()))
    report_flags = {
        "MOUNTGUARD_CONTROLLER_URL",
        "MOUNTGUARD_TOKEN_FILE",
        "MOUNTGUARD_CA_FILE",
        "MOUNTGUARD_HEARTBEAT_INTERVAL",
    }
    if "MOUNTGUARD_CONTROLLER_URL" in declared:
        report_flags = set()  # the report client exists: no allowance
    used: set[str] = set()
    for name in SCENARIOS:
        (c,) = agent_pod(render_scenario(name))["containers"]
        used |= set(env_of(c)) - extra_env_names(name)
    unknown = used - declared - report_flags
    assert unknown == set(), f"agent env vars the agent does not read: {unknown}"


# ---------------------------------------------------------------- controller


def controller_env(r: Any) -> dict[str, Any]:
    (c,) = r.one("Deployment")["spec"]["template"]["spec"]["containers"]
    return env_of(c)


def test_controller_deployment(own_scenario: tuple[str, Any]) -> None:
    scenario = own_scenario
    name, r = scenario
    dep = r.one("Deployment")
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["serviceAccountName"] == CONTROLLER_SA
    env = controller_env(r)
    assert env["MOUNTGUARD_AGENT_SERVICE_ACCOUNT"] == f"{NAMESPACE}:{AGENT_SA}"
    assert env["MOUNTGUARD_AGENT_DAEMONSET"] == r.one("DaemonSet")["metadata"]["name"]
    assert env["MOUNTGUARD_TOKEN_AUDIENCE"] == "mountguard"
    assert env["MOUNTGUARD_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    replicas = dep["spec"]["replicas"]
    assert env["MOUNTGUARD_LEADER_ELECTION"] == ("true" if replicas > 1 else "false")
    mode = SCENARIOS[name].values.get("remediation", {}).get("mode", "off")
    assert env["MOUNTGUARD_REMEDIATION"] == mode
    slurmrestd = SCENARIOS[name].values.get("remediation", {}).get("slurmrestd", {}).get("url")
    assert ("MOUNTGUARD_SLURMRESTD_URL" in env) == (mode != "off" and bool(slurmrestd))

    # The fingerprint key Secret the controller reads exists (or is the user's).
    key_vol = [v for v in pod["volumes"] if v["name"] == "fingerprint-key"][0]
    secret = r.one("Secret", key_vol["secret"]["secretName"])
    assert len(secret["data"]["key"]) >= 64

    # Services: reports go to the acting replica only when there are several.
    svc = r.one("Service", f"{RELEASE}-mountguard-controller")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    sel = svc["spec"]["selector"]
    if replicas > 1:
        assert sel.pop("mountguard.io/leader") == "true"
        assert r.one("PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    else:
        assert r.of_kind("PodDisruptionBudget") == []
    assert sel.items() <= pod_labels.items()
    metrics = r.one("Service", f"{RELEASE}-mountguard-controller-metrics")
    assert metrics["spec"]["selector"].items() <= pod_labels.items()
    assert "mountguard.io/leader" not in metrics["spec"]["selector"]
    port_names = {p["name"] for p in c["ports"]}
    for s in (svc, metrics):
        for p in s["spec"]["ports"]:
            assert p["targetPort"] in port_names


def test_remediation_settings_reach_the_controller() -> None:
    r = render_scenario("remediation-on")
    env = controller_env(r)
    assert env["MOUNTGUARD_SLURM_TOKEN_SECRET"] == "slurm/slurm-token-mountguard"
    assert env["MOUNTGUARD_SLURM_TOKEN_KEY"] == "SLURM_JWT"
    assert env["MOUNTGUARD_SLURMRESTD_CA_FILE"] == "/var/run/mountguard/slurmrestd-ca/ca.crt"
    assert env["MOUNTGUARD_REMEDIATION_BUDGET_PER_NODESET"] == "1"
    assert env["MOUNTGUARD_REMEDIATION_BUDGET_CLUSTER"] == "3"
    assert env["MOUNTGUARD_ON_FAILURE"] == "keep-drained"
    assert env["MOUNTGUARD_DRAIN_TIMEOUT"] == "24h"
    assert env["MOUNTGUARD_EVICTION_TIMEOUT"] == "30m"
    assert env["MOUNTGUARD_VERIFICATION_TIMEOUT"] == "10m"
    assert env["MOUNTGUARD_REPLACE_PINNING_PODS"] == "false"
    assert env["MOUNTGUARD_DRAIN_STATE"] == "drain"
    assert env["MOUNTGUARD_ABSENT_SLURM_NODE"] == "fail"
    assert env["MOUNTGUARD_SLURM_NOT_FOUND_GRACE"] == "5m"
    # A token Secret: nothing of the jwt.key alternative.
    assert "MOUNTGUARD_SLURM_JWT_KEY_SECRET" not in env
    assert "MOUNTGUARD_SLURM_USER" not in env


def test_remediation_values_reach_the_controller() -> None:
    values = deep_merge(
        SCENARIOS["remediation-on"].values,
        {
            "remediation": {
                "evictionTimeout": "45m",
                "verificationTimeout": "2h",
                "replacePinningPods": True,
                "drainTimeout": "12h",
                "replacementTimeout": "20m",
                "delay": "90s",
                "budgetPerNodeSet": 2,
                "budgetCluster": 7,
                "onFailure": "undrain",
                "drainState": "fail",
                "absentSlurmNode": "replace",
                "slurmNotFoundGrace": "90s",
            }
        },
    )
    env = controller_env(render(values))
    assert env["MOUNTGUARD_DRAIN_STATE"] == "fail"
    assert env["MOUNTGUARD_ABSENT_SLURM_NODE"] == "replace"
    assert env["MOUNTGUARD_SLURM_NOT_FOUND_GRACE"] == "90s"
    assert env["MOUNTGUARD_EVICTION_TIMEOUT"] == "45m"
    assert env["MOUNTGUARD_VERIFICATION_TIMEOUT"] == "2h"
    assert env["MOUNTGUARD_REPLACE_PINNING_PODS"] == "true"
    assert env["MOUNTGUARD_DRAIN_TIMEOUT"] == "12h"
    assert env["MOUNTGUARD_REPLACEMENT_TIMEOUT"] == "20m"
    assert env["MOUNTGUARD_REMEDIATION_DELAY"] == "90s"
    assert env["MOUNTGUARD_REMEDIATION_BUDGET_PER_NODESET"] == "2"
    assert env["MOUNTGUARD_REMEDIATION_BUDGET_CLUSTER"] == "7"
    assert env["MOUNTGUARD_ON_FAILURE"] == "undrain"


def test_workload_remediation_needs_no_slurmrestd_and_grants_only_its_kinds() -> None:
    r = render_scenario("remediation-workloads")
    env = controller_env(r)
    assert env["MOUNTGUARD_REMEDIATION"] == "on"
    assert env["MOUNTGUARD_REMEDIATE_WORKLOADS"] == "deployment,statefulset"
    assert env["MOUNTGUARD_REMEDIATION_BUDGET_WORKLOADS"] == "3"
    for name in (
        "MOUNTGUARD_SLURMRESTD_URL",
        "MOUNTGUARD_SLURM_TOKEN_SECRET",
        "MOUNTGUARD_SLURM_JWT_KEY_SECRET",
    ):
        assert name not in env, name
    g = granted(r)
    assert workload_rules(["deployment", "statefulset"]) <= g
    assert PINNING_RULES <= g, "a Deployment's evicted pod: its node held"
    assert ("cluster", "apps", "daemonsets", "patch") not in g
    assert not SLURMRESTD_RULES & g, "no NodeSet is patched without slurmrestd"
    assert REMEDIATION_RULES <= g
    # With NodeSets too, and a budget of its own.
    both = render(
        deep_merge(
            SCENARIOS["remediation-on"].values,
            {"remediation": {"workloads": {"kinds": ["daemonset"], "budget": 5}}},
        )
    )
    env = controller_env(both)
    assert env["MOUNTGUARD_REMEDIATE_WORKLOADS"] == "daemonset"
    assert env["MOUNTGUARD_REMEDIATION_BUDGET_WORKLOADS"] == "5"
    assert env["MOUNTGUARD_SLURMRESTD_URL"]
    g = granted(both)
    assert SLURMRESTD_RULES <= g and workload_rules(["daemonset"]) <= g
    assert ("cluster", "apps", "deployments", "get") not in g
    assert PINNING_RULES <= g, "a DaemonSet's evicted pod: its node held"
    # Remediation off: nothing of it, whatever the kinds say.
    off = render({"remediation": {"workloads": {"kinds": ["deployment"]}}})
    assert "MOUNTGUARD_REMEDIATE_WORKLOADS" not in controller_env(off)
    assert not workload_rules(["deployment"]) & granted(off)


def test_remediation_flags_are_absent_when_remediation_is_off() -> None:
    # The default render leaves every remediation flag at the controller's
    # own default (off), even with remediation values set.
    for values in ({}, {"remediation": {"replacePinningPods": True, "evictionTimeout": "1h"}}):
        env = controller_env(render(values))
        assert env["MOUNTGUARD_REMEDIATION"] == "off"
        for name in (
            "MOUNTGUARD_SLURMRESTD_URL",
            "MOUNTGUARD_SLURM_TOKEN_SECRET",
            "MOUNTGUARD_SLURM_TOKEN_KEY",
            "MOUNTGUARD_SLURM_JWT_KEY_SECRET",
            "MOUNTGUARD_SLURM_USER",
            "MOUNTGUARD_EVICTION_TIMEOUT",
            "MOUNTGUARD_VERIFICATION_TIMEOUT",
            "MOUNTGUARD_REPLACE_PINNING_PODS",
            "MOUNTGUARD_DRAIN_STATE",
            "MOUNTGUARD_ABSENT_SLURM_NODE",
            "MOUNTGUARD_SLURM_NOT_FOUND_GRACE",
        ):
            assert name not in env, (values, name)


def test_token_secret_namespace_defaults_to_the_release_namespace() -> None:
    env = controller_env(render_scenario("remediation-dry-run"))
    assert env["MOUNTGUARD_SLURM_TOKEN_SECRET"] == f"{NAMESPACE}/slurm-token"
    assert env["MOUNTGUARD_SLURM_TOKEN_KEY"] == "SLURM_JWT"
    assert "MOUNTGUARD_SLURM_JWT_KEY_SECRET" not in env


def test_jwt_key_secret_replaces_the_token_secret() -> None:
    r = render_scenario("remediation-jwt-key")
    env = controller_env(r)
    assert env["MOUNTGUARD_SLURM_JWT_KEY_SECRET"] == "slurm/slurm-auth-jwt"
    assert env["MOUNTGUARD_SLURM_USER"] == "mountguard"
    # Exactly one of the two: the controller refuses both.
    assert "MOUNTGUARD_SLURM_TOKEN_SECRET" not in env
    assert "MOUNTGUARD_SLURM_TOKEN_KEY" not in env
    # Nothing is mounted: the controller reads the Secret through the API.
    pod = r.one("Deployment")["spec"]["template"]["spec"]
    assert not any(
        v.get("secret", {}).get("secretName") == "slurm-auth-jwt" for v in pod["volumes"]
    )

    # Defaults: the release namespace and the Slurm user `slurm`.
    env = controller_env(render({"remediation": {"mode": "on", "slurmrestd": {
        "url": "http://slurmrestd:6820", "jwtKeySecret": {"name": "slurm-auth-jwt"},
    }}}))
    assert env["MOUNTGUARD_SLURM_JWT_KEY_SECRET"] == f"{NAMESPACE}/slurm-auth-jwt"
    assert env["MOUNTGUARD_SLURM_USER"] == "slurm"
    assert "MOUNTGUARD_SLURM_TOKEN_SECRET" not in env


def test_rbac_lets_the_controller_get_the_jwt_key_secret() -> None:
    # The controller GETs the Secret in its own namespace (here `slurm`, not
    # the release namespace): a cluster-wide grant without resourceNames.
    r = render_scenario("remediation-jwt-key")
    assert ("cluster", "", "secrets", "get") in granted(r)
    for role in r.of_kind("ClusterRole"):
        for rule in role["rules"]:
            if "secrets" in rule["resources"]:
                assert "resourceNames" not in rule, rule


def test_report_rate_limit_reaches_the_controller() -> None:
    assert controller_env(render())["MOUNTGUARD_REPORT_RATE_LIMIT"] == "2/s,5"
    env = controller_env(render({"controller": {"reportRateLimit": "0.5/s,10"}}))
    assert env["MOUNTGUARD_REPORT_RATE_LIMIT"] == "0.5/s,10"
    env = controller_env(render({"controller": {"reportRateLimit": "20/s"}}))
    assert env["MOUNTGUARD_REPORT_RATE_LIMIT"] == "20/s"


def run_arg_defaults() -> dict[str, str]:
    """MOUNTGUARD_* env name -> default of `mountguard-controller run`."""
    # The flags of `run` are defined beside their conversion into settings.
    src = (REPO / "controller-shim" / "src" / "settings.rs").read_text()
    out = {}
    for attr in re.findall(r"#\[arg\((.*?)\)\]\s*pub ", src, re.S):
        env = re.search(r'env = "(MOUNTGUARD_[A-Z_]+)"', attr)
        default = re.search(r'default_value = "([^"]*)"|default_value_t = ([\w.]+)', attr)
        if env and default:
            out[env.group(1)] = default.group(1) if default.group(1) is not None else default.group(2)
    return out


def test_chart_defaults_are_the_controller_defaults() -> None:
    # The new values default to what the controller would use without them.
    defaults = run_arg_defaults()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    r, c = values["remediation"], values["controller"]
    assert defaults["MOUNTGUARD_REPORT_RATE_LIMIT"] == c["reportRateLimit"]
    assert defaults["MOUNTGUARD_MAX_CONNECTIONS"] == str(c["maxConnections"])
    assert defaults["MOUNTGUARD_HEADER_READ_TIMEOUT"] == c["headerReadTimeout"]
    assert defaults["MOUNTGUARD_IDLE_TIMEOUT"] == c["idleTimeout"]
    assert defaults["MOUNTGUARD_STATUS_AUTH"] == c["statusAuth"]
    assert defaults["MOUNTGUARD_REPORT_BODY_TIMEOUT"] == c["reportBodyTimeout"]
    env = controller_env(render())
    assert env["MOUNTGUARD_MAX_CONNECTIONS"] == "10000"
    assert env["MOUNTGUARD_HEADER_READ_TIMEOUT"] == "10s"
    assert defaults["MOUNTGUARD_EVICTION_TIMEOUT"] == r["evictionTimeout"]
    assert defaults["MOUNTGUARD_NODE_HOLD_TIMEOUT"] == r["nodeHoldTimeout"]
    assert defaults["MOUNTGUARD_VERIFICATION_TIMEOUT"] == r["verificationTimeout"]
    assert defaults["MOUNTGUARD_REPLACE_PINNING_PODS"] == str(r["replacePinningPods"]).lower()
    assert defaults["MOUNTGUARD_DRAIN_STATE"] == r["drainState"]
    assert defaults["MOUNTGUARD_ABSENT_SLURM_NODE"] == r["absentSlurmNode"]
    assert defaults["MOUNTGUARD_SLURM_NOT_FOUND_GRACE"] == r["slurmNotFoundGrace"]
    assert defaults["MOUNTGUARD_SLURM_USER"] == r["slurmrestd"]["user"]
    assert defaults["MOUNTGUARD_SLURM_TOKEN_KEY"] == r["slurmrestd"]["tokenSecret"]["key"]
    assert defaults["MOUNTGUARD_DRAIN_TIMEOUT"] == r["drainTimeout"]
    assert defaults["MOUNTGUARD_REPLACEMENT_TIMEOUT"] == r["replacementTimeout"]


def test_watch_namespaces_are_joined() -> None:
    env = controller_env(render_scenario("replicas-2"))
    assert env["MOUNTGUARD_WATCH_NAMESPACES"] == "slurm,hpc"
    # Empty means all: the variable is not set at all.
    assert "MOUNTGUARD_WATCH_NAMESPACES" not in controller_env(render())
    assert "MOUNTGUARD_POD_SELECTOR" not in controller_env(render())
    sel = controller_env(render({"controller": {"podSelector": "app in (slurmd)"}}))
    assert sel["MOUNTGUARD_POD_SELECTOR"] == "app in (slurmd)"


# The controller's flags as agreed for `mountguard-controller run` (every flag
# also read from MOUNTGUARD_<FLAG>), plus the global log flags.
CONTROLLER_CONTRACT = {
    "MOUNTGUARD_" + f.upper().replace("-", "_")
    for f in """watch-namespaces pod-selector report-listen tls-cert-file tls-key-file
    insecure-plaintext-reports metrics-listen status-auth token-audience agent-service-account
    agent-daemonset grace inventory-max-age fingerprint-key-file max-report-bytes
    leader-election lease-name pod-name pod-namespace remediation slurmrestd-url
    slurmrestd-ca-file slurm-token-secret slurm-token-key slurm-jwt-key-secret slurm-user
    remediation-budget-per-nodeset remediation-budget-cluster remediation-delay drain-timeout
    replacement-timeout eviction-timeout node-hold-timeout verification-timeout
    slurm-not-found-grace on-failure
    replace-pinning-pods
    drain-state absent-slurm-node remediate-workloads remediation-budget-workloads
    report-rate-limit report-body-timeout max-connections header-read-timeout idle-timeout
    admission-listen admission-mode admission-tls-cert-file admission-tls-key-file
    admission-answer-timeout admission-client-ca-file log log-format""".split()
}


# The controller's allocator settings (controller-shim/src/main.rs): read by
# mimalloc, not flags.
ALLOCATOR_ENV = {"MIMALLOC_PURGE_DELAY": "0", "MIMALLOC_ARENA_EAGER_COMMIT": "0"}


def test_controller_allocator_settings() -> None:
    main = (REPO / "controller-shim" / "src" / "main.rs").read_text()
    assert "static ALLOC: mimalloc::MiMalloc" in main
    for name in SCENARIOS:
        env = controller_env(render_scenario(name))
        assert {k: env.get(k) for k in ALLOCATOR_ENV} == ALLOCATOR_ENV, name


def test_controller_environment_names_are_controller_flags() -> None:
    used: set[str] = set()
    for name in SCENARIOS:
        used |= set(controller_env(render_scenario(name))) - extra_env_names(name)
    used -= set(ALLOCATOR_ENV)
    assert used - CONTROLLER_CONTRACT == set(), "not a controller flag"
    declared = set()
    for src in (REPO / "controller-shim" / "src").rglob("*.rs"):
        declared |= set(re.findall(r'env = "(MOUNTGUARD_[A-Z_]+)"', src.read_text()))
    if "MOUNTGUARD_REPORT_LISTEN" in declared:
        # The live controller's flags exist: the chart may set only those.
        assert used - declared == set(), "the controller does not read these"


# ---------------------------------------------------------------- RBAC


READER_ROLE = f"{RELEASE}-mountguard-reader"
STATUS_READER = f"{RELEASE}-mountguard-status-reader"


def granted(r: Any) -> set[tuple[str, str, str, str]]:
    # The reader ClusterRole is for people (bound by the operator), not
    # the controller: see test_reader_role_grants_only_the_metrics_service_proxy.
    # So is the status reader's (test_status_reader_may_only_get_verdicts).
    people = {READER_ROLE, STATUS_READER}
    roles = {
        ("cluster", o["metadata"]["name"]): o
        for o in r.of_kind("ClusterRole")
        if o["metadata"]["name"] not in people
    }
    roles |= {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in r.of_kind("Role")}
    out = set()
    for b in r.of_kind("ClusterRoleBinding") + r.of_kind("RoleBinding"):
        if b["metadata"]["name"] == STATUS_READER:
            continue
        assert b["subjects"] == [
            {"kind": "ServiceAccount", "name": CONTROLLER_SA, "namespace": NAMESPACE}
        ], b
        ref = b["roleRef"]
        scope = "cluster" if b["kind"] == "ClusterRoleBinding" else b["metadata"]["namespace"]
        assert ref["kind"] == ("ClusterRole" if scope == "cluster" else "Role"), b
        role = roles.pop(("cluster" if ref["kind"] == "ClusterRole" else scope, ref["name"]))
        for rule in role["rules"]:
            assert set(rule) <= {"apiGroups", "resources", "verbs"}, rule
            for g in rule["apiGroups"]:
                for res in rule["resources"]:
                    for v in rule["verbs"]:
                        assert "*" not in (g, res, v), rule
                        out.add((scope, g, res, v))
    assert roles == {}, f"roles bound to nobody: {list(roles)}"
    return out


def test_rbac_is_exactly_the_documented_list(scenario: tuple[str, Any]) -> None:
    name, r = scenario
    dep = r.one("Deployment")
    expected = set(BASE_RULES)
    env = controller_env(r)
    if env["MOUNTGUARD_REMEDIATION"] != "off":
        expected |= REMEDIATION_RULES
        if "MOUNTGUARD_SLURMRESTD_URL" in env:
            expected |= SLURMRESTD_RULES
        kinds = [k for k in env.get("MOUNTGUARD_REMEDIATE_WORKLOADS", "").split(",") if k]
        if env.get("MOUNTGUARD_REPLACE_PINNING_PODS") == "true" or {
            "deployment",
            "replicaset",
            "daemonset",
        } & set(kinds):
            expected |= PINNING_RULES
        expected |= workload_rules(kinds)
    if dep["spec"]["replicas"] > 1:
        expected |= LEADER_RULES
    if env["MOUNTGUARD_STATUS_AUTH"] == "kubernetes":
        expected |= STATUS_AUTH_RULES
    assert granted(r) == expected


def test_reader_role_grants_only_the_metrics_service_proxy() -> None:
    assert READER_ROLE not in {o["metadata"]["name"] for o in render().of_kind("ClusterRole")}
    r = render({"rbac": {"readerRole": {"create": True}}})
    role = r.one("ClusterRole", READER_ROLE)
    metrics_svc = next(
        s["metadata"]["name"]
        for s in r.of_kind("Service")
        if s["metadata"]["name"].endswith("-controller-metrics")
    )
    # get on services/proxy of that one Service: what `kubectl mountguard`
    # needs to reach /v1/verdicts and /v1/rollouts through the API server.
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["services/proxy"],
            "resourceNames": [metrics_svc],
            "verbs": ["get"],
        },
        # What the status API's SubjectAccessReview asks for, in the
        # namespace a request reads.
        {"apiGroups": ["mountguard.io"], "resources": ["verdicts"], "verbs": ["get"]},
    ]
    port_names = [p["name"] for p in r.one("Service", metrics_svc)["spec"]["ports"]]
    assert port_names == ["metrics"], "the plugin's default --controller-port"
    # No binding: the operator binds it to people.
    for b in r.of_kind("ClusterRoleBinding") + r.of_kind("RoleBinding"):
        assert b["roleRef"]["name"] != READER_ROLE, b


def test_status_reader_may_only_get_verdicts() -> None:
    r = render()
    sa = r.one("ServiceAccount", STATUS_READER)
    assert sa["automountServiceAccountToken"] is False
    role = r.one("ClusterRole", STATUS_READER)
    assert role["rules"] == [
        {"apiGroups": ["mountguard.io"], "resources": ["verdicts"], "verbs": ["get"]}
    ]
    b = r.one("ClusterRoleBinding", STATUS_READER)
    assert b["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": STATUS_READER,
    }
    assert b["subjects"] == [
        {"kind": "ServiceAccount", "name": STATUS_READER, "namespace": NAMESPACE}
    ]
    # The plugin derives the name from the metrics Service's
    # (controller-shim/src/query/endpoint.rs, status_reader_account).
    assert r.one("Service", f"{RELEASE}-mountguard-controller-metrics")
    for values in (
        {"controller": {"statusAuth": "none"}},
        {"rbac": {"statusReader": {"create": False}}},
    ):
        names = {o["metadata"]["name"] for o in render(values).objects}
        assert STATUS_READER not in names, values
    env = controller_env(render({"controller": {"statusAuth": "none"}}))
    assert env["MOUNTGUARD_STATUS_AUTH"] == "none"
    assert controller_env(render())["MOUNTGUARD_STATUS_AUTH"] == "kubernetes"


def test_documented_rbac_list_matches_the_tests() -> None:
    # docs/security.md lists the permissions in a table; keep both in step.
    doc = (REPO / "docs" / "security.md").read_text()
    rows = set()
    for line in doc.splitlines():
        m = re.match(r"\|\s*`([^`]*)`\s*\|\s*`([^`]+)`\s*\|\s*([a-z, ]+)\|\s*(\w+)", line)
        if m:
            group, res, verbs, when = m.groups()
            group = "" if group == "core" else group
            for v in verbs.split(","):
                rows.add((group, res, v.strip(), when))
    everything = (
        {(g, res, v, "always") for _, g, res, v in BASE_RULES}
        | {(g, res, v, "remediation") for _, g, res, v in REMEDIATION_RULES}
        | {(g, res, v, "slurmrestd") for _, g, res, v in SLURMRESTD_RULES}
        | {(g, res, v, "workloads") for _, g, res, v in workload_rules(list(WORKLOAD_RESOURCES))}
        | {(g, res, v, "leader") for _, g, res, v in LEADER_RULES}
        | {(g, res, v, "nodeHold") for _, g, res, v in PINNING_RULES}
        | {(g, res, v, "statusAuth") for _, g, res, v in STATUS_AUTH_RULES}
    )
    assert rows == everything


def test_nodes_may_be_patched_only_to_hold_them() -> None:
    on = SCENARIOS["remediation-on"].values
    assert not PINNING_RULES & granted(render(on))
    with_pinning = render(deep_merge(on, {"remediation": {"replacePinningPods": True}}))
    assert PINNING_RULES <= granted(with_pinning)
    for kinds, held in ((["replicaset"], True), (["daemonset"], True), (["statefulset"], False)):
        r = render(deep_merge(on, {"remediation": {"workloads": {"kinds": kinds}}}))
        assert bool(PINNING_RULES & granted(r)) == held, kinds
    # Never without remediation, whatever replacePinningPods or the kinds say.
    off = {"remediation": {"replacePinningPods": True, "workloads": {"kinds": ["deployment"]}}}
    assert not PINNING_RULES & granted(render(off))


# ---------------------------------------------------------------- TLS


def test_cert_manager_certificate_covers_the_service_name() -> None:
    r = render()
    certs = {c["metadata"]["name"]: c for c in r.of_kind("Certificate")}
    serving = certs[f"{RELEASE}-mountguard-controller"]
    host = f"{RELEASE}-mountguard-controller.{NAMESPACE}.svc"
    assert host in serving["spec"]["dnsNames"]
    assert serving["spec"]["usages"] == ["server auth"]
    assert serving["spec"]["issuerRef"]["name"] == f"{RELEASE}-mountguard-ca"
    ca = certs[f"{RELEASE}-mountguard-ca"]
    assert ca["spec"]["isCA"] is True
    issuers = {i["metadata"]["name"]: i["spec"] for i in r.of_kind("Issuer")}
    assert issuers[f"{RELEASE}-mountguard-ca"] == {"ca": {"secretName": ca["spec"]["secretName"]}}
    assert "selfSigned" in issuers[f"{RELEASE}-mountguard-selfsigned"]
    for o in certs.values():
        assert o["apiVersion"] == "cert-manager.io/v1"
    # The agents trust what the controller serves: same Secret.
    dep_vols = r.one("Deployment")["spec"]["template"]["spec"]["volumes"]
    tls_secret = [v["secret"]["secretName"] for v in dep_vols if v["name"] == "tls"]
    assert tls_secret == [serving["spec"]["secretName"]]
    agent_ca = [
        s["secret"]["name"]
        for v in agent_pod(r)["volumes"] if "projected" in v
        for s in v["projected"]["sources"] if "secret" in s
    ]
    assert agent_ca == tls_secret


def test_user_secret_replaces_cert_manager() -> None:
    r = render_scenario("tls-user-secret")
    assert [o for o in r.objects if o["apiVersion"].startswith("cert-manager.io")] == []
    dep_vols = r.one("Deployment")["spec"]["template"]["spec"]["volumes"]
    assert [v["secret"]["secretName"] for v in dep_vols if v["name"] == "tls"] == [
        "mountguard-report-tls"
    ]


def test_cluster_issuer_is_used_without_a_private_ca() -> None:
    r = render_scenario("tls-cluster-issuer")
    cert = r.one("Certificate", f"{RELEASE}-mountguard-controller")
    assert cert["spec"]["issuerRef"] == {
        "name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"
    }
    assert r.of_kind("Issuer") == []


# ---------------------------------------------------------------- monitoring


def test_monitoring_objects_only_when_enabled_and_api_present(
    scenario: tuple[str, Any],
) -> None:
    name, r = scenario
    s = SCENARIOS[name]
    api = MONITORING_API in s.api_versions
    metrics = s.values.get("metrics", {})
    for kind, key in (
        ("ServiceMonitor", "serviceMonitor"),
        ("PodMonitor", "podMonitor"),
        ("PrometheusRule", "prometheusRule"),
    ):
        on = metrics.get(key, {}).get("enabled", False)
        count = len(r.of_kind(kind))
        assert count == ((1 if kind == "PrometheusRule" else 2) if (on and api) else 0), kind
    if any(m.get("enabled") for m in metrics.values()) and not api:
        assert "API is not served" in r.notes


@pytest.mark.parametrize("name", ["monitoring-with-api", "podmonitor-with-api"])
def test_monitors_select_the_metrics_ports(name: str) -> None:
    r = render_scenario(name)
    assert r.of_kind("ServiceMonitor") or r.of_kind("PodMonitor")
    services = r.of_kind("Service")
    workloads = {
        "agent": r.one("DaemonSet")["spec"]["template"],
        "controller": r.one("Deployment")["spec"]["template"],
    }
    for sm in r.of_kind("ServiceMonitor"):
        assert sm["apiVersion"] == MONITORING_API
        sel = sm["spec"]["selector"]["matchLabels"]
        (svc,) = [s for s in services if sel.items() <= s["metadata"]["labels"].items()]
        (ep,) = sm["spec"]["endpoints"]
        assert ep["port"] in {p["name"] for p in svc["spec"]["ports"]}
        assert sm["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    for pm in r.of_kind("PodMonitor"):
        sel = pm["spec"]["selector"]["matchLabels"]
        (tpl,) = [t for t in workloads.values() if sel.items() <= t["metadata"]["labels"].items()]
        (ep,) = pm["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for c in tpl["spec"]["containers"] for p in c["ports"]}
        assert ep["port"] in ports
    # The controller's metrics carry the checked pods' namespace/pod labels.
    for mon in r.of_kind("ServiceMonitor") + r.of_kind("PodMonitor"):
        eps = mon["spec"].get("endpoints") or mon["spec"]["podMetricsEndpoints"]
        is_controller = mon["metadata"]["labels"]["app.kubernetes.io/component"] == "controller"
        assert eps[0].get("honorLabels", False) is is_controller


def alert_rules(r: Any) -> list[dict[str, Any]]:
    (rule,) = r.of_kind("PrometheusRule")
    assert rule["apiVersion"] == MONITORING_API
    return [x for g in rule["spec"]["groups"] for x in g["rules"]]


EXPECTED_ALERTS = {
    "MountguardStaleMount",
    "MountguardKubeletCachePinned",
    "MountguardFrozenMount",
    "MountguardAgentNotReporting",
    "MountguardAgentCannotRead",
    "MountguardControllerDown",
    "MountguardRemediationFailed",
    "MountguardRemediationUnresolved",
    "MountguardRemediationStuck",
    "MountguardReportRejections",
}


def test_alerts_have_annotations_and_runbooks_that_exist() -> None:
    rules = alert_rules(render_scenario("monitoring-with-api"))
    names = [x["alert"] for x in rules]
    assert sorted(names) == sorted(EXPECTED_ALERTS)
    base = "https://github.com/mountguard/mountguard/blob/main/docs/runbooks/"
    linked = set()
    for x in rules:
        a = x["annotations"]
        assert set(a) == {"summary", "description", "runbook_url"}, x["alert"]
        assert a["summary"].strip() and a["description"].strip()
        assert a["runbook_url"].startswith(base), a["runbook_url"]
        page = RUNBOOKS / a["runbook_url"][len(base):]
        assert page.is_file(), f"{x['alert']}: {page} does not exist"
        assert x["alert"] in page.read_text(), f"{page} does not name {x['alert']}"
        linked.add(page.name)
        assert x["labels"]["severity"] in {"info", "warning", "critical"}
        assert re.fullmatch(r"\d+[smh]", x["for"]), x
        assert re.search(r"\bmountguard_[a-z_]+", x["expr"]), x
    on_disk = {p.name for p in RUNBOOKS.glob("*.md")} - {"README.md"}
    assert on_disk == linked, "every runbook page belongs to an alert"


def test_alert_severities_and_frozen_is_info() -> None:
    rules = {x["alert"]: x for x in alert_rules(render_scenario("monitoring-with-api"))}
    assert rules["MountguardFrozenMount"]["labels"]["severity"] == "info"
    assert rules["MountguardControllerDown"]["labels"]["severity"] == "critical"
    assert 'namespace="mountguard-system"' in rules["MountguardControllerDown"]["expr"]
    # Pinned caches have their own alert; the stale alert leaves them out.
    assert 'cause!="ImmutableCachePinned"' in rules["MountguardStaleMount"]["expr"]
    assert 'cause="ImmutableCachePinned"' in rules["MountguardKubeletCachePinned"]["expr"]


def test_remediation_stuck_threshold_follows_the_timeouts() -> None:
    def threshold(values: dict[str, Any]) -> int:
        v = deep_merge({"metrics": {"prometheusRule": {"enabled": True}}}, values)
        rules = {x["alert"]: x for x in alert_rules(render(v, [MONITORING_API]))}
        return int(rules["MountguardRemediationStuck"]["expr"].rsplit(">", 1)[1])

    # delay 5m + drain 24h + eviction 30m + replacement 15m + verification
    # 10m + slack 30m
    assert threshold({}) == 300 + 86400 + 1800 + 900 + 600 + 1800
    assert threshold({"remediation": {"drainTimeout": "2h", "replacementTimeout": "600s"}}) == (
        300 + 7200 + 1800 + 600 + 600 + 1800
    )
    assert threshold({"remediation": {"evictionTimeout": "1h", "verificationTimeout": "20m"}}) == (
        300 + 86400 + 3600 + 900 + 1200 + 1800
    )


def test_alert_labels_and_runbook_base_are_configurable() -> None:
    v = {
        "metrics": {
            "prometheusRule": {
                "enabled": True,
                "runbookBaseURL": "https://wiki.example/mg/",
                "alertLabels": {"team": "hpc"},
                "additionalLabels": {"release": "kube-prometheus-stack"},
            }
        }
    }
    r = render(v, [MONITORING_API])
    (rule,) = r.of_kind("PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    for x in alert_rules(r):
        assert x["labels"]["team"] == "hpc"
        assert x["annotations"]["runbook_url"].startswith("https://wiki.example/mg/mountguard-")


# ---------------------------------------------------------------- everything


def test_every_object_is_namespaced_to_the_release_or_cluster_scoped(
    scenario: tuple[str, Any],
) -> None:
    _, r = scenario
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingWebhookConfiguration",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for o in r.objects:
        md = o["metadata"]
        if o["kind"] in cluster_scoped:
            assert "namespace" not in md, o["kind"]
        else:
            assert md["namespace"] == NAMESPACE, (o["kind"], md["name"])
        assert md["labels"]["app.kubernetes.io/instance"] == RELEASE
        assert len(md["name"]) <= 63


def test_images_default_to_app_version() -> None:
    r = render()
    app = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    (a,) = agent_pod(r)["containers"]
    (c,) = r.one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert a["image"] == f"ghcr.io/mountguard/mountguard-agent:{app}"
    assert c["image"] == f"ghcr.io/mountguard/mountguard-controller:{app}"
    r = render({"image": {"tag": "1.2.3"}, "agent": {"image": {"tag": "dev"}}})
    (a,) = agent_pod(r)["containers"]
    (c,) = r.one("Deployment")["spec"]["template"]["spec"]["containers"]
    assert a["image"].endswith(":dev") and c["image"].endswith(":1.2.3")


def test_notes_tell_what_to_check() -> None:
    notes = render().notes
    assert f"kubectl -n {NAMESPACE} get daemonset {RELEASE}-mountguard-agent" in notes
    assert "report_requests_total" in notes
    assert "Remediation: off" in notes
    assert "WARNING" in render_scenario("plaintext").notes


def test_error_hint_a_bad_duration_says_what_a_duration_is() -> None:
    # issue 31 §3: Helm prints only the pattern of a value that does not
    # match; the pattern's group name spells out the grammar.
    with pytest.raises(helm_python.HelmValuesError) as e:
        chart().validate_schema({"agent": {"rescanInterval": "5 minutes"}})
    msg = str(e.value)
    assert "/agent/rescanInterval" in msg and "'5 minutes'" in msg, msg
    assert "whole_number_then_ms_s_m_or_h__like_250ms_60s_5m_1h" in msg, msg


def test_exec_into_the_agent_is_refused_by_a_policy_bound_to_the_release_namespace() -> None:
    r = render()
    policy = r.one("ValidatingAdmissionPolicy")
    binding = r.one("ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert binding["spec"]["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}
    }
    assert policy["spec"]["failurePolicy"] == "Fail"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert {(op, res) for rule in rules for op in rule["operations"] for res in rule["resources"]} == {
        ("CONNECT", "pods/exec"),
        ("CONNECT", "pods/attach"),
        ("UPDATE", "pods/ephemeralcontainers"),
    }
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    # The agent DaemonSet's pods are named after it.
    ds = r.one("DaemonSet")
    assert f'request.name.startsWith("{ds["metadata"]["name"]}-")' in variables["agentPod"]
    assert ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "agent"
    assert variables["excepted"].endswith("g in [])")


def test_an_ephemeral_container_into_a_relabelled_agent_pod_is_matched_by_name_as_exec_is() -> None:
    # An agent pod relabelled (orphaned from its DaemonSet, still running
    # with the kubelet root) keeps its name: the one rule for exec, attach
    # and ephemeral containers is the name the request carries, never the
    # pod's labels, which whoever may patch pods here can change.
    r = render()
    policy = r.one("ValidatingAdmissionPolicy")
    ds = r.one("DaemonSet")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["agentPod"] == f'request.name.startsWith("{ds["metadata"]["name"]}-")'
    for v in policy["spec"]["variables"] + policy["spec"]["validations"]:
        text = v.get("expression", "")
        assert "labels" not in text and "object." not in text, text


def test_exec_policy_break_glass_groups_and_off() -> None:
    r = render({"agent": {"denyExec": {"exceptGroups": ["system:masters"]}}})
    policy = r.one("ValidatingAdmissionPolicy")
    variables = {v["name"]: v["expression"] for v in policy["spec"]["variables"]}
    assert variables["excepted"].endswith('g in ["system:masters"])')
    off = render({"agent": {"denyExec": {"enabled": False}}})
    assert off.of_kind("ValidatingAdmissionPolicy") == []
    assert off.of_kind("ValidatingAdmissionPolicyBinding") == []
