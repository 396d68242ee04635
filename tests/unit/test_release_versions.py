"""One version for a release: the package's (pyproject.toml) is the chart's version and appVersion, the chart's
default image is the one the release workflow pushes for that version, and make image tags it so."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import yaml

from coordinator_service import __version__

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sink-coordinator"
WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"


def package_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_the_chart_is_versioned_as_the_package() -> None:
    chart = load(CHART / "Chart.yaml")
    assert chart["version"] == chart["appVersion"] == package_version()


def test_the_charts_default_image_is_the_released_one() -> None:
    image = load(CHART / "values.yaml")["image"]
    assert image["tag"] == "", "an empty tag is the chart's appVersion, the package's version"
    assert image["digest"] == ""
    # The release workflow pushes to ghcr.io/<the repository>: the chart's own repository's name.
    repository = load(CHART / "Chart.yaml")["home"].removeprefix("https://github.com/")
    assert image["repository"] == f"ghcr.io/{repository}"


def test_the_workflow_publishes_a_tag_of_the_version_only() -> None:
    workflow = load(WORKFLOW)
    # PyYAML reads the key `on` as True (YAML 1.1).
    assert workflow[True] == {"push": {"tags": ["v*"]}}
    steps = workflow["jobs"]["release"]["steps"]
    [version_step] = [step for step in steps if step.get("id") == "version"]
    for read in ('"v$version"', "pyproject.toml", "Chart.yaml", "exit 1", "image=ghcr.io/${GITHUB_REPOSITORY,,}"):
        assert read in version_step["run"]
    [build] = [step for step in steps if step.get("id") == "build"]
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64"
    assert build["with"]["push"] is True


def test_make_image_tags_the_packages_version() -> None:
    dry_run = subprocess.run(
        ["make", "--no-print-directory", "-n", "image", "ENGINE=docker"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert re.search(rf"-t ghcr\.io/sink-coordinator/sink-coordinator:{re.escape(package_version())} \.", dry_run)


def test_the_running_code_reports_the_packages_version() -> None:
    assert __version__ == package_version()
