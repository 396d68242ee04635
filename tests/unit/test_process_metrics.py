"""What the process's own metrics say: why a commit is retried, how late the event loop runs, and that every
metric with a sink label leaves with the sink."""

from __future__ import annotations

import asyncio
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.parser import text_string_to_metric_families
from pyiceberg.exceptions import CommitFailedException
from sqlalchemy.exc import OperationalError

from coordinator_service import __version__, metrics
from coordinator_service.contract.errors import (
    CatalogConflict,
    CatalogUnavailable,
    CommitLockLost,
    MetastoreUnavailable,
)
from coordinator_service.engine.commit_retries import retry_cause
from coordinator_service.metrics.scrape import METRICS_DIRECTORY_VARIABLE


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


# A serving process of a supervisor (coordinator_service.supervisor): it counts in the shared files.
_COUNTING = """
from coordinator_service import metrics
metrics.SINK_SERIES.track(["kept", "gone"])
for sink in ("kept", "gone"):
    metrics.record_commit(sink, 2, snapshots=1, seconds=0.01)
"""
# Another, which answers the scrape once "gone" left the log.
_SCRAPING = """
import sys
from coordinator_service import metrics
from coordinator_service.metrics.scrape import exposition
metrics.SINK_SERIES.track(["kept"])
sys.stdout.write(exposition([]).decode())
"""


def test_a_scrape_of_one_process_sums_every_process_and_leaves_out_gone_sinks(tmp_path: Path) -> None:
    environment = {**os.environ, METRICS_DIRECTORY_VARIABLE: str(tmp_path)}
    for _ in range(2):
        subprocess.run([sys.executable, "-c", _COUNTING], env=environment, check=True)
    scraped = subprocess.run(
        [sys.executable, "-c", _SCRAPING], env=environment, check=True, capture_output=True, text=True
    ).stdout
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
    }
    assert samples[("sink_coordinator_committed_epochs_total", (("sink", "kept"),))] == 4
    assert samples[("sink_coordinator_commits_total", (("sink", "kept"),))] == 2
    assert samples[("sink_coordinator_commit_seconds_count", (("sink", "kept"),))] == 2
    assert not [key for key in samples if ("sink", "gone") in key[1]]
    assert samples[("sink_coordinator_build_info", (("python", platform.python_version()), ("version", __version__)))]


def test_a_series_of_the_files_is_kept_as_the_process_would_keep_it() -> None:
    series = metrics.SinkSeries(max_sinks=2)
    series.track(["a", "b"])
    histogram = "sink_coordinator_commit_seconds"
    assert series.keeps("sink_coordinator_commits", {"sink": "a"})
    assert not series.keeps("sink_coordinator_commits", {"sink": "c"})
    assert series.keeps(histogram, {"sink": "a", "le": "0.1"})
    assert not series.keeps(histogram, {"sink": "", "le": "0.1"})  # the other labelling's, from before
    assert series.keeps("sink_coordinator_grpc_requests", {"method": "PreCommit"})
    series.track(["a", "b", "c"])  # above max_sinks: the histograms lose the sink label
    assert series.keeps(histogram, {"sink": "", "le": "0.1"})
    assert not series.keeps(histogram, {"sink": "a", "le": "0.1"})
    assert series.keeps("sink_coordinator_commits", {"sink": "c"})
