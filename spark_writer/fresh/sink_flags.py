"""The sink's settings a fresh read needs and only the writer's flags hold: where its records are and how it decodes
and routes them, taken under the names of `sink-writer`'s own parameters (spark_writer.job.main: --bootstrap-servers
is bootstrap_servers, --format record_format, ...) and checked by the job's own settings (job_settings), so that a
value the writer refuses is refused here with the same message.

The coordinator knows the sink's tables and key; the other flags cannot be checked against the sink and must be the
writer's. The JSON schema is not among them: a fresh read decodes JSON values with the table's columns, which are the
writer's --schema and every field it added since.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, TypedDict, TypeVar

from spark_writer.formats.json_decoding import DEFAULT_JSON_TIME_ZONE, check_time_zone
from spark_writer.formats.record_decoding import BadRecordPolicy
from spark_writer.job_settings import KafkaSettings, ParseSettings, RecordFormat
from spark_writer.kafka.options import DEFAULT_STARTING_OFFSETS
from spark_writer.mutations.modes import Envelope, MutationMode, Mutations, Op, default_op_map, key_names, parse_op_map
from spark_writer.routing.routes import Routes, Unrouted, routes_from_flags

TEXT_FLAGS: Final = frozenset(
    {
        "bootstrap_servers",
        "starting_offsets",
        "schema_registry_url",
        "subject",
        "key_subject",
        "protobuf_message",
        "key",
        "op_field",
        "json_time_zone",
        "dead_letter_topic",
        "route_by",
    }
)
BOOLEAN_FLAGS: Final = frozenset(
    {"fail_on_data_loss", "decode_key", "kafka_metadata", "evolve_schema", "dynamic_routes"}
)
MAPPING_FLAGS: Final = frozenset({"kafka_option", "schema_registry_option", "op_map"})
Choice = TypeVar("Choice", RecordFormat, MutationMode, Envelope, BadRecordPolicy, Unrouted)

# ParseSettings asks a keyed JSON stream for its --schema; a fresh read decodes with the table's columns instead.
TABLE_COLUMNS: Final = "the table's columns"


class SinkFlags(TypedDict, total=False):
    """The writer's flags a fresh read takes (every one optional but bootstrap_servers and topic), by the names of
    `sink-writer`'s parameters; each means what the flag means (docs/spark-writer.md)."""

    bootstrap_servers: str
    topic: str | Sequence[str]
    kafka_option: Mapping[str, str]
    fail_on_data_loss: bool
    starting_offsets: str
    record_format: RecordFormat | str
    schema_registry_url: str
    schema_registry_option: Mapping[str, str]
    subject: str
    decode_key: bool
    key_subject: str
    protobuf_message: str
    mode: MutationMode | str
    key: str
    op_field: str
    op_map: str | Mapping[str, Op]
    cdc_envelope: Envelope | str
    kafka_metadata: bool
    evolve_schema: bool
    json_time_zone: str
    on_bad_record: BadRecordPolicy | str
    dead_letter_topic: str
    route_by: str
    route: Sequence[str]
    dynamic_routes: bool
    unrouted: Unrouted | str


@dataclass(frozen=True)
class SinkSource:
    """The sink's records and their meaning, as the writer's flags give them."""

    kafka: KafkaSettings
    parse: ParseSettings
    routes: Routes | None


