"""Avro, Protobuf and JSON Schema topics into table rows: the table's schema from the registry, kept up to date.

``RegistrySchemas`` follows a topic's subjects and gives the decoding of its records
(``registry_decoding`` decodes, in the writer's tasks): the sink's parser
(``spark_writer.sink.registry_records.RegistryBatchParser``) asks it before every batch,
a fresh read (``spark_writer.fresh``) once. The rule for the table's schema:

* The table has the columns of the subject's latest registered version when the
  job starts (``<topic>-value``, Confluent's TopicNameStrategy, unless a subject is
  named), then the key's (one ``key`` column) when keys are decoded.
* With ``evolve``, the driver asks the registry for the subject's latest version
  before every batch, and when it is a new one, for every version registered since
  the one read last (one superseded in between holds fields its records have). A
  version with new top-level fields adds them as columns (the writer pre-commits
  with evolve_schema, and the coordinator adds them to the table).
* Every record is decoded with its own writer schema (the id in its header), never
  with a newer version, and its fields go to the columns by name: a record decodes
  to the same row whatever versions the subject gains later, so a batch that Spark
  runs again gives the same rows. A field a record was written without is null (not
  a later version's default); a field a newer version drops keeps its values in the
  records written with it.
* Columns never go away and never change type: a field a newer version dropped
  stays a column (null in the records written without it), a nested field a newer
  version added to a known struct is not read (the coordinator grows top-level
  columns only), and a version that changes a known column's type fails the batch,
  saying which, before anything is written. A record whose writer schema gives a
  field a type its column cannot take as written (text for a long) does not fit;
  one the column widens (int to long) does.
* Without ``evolve`` the schema stays the one read at start; records of newer
  versions are read by it (their new fields are not read).

The schemas live in the driver and are read again from the registry when the job
restarts. Pure: no Spark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import pyarrow as pa
import structlog
from confluent_kafka.schema_registry import RegisteredSchema

from spark_writer.formats.avro_decoding import AvroPayloads, avro_table_type
from spark_writer.formats.dead_letters import DeadLetterTarget
from spark_writer.formats.json_schema_decoding import JsonSchemaPayloads, json_schema_table_type
from spark_writer.formats.protobuf_decoding import ProtobufPayloads, protobuf_table_type
from spark_writer.formats.protobuf_schemas import SERIALIZED
from spark_writer.formats.record_decoding import BadRecordPolicy, RecordDecoding
from spark_writer.formats.registry_decoding import (
    PayloadDecoder,
    RegistryDecoder,
    RegistryValues,
    UnsupportedSchemaError,
)
from spark_writer.formats.schema_registry import (
    RegistrySettings,
    SchemaNotFoundError,
    latest_version,
    subject_version,
    subject_versions,
)
from spark_writer.spark_arrow_types import spark_type_names

log = structlog.get_logger(__name__)

VALUE_SUBJECT_SUFFIX: Final = "-value"
KEY_SUBJECT_SUFFIX: Final = "-key"


class RegistryFormat(StrEnum):
    AVRO = "avro"
    PROTOBUF = "protobuf"
    JSON_SCHEMA = "json-schema"

    @property
    def label(self) -> str:
        """What its schemas are called: "Avro schema", "Protobuf schema", "JSON Schema"."""
        return {"avro": "Avro schema", "protobuf": "Protobuf schema", "json-schema": "JSON Schema"}[self.value]

    @property
    def schema_type(self) -> str:
        """The registry's name of its schemas' type."""
        return {"avro": "AVRO", "protobuf": "PROTOBUF", "json-schema": "JSON"}[self.value]

    @property
    def schema_format(self) -> str | None:
        return SERIALIZED if self is RegistryFormat.PROTOBUF else None


class SchemaChangeError(ValueError):
    """A newer version of a subject changes the type of a column the table has: the batch fails before writing."""


@dataclass(frozen=True)
class RegistrySubject:
    """What one Kafka column (value or key) is written with: a format and the subject whose versions the table
    follows (and for Protobuf, which message of the schema; default: its first)."""

    format: RegistryFormat
    subject: str
    message: str | None = None

    def __post_init__(self) -> None:
        if self.message is not None and self.format is not RegistryFormat.PROTOBUF:
            raise ValueError("a message name is for Protobuf subjects only")

    @property
    def description(self) -> str:
        return f"the {self.format.label} of subject {self.subject}"


def topic_subject(topics: Sequence[str], suffix: str, subject: str | None) -> str:
    """The subject of the topics' values (suffix -value) or keys (-key): `subject` when given, else Confluent's
    TopicNameStrategy, `<topic><suffix>`, which names one subject only for one topic."""
    if subject is not None:
        return subject
    if len(topics) != 1:
        raise ValueError(
            f"the topics {list(topics)} have one subject each (<topic>{suffix}): name the one whose schema the table "
            f"has ({'--subject' if suffix == VALUE_SUBJECT_SUFFIX else '--key-subject'})"
        )
    return topics[0] + suffix


@dataclass(frozen=True)
class _Version:
    """A subject's version the driver knows: its id and number, and the table's type of it."""

    schema_id: int
    version: int | None
    table_type: pa.DataType
    message: str | None  # Protobuf: the message's full name


def _latest(registry: RegistrySettings, subject: RegistrySubject) -> tuple[RegisteredSchema, bool]:
    """The subject's latest version, and whether the subject is deleted: then its last version (said loudly) where
    the registry keeps it (soft-deleted)."""
    try:
        return latest_version(registry, subject.subject, subject.format.schema_format), False
    except SchemaNotFoundError:
        pass
    try:
        latest = latest_version(registry, subject.subject, subject.format.schema_format, deleted=True)
    except SchemaNotFoundError:
        raise ValueError(
            f"subject {subject.subject} is not in the schema registry at {registry.safe_url}, not even among its "
            "deleted subjects: register its schema first (a producer's serializer does), or name another subject"
        ) from None
    _say_deleted(registry, subject, latest.version)
    return latest, True


def _say_deleted(registry: RegistrySettings, subject: RegistrySubject, version: int | None) -> None:
    log.error(
        "schema registry subject deleted",
        subject=subject.subject,
        registry=registry.safe_url,
        version=version,
        message=(
            "the table keeps the columns of the versions known; every record is decoded with the schema its id "
            "names, and a record whose schema the registry no longer gives does not fit (--on-bad-record). Register "
            "the subject's schema again to follow new versions"
        ),
    )


def _version_of(registry: RegistrySettings, subject: RegistrySubject, latest: RegisteredSchema) -> _Version:
    """A registered version mapped to the table's type; ValueError saying why it cannot be."""
    schema_id = int(latest.schema_id or 0)
    registered = latest.schema.schema_type or "AVRO"
    if registered != subject.format.schema_type:
        held = next((f.value for f in RegistryFormat if f.schema_type == registered), registered)
        raise ValueError(
            f"subject {subject.subject} holds {registered} schemas, not {subject.format.schema_type} ones: pass "
            f"--format {held}"
        )
    where = f"{subject.description} (version {latest.version}, schema id {schema_id})"
    try:
        if subject.format is RegistryFormat.AVRO:
            return _Version(schema_id, latest.version, avro_table_type(registry, schema_id), None)
        if subject.format is RegistryFormat.PROTOBUF:
            table_type, message = protobuf_table_type(registry, schema_id, subject.message)
            return _Version(schema_id, latest.version, table_type, message)
        return _Version(schema_id, latest.version, json_schema_table_type(registry, schema_id), None)
    except UnsupportedSchemaError as error:
        raise UnsupportedSchemaError(f"{where} cannot be a table's: {error}") from None


