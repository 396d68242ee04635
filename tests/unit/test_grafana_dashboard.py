"""The chart's Grafana dashboard (helm/sink-coordinator/dashboards/sink-coordinator.json) reads metrics the
coordinator exports (a panel on a metric nobody exports shows nothing, silently), and every panel and variable
goes through the dashboard's data source and release variables."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.fixtures.metric_names import exported_names, metric_names

DASHBOARD = Path(__file__).parents[2] / "helm" / "sink-coordinator" / "dashboards" / "sink-coordinator.json"
# Prometheus' own series of each scrape target.
PROMETHEUS_SERIES = {"up"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels(container: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, those inside rows (collapsed rows hold theirs) included."""
    for panel in container.get("panels", []):
        yield panel
        yield from panels(panel)


def test_every_panel_reads_exported_metrics() -> None:
    exported = exported_names() | PROMETHEUS_SERIES
    expressions = 0
    for panel in panels(dashboard()):
        if panel["type"] == "row":
            continue
        assert panel.get("targets"), panel["title"]
        for target in panel["targets"]:
            named = metric_names(target["expr"])
            assert named, (panel["title"], target["expr"])
            assert named <= exported, (panel["title"], named - exported)
            expressions += 1
    assert expressions >= 20


def test_every_variable_reads_exported_metrics() -> None:
    exported = exported_names()
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        found = re.fullmatch(r"label_values\((\w+)(\{.*\})?, *(\w+)\)", variable["query"]["query"])
        assert found, variable["name"]
        assert found.group(1) in exported, variable["name"]


def test_every_panel_selects_the_chosen_release_through_the_chosen_data_source() -> None:
    ids = []
    for panel in panels(dashboard()):
        ids.append(panel["id"])
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
            selectors = re.findall(r"\{([^{}]*)\}", target["expr"])
            assert selectors, (panel["title"], target["expr"])
            for selector in selectors:
                assert 'namespace=~"$namespace",job=~"$job"' in selector, (panel["title"], selector)
    assert len(ids) == len(set(ids))
