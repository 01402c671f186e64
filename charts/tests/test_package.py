"""The chart as it is published: metadata and the packaged archive.

`helm package` is done by helm-python-sdk's `package` (Helm's own
packaging code), as scripts/test.sh does for CI's artifact.
"""

from __future__ import annotations

import pathlib
import re
import tarfile

import helm_python
import yaml

from render import CHART, SCENARIOS, render

META = yaml.safe_load((CHART / "Chart.yaml").read_text())


def test_artifact_hub_metadata() -> None:
    assert META["icon"].startswith("https://")
    icon = META["icon"].rsplit("/main/", 1)[1]
    assert (CHART.parents[1] / icon).is_file(), f"{icon} is not in the repository"
    ann = META["annotations"]
    for key in ("artifacthub.io/license", "artifacthub.io/changes",
                "artifacthub.io/links", "artifacthub.io/category"):
        assert key in ann, key
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    if ann.get("artifacthub.io/prerelease") == "true":
        # The images of a pre-release are not published: advertising them
        # would send users to a pull that fails.
        assert "artifacthub.io/images" not in ann, "a pre-release advertises no images"
        assert "not published" in META["description"], "say the images are not published"
    else:
        images = yaml.safe_load(ann["artifacthub.io/images"])
        want = {
            f"{values[c]['image']['repository']}:{META['appVersion']}"
            for c in ("agent", "controller")
        }
        assert {i["image"] for i in images} == want, "images annotation out of date with appVersion"
        for i in images:
            assert set(i["platforms"]) == {"linux/amd64", "linux/arm64"}
    changes = yaml.safe_load(ann["artifacthub.io/changes"])
    assert changes and all(c["kind"] in {"added", "changed", "deprecated", "removed",
                                         "fixed", "security"} for c in changes)
    if ann.get("artifacthub.io/prerelease") == "true":
        # Nothing was released before: nothing can have changed.
        assert not [c for c in changes if c["kind"] in {"changed", "deprecated", "removed"}]


def test_an_unreleased_version_has_no_changed_entries() -> None:
    text = (CHART / "CHANGELOG.md").read_text()
    newest = re.split(r"^## ", text, flags=re.M)[1]
    if "(unreleased)" in newest.splitlines()[0] and len(re.findall(r"^## ", text, re.M)) == 1:
        assert "### Changed" not in newest and "### Removed" not in newest


def test_changelog_has_the_chart_version() -> None:
    text = (CHART / "CHANGELOG.md").read_text()
    versions = re.findall(r"^## (\S+)", text, re.M)
    assert versions[0] == META["version"], "CHANGELOG's newest entry is not Chart.yaml's version"


def test_helm_package_builds_an_archive_that_renders_the_same(tmp_path: pathlib.Path) -> None:
    archive = pathlib.Path(helm_python.package(CHART, destination=tmp_path))
    assert archive.name == f"mountguard-{META['version']}.tgz"
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    for f in ("Chart.yaml", "values.yaml", "values.schema.json", "README.md", "CHANGELOG.md",
              "dashboards/mountguard.json", "templates/agent-daemonset.yaml"):
        assert f"mountguard/{f}" in names, f
    assert not [n for n in names if "__pycache__" in n or n.endswith((".swp", ".orig"))]
    def comparable(objects: list[dict]) -> list[dict]:
        # The generated fingerprint key is random in every offline render.
        for o in objects:
            if o["kind"] == "Secret" and o["metadata"]["name"].endswith("-fingerprint-key"):
                o["data"] = {"key": "<random>"}
        return objects

    for name in ("default", "monitoring-with-api", "escape-hatches"):
        s = SCENARIOS[name]
        from_archive = render(s.values, s.api_versions, chart_path=archive).objects
        assert comparable(from_archive) == comparable(render(s.values, s.api_versions).objects)
