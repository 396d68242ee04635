"""The catalog opened by coordinators that start together on a fresh metastore (the serving processes of one
supervisor, the replicas of a first deployment): pyiceberg's SQL catalog creates its tables when it is opened, and
each of them must open it."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import SecretStr
from sqlalchemy import make_url

from coordinator_service.runtime import open_catalog
from coordinator_service.settings import Settings

STARTING_TOGETHER = 8


def test_coordinators_starting_together_on_a_fresh_metastore_all_open_its_catalog(
    database_url: str, tmp_path: Path
) -> None:
    settings = Settings(database_url=SecretStr(database_url), data_dir=tmp_path)
    together = threading.Barrier(STARTING_TOGETHER)

    def start() -> list[tuple[str, ...]]:
        together.wait(30)
        return open_catalog(settings, make_url(database_url)).list_namespaces()

    with ThreadPoolExecutor(STARTING_TOGETHER) as pool:
        opened = [future.result(60) for future in [pool.submit(start) for _ in range(STARTING_TOGETHER)]]
    assert opened == [[]] * STARTING_TOGETHER
