"""The chart's alerting rules name metrics the coordinator exports (an alert on a metric nobody exports never
fires)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from coordinator_service import metrics

RULES = Path(__file__).parents[2] / "helm" / "sink-coordinator" / "rules"


def exported_names() -> set[str]:
    sink = metrics.SinkGauges(
        sink="orders",
        pending=1,
        aborted=0,
        oldest_pending_age_seconds=1.0,
        retrying=False,
        stuck=False,
        suspended=False,
        tables=[metrics.TableGauges("db.orders", 0, retrying=False)],
        stalled=True,
        writer_last_call_age_seconds=2.0,
    )
    exposition = metrics.exposition([sink]).decode()
    return {sample.name for family in text_string_to_metric_families(exposition) for sample in family.samples}


def test_every_rule_names_exported_metrics() -> None:
    exported = exported_names()
    files = sorted(RULES.glob("*.yaml"))
    assert files
    for path in files:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                named = set(re.findall(r"\bsink_coordinator_\w+", rule["expr"]))
                assert named, (path.name, rule["alert"])
                assert named <= exported, (path.name, rule["alert"], named - exported)
