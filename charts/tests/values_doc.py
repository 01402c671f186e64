"""docs/reference/helm-values.md, generated from values.yaml and
values.schema.json: every leaf value with its type, default and
description, so the reference cannot drift from the chart.

    python3 charts/tests/values_doc.py           # print the page
    python3 charts/tests/values_doc.py --write   # rewrite docs/reference/helm-values.md

test_values_doc.py fails when the page differs from what this generates.
The description of a value is its `# --` comment in values.yaml (the
helm-docs convention), else the schema's `description`.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from typing import Any

import yaml

HERE = pathlib.Path(__file__).resolve().parent
CHART = HERE.parent / "mountguard"
PAGE = HERE.parents[1] / "docs" / "reference" / "helm-values.md"

HEAD = """# Helm values

Every value of the chart, generated from `charts/mountguard/values.yaml` and
`values.schema.json` (`python3 charts/tests/values_doc.py --write`; the chart
tests fail when this page differs). Unknown keys and wrong types fail the
install. Durations: a positive whole number with `ms`, `s`, `m` or `h`, or
bare seconds. Sizes: bytes, or like `16Mi`.

| value | type | default | description |
|---|---|---|---|
"""


def comments(text: str) -> dict[str, str]:
    """The `# --` comment block above each key, by dotted path."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    block: list[str] = []
    in_doc = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            body = stripped.lstrip("#").strip()
            if body.startswith("-- "):
                block, in_doc = [body[3:]], True
            elif in_doc and body and not body.startswith("---"):
                block.append(body)
            else:
                block, in_doc = [], False
            continue
        m = re.match(r"^(\s*)([A-Za-z0-9_]+):", line)
        if not m:
            block, in_doc = [], False
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        path = ".".join(k for _, k in stack)
        if block:
            out[path] = " ".join(block)
        block, in_doc = [], False
    return out


def schema_at(schema: dict[str, Any], path: list[str]) -> dict[str, Any]:
    defs = schema.get("$defs", {})

    def resolve(s: dict[str, Any]) -> dict[str, Any]:
        ref = s.get("$ref")
        if ref:
            merged = dict(defs[ref.rsplit("/", 1)[1]])
            merged.update({k: v for k, v in s.items() if k != "$ref"})
            return merged
        return s

    s = resolve(schema)
    for key in path:
        props = s.get("properties", {})
        if key not in props:
            return {}
        s = resolve(props[key])
    return s


def type_of(s: dict[str, Any]) -> str:
    if "enum" in s:
        return " | ".join(json.dumps(v) for v in s["enum"])
    for alt in ("oneOf", "anyOf"):
        if alt in s:
            return " or ".join(type_of(a) for a in s[alt])
    t = s.get("type", "")
    if isinstance(t, list):
        return " or ".join(t)
    if t == "string" and "pattern" in s and "duration" in s.get("description", "").lower():
        return "duration"
    return t or "-"


def leaves(values: Any, prefix: str = "") -> list[tuple[str, Any]]:
    if isinstance(values, dict) and values:
        out: list[tuple[str, Any]] = []
        for k, v in values.items():
            out.extend(leaves(v, f"{prefix}.{k}" if prefix else k))
        return out
    return [(prefix, values)]


def cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def generate() -> str:
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    docs = comments(text)
    rows = []
    for path, default in leaves(values):
        s = schema_at(schema, path.split("."))
        desc = docs.get(path) or s.get("description", "")
        rows.append(
            f"| `{path}` | {cell(type_of(s))} | `{cell(json.dumps(default))}` | {cell(desc)} |"
        )
    return HEAD + "\n".join(rows) + "\n"


if __name__ == "__main__":
    page = generate()
    if sys.argv[1:] == ["--write"]:
        PAGE.write_text(page)
    else:
        sys.stdout.write(page)
