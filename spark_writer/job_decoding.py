"""How a `sink-writer` job's records become rows, built from its settings without Spark: where its dead letters go, a
registry format's schemas (and an upsert or change stream's tombstone keys), the JSON fields its decoder reads. The
job's parsers (job_records) and a fresh read (spark_writer.fresh) both build
theirs here, so that a fresh read decodes as the sink does."""

from __future__ import annotations

import pyarrow as pa

from spark_writer.formats.dead_letters import DeadLetterTarget
from spark_writer.formats.registry_decoding import RegistryValues
from spark_writer.formats.registry_subjects import (
    KEY_SUBJECT_SUFFIX,
    VALUE_SUBJECT_SUFFIX,
    RegistrySchemas,
    RegistrySubject,
    key_values,
    topic_subject,
)
from spark_writer.job_settings import KafkaSettings, ParseSettings
from spark_writer.mutations.decoding import json_value_schema


def dead_letter_target(kafka: KafkaSettings, parse: ParseSettings, sink: str) -> DeadLetterTarget | None:
    if parse.dead_letter_topic is None:
        return None
    return DeadLetterTarget(parse.dead_letter_topic, sink, kafka.producer_config())


def registry_schemas(kafka: KafkaSettings, parse: ParseSettings, sink: str) -> RegistrySchemas:
    """The decoding of Avro, Protobuf or JSON Schema values (and keys, with --decode-key), the table's schema read from
    the registry; an upsert or change stream's positions are its own (mutation_decoding), not the format's."""
    registry_format = parse.record_format.registry_format
    if registry_format is None:
        raise ValueError(f"--format {parse.record_format} is not read with a schema registry")
    value = RegistrySubject(
        registry_format, topic_subject(kafka.topics, VALUE_SUBJECT_SUFFIX, parse.subject), parse.protobuf_message
    )
    key = (
        RegistrySubject(registry_format, topic_subject(kafka.topics, KEY_SUBJECT_SUFFIX, parse.key_subject))
        if parse.decode_key
        else None
    )
    return RegistrySchemas(
        parse.registry_settings(),
        value,
        key,
        kafka_metadata=parse.kafka_metadata and not parse.mutations.keyed,
        on_bad_record=parse.on_bad_record,
        dead_letters=dead_letter_target(kafka, parse, sink),
    )


def tombstone_keys(kafka: KafkaSettings, parse: ParseSettings) -> RegistryValues | None:
    """An upsert or change stream's message keys in a registry format (its key subject's), which its tombstones
    delete; None for JSON, whose keys are objects of the key's columns."""
    registry_format = parse.record_format.registry_format
    if registry_format is None:
        return None
    subject = RegistrySubject(registry_format, topic_subject(kafka.topics, KEY_SUBJECT_SUFFIX, parse.key_subject))
    return key_values(parse.registry_settings(), subject)


def json_values(parse: ParseSettings, row: pa.Schema) -> pa.Schema:
    """The JSON fields the decoder reads of values whose rows have `row`'s columns (Spark's Arrow form): the row's,
    or an upsert or change stream's values (mutations.decoding.json_value_schema), once the row declares its key
    NOT NULL (ValueError otherwise)."""
    mutations = parse.mutations
    if not mutations.keyed:
        return row
    mutations.table_schema(row, declares_nullability=True)
    return json_value_schema(row, mutations)
