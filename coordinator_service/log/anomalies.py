"""What only a lost commit lock explains (an append that landed after the log gave its epoch up, or after a reset):
logged as an error and counted, for an operator to look at."""

from __future__ import annotations

import structlog

from coordinator_service import metrics

log = structlog.get_logger(__name__)


def alert(sink: str, kind: str, **fields: object) -> None:
    metrics.COMMIT_ANOMALIES.labels(sink, kind).inc()
    log.error("exactly-once anomaly: a commit landed without its commit lock", sink=sink, anomaly=kind, **fields)
