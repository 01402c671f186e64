"""Validators nobody on the project wrote, applied to rendered objects.

- Built-in kinds: the Kubernetes JSON schemas of PyPI `kubernetes-validate`
  in strict mode (an unknown field fails), for the oldest and the newest
  Kubernetes release the chart supports.
- Custom resources (monitoring.coreos.com, cert-manager.io): the
  openAPIV3Schema of the upstream CRDs vendored in crds/ (see
  crds/SOURCES.md), checked with `jsonschema`. Like the API server with
  `fieldValidation=Strict`, a field the schema does not declare is an error
  (the API server finds them while pruning:
  k8s.io/apiextensions-apiserver v0.37.2 (Kubernetes v1.37.2)
  pkg/apiserver/schema/pruning/algorithm.go, `PruneWithOptions`, and fails
  strict requests on the pruned paths).
  CEL rules (`x-kubernetes-validations`) are not evaluated.
- Prometheus rules and dashboard queries: `promtool` (Debian's `prometheus`
  package), see promtool.py.
"""

from __future__ import annotations

import copy
import functools
import pathlib
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

HERE = pathlib.Path(__file__).resolve().parent
CRDS = HERE / "crds"

# The chart supports Kubernetes >= 1.34 (its kubeVersion); kubernetes-validate 1.37.0 ships the
# schemas of 1.25 up to 1.37.
K8S_VERSIONS = ("1.34.0", "1.37.0")


def _strict(node: Any) -> Any:
    """The schema with every declared object closed, null allowed where
    `nullable`, as the API server reads an openAPIV3Schema."""
    if isinstance(node, list):
        return [_strict(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    return out


@functools.cache
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    """(apiVersion, kind) -> strict schema, from every vendored CRD."""
    out = {}
    for path in sorted(CRDS.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group = crd["spec"]["group"]
            kind = crd["spec"]["names"]["kind"]
            for v in crd["spec"]["versions"]:
                if v.get("served", True):
                    schema = _strict(v["schema"]["openAPIV3Schema"])
                    out[(f"{group}/{v['name']}", kind)] = schema
    return out


class Invalid(AssertionError):
    pass


def _where(obj: dict[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return f"{obj.get('apiVersion')} {obj.get('kind')} {md.get('name')}"


def validate_builtin(obj: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(obj, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = "." + ".".join(str(p) for p in e.path)
        raise Invalid(f"{_where(obj)} (Kubernetes {version}): {path}: {e.message}") from None


def validate_custom(obj: dict[str, Any], version: str) -> None:
    schema = crd_schemas().get((obj["apiVersion"], obj["kind"]))
    if schema is None:
        raise Invalid(f"{_where(obj)}: no vendored CRD schema for this kind (crds/)")
    errors = sorted(
        jsonschema.Draft7Validator(schema).iter_errors(obj), key=lambda e: list(e.path)
    )
    if errors:
        e = errors[0]
        path = "." + ".".join(str(p) for p in e.path)
        raise Invalid(f"{_where(obj)} (CRD schema): {path}: {e.message}")
    # The CRD schemas leave metadata open; the API server checks it as
    # ObjectMeta: so do we, through an object whose metadata is typed.
    holder = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": copy.deepcopy(obj["metadata"])}
    validate_builtin(holder, version)


def validate(obj: dict[str, Any], version: str) -> None:
    """Raises Invalid with the object, the field and the reason."""
    group = obj["apiVersion"].rpartition("/")[0]
    if group in {"monitoring.coreos.com", "cert-manager.io"}:
        validate_custom(obj, version)
    else:
        validate_builtin(obj, version)
