"""The per-sink gauges of /metrics: computed for each read of the metastore alone, which overlapping scrapes
share, so that scrapes never mix two reads and a sink gone from the metastore is gone from the next read."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families

from coordinator_service.admin.deps import operations_of
from coordinator_service.admin.shared_answer import SharedAnswer
from coordinator_service.engine.operations import SinkOverview
from coordinator_service.log.models import Sink
from coordinator_service.log.repository import EpochCounts
from tests.fixtures.admin import AdminFactory
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
