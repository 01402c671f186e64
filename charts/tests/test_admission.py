"""The admission webhook's objects: both TLS choices, the fields that keep
the webhook from ever being a dependency of the API, and its toggles."""

from __future__ import annotations

import base64
import pathlib
import subprocess
from typing import Any

from render import NAMESPACE, RELEASE, render, render_scenario

NAME = f"{RELEASE}-mountguard-admission"
WEBHOOK = f"{NAMESPACE}-{NAME}"
SERVICE_DNS = f"{NAME}.{NAMESPACE}.svc"


def controller_env(r: Any) -> dict[str, str]:
    d = r.one("Deployment")
    c = d["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in c["env"]}


def webhook(r: Any) -> dict[str, Any]:
    vwc = r.one("ValidatingWebhookConfiguration", WEBHOOK)
    assert len(vwc["webhooks"]) == 1
    return vwc["webhooks"][0]


def test_the_webhook_is_never_a_dependency_of_the_api() -> None:
    for scenario in ("default", "plaintext", "tls-user-secret", "tls-cluster-issuer"):
        w = webhook(render_scenario(scenario))
        assert w["failurePolicy"] == "Ignore", scenario
        assert w["timeoutSeconds"] <= 2, scenario
        assert w["sideEffects"] == "None", scenario
        assert w["admissionReviewVersions"] == ["v1"], scenario
        assert w["rules"] == [
            {
                "operations": ["CREATE", "DELETE"],
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": ["secrets", "configmaps"],
                "scope": "Namespaced",
            }
        ], scenario
        assert w["clientConfig"]["service"] == {
            "name": NAME,
            "namespace": NAMESPACE,
            "path": "/v1/admission",
            "port": 443,
        }, scenario


def test_every_replica_answers_on_the_admission_port() -> None:
    r = render({"controller": {"replicas": 2}})
    svc = r.one("Service", NAME)
    assert "mountguard.io/leader" not in svc["spec"]["selector"]
    assert svc["spec"]["ports"] == [
        {"name": "admission", "port": 443, "targetPort": "admission", "protocol": "TCP"}
    ]
    c = r.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "admission", "containerPort": 9443, "protocol": "TCP"} in c["ports"]
    env = controller_env(r)
    assert env["MOUNTGUARD_ADMISSION_LISTEN"] == "0.0.0.0:9443"
    assert env["MOUNTGUARD_ADMISSION_MODE"] == "warn"
    assert env["MOUNTGUARD_ADMISSION_TLS_CERT_FILE"] == "/var/run/mountguard/admission-tls/tls.crt"
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts["admission-tls"] == "/var/run/mountguard/admission-tls"
    vols = {v["name"]: v for v in r.one("Deployment")["spec"]["template"]["spec"]["volumes"]}
    assert vols["admission-tls"]["secret"]["secretName"] == f"{NAME}-tls"


def test_with_cert_manager_the_ca_injector_fills_the_ca_bundle() -> None:
    for scenario, issuer in (
        ("default", {"name": f"{RELEASE}-mountguard-ca", "kind": "Issuer", "group": "cert-manager.io"}),
        ("tls-cluster-issuer", {"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"}),
    ):
        r = render_scenario(scenario)
        vwc = r.one("ValidatingWebhookConfiguration", WEBHOOK)
        assert vwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
            f"{NAMESPACE}/{NAME}"
        )
        assert "caBundle" not in vwc["webhooks"][0]["clientConfig"]
        cert = r.one("Certificate", NAME)
        assert cert["spec"]["secretName"] == f"{NAME}-tls"
        assert SERVICE_DNS in cert["spec"]["dnsNames"]
        assert cert["spec"]["issuerRef"] == issuer, scenario
        assert not [s for s in r.of_kind("Secret") if s["metadata"]["name"] == f"{NAME}-tls"]


