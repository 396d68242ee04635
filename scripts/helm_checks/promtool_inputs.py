"""Inputs of promtool for scripts/helm_check.sh.

python promtool_inputs.py groups MANIFEST DIR   the PrometheusRule's groups as DIR/rules.yaml, and without their
                                                annotations as DIR/bare.yaml
python promtool_inputs.py case CASES OUT        a promtool test file of tests/unit/alert_rules/ run on bare.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from chart_values import documents


def groups(manifest: str, out: Path) -> None:
    [rule] = [d for d in documents(manifest) if d["kind"] == "PrometheusRule"]
    rendered = rule["spec"]["groups"]
    (out / "rules.yaml").write_text(yaml.safe_dump({"groups": rendered}, sort_keys=False, width=10_000))
    for group in rendered:
        for each in group["rules"]:
            each.pop("annotations", None)
    (out / "bare.yaml").write_text(yaml.safe_dump({"groups": rendered}, sort_keys=False, width=10_000))


def case(cases: Path, out: Path) -> None:
    document = yaml.safe_load(cases.read_text())
    document["rule_files"] = ["bare.yaml"]
    out.write_text(yaml.safe_dump(document, sort_keys=False))


if __name__ == "__main__":
    command, source, target = sys.argv[1:]
    if command == "groups":
        groups(source, Path(target))
    else:
        case(Path(source), Path(target))
