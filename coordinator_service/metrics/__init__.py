"""The coordinator's Prometheus metrics, in the default registry that /metrics exposes.

Counters and histograms are updated where things happen (protocol, committer,
operations), and are declared here. The per-sink gauges are no global objects:
each scrape reads them (coordinator_service.metrics.scrape).

What an SRE's queries can rely on (docs/operations.md, Metrics):

- the gauges read from the log (a sink's epochs, its last commit, its writer's
  last call) come from one replica at a time, the log's reporter (a lease in
  the metastore: coordinator_service.log.reporter_lease), so that sum() over
  replicas counts each sink once; what a process knows alone (its committer
  retrying, its pool, its loop) comes from every replica;
- the per-sink counters an alert watches exist at 0 from the first scrape that
  knows the sink (increase() sees the first anomaly), and leave with the sink;
- above METRICS_SINK_DETAIL_MAX_SINKS sinks in the log the latency histograms
  and the counters of maintenance work drop their sink label (one series per
  bucket, not one per sink and bucket);
- no `_created` series.
"""

from __future__ import annotations

import asyncio
import platform
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final

from prometheus_client import Counter, Gauge, Histogram, Info, disable_created_metrics

from coordinator_service import __version__

if TYPE_CHECKING:
    from coordinator_service.log.models import MaintenanceRun

