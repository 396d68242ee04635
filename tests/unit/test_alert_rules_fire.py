"""Every alert of the chart fires, and stays quiet, as its promtool cases say (tests/unit/alert_rules/*.test.yaml:
input series that fire it and series that must not, on two replicas and beside another job's series).

The cases run on copies of the rule files without their annotations: a case says when an alert fires and with
which labels; the annotations' templates are checked by `promtool check rules` on the files themselves."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).parents[2] / "helm" / "sink-coordinator" / "rules"
CASES = Path(__file__).parent / "alert_rules"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not found (optional: Debian's package prometheus; .ci/run installs it)"
)


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *map(str, args)], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_rule_files_pass_promtools_check() -> None:
    files = sorted(RULES.glob("*.yaml"))
    assert files
    checked = promtool("check", "rules", *files)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("cases", sorted(CASES.glob("*.test.yaml")), ids=lambda path: path.name)
def test_alerts_fire_as_the_cases_say(cases: Path, tmp_path: Path) -> None:
    for name in yaml.safe_load(cases.read_text())["rule_files"]:
        document = yaml.safe_load((RULES / name).read_text())
        for group in document["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
        (tmp_path / name).write_text(yaml.safe_dump(document, sort_keys=False, width=10_000))
    shutil.copy(cases, tmp_path / cases.name)
    tested = promtool("test", "rules", cases.name, cwd=tmp_path)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout
