"""docs/reference/helm-values.md is what values_doc.py generates from
values.yaml and the schema: a value added, removed, or with another default
or description fails here."""

from __future__ import annotations

import difflib

import values_doc


def test_the_values_reference_is_generated_from_values_and_schema() -> None:
    want = values_doc.generate()
    have = values_doc.PAGE.read_text()
    diff = "\n".join(difflib.unified_diff(have.splitlines(), want.splitlines(), "page", "generated", lineterm=""))
    assert have == want, f"run `python3 charts/tests/values_doc.py --write`:\n{diff}"


def test_every_documented_value_is_a_leaf_of_values_yaml() -> None:
    rows = [l for l in values_doc.PAGE.read_text().splitlines() if l.startswith("| `")]
    paths = {p for p, _ in values_doc.leaves(values_doc.yaml.safe_load((values_doc.CHART / "values.yaml").read_text()))}
    assert len(rows) == len(paths) and all(r.split("`")[1] in paths for r in rows)