def test_without_cert_manager_the_chart_ca_signs_a_certificate_for_the_service(
    tmp_path: pathlib.Path,
) -> None:
    for scenario in ("plaintext", "tls-user-secret"):
        r = render_scenario(scenario)
        assert not [c for c in r.of_kind("Certificate") if c["metadata"]["name"] == NAME]
        w = webhook(r)
        secret = r.one("Secret", f"{NAME}-tls")
        assert secret["type"] == "kubernetes.io/tls"
        assert w["clientConfig"]["caBundle"] == secret["data"]["ca.crt"], scenario
        ca = tmp_path / f"{scenario}-ca.crt"
        crt = tmp_path / f"{scenario}-tls.crt"
        ca.write_bytes(base64.b64decode(secret["data"]["ca.crt"]))
        crt.write_bytes(base64.b64decode(secret["data"]["tls.crt"]))
        # The serving certificate chains to the caBundle and names the
        # Service the API server calls.
        ok = subprocess.run(
            ["openssl", "verify", "-CAfile", str(ca), str(crt)], capture_output=True, text=True
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        text = subprocess.run(
            ["openssl", "x509", "-noout", "-ext", "subjectAltName", "-in", str(crt)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f"DNS:{SERVICE_DNS}" in text, text


def test_mode_off_renders_no_webhook_and_deny_is_passed_on() -> None:
    r = render({"admission": {"mode": "off"}})
    assert not r.of_kind("ValidatingWebhookConfiguration")
    assert not [s for s in r.of_kind("Service") if s["metadata"]["name"] == NAME]
    assert not [c for c in r.of_kind("Certificate") if c["metadata"]["name"] == NAME]
    env = controller_env(r)
    assert "MOUNTGUARD_ADMISSION_LISTEN" not in env
    c = r.one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "admission" not in {p["name"] for p in c["ports"]}
    r = render({"admission": {"mode": "deny", "timeoutSeconds": 1, "answerTimeout": "700ms"}})
    env = controller_env(r)
    assert env["MOUNTGUARD_ADMISSION_MODE"] == "deny"
    assert env["MOUNTGUARD_ADMISSION_ANSWER_TIMEOUT"] == "700ms"
    assert webhook(r)["timeoutSeconds"] == 1


def test_selectors_a_user_sets_reach_the_webhook() -> None:
    ns = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                "values": ["kube-system"]}]}
    obj = {"matchLabels": {"mountguard.io/admission": "on"}}
    w = webhook(render({"admission": {"namespaceSelector": ns, "objectSelector": obj}}))
    assert w["namespaceSelector"] == ns
    assert w["objectSelector"] == obj


def test_the_network_policy_admits_the_api_server_to_the_webhook() -> None:
    r = render_scenario("network-policy")
    np = r.one("NetworkPolicy", f"{RELEASE}-mountguard-controller")
    rules = [i for i in np["spec"]["ingress"] if i.get("ports") == [
        {"port": "admission", "protocol": "TCP"}]]
    assert rules == [{"ports": [{"port": "admission", "protocol": "TCP"}]}]
    r = render({"networkPolicy": {"enabled": True}, "admission": {"mode": "off"}})
    np = r.one("NetworkPolicy", f"{RELEASE}-mountguard-controller")
    assert all(
        p["port"] != "admission" for i in np["spec"]["ingress"] for p in i.get("ports", [])
    )


def test_a_client_ca_config_map_is_mounted_and_passed_on() -> None:
    r = render({"admission": {"clientCA": {"configMap": "apiserver-webhook-client-ca"}}})
    env = controller_env(r)
    assert env["MOUNTGUARD_ADMISSION_CLIENT_CA_FILE"] == (
        "/var/run/mountguard/admission-client-ca/ca.crt"
    )
    spec = r.one("Deployment")["spec"]["template"]["spec"]
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["admission-client-ca"]["configMap"] == {
        "name": "apiserver-webhook-client-ca",
        "items": [{"key": "ca.crt", "path": "ca.crt"}],
    }
    assert "MOUNTGUARD_ADMISSION_CLIENT_CA_FILE" not in controller_env(render())


def test_the_network_policy_may_narrow_who_calls_the_webhook() -> None:
    peers = [{"ipBlock": {"cidr": "10.0.0.0/24"}}]
    r = render({"networkPolicy": {"enabled": True, "admissionFrom": peers}})
    np = r.one("NetworkPolicy", f"{RELEASE}-mountguard-controller")
    rules = [i for i in np["spec"]["ingress"] if i.get("ports") == [
        {"port": "admission", "protocol": "TCP"}]]
    assert rules == [{"ports": [{"port": "admission", "protocol": "TCP"}], "from": peers}]
