"""What all registry formats share: the wire format's headers, the registry's settings, and a registry that fails
failing the batch rather than making its records bad."""

from __future__ import annotations

import pyarrow as pa
import pytest

from sink_coordinator_demo.ports import free_port
from spark_writer.formats.avro_decoding import AvroPayloads
from spark_writer.formats.registry_decoding import RegistryValues
from spark_writer.formats.schema_registry import RegistrySettings, RegistryUnavailableError, registry_client
from spark_writer.formats.wire_format import split_frames


@pytest.mark.parametrize("binary_type", [pa.binary(), pa.large_binary()])
def test_headers_are_read_for_the_whole_batch(binary_type: pa.DataType) -> None:
    values = pa.array(
        [b"\x00\x00\x00\x01\x00payload", None, b"\x00\x12\x34\x56\x78", b"\x02\x00\x00\x00\x01x", b"\x00\x00"],
        binary_type,
    )

    frames = split_frames(values)

    assert frames.indices.to_pylist() == [0, 2]
    assert frames.schema_ids.tolist() == [256, 0x12345678]
    assert frames.payloads.to_pylist() == [b"payload", b""]
    assert frames.unframed == {
        1: "tombstone: the record has no value",
        3: "not in the Confluent wire format: magic byte 0x02, not 0x00 (schema ids as GUIDs, magic byte 0x01, "
        "are not read)",
        4: "not in the Confluent wire format: 2 byte(s), fewer than its 5-byte header",
    }
    assert split_frames(values.slice(2, 1)).schema_ids.tolist() == [0x12345678]  # an offset into the buffers


def test_settings_keep_credentials_out_of_messages() -> None:
    settings = RegistrySettings.of("https://user:secret@registry.example:8081/base", {"max.retries": "1"})
    assert settings.safe_url == "https://registry.example:8081/base"
    assert settings.client_config() == {"url": "https://user:secret@registry.example:8081/base", "max.retries": 1}


def test_an_in_memory_registry_is_shared_by_its_url_within_the_process() -> None:
    first = registry_client(RegistrySettings.of("mock://shared"))
    assert registry_client(RegistrySettings.of("mock://shared", {"timeout": "3"})) is first
    assert registry_client(RegistrySettings.of("mock://other")) is not first


def test_a_registry_that_cannot_answer_fails_the_batch_instead_of_its_records() -> None:
    unreachable = RegistrySettings.of(f"http://127.0.0.1:{free_port()}", {"max.retries": "0"})
    values = RegistryValues(unreachable, AvroPayloads(unreachable, pa.struct([("id", pa.int64())])))

    with pytest.raises(RegistryUnavailableError, match="could not be reached for schema id 7"):
        values.decode(pa.array([b"\x00\x00\x00\x00\x07\x02"], pa.binary()))
