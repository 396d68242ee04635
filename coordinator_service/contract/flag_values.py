"""Values of the flags both commands take: `key=value` pairs and sizes in bytes.

`sink-coordinator` (--catalog, --compaction-target-file-bytes) and `sink-writer` (--kafka-option, --storage,
--target-file-size) declare such a flag with ``typer.Option(parser=...)`` from here, so that a bad value is refused
alike everywhere: naming the flag and the value, before anything runs (exit code 2). Shared by the coordinator and
the Spark writer: it imports only the base dependencies (tests/unit/test_writer_imports.py).
"""

from __future__ import annotations

from typing import Final, NamedTuple

import typer
from pydantic import ByteSize, TypeAdapter, ValidationError

KEY_VALUE: Final = "<key=value>"
SIZE: Final = "<size>"
_BYTE_SIZE: Final = TypeAdapter(ByteSize)


class KeyValue(NamedTuple):
    key: str
    value: str


def parse_key_value(text: str) -> KeyValue:
    """'s3.region=eu-west-1' -> KeyValue('s3.region', 'eu-west-1'); the value may hold '=' and be empty."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise typer.BadParameter(f"{text!r} is not key=value")
    return KeyValue(key.strip(), value)


def parse_size(text: str) -> ByteSize:
    """'134217728', '128MiB', '64 MB' -> bytes, as pydantic's ByteSize reads them (MB: 10**6, MiB: 2**20)."""
    try:
        return _BYTE_SIZE.validate_python(text)
    except ValidationError:
        raise typer.BadParameter(
            f"{text!r} is not a size: bytes, or a number and a unit such as 128MiB, 64MB or 1GiB"
        ) from None
