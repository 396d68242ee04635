"""The writer's storage settings (spark_writer.sink.storage): pyiceberg's FileIO keys, checked up front, secrets
hidden."""

from __future__ import annotations

import pickle
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from spark_writer.sink.storage import Storage

S3 = {
    "s3.endpoint": "http://127.0.0.1:9000",
    "s3.region": "eu-west-1",
    "s3.access-key-id": "AKIDEXAMPLE",
    "s3.secret-access-key": "wJalrXUtnFEMI-secret",
    "s3.session-token": "FwoGZXIvYXdz-token",
    "s3.force-virtual-addressing": "false",
    "s3.connect-timeout": "5",
}


@pytest.mark.parametrize("scheme", ["s3", "s3a", "s3n"])
def test_s3_uris_get_an_s3_file_system_and_a_bucket_path(scheme: str) -> None:
    filesystem, path = Storage(S3).filesystem(f"{scheme}://lake/warehouse/db/orders/data/a.parquet")
    assert isinstance(filesystem, pafs.S3FileSystem)
    assert path == "lake/warehouse/db/orders/data/a.parquet"
    assert filesystem.region == "eu-west-1"


def test_other_schemes_go_to_pyarrow_with_their_environment(tmp_path: Path) -> None:
    filesystem, path = Storage().filesystem((tmp_path / "a.parquet").as_uri())
    assert isinstance(filesystem, pafs.LocalFileSystem)
    assert path == str(tmp_path / "a.parquet")


def test_the_repr_hides_secrets_and_a_pickled_copy_keeps_them() -> None:
    storage = Storage(S3)
    shown = repr(storage)
    assert "wJalrXUtnFEMI-secret" not in shown and "FwoGZXIvYXdz-token" not in shown
    assert "AKIDEXAMPLE" in shown and "s3.secret-access-key" in shown
    assert pickle.loads(pickle.dumps(storage)).properties == S3  # as the executors get it


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"s3.path-style-access": "true"}, "unknown storage properties ['s3.path-style-access']"),
        ({"s3.endpoit": "http://x"}, "unknown storage properties ['s3.endpoit']"),
        ({"s3.force-virtual-addressing": "maybe"}, "s3.force-virtual-addressing must be true or false, got 'maybe'"),
        ({"s3.request-timeout": "10s"}, "s3.request-timeout must be a number of seconds, got '10s'"),
    ],
)
def test_bad_properties_are_refused_with_what_was_wrong(properties: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Storage(properties)
