"""What the process's own metrics say: why a commit is retried, how late the event loop runs, and that every
metric with a sink label leaves with the sink."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import REGISTRY, Counter, Histogram
from pyiceberg.exceptions import CommitFailedException
from sqlalchemy.exc import OperationalError

from coordinator_service import metrics
from coordinator_service.contract.errors import (
    CatalogConflict,
    CatalogUnavailable,
    CommitLockLost,
    MetastoreUnavailable,
)
from coordinator_service.engine.commit_retries import retry_cause


def raised_from(error: Exception, cause: BaseException) -> Exception:
    try:
        raise error from cause
    except Exception as raised:
        return raised


def test_a_retried_commit_is_counted_by_its_cause() -> None:
    """On-call review: one retries counter for a catalog conflict, a catalog outage and a metastore outage; the
    first is another writer's doing, the others are pages."""
    # Every catalog call of the engine goes through in_catalog, which makes a refused commit a CatalogConflict.
    conflict = raised_from(CatalogConflict("the Iceberg catalog refused a commit"), CommitFailedException("conflict"))
    catalog_outage = raised_from(CatalogUnavailable("the Iceberg catalog failed"), OSError("connection refused"))
    metastore = raised_from(MetastoreUnavailable("unreachable"), OperationalError("SELECT", {}, Exception("x")))
    assert retry_cause(conflict) == "catalog_conflict"
    assert retry_cause(catalog_outage) == "catalog"
    assert retry_cause(metastore) == "metastore"
    assert retry_cause(OperationalError("SELECT", {}, Exception("x"))) == "metastore"
    assert retry_cause(CommitLockLost("lost")) == "commit_lock_lost"
    assert retry_cause(RuntimeError("something else")) == "other"
    assert {retry_cause(error) for error in (conflict, catalog_outage, metastore)} <= set(metrics.RETRY_CAUSES)


class Observed:
    """Stands in for the lag histogram: the lags observed, and an event when one is over `over` seconds."""

    def __init__(self, over: float) -> None:
        self.over = over
        self.lags: list[float] = []
        self.late = asyncio.Event()

    def observe(self, lag: float) -> None:
        self.lags.append(lag)
        if lag > self.over:
            self.late.set()


async def test_a_blocked_event_loop_shows_in_its_lag(monkeypatch: pytest.MonkeyPatch) -> None:
    """On-call review: a scrape stalled /healthz for 0.36 s, and nothing said the loop was blocked."""
    observed = Observed(over=0.25)
    monkeypatch.setattr(metrics, "EVENT_LOOP_LAG_SECONDS", observed)
    watch = asyncio.create_task(metrics.watch_event_loop_lag())
    try:
        await asyncio.sleep(0)  # the watch asks for its first timer
        time.sleep(metrics.LOOP_LAG_INTERVAL_SECONDS + 0.4)  # noqa: ASYNC251 (blocking the loop is the point)
        async with asyncio.timeout(5):
            await observed.late.wait()
    finally:
        watch.cancel()
    assert 0.3 < max(observed.lags) < 1.5, observed.lags


def test_every_metric_with_a_sink_label_leaves_with_its_sink() -> None:
    labelled = {
        collector
        for collector in REGISTRY._collector_to_names  # type: ignore[attr-defined]
        if isinstance(collector, Counter | Histogram) and "sink" in collector._labelnames  # type: ignore[attr-defined]
    }
    assert labelled == set(metrics._PER_SINK)