def grown(known: pa.DataType, latest: pa.DataType, path: str = "") -> tuple[pa.DataType, list[str]]:
    """`known` with the top-level fields `latest` adds, and their names; SchemaChangeError when `latest` gives a known
    field another type (a nested field it adds to a known struct is left out, as reading by name leaves it)."""
    if not (pa.types.is_struct(known) and pa.types.is_struct(latest)):
        _check_same(known, latest, path)
        return known, []
    fields = list(known)
    added = []
    for field in latest:
        index = known.get_field_index(field.name)
        if index < 0:
            fields.append(field)
            added.append(field.name)
        else:
            _check_same(known.field(index).type, field.type, f"{path}.{field.name}" if path else field.name)
    return pa.struct(fields), added


def _check_same(known: pa.DataType, latest: pa.DataType, path: str) -> None:
    if pa.types.is_struct(known) and pa.types.is_struct(latest):
        for field in known:
            index = latest.get_field_index(field.name)
            if index >= 0:
                _check_same(field.type, latest.field(index).type, f"{path}.{field.name}")
    elif (pa.types.is_list(known) and pa.types.is_list(latest)) or (pa.types.is_map(known) and pa.types.is_map(latest)):
        for child in ("value_type",) if pa.types.is_list(known) else ("key_type", "item_type"):
            _check_same(getattr(known, child), getattr(latest, child), f"{path}[]")
    elif known != latest:
        raise SchemaChangeError(
            f"field {path or '(the value)'} is {latest} in the latest version, but the table's column is {known}: "
            "the table keeps its columns' types; write the new type to a new field, or to a new table"
        )


