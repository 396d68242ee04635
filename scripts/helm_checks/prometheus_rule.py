"""The PrometheusRule of a render against rules/*.yaml, made the release's own as the values say, computed here
independently of the template: none unless prometheusRule.enabled; else every enabled alert in its group, its
selectors the release's (job="sink-coordinator" replaced), its threshold (the number its expr ends with), for,
severity and labels the values', its runbook_url under prometheusRule.runbookUrl.

    python prometheus_rule.py CHART MANIFEST VALUES_FILE...   (the chart's values.yaml first)
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml
from chart_values import documents, report, values

RULE_SELECTOR = 'job="sink-coordinator"'
RUNBOOK = "https://github.com/sink-coordinator/sink-coordinator/blob/main/docs/operations.md"
# helm_check.sh renders in this namespace.
NAMESPACE = "sink"
# The service's COMMIT_INTERVAL_SECONDS when config.commitIntervalSeconds is null.
SERVICE_COMMIT_INTERVAL = 10.0
TRAILING_NUMBER = re.compile(r"([0-9]+(\.[0-9]+)?(e[+-]?[0-9]+)?)$")


def expected_groups(chart: Path, given: dict[str, Any], selector: str) -> list[tuple[str, list[dict[str, Any]]]]:
    config = given["prometheusRule"]
    interval = given["config"].get("commitIntervalSeconds")
    interval = SERVICE_COMMIT_INTERVAL if interval is None else float(interval)
    groups = []
    for path in sorted((chart / "rules").glob("*.yaml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules = []
            for rule in group["rules"]:
                alert = config["alerts"].get(rule["alert"], {})
                if alert.get("enabled", True) is False:
                    continue
                threshold = alert.get("threshold")
                if "commitIntervals" in alert:
                    threshold = max(alert["commitIntervals"] * interval, alert["minSeconds"])
                severity = alert.get("severity", rule["labels"]["severity"])
                rules.append(
                    {
                        "alert": rule["alert"],
                        "expr": rule["expr"].strip().replace(RULE_SELECTOR, selector),
                        "threshold": threshold,
                        "for": alert.get("for", rule["for"]),
                        "labels": {**rule["labels"], **config["alertLabels"], "severity": severity},
                        "annotations": {
                            k: v.replace(RUNBOOK, config["runbookUrl"]) for k, v in rule["annotations"].items()
                        },
                    }
                )
            if rules:
                groups.append((group["name"], rules))
    return groups


def compare(rule: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """The rendered rule against the expected one; a threshold compared as a number."""
    expr, threshold = rule["expr"], expected.pop("threshold")
    errors = []
    if threshold is not None:
        found = TRAILING_NUMBER.search(expr)
        if not found or float(found.group(1)) != float(threshold):
            errors.append(f"{rule['alert']}: the threshold of {expr!r} is not {threshold}")
        expr = expr[: found.start()] if found else expr
        expected["expr"] = TRAILING_NUMBER.sub("", expected["expr"])
    if {**rule, "expr": expr} != expected:
        errors.append(f"{rule['alert']}: rendered {rule}, want {expected}")
    return errors


def main(chart: Path, manifest: str, value_files: list[str]) -> None:
    given = values(value_files)
    docs = documents(manifest)
    rendered = [d for d in docs if d["kind"] == "PrometheusRule"]
    config = given["prometheusRule"]
    if not config["enabled"]:
        report(["a PrometheusRule is rendered although prometheusRule.enabled is false"] if rendered else [])
    if len(rendered) != 1:
        report([f"{len(rendered)} PrometheusRules rendered, want 1"])
    [service] = [d for d in docs if d["kind"] == "Service"]
    selector = config["selector"] or f'job="{service["metadata"]["name"]}",namespace="{NAMESPACE}"'
    want = expected_groups(chart, given, selector)
    got = rendered[0]["spec"]["groups"]
    errors = []
    if [g["name"] for g in got] != [name for name, _ in want]:
        errors.append(f"groups {[g['name'] for g in got]}, want {[name for name, _ in want]}")
    for group, (_, rules) in zip(got, want, strict=False):
        if [r["alert"] for r in group["rules"]] != [r["alert"] for r in rules]:
            errors.append(
                f"group {group['name']}: {[r['alert'] for r in group['rules']]}, want {[r['alert'] for r in rules]}"
            )
        for rule, expected in zip(group["rules"], rules, strict=False):
            errors += compare(rule, expected)
    labels = rendered[0]["metadata"]["labels"]
    if not config["labels"].items() <= labels.items():
        errors.append(f"the PrometheusRule's labels {labels} lack {config['labels']}")
    report(errors)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
