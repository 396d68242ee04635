"""The per-sink gauges of /metrics: computed for each read of the metastore alone, which overlapping scrapes
share, so that scrapes never mix two reads and a sink gone from the metastore is gone from the next read."""

from __future__ import annotations

import asyncio
import platform
import time
from collections.abc import Awaitable, Callable

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from coordinator_service import __version__
from coordinator_service.admin.deps import operations_of
from coordinator_service.admin.shared_answer import SharedAnswer
from coordinator_service.engine.operator.answers import SinkOverview
from coordinator_service.log.models import Sink
from coordinator_service.log.reporter_lease import ReporterLease
from coordinator_service.log.sink_rows import EpochCounts
from coordinator_service.metrics import ANOMALY_KINDS
from tests.fixtures.admin import AdminFactory, eventually
from tests.fixtures.postgres import query

SINK_GAUGES = (
    "sink_coordinator_pending_epochs",
    "sink_coordinator_aborted_epochs_in_log",
    "sink_coordinator_oldest_pending_epoch_age_seconds",
    "sink_coordinator_committer_retrying",
    "sink_coordinator_committer_stuck",
)


def sink_gauges(text: str) -> dict[str, dict[str, float]]:
    """Each per-sink gauge of a scrape: its value by sink."""
    return {
        family.name: {sample.labels["sink"]: sample.value for sample in family.samples}
        for family in text_string_to_metric_families(text)
        if family.name in SINK_GAUGES
    }


class HeldReads:
    """Operations whose sinks() answers each call its own sinks, the first held back until the test lets it go."""

    def __init__(self, *answers: dict[str, int]) -> None:
        self._answers = list(answers)
        self.reads = 0
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def sinks(self) -> list[SinkOverview]:
        self.reads += 1
        pending_by_sink = self._answers.pop(0)
        self.reading.set()
        async with asyncio.timeout(15.0):
            await self.release.wait()
        return [
            SinkOverview(Sink(name=name), EpochCounts(pending=pending), health=None, tables=[])
            for name, pending in pending_by_sink.items()
        ]


class CountedAsks(SharedAnswer[bytes]):
    """The scrapes' shared answer, saying when the second scrape has asked for it."""

    def __init__(self) -> None:
        super().__init__(fresh_seconds=0.0)
        self.asks = 0
        self.second_asked = asyncio.Event()

    async def get(self, compute: Callable[[], Awaitable[bytes]]) -> bytes:
        self.asks += 1
        if self.asks == 2:
            self.second_asked.set()
        return await super().get(compute)


async def test_overlapping_scrapes_share_one_read_and_the_next_reads_again(admin_factory: AdminFactory) -> None:
    admin = await admin_factory(metrics_cache_seconds=0.0)
    # "gone" is in the first read only: the sink was deleted between the two.
    reads = HeldReads({"gone": 3, "kept": 1}, {"kept": 2, "new": 5})
    admin.app.dependency_overrides[operations_of] = lambda: reads
    asks = admin.app.state.metrics_answer = CountedAsks()

    first = asyncio.create_task(admin.get("/metrics"))
    second = asyncio.create_task(admin.get("/metrics"))
    async with asyncio.timeout(15.0):
        await reads.reading.wait()
        await asks.second_asked.wait()  # the second scrape arrived while the first read is under way
    reads.release.set()
    overlapping = await asyncio.gather(first, second)
    assert reads.reads == 1
    for scrape in overlapping:
        assert scrape.status_code == 200
        gauges = sink_gauges(scrape.text)
        assert set(gauges) == set(SINK_GAUGES)
        for name in SINK_GAUGES:
            assert set(gauges[name]) == {"gone", "kept"}, name
        assert gauges["sink_coordinator_pending_epochs"] == {"gone": 3, "kept": 1}

    later = sink_gauges((await admin.get("/metrics")).text)
    assert reads.reads == 2
    assert later["sink_coordinator_pending_epochs"] == {"kept": 2, "new": 5}


async def test_a_sink_deleted_from_the_metastore_leaves_the_next_scrape(
    admin_factory: AdminFactory, database_url: str
) -> None:
    admin = await admin_factory(metrics_cache_seconds=0.0)
    for sink in ("kept", "deleted"):
        registration = await admin.register(sink, table=f"db.{sink}")
        await admin.pre_commit(sink, registration, 0, 0)
    gauges = sink_gauges((await admin.get("/metrics")).text)
    assert gauges["sink_coordinator_pending_epochs"] == {"deleted": 1, "kept": 1}

    query(database_url, "DELETE FROM sinks WHERE name = %s", "deleted")  # its epochs go with it (ON DELETE CASCADE)

    gauges = sink_gauges((await admin.get("/metrics")).text)
    for name in SINK_GAUGES:
        assert set(gauges[name]) == {"kept"}, name
    assert gauges["sink_coordinator_pending_epochs"] == {"kept": 1}


