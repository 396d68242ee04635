"""The chart's alerting rules (helm/sink-coordinator/rules/) name metrics the coordinator exports (an alert on a
metric nobody exports never fires), select the release's series the way the chart rewrites them, each point to a
runbook in docs/operations.md, agree with the chart's default thresholds, and each have a promtool case that fires
them and one that does not (run by test_alert_rules_fire.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from coordinator_service.settings import Settings
from tests.fixtures.metric_names import exported_names, metric_names

ROOT = Path(__file__).parents[2]
CHART = ROOT / "helm" / "sink-coordinator"
RULES = CHART / "rules"
CASES = Path(__file__).parent / "alert_rules"
OPERATIONS = ROOT / "docs" / "operations.md"
RUNBOOK = "https://github.com/sink-coordinator/sink-coordinator/blob/main/docs/operations.md"
# What the chart replaces with its release's selector (prometheusRule.selector).
SELECTOR = 'job="sink-coordinator"'
# Prometheus' own series of each scrape target.
PROMETHEUS_SERIES = {"up"}


def rules() -> list[dict[str, Any]]:
    found = [
        rule
        for path in sorted(RULES.glob("*.yaml"))
        for group in yaml.safe_load(path.read_text())["groups"]
        for rule in group["rules"]
    ]
    assert found
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_sections() -> dict[str, str]:
    """The sections under docs/operations.md's "## Alerts", by their headings' anchors."""
    text = OPERATIONS.read_text()
    alerts = text.split("\n## Alerts\n", 1)[1].split("\n## ", 1)[0]
    sections = re.split(r"^### (.+)$", alerts, flags=re.MULTILINE)
    return {github_anchor(heading): body for heading, body in zip(sections[1::2], sections[2::2], strict=True)}


def test_every_rule_names_exported_metrics() -> None:
    exported = exported_names() | PROMETHEUS_SERIES
    for rule in rules():
        named = metric_names(rule["expr"])
        assert named, rule["alert"]
        assert named <= exported, (rule["alert"], named - exported)


def test_every_series_selector_is_the_one_the_chart_replaces() -> None:
    for rule in rules():
        for name in metric_names(rule["expr"]):
            for match in re.finditer(rf"\b{name}\b(?!\s*\()", rule["expr"]):
                following = rule["expr"][match.end() :]
                assert re.match(rf"\{{{re.escape(SELECTOR)}[,}}]", following), (rule["alert"], name, following[:60])


def test_every_alert_has_a_runbook_section() -> None:
    sections = runbook_sections()
    for rule in rules():
        anchor = github_anchor(rule["alert"])
        assert rule["annotations"]["runbook_url"] == f"{RUNBOOK}#{anchor}", rule["alert"]
        assert anchor in sections, f"docs/operations.md has no '### {rule['alert']}' under '## Alerts'"
        for part in ("**What it means**", "**How to confirm**", "**What to do**"):
            assert part in sections[anchor], (rule["alert"], part)
        assert {"summary", "description"} <= rule["annotations"].keys(), rule["alert"]


def trailing_number(expr: str) -> float:
    found = re.search(r"(\d+(?:\.\d+)?)\s*$", expr)
    assert found, expr
    return float(found.group(1))


def test_the_charts_defaults_are_the_rule_files() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["alerts"]
    schema = json.loads((CHART / "values.schema.json").read_text())
    schema_alerts = schema["properties"]["prometheusRule"]["properties"]["alerts"]["properties"]
    by_name = {rule["alert"]: rule for rule in rules()}
    assert set(values) == set(by_name) == set(schema_alerts)
    interval = Settings.model_fields["commit_interval_seconds"].default
    for name, rule in by_name.items():
        settings = values[name]
        assert settings["enabled"] is True, name
        assert settings["for"] == rule["for"], name
        assert settings["severity"] == rule["labels"]["severity"], name
        assert set(settings) <= set(schema_alerts[name]["properties"]), name
        if "threshold" in settings:
            assert trailing_number(rule["expr"]) == settings["threshold"], name
    # The one threshold that follows a setting: a number of commit intervals, with a floor.
    pending = values["SinkOldestPendingEpochOld"]
    expected = max(pending["commitIntervals"] * interval, pending["minSeconds"])
    assert trailing_number(by_name["SinkOldestPendingEpochOld"]["expr"]) == expected


def test_every_alert_has_a_case_that_fires_it_and_one_that_does_not() -> None:
    fired: set[str] = set()
    quiet: set[str] = set()
    for path in sorted(CASES.glob("*.test.yaml")):
        document = yaml.safe_load(path.read_text())
        assert [(RULES / name).is_file() for name in document["rule_files"]] == [True], path.name
        for case in document["tests"]:
            for check in case["alert_rule_test"]:
                (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    alerts = {rule["alert"] for rule in rules()}
    assert alerts <= fired, alerts - fired
    assert alerts <= quiet, alerts - quiet