class _Column:
    """The driver's knowledge of one Kafka column's subject: the version read last and the table's type of it."""

    def __init__(self, registry: RegistrySettings, subject: RegistrySubject, *, grows: bool) -> None:
        self.registry = registry
        self.subject = subject
        self.grows = grows  # whether a new top-level field becomes a column (the value's), or is left out (the key's)
        latest, self.deleted = _latest(registry, subject)  # deleted: the registry said the subject is gone (once)
        self.version = _version_of(registry, subject, latest)
        self.table_type = self.version.table_type
        if grows:
            self.table_type = self._with_dropped_fields()

    def _with_dropped_fields(self) -> pa.DataType:
        """The latest version's type, and as further columns the top-level fields earlier versions had and it lacks
        (each with the newest type it had): a field a version dropped stays a column across a restart as it does in
        a running writer, so that its records decode to the same rows, whenever their batch runs. An earlier version
        no column can hold, or of another message, adds nothing (its records do not fit)."""
        if not pa.types.is_struct(self.table_type):
            return self.table_type
        fields = list(self.table_type)
        known = {field.name for field in fields}
        earlier = [
            number
            for number in subject_versions(self.registry, self.subject.subject, deleted=self.deleted)
            if number < (self.version.version or 0)
        ]
        for number in reversed(earlier):
            registered = subject_version(self.registry, self.subject.subject, number, self.subject.format.schema_format)
            try:
                version = _version_of(self.registry, self.subject, registered)
            except ValueError:
                continue
            if version.message != self.version.message or not pa.types.is_struct(version.table_type):
                continue
            fields += [field for field in version.table_type if field.name not in known]
            known.update(field.name for field in version.table_type)
        return pa.struct(fields)

    def refresh(self) -> bool:
        """Read the versions registered since the one read last, in order: their new top-level fields new columns (a
        version registered and superseded between two batches too: its records hold its fields); whether the latest
        is another version than the one read so far. A subject deleted meanwhile keeps the columns known (said
        loudly, once)."""
        try:
            registered = latest_version(self.registry, self.subject.subject, self.subject.format.schema_format)
            if registered.schema_id == self.version.schema_id:
                between = []
            else:
                between = [
                    subject_version(self.registry, self.subject.subject, number, self.subject.format.schema_format)
                    for number in subject_versions(self.registry, self.subject.subject)
                    if (self.version.version or 0) < number < (registered.version or 0)
                ]
        except SchemaNotFoundError:
            if not self.deleted:
                self.deleted = True
                _say_deleted(self.registry, self.subject, self.version.version)
            return False
        if self.deleted:
            self.deleted = False
            log.info("schema registry subject back", subject=self.subject.subject, version=registered.version)
        if registered.schema_id == self.version.schema_id:
            return False
        for version in (*between, registered):
            self._read(version)
        return True

    def _read(self, registered: RegisteredSchema) -> None:
        """A newer version: its new top-level fields become columns (SchemaChangeError for a changed one)."""
        version = _version_of(self.registry, self.subject, registered)
        if version.message != self.version.message:
            raise SchemaChangeError(
                f"version {version.version} of subject {self.subject.subject} has {version.message} as its first "
                f"message, the table holds {self.version.message}: name the message"
            )
        try:
            if self.grows:
                table_type, added = grown(self.table_type, version.table_type)
            else:
                _check_same(self.table_type, version.table_type, "")
                table_type, added = self.table_type, []
        except SchemaChangeError as error:
            raise SchemaChangeError(
                f"version {version.version} of subject {self.subject.subject} (schema id {version.schema_id}) "
                f"cannot be read into the table: {error}"
            ) from None
        log.info(
            "new schema version",
            subject=self.subject.subject,
            version=version.version,
            schema_id=version.schema_id,
            new_columns=added,
        )
        self.version, self.table_type = version, table_type

    def payloads(self) -> PayloadDecoder:
        registry, target = self.registry, self.table_type
        if self.subject.format is RegistryFormat.AVRO:
            return AvroPayloads(registry, target)
        if self.subject.format is RegistryFormat.PROTOBUF:
            assert self.version.message is not None
            return ProtobufPayloads(registry, self.version.message, target)
        return JsonSchemaPayloads(target, spark_type_names(target))