async def test_a_sinks_lag_in_epochs_is_its_checkpointed_epoch_minus_its_committed_epoch(
    admin_factory: AdminFactory,
) -> None:
    """The alert on lag (the chart's rules) compares these two: a checkpoint recorded and not yet committed (the
    commit interval holds it back) shows as checkpointed ahead of committed; a sink never checkpointed shows -1."""
    admin = await admin_factory(metrics_cache_seconds=0.0, commit_interval_seconds=3600.0)
    registration = await admin.register("orders")
    await admin.register("idle", table="db.idle")
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0  # a waiting checkpoint commits at once
    for epoch in (1, 2):
        await admin.pre_commit("orders", registration, epoch, epoch * 10)
    assert await admin.checkpoint("orders", registration, 2, wait=False) == 0  # the interval holds 1 and 2 back

    families = {family.name: family for family in text_string_to_metric_families((await admin.get("/metrics")).text)}
    for name, want in (("checkpointed", {"orders": 2, "idle": -1}), ("committed", {"orders": 0, "idle": -1})):
        samples = families[f"sink_coordinator_{name}_epoch"].samples
        assert {sample.labels["sink"]: sample.value for sample in samples} == want, name


def families_of(text: str) -> dict[str, Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def values_by_sink(family: Metric) -> dict[str, float]:
    return {sample.labels["sink"]: sample.value for sample in family.samples}


async def test_a_sinks_last_commit_and_last_pre_commit_are_timestamps_from_the_log(
    admin_factory: AdminFactory,
) -> None:
    """An alert on a sink that stopped committing (or whose writer stopped pre-committing) compares these with
    time(); a sink with no epoch yet has no series."""
    admin = await admin_factory(metrics_cache_seconds=0.0)
    before = time.time() - 1  # the metastore's clock is this machine's; its now() is the transaction's start
    registration = await admin.register("orders")
    await admin.register("idle", table="db.idle")
    await admin.pre_commit("orders", registration, 0, 0)
    assert await admin.checkpoint("orders", registration, 0) == 0
    committed = time.time() + 1
    await admin.pre_commit("orders", registration, 1, 10)
    after = time.time() + 1

    families = families_of((await admin.get("/metrics")).text)
    last_commit = values_by_sink(families["sink_coordinator_last_commit_timestamp_seconds"])
    last_precommit = values_by_sink(families["sink_coordinator_last_precommit_timestamp_seconds"])
    assert set(last_commit) == set(last_precommit) == {"orders"}
    assert before <= last_commit["orders"] <= committed
    assert last_commit["orders"] <= last_precommit["orders"] <= after


async def test_the_counters_alerts_watch_exist_at_0_from_the_first_scrape_and_leave_with_their_sink(
    admin_factory: AdminFactory, database_url: str
) -> None:
    """On-call review: a labelled counter born at its first increment has no earlier sample, so increase() never
    sees its first anomaly. Nor do created timestamps belong in the scrape. The sink's name is this test's alone: the
    metrics are the process's, and an earlier test's sink of the same name may have counted."""
    admin = await admin_factory(metrics_cache_seconds=0.0)
    await admin.register("alerted", table="db.alerted")
    text = (await admin.get("/metrics")).text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    expected = [
        *(("sink_coordinator_commit_anomalies_total", (("kind", kind), ("sink", "alerted"))) for kind in ANOMALY_KINDS),
        ("sink_coordinator_maintenance_runs_total", (("outcome", "failed"), ("sink", "alerted"))),
        ("sink_coordinator_deletions_refused_total", (("sink", "alerted"),)),
        ("sink_coordinator_committer_stuck_events_total", (("sink", "alerted"),)),
    ]
    for key in expected:
        assert samples.get(key) == 0.0, key
    assert not [name for name, _ in samples if name.endswith("_created")]
    assert samples[("sink_coordinator_build_info", (("python", platform.python_version()), ("version", __version__)))]

    query(database_url, "DELETE FROM sinks WHERE name = %s", "alerted")
    text = (await admin.get("/metrics")).text
    assert 'sink="alerted"' not in text


async def test_a_metastore_read_past_its_limit_answers_metastore_up_0_in_time(admin_factory: AdminFactory) -> None:
    """On-call review: the scrape waited on the metastore for as long as the metastore took; Prometheus gave up
    first (its scrape_timeout, 10 s by default) and reported the target down instead of the metastore."""
    # METRICS_READ_TIMEOUT_SECONDS: 5 by default. The fixture keeps the metastore's watch out of the way: in CI it
    # took the metastore for down, and the scrape answered at once from the watch, never reaching the read limit.
    admin = await admin_factory(metrics_cache_seconds=0.0)
    stalled = HeldReads({"orders": 1})  # never released: a metastore that takes its time
    admin.app.dependency_overrides[operations_of] = lambda: stalled
    started = time.monotonic()
    with capture_logs() as logs:
        async with asyncio.timeout(15):
            scrape = await admin.get("/metrics")
    # The read limit answered, not anything before it: the read began and the scrape gave up on it.
    assert stalled.reads == 1
    [gave_up] = [line for line in logs if line["event"] == "metrics scrape could not read the metastore"]
    assert gave_up["error"] == "no answer within 5 s"
    # In time: before Prometheus's default scrape_timeout (10 s). The rest of the answer took up to 3.7 s more on 2
    # cores busy with the suite's other workers.
    assert time.monotonic() - started < 10
    families = families_of(scrape.text)
    assert families["sink_coordinator_metastore_up"].samples[0].value == 0
    assert "sink_coordinator_pending_epochs{" not in scrape.text
    assert "sink_coordinator_commits" in families  # this process's counters are there all the same


async def test_latency_histograms_lose_the_sink_label_above_the_sink_count(admin_factory: AdminFactory) -> None:
    """On-call review: 70,675 series at 1,502 sinks, most of them the buckets of per-sink histograms."""
    admin = await admin_factory(metrics_cache_seconds=0.0, metrics_sink_detail_max_sinks=1)

    def precommit_sinks(text: str) -> set[str]:
        return {sample.labels["sink"] for sample in families_of(text)["sink_coordinator_precommit_seconds"].samples}

    def unlabelled_count(text: str) -> float:
        return sum(
            sample.value
            for sample in families_of(text)["sink_coordinator_precommit_seconds"].samples
            if sample.name.endswith("_count") and sample.labels["sink"] == ""
        )

    # The histograms are the process's: other tests' sinks may be in them; this test looks at its own.
    first = await admin.register("first", table="db.first")
    await admin.pre_commit("first", first, 0, 0)
    below = (await admin.get("/metrics")).text
    assert "first" in precommit_sinks(below)

    second = await admin.register("second", table="db.second")
    await admin.get("/metrics")  # two sinks in the log now: above the bound
    await admin.pre_commit("second", second, 0, 0)
    await admin.pre_commit("first", first, 1, 10)
    text = (await admin.get("/metrics")).text
    assert {"first", "second"}.isdisjoint(precommit_sinks(text))  # no label in Prometheus
    assert unlabelled_count(text) - unlabelled_count(below) == 2


async def test_one_replica_at_a_time_reports_the_gauges_read_from_the_log(admin_factory: AdminFactory) -> None:
    """On-call review: every replica exported every sink's pending epochs, so sum() counted each sink once per
    replica. The log's gauges come from the replica holding the reporter lease; what is a process's own (its
    committer retrying) from each."""
    # The scrape's read of the log is not what this test is about: a loaded machine's slow read must not drop it.
    first = await admin_factory(metrics_cache_seconds=0.0, metrics_read_timeout_seconds=120.0)
    second = await admin_factory(metrics_cache_seconds=0.0, metrics_read_timeout_seconds=120.0)
    registration = await first.register("orders")
    await first.pre_commit("orders", registration, 0, 0)

    def reported(text: str) -> tuple[float, dict[str, float], dict[str, float]]:
        families = families_of(text)
        pending = families.get("sink_coordinator_pending_epochs")  # none at all on a replica that does not report
        return (
            families["sink_coordinator_log_reporter"].samples[0].value,
            {} if pending is None else values_by_sink(pending),
            values_by_sink(families["sink_coordinator_committer_retrying"]),
        )

    assert reported((await first.get("/metrics")).text) == (1, {"orders": 1}, {"orders": 0})
    assert reported((await second.get("/metrics")).text) == (0, {}, {"orders": 0})
    assert reported((await first.get("/metrics")).text)[0] == 1  # it keeps the role

    await first.runtime.lease.stop()  # the reporter stops (or dies): the next replica scraped takes over
    assert reported((await second.get("/metrics")).text) == (1, {"orders": 1}, {"orders": 0})
    assert reported((await first.get("/metrics")).text)[0] == 0


async def test_the_metastore_pool_is_in_the_scrape(admin_factory: AdminFactory) -> None:
    admin = await admin_factory(metrics_cache_seconds=0.0, database_pool_size=3)
    families = families_of((await admin.get("/metrics")).text)
    connections = {
        sample.labels["state"]: sample.value
        for sample in families["sink_coordinator_metastore_pool_connections"].samples
    }
    assert set(connections) == {"in_use", "idle"}
    assert families["sink_coordinator_metastore_pool_max_connections"].samples[0].value == 6


async def test_a_reporter_nobody_scrapes_gives_the_role_up(admin_factory: AdminFactory) -> None:
    """A replica taken out of the Service (or a coordinator started by hand on the same metastore and scraped once)
    must not keep the log's gauges from the replicas Prometheus scrapes."""
    stray = await admin_factory(metrics_cache_seconds=0.0)
    scraped = await admin_factory(metrics_cache_seconds=0.0)
    # The stray's idle time passes when the test says so: on the wall clock, a slow moment between the two first
    # scrapes would give the lease away before the second one.
    now = 0.0
    await stray.runtime.lease.stop()
    stray.runtime.lease = ReporterLease(stray.runtime.database, idle_seconds=0.5, clock=lambda: now)
    stray.runtime.lease.start()
    assert "sink_coordinator_log_reporter 1.0" in (await stray.get("/metrics")).text
    assert "sink_coordinator_log_reporter 0.0" in (await scraped.get("/metrics")).text
    now += 1.0

    async def taken_over() -> bool:
        return "sink_coordinator_log_reporter 1.0" in (await scraped.get("/metrics")).text

    await eventually(taken_over, "the scraped replica reporting the log's gauges")
