"""The per-sink gauges of /metrics: computed for each scrape alone, so that overlapping scrapes do not mix and a
sink gone from the metastore is gone from the next scrape."""

from __future__ import annotations

import asyncio

from prometheus_client.parser import text_string_to_metric_families

from coordinator_service.admin_deps import operations_of
from coordinator_service.models import Sink
from coordinator_service.operations import SinkOverview
from coordinator_service.repository import EpochCounts
from tests.fixtures.admin import AdminApp
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


class OverlappingReads:
    """Operations whose sinks() answers each call its own sinks, and holds the first answer back until the
    second call has read: two scrapes that overlap, the first rendered after the second read."""

    def __init__(self, *answers: dict[str, int]) -> None:
        self._answers = list(answers)
        self._second_read = asyncio.Event()

    async def sinks(self) -> list[SinkOverview]:
        first = len(self._answers) == 2
        pending_by_sink = self._answers.pop(0)
        if first:
            async with asyncio.timeout(15.0):
                await self._second_read.wait()
        else:
            self._second_read.set()
        return [
            SinkOverview(Sink(name=name), EpochCounts(pending=pending), health=None, tables=[])
            for name, pending in pending_by_sink.items()
        ]


async def test_overlapping_scrapes_each_show_their_own_sinks(admin: AdminApp) -> None:
    # "gone" is in the first read only: the sink was deleted between the two.
    reads = OverlappingReads({"gone": 3, "kept": 1}, {"kept": 2, "new": 5})
    admin.app.dependency_overrides[operations_of] = lambda: reads

    first, second = await asyncio.gather(admin.get("/metrics"), admin.get("/metrics"))

    assert first.status_code == second.status_code == 200
    first_gauges, second_gauges = sink_gauges(first.text), sink_gauges(second.text)
    assert set(first_gauges) == set(second_gauges) == set(SINK_GAUGES)
    for name in SINK_GAUGES:
        assert set(first_gauges[name]) == {"gone", "kept"}, name
        assert set(second_gauges[name]) == {"kept", "new"}, name
    assert first_gauges["sink_coordinator_pending_epochs"] == {"gone": 3, "kept": 1}
    assert second_gauges["sink_coordinator_pending_epochs"] == {"kept": 2, "new": 5}


async def test_a_sink_deleted_from_the_metastore_leaves_the_next_scrape(admin: AdminApp, database_url: str) -> None:
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
