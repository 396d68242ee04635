"""The gauges a scrape reads: each sink's, from one metastore query (so that they hold what every replica did, not
only this one), and this process's connection pool, rendered through a collector of each scrape's own, so that
overlapping scrapes share nothing and a sink gone from the metastore is gone from the next scrape; then the
exposition of the whole registry."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Final

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from coordinator_service import metrics

if TYPE_CHECKING:
    pass


# prometheus_client's multiprocess mode: the directory of every serving process's metric files
# (coordinator_service.supervisor sets it).
METRICS_DIRECTORY_VARIABLE: Final = "PROMETHEUS_MULTIPROC_DIR"


@dataclass(frozen=True)
class TableGauges:
    """One table of a sink (its own, or with fan-out another): how far it is, and whether its commit is retried."""

    table: str
    committed_epoch: int
    retrying: bool


@dataclass(frozen=True)
class SinkGauges:
    """One sink's gauges, read from the metastore (and this process's committer) at a scrape."""

    sink: str
    pending: int
    aborted: int
    oldest_pending_age_seconds: float | None
    retrying: bool
    stuck: bool
    suspended: bool
    tables: Sequence[TableGauges]
    # The sink does not advance (its oldest PENDING epoch waited STALLED_AFTER_SECONDS).
    stalled: bool = False
    # Seconds since its writer's last answered call; None: none recorded (no series).
    writer_last_call_age_seconds: float | None = None
    # The log's checkpointed and committed epochs (-1: none yet); their difference is the sink's lag in epochs.
    checkpointed_epoch: int = -1
    committed_epoch: int = -1
    # When (the metastore's clock) its committed epoch was marked COMMITTED, and its newest epoch pre-committed;
    # None: not in the log (no series).
    last_commit_at: datetime | None = None
    last_precommit_at: datetime | None = None
    # How far verification proved its tables (None: never verified, no series), and whether its last failed.
    verified_epoch: int | None = None
    verification_failed: bool = False


@dataclass(frozen=True)
class PoolGauges:
    """The metastore's connection pool at a scrape (SQLAlchemy's QueuePool)."""

    in_use: int
    idle: int
    most: int


@dataclass(frozen=True)
class Scrape:
    """What one scrape read beyond this process's counters: the log's per-sink gauges (None: the metastore could
    not be read in time), whether this replica reports the log's gauges, and its connection pool."""

    sinks: Sequence[SinkGauges] | None
    log_reporter: bool = True
    pool: PoolGauges | None = None


GaugeOf = Callable[[SinkGauges], float | None]


# The gauges that are the log's: the same on every replica, reported by the log's reporter alone.
LOG_GAUGES: Final[Sequence[tuple[str, str, GaugeOf]]] = (
    ("sink_coordinator_pending_epochs", "PENDING epochs of the sink (at scrape time).", lambda s: s.pending),
    (
        "sink_coordinator_aborted_epochs_in_log",
        "ABORTED epochs still in the sink's log (at scrape time).",
        lambda s: s.aborted,
    ),
    (
        "sink_coordinator_oldest_pending_epoch_age_seconds",
        "Age of the sink's oldest PENDING epoch; 0 when there is none.",
        lambda s: s.oldest_pending_age_seconds or 0.0,
    ),
    (
        "sink_coordinator_sink_stalled",
        "1 while the sink does not advance: its oldest PENDING epoch has waited STALLED_AFTER_SECONDS (its "
        "writer died or hangs before the checkpoint, or its commits fail; the sink's `stalled` says which).",
        lambda s: 1 if s.stalled else 0,
    ),
    (
        "sink_coordinator_writer_last_call_age_seconds",
        "Seconds since the sink's writer last made a call a coordinator answered (no series before its "
        "first recorded call).",
        lambda s: s.writer_last_call_age_seconds,
    ),
    (
        "sink_coordinator_sink_suspended",
        "1 while the sink is suspended: its log is out of step with one of its tables (a restored metastore, "
        "another table, another catalog); its suspended_reason says why and how to recover.",
        lambda s: 1 if s.suspended else 0,
    ),
    (
        "sink_coordinator_checkpointed_epoch",
        "The newest epoch whose Spark checkpoint the log recorded as durable (-1: none yet).",
        lambda s: s.checkpointed_epoch,
    ),
    (
        "sink_coordinator_committed_epoch",
        "The newest epoch every table of the sink holds, with every epoch below it (-1: none yet); "
        "checkpointed_epoch minus it is the sink's lag in epochs.",
        lambda s: s.committed_epoch,
    ),
    (
        "sink_coordinator_last_commit_timestamp_seconds",
        "When the sink's committed epoch was marked COMMITTED (Unix time, the metastore's clock; no series when "
        "the log no longer has it).",
        lambda s: None if s.last_commit_at is None else s.last_commit_at.timestamp(),
    ),
    (
        "sink_coordinator_last_precommit_timestamp_seconds",
        "When the sink's newest epoch was (last) pre-committed (Unix time, the metastore's clock; no series before "
        "the first).",
        lambda s: None if s.last_precommit_at is None else s.last_precommit_at.timestamp(),
    ),
    (
        "sink_coordinator_verified_epoch",
        "The newest epoch of the sink verification proved its tables hold exactly what its topics held (the least "
        "over its tables; no series before its first verification). Behind committed_epoch: verification lags.",
        lambda s: s.verified_epoch,
    ),
    (
        "sink_coordinator_verification_failed",
        "1 while the last verification of one of the sink's tables found a fault (GET "
        "/api/v1/sinks/{sink}/verification names it); 0 otherwise, or never verified.",
        lambda s: 1 if s.verification_failed else 0,
    ),
)


