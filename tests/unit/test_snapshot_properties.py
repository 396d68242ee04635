"""A snapshot's summary read as the coordinator reads it: pyiceberg's Summary answers None for a key it lacks (so
`key in summary` is always true, and `.get(key, default)` never gives the default); markers.snapshot_properties is
the plain mapping every reader of markers goes through."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyiceberg.table.snapshots import Operation, Snapshot, Summary

from coordinator_service.contract.markers import (
    MARKER_EPOCH,
    MARKER_GENERATION,
    MARKER_SINK,
    MARKER_SINK_ID,
    SinkIdentity,
    snapshot_properties,
)


def snapshot(**properties: str) -> Snapshot:
    return Snapshot(
        snapshot_id=1,
        sequence_number=1,
        timestamp_ms=0,
        manifest_list="file:///m.avro",
        summary=Summary(Operation.APPEND, **properties),
    )


def test_a_marker_written_before_generations_is_the_legacy_sinks_own() -> None:
    """A sink that existed before generations (and incarnations): its markers count as generation 0. On pyiceberg's
    Summary the generation's default was never used: int('None') raised."""
    legacy = snapshot(**{MARKER_SINK: "orders", MARKER_EPOCH: "3"})
    identity = SinkIdentity("orders", "5f0c", 0, legacy_markers=True)
    assert identity.owns(snapshot_properties(legacy)) is True
    assert SinkIdentity("orders", "5f0c", 1, legacy_markers=True).owns(snapshot_properties(legacy)) is False


def test_a_snapshot_without_a_marker_has_none() -> None:
    compaction = snapshot(**{"sink-coordinator.maintenance": "compaction"})
    properties = snapshot_properties(compaction)
    assert MARKER_SINK not in properties and properties.get(MARKER_GENERATION, "0") == "0"
    assert SinkIdentity("orders", "5f0c", 0).owns(properties) is None


@given(st.dictionaries(st.sampled_from([MARKER_SINK, MARKER_SINK_ID, MARKER_EPOCH, MARKER_GENERATION, "x"]), st.text()))
def test_the_properties_are_the_summary_without_its_operation(properties: dict[str, str]) -> None:
    read = snapshot_properties(snapshot(**properties))
    assert read == properties
    for key in (MARKER_SINK, MARKER_SINK_ID, MARKER_EPOCH, MARKER_GENERATION, "x"):
        assert (key in read) == (key in properties)


def test_a_snapshot_without_a_summary_has_no_properties() -> None:
    bare = Snapshot(snapshot_id=1, sequence_number=1, timestamp_ms=0, manifest_list="file:///m.avro")
    assert snapshot_properties(bare) == {}


@pytest.mark.parametrize("summary_key", [MARKER_SINK, MARKER_GENERATION])
def test_pyiceberg_summary_still_answers_none_for_a_missing_key(summary_key: str) -> None:
    """Why snapshot_properties exists: if pyiceberg ever raises KeyError instead, this fails and the helper can go."""
    summary = Summary(Operation.APPEND)
    assert summary_key in summary and summary.get(summary_key, "0") is None
