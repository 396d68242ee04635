"""The settings of a `sink-writer` job, each checked when it is built (before Spark starts): where the records are
(Kafka), what they are and mean (their format, an upsert or change stream's key), and where they go (the sink)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Final

from spark_writer.formats.json_decoding import DEFAULT_JSON_TIME_ZONE
from spark_writer.formats.record_decoding import BadRecordPolicy
from spark_writer.formats.registry_subjects import RegistryFormat
from spark_writer.formats.schema_registry import RegistrySettings
from spark_writer.kafka.options import DEFAULT_STARTING_OFFSETS, SOURCE_NAME, parse_options
from spark_writer.mutations.modes import Mutations
from spark_writer.routing.routes import Routes
from spark_writer.sink.partitioning import parse_partition_specs
from spark_writer.sink.sink_arguments import (
    DEFAULT_COORDINATOR_RETRY_SECONDS,
    DEFAULT_TARGET_FILE_SIZE_BYTES,
    check_names,
)
from spark_writer.sink.storage import Storage

DEFAULT_SAMPLE_SIZE: Final = 1000


class RecordFormat(StrEnum):
    JSON = "json"
    AVRO = "avro"
    PROTOBUF = "protobuf"
    JSON_SCHEMA = "json-schema"
    RAW = "raw"

    @property
    def registry_format(self) -> RegistryFormat | None:
        """The format of values written with a schema registry, None for json and raw."""
        return None if self in (RecordFormat.JSON, RecordFormat.RAW) else RegistryFormat(self.value)


class KafkaSource(StrEnum):
    """Which Spark source reads Kafka: this project's Python one (no jar), or Spark's own connector."""

    PYTHON = "python"
    SPARK = "spark"


# Spark's Kafka connector (spark-sql-kafka-0-10), when its jar is on the classpath.
SPARK_KAFKA_PROVIDER: Final = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
SPARK_KAFKA_FORMAT: Final = "kafka"


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str = DEFAULT_STARTING_OFFSETS
    max_offsets_per_trigger: int | None = None
    fail_on_data_loss: bool = True
    consumer_options: dict[str, str] = field(default_factory=dict)
    source: KafkaSource = KafkaSource.PYTHON

    def __post_init__(self) -> None:
        parse_options(self._options())  # the source's own options refused now (ValueError), not once Spark runs

    @property
    def source_format(self) -> str:
        return SOURCE_NAME if self.source is KafkaSource.PYTHON else SPARK_KAFKA_FORMAT

    def source_options(self) -> dict[str, str]:
        """The options of the source: the same for both but what Spark's needs to read as the Python one does."""
        options = self._options()
        if self.source is KafkaSource.SPARK:
            # Committed records only, as the Python source reads them (Spark's reads aborted ones by default), and
            # the headers, which dead letters keep.
            options.update({"kafka.isolation.level": "read_committed", "includeHeaders": "true"})
        return options

    def _options(self) -> dict[str, str]:
        options = {
            "kafka.bootstrap.servers": self.bootstrap_servers,
            "subscribe": ",".join(self.topics),
            "startingOffsets": self.starting_offsets,
            "failOnDataLoss": str(self.fail_on_data_loss).lower(),
            **{f"kafka.{key}": value for key, value in self.consumer_options.items()},
        }
        if self.max_offsets_per_trigger is not None:
            options["maxOffsetsPerTrigger"] = str(self.max_offsets_per_trigger)
        return options

    def producer_config(self) -> dict[str, str]:
        """librdkafka settings of a producer to the same cluster (dead letters)."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.consumer_options}


@dataclass(frozen=True)
class ParseSettings:
    record_format: RecordFormat = RecordFormat.JSON
    schema_ddl: str | None = None
    sample_size: int = DEFAULT_SAMPLE_SIZE
    evolve_schema: bool = True
    kafka_metadata: bool = False
    json_time_zone: str = DEFAULT_JSON_TIME_ZONE
    on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL
    dead_letter_topic: str | None = None
    # avro, protobuf and json-schema: where the schemas are, and which subjects the table follows.
    schema_registry_url: str | None = None
    schema_registry_options: dict[str, str] = field(default_factory=dict)
    subject: str | None = None  # default: <topic>-value
    decode_key: bool = False  # keys in the same format, as a `key` column
    key_subject: str | None = None  # default: <topic>-key
    protobuf_message: str | None = None  # default: the schema's first message
    # What the records mean: appended rows, or an upsert or change stream's (spark_writer.mutations.modes).
    mutations: Mutations = field(default_factory=Mutations)

    def __post_init__(self) -> None:
        if (self.on_bad_record is BadRecordPolicy.DEAD_LETTER) != (self.dead_letter_topic is not None):
            raise ValueError("--dead-letter-topic is required with --on-bad-record dead-letter, and only then")
        self._check_mutations()
        registry_format = self.record_format.registry_format
        if registry_format is None:
            given = [
                flag
                for flag, value in (
                    ("--schema-registry-url", self.schema_registry_url),
                    ("--schema-registry-option", self.schema_registry_options),
                    ("--subject", self.subject),
                    ("--decode-key", self.decode_key),
                    ("--key-subject", self.key_subject),
                    ("--protobuf-message", self.protobuf_message),
                )
                if value
            ]
            if given:
                raise ValueError(f"{', '.join(given)}: only with --format avro, protobuf or json-schema")
            return
        if self.schema_registry_url is None:
            raise ValueError(f"--format {self.record_format} reads its schemas from a schema registry: pass its URL")
        if self.schema_ddl is not None:
            raise ValueError(
                f"--schema is for --format json: with --format {self.record_format} the table's schema is the "
                "subject's in the registry"
            )
        if self.key_subject is not None and not (self.decode_key or self.mutations.keyed):
            raise ValueError("--key-subject names the subject of the keys: pass --decode-key too")
        if self.protobuf_message is not None and registry_format is not RegistryFormat.PROTOBUF:
            raise ValueError("--protobuf-message is for --format protobuf")
        self.registry_settings()  # its options checked

    def _check_mutations(self) -> None:
        """An upsert or change stream decodes its records with a schema that declares its key, and a record that does
        not fit has no key to write it under."""
        mode = self.mutations.mode
        if not self.mutations.keyed:
            return
        if self.record_format is RecordFormat.RAW:
            raise ValueError(f"--mode {mode} decodes its records: --format json, avro, protobuf or json-schema")
        if self.record_format is RecordFormat.JSON and self.schema_ddl is None:
            raise ValueError(f"--mode {mode} with --format json needs --schema, its --key columns NOT NULL")
        if self.on_bad_record is BadRecordPolicy.NULL:
            raise ValueError(
                f"--mode {mode}: --on-bad-record null would write a record that does not fit with null columns, its "
                "key among them: fail or dead-letter"
            )
        if self.decode_key:
            raise ValueError(
                f"--mode {mode} reads the message keys of its tombstones, not as a column: no --decode-key"
            )

    def registry_settings(self) -> RegistrySettings:
        """The schema registry's settings (ValueError for options its client refuses)."""
        if self.schema_registry_url is None:
            raise ValueError(f"--format {self.record_format} has no schema registry")
        return RegistrySettings.of(self.schema_registry_url, self.schema_registry_options)


@dataclass(frozen=True)
class SinkSettings:
    sink: str
    table: str
    coordinator: str
    checkpoint_location: str
    writer_token: str | None = None
    partition_by: tuple[str, ...] = ()
    target_file_size_bytes: int = DEFAULT_TARGET_FILE_SIZE_BYTES
    processing_time: str | None = None
    available_now: bool = False
    coordinator_retry_seconds: float = DEFAULT_COORDINATOR_RETRY_SECONDS
    storage: dict[str, str] = field(default_factory=dict)
    routes: Routes | None = None

    def __post_init__(self) -> None:
        check_names(self.sink, self.table)
        parse_partition_specs(self.partition_by)
        if self.target_file_size_bytes <= 0:
            raise ValueError(f"--target-file-size must be positive, got {self.target_file_size_bytes}")
        Storage(self.storage)  # unknown keys and bad values refused before Spark starts
