"""Renders charts/mountguard with the real Helm engine (PyPI helm-python-sdk).

Used by test_chart.py and, through the command line, by the Rust test
tests/tests/chart.rs, which parses the rendered objects into k8s-openapi
types:

    python3 charts/tests/render.py --out DIR

writes DIR/<scenario>/<NN>-<Kind>-<name>.json, one object per file, for
every scenario below.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from dataclasses import dataclass, field
from typing import Any

import helm_python
import yaml
from helm_python import _native

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "mountguard"
RELEASE = "mg"
NAMESPACE = "mountguard-system"
KUBE_VERSION = "v1.37.0"
MONITORING_API = "monitoring.coreos.com/v1"


@dataclass
class Scenario:
    """One combination of values and cluster capabilities."""

    values: dict[str, Any] = field(default_factory=dict)
    api_versions: list[str] = field(default_factory=list)


SLURMRESTD = {
    "url": "http://slurm-restapi.slurm.svc.cluster.local:6820",
    "tokenSecret": {"namespace": "slurm", "name": "slurm-token-mountguard", "key": "SLURM_JWT"},
    "caSecret": {"name": "slurmrestd-ca", "key": "ca.crt"},
}
# The alternative to a token Secret: slurmctld's jwt.key (Slinky's
# slurm-auth-jwt), from which the controller mints its own tokens.
SLURMRESTD_JWT_KEY = {
    "url": SLURMRESTD["url"],
    "jwtKeySecret": {"namespace": "slurm", "name": "slurm-auth-jwt"},
    "user": "mountguard",
}
# ServiceMonitors or PodMonitors (never both: the render fails), and the rules.
ALL_MONITORING = {
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
}
POD_MONITORING = {
    "podMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
}

SCENARIOS: dict[str, Scenario] = {
    "default": Scenario(),
    "remediation-on": Scenario({"remediation": {"mode": "on", "slurmrestd": SLURMRESTD}}),
    "remediation-dry-run": Scenario(
        {
            "remediation": {
                "mode": "dry-run",
                # Namespace left empty: the release namespace.
                "slurmrestd": {"url": SLURMRESTD["url"], "tokenSecret": {"name": "slurm-token"}},
            }
        }
    ),
    # Workloads only: no slurmrestd.
    "remediation-workloads": Scenario(
        {"remediation": {"mode": "on", "workloads": {"kinds": ["deployment", "statefulset"]}}}
    ),
    "remediation-jwt-key": Scenario(
        {"remediation": {"mode": "on", "slurmrestd": SLURMRESTD_JWT_KEY}}
    ),
    "tls-user-secret": Scenario(
        {"tls": {"certManager": {"enabled": False}, "existingSecret": "mountguard-report-tls"}}
    ),
    "tls-cluster-issuer": Scenario(
        {"tls": {"certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer"}}}}
    ),
    "plaintext": Scenario({"tls": {"insecurePlaintextReports": True}}),
    # What tests/tests/real runs workload remediation with: reports over
    # plain HTTP, remediation on for every workload kind, no slurmrestd.
    "rig-workloads": Scenario(
        {
            "tls": {"insecurePlaintextReports": True},
            "remediation": {
                "mode": "on",
                "workloads": {
                    "kinds": ["deployment", "replicaset", "statefulset", "daemonset"]
                },
            },
        }
    ),
    # What tests/tests/real runs remediation with: reports over plain HTTP
    # (no cert-manager there), remediation on with slurmctld's jwt.key, two
    # replicas (leader election on a real Lease).
    "rig-remediation": Scenario(
        {
            "tls": {"insecurePlaintextReports": True},
            "controller": {"replicas": 2},
            "remediation": {"mode": "on", "slurmrestd": SLURMRESTD_JWT_KEY},
        }
    ),
    "monitoring-with-api": Scenario(
        {"metrics": ALL_MONITORING, "dashboard": {"enabled": True}}, [MONITORING_API]
    ),
    "podmonitor-with-api": Scenario({"metrics": POD_MONITORING}, [MONITORING_API]),
    "monitoring-without-api": Scenario({"metrics": ALL_MONITORING}),
    # Every escape hatch at once (test_escape_hatches.py).
    "escape-hatches": Scenario(
        {
            "global": {"imageRegistry": "registry.example.com/mirror"},
            "agent": {
                "image": {"digest": "sha256:" + "a" * 64},
                "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
                "extraArgs": ["--log-format=text"],
                "extraVolumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
                "extraVolumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                "podSecurityContext": {"seLinuxOptions": {"type": "spc_t"}},
                "securityContext": {"seLinuxOptions": {"type": "spc_t"}},
                "topologySpreadConstraints": [],
                "nodeSelector": {"kubernetes.io/os": "linux", "mountguard": "yes"},
                "podLabels": {"team": "hpc"},
                "podAnnotations": {"example.com/note": "agent"},
            },
            "controller": {
                "image": {"tag": "0.9.9"},
                "extraEnv": [{"name": "RUST_BACKTRACE", "value": "1"}],
                "extraArgs": ["--log-format=text"],
                "extraVolumes": [{"name": "extra-ca", "configMap": {"name": "corp-ca"}}],
                "extraVolumeMounts": [
                    {"name": "extra-ca", "mountPath": "/etc/corp-ca", "readOnly": True}
                ],
                "podSecurityContext": {"runAsUser": 10001, "runAsGroup": 10001, "fsGroup": 10001},
                "securityContext": {"capabilities": {"drop": ["ALL", "NET_RAW"]}},
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "topology.kubernetes.io/zone",
                        "whenUnsatisfiable": "ScheduleAnyway",
                        "labelSelector": {
                            "matchLabels": {"app.kubernetes.io/component": "controller"}
                        },
                    }
                ],
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [
                                    {"key": "node-role.kubernetes.io/infra", "operator": "Exists"}
                                ]}
                            ]
                        }
                    }
                },
                "nodeSelector": {"kubernetes.io/os": "linux", "pool": "infra"},
                "podLabels": {"team": "hpc"},
                "podAnnotations": {"example.com/note": "controller"},
            },
            "metrics": {
                "serviceMonitor": {
                    "enabled": True,
                    "relabelings": [
                        {"targetLabel": "cluster", "replacement": "hpc-1", "action": "replace"}
                    ],
                    "metricRelabelings": [
                        {"sourceLabels": ["__name__"], "regex": "mountguard_agent_watch_.*",
                         "action": "drop"}
                    ],
                },
                "prometheusRule": {
                    "enabled": True,
                    "disabled": {"MountguardFrozenMount": True},
                    "extraRules": [
                        {"record": "mountguard:stale_mounts:count",
                         "expr": 'count(mountguard_mount_state{state="Stale"})'}
                    ],
                },
            },
        },
        [MONITORING_API],
    ),
    "network-policy": Scenario(
        {"networkPolicy": {"enabled": True, "metrics": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }}}
    ),
    "replicas-2": Scenario(
        {
            "controller": {"replicas": 2, "watchNamespaces": ["slurm", "hpc"]},
            "remediation": {
                "mode": "on",
                "slurmrestd": {"url": SLURMRESTD["url"], "tokenSecret": SLURMRESTD["tokenSecret"]},
            },
            "metrics": {"prometheusRule": {"enabled": True}},
        },
        [MONITORING_API],
    ),
}


def chart(path: pathlib.Path | None = None) -> helm_python.Chart:
    """The chart directory, or a packaged chart archive."""
    return helm_python.Chart.load(path or CHART)


def render_raw(
    values: dict[str, Any] | None = None,
    api_versions: list[str] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    chart_path: pathlib.Path | None = None,
) -> dict[str, str]:
    """Template path -> rendered text, like `helm template --api-versions`."""
    opts = {
        "name": name,
        "namespace": namespace,
        "kube_version": KUBE_VERSION,
        "api_versions": list(api_versions or []),
    }
    c = chart(chart_path)
    out = _native.call_string(
        "helm_render", c._raw(), json.dumps(values or {}), json.dumps(opts)
    )
    return json.loads(out)


@dataclass
class Rendered:
    objects: list[dict[str, Any]]
    notes: str

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [
            o for o in self.of_kind(kind) if name is None or o["metadata"]["name"] == name
        ]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]


def render(
    values: dict[str, Any] | None = None, api_versions: list[str] | None = None, **kw: Any
) -> Rendered:
    raw = render_raw(values, api_versions, **kw)
    objects: list[dict[str, Any]] = []
    notes = ""
    for path in sorted(raw):
        if path.endswith("NOTES.txt"):
            notes = raw[path]
            continue
        for doc in yaml.safe_load_all(raw[path]):
            if doc is None:
                continue
            assert isinstance(doc, dict), f"{path}: not an object: {doc!r}"
            doc.setdefault("metadata", {})
            doc["metadata"].setdefault("annotations", None)
            if doc["metadata"]["annotations"] is None:
                del doc["metadata"]["annotations"]
            objects.append(doc)
    return Rendered(objects, notes)


def render_scenario(name: str) -> Rendered:
    s = SCENARIOS[name]
    return render(s.values, s.api_versions)


def dump(out: pathlib.Path) -> int:
    count = 0
    for name in SCENARIOS:
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        for i, obj in enumerate(render_scenario(name).objects):
            fname = f"{i:02d}-{obj['kind']}-{obj['metadata']['name']}.json"
            (d / fname).write_text(json.dumps(obj, indent=1, sort_keys=True))
            count += 1
    return count


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=pathlib.Path, required=True)
    args = p.parse_args()
    n = dump(args.out)
    print(f"wrote {n} objects for {len(SCENARIOS)} scenarios to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
