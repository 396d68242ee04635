"""A table's data file described as its manifest entry describes it, as bytes and back: pyiceberg's own Avro encoding
of the entry's data file (the manifest's), without the manifest around it.

The key index keeps each file it names this way (key_index_files.data_file), so that its answer gives the same data
files a scan of the table does, without reading the table's manifests. The partition tuple is encoded under the
partition type of the file's spec as the schema `schema_id` types it: decoding takes the same schema, so a partition
source column promoted since (int to long, float to double) is still read as it was written.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from enum import Enum

from pyiceberg.avro.decoder import new_decoder
from pyiceberg.avro.encoder import BinaryEncoder
from pyiceberg.avro.reader import Reader
from pyiceberg.avro.resolver import construct_writer, resolve_reader
from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, data_file_with_partition
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.types import StructType

# The Avro field ids of the enums in a data file's record (Iceberg's manifest schema): file_format and content.
_ENUMS: dict[int, Callable[..., Enum]] = {101: FileFormat, 134: DataFileContent}


class DescriptionOutdated(ValueError):
    """A data file's description names a partition spec or schema the table no longer has."""


def encode_data_file(metadata: TableMetadata, data_file: DataFile) -> bytes:
    """The bytes of one of the table's data files (its spec's partition type under the table's current schema)."""
    struct = _struct(metadata, data_file.spec_id, metadata.current_schema_id)
    buffer = io.BytesIO()
    construct_writer(struct).write(BinaryEncoder(buffer), data_file)
    return buffer.getvalue()


class DataFileDecoder:
    """Decodes the descriptions of one table's data files: each (spec, schema) pair's Avro reader is resolved once
    (resolving it costs about ten times reading one description: an epoch's answer names hundreds of files)."""

    def __init__(self, metadata: TableMetadata) -> None:
        self.metadata = metadata
        self._readers: dict[tuple[int, int], Reader] = {}

    def decode(self, encoded: bytes, spec_id: int, schema_id: int) -> DataFile:
        """The data file encode_data_file encoded when the table's current schema was `schema_id`.

        Raises DescriptionOutdated when the table no longer has that spec or schema."""
        reader = self._readers.get((spec_id, schema_id))
        if reader is None:
            struct = _struct(self.metadata, spec_id, schema_id)
            reader = resolve_reader(struct, struct, read_types={-1: DataFile}, read_enums=_ENUMS)
            self._readers[spec_id, schema_id] = reader
        data_file = reader.read(new_decoder(encoded))
        assert isinstance(data_file, DataFile)
        data_file.spec_id = spec_id  # not a field of the manifest entry: the manifest's spec says it
        return data_file


def _struct(metadata: TableMetadata, spec_id: int, schema_id: int) -> StructType:
    spec = metadata.specs().get(spec_id)
    schema = next((schema for schema in metadata.schemas if schema.schema_id == schema_id), None)
    if spec is None or schema is None:
        raise DescriptionOutdated(f"the table has no partition spec {spec_id} or no schema {schema_id} any more")
    return data_file_with_partition(spec.partition_type(schema), metadata.format_version)
