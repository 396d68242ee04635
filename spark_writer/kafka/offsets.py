"""The Kafka source's offset arithmetic: pure functions of offsets, no broker, no Spark.

Invariants the source relies on:

* Offsets are ``{topic: {partition: next_offset}}``; their JSON form is canonical
  (topics and partitions sorted), so equal offsets serialise equally and Spark's
  offset log compares them as it should.
* Keys of the offsets JSON that start with ``$`` are not topics (a Kafka topic name
  cannot hold a ``$``): ``$initial`` marks ``initialOffset``'s answer, ``$start``
  batch 0's resolved starting offsets, stored in its end offsets, and
  ``$incarnations`` which life of each topic a batch's end offsets are of
  (``Incarnation``). Every reader of offsets leaves them out.
* A batch is fully described by its (start, end) offsets: planning it again from
  the same offsets gives the same ranges.

This module imports nothing beyond the standard library (tests/unit/test_writer_imports.py checks it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

# Offsets a startingOffsets JSON may give instead of a number, as in Spark.
EARLIEST: Final = -2
LATEST: Final = -1

RESERVED_KEY_PREFIX: Final = "$"
# initialOffset's answer: {"$initial": {topic: {partition: offset}}}, the starting offsets resolved once.
INITIAL_KEY: Final = "$initial"
# Batch 0's end offsets also hold its start, so that Spark's offset log (offsets/0) keeps it durably.
START_KEY: Final = "$start"
# Every batch's end offsets also say which life of each topic they are offsets of (see Incarnation).
INCARNATIONS_KEY: Final = "$incarnations"


class PartitionKey(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


Offsets = dict[PartitionKey, int]
# startingOffsets once parsed: a keyword, or an offset (or EARLIEST / LATEST) per partition of each topic.
StartingOffsets = Literal["earliest", "latest"] | dict[str, dict[int, int]]


@dataclass(frozen=True)
class OffsetRange:
    """Records ``[start, end)`` of one topic-partition: the unit of work of one Spark task."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def key(self) -> PartitionKey:
        return PartitionKey(self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class Incarnation:
    """Which life of a topic offsets belong to: a topic deleted and created again under its name starts again at
    offset 0, and offsets of its earlier life name other records.

    ``topic_id`` is the topic's id where the broker reports one (Kafka 2.8 and later), which a new life changes.
    Without it, ``log_starts`` (each partition's earliest offset when the batch was planned) are the evidence: a
    log start never moves back within one life, so one below the start seen before means a new life. (A new life
    whose log starts where the old one's did, at 0 with no retention yet, is not told apart by them: only its log
    end below the offsets read shows it, as truncation would.)
    """

    topic_id: str | None = None
    log_starts: Mapping[int, int] = field(default_factory=dict)

    def replaced_by(self, later: Incarnation) -> bool:
        """Whether `later` is another life of the topic than this one."""
        if self.topic_id is not None and later.topic_id is not None:
            return self.topic_id != later.topic_id
        return any(later.log_starts.get(partition, start) < start for partition, start in self.log_starts.items())

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {} if self.topic_id is None else {"id": self.topic_id}
        if self.log_starts:
            data["logStarts"] = {str(partition): self.log_starts[partition] for partition in sorted(self.log_starts)}
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Incarnation:
        log_starts = {int(partition): int(offset) for partition, offset in data.get("logStarts", {}).items()}
        return cls(None if data.get("id") is None else str(data["id"]), log_starts)


Incarnations = dict[str, Incarnation]


def incarnations_of(
    topic_ids: Mapping[str, str], earliest: Mapping[PartitionKey, int], new_lives: Collection[str] = ()
) -> Incarnations:
    """Each topic's life as planning sees it now: its id where the broker gave one, else its log starts; and the
    log starts of a topic in a `new_lives`, where the batch starts reading it."""
    incarnations: Incarnations = {}
    for topic in sorted({key.topic for key in earliest}):
        starts = {key.partition: offset for key, offset in earliest.items() if key.topic == topic}
        kept = {} if topic in topic_ids and topic not in new_lives else starts
        incarnations[topic] = Incarnation(topic_ids.get(topic), kept)
    return incarnations


def incarnations_from_json(data: Mapping[str, Any]) -> Incarnations:
    """The topics' lives an offsets JSON records (none in one written before they were recorded)."""
    return {topic: Incarnation.from_json(each) for topic, each in data.get(INCARNATIONS_KEY, {}).items()}


def replaced_topics(before: Mapping[str, Incarnation], now: Mapping[str, Incarnation]) -> list[str]:
    """The topics whose life `now` is another than `before`'s: deleted and created again in between."""
    return sorted(topic for topic, earlier in before.items() if topic in now and earlier.replaced_by(now[topic]))


# --------------------------------------------------------------------------- the offsets JSON


def offsets_to_json(offsets: Mapping[PartitionKey, int]) -> dict[str, dict[str, int]]:
    """Canonical JSON form: topics and partitions sorted, so equal offsets serialise equally."""
    result: dict[str, dict[str, int]] = {}
    for key in sorted(offsets):
        result.setdefault(key.topic, {})[str(key.partition)] = offsets[key]
    return result


def offsets_from_json(data: Mapping[str, Any]) -> Offsets:
    """Offsets of the topics in an offsets JSON (the reserved ``$`` keys are left out)."""
    return {
        PartitionKey(topic, int(partition)): int(offset)
        for topic, partitions in data.items()
        if not topic.startswith(RESERVED_KEY_PREFIX)
        for partition, offset in partitions.items()
    }


def initial_offsets_json(starting: Mapping[PartitionKey, int]) -> dict[str, Any]:
    """What ``initialOffset`` answers: the resolved starting offsets, marked as not yet in the checkpoint."""
    return {INITIAL_KEY: offsets_to_json(starting)}


def planned_end_json(
    start: Mapping[str, Any], end: Mapping[PartitionKey, int], incarnations: Mapping[str, Incarnation]
) -> dict[str, Any]:
    """End offsets of a batch as Spark stores them, with the topics' lives they are offsets of; batch 0's also
    carry its start (the resolved starting offsets), so that Spark's offset log keeps them durably before the
    batch runs."""
    result: dict[str, Any] = offsets_to_json(end)
    if incarnations:
        lives = {topic: incarnations[topic].to_json() for topic in sorted(incarnations)}
        result = {INCARNATIONS_KEY: lives, **result}
    if INITIAL_KEY in start:
        result = {START_KEY: start[INITIAL_KEY], **result}
    return result


def batch_start_offsets(start: Mapping[str, Any], end: Mapping[str, Any] | None = None) -> Offsets:
    """Where a batch starts: for batch 0 the starting offsets its end recorded when it was planned (never
    those resolved again when Spark asks ``initialOffset`` once more), else its start; and for a topic that its
    end records as another life than its start does (deleted and created again), the new life's log starts."""
    if end is not None and START_KEY in end:
        return offsets_from_json(end[START_KEY])
    if INITIAL_KEY in start:
        return offsets_from_json(start[INITIAL_KEY])
    offsets = offsets_from_json(start)
    if end is None:
        return offsets
    replaced = replaced_topics(incarnations_from_json(start), incarnations_from_json(end))
    return from_new_lives(offsets, replaced, offsets_from_json(end), incarnations_from_json(end))


def from_new_lives(
    start: Mapping[PartitionKey, int],
    replaced: Collection[str],
    end_or_latest: Mapping[PartitionKey, int],
    now: Mapping[str, Incarnation],
) -> Offsets:
    """`start` with the partitions of the `replaced` topics starting at their new life's log start (0 where the new
    life's log start is not recorded: an id tells the lives apart)."""
    offsets = {key: offset for key, offset in start.items() if key.topic not in replaced}
    for key in end_or_latest:
        if key.topic in replaced:
            offsets[key] = now[key.topic].log_starts.get(key.partition, 0)
    return offsets


# --------------------------------------------------------------------------- where the stream starts


def resolve_starting_offsets(
    spec: StartingOffsets, earliest: Mapping[PartitionKey, int], latest: Mapping[PartitionKey, int]
) -> Offsets:
    """Concrete start offsets for the partitions that exist now (keys of ``earliest``)."""
    if spec == "earliest":
        return dict(earliest)
    if spec == "latest":
        return {key: latest[key] for key in earliest}
    _check_spec_covers_partitions(spec, set(earliest))
    resolved: Offsets = {}
    for key in earliest:
        requested = spec[key.topic][key.partition]
        resolved[key] = {EARLIEST: earliest[key], LATEST: latest[key]}.get(requested, requested)
    return resolved


def _check_spec_covers_partitions(spec: Mapping[str, Mapping[int, int]], existing: set[PartitionKey]) -> None:
    requested = {PartitionKey(topic, partition) for topic, parts in spec.items() for partition in parts}
    unknown = sorted(requested - existing)
    missing = sorted(existing - requested)
    if unknown or missing:
        raise ValueError(
            "startingOffsets JSON must name exactly the partitions of the subscribed topics; "
            f"unknown partitions: {[str(k) for k in unknown]}, "
            f"missing partitions: {[str(k) for k in missing]}"
        )


# --------------------------------------------------------------------------- planning a batch


def spread_max_rows(available: Mapping[PartitionKey, int], max_rows: int) -> dict[PartitionKey, int]:
    """Share ``max_rows`` (maxOffsetsPerTrigger) between partitions in proportion to their backlogs.

    Everything is granted when the backlogs fit under the cap. Otherwise each partition
    with a backlog gets its proportional share ``max_rows * backlog / total`` rounded
    down, or 1 when that share is below one, so that no partition starves however small
    the cap; then the records the rounding down left under the cap go, one each, to the
    partitions with the largest remainders (the largest remainder method). A batch
    therefore holds exactly ``max(max_rows, sum of the rounded shares)``: the cap, unless
    the shares raised to one push it over, by at most one record per such partition. No
    partition is given more than its backlog.

    How this compares with Spark's Kafka source (``KafkaMicroBatchStream.rateLimit``;
    ``KafkaOffsetRangeCalculator`` only splits the planned ranges into tasks and caps
    nothing): Spark computes the same shares (in doubles, here in exact integers) with the
    same rounding, down or up to 1 below one, and stops there. Each partition gets here
    what it gets in Spark, plus one record for as many of the partitions with the largest
    remainders as Spark's batch falls short of the cap: Spark's batches hold up to one
    record per partition fewer, so draining a backlog can take it one more batch of a few
    records. The backlogs are the caller's: ``plan_end_offsets`` counts from the earliest
    offset still in the log, where Spark counts from the batch's start offset.
    """
    waiting = {key: rows for key, rows in available.items() if rows > 0}
    total = sum(waiting.values())
    if total <= max_rows:
        return {key: max(0, rows) for key, rows in available.items()}
    granted = dict.fromkeys(available, 0)
    for key, rows in waiting.items():
        granted[key] = max(1, max_rows * rows // total)
    left_over = max_rows - sum(granted.values())
    # Only a share rounded down has a remainder to rank; one raised to 1 has had more than its share.
    rounded_down = [key for key in waiting if max_rows * waiting[key] >= total]
    for key in sorted(rounded_down, key=lambda key: (-(max_rows * waiting[key] % total), key))[: max(0, left_over)]:
        granted[key] += 1
    return granted


def cap_to_target(
    latest: Mapping[PartitionKey, int], target: Mapping[PartitionKey, int], start: Mapping[PartitionKey, int]
) -> Offsets:
    """Latest offsets limited to a Trigger.AvailableNow target: partitions born later are left out, and one the
    stream reads but the target lacks stays where it is (never forgotten, which would read it again from 0)."""
    capped = {key: min(offset, target[key]) for key, offset in latest.items() if key in target}
    capped.update(
        {key: min(offset, start[key]) for key, offset in latest.items() if key not in target and key in start}
    )
    return capped


def plan_end_offsets(
    start: Mapping[PartitionKey, int],
    earliest: Mapping[PartitionKey, int],
    latest: Mapping[PartitionKey, int],
    max_rows: int | None,
) -> Offsets:
    """End offsets of the next batch.

    New partitions (in ``latest`` but not in ``start``) start at 0. Where records
    below the start were deleted, reading resumes from ``earliest`` and the cap
    counts only what is still there (whether skipping is allowed is decided per
    range by the data-loss policy). Partitions that vanished are left out, so that a
    topic created again is new and read from its start (whether losing them is
    allowed is decided first, by ``kafka_data_loss.find_lost_partitions``); a log
    end below the start becomes the end.
    """
    read_from = {key: max(start.get(key, 0), earliest.get(key, 0)) for key in latest}
    available = {key: max(0, latest[key] - read_from[key]) for key in latest}
    granted = available if max_rows is None else spread_max_rows(available, max_rows)
    end: Offsets = {}
    for key in latest:
        if key in start and latest[key] < start[key]:
            end[key] = latest[key]
        else:
            end[key] = read_from[key] + granted[key]
    return end


def plan_ranges(start: Mapping[PartitionKey, int], end: Mapping[PartitionKey, int]) -> list[OffsetRange]:
    """Non-empty ``[start, end)`` ranges, one per partition (never split); new partitions start at 0."""
    ranges = [OffsetRange(key.topic, key.partition, start.get(key, 0), offset) for key, offset in end.items()]
    return sorted((r for r in ranges if r.size > 0), key=lambda r: r.key)


def offsets_covered(start: Mapping[str, Any] | None, end: Mapping[str, Any]) -> int:
    """How many offsets a planned batch reads, from its start and end offsets as Spark keeps and reports them (None:
    batch 0's start): its records, and any transaction markers and aborted records among them."""
    first = batch_start_offsets(start or {}, end)
    return sum(planned.size for planned in plan_ranges(first, offsets_from_json(end)))