# The gauges of this process's committer: each replica reports its own.
_PROCESS_GAUGES: Final[Sequence[tuple[str, str, GaugeOf]]] = (
    (
        "sink_coordinator_committer_retrying",
        "1 while this process's committer of the sink is retrying a failed commit.",
        lambda s: 1 if s.retrying else 0,
    ),
    (
        "sink_coordinator_committer_stuck",
        "1 while this process's committer of the sink waits for an operator: its commits failed in a way no "
        "retry can fix (the sink's committer.last_error says why).",
        lambda s: 1 if s.stuck else 0,
    ),
)


class _ScrapedGauges(Collector):
    """The gauges of one scrape: built for that scrape alone, so that scrapes never share them."""

    def __init__(self, scrape: Scrape) -> None:
        self._scrape = scrape

    def collect(self) -> Iterator[Metric]:
        scrape, sinks = self._scrape, self._scrape.sinks or ()
        up = GaugeMetricFamily(
            "sink_coordinator_metastore_up",
            "1 if this scrape read the metastore within METRICS_READ_TIMEOUT_SECONDS (0: the per-sink gauges are "
            "missing from it).",
        )
        up.add_metric([], 0 if scrape.sinks is None else 1)
        yield up
        reporter = GaugeMetricFamily(
            "sink_coordinator_log_reporter",
            "1 on the one replica that reports the gauges read from the log (pending epochs, committed epoch, ...) "
            "at this scrape; sum() over replicas is 1 (0 for a while after the reporter went away).",
        )
        reporter.add_metric([], 1 if scrape.log_reporter and scrape.sinks is not None else 0)
        yield reporter
        if scrape.pool is not None:
            yield from _pool_families(scrape.pool)
        for name, documentation, value in (*(LOG_GAUGES if scrape.log_reporter else ()), *_PROCESS_GAUGES):
            family = GaugeMetricFamily(name, documentation, labels=["sink"])
            for sink in sinks:
                measured = value(sink)
                if measured is not None:
                    family.add_metric([sink.sink], float(measured))
            yield family
        if scrape.log_reporter:
            committed = GaugeMetricFamily(
                "sink_coordinator_table_committed_epoch",
                "The newest epoch of the sink whose files of this table the table holds (the sink's committed "
                "epoch is the least over its tables).",
                labels=["sink", "table"],
            )
            for sink in sinks:
                for table in sink.tables:
                    committed.add_metric([sink.sink, table.table], float(table.committed_epoch))
            yield committed
        retrying = GaugeMetricFamily(
            "sink_coordinator_table_commit_retrying",
            "1 while this process's committer retries a failed commit to this table of the sink (its other tables "
            "commit meanwhile).",
            labels=["sink", "table"],
        )
        for sink in sinks:
            for table in sink.tables:
                retrying.add_metric([sink.sink, table.table], 1.0 if table.retrying else 0.0)
        yield retrying


def _pool_families(pool: PoolGauges) -> Iterator[Metric]:
    connections = GaugeMetricFamily(
        "sink_coordinator_metastore_pool_connections",
        "This process's metastore connections (its pool; the watch's and the reporter's are apart), by state: "
        "in_use, idle.",
        labels=["state"],
    )
    connections.add_metric(["in_use"], pool.in_use)
    connections.add_metric(["idle"], pool.idle)
    yield connections
    most = GaugeMetricFamily(
        "sink_coordinator_metastore_pool_max_connections",
        "The most metastore connections the pool opens (DATABASE_POOL_SIZE, and as many again for bursts): in_use "
        "near it means calls wait for a connection.",
    )
    most.add_metric([], pool.most)
    yield most


class _EveryProcess(Collector):
    """The counters, histograms and gauges of every serving process of a supervisor, summed from their
    multiprocess files (each process counts in its own), without the series of sinks the log no longer holds; and
    the build's info, the same in each."""

    def __init__(self, directory: str) -> None:
        self._files = MultiProcessCollector(None, directory)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterator[Metric]:
        yield from metrics.BUILD_INFO.collect()
        for metric in self._files.collect():  # type: ignore[no-untyped-call]
            metric.samples = [
                sample for sample in metric.samples if metrics.SINK_SERIES.keeps(metric.name, sample.labels)
            ]
            yield metric


def _counted() -> bytes:
    """The counters and histograms: this process's, or the whole coordinator's when it is one of several serving
    processes (coordinator_service.supervisor sets the directory of their files)."""
    directory = os.environ.get(METRICS_DIRECTORY_VARIABLE)
    if not directory:
        return generate_latest(REGISTRY)
    every_process = CollectorRegistry(auto_describe=False)
    every_process.register(_EveryProcess(directory))
    return generate_latest(every_process)


def exposition(sinks: Sequence[SinkGauges] | Scrape | None) -> bytes:
    """The text /metrics answers: the counters and histograms (_counted), then the gauges of this scrape (sinks
    alone, or None: the metastore could not be read). Safe from any thread: prometheus_client locks its own
    metrics."""
    scrape = sinks if isinstance(sinks, Scrape) else Scrape(sinks)
    scraped = CollectorRegistry(auto_describe=False)
    scraped.register(_ScrapedGauges(scrape))
    return _counted() + generate_latest(scraped)