def sink_source(flags: Mapping[str, object]) -> SinkSource:
    """The settings the flags give; ValueError naming an unknown flag or a value the writer refuses."""
    known = SinkFlags.__annotations__
    for name in flags:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            raise ValueError(f"unknown flag {name!r}" + (f": did you mean {close[0]!r}?" if close else ""))
    for name in ("bootstrap_servers", "topic"):
        if name not in flags:
            raise ValueError(f"{name} is required: the sink's own --{name.replace('_', '-')}")
    for name, value in flags.items():
        _check_form(name, value)
    typed = SinkFlags(**flags)  # type: ignore[typeddict-item]  # each value's form checked above
    topics = (typed["topic"],) if isinstance(typed["topic"], str) else tuple(typed["topic"])
    if not topics:
        raise ValueError("topic: give the sink's --topic (one or more)")
    kafka = KafkaSettings(
        bootstrap_servers=typed["bootstrap_servers"],
        topics=topics,
        starting_offsets=typed.get("starting_offsets", DEFAULT_STARTING_OFFSETS),
        fail_on_data_loss=typed.get("fail_on_data_loss", True),
        consumer_options=dict(typed.get("kafka_option", {})),
    )
    mode = _choice(MutationMode, typed.get("mode", MutationMode.APPEND), "mode")
    op_map = typed.get("op_map")
    mutations = Mutations(
        mode,
        key_names(typed["key"]) if typed.get("key") else (),
        typed.get("op_field"),
        parse_op_map(op_map) if isinstance(op_map, str) else dict(op_map or default_op_map()),
        None if typed.get("cdc_envelope") is None else _choice(Envelope, typed.get("cdc_envelope"), "cdc_envelope"),
    )
    record_format = _choice(RecordFormat, typed.get("record_format", RecordFormat.JSON), "record_format")
    parse = ParseSettings(
        record_format,
        TABLE_COLUMNS if record_format is RecordFormat.JSON and mutations.keyed else None,
        kafka_metadata=typed.get("kafka_metadata", False),
        evolve_schema=typed.get("evolve_schema", True),
        json_time_zone=check_time_zone(typed.get("json_time_zone", DEFAULT_JSON_TIME_ZONE)),
        on_bad_record=_choice(BadRecordPolicy, typed.get("on_bad_record", BadRecordPolicy.FAIL), "on_bad_record"),
        dead_letter_topic=typed.get("dead_letter_topic"),
        schema_registry_url=typed.get("schema_registry_url"),
        schema_registry_options=dict(typed.get("schema_registry_option", {})),
        subject=typed.get("subject"),
        decode_key=typed.get("decode_key", False),
        key_subject=typed.get("key_subject"),
        protobuf_message=typed.get("protobuf_message"),
        mutations=mutations,
    )
    routes = routes_from_flags(
        typed.get("route_by"),
        tuple(typed.get("route", ())),
        typed.get("dynamic_routes", False),
        None if typed.get("unrouted") is None else _choice(Unrouted, typed.get("unrouted"), "unrouted"),
    )
    mutations.check_route_column(typed.get("route_by"))
    return SinkSource(kafka, parse, routes)


def _check_form(name: str, value: object) -> None:
    """ValueError when a flag's value is not of its form (text, a list of texts, key=value texts, True or False)."""
    if name in TEXT_FLAGS or name == "topic":
        texts = [value] if isinstance(value, str) or name in TEXT_FLAGS else value
        if not isinstance(texts, list | tuple) or not all(isinstance(each, str) and each.strip() for each in texts):
            raise ValueError(f"{name}: {value!r} is not a non-empty text" + ("" if name in TEXT_FLAGS else " or list"))
    elif name in BOOLEAN_FLAGS and not isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not True or False")
    elif name == "route" and (not isinstance(value, list | tuple) or not all(isinstance(each, str) for each in value)):
        raise ValueError(f"route: {value!r} is not a list of VALUE=TABLE texts")
    elif name in MAPPING_FLAGS and not (
        (name == "op_map" and isinstance(value, str))
        or (isinstance(value, Mapping) and all(isinstance(each, str) for each in value))
    ):
        raise ValueError(f"{name}: {value!r} is not a mapping of texts")


def _choice(kind: type[Choice], value: object, name: str) -> Choice:
    if isinstance(value, str) and value in {each.value for each in kind}:
        return kind(value)
    raise ValueError(f"{name}: {value!r} is not one of {', '.join(each.value for each in kind)}")
