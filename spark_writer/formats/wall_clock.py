"""Wall-clock times of a time zone read as instants, as java.time, PostgreSQL and Python's zoneinfo read them.

A time the zone's clock passes twice (set back) is its earlier instant; one it skips (set forward) is read with the
offset before the gap, that is shifted forward by the gap's length (``02:30`` in a one-hour gap is ``03:30``).

Arrow reads offsets from the transitions tzdata's files list, which end in 2037; for later times it keeps the last
offset it knows, where zoneinfo, java.time and PostgreSQL go on with the zone's rule (daylight saving time in 2038 and
after): those later times take the rule's offsets from zoneinfo, one Python call each.
"""

from __future__ import annotations

import datetime as dt
from typing import Final
from zoneinfo import ZoneInfo

import pyarrow as pa
import pyarrow.compute as pc

from spark_writer.formats.decoded_batch import UTC

# The first wall-clock time past the transitions tzdata's files list (to 2037 included).
PAST_LISTED_TRANSITIONS: Final = dt.datetime(2038, 1, 1)
_MICROSECOND: Final = dt.timedelta(microseconds=1)


def instants_of_wall_clock(local: pa.Array, time_zone: str) -> pa.Array:
    """`local` (naive timestamps: wall-clock times in `time_zone`) as UTC instants, by the rule above."""
    earliest = pc.assume_timezone(local, time_zone, ambiguous="earliest", nonexistent="earliest")
    naive = pa.timestamp(local.type.unit)
    offsets = pc.subtract(pc.local_timestamp(earliest), earliest.cast(naive))
    return pc.subtract(local, _ruled_past_listed_transitions(local, time_zone, offsets)).cast(
        pa.timestamp(local.type.unit, tz=UTC)
    )


def _ruled_past_listed_transitions(local: pa.Array, time_zone: str, offsets: pa.Array) -> pa.Array:
    """`offsets` with those of the times past 2037 taken from the zone's rule (zoneinfo; fold 0: the earlier offset of
    a doubled hour, the offset before a gap)."""
    later = pc.fill_null(pc.greater_equal(local, pa.scalar(PAST_LISTED_TRANSITIONS, type=local.type)), False)
    if not pc.any(later).as_py():
        return offsets
    zone = ZoneInfo(time_zone)
    # A zone's offset is whole seconds: the time to the microsecond tells it (and fits a datetime whatever the unit).
    moments = local.cast(pa.timestamp("us"), safe=False).to_pylist()
    ruled = [
        None if moment is None or not past else _offset_microseconds(zone, moment)
        for moment, past in zip(moments, later.to_pylist(), strict=True)
    ]
    return pc.if_else(later, pa.array(ruled, pa.duration("us")).cast(offsets.type), offsets)


def _offset_microseconds(zone: ZoneInfo, moment: dt.datetime) -> int:
    offset = zone.utcoffset(moment)
    assert offset is not None, "a time zone has an offset at every moment"
    return offset // _MICROSECOND
