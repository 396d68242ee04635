"""The sink's arguments that are checked, and defaulted, before Spark starts: its name and its table's against the
coordinator's name policy, the size of its data files, how long it retries an unreachable coordinator. Pure: the job's
settings (spark_writer.job_settings) and a fresh read (spark_writer.fresh) use them without Spark."""

from __future__ import annotations

from typing import Final

from coordinator_service.contract.table_identifiers import sink_name_problem, table_identifier_problem

DEFAULT_TARGET_FILE_SIZE_BYTES: Final = 128 * 1024 * 1024
DEFAULT_COORDINATOR_RETRY_SECONDS: Final = 60.0


def check_names(sink: str, table: str | None) -> None:
    """ValueError when the sink's name or its table's (if one is named) is outside the name policy, which the
    coordinator would refuse (coordinator_service.contract.table_identifiers)."""
    for problem in (sink_name_problem(sink), None if table is None else table_identifier_problem(table)):
        if problem is not None:
            raise ValueError(problem)