def key_values(registry: RegistrySettings, subject: RegistrySubject) -> RegistryValues:
    """The decoding of Kafka message keys written with `subject`'s schemas (each by its own writer schema, into the
    type of the subject's latest version when the job starts), an absent key null: the keys of an upsert or change
    stream's tombstones. ValueError when the subject cannot be read."""
    return RegistryValues(registry, _Column(registry, subject, grows=False).payloads(), absent_is_null=True)


class RegistrySchemas:
    """The decoding of a topic's values (and keys, as a `key` column) with their registered schemas, the table's
    schema following the subjects' versions (the module's rule): the version each subject has now, then, at each
    `refresh`, those registered since."""

    def __init__(
        self,
        registry: RegistrySettings,
        value: RegistrySubject,
        key: RegistrySubject | None = None,
        *,
        kafka_metadata: bool = False,
        on_bad_record: BadRecordPolicy = BadRecordPolicy.FAIL,
        dead_letters: DeadLetterTarget | None = None,
    ) -> None:
        self._kafka_metadata = kafka_metadata
        self.policy = on_bad_record
        self._dead_letters = dead_letters
        self._value = _Column(registry, value, grows=True)
        self._key = None if key is None else _Column(registry, key, grows=False)
        self.decoding = self._decoding_now()
        log.info(
            "table schema from the registry",
            subject=value.subject,
            version=self._value.version.version,
            schema_id=self._value.version.schema_id,
            key_subject=None if key is None else key.subject,
        )

    @property
    def value_subject(self) -> RegistrySubject:
        return self._value.subject

    @property
    def decodes_keys(self) -> bool:
        return self._key is not None

    def refresh(self) -> None:
        """The subjects' versions registered since they were read last; the decoding built again for a new one."""
        value_moved = self._value.refresh()
        key_moved = self._key is not None and self._key.refresh()
        if value_moved or key_moved:
            self.decoding = self._decoding_now()

    def _decoding_now(self) -> RecordDecoding:
        key = None if self._key is None else RegistryValues(self._key.registry, self._key.payloads(), True)
        decoder = RegistryDecoder(
            RegistryValues(self._value.registry, self._value.payloads()),
            key,
            kafka_metadata=self._kafka_metadata,
            schema_name=self._value.subject.description,
        )
        return RecordDecoding(decoder, self.policy, self._dead_letters)