# A counter's `_created` series doubles what a scrape carries and nobody queries it.
disable_created_metrics()  # type: ignore[no-untyped-call]

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
# Why a commit pass failed and is retried (coordinator_service.engine.committer, retry_cause).
RETRY_CAUSES: Final = ("catalog_conflict", "catalog", "metastore", "commit_lock_lost", "other")
COMMIT_RETRIES = Counter(
    "sink_coordinator_commit_retries_total",
    "Failed commit passes that will be retried, by cause: catalog_conflict (another writer committed to the table "
    "first), catalog (the catalog or its storage failed), metastore (PostgreSQL failed), commit_lock_lost, other.",
    ["sink", "cause"],
)
ABORT_CAUSES: Final = ("recovery", "operator", "reset")
ABORTED_EPOCHS = Counter(
    "sink_coordinator_aborted_epochs_total",
    "Epochs aborted, by cause: recovery (a writer restarted), operator (the abort route), reset.",
    ["sink", "cause"],
)
# What only a lost commit lock explains (coordinator_service.engine.settlement, alert).
ANOMALY_KINDS: Final = (
    "appended_after_abort",
    "appended_after_reset",
    "appended_epoch_gone",
    "aborted_files_in_table",
    "given_up_files_in_table",
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
VERIFICATION_FAILURES = Counter(
    "sink_coordinator_verification_failures_total",
    "Verifications of one of the sink's tables (the CLI's, the admin API's, the maintenance step's) that found a "
    "fault in this process.",
    ["sink"],
)
MAINTENANCE_OUTCOMES: Final = ("ok", "failed")
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
DELETE_FILES_MERGED = Counter(
    "sink_coordinator_compaction_delete_files_merged_total",
    "Position delete files merged into one per partition by compaction.",
    ["sink"],
)
ORPHANS_DELETED = Counter(
    "sink_coordinator_orphan_files_deleted_total",
    "Files under a table's location that nothing referenced, deleted by the orphan sweep.",
    ["sink"],
)
# The counters of maintenance work, by the column of maintenance_runs each counts (a maintenance step's counters:
# coordinator_service.engine.maintenance_steps).
MAINTENANCE_WORK: Final[dict[str, Counter]] = {
    "snapshots_expired": SNAPSHOTS_EXPIRED,
    "expired_files_deleted": EXPIRED_FILES_DELETED,
    "files_compacted": FILES_COMPACTED,
    "files_written": FILES_WRITTEN_BY_COMPACTION,
    "bytes_rewritten": BYTES_REWRITTEN,
    "delete_files_merged": DELETE_FILES_MERGED,
    "orphans_deleted": ORPHANS_DELETED,
}


# With several serving processes (coordinator_service.supervisor) a gauge of this kind is the most any of them saw.
MAINTENANCE_BEHIND_SECONDS = Gauge(
    "sink_coordinator_maintenance_behind_seconds",
    "How long past its MAINTENANCE_INTERVAL_SECONDS the most overdue sink's run is, at this process's last look; "
    "growing: the process does not keep up (raise MAINTENANCE_CONCURRENCY, or add replicas).",
    multiprocess_mode="livemax",
)
MAINTENANCE_DUE_SINKS = Gauge(
    "sink_coordinator_maintenance_due_sinks",
    "Sinks whose scheduled maintenance run was due at this process's last look.",
    multiprocess_mode="livemax",
)
COMMITTER_STUCK_EVENTS = Counter(
    "sink_coordinator_committer_stuck_events", "Times a sink's committer got stuck (see committer_stuck).", ["sink"]
)
GRPC_REQUESTS = Counter(
    "sink_coordinator_grpc_requests_total",
    "gRPC calls answered, by service, method and status code (OK, UNAVAILABLE, ...; refusals of the writer gate "
    "included).",
    ["service", "method", "code"],
)
HTTP_REQUESTS = Counter(
    "sink_coordinator_http_requests_total",
    "HTTP requests answered, by method, route (its template, /api/v1/sinks/{sink}; 'other' for no route) and "
    "status code (refusals of the HTTP gate included).",
    ["method", "route", "code"],
)
METASTORE_POOL_TIMEOUTS = Counter(
    "sink_coordinator_metastore_pool_timeouts_total",
    "Calls that found no free metastore connection within DATABASE_POOL_TIMEOUT_SECONDS (answered UNAVAILABLE): "
    "raise DATABASE_POOL_SIZE, or look for what holds the connections.",
)
EVENT_LOOP_LAG_SECONDS = Histogram(
    "sink_coordinator_event_loop_lag_seconds",
    "How late the event loop ran a timer (measured every LOOP_LAG_INTERVAL_SECONDS): work that blocks the loop "
    "delays every gRPC and HTTP answer by as much.",
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
BUILD_INFO = Info("sink_coordinator_build", "The coordinator's release and the Python that runs it.")
BUILD_INFO.info({"version": __version__, "python": platform.python_version()})


class SinkSeries:
    """The per-sink series of this process's counters and histograms, kept in step with the sinks the log holds.

    Each scrape (and the start) tells it the log's sinks: a new sink's counters that alerts watch start at 0 (so
    that increase() sees its first anomaly, failed maintenance run, refused deletion), and a sink gone from the log
    takes its series with it. Above `max_sinks` sinks in the log, the latency histograms and the counters of
    maintenance work are counted without a sink label (sink=""; Prometheus drops an empty label): their buckets
    would be most of the scrape.
    """

    # The counters alerts watch ("any increase"), with the label values beside the sink's: they exist from the
    # start. The others (retries, aborts, commits) are read as rates, where a first increment unseen is noise.
    INITIALIZED: Final[Sequence[tuple[Counter, Sequence[str]]]] = (
        (COMMIT_ANOMALIES, ANOMALY_KINDS),
        (MAINTENANCE_RUNS, ("failed",)),
        (DELETIONS_REFUSED, ()),
        (COMMITTER_STUCK_EVENTS, ()),
        (VERIFICATION_FAILURES, ()),
    )
    # What loses its sink label above max_sinks sinks: the latency histograms and the counters of maintenance work.
    DETAIL: Final[Sequence[Counter | Histogram]] = (
        PRECOMMIT_SECONDS,
        COMMIT_SECONDS,
        MAINTENANCE_SECONDS,
        *MAINTENANCE_WORK.values(),
    )

    def __init__(self, max_sinks: int = 200) -> None:
        self.max_sinks = max_sinks
        self._sinks: frozenset[str] = frozenset()
        self._lock = threading.Lock()

    @property
    def aggregated(self) -> bool:
        return len(self._sinks) > self.max_sinks

    def configure(self, max_sinks: int) -> None:
        """METRICS_SINK_DETAIL_MAX_SINKS (at start)."""
        with self._lock:
            was_aggregated = self.aggregated
            self.max_sinks = max_sinks
            self._relabel(was_aggregated)

    def track(self, sinks: Iterable[str]) -> None:
        """The sinks the log holds now."""
        with self._lock:
            known = frozenset(sinks)
            was_aggregated = self.aggregated
            for sink in known - self._sinks:
                for counter, values in self.INITIALIZED:
                    for value in values:
                        counter.labels(sink, value)
                    if not values:
                        counter.labels(sink)
            for sink in self._sinks - known:
                for metric in _PER_SINK:
                    metric.remove_by_labels({"sink": sink})
            self._sinks = known
            self._relabel(was_aggregated)

    def _relabel(self, was_aggregated: bool) -> None:
        if self.aggregated != was_aggregated:
            for metric in self.DETAIL:
                metric.clear()  # the other labelling's series

    def label(self, sink: str) -> str:
        """The sink label of a DETAIL metric: the sink's, or "" above max_sinks sinks in the log."""
        return "" if self.aggregated else sink

    def keeps(self, family: str, labels: dict[str, str]) -> bool:
        """Whether a series of every serving process (prometheus_client's multiprocess files, where a series this
        process removes stays in the files) is one track() and the relabelling would have kept: its sink one the
        log holds, labelled as the DETAIL metrics are now."""
        sink = labels.get("sink")
        if sink is None:
            return True
        if family in _DETAIL_FAMILIES:
            return sink == "" if self.aggregated else sink in self._sinks
        return sink in self._sinks


SINK_SERIES = SinkSeries()
_DETAIL_FAMILIES: Final = frozenset(family.name for metric in SinkSeries.DETAIL for family in metric.describe())
# Every metric with a sink label: a sink gone from the log takes its series out of each.
_PER_SINK: Final[Sequence[Counter | Histogram]] = (
    PRECOMMIT_SECONDS,
    COMMIT_SECONDS,
    COMMITS,
    COMMITTED_EPOCHS,
    COMMIT_RETRIES,
    ABORTED_EPOCHS,
    COMMIT_ANOMALIES,
    CLEANED_FILES,
    DELETIONS_REFUSED,
    MAINTENANCE_RUNS,
    MAINTENANCE_SECONDS,
    *MAINTENANCE_WORK.values(),
    COMMITTER_STUCK_EVENTS,
    VERIFICATION_FAILURES,
)


def record_commit(sink: str, epochs: int, *, snapshots: int, seconds: float) -> None:
    """One group of epochs marked COMMITTED by the committer, with the snapshots it appended for them (one per table
    with files of them; none when all are empty or were found in the tables)."""
    COMMITTED_EPOCHS.labels(sink).inc(epochs)
    COMMITS.labels(sink).inc(snapshots)
    COMMIT_SECONDS.labels(SINK_SERIES.label(sink)).observe(seconds)


def record_precommit(sink: str, seconds: float) -> None:
    PRECOMMIT_SECONDS.labels(SINK_SERIES.label(sink)).observe(seconds)


def record_maintenance(sink: str, run: MaintenanceRun, seconds: float) -> None:
    MAINTENANCE_RUNS.labels(sink, run.outcome).inc()
    label = SINK_SERIES.label(sink)
    MAINTENANCE_SECONDS.labels(label).observe(seconds)
    for column, counter in MAINTENANCE_WORK.items():
        count = getattr(run, column)
        if count:  # a run that did nothing of a kind adds no series for it
            counter.labels(label).inc(count)


# How often the event loop's lag is measured.
LOOP_LAG_INTERVAL_SECONDS: Final = 0.5


async def watch_event_loop_lag() -> None:
    """Measure, forever, how late the running loop wakes a timer: what blocks the loop (a long computation, a
    blocking call) delays every answer by as much."""
    loop = asyncio.get_running_loop()
    while True:
        asked = loop.time()
        await asyncio.sleep(LOOP_LAG_INTERVAL_SECONDS)
        EVENT_LOOP_LAG_SECONDS.observe(max(0.0, loop.time() - asked - LOOP_LAG_INTERVAL_SECONDS))
