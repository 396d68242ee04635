"""The coordinator's Prometheus metrics, in the default registry that /metrics exposes.

Counters and histograms are updated where things happen (protocol, committer,
operations). The per-sink gauges are no global objects: each scrape reads them
from one metastore query (so that they hold what every replica did, not only
this one) and renders them through a collector of its own, so that overlapping
scrapes share nothing and a sink gone from the metastore is gone from the next
scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from coordinator_service.log.models import MaintenanceRun

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

PRECOMMIT_SECONDS = Histogram(
    "sink_coordinator_precommit_seconds",
    "Time from a PreCommit request to its durable PERSISTED answer (multi-writer epochs include the wait "
    "for the other writers).",
    ["sink"],
    buckets=_LATENCY_BUCKETS,
)
PRECOMMIT_FOOTERS = Counter(
    "sink_coordinator_precommit_footers_total",
    "Parquet footers of pre-committed data files, by source: sent by the writer (the file checked with one "
    "metadata request) or read from storage.",
    ["source"],
)
COMMIT_SECONDS = Histogram(
    "sink_coordinator_commit_seconds",
    "Time of one Iceberg commit: the append of a group of epochs and their COMMITTED update.",
    ["sink"],
    buckets=_LATENCY_BUCKETS,
)
COMMITS = Counter(
    "sink_coordinator_commits_total",
    "Iceberg snapshots the committer appended (to any of the sink's tables).",
    ["sink"],
)
COMMITTED_EPOCHS = Counter(
    "sink_coordinator_committed_epochs_total",
    "Epochs marked COMMITTED by this process (appended, empty, or found already in the table).",
    ["sink"],
)
COMMIT_RETRIES = Counter(
    "sink_coordinator_commit_retries_total",
    "Failed commit passes that will be retried (catalog conflicts or outages, metastore errors).",
    ["sink"],
)
ABORTED_EPOCHS = Counter(
    "sink_coordinator_aborted_epochs_total",
    "Epochs aborted, by cause: recovery (a writer restarted), operator (the abort route), reset.",
    ["sink", "cause"],
)
COMMIT_ANOMALIES = Counter(
    "sink_coordinator_commit_anomalies_total",
    "Commits that landed although the log had moved on (only a lost commit lock explains them): the table's "
    "content was kept and the log corrected. Alert on any increase.",
    ["sink", "kind"],
)
CLEANED_FILES = Counter(
    "sink_coordinator_cleaned_files_total", "Data files of aborted epochs deleted from storage.", ["sink"]
)
AUTHENTICATION_FAILURES = Counter(
    "sink_coordinator_authentication_failures_total",
    "Requests refused for a missing or wrong token, by API (grpc, http): probing, or a client with an old token.",
    ["api"],
)
AUTHENTICATION_FAILURES.labels("grpc")
AUTHENTICATION_FAILURES.labels("http")
DELETIONS_REFUSED = Counter(
    "sink_coordinator_deletions_refused_total",
    "Files a deletion was asked for and refused: not where the sink's tables keep their files (outside their data "
    "or metadata directory, through a symbolic link, inside another table's location). Alert on any increase.",
    ["sink"],
)
MAINTENANCE_RUNS = Counter(
    "sink_coordinator_maintenance_runs_total", "Table maintenance runs, by outcome (ok, failed).", ["sink", "outcome"]
)
MAINTENANCE_SECONDS = Histogram(
    "sink_coordinator_maintenance_seconds",
    "Time of one maintenance run (expiration, compaction, and the orphan sweep when due).",
    ["sink"],
    buckets=_LATENCY_BUCKETS,
)
SNAPSHOTS_EXPIRED = Counter("sink_coordinator_snapshots_expired_total", "Snapshots expired.", ["sink"])
EXPIRED_FILES_DELETED = Counter(
    "sink_coordinator_expired_files_deleted_total",
    "Files (data files, manifests, manifest lists) that only expired snapshots referenced, deleted.",
    ["sink"],
)
FILES_COMPACTED = Counter(
    "sink_coordinator_files_compacted_total", "Small data files replaced by compaction.", ["sink"]
)
FILES_WRITTEN_BY_COMPACTION = Counter(
    "sink_coordinator_compaction_files_written_total", "Data files written by compaction.", ["sink"]
)
BYTES_REWRITTEN = Counter(
    "sink_coordinator_compaction_bytes_rewritten_total", "Bytes of data files rewritten by compaction.", ["sink"]
)
ORPHANS_DELETED = Counter(
    "sink_coordinator_orphan_files_deleted_total",
    "Files under a table's location that nothing referenced, deleted by the orphan sweep.",
    ["sink"],
)


MAINTENANCE_BEHIND_SECONDS = Gauge(
    "sink_coordinator_maintenance_behind_seconds",
    "How long past its MAINTENANCE_INTERVAL_SECONDS the most overdue sink's run is, at this process's last look; "
    "growing: the process does not keep up (raise MAINTENANCE_CONCURRENCY, or add replicas).",
)
MAINTENANCE_DUE_SINKS = Gauge(
    "sink_coordinator_maintenance_due_sinks",
    "Sinks whose scheduled maintenance run was due at this process's last look.",
)
COMMITTER_STUCK_EVENTS = Counter(
    "sink_coordinator_committer_stuck_events", "Times a sink's committer got stuck (see committer_stuck).", ["sink"]
)


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


class _ScrapedGauges(Collector):
    """The per-sink gauges of one scrape: built for that scrape alone, so that scrapes never share them."""

    def __init__(self, sinks: Sequence[SinkGauges] | None) -> None:
        self._sinks = sinks

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "sink_coordinator_metastore_up", "1 if the per-sink gauges could be read from the metastore at this scrape."
        )
        up.add_metric([], 0 if self._sinks is None else 1)
        yield up
        families: list[tuple[str, str, Callable[[SinkGauges], float | None]]] = [
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
        ]
        for name, documentation, value in families:
            family = GaugeMetricFamily(name, documentation, labels=["sink"])
            for sink in self._sinks or ():
                measured = value(sink)
                if measured is not None:
                    family.add_metric([sink.sink], float(measured))
            yield family
        table_families: list[tuple[str, str, Callable[[TableGauges], float]]] = [
            (
                "sink_coordinator_table_committed_epoch",
                "The newest epoch of the sink whose files of this table the table holds (the sink's committed epoch "
                "is the least over its tables).",
                lambda t: t.committed_epoch,
            ),
            (
                "sink_coordinator_table_commit_retrying",
                "1 while this process's committer retries a failed commit to this table of the sink (its other "
                "tables commit meanwhile).",
                lambda t: 1 if t.retrying else 0,
            ),
        ]
        for name, documentation, table_value in table_families:
            family = GaugeMetricFamily(name, documentation, labels=["sink", "table"])
            for sink in self._sinks or ():
                for table in sink.tables:
                    family.add_metric([sink.sink, table.table], float(table_value(table)))
            yield family


def exposition(sinks: Sequence[SinkGauges] | None) -> bytes:
    """The text /metrics answers: this process's counters and histograms, then the per-sink gauges of this scrape
    (None: the metastore could not be read). Safe from any thread: prometheus_client locks its own metrics."""
    scraped = CollectorRegistry(auto_describe=False)
    scraped.register(_ScrapedGauges(sinks))
    return generate_latest(REGISTRY) + generate_latest(scraped)


def record_commit(sink: str, epochs: int, *, snapshots: int, seconds: float) -> None:
    """One group of epochs marked COMMITTED by the committer, with the snapshots it appended for them (one per table
    with files of them; none when all are empty or were found in the tables)."""
    COMMITTED_EPOCHS.labels(sink).inc(epochs)
    COMMITS.labels(sink).inc(snapshots)
    COMMIT_SECONDS.labels(sink).observe(seconds)


def record_maintenance(sink: str, run: MaintenanceRun, seconds: float) -> None:
    MAINTENANCE_RUNS.labels(sink, run.outcome).inc()
    MAINTENANCE_SECONDS.labels(sink).observe(seconds)
    SNAPSHOTS_EXPIRED.labels(sink).inc(run.snapshots_expired)
    EXPIRED_FILES_DELETED.labels(sink).inc(run.expired_files_deleted)
    FILES_COMPACTED.labels(sink).inc(run.files_compacted)
    FILES_WRITTEN_BY_COMPACTION.labels(sink).inc(run.files_written)
    BYTES_REWRITTEN.labels(sink).inc(run.bytes_rewritten)
    ORPHANS_DELETED.labels(sink).inc(run.orphans_deleted)
