"""Checking the metastore's schema: the migration scripts are parsed once per process, not once per probe."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine

from coordinator_service.contract.errors import SchemaNotCurrent
from coordinator_service.log import schema


def test_repeated_schema_checks_read_the_migration_scripts_once(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    from_config: Callable[..., ScriptDirectory] = ScriptDirectory.from_config

    def counted(config: Any) -> ScriptDirectory:
        reads.append(config.get_main_option("script_location"))
        return from_config(config)

    monkeypatch.setattr(ScriptDirectory, "from_config", counted)
    engine = create_engine("sqlite://")  # a database no migration has touched
    with engine.connect() as connection:
        for _ in range(3):
            with pytest.raises(SchemaNotCurrent, match="no sink-coordinator schema yet"):
                schema.require_current_schema(connection)

    assert len(reads) <= 1, f"the migration scripts were read {len(reads)} times for 3 checks"
