"""Where the tables' files live as the settings say, and when `serve` refuses it
(coordinator_service.tables.warehouse)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator_service.settings import Settings
from coordinator_service.tables.warehouse import listens_beyond_loopback, local_warehouse, serving_refusal, writability


@pytest.mark.parametrize(
    ("host", "beyond"),
    [
        ("127.0.0.1", False),
        ("127.3.2.1", False),
        ("::1", False),
        ("[::1]", False),
        ("localhost", False),
        ("LOCALHOST", False),
        ("0.0.0.0", True),
        ("::", True),
        ("10.1.2.3", True),
        ("coordinator.example", True),
        ("", True),
        ("127.0.0.1.evil.example", True),
    ],
)
def test_only_loopback_addresses_keep_writers_on_this_machine(host: str, beyond: bool) -> None:
    assert listens_beyond_loopback(host) is beyond


@pytest.mark.parametrize(
    ("catalog", "local"),
    [
        ({"type": "rest", "uri": "http://rest:8181", "warehouse": "s3://lake/warehouse"}, None),
        ({"type": "rest", "uri": "http://rest:8181", "warehouse": "my_catalog"}, None),
        ({"type": "rest", "uri": "http://rest:8181"}, None),
        ({"type": "glue", "warehouse": "gs://lake/w"}, None),
        ({"type": "sql", "uri": "postgresql://x/y", "warehouse": "file:///srv/lake"}, Path("/srv/lake")),
        ({"type": "sql", "uri": "postgresql://x/y", "warehouse": "FILE:///srv/lake%20two"}, Path("/srv/lake two")),
        ({"type": "sql", "uri": "postgresql://x/y", "warehouse": "/srv/lake"}, Path("/srv/lake")),
    ],
)
def test_a_configured_warehouse_is_local_when_it_is_a_path(catalog: dict[str, str], local: Path | None) -> None:
    assert local_warehouse(Settings(catalog=catalog)) == local


def test_without_a_catalog_the_warehouse_is_the_data_dirs(tmp_path: Path) -> None:
    assert local_warehouse(Settings(data_dir=tmp_path / "data")) == (tmp_path / "data" / "warehouse").resolve()


def test_serve_refuses_a_local_warehouse_only_for_writers_elsewhere_unless_allowed(tmp_path: Path) -> None:
    remote = {"type": "rest", "uri": "http://rest:8181", "warehouse": "s3://lake/w"}
    assert serving_refusal(Settings(data_dir=tmp_path)) is None  # 127.0.0.1: this machine's writers only
    assert serving_refusal(Settings(data_dir=tmp_path, bind_host="0.0.0.0", catalog=remote)) is None
    assert serving_refusal(Settings(data_dir=tmp_path, bind_host="0.0.0.0", allow_local_warehouse=True)) is None
    refusal = serving_refusal(Settings(data_dir=tmp_path, bind_host="0.0.0.0"))
    assert refusal is not None
    assert refusal.startswith("no catalog is configured")
    assert str(tmp_path / "warehouse") in refusal
    assert "SINK_COORDINATOR_ALLOW_LOCAL_WAREHOUSE=true" in refusal
    shared = {"type": "sql", "uri": "postgresql://x/y", "warehouse": "file:///mnt/lake"}
    refusal = serving_refusal(Settings(bind_host="10.0.0.5", catalog=shared))
    assert refusal is not None and refusal.startswith("the catalog's warehouse is on this machine's file system")


def test_the_setting_takes_booleans_only() -> None:
    with pytest.raises(ValueError, match="allow_local_warehouse"):
        Settings(allow_local_warehouse="maybe")  # type: ignore[arg-type]


def test_a_warehouse_is_writable_only_when_it_is_a_directory_this_process_may_write(tmp_path: Path) -> None:
    assert writability(tmp_path) == "ok"
    assert writability(tmp_path / "gone").startswith("missing:")
    (tmp_path / "a-file").write_text("")
    assert writability(tmp_path / "a-file").startswith("missing:")
